"""`h5stream ingest` as Keras and torchvision users expect it in their first hour: files that are not images are
left out (not skipped), `--classes` means the same for a CSV as for folders, a CSV may name files by absolute
path inside SRC and call its path column anything, a `;`-separated CSV gets a hint, and the help says what each
command takes.  Real image folders, the real CLI in-process."""

from __future__ import annotations

import os

import pytest

from h5stream import cli
from h5stream.samples import make_class_folder
from h5stream.store.meta import read_meta

from test_ingest_keras_parity import ANIMALS, read_report, read_store, write_csv

NOT_IMAGES = ("README.md", "Thumbs.db", "desktop.ini", ".DS_Store")


@pytest.fixture
def animals(tmp_path):
    """bird/3, cat/4, dog/5 and a CSV naming each file with its class.  Returns (root, csv, [(relpath, index)])."""
    root = tmp_path / "src"
    written = make_class_folder(root, classes=ANIMALS, per_class=(3, 4, 5), size=(30, 40), seed=3)
    labels_csv = write_csv(tmp_path / "labels.csv", ["filename", "label"], [(rel, ANIMALS[k]) for rel, k in written])
    return str(root), labels_csv, written


def _add_non_images(root):
    for folder in ("bird", "cat"):
        for name in NOT_IMAGES:
            with open(os.path.join(root, folder, name), "wb") as fh:
                fh.write(b"not an image\n")


def test_files_that_are_not_images_are_left_out_not_skipped_even_with_strict(animals, tmp_path, h5cli):
    root, _csv, written = animals
    _add_non_images(root)
    out = tmp_path / "o.h5"
    code, stdout, err = h5cli("ingest", root, out, "--strict", "--size", "8", "--workers", "0")
    assert code == 0, err
    assert "ingested 12, skipped 0" in stdout and "left out 8 (2 hidden, 6 not an image)" in stdout
    assert read_meta(str(out)).skipped_files == 0
    report = read_report(out)
    assert report["cat/README.md"] == "left out: not an image file extension (.md); only image files are ingested"
    assert report["bird/Thumbs.db"].startswith("left out: not an image")
    assert sorted(read_store(out)[2]) == sorted(rel for rel, _ in written)


def test_strict_still_stops_on_an_image_that_fails(animals, tmp_path, h5cli):
    root, _csv, _written = animals
    _add_non_images(root)
    open(os.path.join(root, "dog", "empty.png"), "wb").close()
    out = tmp_path / "o.h5"
    code, _out, err = h5cli("ingest", root, out, "--strict", "--size", "8", "--workers", "0")
    assert code == 1 and err.count("\n") == 1 and "dog/empty.png" in err and "--strict" in err
    assert not out.exists()


def test_csv_classes_naming_a_class_the_column_lacks_is_refused_as_for_folders(animals, tmp_path, h5cli):
    root, labels_csv, _written = animals
    out = tmp_path / "o.h5"
    code, _out, err = h5cli("ingest", root, out, "--labels", labels_csv, "--classes", "dog,emu,bird")
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("h5stream: error: --classes: column 'label' of ") and "has no class 'emu'" in err
    assert "its classes are bird, cat, dog" in err and not out.exists()
    code, _out, err = h5cli("ingest", root, tmp_path / "f.h5", "--classes", "dog,emu")  # folders: the same answer
    assert code == 1 and "has no class folder 'emu'" in err


def test_absolute_csv_paths_inside_src_are_ingested_as_relative_ones(animals, tmp_path, h5cli):
    root, _csv, written = animals
    absolute = write_csv(tmp_path / "abs.csv", ["filename", "label"],
                         [(os.path.join(os.path.abspath(root), rel), ANIMALS[k]) for rel, k in written])
    out = tmp_path / "o.h5"
    code, stdout, err = h5cli("ingest", root, out, "--labels", absolute, "--size", "8", "--workers", "0")
    assert code == 0, err
    assert "ingested 12, skipped 0" in stdout
    assert sorted(read_store(out)[2]) == sorted(rel for rel, _ in written)  # stored relative to SRC
    relative_root = os.path.relpath(root)  # SRC given relative, the CSV absolute: the same folder
    code, _out, err = h5cli("ingest", relative_root, tmp_path / "r.h5", "--labels", absolute, "--size", "8",
                            "--workers", "0")
    assert code == 0, err
    outside = write_csv(tmp_path / "out.csv", ["filename", "label"], [(str(tmp_path / "abs.csv"), "bird")])
    code, _out, err = h5cli("ingest", root, tmp_path / "x.h5", "--labels", outside)
    assert code == 1 and "is outside the source folder" in err and not (tmp_path / "x.h5").exists()


def test_the_path_column_can_be_named_as_keras_x_col(animals, tmp_path, h5cli):
    root, _csv, written = animals
    named = write_csv(tmp_path / "x.csv", ["image", "label"], [(rel, ANIMALS[k]) for rel, k in written])
    out = tmp_path / "o.h5"
    code, _out, err = h5cli("ingest", root, out, "--labels", named, "--path-column", "image", "--size", "8",
                            "--workers", "0")
    assert code == 0, err
    meta = read_meta(str(out))
    assert meta.class_names == ANIMALS and meta.label_columns == ("label",)
    code, _out, err = h5cli("ingest", root, tmp_path / "n.h5", "--labels", named)
    assert code == 1 and "no 'path' or 'filename' column" in err and "--path-column" in err
    code, _out, err = h5cli("ingest", root, tmp_path / "w.h5", "--labels", named, "--path-column", "img")
    assert code == 1 and "no column 'img' (--path-column)" in err
    code, _out, err = h5cli("ingest", root, tmp_path / "f.h5", "--path-column", "image")
    assert code == 1 and "--path-column needs --labels" in err


def test_a_semicolon_separated_csv_gets_a_delimiter_hint(animals, tmp_path, h5cli):
    root, _csv, written = animals
    semicolons = tmp_path / "semi.csv"
    semicolons.write_text("path;label\n" + "".join(f"{rel};{ANIMALS[k]}\n" for rel, k in written))
    code, _out, err = h5cli("ingest", root, tmp_path / "o.h5", "--labels", semicolons)
    assert code == 1 and err.count("\n") == 1
    assert "the header holds semicolons: save the file comma-separated" in err


@pytest.mark.parametrize(("command", "says", "never"), [
    ("info", ["STORE", "s3://"], ["OUT.h5"]),
    ("preview", ["GRID.png", ".jpg", ".webp"], ["--workers", "PNG grid"]),
    ("ingest", ["--path-column", "absolute", "left out either way"], []),
])
def test_help_says_what_each_command_takes(capsys, command, says, never):
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for word in says:
        assert word in text, word
    for word in never:
        assert word not in text, word
