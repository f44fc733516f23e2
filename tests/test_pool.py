"""WorkerPool with real spawned processes: results, order, errors, rows read where they lie or from a file,
back-pressure.

Spawning costs about a second per worker on a loaded machine, so two
module-scoped pools serve most tests; the transform's behaviour is picked by
the task's ``seed`` (see :class:`Scripted`).
"""

from __future__ import annotations

import os
import threading

import numpy as np
import psutil
import pytest

from h5stream.augment.pool import FileSource, Result, WorkerPool
from h5stream.memory.shm import SharedArray, new_prefix, segment_names
from h5stream.errors import ConfigError, WorkerError

MY_SEGMENTS = f"h5s_{os.getpid()}_"  # other sessions on this machine create h5s_* too
ROW_SHAPE = (6, 5, 3)
SOURCE_ROWS = 40
BATCH_ROWS = 8
N_SLOTS = 4

PLAIN, RAISE, GATE = 0, 1, 2  # seed values that select Scripted's behaviour


pytestmark = pytest.mark.usefixtures("no_leaks")


def add_row_ids(images, row_ids, epoch):
    """The reference transform: each row plus (row_id + epoch) mod 256, wrapping like uint8."""
    return (images.astype(np.int64) + ((row_ids + epoch) % 256)[:, None, None, None]).astype(np.uint8)


def _explode_in_worker(row_ids):
    return int(row_ids[0]) // 0


class Scripted:
    """Picklable transform; ``seed`` picks what it does so one pool serves many tests.

    PLAIN: :func:`add_row_ids`.  RAISE: ZeroDivisionError from a named helper.
    GATE: the batch whose first row id is 0 blocks on a FIFO until the batch
    with first row id 100 has finished and logged; both log their row id, so
    the log proves the completion order.
    """

    def __init__(self, gate_dir=None):
        self.gate_dir = gate_dir

    def __call__(self, images, *, seed, epoch, row_ids, out=None):
        if seed == RAISE:
            _explode_in_worker(row_ids)
        if seed == GATE:
            fifo, log = os.path.join(self.gate_dir, "fifo"), os.path.join(self.gate_dir, "log")
            if row_ids[0] == 0:
                with open(fifo, "rb") as f:  # blocks until the other batch opens it for writing
                    f.read(1)
                with open(log, "a") as f:
                    f.write("0\n")
            elif row_ids[0] == 100:
                with open(log, "a") as f:
                    f.write("100\n")
                with open(fifo, "wb") as f:
                    f.write(b"x")
        out[...] = add_row_ids(images, row_ids, epoch)


def take(pool, timeout_s=60):
    """``(seq, rows)`` of the next batch, copied out of its slot, the slot released: what the feed does when it
    does not lend the slot."""
    batch = pool.get(timeout_s)
    try:
        return batch.seq, pool.slot_view(batch.slot)[:batch.rows].copy()
    finally:
        pool.release(batch.slot)


def submit(pool, source, start, n, row_ids, **kw):
    """Submit the run of ``n`` rows from ``start`` of a shared source, transformed where they lie."""
    kw = {"epoch": 0, "seed": PLAIN, "timeout_s": 60, **kw}
    return pool.submit(source, np.arange(start, start + n), row_ids, in_place=True, **kw)


def _check_pool_cleanup(pool, names):
    pids = pool.pids
    pool.close()
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not set(names) & set(segment_names(MY_SEGMENTS))


@pytest.fixture(scope="module")
def sources():
    """Two shared source buffers of random pixels, owned by the test (as the stream owns its buffers)."""
    rng = np.random.default_rng(7)
    prefix = new_prefix()
    arrays = [SharedArray.create((SOURCE_ROWS,) + ROW_SHAPE, np.uint8, prefix) for _ in range(2)]
    for a in arrays:
        a.array[:] = rng.integers(0, 256, a.array.shape, dtype=np.uint8)
    yield arrays
    for a in arrays:
        a.close()


@pytest.fixture(scope="module")
def gate_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("gate")
    os.mkfifo(d / "fifo")
    return str(d)


