"""Encoded (JPEG) stores read by byte offset, as raw ones are: runs of rows are byte ranges of ``/image_bytes``
located from its chunk index, so an encoded store streams while an ingest appends to it, a set of encoded parts
streams as one store, and ``direct_io=True`` and a URL read the same bytes as the page cache, on real files."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

import h5stream
from h5stream.read.encbytes import byte_pieces
from h5stream.store import encoded as encoded_store
from h5stream.store import schema
from h5stream.store.encoded import EncodedRows
from h5stream.store.jpeg import decode
from h5stream.store.meta import read_meta
from h5stream.store.writer import StoreWriter

pytestmark = pytest.mark.usefixtures("no_leaks")

SIZES = (13, 22, 9)  # no part a multiple of the 4-row blocks
SHAPE = (16, 16, 3)
CHUNK_BYTES = 1000  # chunks of /image_bytes that cut rows: a run crosses chunks
SAFETY_S = 120.0


def _jpegs(n: int, first: int, side: int = 16) -> list[bytes]:
    """Rows ``first .. first + n - 1`` of one sequence as JPEG q90: smooth images, every fifth one noise (its JPEG
    larger than its pixels at 16 px: the reader decodes it in place)."""
    import cv2

    out = []
    yy, xx = np.mgrid[0:side, 0:side]
    for i in range(first, first + n):
        img = np.stack([(yy * 16 + i * 5) % 256, (xx * 16 + i) % 256, np.full((side, side), i * 37 % 256)],
                       -1).astype(np.uint8)
        if i % 5 == 0:
            img = np.random.default_rng(i).integers(0, 256, (side, side, 3), dtype=np.uint8)
        out.append(cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes())
    return out


def _write(path, rows: list[bytes], first: int, side: int = 16, block_rows: int = 4) -> None:
    n = len(rows)
    with StoreWriter.create(path, image_shape=(side, side, 3), class_names=["a", "b", "c"], block_rows=block_rows,
                            encoding="jpeg") as w:
        for a in range(0, n, 5):  # several commits
            b = min(n, a + 5)
            w.append(EncodedRows.from_bytes(rows[a:b]), np.arange(first + a, first + b) % 3,
                     [f"r{first + i}" for i in range(a, b)])


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """(parts, whole): three encoded part stores and one encoded store of their rows in the same order, all with
    /image_bytes in chunks of CHUNK_BYTES."""
    root = tmp_path_factory.mktemp("encparts")
    parts, first = [], 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(encoded_store, "ENCODED_CHUNK_BYTES", CHUNK_BYTES)
        for k, n in enumerate(SIZES):
            path = str(root / f"part-{k}.h5")
            _write(path, _jpegs(n, first), first)
            parts.append(path)
            first += n
        whole = str(root / "whole.h5")
        _write(whole, _jpegs(first, 0), 0)
    return parts, whole


def stored_rows(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Every committed row decoded from its stored JPEG with plain h5py, and the labels."""
    with h5py.File(path, "r") as f:
        n = int(f.attrs[schema.ATTR_ENCODED_COMMITTED])
        ends, data = f[schema.IMAGE_ENDS][:n], f[schema.IMAGE_BYTES][:]
        shape = tuple(int(f.attrs[k]) for k in (schema.ATTR_HEIGHT, schema.ATTR_WIDTH, schema.ATTR_CHANNELS))
        labels = f[schema.LABELS][:n]
    starts = np.concatenate([[0], ends[:-1]])
    return np.stack([decode(data[a:b], shape) for a, b in zip(starts, ends)]), labels


def _batches(spec, **kw):
    with h5stream.open(spec, **kw) as s:
        return [(np.array(x), np.array(y)) for x, y in s], s.stats()


