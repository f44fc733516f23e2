"""Byte sources (h5stream.read.source): O_DIRECT reads, in place or through bounce buffers, give the bytes a
plain read gives, wherever they start; the page-cache probe judges a run by its own pages; the stream's direct_io
option."""

from __future__ import annotations

import os
import shutil
import threading

import h5py
import numpy as np
import pytest
import tables

from conftest import direct_io_folder

import h5stream
from h5stream.errors import ConfigError
from h5stream.measure import evict_from_page_cache
from h5stream.read import source
from h5stream.read.locate import locate
from h5stream.read.runs import plan_runs
from h5stream.store import layout
from h5stream.store.meta import read_meta
from h5stream.store.writer import write_arrays

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture(scope="module")
def direct_dir(tmp_path_factory):
    """A folder on a file system that takes O_DIRECT reads: pytest's, else /var/tmp; skip where none does."""
    with direct_io_folder(str(tmp_path_factory.mktemp("direct"))) as folder:
        yield folder


@pytest.fixture(scope="module")
def data_file(direct_dir):
    """3 MiB and 1234 bytes of random data: the end lies off the 4 KiB alignment."""
    path = os.path.join(direct_dir, "data.bin")
    data = np.random.default_rng(0).integers(0, 256, 3 * (1 << 20) + 1234, dtype=np.uint8).tobytes()
    with open(path, "wb") as fh:
        fh.write(data)
    return path, data


def _pieces(total: int, rng: np.random.Generator) -> list[int]:
    """``total`` bytes cut into buffers of random sizes, some empty."""
    cuts = np.sort(rng.integers(0, total + 1, int(rng.integers(0, 40))))
    return np.diff(np.concatenate([[0], cuts, [total]])).tolist()


def _read(src, offset: int, sizes: list[int]) -> bytes:
    bufs = [bytearray(n) for n in sizes]
    src.readinto(offset, [memoryview(b) for b in bufs])
    return b"".join(bufs)


def test_direct_reads_give_the_bytes_at_any_offset_in_any_pieces(data_file):
    path, data = data_file
    rng = np.random.default_rng(1)
    src = source.DirectFile(path)
    try:
        cases = [(0, len(data)), (2952, 786432), (2952 + 786432, 786432), (4096, 65536), (1, source.BOUNCE_BYTES + 5),
                 (len(data) - 70000, 70000), (len(data) - 10, 10), (100, 10)]  # whole file, HDF5-like runs, tail
        cases += [(int(o), int(rng.integers(1, len(data) - o + 1)))
                  for o in rng.integers(0, len(data), 40)]
        for offset, length in cases:
            assert _read(src, offset, _pieces(length, rng)) == data[offset:offset + length], (offset, length)
    finally:
        src.close()
        src.close()  # idempotent


