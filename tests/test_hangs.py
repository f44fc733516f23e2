"""The stream never hangs: a store chunked by plain h5py streams (or is refused at open), ``timeout_s`` bounds the
wait for a batch, Ctrl-C ends a process within a second in every state, and no error leaves a thread that keeps
the process alive.

Stalls are real: an HTTP server on 127.0.0.1 that never answers a read of chosen bytes (a hung disk or network
file system never returns a read either), and an augment worker stopped with SIGSTOP.  Processes report where
they are through stdout lines; timeouts are safety nets, except where the bound is the point (Ctrl-C within a
second, an error within ``timeout_s``), and there the bound is several times what the code needs.
"""

from __future__ import annotations

import concurrent.futures.thread
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time

import h5py
import numpy as np
import psutil
import pytest

import h5stream
from h5stream.errors import ReaderError, StoreFormatError
from h5stream.memory.shm import segment_names
from h5stream.store.writer import write_arrays

pytestmark = pytest.mark.usefixtures("no_leaks")

SAFETY_S = 60.0
"""Safety net for a process that should end: far beyond the bounds asserted, far below 'never'."""

CTRL_C_S = 4.0
"""Ctrl-C must end the process within this long: about 0.2 s on a quiet machine and up to 1.6 s seen at load
average 12 (the interpreter's own exit), where closing used to wait 5 s for a stopped worker and, for a stalled
read, until the read returned (never, for a hung disk)."""

ROWS = 512


def pattern(row_ids) -> np.ndarray:
    """The pixel value every test store holds at each row: a function of the row id."""
    return (np.asarray(row_ids) % 251).astype(np.uint8)


def make_store(path, rows: int = ROWS, size: int = 16, block_rows: int = 64) -> str:
    ids = np.arange(rows)
    write_arrays(path, np.broadcast_to(pattern(ids)[:, None, None, None], (rows, size, size, 3)), ids % 3,
                 block_rows=block_rows)
    return str(path)


def copy_with_h5py(src: str, dst: str) -> tuple:
    """The store at ``src`` copied by plain h5py: every dataset with ``data=``, ``/images`` with ``chunks=True``
    (h5py's own guess), attributes copied.  Returns the chunk shape h5py chose for ``/images``."""
    with h5py.File(src, "r") as s, h5py.File(dst, "w") as d:
        for k, v in s.attrs.items():
            d.attrs[k] = v
        for name in s:
            d.create_dataset(name, data=s[name][:], chunks=True if name == "images" else None)
            for k, v in s[name].attrs.items():
                d[name].attrs[k] = v
        return d["images"].chunks


def check_epoch(stream) -> None:
    """Every batch of the current epoch holds the rows ``epoch_order`` names, each row exactly once."""
    order = stream.epoch_order()
    seen = 0
    for x, y in stream:
        ids = order[seen:seen + len(x)]
        assert (x == pattern(ids)[:, None, None, None]).all()
        assert np.array_equal(y, ids % 3)
        seen += len(x)
    assert seen == stream.rows and sorted(order) == list(range(stream.rows))


def reader_threads_that_can_block_exit() -> list[threading.Thread]:
    """Live threads of h5stream's readers that the interpreter waits for at exit: non-daemon ones, and those
    ``concurrent.futures`` joins at exit."""
    joined_at_exit = set(concurrent.futures.thread._threads_queues)
    return [t for t in threading.enumerate()
            if t.name.startswith("h5stream-reader") and t.is_alive() and (not t.daemon or t in joined_at_exit)]


# -- a store whose chunks h5stream did not lay out ----------------------------------------------------------------


def test_a_store_copied_by_plain_h5py_with_guessed_chunks_streams_every_row_once(tmp_path):
    # h5py's guess cuts each 64x64x3 image into pieces that span many rows: read through HDF5 without a cache
    # that holds them, every row cost thousands of one-byte reads and no batch came within timeout_s.
    src = make_store(tmp_path / "src.h5", rows=256, size=64)
    chunks = copy_with_h5py(src, str(tmp_path / "copy.h5"))
    assert chunks[1:] != (64, 64, 3)  # the chunks really do split images
    with h5stream.open(str(tmp_path / "copy.h5"), batch_size=16, timeout_s=5) as stream:
        assert stream.plan.chunk_cache_bytes > 0  # the band cache is part of the budget
        assert stream.plan.total_bytes <= stream.plan.budget_bytes
        check_epoch(stream)
        check_epoch(stream)
    with h5stream.open(src, batch_size=16) as stream:
        assert stream.plan.chunk_cache_bytes == 0  # h5stream's own chunks hold whole images


