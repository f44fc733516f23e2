"""Ingest end to end on real files: labels by pixel content, order, CSV targets, append, layout in plain h5py."""

from __future__ import annotations

import json
import os
import shutil
import sys

import h5py
import numpy as np
import pytest
from PIL import Image

from h5stream.ingest.decode import DecodeSpec, decode_file
from h5stream.ingest.pack import IngestOptions, ingest, storage_permutation
from h5stream.samples import make_class_folder, nearest_class, targets_from_pixels
from h5stream.store import read_meta, schema
from h5stream.store import pathrows

from conftest import CLASS_NAMES, REG_N, new_children

pytestmark = pytest.mark.usefixtures("no_leaks")  # decode workers and their shared-memory result slots


def read_store(path):
    """(images, labels, paths, attrs) of the committed rows, with plain h5py."""
    with h5py.File(path, "r") as f:
        n = int(f.attrs[schema.ATTR_COMMITTED])
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        return f["images"][:n], f["labels"][:n], [p.decode() for p in pathrows.stored_bytes(f, 0, n)], attrs


@pytest.mark.parametrize("order,workers", [("sorted", 0), ("shuffled", 2)])
def test_every_image_lands_once_with_its_label(class_src, tmp_path, h5cli, order, workers):
    root, written = class_src
    out = tmp_path / "s.h5"
    code, stdout, err = h5cli("ingest", root, out, "--size", "16x24", "--order", order, "--workers", str(workers))
    assert code == 0, err
    assert "ingested 18, skipped 0" in stdout
    images, labels, paths, attrs = read_store(out)
    expected = dict(written)
    assert sorted(paths) == sorted(expected) and len(paths) == len(set(paths)) == 18
    assert images.shape == (18, 16, 24, 3) and images.dtype == np.uint8 and labels.dtype == np.int64
    spec = DecodeSpec(size=(16, 24))
    for image, label, rel in zip(images, labels, paths):
        assert label == expected[rel]  # label from the folder name
        assert nearest_class(image, len(CLASS_NAMES)) == label  # ... and the pixels agree
        np.testing.assert_array_equal(image, decode_file(os.path.join(root, rel), spec))  # row == its own file
    assert json.loads(attrs[schema.ATTR_CLASS_NAMES]) == list(CLASS_NAMES)
    assert attrs[schema.ATTR_ORDER] == order


def test_sorted_keeps_walk_order_and_shuffled_is_the_seeded_permutation(class_src, tmp_path, h5cli):
    root, written = class_src
    walk = sorted(rel for rel, _ in written)
    orders = {}
    runs = [("sorted", ["--order", "sorted"]), ("s0", []), ("s0b", ["--seed", "0"]), ("s7", ["--seed", "7"])]
    for name, extra in runs:
        code, _, err = h5cli("ingest", root, tmp_path / f"{name}.h5", "--size", "8", "--workers", "0", *extra)
        assert code == 0, err
        _, labels, paths, attrs = read_store(tmp_path / f"{name}.h5")
        orders[name] = (paths, labels, attrs)
    assert orders["sorted"][0] == walk
    assert list(orders["sorted"][1]) == sorted(orders["sorted"][1])  # class-sorted, as the folders are
    assert orders["sorted"][2][schema.ATTR_ORDER_SEED] == -1
    assert orders["s0"][0] == [walk[i] for i in storage_permutation(len(walk), "shuffled", 0)]
    assert orders["s0"][0] == orders["s0b"][0]  # default seed is 0, and seeded = reproducible
    assert orders["s7"][0] != orders["s0"][0] and sorted(orders["s7"][0]) == walk
    assert orders["s7"][2][schema.ATTR_ORDER_SEED] == 7 and orders["s7"][2][schema.ATTR_ORDER] == "shuffled"
    assert list(orders["s0"][1]) != sorted(orders["s0"][1])  # shuffled rows are not class-sorted


def test_csv_regression_two_targets(regression_src, tmp_path, h5cli):
    root, csv_path, rows = regression_src
    out = tmp_path / "r.h5"
    code, _, err = h5cli("ingest", root, out, "--labels", csv_path, "--size", "12", "--workers", "1")
    assert code == 0, err
    images, labels, paths, attrs = read_store(out)
    expected = dict(rows)
    assert labels.dtype == np.float32 and labels.shape == (REG_N, 2)
    assert sorted(paths) == sorted(expected)
    for image, label, rel in zip(images, labels, paths):
        np.testing.assert_allclose(label, expected[rel], rtol=0, atol=1e-6)
        np.testing.assert_allclose(targets_from_pixels(image, 2), expected[rel], atol=0.02)
    meta = read_meta(out)
    assert meta.label_kind == "regression" and meta.label_columns == ("t0", "t1") and meta.class_names is None


