"""``validation_split`` holds out a sample of the rows, or is refused: a store written in class order (by the Python
writer from an iterable, or a set of parts each of one class) never gets a validation subset of its last class."""

from __future__ import annotations

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
