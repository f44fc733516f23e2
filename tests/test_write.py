"""h5stream.write / h5stream.Writer: Python sources become the rows ingest would make, bad items are skipped and
listed, misuse is one clear error, and a write SIGKILLed at any flush continues to exactly the store an
uninterrupted write makes."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
from PIL import Image

import h5stream
from h5stream.errors import ConfigError, SourceError, StoreBusyError, StoreExistsError
from h5stream.ingest.decode import decode_file
from h5stream.ingest.report import read_report
from h5stream.ingest.spec import DecodeSpec
from h5stream.store import pathrows, schema
from h5stream.store.progress import unfinished_message

pytestmark = pytest.mark.usefixtures("no_leaks")  # child processes: a killed writer, the examples

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def contents(path) -> dict:
    """Everything a reader sees of a store: rows, labels, paths, classes, order, skip report, progress."""
    with h5py.File(path, "r") as f:
        n = int(f.attrs[schema.ATTR_COMMITTED])
        out = {name: f[name][:n] for name in (schema.IMAGES, schema.LABELS)}
        out[schema.PATHS] = pathrows.stored_bytes(f, 0, n)
        out["attrs"] = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()
                        if k in (schema.ATTR_CLASS_NAMES, schema.ATTR_ORDER, schema.ATTR_ORDER_SEED,
                                 schema.ATTR_LABEL_KIND, schema.ATTR_SKIPPED, schema.ATTR_INGEST_FILES,
                                 schema.ATTR_INGEST_SKIPPED)}
        out["sums"] = f[schema.CHECKSUMS][:] if schema.CHECKSUMS in f else None
    out["report"] = read_report(schema.skipped_report_path(str(path)))
    return out


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], np.ndarray):
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        else:
            assert a[key] == b[key], key


def encoded(arr: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt)
    return buf.getvalue()


def test_keras_style_arrays_are_stored_row_for_row_in_the_recorded_order(tmp_path, h5cli):
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (300, 12, 10), dtype=np.uint8), rng.integers(0, 7, (300, 1))  # CIFAR-like (N, 1)
    result = h5stream.write(tmp_path / "a.h5", (x, y), block_rows=16, commit_rows=32, seed=5)
    assert (result.rows, result.written, result.skipped, result.consumed) == (300, 300, 0, 300)
    meta = h5stream.read_meta(tmp_path / "a.h5")
    assert meta.image_shape == (12, 10, 1) and meta.storage_order == "shuffled" and meta.order_seed == 5
    assert meta.class_names == tuple(str(i) for i in range(7)) and meta.ingest.finished
    c = contents(tmp_path / "a.h5")
    index = np.array([int(p) for p in c[schema.PATHS]])
    np.testing.assert_array_equal(index, np.random.default_rng(5).permutation(300))  # ingest's storage order
    np.testing.assert_array_equal(c[schema.IMAGES][..., 0], x[index])
    np.testing.assert_array_equal(c[schema.LABELS], y[index, 0])
    assert h5cli("verify", str(tmp_path / "a.h5"))[0] == 0  # every block checks against its checksum
    h5stream.write(tmp_path / "s.h5", (x, y), order="sorted")
    np.testing.assert_array_equal(contents(tmp_path / "s.h5")[schema.IMAGES][..., 0], x)


class MixedDataset:
    """Map-style: arrays of another size, PIL images, JPEG and PNG bytes, class names; some items bad."""

    def __init__(self, n=40, bad=(3, 17, 29)):
        rng = np.random.default_rng(1)
        self.pixels = [rng.integers(0, 256, (20 + i % 5, 16 + i % 3, 3), dtype=np.uint8) for i in range(n)]
        self.bad = set(bad)

    def __len__(self):
        return len(self.pixels)

    def __getitem__(self, i):
        arr, label = self.pixels[i], ("cat", "dog", "bird")[i % 3]
        if i in self.bad:
            return [b"\x89PNG broken", np.zeros((4, 4), np.float64), None][sorted(self.bad).index(i)], label
        kind = i % 4
        image = arr if kind == 0 else Image.fromarray(arr) if kind == 1 else encoded(arr, "PNG" if kind == 2 else
                                                                                     "JPEG")
        return image, label


def test_a_map_style_dataset_decodes_like_ingest_and_lists_its_bad_items(tmp_path):
    ds = MixedDataset()
    result = h5stream.write(tmp_path / "m.h5", ds, size=(8, 6), order="sorted")
    assert (result.rows, result.skipped) == (37, 3)
    c = contents(tmp_path / "m.h5")
    assert set(c["report"]) == {"3", "17", "29"}
    assert "not an image Pillow can read" in c["report"]["3"] and "dtype float64" in c["report"]["17"]
    assert "no image" in c["report"]["29"]
    assert json.loads(c["attrs"][schema.ATTR_CLASS_NAMES]) == ["cat", "dog", "bird"]  # first seen first
    assert c["attrs"][schema.ATTR_SKIPPED] == 3
    spec = DecodeSpec(size=(8, 6))
    for row, path in enumerate(c[schema.PATHS]):
        i = int(path)
        assert c[schema.LABELS][row] == i % 3
        file = tmp_path / f"{i}.png"  # what ingest makes of the same pixels as a file
        Image.fromarray(ds.pixels[i]).save(file)
        if i % 4 != 3:  # JPEG is lossy: compare it with ingest of the same JPEG bytes
            np.testing.assert_array_equal(c[schema.IMAGES][row], decode_file(str(file), spec))
        else:
            file.write_bytes(ds[i][0])
            np.testing.assert_array_equal(c[schema.IMAGES][row], decode_file(str(file), spec))


def test_a_generator_of_unlabeled_images_makes_the_unlabeled_layout(tmp_path):
    def gen():
        for i in range(25):
            yield np.full((5, 5, 3), i, np.uint8)

    result = h5stream.write(tmp_path / "u.h5", gen(), channels=1)
    meta = h5stream.read_meta(tmp_path / "u.h5")
    assert result.rows == 25 and meta.label_kind == schema.LABEL_NONE and meta.image_shape == (5, 5, 1)
    c = contents(tmp_path / "u.h5")
    assert c[schema.LABELS].dtype == np.int8 and (c[schema.LABELS] == schema.NO_LABEL).all()
    assert [int(p) for p in c[schema.PATHS]] == list(range(25))
    x, y = np.zeros((30, 4, 4), np.uint8), np.arange(30)
    h5stream.write(tmp_path / "n.h5", (x, y), label_kind="none")  # labels there, and not wanted: not read
    assert h5stream.read_meta(tmp_path / "n.h5").label_kind == schema.LABEL_NONE
    assert (contents(tmp_path / "n.h5")[schema.LABELS] == schema.NO_LABEL).all()
    with pytest.raises(ConfigError, match="iterable .* has no length"):
        h5stream.write(tmp_path / "v.h5", gen(), order="shuffled")
    assert not os.path.exists(tmp_path / "v.h5")


def test_float_vector_labels_make_a_regression_store_and_misfits_are_skipped(tmp_path):
    items = [(np.zeros((4, 4), np.uint8), [0.5, float(i)]) for i in range(6)] + [(np.zeros((4, 4), np.uint8), [1.0])]
    with h5stream.Writer(tmp_path / "r.h5") as w:
        for image, label in items:
            w.add(image, label)
    c = contents(tmp_path / "r.h5")
    assert c[schema.LABELS].shape == (6, 2) and c[schema.LABELS][5, 1] == 5.0
    assert "shape (1,)" in c["report"]["6"]


def test_misuse_is_one_clear_error_and_writes_nothing(tmp_path, small_class_store):
    x = np.zeros((4, 3, 3), np.uint8)
    out = tmp_path / "o.h5"
    with pytest.raises(ConfigError, match="unknown option 'sise'.*size"):
        h5stream.write(out, x, sise=3)
    with pytest.raises(ConfigError, match="part is h5stream ingest --part's"):  # was taken and ignored: every row
        h5stream.write(out, (x, np.zeros(4, int)), part=(0, 2))
    with pytest.raises(ConfigError, match="part is h5stream ingest --part's"):
        h5stream.Writer(out, part=(0, 2))
    with pytest.raises(ConfigError, match="uint8 pixels"):
        h5stream.write(out, (x.astype(np.float32), np.zeros(4, int)))
    with pytest.raises(ConfigError, match="4 images but 3 labels"):
        h5stream.write(out, (x, np.zeros(3, int)))
    with pytest.raises(ConfigError, match="is a string"):
        h5stream.write(out, "images/")
    with pytest.raises(ConfigError, match="size must be"):
        h5stream.write(out, x, size=(0, 3))
    with pytest.raises(ConfigError, match="order they are added"):
        h5stream.Writer(out, order="shuffled")
    with pytest.raises(SourceError, match=r"every one of the 2 items was skipped \(item 0: no image \(None\)"):
        h5stream.write(out, [None, b""])
    with pytest.raises(SourceError, match="gave no items"):
        h5stream.write(out, iter(()))
    assert not os.path.exists(out)
    h5stream.write(out, x)
    with pytest.raises(StoreExistsError, match="overwrite=True .* resume=True"):
        h5stream.write(out, x)
    with pytest.raises(ConfigError, match="store has size"):
        h5stream.write(out, x, size=4, resume=True)
    with pytest.raises(ConfigError, match="source of 4 items, this one has 5"):
        h5stream.write(out, np.zeros((5, 3, 3), np.uint8), resume=True)
    with pytest.raises(ConfigError, match="not made by h5stream.write"):
        h5stream.write(small_class_store, x, resume=True)
    with pytest.raises(ConfigError, match="^block_rows must be >= 1"):
        h5stream.write(tmp_path / "b.h5", x, block_rows=0)
    with pytest.raises(ConfigError, match="contradict"):
        h5stream.write(out, x, resume=True, overwrite=True)
    with pytest.raises(ConfigError, match="store has classes"):
        h5stream.write(out, x, classes=["a"], resume=True)
    with h5stream.Writer(tmp_path / "busy.h5") as w:
        w.add(x[0])
        with pytest.raises(StoreBusyError):
            h5stream.write(tmp_path / "busy.h5", x)
    with pytest.raises(SourceError, match="item 1: .*strict=True"):
        h5stream.write(tmp_path / "st.h5", [np.zeros((3, 3), np.uint8), None], strict=True)


# -- continue after a kill ---------------------------------------------------------------------------------

CHILD = r"""
import os, signal, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
from h5stream.store import durable
import tests.test_write as t

