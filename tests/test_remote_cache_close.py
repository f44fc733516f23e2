"""Closing a URL stream whose disk cache has a piece fetch hung on a stalled server (h5stream/remote/cache.py):
what the stream holds in the cache folder (the piece's lock, its half-written file, descriptors) is let go when
``close()`` returns, not when the request times out; another process on the node then fetches that piece at once,
and the stalled request, answered later, writes and publishes nothing.  A real HTTP server in its own process,
real subprocesses."""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import textwrap
import threading

import pytest

import h5stream
from h5stream.errors import ReaderError

pytestmark = pytest.mark.usefixtures("no_leaks")

PIECE = 1 << 20
STALLED = 5
"""The piece whose GET the server holds: the first fill of the stream needs it (and the small part of a set, 4 MB,
has none of its bytes)."""

SAFETY_S = 60.0
"""Safety net for what must come at once: far beyond the time it takes, far below the request's own timeout."""

# The client would give up on the stalled request only after this: far beyond the test, as a hung server's "never".
REMOTE = {"timeout_s": 600, "cache_piece": PIECE}

CHILD = textwrap.dedent("""
    import hashlib, sys
    from h5stream.remote.cache import CachedSource
    from h5stream.remote.config import RemoteOptions
    from h5stream.remote.source import RemoteSource
    url, cache, index, piece = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    out = bytearray(piece)
    with CachedSource(RemoteSource(url, RemoteOptions(timeout_s=10)), cache, piece_bytes=piece) as src:
        src.readinto(index * piece, [out])
        print(hashlib.sha256(out).hexdigest(), src.pieces_fetched, flush=True)
""")


def _child_fetch(url: str, cache_dir, index: int) -> tuple[str, int]:
    """Piece ``index`` read through the cache at ``cache_dir`` by another process: (its sha256, pieces it
    fetched)."""
    root = os.path.dirname(os.path.dirname(h5stream.__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, url, str(cache_dir), str(index), str(PIECE)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=SAFETY_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        pytest.fail(f"another process waited {SAFETY_S:.0f} s for the piece the closed stream was fetching")
    assert proc.returncode == 0, err
    digest, fetched = out.split()
    return digest, int(fetched)


def _fds_under(folder) -> list[str]:
    """What this process's descriptors open under ``folder``."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)):
            out.append(target)
    return out


def _lock_is_free(path) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _ours() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("h5stream") and t.is_alive()]


@pytest.mark.parametrize("how", ["close", "timeout", "parts"])
def test_a_stream_closed_with_a_piece_fetch_stalled_lets_the_piece_go_at_once(range_server, tmp_path, how):
    url = range_server.url + "store.h5"
    want = (range_server.root / "store.h5").read_bytes()[STALLED * PIECE:(STALLED + 1) * PIECE]
    cache = tmp_path / "cache"
    where = url
    if how == "parts":  # a set of two URL parts, the second too small to reach the stalled bytes
        from benchmarks.data import make_bench_file

        make_bench_file(str(range_server.root / "small.h5"), rows=300, size=32, n_classes=5, progress=False)
        where = [url, range_server.url + "small.h5"]
    range_server.stall_bytes(STALLED * PIECE + 10, STALLED * PIECE + 11)
    before = set(_ours())
    stream = h5stream.open(where, batch_size=100, seed=1, timeout_s=2 if how == "timeout" else 60, cache_dir=cache,
                           remote=REMOTE)
    try:
        it = iter(stream)
        assert range_server.stalled.wait(SAFETY_S)  # the piece's fetch is in flight, and will never be answered
        if how == "timeout":
            with pytest.raises(ReaderError):
                next(it)
    finally:
        stream.close()
    [folder] = [f for f in (cache / "objects").iterdir() if (f / f"{STALLED}.lock").exists()]
    # What the stream held of the piece is let go when close() returns: its lock, its half-written file, their
    # descriptors; no thread left that keeps the process alive.
    assert _lock_is_free(folder / f"{STALLED}.lock")
    assert not (folder / f"{STALLED}.tmp").exists() and not (folder / f"{STALLED}.piece").exists()
    assert [f for f in _fds_under(cache) if os.path.basename(f).startswith(f"{STALLED}.")] == []
    assert not [t for t in _ours() if t not in before and not t.daemon]
    # Another process on the node fetches the piece at once (it used to wait on the lock until the stalled
    # request timed out).
    range_server.stop_stalling()
    digest, fetched = _child_fetch(url, cache, STALLED)
    assert digest == hashlib.sha256(want).hexdigest() and fetched == 1
    piece = folder / f"{STALLED}.piece"
    published = (piece.stat().st_ino, piece.read_bytes())
    # The stalled request answered now: what the closed stream's fetch receives goes nowhere.
    range_server.release_stalled()
    for t in _ours():
        if t not in before:
            t.join(SAFETY_S)
    assert [t.name for t in _ours() if t not in before] == []
    span = (STALLED * PIECE, (STALLED + 1) * PIECE)
    assert range_server.ranges.count(span) == 2  # the child's GET, and the late answer to the stalled one
    assert (piece.stat().st_ino, piece.read_bytes()) == published
    assert sorted(p.name for p in folder.iterdir() if p.suffix == ".tmp") == []
    assert _fds_under(cache) == []  # every descriptor of the stream's, once its threads have ended