@pytest.fixture(scope="module", params=[1, 2], ids=["workers1", "workers2"])
def pool(request, sources, gate_dir):
    before = set(segment_names(MY_SEGMENTS))
    p = WorkerPool(
        Scripted(gate_dir), [s.spec for s in sources], workers=request.param, batch_rows=BATCH_ROWS, n_slots=N_SLOTS
    )
    names = set(segment_names(MY_SEGMENTS)) - before
    assert len(names) == 1  # the slot ring
    yield p
    _check_pool_cleanup(p, names)


@pytest.fixture
def pool2(pool):
    if pool.workers != 2:
        pytest.skip("needs two workers")
    return pool


def test_round_trip_equals_inline(pool, sources):
    rng = np.random.default_rng(pool.workers)
    expected, taken = [], []
    for epoch in range(3):
        for n in (BATCH_ROWS, 3, 1, BATCH_ROWS):
            src = int(rng.integers(2))
            start = int(rng.integers(0, SOURCE_ROWS - n + 1))
            row_ids = rng.integers(0, 10**6, n)
            expected.append(add_row_ids(sources[src].array[start:start + n], row_ids, epoch))
            submit(pool, src, start, n, row_ids, epoch=epoch)
            if len(expected) - len(taken) == N_SLOTS:  # the ring is full: consume one
                taken.append(take(pool))
    while len(taken) < len(expected):
        taken.append(take(pool))
    assert [seq for seq, _ in taken] == list(range(taken[0][0], taken[0][0] + len(expected)))
    for i, (_, got) in enumerate(taken):
        assert got.dtype == np.uint8 and np.array_equal(got, expected[i]), f"batch {i}"


def test_delivery_in_submission_order_when_completion_is_not(pool2, sources, gate_dir):
    log = os.path.join(gate_dir, "log")
    if os.path.exists(log):
        os.unlink(log)
    ids = [np.arange(k, k + 4) for k in (0, 100, 200, 300)]
    seqs = [submit(pool2, 0, 0, 4, i, seed=GATE) for i in ids]
    got = [pool2.get(60) for _ in seqs]
    assert [b.seq for b in got] == seqs
    for batch, i in zip(got, ids):
        assert batch.rows == 4
        assert np.array_equal(pool2.slot_view(batch.slot)[:4], add_row_ids(sources[0].array[:4], i, 0))
        pool2.release(batch.slot)
    with open(log) as f:
        assert f.read().split() == ["100", "0"], "precondition: the second batch finished first"


def test_transform_exception_reraised_with_worker_traceback(pool):
    ok_before = submit(pool, 0, 1, 2, [5, 6])
    bad = submit(pool, 0, 3, 1, [7], seed=RAISE)
    ok_after = submit(pool, 1, 4, 1, [8])
    assert take(pool)[0] == ok_before  # batches before the failing one still arrive
    with pytest.raises(WorkerError, match=rf"batch {bad}: ZeroDivisionError") as info:
        pool.get(60)
    tb = info.value.worker_traceback
    assert "_explode_in_worker" in tb and "Traceback" in tb
    assert "_explode_in_worker" in str(info.value.__cause__)
    assert take(pool)[0] == ok_after  # the pool stays usable


def test_submit_waits_for_a_free_slot(pool):
    for i in range(N_SLOTS):
        submit(pool, 0, i, 1, [i])
    held = [pool.get(60) for _ in range(N_SLOTS)]
    with pytest.raises(TimeoutError, match="release"):
        submit(pool, 0, 0, 1, [0], timeout_s=0.05)
    pool.release(held[0].slot)
    seq = submit(pool, 0, 0, 1, [0])
    for b in held[1:]:
        pool.release(b.slot)
    assert take(pool)[0] == seq
    with pytest.raises(ConfigError, match="not held"):
        pool.release(held[0].slot)


def test_get_times_out_when_nothing_was_submitted(pool):
    with pytest.raises(TimeoutError, match="not ready"):
        pool.get(0.01)


def test_discard_pending_drops_undelivered_batches(pool, sources):
    for i in range(3):
        submit(pool, 0, i, 1, [i])
    submit(pool, 0, 3, 1, [3], seed=RAISE)  # dropped errors are not raised
    assert pool.discard_pending(60) == 4
    assert pool.in_flight == 0
    seq = submit(pool, 0, 9, 1, [1], epoch=2)
    got_seq, got = take(pool)
    assert got_seq == seq and np.array_equal(got, add_row_ids(sources[0].array[[9]], np.array([1]), 2))