def test_direct_reads_from_several_threads_at_once(data_file):
    """More threads than bounce buffers: every read gets its bytes, and no more bounce buffers exist than the
    budget counts."""
    path, data = data_file
    src = source.DirectFile(path)
    failures = []
    most = []

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(30):
            offset = int(rng.integers(0, len(data) - 300000))
            length = int(rng.integers(source.DIRECT_MIN_BYTES, 300000))
            if _read(src, offset, _pieces(length, rng)) != data[offset:offset + length]:
                failures.append((offset, length))
            most.append(len(src._bounces._all))

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(3 * source.BOUNCE_BUFFERS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        src.close()
    assert failures == []
    assert 1 <= max(most) <= source.BOUNCE_BUFFERS
    assert source.DIRECT_IO_BYTES == source.BOUNCE_BUFFERS * source.BOUNCE_BYTES


def test_direct_files_sharing_a_bounce_pool_hold_one_files_buffers_and_outlive_each_other(data_file, direct_dir):
    """The direct parts of a set share one pool: together they hold at most BOUNCE_BUFFERS buffers, closing one
    file leaves the pool to the others, and closing the pool (its owner's) ends every read through it."""
    path, data = data_file
    other = os.path.join(direct_dir, "other.bin")
    shutil.copy(path, other)
    pool = source.BouncePool()
    files = [source.DirectFile(path, pool), source.DirectFile(other, pool)]
    failures, most = [], []

    def work(seed):
        rng = np.random.default_rng(seed)
        src = files[seed % 2]
        for _ in range(20):
            offset = int(rng.integers(1, len(data) - 300000)) | 1  # odd: never in place, always bounced
            length = int(rng.integers(source.DIRECT_MIN_BYTES, 300000))
            if _read(src, offset, [length]) != data[offset:offset + length]:
                failures.append((offset, length))
            most.append(len(pool._all))

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4 * source.BOUNCE_BUFFERS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == [] and 1 <= max(most) <= source.BOUNCE_BUFFERS
        files[0].close()
        assert _read(files[1], 4097, [70000]) == data[4097:74097]  # the pool outlives a file closed
        pool.close()
        with pytest.raises(ValueError, match="read from a closed source"):
            _read(files[1], 4097, [70000])
    finally:
        for f in files:
            f.close()
        pool.close()


def test_a_read_waits_for_a_bounce_buffer_and_close_ends_the_wait(data_file):
    """With every bounce buffer in use, a read that needs one waits for one to come back; closing the source
    ends the wait with an error instead of a hang."""
    path, data = data_file
    src = source.DirectFile(path)
    held = [src._bounces.take(lambda: True, path) for _ in range(source.BOUNCE_BUFFERS)]
    results = []

    def read():
        try:
            results.append(_read(src, 1, [70000]) == data[1:70001])
        except ValueError as exc:
            results.append(str(exc))

    def give_back(bounce):
        src._bounces.give(bounce)

    try:
        first = threading.Thread(target=read)
        first.start()
        give_back(held.pop())
        first.join(timeout=30)
        assert not first.is_alive() and results == [True]
        assert len(src._bounces._all) == source.BOUNCE_BUFFERS
        held.append(src._bounces.take(lambda: True, path))  # every buffer held again: the second read cannot get one
        second = threading.Thread(target=read)
        second.start()
        src.close()
        second.join(timeout=30)
        assert not second.is_alive() and "closed" in results[1]
    finally:
        src.close()


def test_a_direct_read_past_the_end_of_the_file_fails(data_file):
    path, data = data_file
    src = source.DirectFile(path)
    try:
        with pytest.raises(OSError, match="unexpected end of file"):
            _read(src, len(data) - 100000, [200000])
    finally:
        src.close()
    with pytest.raises(ValueError, match="closed"):
        _read(src, 0, [source.DIRECT_MIN_BYTES])


def _write_store(path: str, rows: int, side: int, block_rows: int):
    ids = np.arange(rows)
    images = np.random.default_rng(2).integers(0, 256, (rows, side, side, 3), dtype=np.uint8)
    write_arrays(path, images, ids % 5, block_rows=block_rows)
    return read_meta(path), images, ids % 5


@pytest.fixture(scope="module")
def direct_store(direct_dir):
    """4000 rows of 30x30x3 (2700 bytes: no multiple of 512) in chunks of 256 rows (runs of ~690 KB)."""
    path = os.path.join(direct_dir, "store.h5")
    meta, images, labels = _write_store(path, 4000, 30, 256)
    return path, meta, images, labels


def _epochs(path: str, direct_io, epochs: int = 2, **options):
    # Under a given budget the bounce buffers of direct I/O (and the read check's block buffers, four with direct
    # I/O, two without) come out of the fills: a pinned fill size keeps the epoch order the same with and without.
    options.setdefault("memory_budget", "24MiB")
    options.setdefault("rows_per_fill", 768)
    with h5stream.open(path, batch_size=50, seed=4, direct_io=direct_io, **options) as s:
        out = [(x.copy(), y.copy()) for _ in range(epochs) for x, y in s]
        return out, s.direct_io, s.stats()


def test_forced_direct_io_streams_the_same_batches_as_the_page_cache(direct_store):
    path, meta, images, _labels = direct_store
    where = locate(meta, cache_labels=False)
    assert meta.row_bytes % source.IN_PLACE_ALIGN  # rows start off the device block: every read bounces
    runs = plan_runs(np.array([[0, meta.rows]]), where.image_chunks, meta.block_rows, meta.row_bytes)
    assert min(r.rows for r in runs) * meta.row_bytes >= source.DIRECT_MIN_BYTES  # the reads do go direct
    buffered, used_b, stats_b = _epochs(path, False)
    direct, used_d, stats_d = _epochs(path, True)
    assert (used_b, stats_b["direct_io"], used_d, stats_d["direct_io"]) == (False, 0, True, 1)
    assert stats_d["advised_bytes"] == 0  # nothing asked of the page cache
    assert stats_d["in_place_bytes"] == 0
    assert len(buffered) == len(direct) == 2 * -(-meta.rows // 50)
    for (xb, yb), (xd, yd) in zip(buffered, direct):
        assert np.array_equal(xb, xd) and np.array_equal(yb, yd)
    seen = np.concatenate([x for x, _ in direct[:len(direct) // 2]])
    assert sorted(map(bytes, seen)) == sorted(map(bytes, images))  # every row once per epoch


def test_direct_io_with_labels_read_by_offset_and_augmenting_workers(direct_store):
    path, meta, images, labels = direct_store
    from h5stream.streaming.planning import plan_stream
    from h5stream.read.reader import Reader
    from h5stream.streaming.config import layout_function

    plan = plan_stream(meta, 16 << 20, 50)
    layout = layout_function(meta.rows, plan, seed=5)

    def allocate(n, want_images=True):
        return np.empty((n, *meta.image_shape), np.uint8), np.empty((n, *meta.label_shape), meta.label_dtype), None

    reader = Reader(meta, layout, queue_depth=4, allocate=allocate, cache_labels=False, direct_io=True)
    try:
        for _ in range(layout(0).n_batches):
            batch = reader.get()
            assert np.array_equal(batch.images, images[batch.row_ids])
            assert np.array_equal(batch.labels, labels[batch.row_ids])
        assert reader.stats["direct_io"] == 1
    finally:
        reader.close()
    augment = h5stream.Augment(horizontal_flip=True, rotation_range=10)
    buffered, _, _ = _epochs(path, False, epochs=1, augment=augment, workers=1, memory_budget=None)
    direct, _, _ = _epochs(path, True, epochs=1, augment=augment, workers=1, memory_budget=None)
    for (xb, yb), (xd, yd) in zip(buffered, direct, strict=True):
        assert np.array_equal(xb, xd) and np.array_equal(yb, yd)


def test_direct_io_option_is_checked_and_auto_follows_the_memory_the_cache_could_use(direct_store, tmp_path):
    path = direct_store[0]
    for bad in ("yes", 1, None, "AUTO"):
        with pytest.raises(ConfigError, match="direct_io must be 'auto', True or False"):
            h5stream.open(path, direct_io=bad)
    assert source.use_direct_io("auto", 10 << 30, 8 << 30)
    assert not source.use_direct_io("auto", 6 << 30, 8 << 30)
    assert not source.use_direct_io("auto", 10 << 30, None)  # unknown memory: the page cache
    assert source.use_direct_io(True, 1, 8 << 30) and not source.use_direct_io(False, 10 << 30, 8 << 30)
    with h5stream.open(path, batch_size=50) as s:  # a small store: auto keeps the page cache
        assert s.direct_io is False


def test_direct_io_is_for_local_stores(direct_store, tmp_path):
    pytest.importorskip("obstore")
    from remote_servers import RangeServer

    (tmp_path / "www").mkdir()
    shutil.copyfile(direct_store[0], tmp_path / "www" / "s.h5")
    server = RangeServer(tmp_path / "www")
    try:
        with pytest.raises(ConfigError, match="direct_io=True is for a local store"):
            h5stream.open(server.url + "s.h5", direct_io=True)
        with h5stream.open(server.url + "s.h5", batch_size=50) as s:  # auto: never for a URL
            assert s.direct_io is False and len(next(iter(s))[0]) == 50
    finally:
        server.stop()


def test_the_plan_counts_the_bounce_buffers_on_top_of_the_default_budget(direct_store):
    from h5stream.streaming.planning import plan_stream

    meta = direct_store[1]
    plain, direct = plan_stream(meta, None, 50), plan_stream(meta, None, 50, direct_io=True)
    assert direct.allocations()["direct I/O"] == source.DIRECT_IO_BYTES and plain.allocations()["direct I/O"] == 0
    assert direct.budget_bytes == plain.budget_bytes + source.DIRECT_IO_BYTES
    assert direct.rows_per_fill == plain.rows_per_fill  # the default budget: the same epoch order
    given = plan_stream(meta, 64 << 20, 50, direct_io=True)
    assert given.total_bytes <= given.budget_bytes and given.direct_io_bytes == source.DIRECT_IO_BYTES


def test_a_run_is_cached_only_when_its_own_pages_are(direct_dir):
    """Runs back to back at HDF5's offsets share boundary pages: reading its neighbours on both sides must not
    make a run look cached (the probe decides which runs get read-ahead advice, and which workers may read)."""
    path = os.path.join(direct_dir, "runs.bin")
    run = 786432
    a, b, c = ((2952 + k * run, run) for k in range(3))
    with open(path, "wb") as fh:
        fh.write(os.urandom(2952 + 3 * run + 5000))
    if not evict_from_page_cache(path):
        pytest.skip("cannot evict a file from the page cache here")
    fd = os.open(path, os.O_RDONLY)
    src = source.LocalFile(path)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead: only the pages read get cached
        if src._residency.method is None:
            pytest.skip("neither cachestat nor mincore is available here")
        assert not any(src.cached(*r) for r in (a, b, c))
        for r in (a, c):  # the neighbours, each with the page it shares with b
            os.pread(fd, r[1], r[0])
        assert src.cached(*a) and src.cached(*c)
        assert src._byte_cached(b[0]) and src._byte_cached(b[0] + b[1] - 1)  # b's two ends are cached...
        assert not src.cached(*b)  # ...but b is not
        os.pread(fd, b[1], b[0])
        assert src.cached(*b)
    finally:
        src.close()
        os.close(fd)


def test_preadv_all_fills_more_buffers_than_one_call_takes(tmp_path):
    from h5stream.memory.rawio import IOV_MAX, preadv_all

    data = np.random.default_rng(3).integers(0, 256, 3 * IOV_MAX + 17, dtype=np.uint8).tobytes()
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    n = len(data) - 5
    out = bytearray(n)
    views = [memoryview(out)[i:i + 1] for i in range(n)]  # one byte each: far more than IOV_MAX views
    fd = os.open(path, os.O_RDONLY)
    try:
        preadv_all(fd, views, 5, str(path))
    finally:
        os.close(fd)
    assert bytes(out) == data[5:]


def _unpaged_store(path: str, rows: int, side: int, block_rows: int, monkeypatch):
    """A store laid out as HDF5 does by default (no page alignment), as stores made before it had: the empty
    file is created without the paged file-space strategy."""
    from h5stream.store import writer

    with monkeypatch.context() as m:
        m.setattr(writer.layout, "create_empty_file", lambda name: h5py.File(name, "w").close())
        return _write_store(path, rows, side, block_rows)


def test_a_new_stores_rows_are_read_in_place_and_an_old_layout_still_bounces(direct_dir, monkeypatch):
    """32x32x3 rows (3072 bytes: 6 device blocks).  Chunks of a new store start on 4 KiB pages, so direct reads
    land straight in the batches; a store laid out without pages is read through the bounce buffer, the same
    batches either way."""
    new, old = os.path.join(direct_dir, "paged.h5"), os.path.join(direct_dir, "unpaged.h5")
    meta, images, _ = _write_store(new, 3000, 32, 64)
    _unpaged_store(old, 3000, 32, 64, monkeypatch)
    new_chunks = locate(meta, cache_labels=False).image_chunks
    old_chunks = locate(read_meta(old), cache_labels=False).image_chunks
    assert (new_chunks % layout.PAGE_BYTES == 0).all() and (old_chunks % source.IN_PLACE_ALIGN != 0).any()
    options = dict(rows_per_fill=512, memory_budget="24MiB")
    buffered, _, _ = _epochs(new, False, **options)
    direct_new, _, stats_new = _epochs(new, True, **options)
    direct_old, _, stats_old = _epochs(old, True, **options)
    for (xb, yb), (xn, yn), (xo, yo) in zip(buffered, direct_new, direct_old, strict=True):
        assert np.array_equal(xb, xn) and np.array_equal(yb, yn) and np.array_equal(xb, xo) and np.array_equal(yb, yo)
    # Runs of at least DIRECT_MIN_BYTES (22 rows) go direct; in the new store those are read in place.
    assert stats_new["in_place_bytes"] > 0
    assert stats_old["in_place_bytes"] < stats_new["in_place_bytes"]
    with h5py.File(new, "r") as f, tables.open_file(new) as t:  # plain h5py and PyTables read the paged store
        assert np.array_equal(f["images"][:], images) and t.root.images.nrows == 3000


def test_a_direct_read_into_a_buffer_off_the_device_block_still_gives_the_bytes(data_file):
    path, data = data_file
    from h5stream.memory.rawio import aligned_empty

    src = source.DirectFile(path)
    try:
        n = 8 * 4096 * 4
        aligned = aligned_empty(n)
        src.readinto(4096, [memoryview(aligned)])
        assert aligned.tobytes() == data[4096:4096 + n] and src.in_place_bytes == n
        off = aligned_empty(n + 512)[16:16 + n]  # 16 bytes past a page: refused where the device wants 512
        src.readinto(8192, [memoryview(off)])
        assert off.tobytes() == data[8192:8192 + n]
        assert src.in_place_bytes in (n, 2 * n)  # in place only where the device takes the address
    finally:
        src.close()


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads the mapping's flags from /proc (Linux)")
def test_batch_memory_is_private_to_the_process_and_page_aligned():
    """The arrays batches are read into (aligned_empty) are private anonymous memory: a page boundary for direct
    reads, and no shared-memory file behind it, whose first touch costs a fault through tmpfs per page."""
    from h5stream.memory.rawio import aligned_empty

    a = aligned_empty((3, 1000, 7))
    a[:] = 1
    address = a.ctypes.data
    assert address % 4096 == 0 and a.base is not None
    with open("/proc/self/maps") as fh:
        spans = [(ln, *(int(x, 16) for x in ln.split()[0].split("-"))) for ln in fh]
    (line,) = [ln for ln, lo, hi in spans if lo <= address < hi]
    perms = line.split()[1]
    assert perms[3] == "p", line  # private ("s": shared memory, what Python's mmap gives by default)