def _same(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


def test_a_byte_range_is_one_piece_per_chunk_crossed_joined_where_the_file_goes_on():
    offsets = np.array([100, 5000, 2100, 3100], np.int64)
    assert byte_pieces(500, 2500, offsets, 1000) == [(600, 0, 500), (5000, 500, 1000), (2100, 1500, 500)]
    assert byte_pieces(2000, 3700, offsets, 1000) == [(2100, 0, 1700)]  # chunks 2 and 3 follow in the file
    assert byte_pieces(1200, 1300, offsets, 1000) == [(5200, 0, 100)]
    assert byte_pieces(7, 7, offsets, 1000) == []


@pytest.mark.parametrize("verify_reads", [True, "once"])
@pytest.mark.parametrize("workers", [0, 2])
def test_runs_that_cross_chunks_of_image_bytes_give_the_stored_rows(stores, workers, verify_reads):
    _, whole = stores
    with h5py.File(whole, "r") as f:
        assert f[schema.IMAGE_BYTES].chunks == (CHUNK_BYTES,) and f[schema.IMAGE_BYTES].shape[0] > 4 * CHUNK_BYTES
    rows, labels = stored_rows(whole)
    assert (np.diff(np.concatenate([[0], h5py.File(whole, "r")[schema.IMAGE_ENDS][:]])) > np.prod(SHAPE)).any()
    with h5stream.open(whole, batch_size=5, seed=7, workers=workers, rows_per_fill=12,
                       verify_reads=verify_reads) as s:
        order = s.epoch_order(0)
        got = [(np.array(x), np.array(y)) for x, y in s]
    np.testing.assert_array_equal(np.concatenate([x for x, _ in got]), rows[order])
    np.testing.assert_array_equal(np.concatenate([y for _, y in got]), labels[order])


@pytest.mark.parametrize("workers", [0, 2])
def test_an_encoded_part_set_streams_the_batches_of_one_encoded_store(stores, workers):
    parts, whole = stores
    kw = dict(batch_size=6, seed=3, workers=workers, verify_reads=True, rows_per_fill=16)
    got, _ = _batches(parts, **kw)
    want, _ = _batches(whole, **kw)
    _same(got, want)
    assert sum(len(x) for x, _ in got) == sum(SIZES)
    aug = h5stream.Augment(horizontal_flip=True)
    _same(_batches(parts, augment=aug, **kw)[0], _batches(whole, augment=aug, **kw)[0])


def test_an_encoded_part_set_resumes_and_shards_as_one_store(stores):
    parts, whole = stores
    kw = dict(batch_size=4, seed=1, rows_per_fill=16)
    with h5stream.open(parts, **kw) as s:
        it = iter(s)
        first = [np.array(next(it)[0]) for _ in range(3)]
        state = s.state()
    rest, _ = _batches(parts, resume=state, **kw)
    whole_batches, _ = _batches(whole, **kw)
    np.testing.assert_array_equal(np.concatenate(first + [x for x, _ in rest]),
                                  np.concatenate([x for x, _ in whole_batches]))
    for k in range(2):
        _same(_batches(parts, shard=(k, 2), **kw)[0], _batches(whole, shard=(k, 2), **kw)[0])


def test_encoded_parts_at_urls_stream_the_batches_of_one_encoded_store(stores, tmp_path):
    pytest.importorskip("obstore")
    from remote_servers import RangeServer

    from h5stream.remote.config import RemoteOptions

    parts, whole = stores
    root = tmp_path / "www"
    root.mkdir()
    for p in parts:
        shutil.copy(p, root)
    server = RangeServer(root)
    try:
        kw = dict(batch_size=6, seed=4, rows_per_fill=16, verify_reads=True)
        got, _ = _batches([server.url + os.path.basename(p) for p in parts], remote=RemoteOptions(timeout_s=10),
                          **kw)
    finally:
        server.stop()
    _same(got, _batches(whole, **kw)[0])


def test_parts_of_different_encodings_are_named(stores, tmp_path):
    from h5stream.errors import ConfigError
    from h5stream.store.writer import write_arrays

    parts, _ = stores
    raw = tmp_path / "raw.h5"
    write_arrays(raw, np.zeros((4, *SHAPE), np.uint8), np.zeros(4, np.int64), class_names=["a", "b", "c"])
    with pytest.raises(ConfigError, match=r"raw\.h5: this part's encoding \(raw\) differs from .*\(jpeg\)"):
        h5stream.open([parts[0], str(raw)], batch_size=2)


@pytest.fixture(scope="module")
def big_store(tmp_path_factory):
    """An encoded store whose blocks are read past the page cache: blocks of 40 rows of 64-px JPEGs, more than
    DIRECT_MIN_BYTES each; a file system that takes O_DIRECT, else the test is skipped."""
    from conftest import direct_io_folder

    with direct_io_folder(str(tmp_path_factory.mktemp("encdirect"))) as folder:
        path = os.path.join(folder, "big.h5")
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(encoded_store, "ENCODED_CHUNK_BYTES", 256 << 10)
            _write(path, _jpegs(120, 0, side=64), 0, side=64, block_rows=40)
        yield path


def test_direct_io_and_an_http_url_stream_the_batches_of_the_page_cache(big_store, tmp_path):
    from h5stream.read.source import DIRECT_MIN_BYTES

    meta = read_meta(big_store)
    sizes = np.diff(np.concatenate([[0], h5py.File(big_store, "r")[schema.IMAGE_ENDS][:]]))
    assert sizes.reshape(-1, 40).sum(axis=1).min() >= DIRECT_MIN_BYTES  # every block read goes past the cache
    kw = dict(batch_size=8, seed=5, verify_reads=True, rows_per_fill=32)
    cached, cached_stats = _batches(big_store, direct_io=False, **kw)
    direct, direct_stats = _batches(big_store, direct_io=True, workers=2, **kw)
    assert (cached_stats["direct_io"], direct_stats["direct_io"]) == (0, 1)
    _same(direct, cached)
    assert sum(len(x) for x, _ in cached) == meta.rows

    pytest.importorskip("obstore")
    from remote_servers import RangeServer

    from h5stream.remote.config import RemoteOptions

    root = tmp_path / "www"
    root.mkdir()
    shutil.copyfile(big_store, root / "big.h5")
    server = RangeServer(root)
    try:
        # Without the disk cache, whose own pieces would be the requests (see test_remote_cache.py).
        remote, _ = _batches(server.url + "big.h5", remote=RemoteOptions(timeout_s=10), cache_dir=None, **kw)
        ranges = list(server.ranges)
    finally:
        server.stop()
    _same(remote, cached)
    # The rows came as ranged reads of the blocks' bytes: a request starts at the first byte of every block.
    with h5py.File(big_store, "r") as f:
        ends, data = f[schema.IMAGE_ENDS][:], f[schema.IMAGE_BYTES]
        chunk = {}
        data.id.chunk_iter(lambda info: chunk.__setitem__(info.chunk_offset[0], info.byte_offset))
        chunk_bytes = data.chunks[0]
    starts = [0] + [int(ends[b * 40 - 1]) for b in range(1, 3)]
    at = [chunk[s - s % chunk_bytes] + s % chunk_bytes for s in starts]
    assert set(at) <= {a for a, _ in ranges}, (at, sorted(ranges))


# An `h5stream ingest --append` whose writer stops itself (SIGSTOP) the first time a flush leaves rows on disk past
# the committed count (inside a commit: bytes, ends and extents flushed, the count not raised yet).
PAUSED_INGEST = textwrap.dedent(
    """
    import os, signal, sys
    from h5stream.store.writer import StoreWriter

    flush = StoreWriter._flush

    def flush_and_stop(self):
        flush(self)
        on_disk, count = int(self.images.nrows), int(self.attrs[self._committed_attr])
        if self.published and count == self.committed_rows < on_disk and not getattr(self, "stopped", False):
            self.stopped = True
            print("stopped", count, on_disk, flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)

    StoreWriter._flush = flush_and_stop
    if __name__ == "__main__":
        from h5stream import cli
        sys.exit(cli.main(sys.argv[1:]))
    """
)

ARGS = ["--size", "16", "--encoding", "jpeg", "--block-rows", "4", "--commit-rows", "4", "--workers", "0",
        "--order", "sorted"]


def _stopped(proc) -> tuple[int, int]:
    """Wait for the ingest's stop line and for the stop itself; (committed rows, rows on disk)."""
    fd = proc.stdout.fileno()
    if not select.select([fd], [], [], SAFETY_S)[0]:
        proc.kill()
        pytest.fail(f"the ingest never stopped mid-commit: {proc.communicate()[1]}")
    line = proc.stdout.readline().split()
    assert line and line[0] == "stopped", (line, proc.communicate()[1])
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), status
    return int(line[1]), int(line[2])


