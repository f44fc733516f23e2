"""Bad files are skipped with reasons (never partial rows); bad usage is one line, non-zero, nothing written."""

from __future__ import annotations

import csv
import os
import struct
import subprocess
import sys
import zlib

import h5py
import numpy as np
import pytest
from PIL import Image

from h5stream.ingest.decode import DecodeSpec, decode_file
from h5stream.store import read_meta, schema
from h5stream.store.writer import write_arrays
from h5stream.store import pathrows

pytestmark = pytest.mark.usefixtures("no_leaks")  # decode workers and their shared-memory result slots


def _huge_png(path, width=60000, height=60000):
    """A valid 1x1 PNG whose IHDR is patched to declare width x height (a decompression bomb header)."""
    import io

    buf = io.BytesIO()
    Image.new("L", (1, 1)).save(buf, format="PNG")
    data = bytearray(buf.getvalue())
    ihdr = 8 + 8  # signature, then length+type of IHDR
    data[ihdr:ihdr + 8] = struct.pack(">II", width, height)
    data[ihdr + 13:ihdr + 17] = struct.pack(">I", zlib.crc32(bytes(data[ihdr - 4:ihdr + 13])))
    with open(path, "wb") as fh:
        fh.write(data)


def add_bad_files(root):
    """One of each bad kind in class folder 'cat'; returns {relpath: reason keyword}."""
    cat = os.path.join(root, "cat")
    good_jpg = next(os.path.join(cat, n) for n in sorted(os.listdir(cat)) if n.endswith(".jpg"))
    with open(good_jpg, "rb") as fh:
        data = fh.read()
    with open(os.path.join(cat, "truncated.jpg"), "wb") as fh:
        fh.write(data[: len(data) // 2])
    open(os.path.join(cat, "empty.jpg"), "wb").close()
    with open(os.path.join(cat, "notes.jpg"), "w") as fh:
        fh.write("this is not an image\n")
    with open(os.path.join(cat, "readme.txt"), "w") as fh:
        fh.write("not an image either\n")
    os.symlink(os.path.join(cat, "does-not-exist.png"), os.path.join(cat, "dangling.png"))
    _huge_png(os.path.join(cat, "huge.png"))
    return {
        "cat/truncated.jpg": "truncated",
        "cat/empty.jpg": "empty",
        "cat/notes.jpg": "not an image",
        "cat/readme.txt": "extension",  # left out (not an image), as Keras leaves it; listed, not skipped
        "cat/dangling.png": "unreadable",
        "cat/huge.png": "too large",
    }


def read_report(out):
    with open(schema.skipped_report_path(str(out)), newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["path", "reason"]
    return {r[0]: r[1] for r in rows[1:]}


def test_bad_files_are_skipped_listed_and_counted(class_src_copy, tmp_path, h5cli):
    root, written = class_src_copy
    bad = add_bad_files(root)
    out = tmp_path / "b.h5"
    code, stdout, err = h5cli("ingest", root, out, "--size", "16", "--workers", "2")
    assert code == 0, err
    assert "ingested 18, skipped 5, left out 1 (1 not an image)" in stdout
    report = read_report(out)
    assert set(report) == set(bad)
    for rel, keyword in bad.items():
        assert keyword in report[rel], (rel, report[rel])
    assert report["cat/readme.txt"].startswith("left out: ")
    meta = read_meta(out)
    assert meta.rows == 18 and meta.skipped_files == 5
    with h5py.File(out, "r") as f:  # every stored row is a whole, correct image
        paths = [p.decode() for p in pathrows.stored_bytes(f, 0, 18)]
        assert sorted(paths) == sorted(r for r, _ in written)
        for rel, image in zip(paths, f["images"][:18]):
            np.testing.assert_array_equal(image, decode_file(os.path.join(root, rel), DecodeSpec(size=(16, 16))))
    code, stdout, _ = h5cli("info", out)
    assert code == 0 and "skipped files   5" in stdout
    # Appending again re-tries the bad files but neither duplicates them in the report nor in the count.
    code, stdout, _ = h5cli("ingest", root, out, "--append", "--workers", "0")
    assert code == 0 and "ingested 0, skipped 5" in stdout
    assert read_meta(out).skipped_files == 5 and len(read_report(out)) == 6


def test_decode_reasons_are_specific(tmp_path):
    _huge_png(tmp_path / "h.png", 12000, 12000)  # 144 MP: under Pillow's bomb error, over our limit
    with pytest.raises(Exception, match="too large: 12000x12000"):
        decode_file(str(tmp_path / "h.png"), DecodeSpec(size=(8, 8)))


@pytest.mark.parametrize("bad_kind", ["empty.jpg", "notes.jpg"])
def test_strict_fails_and_writes_nothing(class_src_copy, tmp_path, h5cli, bad_kind):
    root, _ = class_src_copy
    add_bad_files(root)  # readme.txt stays: not an image, left out, so --strict does not stop on it
    keep = {"empty.jpg", "notes.jpg"} - {bad_kind}
    for name in ["truncated.jpg", "dangling.png", "huge.png", *keep]:
        os.unlink(os.path.join(root, "cat", name))
    out = tmp_path / "strict.h5"
    code, stdout, err = h5cli("ingest", root, out, "--strict", "--workers", "1", "--size", "8")
    assert code == 1 and err.count("\n") == 1 and err.startswith("h5stream: error: ")
    assert bad_kind in err and "--strict" in err and "Traceback" not in err
    assert not out.exists() and not os.path.exists(schema.skipped_report_path(str(out)))


def test_strict_append_rolls_back_its_rows(class_src_copy, tmp_path, h5cli):
    root, _ = class_src_copy
    out = tmp_path / "s.h5"
    assert h5cli("ingest", root, out, "--size", "8", "--workers", "0", "--order", "sorted")[0] == 0
    os.makedirs(os.path.join(root, "emu"))
    for i in range(5):  # good files sorted before the bad one: they are decoded, then undone
        Image.new("RGB", (9, 9), (i, 0, 0)).save(os.path.join(root, "emu", f"a{i}.png"))
    open(os.path.join(root, "emu", "z_empty.png"), "wb").close()
    code, _, err = h5cli("ingest", root, out, "--append", "--strict", "--workers", "0")
    assert code == 1 and "z_empty.png" in err
    meta = read_meta(out)
    assert meta.rows == 18 and meta.class_names == ("bird", "cat", "dog", "emu")
    with h5py.File(out, "r") as f:
        assert f["images"].shape[0] == 18


def _csv(path, text):
    with open(path, "w") as fh:
        fh.write(text)
    return str(path)


def usage_cases(tmp_path, class_root, reg_root, reg_csv):
    empty = tmp_path / "empty"
    empty.mkdir()
    no_images = tmp_path / "noimg"
    (no_images / "a").mkdir(parents=True)
    (no_images / "a" / "x.txt").write_text("x")
    loose = tmp_path / "loose"
    loose.mkdir()
    Image.new("RGB", (4, 4)).save(loose / "a.png")
    existing = tmp_path / "exists.h5"
    existing.write_bytes(b"x")
    damaged = tmp_path / "damaged.h5"  # an HDF5 file cut short: no tool opens it
    write_arrays(damaged, np.zeros((64, 8, 8, 3), np.uint8), np.zeros(64, np.int64))
    with open(damaged, "r+b") as fh:
        fh.truncate(8192)
    missing_row = _csv(tmp_path / "m.csv", "filename,t0\nimages/img_00000.png,0.5\nimages/nope.png,0.1\n")
    return {
        "missing src": ([tmp_path / "nope", "OUT"], "no such folder"),
        "src is a file": ([reg_csv, "OUT"], "not a folder"),
        "empty src": ([empty, "OUT"], "no class subfolders"),
        "only loose files": ([loose, "OUT"], "no class subfolders"),
        "no images": ([no_images, "OUT"], "no image files"),
        "csv missing file": ([reg_root, "OUT", "--labels", missing_row, "--strict"], "does not exist"),
        "csv missing": ([reg_root, "OUT", "--labels", tmp_path / "none.csv"], "no such labels file"),
        "unknown column": ([reg_root, "OUT", "--labels", reg_csv, "--label-columns", "t0,speed"],
                           "unknown label column 'speed'"),
        "non-numeric": ([reg_root, "OUT", "--labels", _csv(tmp_path / "n.csv", "path,t0\nimages/img_00000.png,left\n"),
                         "--label-kind", "regression"], "not a number"),
        "no path column": ([reg_root, "OUT", "--labels", _csv(tmp_path / "p.csv", "file,t0\na.png,1\n")],
                           "no 'path' or 'filename'"),
        "path outside": ([reg_root, "OUT", "--labels", _csv(tmp_path / "o.csv", "path,t0\n../x.png,1\n")], "outside"),
        "size 0": ([class_root, "OUT", "--size", "0"], "--size"),
        "size junk": ([class_root, "OUT", "--size", "12y4"], "--size"),
        "out is dir": ([class_root, tmp_path], "is a directory"),
        "out exists": ([class_root, existing], "already exists"),
        "out folder missing": ([class_root, tmp_path / "no" / "such" / "o.h5"], "does not exist"),
        "append not a store": ([class_root, existing, "--append"], "not an HDF5 file"),
        "append damaged store": ([class_root, damaged, "--append"], "move"),
        "append and overwrite": ([class_root, "OUT", "--append", "--overwrite"], "not allowed with"),
        "bad resize": ([class_root, "OUT", "--resize", "squash"], "invalid choice"),
        "negative workers": ([class_root, "OUT", "--workers", "-1"], "--workers"),
        "label-columns without labels": ([class_root, "OUT", "--label-columns", "a"], "--labels"),
        "negative seed": ([class_root, "OUT", "--seed", "-1"], "--seed must be between 0 and"),
        "seed past int64": ([class_root, "OUT", "--seed", str(2**63)], "--seed must be between 0 and"),
        "commit rows 0": ([class_root, "OUT", "--commit-rows", "0"], "--commit-rows must be an integer >= 1, got 0"),
        "label beyond float32": ([reg_root, "OUT", "--labels", _csv(tmp_path / "f.csv",
                                  "path,t0\nimages/img_00000.png,0.5\nimages/img_00001.png,1e39\n")],
                                 "f.csv line 3: column 't0' holds '1e39', beyond the float32 range"),
    }


CASES = [
    "missing src", "src is a file", "empty src", "only loose files", "no images", "csv missing file", "csv missing",
    "unknown column", "non-numeric", "no path column", "path outside", "size 0", "size junk", "out is dir",
    "out exists", "out folder missing", "append not a store", "append damaged store", "append and overwrite",
    "bad resize",
    "negative workers", "label-columns without labels", "negative seed", "seed past int64", "commit rows 0",
    "label beyond float32",
]


@pytest.mark.parametrize("case", CASES)
def test_usage_errors_are_one_line_and_write_nothing(class_src, regression_src, tmp_path, h5cli, case):
    reg_root, reg_csv, _ = regression_src
    args, expected = usage_cases(tmp_path, class_src[0], reg_root, reg_csv)[case]
    out = tmp_path / "out.h5"
    args = [out if a == "OUT" else a for a in args]
    before = {name: (tmp_path / name).read_bytes() if (tmp_path / name).is_file() else None
              for name in os.listdir(tmp_path)}
    code, stdout, err = h5cli("ingest", *args, "--workers", "0") if "--workers" not in args else h5cli("ingest", *args)
    assert code != 0
    assert err.count("\n") == 1 and err.startswith("h5stream: error: ") and expected in err, err
    assert "Traceback" not in err and stdout == ""
    after = {name: (tmp_path / name).read_bytes() if (tmp_path / name).is_file() else None
             for name in os.listdir(tmp_path)}
    assert after == before  # nothing written: no OUT, no report, no temp file; a file that was there untouched


def test_append_mismatch_is_a_clear_error(class_src, regression_src, tmp_path, h5cli):
    root, _ = class_src
    out = tmp_path / "m.h5"
    assert h5cli("ingest", root, out, "--size", "8", "--workers", "0")[0] == 0
    size_before = out.stat().st_size
    for args, expected in [
        (["--size", "16"], "size 8x8"),
        (["--channels", "1"], "channels 3"),
        (["--seed", "3"], "order seed 0"),
        (["--labels", regression_src[1]], "class labels"),
    ]:
        src = regression_src[0] if "--labels" in args else root
        code, _, err = h5cli("ingest", src, out, "--append", "--workers", "0", *args)
        assert code == 1 and err.count("\n") == 1 and expected in err, err
    assert read_meta(out).rows == 18 and out.stat().st_size == size_before


def test_cli_error_in_a_real_process_has_no_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "h5stream", "ingest", str(tmp_path / "missing"), str(tmp_path / "o.h5")],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr and "no such folder" in proc.stderr
    assert not (tmp_path / "o.h5").exists()


def test_too_little_shared_memory_for_the_decode_slots_is_one_line(class_src, tmp_path, h5cli):
    # 16384 x 16384 rows: one slot of 16 rows is 12 GiB, and the two a single worker needs must fit in half of
    # what /dev/shm has free; refused before any allocation, and before the store is created.
    from h5stream.memory.shm import shm_free_bytes

    root, _ = class_src
    free = shm_free_bytes()
    if free is None:
        pytest.skip("no /dev/shm mount")
    if 2 * 16 * 16384 * 16384 * 3 <= free // 2:
        pytest.skip("this machine's /dev/shm holds even that")
    out = tmp_path / "big.h5"
    code, stdout, err = h5cli("ingest", root, out, "--size", "16384", "--workers", "1")
    assert code != 0 and stdout == ""
    assert err.count("\n") == 1 and "shared memory" in err and "--workers 0" in err, err
    assert not out.exists()


@pytest.mark.parametrize("mode", [[], ["--append"]])
def test_an_ingest_where_every_file_is_skipped_is_an_error_and_leaves_no_store(tmp_path, h5cli, mode):
    # Files that look like images but none decodes: no store of 0 rows presented as a success.
    root = tmp_path / "src"
    (root / "cat").mkdir(parents=True)
    (root / "cat" / "a.png").write_bytes(b"not a png")
    (root / "cat" / "b.jpg").write_bytes(b"")
    out = tmp_path / "o.h5"
    code, stdout, err = h5cli("ingest", root, out, "--workers", "0", *mode)
    assert code == 1 and stdout == "", stdout
    assert err.count("\n") == 1 and err.startswith("h5stream: error: ") and "Traceback" not in err, err
    report = schema.skipped_report_path(str(out))
    assert f"{out}: not created" in err and "2 files" in err and str(root) in err and report in err, err
    assert ".png" in err  # what it expects
    assert sorted(os.listdir(tmp_path)) == ["o.h5.skipped.csv", "src"]  # no store, no temporary file, no lock
    assert set(read_report(out)) == {"cat/a.png", "cat/b.jpg"}


def test_skip_report_cells_cannot_run_as_spreadsheet_formulas(tmp_path, h5cli):
    # File names are chosen by whoever made the images: a cell starting with = + - @ (or tab, CR) would be a formula
    # in a spreadsheet.  The report quotes them (OWASP), reads them back exactly, and --append adds no duplicates.
    root = tmp_path / "src"
    (root / "images").mkdir(parents=True)
    Image.new("RGB", (9, 9), (10, 20, 30)).save(root / "images" / "good.png")
    hostile = ["=cmd|' -C calc'!A0.png", "+1.png", "-2.png", "@SUM(A1).png", "'quoted.png"]
    for name in hostile:
        (root / name).write_bytes(b"not an image")  # unreadable: skipped, so listed in the report
    labels = tmp_path / "labels.csv"
    with open(labels, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["path", "t"])
        for i, name in enumerate(["images/good.png", *hostile]):
            writer.writerow([name, i])
    out = tmp_path / "o.h5"
    code, stdout, err = h5cli("ingest", root, out, "--labels", labels, "--size", "8", "--workers", "0")
    assert code == 0 and "ingested 1, skipped 5" in stdout, err
    with open(schema.skipped_report_path(str(out)), newline="") as fh:
        cells = [row[0] for row in list(csv.reader(fh))[1:]]
    assert sorted(cells) == sorted("'" + name for name in hostile)  # every one starts with a quote now
    from h5stream.ingest.report import read_report as read_back

    assert set(read_back(schema.skipped_report_path(str(out)))) == set(hostile)  # exactly the names
    code, stdout, err = h5cli("ingest", root, out, "--labels", labels, "--append", "--workers", "0")
    assert code == 0 and "ingested 0, skipped 5" in stdout, err
    with open(schema.skipped_report_path(str(out)), newline="") as fh:
        assert len(list(csv.reader(fh))) == 1 + len(hostile)