where, kill_at = sys.argv[3].split(":")
calls = [0]

def die_on(name, marked_only=False):
    original = getattr(durable.DurableFile, name)

    def patched(self, *args):
        if not marked_only or args[0]:
            calls[0] += 1
            if calls[0] == int(kill_at):
                os.kill(os.getpid(), signal.SIGKILL)
        return original(self, *args)

    setattr(durable.DurableFile, name, patched)

if where == "flush":
    die_on("_flush")  # before this flush: the store as the last one left it
else:
    die_on("_unmark_flushing", marked_only=True)  # a flush done, its marker still there: the store is rebuilt
t.write_source(sys.argv[4], sys.argv[2])
print("finished")
"""

N_ITEMS = 150


def make_source(kind: str):
    """Deterministic sources that can be made again: arrays, a map-style dataset, a generator (with bad items)."""
    rng = np.random.default_rng(7)
    x, y = rng.integers(0, 256, (N_ITEMS, 6, 5, 3), dtype=np.uint8), rng.integers(0, 4, N_ITEMS)
    if kind == "arrays":
        return (x, y)
    if kind == "dataset":
        return [(x[i] if i % 11 else None, int(y[i])) for i in range(N_ITEMS)]  # a list is map-style
    return ((x[i] if i % 13 else b"junk", ("a", "b", "c", "d")[y[i]]) for i in range(N_ITEMS))


def write_source(kind: str, out: str, resume: bool = False):
    return h5stream.write(out, make_source(kind), block_rows=8, commit_rows=16, seed=3, resume=resume)


@pytest.mark.parametrize("kind", ["arrays", "dataset", "generator"])
@pytest.mark.parametrize("kill_at", ["flush:1", "flush:3", "flush:8", "flush:9", "flush:14", "marker:5"])
def test_a_write_killed_mid_way_continues_to_the_store_an_uninterrupted_write_makes(kind, kill_at, tmp_path):
    whole = tmp_path / "whole.h5"
    write_source(kind, str(whole))
    out = tmp_path / "killed.h5"
    # kill_at: before the k-th flush (the 1st: before any row; 8 and 14: between a commit's two flushes), or
    # after the k-th flush of the published store while its flushing marker is still there
    proc = subprocess.run([sys.executable, "-c", CHILD, ROOT, str(out), kill_at, kind],
                          env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9 and "finished" not in proc.stdout, proc.stderr[-2000:]
    if kill_at.startswith("marker"):
        assert os.path.exists(schema.flushing_path(str(out)))  # resume rebuilds it first
    elif os.path.exists(out):
        meta = h5stream.read_meta(out)
        assert 0 < meta.rows < N_ITEMS and not meta.ingest.finished  # it says it is unfinished, and how to go on
        assert "h5stream.write(" in unfinished_message(meta) and "resume=True" in unfinished_message(meta)
    else:
        assert kill_at == "flush:1"  # killed before its first commit: no store under that name
    result = write_source(kind, str(out), resume=True)
    assert result.resumed_from < N_ITEMS
    assert_same(contents(out), contents(whole))
    assert h5stream.read_meta(out).ingest.finished and h5stream.read_meta(out).checksum_problem is None


def test_a_writer_continued_by_hand_starts_where_the_store_says(tmp_path):
    items = [(np.full((3, 3), i, np.uint8), i % 2) for i in range(40)]
    w = h5stream.Writer(tmp_path / "h.h5", block_rows=4, commit_rows=4)
    for image, label in items[:22]:
        w.add(image, label)
    w._store.discard()  # as if the process died: what the last commit published is what is there
    w._lock.release()
    with h5stream.Writer(tmp_path / "h.h5", resume=True) as w:
        assert w.consumed == 20  # the commits end on block boundaries (4 rows)
        for image, label in items[w.consumed:]:
            w.add(image, label)
    c = contents(tmp_path / "h.h5")
    np.testing.assert_array_equal(c[schema.IMAGES][:, 0, 0, 0], np.arange(40))


def test_an_error_in_the_source_keeps_what_was_written_unfinished_and_resume_finishes_it(tmp_path):
    def photos(fail_at=None):
        for i in range(90):
            if i == fail_at:
                raise RuntimeError("the database went away")
            yield np.full((4, 4, 3), i, np.uint8), i % 3

    h5stream.write(tmp_path / "whole.h5", photos(), block_rows=8, commit_rows=8)
    out = tmp_path / "o.h5"
    with pytest.raises(RuntimeError, match="database went away"):
        h5stream.write(out, photos(fail_at=70), block_rows=8, commit_rows=8)
    meta = h5stream.read_meta(out)
    assert meta.rows == 70 and not meta.ingest.finished  # the 70 items before the error, not a finished store
    assert h5stream.write(out, photos(), resume=True).resumed_from == 70
    assert_same(contents(out), contents(tmp_path / "whole.h5"))


def test_a_channels_first_tensor_is_skipped_with_a_hint(tmp_path):
    with h5stream.Writer(tmp_path / "c.h5") as w:
        w.add(np.zeros((8, 8, 3), np.uint8), 0)
        assert not w.add(np.zeros((3, 8, 8), np.uint8), 1)
    assert "channels-first" in contents(tmp_path / "c.h5")["report"]["1"]


def test_hugging_face_style_dict_items_with_class_names_given(tmp_path):
    rows = [{"image": Image.new("L", (9, 7), 10 * i), "label": ("b", "a")[i % 2]} for i in range(10)]
    rows.append({"image": Image.new("RGB", (9, 7)), "label": "c"})  # not one of the classes given: skipped
    result = h5stream.write(tmp_path / "hf.h5", rows, classes=["a", "b"], order="sorted")
    meta = h5stream.read_meta(tmp_path / "hf.h5")
    assert (result.rows, meta.image_shape, meta.class_names) == (10, (7, 9, 1), ("a", "b"))
    c = contents(tmp_path / "hf.h5")
    np.testing.assert_array_equal(c[schema.LABELS], [1, 0] * 5)
    np.testing.assert_array_equal(c[schema.IMAGES][:, 0, 0, 0], 10 * np.arange(10))
    assert "not one of the classes given" in c["report"]["10"]


def _photos(n, side=32, seed=0):
    """Smooth images (JPEG's kind): a gradient per image plus a little noise."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 200, side, dtype=np.float32)
    base = ramp[None, :, None, None] + ramp[None, None, :, None] * 0.2
    return np.clip(base + rng.normal(0, 4, (n, side, side, 3)) + rng.integers(0, 50, (n, 1, 1, 3)), 0,
                   255).astype(np.uint8)


@pytest.mark.parametrize("encoding", ["jpeg", "auto"])
def test_an_encoded_write_stores_jpeg_rows_that_stream_and_continue_by_hand(tmp_path, h5cli, encoding):
    from h5stream.store.encoded import EncodedArray
    from h5stream.store.jpeg import decode

    x, y = _photos(40), np.arange(40) % 3
    w = h5stream.Writer(tmp_path / "j.h5", block_rows=4, commit_rows=4, encoding=encoding, quality=85)
    for image, label in zip(x[:22], y[:22]):
        w.add(image, label)
    w._store.discard()  # as if the process died
    w._lock.release()
    with h5stream.Writer(tmp_path / "j.h5", resume=True) as w:
        assert w.consumed == 20
        for image, label in zip(x[w.consumed:], y[w.consumed:]):
            w.add(image, label)
    meta = h5stream.read_meta(tmp_path / "j.h5")
    assert (meta.encoding, meta.jpeg_quality, meta.rows) == ("jpeg", 85, 40)
    with h5py.File(tmp_path / "j.h5", "r") as f:
        rows = EncodedArray.of(f).read(0, 40)
        stored = np.stack([decode(rows.row(i), (32, 32, 3)) for i in range(40)])
        order = [int(p) for p in pathrows.stored_bytes(f, 0, 40)]
    assert order == list(range(40))  # pushed items are stored in the order given
    assert np.abs(stored.astype(int) - x.astype(int)).mean() < 4  # JPEG q85 of smooth photos
    with h5stream.open(tmp_path / "j.h5", batch_size=8, shuffle=False) as s:
        got = np.concatenate([b for b, _ in s])
    np.testing.assert_array_equal(got, stored)
    assert h5cli("verify", str(tmp_path / "j.h5"))[0] == 0


def test_a_write_resumed_with_another_encoding_is_refused_in_one_line(tmp_path):
    h5stream.write(tmp_path / "r.h5", (_photos(10), np.arange(10) % 2), order="sorted")
    with pytest.raises(ConfigError, match="store has encoding raw, this write asks for jpeg"):
        h5stream.write(tmp_path / "r.h5", (_photos(10), np.arange(10) % 2), resume=True, order="sorted",
                       encoding="jpeg")


class _HeldImage:
    """An image whose pixels are handed over only once ``release`` is set: the thread adding it stays inside
    ``Writer.add`` until then (``entered`` says it is there)."""

    def __init__(self, pixels, entered, release):
        self.pixels, self.entered, self.release = pixels, entered, release

    def __array__(self, dtype=None, copy=None):
        self.entered.set()
        assert self.release.wait(60)
        return self.pixels


def test_a_writer_used_by_a_second_thread_at_once_is_one_clear_error_and_keeps_its_rows_whole(tmp_path):
    import threading

    out = tmp_path / "o.h5"
    rows = np.arange(6 * 4 * 4 * 3, dtype=np.uint8).reshape(6, 4, 4, 3)
    entered, release = threading.Event(), threading.Event()
    with h5stream.Writer(out) as w:
        w.add(rows[0], 0)
        inside = threading.Thread(target=w.add, args=(_HeldImage(rows[1], entered, release), 1))
        inside.start()
        try:
            assert entered.wait(60)
            with pytest.raises(ConfigError, match=r"o\.h5: add\(\) while another thread is inside this Writer; "
                                                  "a Writer is used by one thread at a time"):
                w.add(rows[5], 5)
            with pytest.raises(ConfigError, match=r"add_rows\(\) while another thread is inside"):
                w.add_rows(rows[4:], np.array([4, 5]), np.array([4, 5]))
            with pytest.raises(ConfigError, match=r"close\(\) while another thread is inside"):
                w.close()
        finally:
            release.set()
            inside.join()
        for k in (2, 3):
            w.add(rows[k], k)
    got = contents(out)
    np.testing.assert_array_equal(got[schema.IMAGES], rows[:4])
    np.testing.assert_array_equal(got[schema.LABELS], np.arange(4))
    assert [int(p) for p in got[schema.PATHS]] == [0, 1, 2, 3]


def test_a_store_path_of_bytes_is_written_and_one_of_another_type_is_one_clear_error(tmp_path):
    x = np.zeros((3, 4, 4, 3), np.uint8)
    out = tmp_path / "b.h5"
    result = h5stream.write(os.fsencode(out), (x, np.arange(3)))
    assert result.out == str(out) and result.rows == 3
    with h5stream.Writer(os.fsencode(tmp_path / "w.h5")) as w:
        w.add(x[0], 1)
    assert contents(tmp_path / "w.h5")[schema.LABELS].tolist() == [1]
    for bad in (123, None, ["o.h5"]):
        with pytest.raises(ConfigError, match=f"the store's path must be a file name .* got {type(bad).__name__}"):
            h5stream.write(bad, (x, np.arange(3)))
    assert sorted(os.listdir(tmp_path)) == ["b.h5", "w.h5"]


def test_a_total_that_is_no_count_of_items_is_one_clear_error_and_writes_nothing(tmp_path):
    out = tmp_path / "t.h5"
    for bad in ("abc", -1, 2.5, True, [3]):
        with pytest.raises(ConfigError, match=r"total must be the count of items the source holds \(an int >= 0\)"):
            h5stream.Writer(out, total=bad)
    assert os.listdir(tmp_path) == []
    with h5stream.Writer(out, total=np.int64(3)) as w:
        w.add(np.zeros((4, 4, 3), np.uint8), 0)
    from h5stream.store.meta import read_meta

    assert "1 of 3" in unfinished_message(read_meta(str(out)))