@pytest.mark.parametrize("workers", [0, 2])
def test_an_encoded_store_streams_its_committed_rows_while_an_ingest_appends_to_it(tmp_path, class_src, h5cli,
                                                                                    workers):
    from h5stream.store.access import writer_pids

    root, written = class_src
    src = tmp_path / "src"
    shutil.copytree(root, src)
    shutil.move(src / "dog", tmp_path / "dog")
    out = tmp_path / "out.h5"
    code, _, err = h5cli("ingest", src, out, *ARGS)
    assert code == 0, err
    before = read_meta(out).rows
    shutil.move(tmp_path / "dog", src / "dog")
    script = tmp_path / "paused_ingest.py"
    script.write_text(PAUSED_INGEST)
    proc = subprocess.Popen([sys.executable, str(script), "ingest", str(src), str(out), *ARGS, "--append"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        committed, on_disk = _stopped(proc)
        assert before <= committed < on_disk  # rows past the count are in the file
        assert writer_pids(out) == [proc.pid]
        with h5stream.open(out, batch_size=5, seed=2, workers=workers, verify_reads=True, allow_unfinished=True) as s:
            assert s.rows == committed
            order = s.epoch_order(0)
            x = np.concatenate([np.array(b) for b, _ in s])
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        _, err = proc.communicate(timeout=SAFETY_S)
    assert proc.returncode == 0, err
    rows, _ = stored_rows(str(out))  # the finished store
    assert len(rows) == len(written)
    np.testing.assert_array_equal(x, rows[:committed][order])


def test_runs_not_in_the_page_cache_are_advised_ahead_as_a_raw_store_s_are(tmp_path):
    from h5stream.read.encbytes import ByteRows
    from h5stream.read.locate import locate
    from h5stream.read.runs import Run
    from h5stream.read.source import LocalFile

    path = str(tmp_path / "cold.h5")
    _write(path, _jpegs(120, 0, side=64), 0, side=64, block_rows=40)
    kw = dict(batch_size=8, seed=6, rows_per_fill=40)
    _, warm_stats = _batches(path, **kw)
    assert warm_stats["advised_bytes"] == 0  # all of it in the page cache: nothing to ask for
    extents = locate(read_meta(path), cache_labels=False).encoded
    runs = [Run(0, 3, 20, None), Run(20, 70, 30, None)]
    want = sum(int(extents.ends[r.src + r.rows - 1] - extents.ends[r.src - 1]) for r in runs)
    source = LocalFile(path)
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        if source.cached(0, os.path.getsize(path)):
            pytest.skip("this file system keeps the file in memory (tmpfs): nothing to advise")
        rows = ByteRows(extents, source)
        missing, advised = rows.advise(runs)
        assert (missing, advised) == (runs, want)
        for r in runs:  # once read, cached: nothing more to advise
            rows.read(r.src, r.src + r.rows)
        assert rows.advise(runs) == ([], 0)
    finally:
        source.close()
