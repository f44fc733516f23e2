"""Stores without labels: `h5stream ingest SRC OUT --labels none` (every image under SRC, subfolders too, sorted,
as Keras' ``labels=None``) or a CSV that only names the files (``--label-kind none``); the store keeps every
guarantee of a labelled one (verify, info, append, resume after a kill), and streams yield the images alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
from PIL import Image

import h5stream
from h5stream.errors import ConfigError
from h5stream.ingest.pack import storage_permutation
from h5stream.samples import make_class_folder
from h5stream.store import read_meta, schema
from h5stream.store.progress import continue_command
from h5stream.store import pathrows

pytestmark = pytest.mark.usefixtures("no_leaks")

ARGS = ("--size", "8", "--workers", "0")
DEADLINE_S = 120.0


def colour(i: int) -> tuple[int, int, int]:
    """A colour of its own for file ``i``: a stored row says which file it came from."""
    return (i * 37 % 256, 255 - i * 11 % 256, i * 7 % 256)


def write_flat(root, names) -> dict[str, tuple[int, int, int]]:
    """Solid-colour PNGs (lossless, so each stored row is exactly its colour) at ``names`` under ``root``."""
    made = {}
    for i, rel in enumerate(names):
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        Image.new("RGB", (12, 10), colour(i)).save(os.path.join(root, rel))
        made[rel] = colour(i)
    return made


FLAT = ["a.png", "b.png", "c.png", "d.png", "sub/e.png", "sub/deep/f.png", "z.png"]


@pytest.fixture
def flat(tmp_path):
    """A folder of images and no class folders: some directly in it, some in subfolders, plus a text file and a
    hidden image (left out).  Returns (root, {relpath: colour})."""
    root = tmp_path / "flat"
    made = write_flat(root, FLAT)
    (root / "notes.txt").write_text("not an image")
    Image.new("RGB", (4, 4)).save(root / ".hidden.png")
    return str(root), made


def stored(out) -> tuple[list[str], np.ndarray, np.ndarray, dict]:
    """Paths, images, labels and attributes of the committed rows, read with plain h5py."""
    with h5py.File(out, "r") as f:
        n = int(f.attrs["committed_rows"])
        paths = [p.decode() for p in pathrows.stored_bytes(f, 0, n)]
        return paths, f["images"][:n], f["labels"][:n], dict(f.attrs)


def assert_rows_are_their_files(out, made) -> list[str]:
    paths, images, labels, attrs = stored(out)
    assert attrs["label_kind"] in ("none", b"none")
    assert (labels == schema.NO_LABEL).all() and labels.dtype == np.int8
    for rel, img in zip(paths, images):
        assert (img == np.array(made[rel], np.uint8)).all(), rel  # the right pixels in the right row
    return paths


def test_flat_folder_with_labels_none_is_every_image_below_it_and_verifies(flat, tmp_path, h5cli):
    root, made = flat
    out = tmp_path / "o.h5"
    code, text, err = h5cli("ingest", root, out, "--labels", "none", *ARGS)
    assert code == 0, err
    paths = assert_rows_are_their_files(out, made)
    assert sorted(paths) == sorted(made)  # subfolders too; notes.txt and the hidden file are not rows
    assert paths == [sorted(made)[i] for i in storage_permutation(len(made), "shuffled", 0)]
    code, text, err = h5cli("verify", out)
    assert code == 0 and "OK" in text, err
    code, text, _ = h5cli("info", out)
    assert code == 0 and "  labels          none\n" in text and "classes" not in text
    info = json.loads(h5cli("info", out, "--json")[1])
    assert info["label_kind"] == "none" and info["classes"] is None and info["ingest"]["finished"]
    meta = read_meta(out)
    assert meta.class_names is None and meta.label_columns is None and meta.rows == len(made)


def test_a_flat_folder_without_labels_none_is_one_line_naming_it(tmp_path, h5cli):
    root = tmp_path / "flat"
    write_flat(root, ["a.png", "b.png"])  # no subfolder: nothing a class could be
    code, text, err = h5cli("ingest", root, tmp_path / "o.h5", *ARGS)
    assert code != 0 and err.count("\n") == 1 and "no class subfolders" in err and "--labels none" in err, err
    assert not os.path.exists(tmp_path / "o.h5")


def test_labels_none_refuses_what_only_labels_mean(flat, tmp_path, h5cli):
    root, _ = flat
    for extra, words in ((("--classes", "a"), "--classes"), (("--label-kind", "class"), "--label-kind class")):
        code, _, err = h5cli("ingest", root, tmp_path / "o.h5", "--labels", "none", *extra, *ARGS)
        assert code != 0 and err.count("\n") == 1 and words in err and "no labels" in err, err
    assert not os.path.exists(tmp_path / "o.h5")


def test_a_path_only_csv_with_label_kind_none_stores_the_files_it_names(flat, tmp_path, h5cli):
    root, made = flat
    listed = ["c.png", "sub/deep/f.png", "a.png"]
    csv_path = tmp_path / "files.csv"
    csv_path.write_text("filename\n" + "\n".join(listed) + "\n")
    code, _, err = h5cli("ingest", root, tmp_path / "refused.h5", "--labels", csv_path, *ARGS)
    assert code != 0 and err.count("\n") == 1 and "--label-kind none" in err, err
    out = tmp_path / "o.h5"
    code, _, err = h5cli("ingest", root, out, "--labels", csv_path, "--label-kind", "none", *ARGS)
    assert code == 0, err
    assert sorted(assert_rows_are_their_files(out, made)) == sorted(listed)
    assert h5cli("verify", out)[0] == 0
    assert "  labels          none\n" in h5cli("info", out)[1]


def open_unlabeled(out, **kwargs):
    return h5stream.open(out, batch_size=3, seed=5, **kwargs)


def test_stream_yields_images_alone_the_same_with_and_without_workers(flat, tmp_path, h5cli):
    root, made = flat
    out = tmp_path / "o.h5"
    assert h5cli("ingest", root, out, "--labels", "none", *ARGS)[0] == 0
    with open_unlabeled(out) as s:
        assert s.label_mode is None and not s.yields_labels and s.label_shape is None
        assert s.meta.class_names is None and s.class_names is None
        batches = list(s)
    assert all(isinstance(b, np.ndarray) and b.dtype == np.uint8 for b in batches)
    rows = np.concatenate(batches)
    colours = sorted(tuple(int(v) for v in img[0, 0]) for img in rows)
    assert colours == sorted(made.values())  # every row exactly once
    augment = h5stream.Augment(horizontal_flip=True, brightness_range=[0.8, 1.2])
    got = {}
    for workers, feeder in ((0, False), (2, False), (1, True)):
        with open_unlabeled(out, augment=augment, workers=workers, feeder=feeder) as s:
            got[workers, feeder] = [b.copy() for b in s]
            assert all(isinstance(b, np.ndarray) for b in got[workers, feeder])
    alone = got[0, False]
    assert len(alone) == len(batches) and not np.array_equal(np.concatenate(alone), rows)  # augmented
    for other in (got[2, False], got[1, True]):
        assert len(other) == len(alone) and all(np.array_equal(a, b) for a, b in zip(alone, other))


def test_label_modes_that_need_labels_are_refused_in_one_line(flat, tmp_path, h5cli):
    root, _ = flat
    out = tmp_path / "o.h5"
    assert h5cli("ingest", root, out, "--labels", "none", *ARGS)[0] == 0
    for mode in ("int", "categorical", "binary"):
        with pytest.raises(ConfigError) as info:
            open_unlabeled(out, label_mode=mode)
        assert "\n" not in str(info.value) and "has none" in str(info.value) and "label_mode" in str(info.value)
    with open_unlabeled(out, label_mode=None) as s:
        assert isinstance(next(iter(s)), np.ndarray)


def test_a_labelled_store_keeps_int_as_its_default(class_src, tmp_path, h5cli):
    root, _ = class_src
    out = tmp_path / "c.h5"
    assert h5cli("ingest", root, out, *ARGS)[0] == 0
    with open_unlabeled(out) as s:
        x, y = next(iter(s))
        assert s.label_mode == "int" and y.dtype == np.int64


def test_append_adds_new_files_and_refuses_a_labelled_source(flat, class_src, tmp_path, h5cli):
    root, made = flat
    out = tmp_path / "o.h5"
    assert h5cli("ingest", root, out, "--labels", "none", *ARGS)[0] == 0
    more = write_flat(root, [*FLAT, "new/g.png", "y.png"])  # the same files again (same colours), two new ones
    code, text, err = h5cli("ingest", root, out, "--labels", "none", "--append", "--workers", "0")
    assert code == 0 and "ingested 2" in text and f"already stored {len(made)}" in text, err
    assert sorted(assert_rows_are_their_files(out, more)) == sorted(more)
    assert h5cli("verify", out)[0] == 0
    class_root, _ = class_src
    code, _, err = h5cli("ingest", class_root, out, "--append", "--workers", "0")
    assert code != 0 and err.count("\n") == 1 and "none" in err and "class" in err, err


def test_sorted_order_and_the_continue_command_keep_labels_none(flat, tmp_path, h5cli):
    root, made = flat
    out = tmp_path / "o.h5"
    assert h5cli("ingest", root, out, "--labels", "none", "--order", "sorted", *ARGS)[0] == 0
    assert stored(out)[0] == sorted(made)
    progress = read_meta(out).ingest
    assert "--labels none" in continue_command(progress, str(out))


def committed_rows(path) -> int:
    try:
        with h5py.File(path, "r", locking=False) as f:
            return int(f.attrs.get("committed_rows", 0))
    except (OSError, KeyError):
        return 0


def test_sigkill_mid_ingest_then_the_recorded_command_finishes_it(tmp_path):
    root = tmp_path / "src"
    written = [rel for rel, _ in make_class_folder(root, classes=2, per_class=400, size=(96, 128), fmt="jpg",
                                                    seed=4)]
    out = tmp_path / "kill.h5"
    cmd = [sys.executable, "-m", "h5stream", "ingest", str(root), str(out), "--labels", "none", "--size", "64",
           "--commit-rows", "64", "--workers", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while proc.poll() is None and time.monotonic() < deadline and committed_rows(out) == 0:
            time.sleep(0.005)  # polling interval, bounded by the deadline; not a synchronisation sleep
        assert proc.poll() is None, f"ingest ended before it could be killed: {proc.stderr.read().decode()}"
        os.killpg(proc.pid, signal.SIGKILL)  # the ingest and its decode worker
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stderr.close()
    meta = read_meta(out)
    assert 0 < meta.rows < len(written) and not meta.ingest.finished and meta.label_kind == "none"
    command = continue_command(meta.ingest, str(out))
    assert "--labels none" in command and command.endswith("--append")
    resumed = subprocess.run(cmd + ["--append"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and f"already stored {meta.rows}" in resumed.stdout, resumed.stderr
    paths, _, labels, _ = stored(out)
    walk = sorted(written)
    assert paths == [walk[i] for i in storage_permutation(len(walk), "shuffled", 0)]  # as an unbroken run
    assert (labels == schema.NO_LABEL).all()
    assert read_meta(out).ingest.finished
    verified = subprocess.run([sys.executable, "-m", "h5stream", "verify", str(out)], capture_output=True,
                              text=True, timeout=300)
    assert verified.returncode == 0, verified.stderr


def test_repair_rebuilds_an_unlabeled_store(flat, tmp_path, h5cli):
    from h5stream.store.handle import mark_flushing

    root, made = flat
    out = tmp_path / "o.h5"
    assert h5cli("ingest", root, out, "--labels", "none", *ARGS)[0] == 0
    before = stored(out)[0]
    mark_flushing(str(out))
    code, text, err = h5cli("repair", out)
    assert code == 0 and "rebuilt" in text, err
    assert assert_rows_are_their_files(out, made) == before
    assert read_meta(out).label_kind == "none" and h5cli("verify", out)[0] == 0


def test_keras_predict_takes_an_unlabeled_stream(flat, tmp_path, h5cli):
    keras = pytest.importorskip("keras")
    root, made = flat
    out = tmp_path / "o.h5"
    assert h5cli("ingest", root, out, "--labels", "none", *ARGS)[0] == 0
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
                              keras.layers.Dense(2, activation="softmax")])
    with h5stream.open(out, batch_size=3, shuffle=False) as s:
        predicted = model.predict(s.keras(), verbose=0)
    assert predicted.shape == (len(made), 2)
    with h5py.File(out, "r") as f:
        expected = model.predict(f["images"][: len(made)], verbose=0)
    np.testing.assert_allclose(predicted, expected, rtol=1e-5, atol=1e-6)
    with h5stream.open(out, batch_size=3, shuffle=False) as s:
        ds = s.tf_dataset()
        assert len(ds.element_spec.shape) == 4  # one tensor: the images, no labels
        np.testing.assert_allclose(model.predict(ds, verbose=0), expected, rtol=1e-5, atol=1e-6)


def test_torch_takes_an_unlabeled_stream(flat, tmp_path, h5cli):
    torch = pytest.importorskip("torch")
    root, made = flat
    out = tmp_path / "o.h5"
    assert h5cli("ingest", root, out, "--labels", "none", *ARGS)[0] == 0
    with h5stream.open(out, batch_size=3, shuffle=False) as s:
        batches = list(torch.utils.data.DataLoader(s.torch(), batch_size=None))
    assert all(isinstance(x, torch.Tensor) for x in batches)
    with h5py.File(out, "r") as f:
        np.testing.assert_array_equal(torch.cat(batches).numpy(), f["images"][: len(made)])


def test_bench_preview_and_the_shuffle_report_take_an_unlabeled_store(flat, tmp_path, h5cli):
    root, made = flat
    out = tmp_path / "o.h5"
    assert h5cli("ingest", root, out, "--labels", "none", *ARGS)[0] == 0
    code, text, err = h5cli("bench", out, "--no-baselines", "--json", "--batch-size", "2")
    assert code == 0, err
    result = json.loads(text)
    assert result["rows_streamed"] == len(made) and result["order_matches_yield"] is None
    code, text, err = h5cli("preview", out, "--out", tmp_path / "grid.png", "--rows", "2", "--cols", "2")
    assert code == 0 and os.path.exists(tmp_path / "grid.png"), err
    code, text, err = h5cli("info", out, "--shuffle-report")
    assert code == 0 and "no labels: one bin" in text, err


def test_label_kind_none_over_labels_that_are_not_one_integer_a_row_is_one_line(regression_src, tmp_path, h5cli):
    from h5stream.errors import StoreFormatError

    root, csv_path, _ = regression_src
    out = tmp_path / "r.h5"
    assert h5cli("ingest", root, out, "--labels", csv_path, *ARGS)[0] == 0  # float32 (N, 2) targets
    with h5py.File(out, "r+") as f:
        f.attrs["label_kind"] = "none"
    with pytest.raises(StoreFormatError) as info:
        read_meta(out)
    assert "\n" not in str(info.value) and "label_kind is 'none'" in str(info.value)
    code, _, err = h5cli("info", out)
    assert code != 0 and err.count("\n") == 1 and "label_kind is 'none'" in err