def test_a_store_whose_chunks_would_make_every_row_cost_a_huge_read_is_refused_at_open_in_one_line(tmp_path):
    src = make_store(tmp_path / "src.h5", rows=64, size=8)
    path = str(tmp_path / "big.h5")
    with h5py.File(src, "r") as s, h5py.File(path, "w") as d:
        for k, v in s.attrs.items():
            d.attrs[k] = v
        # 64 images of 1024x1024x3 in chunks of (64, 8, 8, 1): reading any image reads 192 MiB of chunks.
        # Every chunk allocated at creation but never written (a sparse file that stays small on disk), so all
        # 64 rows have storage; the layout alone decides.
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((64, 8, 8, 1))
        dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
        dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
        h5py.h5d.create(d.id, b"images", h5py.h5t.STD_U8LE, h5py.h5s.create_simple((64, 1024, 1024, 3)), dcpl=dcpl)
        d.create_dataset("labels", data=s["labels"][:])
    with pytest.raises(StoreFormatError) as info:
        h5stream.open(path, batch_size=8, timeout_s=5)
    message = str(info.value)
    assert "\n" not in message and "h5repack -l images:CHUNK=64x1024x1024x3" in message, message
    assert "h5stream ingest" in message


# -- a read that never returns ------------------------------------------------------------------------------------


BLOCK = 128 << 10
"""Stalled spans are whole blocks of this many bytes inside an image chunk: HDF5's metadata reads (through blocks
of the remote file's cache) never touch them, only pixel reads do."""


