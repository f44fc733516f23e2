"""What a Keras user expects of `h5stream ingest` on a folder or a labels CSV.

Class names from a CSV column of strings (flow_from_dataframe), ``--classes`` to choose and order classes
(flow_from_directory(classes=) / image_dataset_from_directory(class_names=)), symlinks as
image_dataset_from_directory(follow_links=) walks them, ``--resize pad`` filling with 0 as
pad_to_aspect_ratio does, and every file not ingested listed in OUT.skipped.csv.  Real image files, the real
CLI in-process; Keras' own directory indexer is the oracle where it is installed.
"""

from __future__ import annotations

import csv
import json
import os

import h5py
import numpy as np
import pytest

from h5stream.samples import make_class_folder, nearest_class
from h5stream.store import schema
from h5stream.store.meta import read_meta
from h5stream.store import pathrows

ANIMALS = ("bird", "cat", "dog")  # make_class_folder's colour index = sorted position


def read_store(path):
    """(images, labels, paths, attrs) of the committed rows, with plain h5py."""
    with h5py.File(path, "r") as f:
        n = int(f.attrs[schema.ATTR_COMMITTED])
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        return f["images"][:n], f["labels"][:n], [p.decode() for p in pathrows.stored_bytes(f, 0, n)], attrs


def read_report(out):
    with open(schema.skipped_report_path(str(out)), newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["path", "reason"]
    return {r[0]: r[1] for r in rows[1:]}


def write_csv(path, header, rows):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return str(path)


@pytest.fixture
def animals(tmp_path):
    """bird/3, cat/4, dog/5 (30x40 PNG/JPEG) and a CSV naming each file with its class as text.
    Returns (root, csv path, [(relpath, colour index)])."""
    root = tmp_path / "src"
    written = make_class_folder(root, classes=ANIMALS, per_class=(3, 4, 5), size=(30, 40), seed=3)
    labels_csv = write_csv(tmp_path / "labels.csv", ["filename", "label"],
                           [(rel, ANIMALS[k]) for rel, k in written])
    return str(root), labels_csv, written


# -- labels CSV: a column of names is a classification ------------------------------------------


def test_csv_column_of_names_is_a_class_label_stored_as_folders_store_it(animals, tmp_path, h5cli):
    root, labels_csv, written = animals
    from_csv, from_folders = tmp_path / "csv.h5", tmp_path / "folders.h5"
    code, stdout, err = h5cli("ingest", root, from_csv, "--labels", labels_csv, "--size", "16", "--workers", "0")
    assert code == 0, err
    assert "ingested 12, skipped 0" in stdout
    assert h5cli("ingest", root, from_folders, "--size", "16", "--workers", "0")[0] == 0
    csv_meta, folder_meta = read_meta(str(from_csv)), read_meta(str(from_folders))
    assert csv_meta.label_kind == folder_meta.label_kind == "class"
    assert csv_meta.class_names == folder_meta.class_names == ANIMALS  # sorted, as Keras sorts class names
    assert csv_meta.label_columns == ("label",)
    images, labels, paths, _ = read_store(from_csv)
    assert labels.dtype == np.int64
    assert sorted(paths) == sorted(rel for rel, _ in written)
    for image, label in zip(images, labels):
        assert nearest_class(image, len(ANIMALS)) == label  # the index of its own class name
    code, text, _ = h5cli("info", from_csv)
    assert code == 0 and "label kind      class (index into the class names, from the CSV column label)" in text
    code, text, _ = h5cli("info", from_csv, "--json")
    info = json.loads(text)
    assert info["label_kind"] == "class" and info["classes"] == {"bird": 3, "cat": 4, "dog": 5}


def test_csv_classes_flag_chooses_and_orders_classes_and_lists_the_rows_left_out(animals, tmp_path, h5cli):
    root, labels_csv, written = animals
    out = tmp_path / "o.h5"
    code, stdout, err = h5cli("ingest", root, out, "--labels", labels_csv, "--classes", "dog,bird",
                              "--size", "16", "--workers", "0")
    assert code == 0, err
    assert read_meta(str(out)).class_names == ("dog", "bird")
    images, labels, paths, _ = read_store(out)
    assert sorted(paths) == sorted(rel for rel, k in written if ANIMALS[k] in ("dog", "bird"))
    for image, label in zip(images, labels):
        assert ANIMALS[nearest_class(image, len(ANIMALS))] == ("dog", "bird")[label]
    report = read_report(out)
    cats = {rel for rel, k in written if ANIMALS[k] == "cat"}
    assert set(report) == cats
    assert all(report[rel] == "left out: class 'cat' not in --classes" for rel in cats)
    assert "left out 4" in stdout


def test_csv_numbers_stay_regression_unless_label_kind_class(animals, tmp_path, h5cli):
    root, _, written = animals
    # 0/1/2/10 as a pandas CSV would hold them: numbers.  Keras' flow_from_dataframe refuses numbers as classes
    # (class_mode="raw" takes them as targets), so by default they are regression targets.
    codes = {"bird": "2", "cat": "10", "dog": "0"}
    labels_csv = write_csv(tmp_path / "n.csv", ["path", "y"], [(rel, codes[ANIMALS[k]]) for rel, k in written])
    reg, cls = tmp_path / "reg.h5", tmp_path / "cls.h5"
    assert h5cli("ingest", root, reg, "--labels", labels_csv, "--size", "8", "--workers", "0")[0] == 0
    meta = read_meta(str(reg))
    assert meta.label_kind == "regression" and meta.class_names is None
    assert "label kind      regression (float targets from CSV column y)" in h5cli("info", reg)[1]
    code, _, err = h5cli("ingest", root, cls, "--labels", labels_csv, "--label-kind", "class", "--size", "8",
                         "--workers", "0")
    assert code == 0, err
    meta = read_meta(str(cls))
    assert meta.label_kind == "class" and meta.class_names == ("0", "2", "10")  # by number, not "10" < "2"
    images, labels, _, _ = read_store(cls)
    for image, label in zip(images, labels):
        assert codes[ANIMALS[nearest_class(image, len(ANIMALS))]] == meta.class_names[label]


def test_csv_class_column_needs_one_label_column(animals, tmp_path, h5cli):
    root, _, written = animals
    labels_csv = write_csv(tmp_path / "two.csv", ["path", "label", "weight"],
                           [(rel, ANIMALS[k], "0.5") for rel, k in written])
    out = tmp_path / "o.h5"
    code, _, err = h5cli("ingest", root, out, "--labels", labels_csv)
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "class labels come from one column" in err and "--label-columns" in err
    assert not out.exists()
    code, _, err = h5cli("ingest", root, out, "--labels", labels_csv, "--label-columns", "label", "--workers", "0",
                         "--size", "8")
    assert code == 0, err
    assert read_meta(str(out)).class_names == ANIMALS


# -- a CSV row for a file that is not there -------------------------------------------------------


def test_csv_row_for_a_missing_file_is_skipped_and_listed_unless_strict(animals, tmp_path, h5cli):
    root, _, written = animals
    rows = [(rel, ANIMALS[k]) for rel, k in written] + [("cat/gone.png", "cat")]
    labels_csv = write_csv(tmp_path / "m.csv", ["filename", "label"], rows)
    out = tmp_path / "o.h5"
    code, stdout, err = h5cli("ingest", root, out, "--labels", labels_csv, "--size", "8", "--workers", "0")
    assert code == 0, err
    assert "ingested 12, skipped 1" in stdout
    assert read_report(out) == {"cat/gone.png": "listed in m.csv (line 14) but does not exist"}
    assert read_meta(str(out)).skipped_files == 1
    strict = tmp_path / "strict.h5"
    code, _, err = h5cli("ingest", root, strict, "--labels", labels_csv, "--strict", "--workers", "0")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "gone.png: listed in m.csv (line 14) but does not exist; --strict stops" in err
    assert not strict.exists() and not os.path.exists(schema.skipped_report_path(str(strict)))


# -- --classes for folders ------------------------------------------------------------------------


def test_folder_classes_flag_chooses_and_orders_class_folders(animals, tmp_path, h5cli):
    root, _, written = animals
    out = tmp_path / "o.h5"
    code, stdout, err = h5cli("ingest", root, out, "--classes", "dog,bird", "--size", "16", "--workers", "0")
    assert code == 0, err
    assert read_meta(str(out)).class_names == ("dog", "bird")
    images, labels, paths, _ = read_store(out)
    assert sorted(paths) == sorted(rel for rel, k in written if ANIMALS[k] != "cat")
    for image, label in zip(images, labels):
        assert ANIMALS[nearest_class(image, len(ANIMALS))] == ("dog", "bird")[label]
    assert read_report(out) == {"cat/": "left out: class folder not in --classes; not searched"}
    code, _, err = h5cli("ingest", root, tmp_path / "typo.h5", "--classes", "dog,cow")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "no class folder 'cow'" in err and "bird, cat, dog" in err


def test_folder_classes_match_keras_class_names(animals, tmp_path, h5cli):
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    dataset_utils = pytest.importorskip("keras.src.utils.dataset_utils")
    root, _, _ = animals
    out = tmp_path / "o.h5"
    assert h5cli("ingest", root, out, "--classes", "dog,bird", "--size", "8", "--workers", "0")[0] == 0
    paths, labels, class_names = dataset_utils.index_directory(root, "inferred", formats=(".png", ".jpg"),
                                                               class_names=["dog", "bird"], shuffle=False,
                                                               verbose=False)
    _, stored_labels, stored_paths, _ = read_store(out)
    ours = dict(zip(stored_paths, stored_labels.tolist()))
    theirs = {os.path.relpath(p, root): int(k) for p, k in zip(paths, labels)}
    assert read_meta(str(out)).class_names == tuple(class_names)
    assert ours == theirs


# -- symlinks -------------------------------------------------------------------------------------


@pytest.fixture
def linked(tmp_path):
    """src/bird, src/cat (real); src/dog -> elsewhere/dog (a symlinked class folder); src/cat/more -> extra/
    (a symlinked folder inside a class, 2 images); src/cat/loop -> src/cat (a loop).
    Returns (root, {relpath: colour index} of the real and top-level linked files, extra relpaths)."""
    root, elsewhere = tmp_path / "src", tmp_path / "elsewhere"
    written = make_class_folder(root, classes=("bird", "cat"), per_class=(2, 3), size=(30, 40), seed=4)
    dogs = make_class_folder(elsewhere, classes=ANIMALS, per_class=(1, 1, 3), size=(30, 40), seed=5)
    os.symlink(elsewhere / "dog", root / "dog")
    make_class_folder(tmp_path / "extra", classes=ANIMALS, per_class=(0, 2, 0), size=(30, 40), seed=6)
    os.symlink(tmp_path / "extra" / "cat", root / "cat" / "more")
    os.symlink(root / "cat", root / "cat" / "loop")
    base = {rel: k for rel, k in written} | {rel: k for rel, k in dogs if rel.startswith("dog/")}
    return str(root), base, ["cat/more/cat_00000.jpg", "cat/more/cat_00001.png"]


def test_symlinks_as_keras_walks_them_and_every_folder_not_entered_is_listed(linked, tmp_path, h5cli):
    root, base, _ = linked
    out = tmp_path / "o.h5"
    code, stdout, err = h5cli("ingest", root, out, "--size", "8", "--workers", "0")
    assert code == 0, err
    assert read_meta(str(out)).class_names == ANIMALS  # the symlinked top-level folder is a class, as in Keras
    _, _, paths, _ = read_store(out)
    assert sorted(paths) == sorted(base)
    report = read_report(out)
    assert set(report) == {"cat/more/", "cat/loop/"}
    assert all(why.startswith("left out: symlinked folder, not entered; use --follow-links") for why in report.values())
    keras_utils = _keras_dataset_utils()
    if keras_utils is not None:  # Keras (follow_links=False) indexes the same files
        found, _, names = keras_utils.index_directory(root, "inferred", formats=(".png", ".jpg"), shuffle=False,
                                                      verbose=False)
        assert tuple(names) == ANIMALS
        assert sorted(os.path.relpath(p, root) for p in found) == sorted(paths)


def test_follow_links_enters_linked_folders_and_lists_loops(linked, tmp_path, h5cli):
    root, base, extra = linked
    out = tmp_path / "o.h5"
    code, _, err = h5cli("ingest", root, out, "--follow-links", "--size", "8", "--workers", "0")
    assert code == 0, err
    images, labels, paths, _ = read_store(out)
    assert sorted(paths) == sorted(list(base) + extra)
    for image, label in zip(images, labels):  # the linked cat images carry class cat
        assert nearest_class(image, len(ANIMALS)) == label
    report = read_report(out)
    assert set(report) == {"cat/loop/"}
    assert report["cat/loop/"].startswith("left out: symlink to ") and "a folder it lies in" in report["cat/loop/"]


def test_csv_mode_lists_the_symlinked_folders_it_does_not_enter(linked, tmp_path, h5cli):
    root, base, _ = linked
    real = {rel: k for rel, k in base.items() if not rel.startswith("dog/")}
    labels_csv = write_csv(tmp_path / "l.csv", ["path", "label"], [(rel, ANIMALS[k]) for rel, k in real.items()])
    out = tmp_path / "o.h5"
    code, _, err = h5cli("ingest", root, out, "--labels", labels_csv, "--size", "8", "--workers", "0")
    assert code == 0, err
    assert sorted(read_store(out)[2]) == sorted(real)
    hint = ("left out: symlinked folder, not entered; l.csv lists no file in it "
            "(--follow-links lists the images it holds)")
    assert read_report(out) == {"dog/": hint, "cat/more/": hint, "cat/loop/": hint}


def _keras_dataset_utils():
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    try:
        from keras.src.utils import dataset_utils
    except ImportError:
        return None
    return dataset_utils


# -- --resize pad ---------------------------------------------------------------------------------


def test_pad_fills_black_as_keras_and_pad_fill_chooses_and_is_kept_on_append(animals, tmp_path, h5cli):
    root, _, _ = animals
    out = tmp_path / "o.h5"
    only_bird = ("--classes", "bird")
    code, _, err = h5cli("ingest", root, out, "--size", "20", "--resize", "pad", *only_bird, "--workers", "0")
    assert code == 0, err
    images, _, _, attrs = read_store(out)
    # 30x40 fits as 15x20: bands of 2-3 rows above and below, 0 as Keras' pad_to_aspect_ratio pads.
    assert (images[:, :2] == 0).all() and (images[:, -2:] == 0).all()
    assert json.loads(attrs[schema.ATTR_PAD_FILL]) == [0, 0, 0]
    white = tmp_path / "w.h5"
    code, _, err = h5cli("ingest", root, white, "--size", "20", "--resize", "pad", "--pad-fill", "255", *only_bird,
                         "--workers", "0")
    assert code == 0, err
    assert (read_store(white)[0][:, :2] == 255).all()
    code, _, err = h5cli("ingest", root, white, "--append", "--classes", "bird,cat", "--workers", "0")
    assert code == 0, err
    images, labels, _, _ = read_store(white)
    assert (labels == 1).sum() == 4 and (images[:, :2] == 255).all()  # appended rows padded as the store's
    code, _, err = h5cli("ingest", root, white, "--append", "--pad-fill", "0")
    assert code == 1 and "store has pad fill 255,255,255, this run asks for 0,0,0" in err
    code, _, err = h5cli("ingest", root, tmp_path / "bad.h5", "--pad-fill", "300")
    assert code == 1 and "--pad-fill '300'" in err


def test_a_store_written_before_pad_fill_keeps_its_white_padding_on_append(animals, tmp_path, h5cli):
    root, _, _ = animals
    out = tmp_path / "old.h5"
    code, _, err = h5cli("ingest", root, out, "--size", "20", "--resize", "pad", "--pad-fill", "255",
                         "--classes", "bird", "--workers", "0")
    assert code == 0, err
    with h5py.File(out, "r+") as f:  # as older versions wrote it: padded with the alpha background, no pad_fill
        del f.attrs[schema.ATTR_PAD_FILL]
    code, _, err = h5cli("ingest", root, out, "--append", "--workers", "0")
    assert code == 0, err
    images, labels, _, _ = read_store(out)
    assert len(labels) == 12 and (images[:, :2] == 255).all() and (images[:, -2:] == 255).all()
