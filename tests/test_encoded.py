"""Encoded (JPEG) stores: the layout plain h5py reads, ingest --encoding, and every stream guarantee a raw store
has (same batches as decoding the stored JPEGs yourself, resume, shards, feeder, checks, URL), on real files."""

from __future__ import annotations

import os
import shutil

import h5py
import numpy as np
import pytest

import h5stream
from h5stream import cli
from h5stream.errors import ChecksumError, StoreFormatError
from h5stream import ImageDecodeError  # public, as every stream error
from h5stream.samples import make_class_folder
from h5stream.store import schema
from h5stream.store.checksum import verify_store
from h5stream.store.encoded import EncodedRows
from h5stream.store.jpeg import decode
from h5stream.store.meta import read_meta

SIDE = 32
BLOCK = 8


@pytest.fixture(scope="module")
def jpeg_src(tmp_path_factory):
    root = tmp_path_factory.mktemp("jpegsrc") / "src"
    make_class_folder(root, classes=3, per_class=(14, 12, 13), size=(48, 56), seed=4)
    return str(root)


@pytest.fixture(scope="module")
def jpeg_store(tmp_path_factory, jpeg_src):
    """39 rows of 32x32x3 JPEG q90 in blocks of 8; read it, never write it."""
    path = str(tmp_path_factory.mktemp("jpegstore") / "j.h5")
    assert cli.main(["ingest", jpeg_src, path, "--size", str(SIDE), "--encoding", "jpeg", "--block-rows",
                     str(BLOCK), "--workers", "0"]) == 0
    return path