@pytest.fixture
def hung_server(range_server, tmp_path):
    """``(server, url, pixel_spans)``: a store of 512 rows of 64x64x3 in blocks of 64 rows served over HTTP;
    ``pixel_spans[b]`` is a byte range inside image block ``b`` (in file order), for
    :meth:`~remote_servers.RangeServer.stall_bytes`."""
    path = make_store(tmp_path / "s.h5", size=64)
    os.link(path, range_server.root / "s.h5")
    spans = []
    with h5py.File(path, "r") as f:
        images = f["images"]
        for b in range(images.id.get_num_chunks()):
            info = images.id.get_chunk_info(b)
            start = -(-info.byte_offset // BLOCK) * BLOCK
            stop = (info.byte_offset + info.size) // BLOCK * BLOCK
            assert stop > start
            spans.append((start, stop))
    return range_server, range_server.url + "s.h5", sorted(spans)


# The remote client's own timeout is far beyond the test's safety net, as a hung disk's is "never".
REMOTE = {"timeout_s": 600}


def test_a_stalled_read_raises_within_timeout_s_and_leaves_no_thread_that_blocks_exit(hung_server):
    server, url, spans = hung_server
    server.stall_bytes(*spans[-1])
    timeout_s = 3.0
    t0 = time.monotonic()
    with pytest.raises(ReaderError, match="no batch from the reader in 3.* s, and no read done in the last 3 s"):
        with h5stream.open(url, batch_size=8, timeout_s=timeout_s, remote=REMOTE) as stream:
            next(iter(stream))
    # The error reaches the caller when timeout_s is up, the stream closed on the way out included (closing
    # used to wait timeout_s more for a thread that could not stop).
    assert time.monotonic() - t0 < timeout_s + 1.5
    assert server.stalled.is_set()
    assert reader_threads_that_can_block_exit() == []
    with pytest.raises(h5stream.StreamClosedError):
        next(iter(stream))


def test_after_a_reader_error_every_later_get_raises_it_and_the_reader_stops(hung_server):
    server, url, spans = hung_server
    server.stall_bytes(*spans[-1])
    stream = h5stream.open(url, batch_size=8, timeout_s=1, remote=REMOTE)
    try:
        with pytest.raises(ReaderError) as first:
            next(iter(stream))
        with pytest.raises(ReaderError) as again:
            next(iter(stream))
        assert again.value is first.value
        assert reader_threads_that_can_block_exit() == []
    finally:
        stream.close()


CHILD = textwrap.dedent(
    """
    import sys
    import h5stream

    if __name__ == "__main__":
        where, how, timeout_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
        kwargs = dict(batch_size=8, timeout_s=timeout_s, remote={"timeout_s": 600})
        if how == "sequential":  # uncached: a piece of the disk cache would hold the stalled block too
            kwargs.update(shuffle=False, rows_per_fill=64, cache_dir=None)
        if how == "workers":
            kwargs.update(augment=h5stream.Augment(horizontal_flip=True), workers=2)
        stream = h5stream.open(where, **kwargs)
        print("opened", *stream.stats().get("worker_pids", []), flush=True)
        try:
            for n, _ in enumerate(stream, 1):
                print("batch", n, flush=True)
                if how == "workers" and n == 1:
                    sys.stdin.readline()  # the test stops a worker meanwhile
            print("epoch", flush=True)
        except h5stream.ReaderError as exc:
            print("error", exc, flush=True)
        # Falls off the end without closing: the interpreter must exit by itself.
    """
)


def start_child(tmp_path, where: str, how: str, timeout_s: float = 60.0) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    # The child imports the h5stream this test runs (its script's folder comes first on its path, not ours).
    root = os.path.dirname(os.path.dirname(h5stream.__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, str(script), where, how, str(timeout_s)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def readline(proc) -> str:
    if not select.select([proc.stdout], [], [], SAFETY_S)[0]:
        proc.kill()
        pytest.fail(f"no line from the child: {proc.communicate()[1]}")
    line = proc.stdout.readline()
    if not line:
        pytest.fail(f"the child ended early: {proc.communicate()[1]}")
    return line.strip()


def wait_exit(proc, safety_s: float = SAFETY_S) -> tuple[float, str]:
    """Seconds until ``proc`` exits and its stderr; fails if it is still alive after ``safety_s``."""
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=safety_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"the process did not exit within {safety_s:.0f} s")
    return time.monotonic() - t0, err


def leftovers(pid: int) -> list:
    return segment_names(f"h5s_{pid}_")


def test_a_process_whose_stream_raised_on_a_stalled_read_exits_by_itself(hung_server, tmp_path):
    server, url, spans = hung_server
    server.stall_bytes(*spans[-1])
    proc = start_child(tmp_path, url, "shuffled", timeout_s=2)
    assert readline(proc).startswith("opened")
    assert readline(proc).startswith("error")
    wait_exit(proc)  # used to stay until the stalled read returned: never, for a hung disk
    assert proc.returncode == 0 and leftovers(proc.pid) == []


@pytest.mark.parametrize("how", ["shuffled", "sequential"], ids=["first-batch", "mid-epoch"])
def test_ctrl_c_with_a_read_stalled_ends_the_process_at_once(hung_server, tmp_path, how):
    # Shuffled, the first fill needs every block, so the first batch waits on the stalled one; sequential, in
    # fills of 64 rows, batches come until the reader reaches the last block.
    server, url, spans = hung_server
    server.stall_bytes(*spans[-1])
    proc = start_child(tmp_path, url, how)
    assert readline(proc).startswith("opened")
    if how == "sequential":
        assert readline(proc) == "batch 1"
    assert server.stalled.wait(SAFETY_S)
    os.kill(proc.pid, signal.SIGINT)
    took, err = wait_exit(proc)
    assert err.rstrip().endswith("KeyboardInterrupt"), err
    assert took < CTRL_C_S, took
    assert leftovers(proc.pid) == []


# -- a stopped augment worker --------------------------------------------------------------------------------------


def test_a_stopped_worker_is_named_within_timeout_s_and_every_batch_before_is_right_and_in_order(tmp_path):
    path = make_store(tmp_path / "s.h5", size=8, block_rows=16)
    timeout_s = 3.0
    stream = h5stream.open(path, batch_size=8, timeout_s=timeout_s, workers=2, seed=1,
                           augment=h5stream.Augment(horizontal_flip=True))  # a flip of a uniform image is itself
    pid = stream.stats()["worker_pids"][1]
    try:
        os.kill(pid, signal.SIGSTOP)
        served = 0
        with pytest.raises(ReaderError) as info:
            for _ in range(4):  # the other worker may serve a while; the stopped one gets a batch soon enough
                order, seen = stream.epoch_order(), 0
                last = time.monotonic()
                for x, y in stream:
                    ids = order[seen:seen + len(x)]
                    assert (x == pattern(ids)[:, None, None, None]).all() and np.array_equal(y, ids % 3)
                    seen += len(x)
                    served += 1
                    last = time.monotonic()
        # Reading and transforming share timeout_s (each used to have its own, so an error took up to twice it).
        assert time.monotonic() - last < timeout_s + 1.5
        message = str(info.value)
        assert f"pid {pid}" in message and "stopped" in message and f"kill -CONT {pid}" in message, message
        with pytest.raises(ReaderError) as again:  # the order is lost: no batch out of step ever comes
            next(iter(stream))
        assert again.value is info.value
    finally:
        stream.close()  # kills the stopped worker: it would read no stop message
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_ctrl_c_with_a_stopped_worker_ends_the_process_at_once_leaving_nothing(tmp_path):
    path = make_store(tmp_path / "s.h5", size=8, block_rows=16)
    proc = start_child(tmp_path, path, "workers")
    opened = readline(proc).split()
    workers = [psutil.Process(int(p)) for p in opened[1:]]
    assert opened[0] == "opened" and len(workers) == 2
    assert readline(proc) == "batch 1"
    os.kill(workers[1].pid, signal.SIGSTOP)
    # kill() returns before a busy worker on a loaded machine has actually stopped: the case is a stopped one.
    deadline = time.monotonic() + SAFETY_S
    while workers[1].status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
        select.select([], [], [], 0.01)  # a condition polled, not a guessed delay
    proc.stdin.write("go\n")
    proc.stdin.flush()
    os.kill(proc.pid, signal.SIGINT)
    took, err = wait_exit(proc)
    assert err.rstrip().endswith("KeyboardInterrupt"), err
    assert took < CTRL_C_S, took  # closing used to wait 5 s for the stopped worker to read its stop message
    _, alive = psutil.wait_procs(workers, timeout=SAFETY_S)
    assert alive == [] and leftovers(proc.pid) == []
