"""Faults and misuse on encoded (JPEG) stores, each met as a user would meet it: rows that do not decode, on
every path that decodes them, raise the same one-line :class:`~h5stream.errors.ImageDecodeError` naming the row
(never other pixels), and again at every later call; damaged row ends are named; options an append would drop
are refused; `repair --source` restores damaged JPEG blocks, killed or not; a budget above the minimum streams.
Real files, real worker processes, a real HTTP server, real SIGKILLs."""

from __future__ import annotations

import re

import cv2
import numpy as np
import pytest

import h5stream
from h5stream import ImageDecodeError
from h5stream.errors import ReaderError
from h5stream.store.encoded import EncodedRows
from h5stream.store.writer import StoreWriter
from test_crash_resume import kill_shim as _kill_shim_fixture

kill_shim = _kill_shim_fixture  # the LD_PRELOAD library that SIGKILLs after the K-th change (a module fixture)

pytestmark = pytest.mark.usefixtures("no_leaks")


def write_rows(path: str, rows: list[bytes], side: int) -> str:
    """A JPEG store of ``rows`` (encoded bytes, stored as they are: their checksums match) of side ``side``."""
    with StoreWriter.create(path, image_shape=(side, side, 3), class_names=["a"], block_rows=4, encoding="jpeg") as w:
        w.append(EncodedRows.from_bytes(rows), np.zeros(len(rows), int), [f"r{i}" for i in range(len(rows))])
    return path


