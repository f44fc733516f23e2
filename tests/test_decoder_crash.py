"""A source file that crashes the decoder (a native decoder's segmentation fault or abort): the ingest finds it by
decoding the files in flight alone, skips and lists it with how the decoder died, and goes on; a run that died on
it (decoding in its own process) is resumed past it.  Never a row of it, and the same rows as a run in which it was
an ordinary bad file.

The crash is real: a Pillow plugin for a test-only format (files starting with ``H5CRASH``) that segfaults or
aborts the process decoding it, installed by a ``sitecustomize`` module on the PYTHONPATH of the `h5stream ingest`
process this test starts (and so of its decode workers and probes).  Nothing in h5stream can be made to load it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from h5stream.samples import make_class_folder
from h5stream.store.meta import read_meta
from h5stream.store.schema import DECODING_SUFFIX

from test_ingest_keras_parity import read_report, read_store

pytestmark = pytest.mark.usefixtures("no_leaks")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CRASHING_PLUGIN = '''
import os

from PIL import Image, ImageFile


class _Crash(ImageFile.ImageFile):
    format = "H5CRASH"

    def _open(self):
        if self.fp.read(16)[7:].startswith(b"abort"):
            os.abort()
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV


Image.register_open("H5CRASH", _Crash, lambda prefix: prefix[:7] == b"H5CRASH")
'''


def _source(root, crash: bytes | None):
    """bird/4, cat/5 (PNG/JPEG) and cat/odd.png: a crashing file (``crash``) or, with None, plain garbage."""
    make_class_folder(root, classes=("bird", "cat"), per_class=(4, 5), size=(20, 24), seed=5)
    (root / "cat" / "odd.png").write_bytes(crash if crash is not None else b"garbage, not an image")
    return root


def _ingest(tmp_path, *args):
    plugin = tmp_path / "plugin"
    plugin.mkdir(exist_ok=True)
    (plugin / "sitecustomize.py").write_text(CRASHING_PLUGIN)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, str(plugin)]))
    return subprocess.run([sys.executable, "-m", "h5stream", "ingest", *map(str, args), "--size", "8",
                           "--order", "shuffled", "--seed", "3",], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def reference(tmp_path_factory):
    """The store of the same source with odd.png an ordinary bad file: what a crashing odd.png must give too."""
    tmp = tmp_path_factory.mktemp("reference")
    out = tmp / "ref.h5"
    done = _ingest(tmp, _source(tmp / "src", None), out, "--workers", "0")
    assert done.returncode == 0, done.stderr
    images, labels, paths, _ = read_store(out)
    assert read_report(out) == {"cat/odd.png": "not an image Pillow can read"}
    return images, labels, paths


def _same_rows(out, reference):
    images, labels, paths, _ = read_store(out)
    ref_images, ref_labels, ref_paths = reference
    assert paths == ref_paths and "cat/odd.png" not in paths
    assert np.array_equal(images, ref_images) and np.array_equal(labels, ref_labels)


@pytest.mark.parametrize("how,signame", [(b"segv", "SIGSEGV"), (b"abort", "SIGABRT")])
def test_a_file_that_kills_a_decode_worker_is_skipped_with_how_and_the_ingest_goes_on(tmp_path, reference, how,
                                                                                      signame):
    """Each run died with 'decode worker died ... rerun with --append', and so did every --append."""
    src = _source(tmp_path / "src", b"H5CRASH" + how)
    out = tmp_path / "o.h5"
    done = _ingest(tmp_path, src, out, "--workers", "2")
    assert done.returncode == 0, done.stderr
    assert read_report(out) == {"cat/odd.png": f"the decoder process died with {signame}"}
    assert read_meta(str(out)).skipped_files == 1 and not os.path.exists(str(out) + DECODING_SUFFIX)
    _same_rows(out, reference)
    again = _ingest(tmp_path, src, out, "--workers", "2", "--append")  # tried alone again, skipped again
    assert again.returncode == 0, again.stderr
    assert read_report(out) == {"cat/odd.png": f"the decoder process died with {signame}"}
    _same_rows(out, reference)


def test_a_run_that_died_decoding_a_file_in_its_own_process_resumes_past_it(tmp_path, reference):
    """--workers 0 decodes in the ingest's process: the crash kills the run, and every --append died the same way."""
    src = _source(tmp_path / "src", b"H5CRASH" + b"segv")
    out = tmp_path / "o.h5"
    died = _ingest(tmp_path, src, out, "--workers", "0")
    assert died.returncode == -signal.SIGSEGV, died.stderr
    assert os.path.exists(str(out) + DECODING_SUFFIX)  # which files it was decoding
    resumed = _ingest(tmp_path, src, out, "--workers", "0", "--append")
    assert resumed.returncode == 0, resumed.stderr
    assert read_report(out) == {"cat/odd.png": "the decoder process died with SIGSEGV"}
    assert read_meta(str(out)).skipped_files == 1 and not os.path.exists(str(out) + DECODING_SUFFIX)
    _same_rows(out, reference)
    (src / "cat" / "odd.png").write_bytes(b"garbage, not an image")  # "fixed": decoded again, an ordinary skip now
    fixed = _ingest(tmp_path, src, out, "--workers", "0", "--append")
    assert fixed.returncode == 0, fixed.stderr
    assert read_report(out) == {"cat/odd.png": "not an image Pillow can read"}
