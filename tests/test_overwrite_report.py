"""`h5stream ingest --overwrite` and the skip report: the old store's report goes only when the new store replaces
the old one (its first commit), never before.  Real image folders, the real CLI in-process."""

from __future__ import annotations

import os

from h5stream.ingest.report import REPLACING_SUFFIX, SkipReport, read_report, settle_replacement
from h5stream.samples import make_class_folder
from h5stream.store.meta import read_meta
from h5stream.store.schema import CREATING_SUFFIX, skipped_report_path


def _source_with_a_bad_file(root):
    make_class_folder(root, classes=("a", "b"), per_class=(3, 3), size=(20, 20), seed=1)
    (root / "a" / "bad.png").write_bytes(b"not a png")


def test_an_overwrite_that_stores_nothing_keeps_the_old_stores_report(tmp_path, h5cli):
    """The old report was removed when the run started: a mistyped folder left the old store without its report."""
    src = tmp_path / "src"
    _source_with_a_bad_file(src)
    out = tmp_path / "o.h5"
    assert h5cli("ingest", src, out, "--size", "8", "--workers", "0")[0] == 0
    report = skipped_report_path(str(out))
    before = open(report, "rb").read()
    assert read_report(report) == {"a/bad.png": "not an image Pillow can read"}
    typo = tmp_path / "typo" / "x"
    typo.mkdir(parents=True)
    (typo / "1.png").write_bytes(b"nor this")
    code, _out, err = h5cli("ingest", typo.parent, out, "--size", "8", "--workers", "0", "--overwrite")
    assert code == 1 and err.count("\n") == 1, err
    assert f"{out}: not replaced" in err and f"{typo / '1.png'}: not an image Pillow can read" in err, err
    assert open(report, "rb").read() == before and read_meta(str(out)).skipped_files == 1
    assert not os.path.exists(report + REPLACING_SUFFIX)


def test_an_overwrite_that_stores_rows_replaces_the_report_with_its_own(tmp_path, h5cli):
    src = tmp_path / "src"
    _source_with_a_bad_file(src)
    out = tmp_path / "o.h5"
    assert h5cli("ingest", src, out, "--size", "8", "--workers", "0")[0] == 0
    report = skipped_report_path(str(out))
    clean = tmp_path / "clean"
    make_class_folder(clean, classes=("a",), per_class=(2,), size=(20, 20), seed=2)
    assert h5cli("ingest", clean, out, "--size", "8", "--workers", "0", "--overwrite")[0] == 0
    assert read_meta(str(out)).rows == 2 and read_meta(str(out)).skipped_files == 0
    assert not os.path.exists(report) and not os.path.exists(report + REPLACING_SUFFIX)  # nothing skipped: none
    (clean / "a" / "worse.png").write_bytes(b"")
    assert h5cli("ingest", clean, out, "--size", "8", "--workers", "0", "--overwrite")[0] == 0
    assert read_report(report) == {"a/worse.png": "empty file (0 bytes)"}


def test_a_replacing_report_is_put_in_place_by_append_only_when_its_store_was(tmp_path):
    """A run killed between its store's rename and its report's: the next --append finishes the swap; killed before
    the store's rename (its temporary file still there): the new report is dropped, the old one stays."""
    out = str(tmp_path / "o.h5")
    report = skipped_report_path(out)
    with open(report, "w") as fh:
        fh.write("path,reason\nold.png,old reason\n")
    for store_renamed in (False, True):
        new = SkipReport(report, {}, replacing=True)
        new.add("new.png", "new reason")
        new.flush()  # what a commit makes durable; the process is "killed" here
        new._fh.close()
        if not store_renamed:
            open(out + CREATING_SUFFIX, "w").close()
        settle_replacement(report, out + CREATING_SUFFIX)
        assert not os.path.exists(report + REPLACING_SUFFIX)
        expected = {"new.png": "new reason"} if store_renamed else {"old.png": "old reason"}
        assert read_report(report) == expected
        if not store_renamed:
            os.unlink(out + CREATING_SUFFIX)


def test_writer_overwrite_that_stores_nothing_keeps_the_old_stores_report_and_one_that_does_replaces_it(tmp_path):
    """h5stream.write(overwrite=True) removed the old report when it opened, as ingest --overwrite did."""
    import numpy as np
    import pytest

    import h5stream
    from h5stream.errors import SourceError

    out = tmp_path / "w.h5"
    images = np.zeros((3, 4, 4, 3), np.uint8)
    h5stream.write(out, list(zip(images, [0, 2**40, 1])), order="sorted")
    report = skipped_report_path(str(out))
    before = open(report, "rb").read()
    with pytest.raises(SourceError, match="the old store keeps its report"):
        h5stream.write(out, [(images[0], 2**41)], overwrite=True)
    assert open(report, "rb").read() == before and read_meta(str(out)).rows == 2
    assert not os.path.exists(report + REPLACING_SUFFIX)
    h5stream.write(out, list(zip(images, [0, 1, 2**42])), overwrite=True, order="sorted")
    assert list(read_report(report)) == ["2"] and read_meta(str(out)).rows == 2