@pytest.mark.parametrize(
    "args, match",
    [
        ((0, [], []), "1..8 entries"),
        ((0, np.arange(9), np.arange(9)), "1..8 entries"),
        ((0, [0, 1], [0]), "differs"),
        ((0, [SOURCE_ROWS - 1, SOURCE_ROWS], [0, 1]), "positions must lie"),
        ((0, [-1], [0]), "positions must lie"),
        ((0, [1, 3], [1, 3]), "contiguous"),
        ((0, [2, 1], [2, 1]), "contiguous"),
        ((2, [0], [0]), "source_index"),
        ((0, [0.5], [0]), "integers"),
    ],
)
def test_submit_validates_at_the_boundary(pool, args, match):
    with pytest.raises(ConfigError, match=match):
        pool.submit(*args, epoch=0, seed=PLAIN, timeout_s=1, in_place=True)
    assert pool.in_flight == 0


def test_rows_of_shared_memory_are_never_copied_out_only_transformed_where_they_lie(pool):
    # The caller's promise (in_place=True) that the rows stay put until the result is taken is required: there
    # is no path that copies them out first.
    with pytest.raises(ConfigError, match="transformed where they lie"):
        pool.submit(0, [3, 4], [3, 4], epoch=0, seed=PLAIN, timeout_s=1)
    assert pool.in_flight == 0


def test_float_output_slots(sources):
    with WorkerPool(Scripted(), [sources[0].spec], workers=1, batch_rows=2, n_slots=1, out_dtype=np.float32) as p:
        submit(p, 0, 0, 2, [3, 4], epoch=1)
        batch = p.get(60)
        assert isinstance(batch, Result) and batch.rows == 2
        view = p.slot_view(batch.slot)
        assert view.dtype == np.float32 and view.shape == (2,) + ROW_SHAPE
        assert np.array_equal(view, add_row_ids(sources[0].array[:2], np.array([3, 4]), 1).astype(np.float32))
        p.release(batch.slot)


class _FailsToUnpickle:
    def __call__(self, images, **kw):
        return images

    def __reduce__(self):
        return (_raise_on_load, ())


def _raise_on_load():
    raise RuntimeError("cannot rebuild the transform in the worker")


def test_worker_start_failure_reported_with_traceback(sources):
    with pytest.raises(WorkerError, match="failed to start: RuntimeError: cannot rebuild") as info:
        WorkerPool(_FailsToUnpickle(), [sources[0].spec], workers=1, batch_rows=2, n_slots=1)
    assert "_raise_on_load" in info.value.worker_traceback


def test_constructor_validates(sources):
    spec = sources[0].spec
    with pytest.raises(ConfigError, match="picklable"):
        WorkerPool(lambda images, **kw: images, [spec], workers=1, batch_rows=2, n_slots=1)
    with pytest.raises(ConfigError, match="workers must be"):
        WorkerPool(Scripted(), [spec], workers=0, batch_rows=2, n_slots=1)
    with pytest.raises(ConfigError, match="sources"):
        WorkerPool(Scripted(), [], workers=1, batch_rows=2, n_slots=1)


def test_rows_are_transformed_where_they_lie(pool, sources):
    src = sources[1].array
    saved = src[3:6].copy()
    try:
        src[3:6] = 17  # written by the caller just before submitting: the worker sees these very rows
        seq = submit(pool, 1, 3, 3, [9, 8, 7], epoch=2)
        got_seq, got = take(pool)
        assert got_seq == seq and np.array_equal(got, add_row_ids(src[3:6], np.array([9, 8, 7]), 2))
    finally:
        src[3:6] = saved


HEADER = 100  # bytes before the first row in the file source


@pytest.fixture(scope="module")
def row_file(tmp_path_factory, sources):
    """Source 0's rows written to a plain file after a header: a FileSource addresses them by byte offset."""
    path = tmp_path_factory.mktemp("rows") / "rows.bin"
    path.write_bytes(b"h" * HEADER + sources[0].array.tobytes())
    return str(path)


def _offsets(rows):
    return HEADER + np.asarray(rows, np.int64) * int(np.prod(ROW_SHAPE))


