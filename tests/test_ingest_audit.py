"""`h5stream ingest` against inputs a hostile or careless user gives it: labels CSV rows that do not fit their header,
and what the real CLI answers.  Real image folders, the real CLI in-process."""

from __future__ import annotations

import pytest

from h5stream.samples import make_class_folder
from h5stream.store.meta import read_meta

from test_ingest_keras_parity import ANIMALS, read_store


@pytest.fixture
def animals(tmp_path):
    """bird/3, cat/4, dog/5 (30x40 PNG/JPEG).  Returns (root, [(relpath, colour index)])."""
    root = tmp_path / "src"
    return str(root), make_class_folder(root, classes=ANIMALS, per_class=(3, 4, 5), size=(30, 40), seed=3)


@pytest.mark.parametrize("row", ["{rel},1,5", "{rel},2.5,extra"])
def test_a_csv_row_with_more_fields_than_the_header_is_refused_not_cut(animals, tmp_path, h5cli, row):
    """An unquoted comma (a decimal comma, a name with a comma) made a cell past the header, which was dropped: label
    1 stored for '1,5'."""
    root, written = animals
    lines = [f"{rel},{k}" for rel, k in written]
    lines[4] = row.format(rel=written[4][0])
    labels = tmp_path / "labels.csv"
    labels.write_text("path,label\n" + "\n".join(lines) + "\n")
    out = tmp_path / "o.h5"
    code, _out, err = h5cli("ingest", root, out, "--labels", labels, "--size", "8", "--workers", "0")
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith(f"h5stream: error: {labels} line 6: 3 fields, the header has 2; ") and "quoted" in err
    assert not out.exists()


def test_empty_cells_past_the_header_are_a_spreadsheets_trailing_commas_and_allowed(animals, tmp_path, h5cli):
    root, written = animals
    labels = tmp_path / "labels.csv"
    labels.write_text("path,label\n" + "".join(f"{rel},{k},,\r\n" for rel, k in written))
    out = tmp_path / "o.h5"
    code, _out, err = h5cli("ingest", root, out, "--labels", labels, "--size", "8", "--workers", "0")
    assert code == 0, err
    _images, stored, paths, _attrs = read_store(out)
    assert read_meta(str(out)).rows == len(written)
    assert dict(zip(paths, stored.tolist())) == {rel: float(k) for rel, k in written}


def test_write_overwrite_refuses_a_symlink_at_the_store_as_ingest_overwrite_does(tmp_path, h5cli):
    """Writer(overwrite=True) removed a link at its path and wrote the store in its place, where the user meant the
    file it names (a store on a larger disk, say); ingest --overwrite refuses it in one line."""
    import os

    import numpy as np

    import h5stream
    from h5stream.errors import StoreExistsError

    target, link = tmp_path / "elsewhere.h5", tmp_path / "train.h5"
    h5stream.write(target, np.zeros((4, 8, 8, 3), np.uint8))
    os.symlink(target, link)
    with pytest.raises(StoreExistsError, match="is a symbolic link .* which a new store would replace"):
        h5stream.write(link, np.full((4, 8, 8, 3), 7, np.uint8), overwrite=True)
    assert os.path.islink(link) and read_meta(str(target)).rows == 4
    src = tmp_path / "src"
    make_class_folder(src, classes=2, per_class=2, size=(8, 8))
    code, _out, err = h5cli("ingest", src, link, "--overwrite", "--size", "8", "--workers", "0")
    assert code == 1 and "is a symbolic link" in err and os.path.islink(link)


@pytest.mark.parametrize("block_rows", ["100000", "99999999999"])
def test_a_block_too_large_for_an_hdf5_chunk_is_one_line_and_leaves_no_file(tmp_path, h5cli, block_rows):
    """HDF5 refuses a chunk of 4 GiB or more: the ingest ended in a ValueError traceback from h5py, leaving
    OUT.h5.creating behind."""
    src = tmp_path / "src"
    make_class_folder(src, classes=2, per_class=2, size=(8, 8))
    out = tmp_path / "o.h5"
    code, _out, err = h5cli("ingest", src, out, "--size", "128", "--block-rows", block_rows, "--workers", "0")
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith(f"h5stream: error: {out}: {int(block_rows):,} rows a block of 128x128x3 images make chunks")
    assert "give at most 87,381 rows a block" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_write_refuses_a_block_too_large_for_an_hdf5_chunk_before_writing(tmp_path):
    import numpy as np

    import h5stream
    from h5stream.errors import ConfigError

    with pytest.raises(ConfigError, match="give at most 1,398,101 rows a block"):
        h5stream.write(tmp_path / "w.h5", np.zeros((3, 32, 32, 3), np.uint8), block_rows=2_000_000)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("out", ["", "newdir/"])