def noise_jpeg(rng, side: int) -> bytes:
    return cv2.imencode(".jpg", rng.integers(0, 256, (side, side, 3), dtype=np.uint8))[1].tobytes()


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("output_size", [None, 4])
def test_a_row_the_reader_decodes_that_does_not_decode_raises_image_decode_error(tmp_path, workers, output_size):
    """8x8 noise: each JPEG is larger than its 192-byte row, so the reader thread decodes it; a row that does
    not decode there raises the ImageDecodeError the decoding workers raise, not a ReaderError around its repr."""
    rng = np.random.default_rng(3)
    rows = [noise_jpeg(rng, 8) for _ in range(8)]
    rows[5] = rows[5][:len(rows[5]) // 2]  # damaged before it was stored: its checksum matches
    assert min(len(r) for r in rows) > 8 * 8 * 3
    path = write_rows(str(tmp_path / "tiny.h5"), rows, 8)
    aug = None if output_size is None else h5stream.Augment(output_size=output_size)
    with h5stream.open(path, batch_size=2, seed=0, workers=workers, shuffle=False, augment=aug) as s:
        with pytest.raises(ImageDecodeError) as caught:
            [None for _ in s]
    message = str(caught.value)
    assert message.startswith(f"{path}: row 5: its stored JPEG does not decode to a 8x8 image")
    assert "ImageDecodeError(" not in message and "\n" not in message
    assert isinstance(caught.value, ReaderError)  # as every stream read error


def smooth_jpeg(side: int, k: int) -> bytes:
    y, x = np.mgrid[0:side, 0:side] * (32 / side)
    image = np.stack([x * 7 + k, y * 7, (x + y) * 3 + 2 * k], -1).astype(np.uint8)
    return cv2.imencode(".jpg", image)[1].tobytes()


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("crop", ["random_resized", "center"])
@pytest.mark.parametrize("other_side", [16, 64])
def test_a_row_of_another_size_raises_where_its_crop_is_decoded_at_a_reduced_scale(tmp_path, workers, crop,
                                                                                   other_side):
    """A 32x32 store cropped to 4 px is decoded at 1/2 to 1/8; a 16x16 (or 64x64) JPEG in row 5 decodes to the
    reduced shape just as well (16x16 at full scale is 32x32 at 1/2), so only its size tells it apart: the same
    ImageDecodeError as a full decode of it, never a crop of other pixels."""
    rows = [smooth_jpeg(32, k) for k in range(8)]
    rows[5] = smooth_jpeg(other_side, 5)
    assert len(rows[5]) <= 32 * 32 * 3  # stays encoded in its place: decoded where the crop is
    path = write_rows(str(tmp_path / "sized.h5"), rows, 32)
    aug = h5stream.Augment(output_size=4, crop=crop)
    with h5stream.open(path, batch_size=2, seed=0, workers=workers, shuffle=False, augment=aug) as s:
        with pytest.raises(ImageDecodeError, match=rf"^{path}: row 5: its stored JPEG does not decode to a 32x32 "
                                                   rf"image \(is a {other_side}x{other_side} image, not 32x32\)"):
            [None for _ in s]


@pytest.mark.parametrize("encoding", ["raw", "jpeg"])
def test_a_compression_for_rows_appended_to_a_store_without_it_is_refused_in_one_line(tmp_path, h5cli, encoding):
    """--append --compression zlib to an uncompressed store (raw or JPEG) appended uncompressed rows without a
    word; rows are appended as the store's are, so another compression is refused, the store left as it was."""
    from h5stream.errors import ConfigError
    from h5stream.samples import make_class_folder

    src = tmp_path / "src"
    make_class_folder(src, classes=2, per_class=3, size=(20, 20), seed=1)
    out = str(tmp_path / "s.h5")
    assert h5cli("ingest", src, out, "--size", "16", "--workers", "0", "--encoding", encoding)[0] == 0
    before = open(out, "rb").read()
    code, _, err = h5cli("ingest", src, out, "--append", "--compression", "zlib", "--workers", "0")
    assert code != 0 and err.count("\n") == 1
    assert err.startswith(f"h5stream: error: {out}: store has compression none, this run asks for zlib; drop "
                          "--compression")
    assert open(out, "rb").read() == before
    written = str(tmp_path / "written.h5")
    items = (np.zeros((4, 16, 16, 3), np.uint8), np.zeros(4, int))
    h5stream.write(written, items, order="sorted", encoding=encoding)
    before = open(written, "rb").read()
    with pytest.raises(ConfigError, match="store has compression none, this write asks for zlib"):
        h5stream.write(written, items, resume=True, order="sorted", compression="zlib")
    assert open(written, "rb").read() == before


def test_a_jpeg_quality_for_rows_appended_to_a_raw_store_is_refused_in_one_line(tmp_path, h5cli):
    """Rows appended to a store are stored as its rows are: a --quality (quality=) asked of a raw store would be
    dropped without a word, so it is refused, the store left as it was."""
    from h5stream.errors import ConfigError
    from h5stream.samples import make_class_folder

    src = tmp_path / "src"
    make_class_folder(src, classes=2, per_class=3, size=(20, 20), seed=1)
    out = str(tmp_path / "raw.h5")
    assert h5cli("ingest", src, out, "--size", "16", "--workers", "0")[0] == 0
    before = open(out, "rb").read()
    code, _, err = h5cli("ingest", src, out, "--append", "--quality", "80", "--workers", "0")
    assert code != 0 and err.count("\n") == 1
    assert err.startswith(f"h5stream: error: {out}: store keeps raw pixels, this run asks for JPEG quality 80")
    assert open(out, "rb").read() == before
    written = str(tmp_path / "written.h5")
    items = (np.zeros((4, 16, 16, 3), np.uint8), np.zeros(4, int))
    h5stream.write(written, items, order="sorted")
    before = open(written, "rb").read()
    with pytest.raises(ConfigError, match="store keeps raw pixels, this write asks for JPEG quality 80"):
        h5stream.write(written, items, resume=True, order="sorted", quality=80)
    assert open(written, "rb").read() == before


def flip(path: str, row: int, back: int) -> None:
    """Flip a byte ``back`` bytes before the end of encoded row ``row`` (with plain h5py)."""
    import h5py

    from h5stream.store import schema

    with h5py.File(path, "r+") as f:
        at = int(f[schema.IMAGE_ENDS][row]) - back
        f[schema.IMAGE_BYTES][at] ^= 0x5A


def test_repair_source_restores_an_encoded_stores_damaged_blocks_byte_for_byte(tmp_path, h5cli, monkeypatch):
    """The files of a damaged block decoded and JPEG-encoded again as the ingest did give back the bytes its
    checksum was taken over: written back over the chunks of /image_bytes they cross (chunks of 1,000 bytes
    here, so each block crosses several), the file is the one ingested; a block whose file changed since is
    named and left, the others restored all the same."""
    import shutil

    from h5stream.samples import make_class_folder
    from h5stream.store import encoded as encoded_store
    from h5stream.store.checksum import verify_store

    monkeypatch.setattr(encoded_store, "ENCODED_CHUNK_BYTES", 1000)
    src = tmp_path / "src"
    make_class_folder(src, classes=3, per_class=8, size=(40, 48), seed=2)
    good = str(tmp_path / "good.h5")
    assert h5cli("ingest", src, good, "--size", "32", "--encoding", "jpeg", "--block-rows", "4", "--order",
                 "sorted", "--workers", "0")[0] == 0
    path = str(tmp_path / "damaged.h5")
    shutil.copyfile(good, path)
    flip(path, 5, 30)  # block 1
    flip(path, 18, 200)  # block 4
    assert [b.start for b in verify_store(path).bad] == [4, 16]
    code, out, err = h5cli("repair", path, "--source", src)
    assert (code, err) == (0, ""), err
    assert out.startswith(f"{path}: restored 8 damaged rows in 2 blocks from their source files in {src}")
    assert open(path, "rb").read() == open(good, "rb").read()

    shutil.copyfile(good, path)
    flip(path, 5, 30)
    flip(path, 18, 200)
    changed = sorted(p.relative_to(src) for p in src.rglob("*") if p.is_file())[18]  # row 18's file, sorted order
    from PIL import Image

    Image.new("RGB", (40, 48), (200, 10, 10)).save(src / changed)
    code, out, err = h5cli("repair", path, "--source", src)
    assert code == 1 and err.count("\n") == 1
    assert "rows 16-19 do not match their checksum" in err and "--source restored 1 of 2 damaged blocks" in err
    assert "decoded and encoded again, their files give other bytes than were ingested" in err
    assert [b.start for b in verify_store(path).bad] == [16]  # block 1 restored, block 4 left as it was


@pytest.mark.parametrize("end", [10**7, -100])
def test_repair_source_names_blocks_whose_row_ends_are_damaged_and_writes_nothing(tmp_path, h5cli, end):
    """A block's last end set past /image_bytes (or back into the row): its bytes cannot be placed, so --source
    names it in the one line and leaves the file as it is (it raised a TypeError traceback for an end past the
    stored bytes)."""
    import h5py

    from h5stream.samples import make_class_folder
    from h5stream.store import schema

    src = tmp_path / "src"
    make_class_folder(src, classes=2, per_class=6, size=(40, 48), seed=3)
    path = str(tmp_path / "ends.h5")
    assert h5cli("ingest", src, path, "--size", "32", "--encoding", "jpeg", "--block-rows", "4", "--workers",
                 "0")[0] == 0
    with h5py.File(path, "r+") as f:
        f[schema.IMAGE_ENDS][3] = end if end > 0 else f[schema.IMAGE_ENDS][3] + end
    damaged = open(path, "rb").read()
    code, _, err = h5cli("repair", path, "--source", src)
    assert code == 1 and err.count("\n") == 1 and err.startswith("h5stream: error: ")
    assert "rows 0-3: their row ends in /image_ends are damaged too" in err
    assert open(path, "rb").read() == damaged


def test_repair_source_of_an_encoded_store_killed_after_each_of_its_writes_is_finished_by_the_next(kill_shim, tmp_path,
                                                                                                  h5cli):
    import os
    import signal
    import subprocess
    import sys

    from h5stream.samples import make_class_folder

    src = tmp_path / "src"
    make_class_folder(src, classes=2, per_class=6, size=(40, 48), seed=3)
    path = str(tmp_path / "dmg.h5")
    assert h5cli("ingest", src, path, "--size", "32", "--encoding", "jpeg", "--block-rows", "4", "--workers",
                 "0")[0] == 0
    good = open(path, "rb").read()
    flip(path, 2, 40)
    flip(path, 9, 40)
    damaged = open(path, "rb").read()

    def killed_repair(after, log=None):
        env = dict(os.environ, LD_PRELOAD=kill_shim, KILL_DIR=str(tmp_path), KILL_AFTER=str(after))
        if log is not None:
            env["KILL_LOG"] = str(log)
        return subprocess.run([sys.executable, "-m", "h5stream", "repair", path, "--source", str(src)],
                              env=env, capture_output=True, text=True, timeout=300)

    log = tmp_path / "steps.log"
    assert killed_repair(0, log).returncode == 0 and open(path, "rb").read() == good
    steps = [s for s in log.read_text().splitlines() if s.endswith("dmg.h5")]
    assert sum(" pwrite" in s for s in steps) == 2, steps  # one write per damaged block (one chunk each)
    for k in range(1, len(steps) + 1):
        with open(path, "wb") as fh:
            fh.write(damaged)
        assert killed_repair(k).returncode == -signal.SIGKILL, k
        assert h5cli("verify", path)[0] in (0, 1)  # restored or still damaged, never anything else
        code, _, err = h5cli("repair", path, "--source", src)
        assert code == 0 and open(path, "rb").read() == good, (k, err)


def test_a_local_jpeg_store_streams_under_every_budget_above_its_minimum(tmp_path):
    """What reading JPEG rows holds (their ends, a block per read in flight, a row per decoder) is the local
    file's own memory, planned with its fills: a budget above the minimum streams (it was refused at some budgets
    as if the file were a URL whose 'remote client' did not fit beside the local file's fills), and the plan
    names it for what it is."""
    from h5stream.streaming.planning import plan_stream
    from h5stream.store.meta import read_meta

    rng = np.random.default_rng(0)
    rows = [noise_jpeg(rng, 64) for _ in range(50)]  # ~4 KiB a row: 2 blocks in flight hold 2 MiB
    path = str(tmp_path / "big.h5")
    with StoreWriter.create(path, image_shape=(64, 64, 3), class_names=["a"], block_rows=256, encoding="jpeg") as w:
        for k in range(100):
            w.append(EncodedRows.from_bytes(rows), np.zeros(50, int), [f"r{k}-{i}" for i in range(50)])
    meta = read_meta(path)
    kw = dict(available_bytes=None, verify_reads="once")  # as h5stream.open plans it by default
    minimum = plan_stream(meta, None, 32, **kw).min_budget_bytes
    refused = []
    for mib in range(-(-minimum // (1 << 20)), 64):
        try:
            plan = plan_stream(meta, mib << 20, 32, **kw)
        except h5stream.BudgetError as exc:
            refused.append((mib, str(exc)))
            continue
        assert plan.total_bytes <= mib << 20
        assert plan.remote_client_bytes == 0 and plan.allocations()["JPEG reads"] > 0
    assert refused == []
    assert "remote client" not in plan.describe() and "JPEG reads" in plan.describe()
    with h5stream.open(path, batch_size=32, memory_budget="28MiB") as s:  # refused before
        assert sum(len(x) for x, _ in s) == 5000


def test_a_jpeg_store_at_a_url_keeps_its_local_files_order_under_a_budget(tmp_path):
    """A URL under a given budget gets its local file's fills, the local file's JPEG reads counted as the local
    file counts them (the URL's client, and its JPEG reads with more requests in flight, beside them), or a
    BudgetError naming the fill that fits; with that fill both give the same batches."""
    pytest.importorskip("obstore")
    from remote_servers import RangeServerProcess

    from h5stream.remote.config import RemoteOptions

    rng = np.random.default_rng(0)
    rows = [noise_jpeg(rng, 64) for _ in range(50)]
    root = tmp_path / "www"
    root.mkdir()
    path = str(root / "big.h5")
    with StoreWriter.create(path, image_shape=(64, 64, 3), class_names=["a", "b"], block_rows=256,
                            encoding="jpeg") as w:
        for k in range(100):
            w.append(EncodedRows.from_bytes(rows), np.arange(50) % 2, [f"r{k}-{i}" for i in range(50)])

    def first_batches(where, **kw):
        with h5stream.open(where, batch_size=32, seed=1, **kw) as s:
            it = iter(s)
            got = [tuple(np.array(v) for v in next(it)) for _ in range(3)]
            return s.plan.rows_per_fill, s.epoch_order(0), got

    with RangeServerProcess(root) as server:
        url = dict(remote=RemoteOptions(timeout_s=10), cache_dir=None)
        for budget in ("80MiB", "96MiB", "160MiB", "192MiB"):
            here = first_batches(path, memory_budget=budget)
            try:
                there = first_batches(server.url + "big.h5", memory_budget=budget, **url)
            except h5stream.BudgetError as exc:
                fill = {"rows_per_fill": exc.rows_per_fill}
                here = first_batches(path, memory_budget=budget, **fill)
                there = first_batches(server.url + "big.h5", memory_budget=budget, **fill, **url)
            assert here[0] == there[0] and np.array_equal(here[1], there[1])
            for a, b in zip(here[2], there[2]):
                np.testing.assert_array_equal(a[0], b[0])
                np.testing.assert_array_equal(a[1], b[1])


@pytest.mark.parametrize("workers", [0, 2])
def test_damaged_row_ends_are_one_store_format_error_that_says_what_is_damaged(tmp_path, h5cli, workers):
    """/image_ends placing a row before the one it follows, or the last row past /image_bytes: one line naming
    /image_ends and the row (a StoreFormatError at open, a ReaderError from the reader thread: never the repr of
    one inside the other, never '/images', never `repair`, which cannot rebuild them), and `verify` names the rows
    where it can read the store."""
    import shutil

    import h5py

    from h5stream.errors import StoreFormatError
    from h5stream.store import schema

    good = write_rows(str(tmp_path / "good.h5"), [smooth_jpeg(32, k) for k in range(12)], 32)
    for row, set_to, says in ((6, lambda ends: ends[4] - 5, r"row 6 ends at byte \d+, before row 5 does \(\d+\)"),
                              (11, lambda ends: ends[11] + 10**6, r"its committed row 11 ends at byte \d+, outside "
                                                                  r"the \d+ bytes of /image_bytes")):
        path = str(tmp_path / f"ends{row}.h5")
        shutil.copyfile(good, path)
        with h5py.File(path, "r+") as f:
            ends = f[schema.IMAGE_ENDS][:]
            f[schema.IMAGE_ENDS][row] = set_to(ends)
        with pytest.raises((StoreFormatError, ReaderError)) as caught:
            with h5stream.open(path, batch_size=4, seed=0, workers=workers) as s:
                [None for _ in s]
        message = str(caught.value)
        assert re.match(rf"{re.escape(path)}: (reading failed: )?/image_ends is damaged: ", message), message
        assert "\n" not in message and "Error(" not in message
        assert re.search(says, message), message
        assert "/images " not in message and "repair" not in message
        code, _, err = h5cli("verify", path)
        assert code == 1 and err.count("\n") == 1
        if row == 6:
            assert "rows 4-7 do not match their checksum (images: rows 6, 7)" in err, err


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("output_size", [None, 4])
def test_after_a_row_that_does_not_decode_every_next_raises_it_again_until_a_restart(tmp_path, workers, output_size):
    """The batch whose row does not decode is taken from the reader all the same: the next call raised 'feed out
    of step' (a bare RuntimeError) and the feed went on to later batches. It raises the same error again, every
    call, and a restore to the state before it gives the batches before it again, then the error."""
    rows = [smooth_jpeg(32, k) for k in range(12)]
    rows[5] = rows[5][:len(rows[5]) // 2]
    path = write_rows(str(tmp_path / "bad.h5"), rows, 32)
    aug = None if output_size is None else h5stream.Augment(output_size=output_size)
    with h5stream.open(path, batch_size=2, seed=0, workers=workers, shuffle=False, augment=aug) as s:
        start = s.state()
        it = iter(s)
        first = [np.array(next(it)[0]) for _ in range(2)]
        state = s.state()
        for _ in range(3):
            with pytest.raises(ImageDecodeError, match=rf"^{path}: row 5: its stored JPEG does not decode"):
                next(it)
        s.restore(state)
        with pytest.raises(ImageDecodeError, match="row 5"):
            next(iter(s))
        s.restore(start)
        again = iter(s)
        np.testing.assert_array_equal(np.array(next(again)[0]), first[0])