def test_csv_one_column_gives_flat_targets(regression_src, tmp_path, h5cli):
    root, csv_path, rows = regression_src
    out = tmp_path / "r1.h5"
    code, _, err = h5cli("ingest", root, out, "--labels", csv_path, "--label-columns", "t1", "--size", "8",
                         "--workers", "0")
    assert code == 0, err
    _, labels, paths, _ = read_store(out)
    expected = dict(rows)
    assert labels.shape == (REG_N,)
    np.testing.assert_allclose(labels, [expected[p][1] for p in paths], atol=1e-6)


def test_plain_h5py_reads_layout_block_rows_and_zlib(class_src, tmp_path, h5cli):
    root, _ = class_src
    plain, zipped = tmp_path / "plain.h5", tmp_path / "zlib.h5"
    common = ("--size", "16", "--order", "sorted", "--workers", "0")
    assert h5cli("ingest", root, plain, "--block-rows", "8", *common)[0] == 0
    assert h5cli("ingest", root, zipped, "--compression", "zlib", *common)[0] == 0
    with h5py.File(plain, "r") as f:
        assert f["images"].chunks == (8, 16, 16, 3) and f["images"].compression is None
        assert f.attrs["block_rows"] == 8 and f.attrs["committed_rows"] == 18
        assert f.attrs["h5stream_format"] == schema.FORMAT_VERSION
        assert f.attrs["image_height"] == 16 and f.attrs["channels"] == 3
        a = f["images"][:]
    with h5py.File(zipped, "r") as f:
        assert f["images"].compression == "gzip"
        np.testing.assert_array_equal(f["images"][:], a)


def test_append_adds_a_new_class_with_a_new_index_and_dedups(class_src_copy, tmp_path, h5cli):
    root, written = class_src_copy
    out = tmp_path / "a.h5"
    assert h5cli("ingest", root, out, "--size", "16", "--workers", "0")[0] == 0
    _, labels_before, paths_before, _ = read_store(out)
    # "aardvark" sorts first but must not renumber the existing classes.
    added = make_class_folder(tmp_path / "extra", classes=["aardvark"], per_class=4, size=(30, 40), seed=5)
    shutil.move(str(tmp_path / "extra" / "aardvark"), os.path.join(root, "aardvark"))
    code, stdout, err = h5cli("ingest", root, out, "--append", "--workers", "1")
    assert code == 0, err
    assert "ingested 4" in stdout and "already stored 18" in stdout
    images, labels, paths, attrs = read_store(out)
    assert json.loads(attrs[schema.ATTR_CLASS_NAMES]) == [*CLASS_NAMES, "aardvark"]
    assert paths[:18] == paths_before and list(labels[:18]) == list(labels_before)
    assert sorted(paths) == sorted([r for r, _ in written] + [r for r, _ in added])
    new = [(img, lab) for img, lab, p in zip(images, labels, paths) if p.startswith("aardvark/")]
    assert len(new) == 4 and all(lab == 3 and nearest_class(img, 1) == 0 for img, lab in new)
    # Running the same append again finds nothing new.
    code, stdout, _ = h5cli("ingest", root, out, "--append", "--workers", "0")
    assert code == 0 and "ingested 0" in stdout
    assert read_meta(out).rows == 22


@pytest.mark.parametrize("resize", ["crop", "pad"])
def test_resize_modes_and_grayscale(class_src, tmp_path, h5cli, resize):
    root, written = class_src
    out = tmp_path / f"{resize}.h5"
    code, _, err = h5cli("ingest", root, out, "--size", "20", "--resize", resize, "--channels", "1", "--workers", "0")
    assert code == 0, err
    images, labels, paths, attrs = read_store(out)
    assert images.shape == (18, 20, 20, 1) and attrs[schema.ATTR_RESIZE] == resize
    for image, label in zip(images, labels):
        assert nearest_class(image, len(CLASS_NAMES)) == label
    if resize == "pad":  # 30x40 source fits as 15x20, centred: black bands above and below (as Keras pads)
        assert (images[:, :2] == 0).all() and (images[:, -2:] == 0).all()


# -- decoding: every mode, alpha, EXIF, draft --------------------------------------------


def _save(tmp_path, name, im, **kw):
    path = str(tmp_path / name)
    im.save(path, **kw)
    return path