def test_an_empty_store_path_or_one_ending_in_a_slash_is_one_line_naming_it(tmp_path, h5cli, monkeypatch, out):
    """Both reached HDF5's create and came back as 'cannot create it (... No such file or directory); run the same
    command with --append to continue'."""
    import numpy as np

    import h5stream
    from h5stream.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    make_class_folder(tmp_path / "src", classes=2, per_class=2, size=(8, 8))
    code, _out, err = h5cli("ingest", "src", out, "--size", "8", "--workers", "0")
    assert code == 1 and err.count("\n") == 1, err
    assert ("path is empty" if not out else "newdir/: names a folder (it ends in /)") in err
    assert "give a file name such as" in err and "--append" not in err
    with pytest.raises(ConfigError, match="give a file name such as"):
        h5stream.write(out, np.zeros((2, 8, 8, 3), np.uint8))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


@pytest.mark.parametrize("arrays", [False, True])
def test_a_class_index_far_past_any_class_count_is_skipped_not_a_list_of_its_names(tmp_path, arrays):
    """A class index names every class below it ("0", "1", ...): an ID such as 2**40 given as a label made the
    writer build 2**40 names (a MemoryError after half a minute, or the machine's memory)."""
    import numpy as np

    import h5stream
    from h5stream.ingest.items import MAX_CLASSES

    images, labels = np.zeros((3, 4, 4, 3), np.uint8), [0, 2**40, 5]
    source = (images, np.array(labels)) if arrays else list(zip(images, labels))
    result = h5stream.write(tmp_path / "w.h5", source, order="sorted")
    assert result.rows == 2 and result.skipped == 1
    assert read_meta(str(tmp_path / "w.h5")).class_names == tuple(str(i) for i in range(6))
    report = (tmp_path / "w.h5.skipped.csv").read_text()
    assert f"class index {2**40} would make" in report and f"more than {MAX_CLASSES:,}" in report


@pytest.mark.parametrize("header", ["path,y,y", "path,path,y"])
def test_a_csv_header_naming_a_column_twice_is_refused(animals, tmp_path, h5cli, header):
    """Columns are found by name: with two 'y' columns the first stood in for both, regression targets (1, 1)
    stored for a row '1,2'."""
    root, written = animals
    labels = tmp_path / "labels.csv"
    labels.write_text(header + "\n" + "".join(f"{rel},{k},{k + 1}\n" for rel, k in written))
    out = tmp_path / "o.h5"
    code, _out, err = h5cli("ingest", root, out, "--labels", labels, "--size", "8", "--workers", "0")
    assert code == 1 and err.count("\n") == 1, err
    name = header.split(",")[1]
    assert f"the header names column {name!r} 2 times" in err and "give each column its own name" in err
    assert not out.exists()


@pytest.mark.parametrize(("columns", "says"), [("y,y", "--label-columns names 'y' twice"),
                                               ("path", "--label-columns names 'path', the column of file paths")])
def test_label_columns_naming_one_twice_or_the_path_column_are_refused(animals, tmp_path, h5cli, columns, says):
    """'y,y' stored each target twice, (1, 1); 'path' made every file a class of its own."""
    root, written = animals
    labels = tmp_path / "labels.csv"
    labels.write_text("path,y,z\n" + "".join(f"{rel},{k},{k + 1}\n" for rel, k in written))
    out = tmp_path / "o.h5"
    code, _out, err = h5cli("ingest", root, out, "--labels", labels, "--label-columns", columns, "--size", "8",
                            "--workers", "0")
    assert code == 1 and err.count("\n") == 1, err
    assert says in err and not out.exists()


@pytest.mark.filterwarnings("error")
def test_a_regression_label_past_float32_is_named_so_not_called_infinite(tmp_path):
    """1e39 is finite; stored as float32 it would be inf.  The skip said 'label 1e+39 is not finite'."""
    import numpy as np

    import h5stream

    image = np.zeros((4, 4, 3), np.uint8)
    items = [(image, 0.5), (image, 1e39), (image, float("inf"))]
    arrays = (np.stack([image] * 3), np.array([label for _, label in items]))
    for name, source in (("items", items), ("arrays", arrays)):
        result = h5stream.write(tmp_path / f"{name}.h5", source, order="sorted")
        assert result.rows == 1 and result.skipped == 2
        report = (tmp_path / f"{name}.h5.skipped.csv").read_text()
        assert "1,label 1e+39 is beyond the float32 range labels are stored in (largest 3.40282e+38)" in report
        assert "2,label inf is not finite" in report


