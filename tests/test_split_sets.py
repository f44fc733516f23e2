"""``validation_split`` holds out a sample of the rows, or is refused: a store written in class order (by the Python
writer from an iterable, or a set of parts each of one class) never gets a validation subset of its last class."""

from __future__ import annotations

import os

import numpy as np
import pytest

import h5stream
from h5stream.errors import ConfigError

pytestmark = pytest.mark.usefixtures("no_leaks")

CLASSES = 3
PER_CLASS = 40


def _class_rows(k: int):
    images = np.zeros((PER_CLASS, 4, 4, 3), np.uint8)
    images[:, 0, 0, 0] = np.arange(PER_CLASS)
    images[:, 0, 0, 1] = k
    return images, np.full(PER_CLASS, k, np.int64)


def _labels(spec, **kw):
    with h5stream.open(spec, batch_size=50, **kw) as s:
        return np.concatenate([y for _, y in s])


def test_a_set_of_parts_each_of_one_class_is_refused_not_given_its_last_class(tmp_path):
    """Each part is written shuffled by the Python writer, but holds one class: the set's last rows are one class."""
    names = [f"c{k}" for k in range(CLASSES)]
    parts = []
    for k in range(CLASSES):
        path = str(tmp_path / f"class-{k}.h5")
        h5stream.write(path, _class_rows(k), classes=names, order="shuffled")
        parts.append(path)
    assert sorted(np.unique(_labels(parts)).tolist()) == [0, 1, 2]  # the set streams whole
    for subset in ("training", "validation", "both"):
        with pytest.raises(ConfigError, match=r"set of 3 parts.*open the validation parts as a set of their own"):
            h5stream.open(parts, validation_split=0.25, subset=subset)
    with pytest.raises(ConfigError, match="set of 3 parts"):
        h5stream.open(str(tmp_path / "class-*.h5"), validation_split=0.25, subset="validation")
    # what the message says to do: the caller, who knows what the parts hold, names the validation rows
    assert sorted(np.unique(_labels(parts[:2])).tolist()) == [0, 1]


def test_the_python_writer_in_class_order_is_refused_and_arrays_are_stored_shuffled(tmp_path):
    images = np.concatenate([_class_rows(k)[0] for k in range(CLASSES)])
    labels = np.repeat(np.arange(CLASSES), PER_CLASS)
    names = [f"c{k}" for k in range(CLASSES)]
    in_order = str(tmp_path / "iterable.h5")
    h5stream.write(in_order, iter(list(zip(images, labels))), classes=names)  # an iterable: stored in its order
    with pytest.raises(ConfigError, match="shuffled order.*'sorted'"):
        h5stream.open(in_order, validation_split=0.25, subset="validation")
    arrays = str(tmp_path / "arrays.h5")
    h5stream.write(arrays, (images, labels), classes=names)  # arrays: stored in a seeded random order
    val = _labels(arrays, validation_split=0.25, subset="validation")
    train = _labels(arrays, validation_split=0.25, subset="training")
    assert len(val) == 30 and len(train) == 90
    assert np.bincount(val, minlength=CLASSES).min() >= 5  # every class, near its share (10)


def test_the_parts_of_one_ingest_part_set_split_disjoint_and_every_class_held_out(class_src, h5cli, tmp_path):
    root, written = class_src
    parts = []
    for i in range(3):
        out = tmp_path / f"p{i}.h5"
        assert h5cli("ingest", root, out, "--size", "8", "--workers", "0", "--part", f"{i}/3")[0] == 0
        parts.append(str(out))

    def paths(subset, seed):
        with h5stream.open(parts, batch_size=4, seed=seed, validation_split=0.34, subset=subset) as s:
            got = [p for p in s.file_paths]
            labels = np.concatenate([y for _, y in s])
        return got, labels

    train, _ = paths("training", 1)
    val, val_labels = paths("validation", 1)
    assert paths("validation", 2)[0] == val and paths("training", 2)[0] == train  # the same split for every seed
    assert not set(train) & set(val) and sorted(train + val) == sorted(rel for rel, _ in written)
    assert len(val) == int(0.34 * len(written))
    assert len(np.unique(val_labels)) > 1  # a hash-cut part samples the classes


def test_a_store_grown_by_an_append_of_new_files_is_refused_and_a_killed_ingest_continued_is_not(class_src_copy,
                                                                                                 h5cli, tmp_path):
    import shutil

    import h5py

    from h5stream.store import rebuild
    from h5stream.store.lock import StoreLock
    from h5stream.store.meta import read_meta

    root, written = class_src_copy
    flags = ("--size", "8", "--workers", "0")
    # an ingest killed after its first commits and finished with --append: one storage order, the split allowed
    ref, cut = tmp_path / "ref.h5", tmp_path / "cut.h5"
    assert h5cli("ingest", root, ref, *flags)[0] == 0
    assert h5cli("ingest", root, cut, *flags, "--block-rows", "2", "--commit-rows", "2")[0] == 0
    with h5py.File(cut, "r+") as f:
        f.attrs["committed_rows"] = 4  # what a killed run leaves
    assert h5cli("ingest", root, cut, *flags, "--append")[0] == 0
    assert read_meta(str(cut)).appended_from is None
    with h5stream.open(str(cut), validation_split=0.3, subset="validation") as a, \
            h5stream.open(str(ref), validation_split=0.3, subset="validation") as b:
        assert a.file_paths == b.file_paths  # the rows of the run that was not stopped

    # a class folder added later and appended: its rows come last, and would be the validation subset
    out = tmp_path / "grown.h5"
    shutil.move(os.path.join(root, "dog"), tmp_path / "dog")
    assert h5cli("ingest", root, out, *flags)[0] == 0
    before = read_meta(str(out)).rows
    assert h5cli("ingest", root, out, *flags, "--append")[0] == 0  # nothing new: nothing marked
    assert read_meta(str(out)).appended_from is None
    shutil.move(tmp_path / "dog", os.path.join(root, "dog"))
    assert h5cli("ingest", root, out, *flags, "--append")[0] == 0
    assert read_meta(str(out)).appended_from == before
    for subset in ("training", "validation"):
        with pytest.raises(ConfigError, match=rf"rows {before}\.\. were added by ingest --append from files the "
                                              "first ingest did not list.*re-ingest"):
            h5stream.open(str(out), validation_split=0.3, subset=subset)
    assert len(_labels(str(out))) == len(written)  # the store itself streams as before
    lock = StoreLock.acquire(str(out))
    try:
        rebuild.rebuild(str(out), lock)  # what repair does: the mark is kept
    finally:
        lock.release()
    assert read_meta(str(out)).appended_from == before