def stored_rows(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Every committed row decoded from its stored JPEG with plain h5py and the public decoder, and the labels."""
    with h5py.File(path, "r") as f:
        n = int(f.attrs[schema.ATTR_ENCODED_COMMITTED])
        ends, data = f[schema.IMAGE_ENDS][:n], f[schema.IMAGE_BYTES][:]
        shape = tuple(int(f.attrs[k]) for k in (schema.ATTR_HEIGHT, schema.ATTR_WIDTH, schema.ATTR_CHANNELS))
        labels = f[schema.LABELS][:n]
    starts = np.concatenate([[0], ends[:-1]])
    return np.stack([decode(data[a:b], shape) for a, b in zip(starts, ends)]), labels


def streamed(stream) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for x, y in stream:
        xs.append(np.array(x))
        ys.append(np.array(y))
    return np.concatenate(xs), np.concatenate(ys)


# -- the store -----------------------------------------------------------------------------------------------------


def test_layout_is_bytes_plus_ends_that_plain_h5py_reads(jpeg_store):
    meta = read_meta(jpeg_store)
    assert (meta.encoding, meta.rows, meta.image_shape, meta.jpeg_quality) == ("jpeg", 39, (SIDE, SIDE, 3), 90)
    with h5py.File(jpeg_store, "r") as f:
        ends = f[schema.IMAGE_ENDS][:]
        assert f[schema.IMAGES].shape == (0, SIDE, SIDE, 3)  # the decoded shape, no rows
        assert ends[-1] == meta.encoded_bytes <= f[schema.IMAGE_BYTES].shape[0]
        first = bytes(f[schema.IMAGE_BYTES][:ends[0]])
    assert first[:2] == b"\xff\xd8" and first[-2:] == b"\xff\xd9"  # a whole JPEG file
    assert meta.encoded_bytes < 39 * SIDE * SIDE * 3 / 3  # far smaller than the pixels
    assert verify_store(jpeg_store).ok


def test_an_older_h5stream_reaches_the_format_version_and_says_upgrade(jpeg_store, monkeypatch):
    # What a reader that predates encoded rows checks before the version: /images and /labels, the committed count
    # (absent: every row present in both), the chunk rows.  An encoded store passes them as an empty store ...
    with h5py.File(jpeg_store, "r") as f:
        assert schema.ATTR_COMMITTED not in f.attrs
        assert f[schema.IMAGES].shape[0] == 0 and f[schema.IMAGES].chunks[0] == f.attrs[schema.ATTR_BLOCK_ROWS]
        assert f.attrs[schema.ATTR_FORMAT] >= schema.ENCODED_FORMAT_VERSION > 1
    # ... so its version check is what refuses it, with the one line that says upgrade.
    monkeypatch.setattr(schema, "FORMAT_VERSION", 1)
    with pytest.raises(StoreFormatError, match="upgrade h5stream"):
        read_meta(jpeg_store)


def test_writer_appends_commits_and_reopens(tmp_path):
    import cv2

    from h5stream.store.writer import StoreWriter

    rng = np.random.default_rng(0)
    images = [cv2.imencode(".jpg", rng.integers(0, 256, (16, 16, 3), dtype=np.uint8))[1] for _ in range(21)]
    path = str(tmp_path / "w.h5")
    with StoreWriter.create(path, image_shape=(16, 16, 3), class_names=["a"], block_rows=4, encoding="jpeg") as w:
        w.append(EncodedRows.from_bytes(images[:10]), np.zeros(10, int), [f"r{i}" for i in range(10)])
        w.commit()
        w.append(EncodedRows.from_bytes(images[10:13]), np.zeros(3, int), ["a", "b", "c"])
        w.rollback(10)  # the uncommitted rows and their bytes go
    with StoreWriter.open_append(path) as w:
        w.append(EncodedRows.from_bytes(images[10:]), np.zeros(11, int), [f"s{i}" for i in range(11)])
    with h5py.File(path, "r") as f:
        ends = f[schema.IMAGE_ENDS][:]
        data = f[schema.IMAGE_BYTES][:]
    assert len(ends) == 21 and ends[-1] == len(data) == sum(len(b) for b in images)
    assert all(bytes(data[(ends[i - 1] if i else 0):ends[i]]) == images[i].tobytes() for i in range(21))
    assert verify_store(path).ok and read_meta(path).rows == 21
    sizes = [sum(len(b) for b in images[i:i + 4]) for i in range(0, 21, 4)]  # blocks cut by the commits too
    assert read_meta(path).encoded_block_bytes == max(sizes)


def test_encoded_rows_digest_does_not_depend_on_grouping():
    from h5stream.store.checksum import BlockHasher

    rows = [bytes([i]) * (i + 3) for i in range(10)]
    one, many = BlockHasher(4), BlockHasher(4)
    labels, paths = np.zeros(10, np.int64), np.array([b"p"] * 10, "S512")
    one.add(EncodedRows.from_bytes(rows), labels, paths)
    for a, b in ((0, 3), (3, 4), (4, 10)):
        many.add(EncodedRows.from_bytes(rows[a:b]), labels[a:b], paths[a:b])
    digests = one.take_complete()
    assert len(digests) == 2 and digests == many.take_complete() and one.tail() == many.tail()
    moved = BlockHasher(4)  # the same bytes, one boundary between rows moved: another digest for that block
    moved.add(EncodedRows.from_bytes([rows[0] + rows[1][:1], rows[1][1:]] + rows[2:]), labels, paths)
    first, second = moved.take_complete()
    assert first[0] != digests[0][0] and second[0] == digests[1][0]


def test_a_flipped_byte_is_found_by_verify_and_repair_names_the_rows(jpeg_store, tmp_path, capsys):
    path = str(tmp_path / "bad.h5")
    shutil.copyfile(jpeg_store, path)
    with h5py.File(path, "r+") as f:
        ends = f[schema.IMAGE_ENDS][:]
        at = int(ends[BLOCK + 1]) - 10  # inside row 9 (block 1)
        f[schema.IMAGE_BYTES][at] ^= 0xFF
    result = verify_store(path)
    assert [(b.start, b.stop, b.parts) for b in result.bad] == [(BLOCK, 2 * BLOCK, ("images",))]
    assert cli.main(["repair", path]) != 0
    assert "rows 8-15" in capsys.readouterr().err
    before = open(path, "rb").read()
    assert cli.main(["repair", path, "--source", os.path.dirname(path)]) != 0  # a folder without the files
    err = capsys.readouterr().err
    assert "rows 8-15" in err and "--source restored 0 of 1 damaged blocks" in err and "cannot be decoded" in err
    assert err.count("\n") == 1 and open(path, "rb").read() == before


def test_repair_rebuilds_an_encoded_store_left_mid_flush(jpeg_store, tmp_path):
    path = str(tmp_path / "torn.h5")
    shutil.copyfile(jpeg_store, path)
    open(schema.flushing_path(path), "w").close()  # a writer stopped while HDF5 rewrote the file in place
    assert cli.main(["repair", path]) == 0
    assert not os.path.exists(schema.flushing_path(path))
    assert read_meta(path).encoding == "jpeg" and verify_store(path).ok
    np.testing.assert_array_equal(stored_rows(path)[0], stored_rows(jpeg_store)[0])


# -- ingest ----------------------------------------------------------------------------------------------------------


def test_ingest_jpeg_with_workers_matches_in_process_and_append_adds_only_new_files(jpeg_src, jpeg_store, tmp_path,
                                                                                    capsys):
    path = str(tmp_path / "w.h5")
    assert cli.main(["ingest", jpeg_src, path, "--size", str(SIDE), "--encoding", "jpeg", "--block-rows",
                     str(BLOCK), "--workers", "2"]) == 0
    with h5py.File(path, "r") as a, h5py.File(jpeg_store, "r") as b:  # the same bytes, encoded in the workers
        assert np.array_equal(a[schema.IMAGE_ENDS][:], b[schema.IMAGE_ENDS][:])
        assert np.array_equal(a[schema.IMAGE_BYTES][:], b[schema.IMAGE_BYTES][:])
    more = tmp_path / "more"
    make_class_folder(more, classes=("omega", "zeta"), per_class=4, size=(48, 56), seed=9)
    assert cli.main(["ingest", str(more), path, "--append", "--workers", "0"]) == 0
    assert read_meta(path).rows == 39 + 8 and verify_store(path).ok
    assert cli.main(["ingest", jpeg_src, path, "--append", "--encoding", "raw"]) != 0
    assert "store has encoding jpeg" in capsys.readouterr().err
    assert cli.main(["info", path]) == 0
    assert "encoding        jpeg quality 90" in capsys.readouterr().out


def test_ingest_auto_keeps_tiny_images_raw_and_photos_jpeg(jpeg_src, tmp_path):
    tiny, big = str(tmp_path / "t.h5"), str(tmp_path / "b.h5")
    assert cli.main(["ingest", jpeg_src, tiny, "--size", "8", "--encoding", "auto", "--workers", "0"]) == 0
    assert cli.main(["ingest", jpeg_src, big, "--size", "48", "--encoding", "auto", "--workers", "1"]) == 0
    assert read_meta(tiny).encoding == "raw" and read_meta(big).encoding == "jpeg"


def test_auto_picks_jpeg_for_large_photos_by_the_bytes_one_core_decodes_not_the_images():
    from h5stream.ingest.encode import choose

    raw = 32 * 768 * 1024 * 3  # 32 photos of 1024x768: 9x smaller as JPEG, 2 ms a decode (500 images/s, 600 MB/s)
    assert choose({"images": 32, "raw_bytes": raw, "jpeg_bytes": raw // 9, "decode_s": 32 * 0.002}) == "jpeg"
    assert choose({"images": 32, "raw_bytes": raw, "jpeg_bytes": raw // 9, "decode_s": 32 * 0.1}) == "raw"  # 24 MB/s
    assert choose({"images": 32, "raw_bytes": raw, "jpeg_bytes": raw // 2, "decode_s": 32 * 0.002}) == "raw"


def test_ingest_auto_stores_large_photos_as_jpeg(tmp_path):
    from h5stream.samples import make_realistic_jpegs

    src, out = tmp_path / "photos", str(tmp_path / "p.h5")
    make_realistic_jpegs(src, 4, classes=2, size=(768, 1024))
    assert cli.main(["ingest", str(src), out, "--size", "768x1024", "--encoding", "auto", "--workers", "0"]) == 0
    meta = read_meta(out)
    assert meta.encoding == "jpeg" and meta.rows == 4
    with h5py.File(out, "r") as f:  # several times smaller than the 4 rows of pixels
        assert f[schema.IMAGE_BYTES].shape[0] * 3 < 4 * 768 * 1024 * 3


def test_ingest_refuses_jpeg_with_compression_and_a_bad_quality(jpeg_src, tmp_path, capsys):
    out = str(tmp_path / "x.h5")
    assert cli.main(["ingest", jpeg_src, out, "--encoding", "jpeg", "--compression", "zlib"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("h5stream: error: --encoding jpeg and --compression zlib") and err.count("\n") == 1
    assert cli.main(["ingest", jpeg_src, out, "--encoding", "jpeg", "--quality", "101"]) != 0
    assert "--quality must be an integer from 1 to 100" in capsys.readouterr().err
    assert cli.main(["ingest", jpeg_src, out, "--quality", "80"]) != 0  # a raw store has no quality
    assert "--quality 80 is the JPEG quality of --encoding jpeg or auto" in capsys.readouterr().err
    assert not os.path.exists(out)


# -- streaming -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_stream_yields_the_stored_jpegs_decoded_in_epoch_order(jpeg_store, workers, no_leaks):
    rows, labels = stored_rows(jpeg_store)
    with h5stream.open(jpeg_store, batch_size=5, seed=7, workers=workers, rows_per_fill=16) as s:
        order = s.epoch_order(0)
        x, y = streamed(s)
    assert sorted(order.tolist()) == list(range(len(rows)))
    np.testing.assert_array_equal(x, rows[order])
    np.testing.assert_array_equal(y, labels[order])


@pytest.mark.parametrize("workers", [0, 2])
def test_augmented_stream_equals_the_augmentation_of_the_decoded_rows(jpeg_store, workers, no_leaks):
    rows, _ = stored_rows(jpeg_store)
    aug = h5stream.Augment(horizontal_flip=True, rotation_range=10, rescale=1 / 255)
    with h5stream.open(jpeg_store, batch_size=6, seed=3, workers=workers, augment=aug) as s:
        order = s.epoch_order(0)
        x, _ = streamed(s)
    expected = [aug(rows[order[i:i + 6]], seed=3, epoch=0, row_ids=order[i:i + 6]) for i in range(0, len(order), 6)]
    np.testing.assert_allclose(x, np.concatenate(expected), atol=1e-6)


def test_resume_mid_epoch_gives_the_rest(jpeg_store, no_leaks):
    with h5stream.open(jpeg_store, batch_size=4, seed=1) as s:
        whole, _ = streamed(s)
    with h5stream.open(jpeg_store, batch_size=4, seed=1) as s:
        it = iter(s)
        first = [np.array(next(it)[0]) for _ in range(3)]
        state = s.state()
    with h5stream.open(jpeg_store, batch_size=4, seed=1, resume=state, workers=2) as s:
        rest, _ = streamed(s)
    np.testing.assert_array_equal(np.concatenate(first + [rest]), whole)


def test_shards_together_give_every_row_once(jpeg_store, no_leaks):
    rows, _ = stored_rows(jpeg_store)
    seen = []
    for k in range(2):
        with h5stream.open(jpeg_store, batch_size=4, seed=2, shard=(k, 2), drop_remainder=False) as s:
            order = s.epoch_order(0)
            x, _ = streamed(s)
        np.testing.assert_array_equal(x, rows[order])
        seen.extend(order.tolist())
    assert sorted(seen) == list(range(len(rows)))


def test_feeder_streams_the_same_batches(jpeg_store, no_leaks):
    with h5stream.open(jpeg_store, batch_size=8, seed=5) as s:
        inline, _ = streamed(s)
    with h5stream.open(jpeg_store, batch_size=8, seed=5, workers=1, feeder=True) as s:
        fed, _ = streamed(s)
    np.testing.assert_array_equal(fed, inline)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_flipped_encoded_byte_raises_checksum_error_before_a_wrong_batch(jpeg_store, tmp_path, workers, no_leaks):
    path = str(tmp_path / "flip.h5")
    shutil.copyfile(jpeg_store, path)
    rows, _ = stored_rows(jpeg_store)
    with h5py.File(path, "r+") as f:
        ends = f[schema.IMAGE_ENDS][:]
        f[schema.IMAGE_BYTES][int(ends[20]) - 30] ^= 0x01  # row 20: still a decodable JPEG, other pixels
    with h5stream.open(path, batch_size=3, seed=0, workers=workers, shuffle=False) as s:
        got = []
        with pytest.raises(ChecksumError, match=r"row 20 \(block 2\)"):  # each row checked against its digest
            for x, _ in s:
                got.append(np.array(x))
    assert len(got) * 3 <= 20  # not the damaged row
    if got:
        np.testing.assert_array_equal(np.concatenate(got), rows[:len(got) * 3])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_row_that_does_not_decode_is_an_error_naming_the_row(tmp_path, workers, no_leaks):
    import cv2

    from h5stream.store.writer import StoreWriter

    rng = np.random.default_rng(1)
    good = [cv2.imencode(".jpg", rng.integers(0, 256, (16, 16, 3), dtype=np.uint8))[1].tobytes() for _ in range(8)]
    rows = good[:5] + [good[5][:40] + b"\x00" * 300] + good[6:]  # damaged before it was stored: checksums match
    path = str(tmp_path / "d.h5")
    with StoreWriter.create(path, image_shape=(16, 16, 3), class_names=["a"], block_rows=4, encoding="jpeg") as w:
        w.append(EncodedRows.from_bytes(rows), np.zeros(8, int), [f"r{i}" for i in range(8)])
    assert verify_store(path).ok
    with h5stream.open(path, batch_size=2, seed=0, workers=workers, shuffle=False) as s:
        with pytest.raises(ImageDecodeError, match=rf"{path}: row 5: its stored JPEG does not decode"):
            streamed(s)


def test_a_url_store_streams_the_same_batches(jpeg_store, tmp_path, no_leaks):
    pytest.importorskip("obstore")
    from remote_servers import RangeServer

    from h5stream.remote.config import RemoteOptions

    root = tmp_path / "www"
    root.mkdir()
    shutil.copyfile(jpeg_store, root / "j.h5")
    server = RangeServer(root)
    try:
        with h5stream.open(jpeg_store, batch_size=8, seed=9) as s:
            local, _ = streamed(s)
        with h5stream.open(server.url + "j.h5", batch_size=8, seed=9, workers=1,
                           remote=RemoteOptions(timeout_s=10)) as s:
            remote, _ = streamed(s)
        assert verify_store(server.url + "j.h5", remote=RemoteOptions(timeout_s=10)).ok
    finally:
        server.stop()
    np.testing.assert_array_equal(remote, local)


def test_the_budget_counts_the_ends_the_largest_encoded_block_per_read_and_a_row_per_decoder(jpeg_store):
    from dataclasses import replace

    from h5stream.streaming.planning import plan_stream

    meta = read_meta(jpeg_store)
    with h5py.File(jpeg_store, "r") as f:
        ends = f[schema.IMAGE_ENDS][:]
    sizes = np.diff(np.concatenate([[0], ends[BLOCK - 1::BLOCK], [] if len(ends) % BLOCK == 0 else [ends[-1]]]))
    assert meta.encoded_block_bytes == int(sizes.max()) > 0  # recorded commit by commit by the writer
    raw = replace(meta, encoding="raw")
    from h5stream.read.source import DIRECT_IN_FLIGHT, LocalFile

    for workers, direct_io, in_flight in ((0, False, LocalFile.max_in_flight), (2, False, LocalFile.max_in_flight),
                                          (2, True, DIRECT_IN_FLIGHT)):
        encoded_plan = plan_stream(meta, None, 8, workers=workers, available_bytes=None, direct_io=direct_io)
        raw_plan = plan_stream(raw, None, 8, workers=workers, available_bytes=None, direct_io=direct_io)
        # the ends of the committed rows, a block per read in flight (the reader's I/O threads), a row per decoder
        assert encoded_plan.total_bytes - raw_plan.total_bytes == \
            8 * meta.rows + in_flight * meta.encoded_block_bytes + (workers + 1) * meta.row_bytes


def test_featurewise_statistics_are_those_of_the_decoded_rows(jpeg_store):
    from h5stream.augment.stats import compute_feature_stats

    rows, _ = stored_rows(jpeg_store)
    mean, std = compute_feature_stats(jpeg_store)[:2]
    np.testing.assert_allclose(mean, rows.reshape(-1, 3).mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(std, rows.reshape(-1, 3).std(axis=0), rtol=1e-4)


def test_bench_of_an_encoded_store_measures_the_stream_and_no_pixel_baseline(jpeg_store):
    from h5stream.commands.bench import run_bench

    result, _timeline = run_bench(jpeg_store, batch_size=8, progress=False)
    assert result["baselines"] == {} and result["order_matches_yield"] is True


def test_jpeg_rows_are_the_raw_rows_within_jpeg_error_channel_for_channel(jpeg_src, tmp_path):
    raw, jpeg = str(tmp_path / "r.h5"), str(tmp_path / "j.h5")
    for out, extra in ((raw, []), (jpeg, ["--encoding", "jpeg", "--quality", "95"])):
        assert cli.main(["ingest", jpeg_src, out, "--size", str(SIDE), "--workers", "0", "--order", "sorted",
                         *extra]) == 0
    with h5py.File(raw, "r") as f:
        pixels = f[schema.IMAGES][:].astype(np.float64)
    decoded = stored_rows(jpeg)[0].astype(np.float64)
    assert np.abs(decoded - pixels).mean() < 3  # a swapped R and B would differ by tens on these coloured images
    np.testing.assert_allclose(decoded.mean(axis=(0, 1, 2)), pixels.mean(axis=(0, 1, 2)), atol=1.5)
    assert read_meta(jpeg).jpeg_quality == 95


@pytest.mark.parametrize("scale", [2, 4, 8])
def test_reduced_scale_decoding_gives_the_image_that_many_times_smaller(jpeg_store, scale):
    import cv2

    from h5stream.store.jpeg import scaled_shape

    with h5py.File(jpeg_store, "r") as f:
        data = f[schema.IMAGE_BYTES][:f[schema.IMAGE_ENDS][0]]
    full = decode(data, (SIDE, SIDE, 3))
    small = decode(data, (SIDE, SIDE, 3), scale=scale)
    assert small.shape == scaled_shape((SIDE, SIDE, 3), scale) == (SIDE // scale, SIDE // scale, 3)
    shrunk = cv2.resize(full, small.shape[1::-1], interpolation=cv2.INTER_AREA)
    assert np.abs(small.astype(int) - shrunk).mean() < 6
    with pytest.raises(ValueError, match="scale must be one of"):
        decode(data, (SIDE, SIDE, 3), scale=3)


def test_auto_measures_the_decode_rate_past_the_first_calls_set_up_in_a_fresh_process():
    """The probe's first decode in a process pays the decoder's set-up (its import, first allocations): 32 small
    photos timed once in a fresh process measured 45-65 MB/s of pixels where they decode at about 200, and ``auto``
    then stored them raw now and then.  The fastest of several passes is the rate."""
    import subprocess
    import sys

    code = ("import numpy as np; from h5stream.ingest.encode import probe, choose\n"
            "side = 32; ramp = np.linspace(0, 200, side, dtype=np.float32)\n"
            "base = ramp[None, :, None, None] + ramp[None, None, :, None] * 0.2\n"
            "rng = np.random.default_rng(0)\n"
            "x = np.clip(base + rng.normal(0, 4, (32, side, side, 3)) + rng.integers(0, 50, (32, 1, 1, 3)), 0, 255)\n"
            "print(choose(probe(x.astype(np.uint8), 85)))\n")
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "jpeg"