def test_files_fixed_after_a_run_leave_the_skip_report_when_append_stores_them(tmp_path, h5cli):
    """Fix the files the report names, run --append: they were stored, yet the report still listed them as
    skipped and skipped_files still counted them."""
    import shutil

    from test_ingest_keras_parity import read_report

    src, out = tmp_path / "src", tmp_path / "o.h5"
    written = make_class_folder(src, classes=2, per_class=3, size=(8, 8))
    for name in ("a.jpg", "b.jpg"):
        (src / "class_0" / name).write_bytes(b"not a jpeg")
    code, _out, err = h5cli("ingest", src, out, "--size", "8", "--workers", "0")
    assert code == 0, err
    assert set(read_report(out)) == {"class_0/a.jpg", "class_0/b.jpg"} and read_meta(str(out)).skipped_files == 2
    shutil.copyfile(src / written[0][0], src / "class_0" / "a.jpg")  # a fixed
    code, stdout, err = h5cli("ingest", src, out, "--append", "--workers", "0")
    assert code == 0 and "ingested 1, skipped 1" in stdout, err
    assert read_report(out) == {"class_0/b.jpg": "not an image Pillow can read"}
    meta = read_meta(str(out))
    assert meta.rows == 7 and meta.skipped_files == 1 and meta.ingest.finished
    code, stdout, _err = h5cli("info", out)
    assert "skipped files   1 " in stdout
    shutil.copyfile(src / written[0][0], src / "class_0" / "b.jpg")  # b fixed: nothing is skipped any more
    code, stdout, err = h5cli("ingest", src, out, "--append", "--workers", "0")
    assert code == 0 and "ingested 1, skipped 0" in stdout, err
    assert read_meta(str(out)).skipped_files == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["o.h5", "src"]


def test_append_with_a_csv_listing_more_files_counts_and_lists_them_as_this_run_finds_them(tmp_path, h5cli):
    """A first CSV listed two files (the rest left out: not listed); a second lists all.  The files it stores left
    the report; the one it skips stayed 'left out: not listed', and skipped_files did not count it."""
    from test_ingest_keras_parity import read_report

    src, out = tmp_path / "src", tmp_path / "o.h5"
    written = make_class_folder(src, classes=2, per_class=3, size=(8, 8))
    (src / "class_0" / "z.jpg").write_bytes(b"not a jpeg")
    first, every = tmp_path / "first.csv", tmp_path / "every.csv"
    first.write_text("path,label\n" + "".join(f"{rel},c{k}\n" for rel, k in written[:2]))
    every.write_text("path,label\n" + "".join(f"{rel},c{k}\n" for rel, k in written) + "class_0/z.jpg,c0\n")
    code, _out, err = h5cli("ingest", src, out, "--labels", first, "--size", "8", "--workers", "0")
    assert code == 0, err
    assert read_report(out)["class_0/z.jpg"].startswith("left out: ") and read_meta(str(out)).skipped_files == 0
    code, stdout, err = h5cli("ingest", src, out, "--labels", every, "--append", "--workers", "0")
    assert code == 0 and "ingested 4, skipped 1, already stored 2" in stdout, err
    assert read_report(out) == {"class_0/z.jpg": "not an image Pillow can read"}
    assert read_meta(str(out)).skipped_files == 1


def _digest(path) -> str:
    import hashlib

    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_overwrite_that_stores_nothing_leaves_the_old_store_as_it_was(animals, tmp_path, h5cli):
    """--overwrite removed the old store before the first commit: a run whose files were all skipped (a mistyped
    source folder) left neither the old store nor a new one."""
    root, _ = animals
    out = tmp_path / "o.h5"
    assert h5cli("ingest", root, out, "--size", "8", "--workers", "0")[0] == 0
    before = _digest(out)
    bad = tmp_path / "bad" / "a"
    bad.mkdir(parents=True)
    (bad / "1.png").write_bytes(b"not a png")
    code, _out, err = h5cli("ingest", bad.parent, out, "--size", "8", "--workers", "0", "--overwrite")
    assert code == 1 and err.count("\n") == 1 and f"{out}: not replaced: every one of the 1 files" in err, err
    assert _digest(out) == before and read_meta(str(out)).rows == 12


def test_writer_overwrite_that_fails_before_its_first_commit_leaves_the_old_store(tmp_path):
    import numpy as np

    import h5stream

    out = tmp_path / "w.h5"
    h5stream.write(out, (np.zeros((5, 8, 8, 3), np.uint8), np.arange(5)))
    before = _digest(out)
    with pytest.raises(RuntimeError, match="the source broke"):
        with h5stream.Writer(out, overwrite=True):  # (rows added before a failure are committed: resumable)
            raise RuntimeError("the source broke")
    assert _digest(out) == before and read_meta(str(out)).rows == 5
    with h5stream.Writer(out, overwrite=True) as w:  # and one that commits replaces it
        for k in range(3):
            w.add(np.full((8, 8, 3), k, np.uint8), k)
    assert read_meta(str(out)).rows == 3