def test_file_source_workers_read_rows_at_byte_offsets(sources, row_file):
    spec = FileSource(row_file, (SOURCE_ROWS,) + ROW_SHAPE, "uint8")
    with WorkerPool(Scripted(), [spec, sources[1].spec], workers=1, batch_rows=BATCH_ROWS, n_slots=N_SLOTS) as p:
        # Shuffled rows, a run of adjacent ones (read in one call), a repeated row, a single row.
        for rows in ([7, 3, 4, 5, 0, 39, 39, 12], [20, 21, 22, 23], [1]):
            ids = np.arange(len(rows)) + 50
            p.submit(0, _offsets(rows), ids, epoch=1, seed=PLAIN, timeout_s=60)
            _, got = take(p)
            assert np.array_equal(got, add_row_ids(sources[0].array[rows], ids, 1))
        submit(p, 1, 2, 2, [0, 1])  # shared sources still work beside it
        assert np.array_equal(take(p)[1], add_row_ids(sources[1].array[2:4], np.arange(2), 0))
        with pytest.raises(ConfigError, match="byte offsets must be >= 0"):
            p.submit(0, [-1], [0], epoch=0, seed=PLAIN, timeout_s=1)
        with pytest.raises(ConfigError, match="in_place"):
            p.submit(0, _offsets([1, 2]), [0, 1], epoch=0, seed=PLAIN, timeout_s=1, in_place=True)
        # Past the end of the file: the read fails in the worker, the consumer gets it with its stage; the pool goes on.
        p.submit(0, _offsets([0, SOURCE_ROWS]), [0, 1], epoch=0, seed=PLAIN, timeout_s=60)
        with pytest.raises(WorkerError, match="could not read the rows of batch .*unexpected end of file") as info:
            p.get(60)
        assert info.value.stage == "read" and "in read" in info.value.worker_traceback
        p.submit(0, _offsets([3]), [3], epoch=0, seed=PLAIN, timeout_s=60)
        assert np.array_equal(take(p)[1], add_row_ids(sources[0].array[[3]], np.array([3]), 0))


def test_the_pool_runs_no_thread_of_its_own(sources):
    """The thread that waits for a result reads the workers' answers itself: no collector thread to wake per
    batch, none even while a batch is in flight."""
    before = {t.ident for t in threading.enumerate()}
    with WorkerPool(Scripted(), [sources[0].spec], workers=1, batch_rows=BATCH_ROWS, n_slots=N_SLOTS) as pool:
        submit(pool, 0, 2, 4, np.arange(4))
        started = {t.name for t in threading.enumerate() if t.ident not in before}
        seq, rows = take(pool)
    assert started == set()
    assert seq == 0 and np.array_equal(rows, add_row_ids(sources[0].array[2:6], np.arange(4), 0))


@pytest.mark.parametrize("seed", [0, 1, -1, 2**63, -(2**80) + 3, 2**200])
def test_a_task_packed_as_bytes_reads_back_the_same_whatever_the_seed(seed):
    from h5stream.augment.worker import pack_task, unpack_task

    row_ids = np.array([5, 3, 2**40], np.int64)
    offsets = np.array([0, 4096, 2**33], np.int64)
    digests, checked = np.array([1, 2**64 - 1, 7], np.uint64), np.array([True, False, True])
    slot, src, first, ids, epoch, got_seed, checks = unpack_task(memoryview(pack_task(3, 0, 17, row_ids.tobytes(),
                                                                                      9, seed)))
    assert (slot, src, first, epoch, got_seed, checks) == (3, 0, 17, 9, seed, None)
    assert np.array_equal(ids, row_ids)
    body = pack_task(2, 1, -1, row_ids.tobytes(), 2**40, seed, offsets.tobytes(), (digests.tobytes(),
                                                                                  checked.tobytes()))
    slot, src, where, ids, epoch, got_seed, checks = unpack_task(memoryview(body))
    assert (slot, src, epoch, got_seed) == (2, 1, 2**40, seed)
    assert np.array_equal(ids, row_ids) and np.array_equal(where, offsets)
    assert np.array_equal(checks[0], digests) and np.array_equal(checks[1], checked)
    unchecked = unpack_task(memoryview(pack_task(2, 1, -1, row_ids.tobytes(), 0, seed, offsets.tobytes())))
    assert np.array_equal(unchecked[2], offsets) and unchecked[6] is None