def test_decode_modes(tmp_path):
    spec = DecodeSpec(size=(4, 4))
    gray = DecodeSpec(size=(4, 4), channels=1)
    cases = {
        "L.png": (Image.new("L", (8, 8), 100), [100, 100, 100]),
        "1.png": (Image.new("1", (8, 8), 1), [255, 255, 255]),
        "P.png": (Image.new("RGB", (8, 8), (10, 20, 30)).convert("P"), [10, 20, 30]),
        "I16.png": (Image.fromarray(np.full((8, 8), 65535 // 2, dtype=np.uint16)), [127, 127, 127]),
        "I.tif": (Image.fromarray(np.full((8, 8), 40000, dtype=np.int32)), [156, 156, 156]),
        "F.tif": (Image.fromarray(np.full((8, 8), 0.5, dtype=np.float32)), [128, 128, 128]),
        "CMYK.jpg": (Image.new("CMYK", (8, 8), (0, 255, 255, 0)), [255, 0, 0]),
        "RGBA.png": (Image.new("RGBA", (8, 8), (0, 0, 0, 0)), [255, 255, 255]),  # transparent -> white
        "LA.png": (Image.new("LA", (8, 8), (0, 128)), [127, 127, 127]),  # half black over white
    }
    for name, (im, want) in cases.items():
        path = _save(tmp_path, name, im)
        got = decode_file(path, spec)
        assert got.shape == (4, 4, 3) and got.dtype == np.uint8, name
        np.testing.assert_allclose(got.reshape(-1, 3).mean(axis=0), want, atol=4, err_msg=name)
        assert decode_file(path, gray).shape == (4, 4, 1)
    # A palette image with a transparent index composites on the background too.
    p = Image.new("P", (8, 8), 0)
    p.putpalette([0, 0, 0, 200, 0, 0] + [0] * 762)
    p.paste(1, (0, 0, 8, 4))
    got = decode_file(_save(tmp_path, "Ptrans.png", p, transparency=0), DecodeSpec(size=(8, 8)))
    np.testing.assert_array_equal(got[:4, 0], [[200, 0, 0]] * 4)
    np.testing.assert_array_equal(got[4:, 0], [[255, 255, 255]] * 4)


def test_exif_orientation_is_applied(tmp_path):
    arr = np.zeros((20, 40, 3), dtype=np.uint8)
    arr[:, :20] = (250, 0, 0)  # left half red, right half black
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: display = rotate 90 degrees clockwise
    path = _save(tmp_path, "o.jpg", Image.fromarray(arr), exif=exif, quality=95)
    got = decode_file(path, DecodeSpec(size=(40, 20)))
    assert got.shape == (40, 20, 3)
    assert got[:16, :, 0].mean() > 200 and got[24:, :, 0].mean() < 50  # red on top after rotation


@pytest.mark.parametrize("resize", ["stretch", "crop", "pad"])
def test_opencv_jpeg_path_gives_pillows_pixels_for_every_orientation_scale_and_mode(tmp_path, monkeypatch, resize):
    # Whole 8-bit JPEGs are decoded by OpenCV; the result must be what the Pillow path gives, for every EXIF
    # orientation, draft scale (1, 2, 4, 8) and channel count, including a grayscale source.
    import h5stream.ingest.decode as decode
    from h5stream.samples import realistic_image

    photo = realistic_image(5)  # 500x375 RGB
    sources = {"rgb": photo, "gray": photo.convert("L")}
    paths = []
    for kind, im in sources.items():
        for o in range(1, 9):
            exif = Image.Exif()
            exif[0x0112] = o
            paths.append(_save(tmp_path, f"{kind}{o}.jpg", im, exif=exif, quality=90))
    specs = [DecodeSpec(size=(h, w), resize=resize, channels=c, background=(10, 200, 30))
             for (h, w) in [(300, 260), (120, 100), (60, 90), (40, 40)] for c in (3, 1)]
    taken = []
    real = decode.jpeg_by_opencv
    monkeypatch.setattr(decode, "jpeg_by_opencv", lambda im, ch: taken.append(real(im, ch) is not None) or real(im, ch))
    fast = [[decode_file(p, s) for s in specs] for p in paths]
    assert all(taken) and len(taken) == len(paths) * len(specs)  # every one went through OpenCV
    monkeypatch.setattr(decode, "jpeg_by_opencv", lambda im, ch: None)
    for p, row in zip(paths, fast):
        for s, got in zip(specs, row):
            want = decode_file(p, s)
            assert got.shape == want.shape == s.shape, (p, s)
            assert np.abs(got.astype(int) - want.astype(int)).max() <= 1, (p, s)


def test_opencv_jpeg_path_leaves_cut_short_and_cmyk_files_to_pillow(tmp_path):
    from h5stream.ingest.decode import SkipFile, jpeg_by_opencv
    from h5stream.samples import realistic_image

    whole = _save(tmp_path, "whole.jpg", realistic_image(1), quality=90)
    data = open(whole, "rb").read()
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(data[: len(data) * 2 // 3])
    # Cut short: left to Pillow, which names it (some OpenCV releases pad such a file and return it).
    with Image.open(cut) as im:
        assert jpeg_by_opencv(im, 3) is None
    with pytest.raises(SkipFile, match="truncated"):
        decode_file(str(cut), DecodeSpec(size=(64, 64)))
    cmyk = _save(tmp_path, "cmyk.jpg", Image.new("CMYK", (64, 64), (0, 255, 255, 0)))
    with Image.open(cmyk) as im:
        assert jpeg_by_opencv(im, 3) is None
    with Image.open(whole) as im:
        assert jpeg_by_opencv(im, 3).shape == (375, 500, 3)


def test_jpeg_draft_matches_full_decode(tmp_path):
    from h5stream.samples import realistic_image

    path = _save(tmp_path, "big.jpg", realistic_image(3), quality=90)
    spec = DecodeSpec(size=(64, 64))
    fast = decode_file(path, spec).astype(np.int16)
    with Image.open(path) as im:
        full = np.asarray(im.convert("RGB").resize((64, 64), Image.Resampling.BILINEAR), dtype=np.int16)
    assert np.abs(fast - full).mean() < 6


def test_resize_is_bilinear_below_2x_and_area_averaged_from_2x(tmp_path):
    # A horizontal ramp 0..255 over 100 px, 60 px high: bilinear resampling keeps a ramp a ramp, so each output
    # column is the ramp's value at that output pixel's centre, for a stretch (1.56x) and a crop (the centre
    # 60 x 60, 1.5x), whose source box starts at x = 20.
    ramp = np.tile(np.linspace(0, 255, 100), (60, 1)).astype(np.uint8)
    path = _save(tmp_path, "ramp.png", Image.fromarray(ramp))
    for mode, size, left, width in (("stretch", (40, 64), 0, 100), ("crop", (40, 40), 20, 60)):
        got = decode_file(path, DecodeSpec(size=size, channels=1, resize=mode))
        centres = left + (np.arange(size[1]) + 0.5) * width / size[1] - 0.5
        np.testing.assert_allclose(got[20, :, 0], np.interp(centres, np.arange(100), ramp[0]), atol=1.5, err_msg=mode)
    # Stripes 255, 0, 0 shrunk 6x: an area average is a flat 85; point sampling (bilinear) would give 127.5
    # (between a 0 and a 255 column at every output centre).
    stripes = np.zeros((96, 96), np.uint8)
    stripes[:, ::3] = 255
    got = decode_file(_save(tmp_path, "stripes.png", Image.fromarray(stripes)), DecodeSpec(size=(16, 16), channels=1))
    assert np.abs(got.astype(int) - 85).max() <= 1


def test_crop_and_pad_geometry(tmp_path):
    # 200 x 100 (w x h): left quarter red, middle half green, right quarter blue.
    arr = np.zeros((100, 200, 3), np.uint8)
    arr[:, :50, 0] = arr[:, 50:150, 1] = arr[:, 150:, 2] = 255
    path = _save(tmp_path, "bands.png", Image.fromarray(arr))
    crop = decode_file(path, DecodeSpec(size=(20, 20), resize="crop"))  # the centre 100 x 100: all green
    assert (crop[..., 1] == 255).all() and (crop[..., [0, 2]] == 0).all()
    pad = decode_file(path, DecodeSpec(size=(40, 40), resize="pad", pad_fill=(9, 9, 9)))  # 40 x 20, centred
    assert (pad[:10] == 9).all() and (pad[30:] == 9).all()
    np.testing.assert_array_equal(pad[20, 1], [255, 0, 0])
    np.testing.assert_array_equal(pad[20, 20], [0, 255, 0])
    np.testing.assert_array_equal(pad[20, 38], [0, 0, 255])


def test_block_split_writes_whole_blocks_from_boundaries_and_stages_the_rest():
    """Every split of new rows: head + whole + tail is all of them, the head only closes the open block, the
    whole blocks start and end on boundaries, and what is staged is less than a block."""
    from h5stream.ingest.write import block_split

    for block in (1, 4, 64, 100):
        for rows in range(0, 3 * block + 2):
            for staged in range(0, block):
                if staged and (rows + staged) % block == 0:
                    continue  # a full staged block is written at once: never left staged
                for n in (0, 1, block - 1, block, block + 1, 3 * block + 5):
                    head, whole, tail = block_split(rows, staged, n, block)
                    assert head + whole + tail == n and min(head, whole, tail) >= 0
                    assert whole % block == 0 and tail < block
                    if whole or tail:  # the open block was closed first
                        assert (rows + staged + head) % block == 0
                    else:
                        assert head == n
                    if staged == 0 and rows % block == 0:
                        assert head == 0 and whole == n - n % block  # the aligned case copies nothing


def test_decode_workers_do_not_rerun_the_callers_main_script(class_src, tmp_path):
    # spawn would re-run a script in each decode worker (a top-level `import tensorflow` costs seconds and
    # hundreds of MiB per worker); the workers need package code only.
    import subprocess
    import sys
    import textwrap

    src, expected = class_src
    script = tmp_path / "ingest_from_script.py"
    out = tmp_path / "s.h5"
    script.write_text(textwrap.dedent(f"""
        import sys
        print("main script ran", file=sys.stderr, flush=True)
        if __name__ == "__main__":
            from h5stream.ingest.pack import IngestOptions, ingest
            r = ingest(IngestOptions(src={str(src)!r}, out={str(out)!r}, size=(16, 16), workers=2,
                                     progress=False))
            print(r.ingested)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) == read_meta(out).rows == len(expected)
    assert done.stderr.count("main script ran") == 1, done.stderr


def test_decode_slots_fit_in_half_of_dev_shm_and_never_below_one_per_worker_plus_one():
    from h5stream.ingest.pool import decode_slots

    mib = 1 << 20
    assert decode_slots(2, mib, None) == 9  # unknown free space: four in flight per worker, one written out
    assert decode_slots(2, mib, 1 << 40) == 9
    assert decode_slots(16, 2 * mib, 64 * mib) == 16  # Docker's 64 MiB: half of it, 2 MiB slots
    assert decode_slots(4, mib, 8 * mib) == 4  # below workers + 1: the pool refuses (see test_ingest_errors)
    for workers in (1, 2, 8, 64):
        for free in (0, 3 * mib, 100 * mib, None):
            n = decode_slots(workers, mib, free)
            assert n <= 4 * workers + 1 and (free is None or n * mib <= free // 2)
    # The slots are one segment, one file of /dev/shm: never larger than the file size limit (ulimit -f)
    assert decode_slots(2, mib, None, max_segment=5 * mib) == 5
    assert decode_slots(2, mib, 8 * mib, max_segment=5 * mib) == 4  # whichever is tighter: half of 8 MiB here
    assert decode_slots(2, mib, 1 << 40, max_segment=mib - 1) == 0


def test_decode_layout_shrinks_slots_before_refusing_but_not_below_the_floor():
    from h5stream.ingest.pool import decode_layout, decode_slots

    row = 3 * 128 * 128  # 48 KiB
    mib = 1 << 20
    assert decode_layout(2, row, None) == (9, 64)  # room: 64-row slots, four tasks in flight per worker
    # Docker's 64 MiB with 16 workers: 64-row slots (3 MiB) give 10 < 18 slots; 32-row slots (1.5 MiB) give 21
    assert decode_layout(16, row, 64 * mib) == (21, 32)
    # 18 MiB with 2 workers: 64-row slots give 3, a slot per worker and one for the writer, which holds two (the
    # one it takes and the one the disk writes): 32-row slots give 6
    assert decode_layout(2, row, 18 * mib) == (6, 32)
    # 1 MiB rows and 40 MiB free: 64 and 32 rows refused, 16 rows (the floor) give 1 slot: the pool refuses
    assert decode_layout(2, mib, 40 * mib) == (1, 16)
    assert decode_layout(1, row, None, max_rows=4) == (5, 4)  # a smaller cap is kept as asked
    # A file size limit of 4 MiB (ulimit -f binds /dev/shm's files too) with 2 workers: 64-row slots (3 MiB)
    # give 1, 32-row slots 2, 16-row slots 5; with a 1 MiB limit 16-row slots give 1: the pool refuses
    assert decode_layout(2, row, None, max_segment=4 * mib) == (5, 16)
    assert decode_layout(2, row, None, max_segment=mib) == (1, 16)
    for workers in (1, 2, 8, 64):
        for free in (0, 5 * mib, 64 * mib, 1 << 40, None):
            slots, rows = decode_layout(workers, row, free)
            assert 16 <= rows <= 64 and slots == decode_slots(workers, rows * row, free)
            if rows > 16:  # shrunk only as far as needed: the next size up did not fit
                assert rows == 64 or decode_slots(workers, 2 * rows * row, free) < workers + 2


@pytest.mark.parametrize("workers", [0, 1, 2, 3, 16])
@pytest.mark.parametrize("n", [0, 1, 5, 63, 64, 65, 500, 3000, 10007])
def test_task_sizes_cover_every_file_once_big_first_small_last(n, workers):
    from h5stream.ingest.write import task_sizes

    sizes = task_sizes(n, workers, max_files=64, min_files=4)
    assert sum(sizes) == n and all(0 < k <= 64 for k in sizes)
    assert sizes == sorted(sizes, reverse=True)  # never a big task after a small one
    assert all(k >= 4 for k in sizes[:-1])  # only the very last may be a remainder below the floor
    if n >= 4 * max(workers, 1) * 64:
        assert sizes[0] == 64  # plenty left: full tasks
    if n >= 64:
        # the last task is small: a worker finishing it while the others idle costs at most a few files
        assert sizes[-1] <= 4



@pytest.mark.parametrize("workers", [1, 2, 16])
@pytest.mark.parametrize("block_rows", [1, 8, 64])
def test_tasks_are_whole_blocks_from_a_boundary_while_every_worker_has_a_block_to_do(workers, block_rows):
    from h5stream.ingest.write import next_task_size, task_sizes

    for n in (0, 7, 64, 500, 3000, 10007):
        sizes = task_sizes(n, workers, max_files=64, min_files=4, block_rows=block_rows)
        assert sum(sizes) == n and all(0 < k <= 64 for k in sizes)
        ends = np.cumsum(sizes)
        for k, end in zip(sizes, ends):
            if n - (end - k) >= workers * block_rows:  # every worker still had a block's worth: whole blocks
                assert k % block_rows == 0 and end % block_rows == 0
        if n >= workers * 64 * 4:
            assert sizes[0] == 64 // block_rows * block_rows
    # Rows in flight start 3 past a boundary (a file was skipped): the next task ends on a boundary again.
    for offset in range(1, block_rows):
        assert (offset + next_task_size(5000, workers, offset, block_rows, max_files=64)) % block_rows == 0
    # A block larger than a task: tasks as before, whatever the offset.
    assert next_task_size(5000, workers, 3, 128, max_files=64) == task_sizes(5000, workers, 64, 4)[0]


def test_the_decode_workers_checksum_whole_blocks_and_tasks_realign_after_a_skipped_file(tmp_path, monkeypatch):
    """The parent neither copies nor hashes whole blocks: they come from the decode slot with the digests the
    workers computed, also after a skipped file (once the tasks already in flight are in, the next ones end on
    block boundaries again), and the stored checksums are what verify recomputes."""
    from h5stream.ingest.pack import IngestOptions, ingest
    from h5stream.ingest.pool import decode_slots
    from h5stream.store.checksum import BlockHasher, verify_store

    src = tmp_path / "src"
    written = make_class_folder(src, classes=3, per_class=200, size=(20, 24), fmt="png", seed=7)
    broken = written[5][0]  # sorted order: the first task loses a row, every later one would start mid-block
    (src / broken).write_bytes(b"not an image")
    adds, real_add = [], BlockHasher.add

    def add(self, images, labels, paths, image_digests=()):
        adds.append((self.rows, len(images), len(image_digests)))
        return real_add(self, images, labels, paths, image_digests)

    monkeypatch.setattr(BlockHasher, "add", add)
    out = tmp_path / "o.h5"
    result = ingest(IngestOptions(src=str(src), out=str(out), size=(8, 8), workers=1, block_rows=8, order="sorted",
                                  progress=False))
    assert result.ingested == 599 and result.skipped == 1
    # Hashed here: the rows of the tasks in flight when the skip came back (a slot each but one, 64 rows at most),
    # the first block the skip broke, and the last rows (under a block per worker, the partial last block).
    in_flight = (decode_slots(1, 0, None) - 1) * 64
    hashed_here = 599 - 8 * sum(d for _, _, d in adds)
    assert hashed_here <= in_flight + 3 * 8, adds
    assert adds[0][2] and adds[-2][2], adds  # whole blocks hashed by the workers before the skip and after it
    assert verify_store(str(out)).ok
    kept = [rel for rel, _ in written if rel != broken]
    with h5py.File(out, "r") as f:
        assert [schema.decode_path(p) for p in pathrows.stored_bytes(f, 0, f["images"].shape[0])] == kept
        for i in (0, 4, 5, 8, 300, 598):
            np.testing.assert_array_equal(f[schema.IMAGES][i], decode_file(str(src / kept[i]), DecodeSpec(size=(8, 8))))


def test_an_ingest_loads_no_psutil(tmp_path):
    """Stopping the decode pool checks for stopped workers in /proc: importing psutil for it cost ~40 ms of the
    ingest process's CPU per run."""
    import subprocess

    src = tmp_path / "src"
    make_class_folder(src, classes=2, per_class=10, size=(12, 12), fmt="png", seed=1)
    code = ("import sys; from h5stream.ingest.pack import IngestOptions, ingest; "
            f"ingest(IngestOptions(src={str(src)!r}, out={str(tmp_path / 'o.h5')!r}, size=(8, 8), workers=1, "
            "progress=False)); print('psutil' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def _minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[7])  # field 10, minflt


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc heap tuning, /proc")
def test_decode_workers_keep_freed_heap_so_photos_do_not_fault_it_back_in(tmp_path):
    # With glibc's default thresholds a decode worker trims its heap after every photo and faults the
    # same pages back in for the next (~80 minor faults per 500x375 JPEG, a sixth of the decode's CPU,
    # measured); the pool's worker set-up pins them (keep_freed_heap).
    import psutil

    from h5stream.ingest.pool import DecodePool

    rng = np.random.default_rng(0)
    photo = tmp_path / "0.jpg"
    Image.fromarray(rng.integers(0, 256, (375, 500, 3), dtype=np.uint8)).save(photo, quality=90)
    names = [f"{i}.jpg" for i in range(160)]
    for name in names[1:]:
        shutil.copyfile(photo, tmp_path / name)
    spec = DecodeSpec(size=(128, 128))
    chunks = [names[i:i + 16] for i in range(0, len(names), 16)]
    before = {p.pid for p in psutil.Process().children()}
    pool = DecodePool(1, spec.shape, rows_per_task=16)
    try:
        pool.start()
        for _, reasons, _ in pool.imap(str(tmp_path), chunks[:6], spec):  # every result slot touched once
            assert reasons == [None] * 16
        (worker,) = new_children(before)
        start = _minor_faults(worker.pid)
        for _, reasons, _ in pool.imap(str(tmp_path), chunks[6:], spec):
            assert reasons == [None] * 16
        per_photo = (_minor_faults(worker.pid) - start) / (16 * len(chunks[6:]))
    finally:
        pool.close()
    assert per_photo < 5, f"{per_photo:.0f} minor page faults per photo in a decode worker"


def test_a_killed_decode_worker_is_reported_with_its_signal_pid_and_the_out_of_memory_hint(tmp_path):
    # The same account as the augment pool gives (one death report for both pools), plus ingest's way on.
    import signal

    import psutil

    from h5stream.errors import WorkerError
    from h5stream.ingest.pool import DecodePool

    names = [f"{i}.png" for i in range(64)]
    for name in names:
        Image.fromarray(np.full((8, 8, 3), 7, np.uint8)).save(tmp_path / name)
    spec = DecodeSpec(size=(8, 8))
    chunks = [names[i:i + 2] for i in range(0, len(names), 2)]  # more chunks than result slots: some wait
    pool = DecodePool(1, spec.shape, rows_per_task=2)
    try:
        pool.start()
        items = pool.imap(str(tmp_path), chunks, spec)
        next(items)
        (worker,) = [psutil.Process(pid) for pid in pool.pids]
        worker.send_signal(signal.SIGKILL)  # not waited for here: that would reap it, and its exit status with it
        with pytest.raises(WorkerError) as info:
            for _ in items:
                pass
    finally:
        pool.close()
    message = str(info.value)
    assert f"decode worker died: worker 0 (pid {worker.pid}) was killed by SIGKILL" in message, message
    assert "SIGKILL often means the out-of-memory killer: pass fewer --workers" in message, message
    assert message.endswith("committed rows are kept, rerun with --append to continue"), message


def test_whole_blocks_go_from_the_decode_slot_to_the_store_uncopied_and_the_rest_in_whole_blocks(tmp_path,
                                                                                                 monkeypatch):
    """The parent's per-row work: rows that fill blocks are written from the decode slot itself (no copy), every
    write but the last starts and ends on a block boundary (whole chunks), also around a skipped file, and the
    store holds exactly the decoded files, checksums verified."""
    from h5stream.ingest.pack import IngestOptions, ingest
    from h5stream.ingest.pool import DecodePool
    from h5stream.store.checksum import verify_store
    from h5stream.store.writer import StoreWriter

    src = tmp_path / "src"
    written = make_class_folder(src, classes=2, per_class=45, size=(20, 24), fmt="png", seed=5)
    broken = written[33][0]
    (src / broken).write_bytes(b"not an image")
    yielded, appends = [], []
    real_imap, real_append = DecodePool.imap, StoreWriter.append

    def imap(self, *args, **kwargs):
        for images, reasons, digests in real_imap(self, *args, **kwargs):
            yielded.append(images)
            yield images, reasons, digests

    def append(self, images, labels, paths, image_digests=(), **kw):
        from_slot = any(np.may_share_memory(images, v) for v in yielded)
        appends.append((self.rows, len(paths), from_slot))
        return real_append(self, images, labels, paths, image_digests, **kw)

    monkeypatch.setattr(DecodePool, "imap", imap)
    monkeypatch.setattr(StoreWriter, "append", append)
    out = tmp_path / "o.h5"
    result = ingest(IngestOptions(src=str(src), out=str(out), size=(8, 8), workers=2, block_rows=8, commit_rows=16,
                                  order="sorted", progress=False))
    assert result.ingested == len(written) - 1 and result.skipped == 1
    assert any(from_slot for _, _, from_slot in appends)  # whole blocks straight from shared memory
    for start, n, _ in appends[:-1]:
        assert start % 8 == 0 and n % 8 == 0
    assert sum(n for _, n, _ in appends) == result.ingested
    assert verify_store(str(out)).ok
    kept = [rel for rel, _ in written if rel != broken]
    with h5py.File(out, "r") as f:
        assert [schema.decode_path(p) for p in pathrows.stored_bytes(f, 0, f["images"].shape[0])] == kept
        for i in (0, 7, 8, 33, 34, len(kept) - 1):
            np.testing.assert_array_equal(f[schema.IMAGES][i], decode_file(str(src / kept[i]), DecodeSpec(size=(8, 8))))


def test_an_ingest_says_where_its_time_and_its_own_cpu_went_by_stage(class_src, tmp_path):
    """``IngestResult.phases``: the stages in order, each its wall and this process's CPU seconds; they make up
    the run's seconds (the scaling benchmark reports them, to find what the one serial process spends)."""
    root, _ = class_src
    result = ingest(IngestOptions(src=root, out=str(tmp_path / "o.h5"), size=(8, 8), workers=1, progress=False))
    assert list(result.phases) == ["find", "create", "write", "finish"]
    assert all(wall >= 0 and cpu >= 0 for wall, cpu in result.phases.values())
    assert sum(wall for wall, _ in result.phases.values()) == pytest.approx(result.seconds)
    assert result.phases["write"][0] > 0  # the rows were decoded in that stage, by the worker


@pytest.mark.parametrize("fewest_slots", [False, True])
def test_a_chunk_the_caller_holds_stays_unchanged_until_it_asks_past_it_and_every_chunk_comes(tmp_path,
                                                                                             monkeypatch,
                                                                                             fewest_slots):
    """imap(hold=1): a chunk's rows stay as they were while the caller takes the next chunk, and are reused only
    once it asks for the one after; with the fewest result slots a pool has (one worker, two slots: a small
    /dev/shm) every chunk still comes, in order."""
    from h5stream.memory import shm
    from h5stream.ingest.pool import DecodePool

    names = [f"{i:03d}.png" for i in range(40)]
    for i, name in enumerate(names):
        Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(tmp_path / name)
    spec = DecodeSpec(size=(8, 8))
    chunks = [names[i:i + 2] for i in range(0, len(names), 2)]  # more chunks than result slots
    if fewest_slots:  # room for two slots of two rows
        monkeypatch.setattr(shm, "shm_free_bytes", lambda: 2 * 2 * 2 * 8 * 8 * 3)
    pool = DecodePool(1, spec.shape, rows_per_task=2)
    try:
        assert (pool._state.slots.array.shape[0] == 2) is fewest_slots
        pool.start()
        seen, before = [], None
        for images, reasons, _ in pool.imap(str(tmp_path), chunks, spec, hold=1):
            assert reasons == [None, None]
            if before is not None:
                held, copy = before
                assert np.array_equal(held, copy)  # the previous chunk, still as it came
            seen.append(images[:, 0, 0, 0].tolist())
            before = (images, images.copy())
    finally:
        pool.close()
    assert seen == [[i, i + 1] for i in range(0, 40, 2)]


def test_a_decode_slot_is_reused_only_once_the_disk_has_written_its_blocks(tmp_path, monkeypatch):
    """The disk writes a chunk's blocks while the ingest takes the next chunk, from the decode slot itself.  Here
    the disk writes nothing until the ingest waits for it: were a slot reused before its blocks were written,
    the store would hold another chunk's pixels there."""
    import threading
    import types

    from conftest import direct_io_folder
    from h5stream.store import rawchunks
    from h5stream.store.checksum import verify_store
    from h5stream.store.writer import StoreWriter

    src = tmp_path / "src"
    written = make_class_folder(src, classes=2, per_class=60, size=(20, 24), fmt="png", seed=9)
    cond, allowed, started = threading.Condition(), [0], [0]
    real_wait = StoreWriter.wait_direct_writes

    def wait_direct_writes(self, upto=None):
        with cond:  # the disk may now write what is waited for
            allowed[0] = max(allowed[0], self.direct_writes if upto is None else upto)
            cond.notify_all()
        return real_wait(self, upto)

    def pwrite(fd, data, offset):
        with cond:
            started[0] += 1
            if started[0] > 1:  # the first is made at once, in the ingest's thread
                cond.wait_for(lambda: allowed[0] >= started[0])
        return os.pwrite(fd, data, offset)

    monkeypatch.setattr(StoreWriter, "wait_direct_writes", wait_direct_writes)
    monkeypatch.setattr(rawchunks, "os", types.SimpleNamespace(**{**vars(os), "pwrite": pwrite}))
    with direct_io_folder(str(tmp_path)) as folder:
        out = os.path.join(folder, "o.h5")
        # rows of 768 bytes: a block of 16 is 3 pages, so whole blocks can go direct from a decode slot
        result = ingest(IngestOptions(src=str(src), out=out, size=(16, 16), workers=2, block_rows=16,
                                      commit_rows=10_000, order="sorted", progress=False))
        assert result.ingested == len(written) and started[0] > 4  # blocks went direct
        # and the ingest says how long it waited for the disk: part of its write and finish stages
        assert 0 < result.disk_wait_s <= result.phases["write"][0] + result.phases["finish"][0]
        assert verify_store(out).ok
        with h5py.File(out, "r") as f:
            paths = [schema.decode_path(p) for p in pathrows.stored_bytes(f, 0, f["images"].shape[0])]
            for i, rel in enumerate(paths):
                np.testing.assert_array_equal(f[schema.IMAGES][i],
                                              decode_file(str(src / rel), DecodeSpec(size=(16, 16))))
