"""How many reads a URL stream keeps going through the disk cache (h5stream/remote/cache.py ``max_in_flight``,
h5stream/read/fill.py ``IOThreads.grow``): while it caches, the reader copies pieces out of the page cache with as
few threads as a local file's (the prefetch threads keep the server's GETs going); once caching gives up (a full
disk), the reader goes back to the server's ``max_in_flight`` reads, and the batches stay those of the local file."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
import threading

import pytest

import h5stream
from h5stream.remote.cache import CACHED_READS_IN_FLIGHT

pytestmark = pytest.mark.usefixtures("no_leaks")

IN_FLIGHT = 6
OPTS = dict(batch_size=100, seed=3, memory_budget="256MiB")


def _io_threads() -> int:
    return sum(1 for t in threading.enumerate() if "-io_" in t.name)


def _epochs_digest(path, epochs=2, **kw) -> str:
    h = hashlib.sha256()
    with h5stream.open(path, **OPTS, **kw) as stream:
        for _ in range(epochs):
            for x, y in stream:
                h.update(x.tobytes())
                h.update(y.tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("cache", [True, False])
def test_the_reader_keeps_a_local_file_s_reads_going_while_it_caches_the_server_s_when_not(range_server, tmp_path,
                                                                                           cache):
    url = range_server.url + "store.h5"
    remote = {"timeout_s": 10, "cache_piece": 1 << 20, "max_in_flight": IN_FLIGHT}
    before = _io_threads()
    seen = []
    with h5stream.open(url, **OPTS, cache_dir=tmp_path / "cache" if cache else None, remote=remote) as stream:
        for _ in range(2):
            for _x, _y in stream:
                seen.append(_io_threads() - before)
    assert max(seen) == (CACHED_READS_IN_FLIGHT if cache else IN_FLIGHT)
    assert bool(list(tmp_path.glob("cache/objects/*/*.piece"))) == cache


CHILD = textwrap.dedent("""
    import hashlib, resource, sys, threading, warnings
    resource.setrlimit(resource.RLIMIT_FSIZE, (500_000, 500_000))  # the first piece cannot be written: a full disk
    import h5stream
    url, cache, in_flight = sys.argv[1], sys.argv[2], int(sys.argv[3])
    h = hashlib.sha256()
    threads = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with h5stream.open(url, batch_size=100, seed=3, memory_budget="256MiB", cache_dir=cache,
                           remote={"timeout_s": 10, "cache_piece": 1 << 20, "max_in_flight": in_flight}) as stream:
            for _ in range(2):
                for x, y in stream:
                    h.update(x.tobytes())
                    h.update(y.tobytes())
                    threads.append(sum(1 for t in threading.enumerate() if "-io_" in t.name))
    gave_up = sum("cannot write to the cache" in str(w.message) for w in caught)
    print(h.hexdigest(), threads[0], max(threads), gave_up)
""")


def test_a_stream_whose_cache_gives_up_goes_back_to_the_server_s_reads_in_flight_same_batches(range_server, tmp_path):
    url = range_server.url + "store.h5"
    want = _epochs_digest(str(range_server.root / "store.h5"))
    proc = subprocess.run([sys.executable, "-c", CHILD, url, str(tmp_path / "cache"), str(IN_FLIGHT)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    digest, first, most, gave_up = proc.stdout.split()
    assert digest == want
    assert int(gave_up) == 1
    assert int(first) <= IN_FLIGHT and int(most) == IN_FLIGHT  # threads started as the source asked for more