def test_an_interrupted_overwrite_before_its_first_commit_says_the_old_store_is_there(tmp_path):
    import numpy as np

    import h5stream
    from h5stream.commands.ingest import _how_far, _identity

    out = tmp_path / "o.h5"
    h5stream.write(out, (np.zeros((5, 8, 8, 3), np.uint8), np.arange(5)))
    assert "was not replaced: it is the store it was before this run" in _how_far(str(out), _identity(str(out)))
    replacing = _identity(str(out))
    h5stream.write(out, (np.zeros((7, 8, 8, 3), np.uint8), np.arange(7)), overwrite=True)
    assert "not replaced" not in _how_far(str(out), replacing)


def test_more_class_names_than_one_attribute_holds_are_one_line_before_a_store_is_made(tmp_path, h5cli):
    """HDF5's object header format keeps 64 KiB in one attribute: 6,000 class folders named as ImageNet's failed with
    'cannot create it (HDF5 error back trace); check the disk'."""
    import numpy as np
    from PIL import Image

    src = tmp_path / "src"
    for i in range(6000):
        (src / f"n{1440764 + 7 * i:08d}").mkdir(parents=True)
    Image.fromarray(np.full((4, 4, 3), 9, np.uint8)).save(src / "n01440764" / "a.png")
    out = tmp_path / "o.h5"
    code, _out, err = h5cli("ingest", src, out, "--size", "4", "--workers", "0")
    assert code == 1 and err.count("\n") == 1, err
    assert "the names of 6,000 classes take" in err and "at most 64,000" in err, err
    assert not out.exists() and not list(tmp_path.glob("o.h5*"))


def test_an_append_past_the_class_names_one_attribute_holds_is_one_line_and_changes_nothing(tmp_path, h5cli):
    import numpy as np
    from PIL import Image

    src = tmp_path / "src"
    for name in ("n00000001", "n00000002"):
        (src / name).mkdir(parents=True)
        Image.fromarray(np.full((4, 4, 3), 9, np.uint8)).save(src / name / "a.png")
    out = tmp_path / "o.h5"
    assert h5cli("ingest", src, out, "--size", "4", "--workers", "0")[0] == 0
    before = _digest(out)
    for i in range(6000):
        (src / f"n{1440764 + 7 * i:08d}").mkdir()
    code, _out, err = h5cli("ingest", src, out, "--size", "4", "--workers", "0", "--append")
    assert code == 1 and err.count("\n") == 1 and "the names of 6,002 classes take" in err, err
    assert _digest(out) == before


def test_a_class_index_whose_names_would_not_fit_the_store_is_skipped_with_why(tmp_path):
    """Names "0" .. "20000" take more than the one attribute holds: the write failed with an HDF5 back trace and
    left w.h5.creating behind."""
    import numpy as np

    import h5stream

    out = tmp_path / "w.h5"
    result = h5stream.write(out, (np.zeros((3, 4, 4, 3), np.uint8), np.array([0, 20000, 5])))
    assert result.rows == 2 and result.skipped == 1
    assert read_meta(str(out)).class_names == tuple(str(i) for i in range(6))
    assert "class index 20000 would make 20,001 classes" in (tmp_path / "w.h5.skipped.csv").read_text()
    assert not list(tmp_path.glob("*.creating"))


@pytest.mark.parametrize("on_disk,in_csv", [("NFD", "NFC"), ("NFC", "NFD")])
def test_a_csv_naming_a_file_in_another_unicode_normal_form_finds_it(tmp_path, h5cli, on_disk, in_csv):
    """A CSV written on macOS spells café composed where the files keep it decomposed (or the other way round): the
    same name to the user, other bytes to the file system; the row was skipped as 'does not exist' and the file left
    out as 'not listed'."""
    import unicodedata

    import numpy as np
    from PIL import Image

    src = tmp_path / "src"
    (src / "x").mkdir(parents=True)
    name = unicodedata.normalize(on_disk, "x/café.png")
    Image.fromarray(np.full((6, 6, 3), 77, np.uint8)).save(src / name)
    Image.fromarray(np.full((6, 6, 3), 9, np.uint8)).save(src / "x" / "plain.png")
    labels = tmp_path / "l.csv"
    labels.write_text(f"path,label\n{unicodedata.normalize(in_csv, 'x/café.png')},1.5\nx/plain.png,2\n",
                      encoding="utf-8")
    out = tmp_path / "o.h5"
    code, _out, err = h5cli("ingest", src, out, "--labels", labels, "--size", "4", "--workers", "0")
    assert code == 0, err
    _images, stored, paths, _attrs = read_store(out)
    assert dict(zip(paths, stored.tolist())) == {name: 1.5, "x/plain.png": 2.0}
    assert not (tmp_path / "o.h5.skipped.csv").exists()
