"""No deadlock between h5py's lock and the garbage collector while HDF5 waits for a helper thread.

A read HDF5 makes through h5stream's file objects runs on a helper thread while the calling thread, inside
HDF5, holds h5py's lock.  If the helper started a cyclic collection that frees an h5py object, it would wait
for that lock forever.  The child processes below keep garbage holding h5py objects in cycles at all times
(each freed cycle makes the next) and collect at every second allocation: without the pause, the first read
through the helper hangs.  The child runs under a limit (a hang fails the test, it does not hang the suite).
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from h5stream.concurrency.gcpause import collection_paused
from h5stream.store.writer import write_arrays

pytestmark = pytest.mark.usefixtures("no_leaks")

HANG_LIMIT_S = 120

GARBAGE = """
import atexit, gc, h5py, sys
keep = h5py.File(sys.argv[2], "r")  # a file whose dataset ids the garbage holds (freeing one takes h5py's lock)
regenerate = [True]

class Cycle:
    def __init__(self):
        self.me, self.dataset = self, keep["images"].id
    def __del__(self):
        if regenerate[0]:
            Cycle()  # the next cycle, for the next collection

Cycle()
gc.collect()  # the first cycle's collection made the second: there is always one to free
gc.set_threshold(1)
atexit.register(lambda: (regenerate.clear(), regenerate.append(False), gc.set_threshold(700)))
"""


def run_child(body: str, *args: str) -> subprocess.CompletedProcess:
    script = GARBAGE + textwrap.dedent(body)
    try:
        return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                              timeout=HANG_LIMIT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child hung for {HANG_LIMIT_S} s: a collection on the helper thread waits for h5py's "
                    "lock held by the reader")


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "s.h5"
    images = np.random.default_rng(0).integers(0, 256, (64, 8, 8, 3), dtype=np.uint8)
    write_arrays(path, images, np.arange(64) % 4, block_rows=16, compression="zlib")
    return str(path)


def test_reading_a_store_through_the_stoppable_file_does_not_deadlock(store):
    done = run_child("""
        import threading
        import numpy as np
        from h5stream.store.access import open_h5_readonly
        with open_h5_readonly(sys.argv[1], stop=threading.Event()) as f:
            images = f["images"][:]
        print("read", images.shape, int(images.sum()))
    """, store, store)
    assert done.returncode == 0, done.stderr
    import h5py

    with h5py.File(store, "r") as f:
        expected = f["images"][:]
    assert done.stdout.split() == ["read", "(64,", "8,", "8,", "3)", str(int(expected.sum()))]


def test_opening_a_url_from_the_main_thread_does_not_deadlock(range_server, store):
    # The main thread's remote reads run on a thread of their own (so a Ctrl-C ends them at once).
    done = run_child("""
        from h5stream.store.access import open_h5_readonly
        with open_h5_readonly(sys.argv[1]) as f:
            print("rows", f["images"].shape[0], int(f["images"][:50].sum()))
    """, range_server.url + "store.h5", store)
    assert done.returncode == 0, done.stderr
    import h5py

    with h5py.File(range_server.root / "store.h5", "r") as f:
        assert done.stdout.split() == ["rows", str(f["images"].shape[0]), str(int(f["images"][:50].sum()))]


# -- the pause itself ---------------------------------------------------------------------


@pytest.fixture
def collection_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_overlapping_pauses_on_two_threads_share_one_and_restore_collection(collection_on):
    inside, release = threading.Event(), threading.Event()

    def other():
        with collection_paused():
            inside.set()
            release.wait()

    t = threading.Thread(target=other)
    with collection_paused():
        assert not gc.isenabled()
        t.start()
        inside.wait()
    assert not gc.isenabled()  # the other thread's pause still holds
    release.set()
    t.join()
    assert gc.isenabled()


def test_a_pause_leaves_collection_off_when_the_user_turned_it_off(collection_on):
    gc.disable()
    with collection_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_a_pause_begun_while_another_holds_runs_the_collection_that_is_due(collection_on):
    """Back-to-back pauses on many threads must not put collection off for good."""
    freed, inside, release = [], threading.Event(), threading.Event()

    class Cycle:
        def __init__(self):
            self.me = self

        def __del__(self):
            freed.append(1)

    def other():
        with collection_paused():
            inside.set()
            release.wait()

    t = threading.Thread(target=other)
    t.start()
    try:
        inside.wait()
        Cycle()
        kept = [[] for _ in range(gc.get_threshold()[0] + 10)]  # past the threshold, nobody collecting
        assert freed == []
        with collection_paused():
            assert freed == [1]
        del kept
    finally:
        release.set()
        t.join()
