"""The local disk cache of URL stores (h5stream/remote/cache.py), against the real S3 and HTTP servers of the
fixtures: later reads fetch nothing, the same batches as the local file, a changed object fetched anew, one fetch
per piece across processes, kill -9 mid-fill, a file size limit (a full disk), eviction past the limit."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import h5stream
from h5stream.errors import ConfigError
from h5stream.remote.cache import (
    TRAILER_BYTES,
    CachedSource,
    default_cache_dir,

    index_memory_bytes,
    object_key,
    piece_spans,
    slice_views,
    trailer_ok,
)
from h5stream.remote.cache_evict import evict
from h5stream.remote.config import RemoteOptions, client_memory_bytes, stream_remote
from h5stream.remote.source import RemoteSource

pytestmark = pytest.mark.usefixtures("no_leaks")

PIECE = 1 << 20


def _read_all(source, chunk: int = 300_000, seed: int = 0) -> bytes:
    """Every byte of ``source``, read in chunks of ``chunk`` bytes in a shuffled order."""
    out = bytearray(source.size)
    starts = list(range(0, source.size, chunk))
    random.Random(seed).shuffle(starts)
    for s in starts:
        view = memoryview(out)[s:s + chunk]
        source.readinto(s, [view])
    return bytes(out)


def _pieces(cache_dir) -> list[str]:
    return sorted(str(p) for p in (cache_dir / "objects").glob("*/*.piece"))


def _local_bytes(path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


# --- pure parts ---------------------------------------------------------------------------------------------------

def test_piece_spans_and_views_cut_where_pieces_end():
    assert piece_spans(0, 0, 10) == []
    assert piece_spans(5, 20, 10) == [(0, 5, 5), (1, 0, 10), (2, 0, 5)]
    views = [memoryview(bytearray(b"abc")), memoryview(bytearray(b"defg"))]
    assert b"".join(bytes(v) for v in slice_views(views, 2, 3)) == b"cde"
    assert b"".join(bytes(v) for v in slice_views(views, 3, 4)) == b"defg"


def test_object_key_changes_with_the_object_and_needs_an_identity():
    a = object_key("s3://b/k", '"e1"', 10, None, PIECE)
    assert a != object_key("s3://b/k", '"e2"', 10, None, PIECE) != object_key("s3://b/k", '"e1"', 11, None, PIECE)
    assert a != object_key("s3://b/k", '"e1"', 10, None, 2 * PIECE)  # piece N is other bytes
    assert object_key("s3://b/k", None, 10, None, PIECE) is None


def test_trailer_rejects_a_short_or_altered_piece():
    import xxhash

    from h5stream.remote.cache import MAGIC, TRAILER

    body = bytearray(b"x" * 100)
    whole = bytes(body) + TRAILER.pack(MAGIC, xxhash.xxh3_64_intdigest(body), 100)
    assert trailer_ok(memoryview(whole), 100)
    assert not trailer_ok(memoryview(whole[:-1]), 100)
    assert not trailer_ok(memoryview(b"y" + whole[1:]), 100)
    assert not trailer_ok(memoryview(bytes(100 + TRAILER_BYTES)), 100)  # zeros: a fill that never finished


def test_a_piece_with_the_earlier_crc_trailer_is_not_taken_as_whole():
    import struct
    import zlib

    body = b"x" * 100
    earlier = body + struct.pack("<8sIQ", b"h5spiece", zlib.crc32(body), 100)  # magic, CRC-32, count
    assert not trailer_ok(memoryview(earlier.ljust(100 + TRAILER_BYTES, b"\0")), 100)
    assert not trailer_ok(memoryview(earlier), 100)


def test_default_cache_dir_follows_xdg():
    assert default_cache_dir({"XDG_CACHE_HOME": "/x/cache"}) == "/x/cache/h5stream"
    assert default_cache_dir({"XDG_CACHE_HOME": "relative"}) == os.path.expanduser("~/.cache/h5stream")


def test_options_default_on_and_off_and_checked(tmp_path):
    url = "s3://b/k.h5"
    assert stream_remote(url, None, 60).cache_dir == default_cache_dir()
    assert stream_remote(url, None, 60, None).cache_dir is None
    assert stream_remote(url, None, 60, False).cache_dir is None
    assert stream_remote(url, None, 60, tmp_path, 10**9).cache_limit == 10**9
    with pytest.raises(ConfigError, match="cache_limit"):
        RemoteOptions(cache_dir="/c", cache_limit=1000)
    with pytest.raises(ConfigError, match="cache_dir"):
        h5stream.open(url, cache_dir=5)
    with pytest.raises(ConfigError, match="cache_limit"):
        h5stream.open(url, cache_limit="lots")
    # The remote dict takes sizes as open() does; an empty cache_dir (an unset variable, say) is no silent "off".
    from h5stream.streaming.options import StreamOptions

    remote = StreamOptions(remote={"cache_limit": "2GB", "cache_piece": "4MiB"}).remote
    assert (remote.cache_limit, remote.cache_piece) == (2 * 10**9, 4 << 20)
    with pytest.raises(ConfigError, match="remote cache_limit"):
        h5stream.open(url, remote={"cache_limit": "lots"})
    with pytest.raises(ConfigError, match="cache_dir is an empty string"):
        h5stream.open(url, cache_dir="")


def test_the_index_is_counted_in_the_budget():
    on = RemoteOptions(cache_dir="/c")
    assert client_memory_bytes(on, 10**12) - client_memory_bytes(RemoteOptions()) == index_memory_bytes(10**12)
    assert index_memory_bytes(10**12) < 32 << 20  # a terabyte's index: 119,210 pieces


# --- against the servers ----------------------------------------------------------------------------------------

def _cached(url, options, cache_dir, **kw) -> CachedSource:
    return CachedSource(RemoteSource(url, options), str(cache_dir), piece_bytes=PIECE, **kw)


def test_later_reads_fetch_nothing_and_give_the_same_bytes(served_store, tmp_path):
    local, url, options = served_store
    want = _local_bytes(local)
    with _cached(url, options, tmp_path) as first:
        assert _read_all(first, seed=1) == want
        assert first.bytes_read == first.size  # each piece fetched once, though read in 26 shuffled pieces
        assert first.pieces_fetched == len(_pieces(tmp_path)) == -(-first.size // PIECE)
    with _cached(url, options, tmp_path) as again:
        assert _read_all(again, chunk=70_001, seed=2) == want
        assert again.bytes_read == 0 and again.requests == 1  # the HEAD alone


def test_stream_epochs_after_the_first_fetch_nothing_same_batches_as_local(range_server, tmp_path):
    url = range_server.url + "store.h5"
    local = str(range_server.root / "store.h5")
    opts = dict(batch_size=100, seed=3, memory_budget="256MiB")

    def epochs(path, **kw):
        with h5stream.open(path, **opts, **kw) as stream:
            got = []
            for _ in range(3):
                got.append([(x.copy(), y.copy()) for x, y in stream])
                got[-1].append(range_server.ranges[:])
            return got

    remote = epochs(url, cache_dir=tmp_path, remote={"timeout_s": 10, "cache_piece": PIECE})
    plain = epochs(local)
    fetched = [sum(e - s for s, e in ep[-1]) for ep in remote]
    assert fetched[0] >= 7 * PIECE  # 7.7 MB of pixels, in whole pieces
    assert fetched[1] == fetched[0] and fetched[2] == fetched[0]  # nothing more in epochs 2 and 3
    for a, b in zip(remote, plain):
        assert len(a) == len(b)
        for (xa, ya), (xb, yb) in zip(a[:-1], b[:-1]):
            np.testing.assert_array_equal(xa, xb)
            np.testing.assert_array_equal(ya, yb)
    # the next run, another process's stream: only metadata from the server
    before = len(range_server.ranges)
    again = epochs(url, cache_dir=tmp_path, remote={"timeout_s": 10, "cache_piece": PIECE})
    later = range_server.ranges[before:]  # the header and the chunk indexes, read at open: no piece
    assert later and max(e - s for s, e in later) < PIECE, later
    for (xa, _), (xb, _) in zip(again[0][:-1], plain[0][:-1]):
        np.testing.assert_array_equal(xa, xb)


def test_cache_off_fetches_every_epoch(range_server, tmp_path):
    url = range_server.url + "store.h5"
    with h5stream.open(url, batch_size=500, cache_dir=None, remote={"timeout_s": 10}) as stream:
        list(stream)
        first = sum(e - s for s, e in range_server.ranges)
        list(stream)
        assert sum(e - s for s, e in range_server.ranges) - first >= 2500 * 32 * 32 * 3  # every pixel again
    assert not (tmp_path / "objects").exists() and not os.path.exists(default_cache_dir())


def test_a_changed_object_is_fetched_anew(range_server, tmp_path):
    url = range_server.url + "store.h5"
    path = range_server.root / "store.h5"
    options = RemoteOptions(timeout_s=10)
    with _cached(url, options, tmp_path) as first:
        _read_all(first)
    changed = bytearray(_local_bytes(path))
    changed[-PIECE:] = bytes(PIECE)  # same size, other bytes: only the ETag (mtime) tells
    path.write_bytes(changed)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with _cached(url, options, tmp_path) as second:
        assert _read_all(second) == bytes(changed)
        assert second.bytes_read == second.size
    assert len(_pieces(tmp_path)) == 2 * -(-len(changed) // PIECE)  # two versions, two folders


CHILD = textwrap.dedent("""
    import hashlib, random, sys
    from h5stream.remote.cache import CachedSource
    from h5stream.remote.config import RemoteOptions
    from h5stream.remote.source import RemoteSource
    url, cache, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    src = CachedSource(RemoteSource(url, RemoteOptions(timeout_s=10)), cache, piece_bytes=1 << 20)
    out = bytearray(src.size)
    starts = list(range(0, src.size, 100_000))
    random.Random(seed).shuffle(starts)
    print("started", flush=True)
    for s in starts:
        src.readinto(s, [memoryview(out)[s:s + 100_000]])
    print(hashlib.sha256(out).hexdigest(), src.pieces_fetched, flush=True)
""")


def _child(url, cache_dir, seed, **kw):
    return subprocess.Popen([sys.executable, "-c", CHILD, url, str(cache_dir), str(seed)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)


def test_four_processes_fetch_each_piece_once(range_server, tmp_path):
    url = range_server.url + "store.h5"
    want = hashlib.sha256(_local_bytes(range_server.root / "store.h5")).hexdigest()
    procs = [_child(url, tmp_path, seed) for seed in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err for _, err in outs]
    results = [out.split()[-2:] for out, _ in outs]
    assert {digest for digest, _ in results} == {want}
    n = -(-(range_server.root / "store.h5").stat().st_size // PIECE)
    assert sum(int(k) for _, k in results) == n  # between them, each piece once
    assert range_server.requests["GET"] == n and len(range_server.ranges) == n


def test_processes_cutting_one_object_into_pieces_of_other_sizes_each_read_its_own_bytes(range_server, tmp_path):
    # 3 MiB: piece 1 of 1 MiB pieces (bytes [1, 2) MiB) and piece 1 of 2 MiB pieces ([2, 3) MiB) are as long, so
    # the one a process filled passed the other's trailer check, and the other was served the wrong bytes.
    data = random.Random(0).randbytes(3 * PIECE)
    (range_server.root / "obj.bin").write_bytes(data)
    url = range_server.url + "obj.bin"
    proc = _child(url, tmp_path, 0)  # pieces of 1 MiB, every byte
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.split()[-2:] == [hashlib.sha256(data).hexdigest(), "3"]
    with CachedSource(RemoteSource(url, RemoteOptions(timeout_s=10)), str(tmp_path), piece_bytes=2 * PIECE) as src:
        assert _read_all(src) == data
        assert src.pieces_fetched == 2
    assert len(_pieces(tmp_path)) == 3 + 2  # each kept its own: neither removed the other's as damaged


def test_links_planted_in_the_cache_folder_are_never_written_through(range_server, tmp_path):
    url = range_server.url + "store.h5"
    want = _local_bytes(range_server.root / "store.h5")
    cache, elsewhere = tmp_path / "cache", tmp_path / "elsewhere"
    with _cached(url, RemoteOptions(timeout_s=10), cache) as src:
        folder = src.folder  # made, nothing fetched
    with _cached(url, RemoteOptions(timeout_s=10), elsewhere) as src:
        src.readinto(2 * PIECE, [bytearray(10)])
    valid = _pieces(elsewhere)[0]  # a whole piece 2, of another cache folder
    os.utime(valid, ns=(10**18, 10**18))
    victim = tmp_path / "precious.txt"
    victim.write_text("precious\n")
    os.symlink(victim, os.path.join(folder, "0.tmp"))
    os.symlink(tmp_path / "not-made", os.path.join(folder, "1.lock"))
    os.symlink(valid, os.path.join(folder, "2.piece"))
    proc = _child(url, cache, 0)  # another process reads every byte through the cache
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.split()[-2] == hashlib.sha256(want).hexdigest()
    assert victim.read_bytes() == b"precious\n"  # used to be overwritten with piece 0
    assert not (tmp_path / "not-made").exists()
    assert os.stat(valid).st_mtime_ns == 10**18  # not even marked used through the link
    assert not [name for name in os.listdir(folder) if os.path.islink(os.path.join(folder, name))]
    with _cached(url, RemoteOptions(timeout_s=10), cache) as src:
        assert _read_all(src) == want and src.pieces_fetched == 0


@pytest.mark.parametrize("linked", ["objects", "object"])
def test_a_link_planted_for_an_object_s_folder_is_never_written_through(range_server, tmp_path, linked):
    url = range_server.url + "store.h5"
    want = _local_bytes(range_server.root / "store.h5")
    cache = tmp_path / "cache"
    with _cached(url, RemoteOptions(timeout_s=10), cache) as src:
        folder = src.folder  # made, nothing fetched
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "0.piece").write_text("precious\n")
    where = os.path.dirname(folder) if linked == "objects" else folder
    if linked == "objects":
        os.rename(where, tmp_path / "moved")
    else:
        os.rmdir(where)
    os.symlink(victim, where)
    proc = _child(url, cache, 0)  # another process reads every byte through the cache
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.split()[-2] == hashlib.sha256(want).hexdigest()
    assert sorted(os.listdir(victim)) == ["0.piece"]  # used to get every piece, and this one replaced
    assert (victim / "0.piece").read_text() == "precious\n"
    assert not os.path.islink(where) and len(_pieces(cache)) == -(-len(want) // PIECE)


def test_kill_9_mid_fill_leaves_no_piece_and_the_next_reader_refills(range_server, tmp_path):
    url = range_server.url + "store.h5"
    range_server.stall_bytes(3 * PIECE + 10, 3 * PIECE + 11)  # piece 3 never arrives
    proc = _child(url, tmp_path, 0)
    assert range_server.stalled.wait(60)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    folder = next((tmp_path / "objects").iterdir())
    assert not (folder / "3.piece").exists()
    assert (folder / "3.tmp").exists()  # what it was filling: never served
    range_server.stop_stalling()
    with _cached(url, RemoteOptions(timeout_s=10), tmp_path) as src:
        assert _read_all(src) == _local_bytes(range_server.root / "store.h5")
    assert (folder / "3.piece").exists()


def test_a_damaged_piece_is_refetched_not_served(range_server, tmp_path):
    url = range_server.url + "store.h5"
    options = RemoteOptions(timeout_s=10)
    with _cached(url, options, tmp_path) as src:
        _read_all(src)
    piece = _pieces(tmp_path)[0]
    with open(piece, "r+b") as fh:
        fh.seek(1000)
        fh.write(b"\xff" * 16)
    with _cached(url, options, tmp_path) as src:
        assert _read_all(src) == _local_bytes(range_server.root / "store.h5")
        assert src.pieces_fetched == 1 and src.bytes_read == PIECE


def test_a_piece_whose_pages_never_reached_the_disk_is_refetched_not_served(range_server, tmp_path):
    # Pieces are renamed into place without fsync: after a machine crash one may be there at its full size with
    # zeros (blocks allocated, never written) or a stale block where a part of it should be.
    url = range_server.url + "store.h5"
    options = RemoteOptions(timeout_s=10)
    with _cached(url, options, tmp_path) as src:
        _read_all(src)
    zeros, stale = _pieces(tmp_path)[:2]
    size = os.path.getsize(zeros)
    with open(zeros, "r+b") as fh:
        fh.write(bytes(size))
    with open(stale, "r+b") as fh:
        fh.seek(4096)
        fh.write(bytes(4096))
    with _cached(url, options, tmp_path) as src:
        assert _read_all(src) == _local_bytes(range_server.root / "store.h5")
        assert src.pieces_fetched == 2 and src.bytes_read == 2 * PIECE


def test_a_file_size_limit_warns_once_and_streams_on_uncached(range_server, tmp_path):
    url = range_server.url + "store.h5"
    want = hashlib.sha256(_local_bytes(range_server.root / "store.h5")).hexdigest()
    script = ("import resource; resource.setrlimit(resource.RLIMIT_FSIZE, (500_000, 500_000))\n" + CHILD)
    proc = subprocess.run([sys.executable, "-c", script, url, str(tmp_path), "0"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-2:] == [want, "0"]
    warnings = [line for line in proc.stderr.splitlines() if "cannot write to the cache" in line]
    assert len(warnings) == 1 and "File too large" in warnings[0], proc.stderr
    assert _pieces(tmp_path) == [] and not list((tmp_path / "objects").glob("*/*.tmp"))


@pytest.mark.parametrize("where", ["a-file", "a-file/sub"])
def test_a_cache_dir_that_is_a_file_warns_once_and_streams_on_uncached(range_server, tmp_path, where):
    url = range_server.url + "store.h5"
    (tmp_path / "a-file").write_text("not a folder")
    opts = dict(batch_size=500, seed=3, memory_budget="256MiB")
    with pytest.warns(UserWarning) as caught:
        with h5stream.open(url, **opts, cache_dir=tmp_path / where, remote={"timeout_s": 10}) as stream:
            got = [(x.copy(), y.copy()) for x, y in stream]
    with h5stream.open(str(range_server.root / "store.h5"), **opts) as stream:  # used to be a ReaderError
        for (xa, ya), (xb, yb) in zip(got, stream, strict=True):
            np.testing.assert_array_equal(xa, xb)
            np.testing.assert_array_equal(ya, yb)
    lines = [str(w.message) for w in caught if "cache" in str(w.message)]
    assert len(lines) == 1 and "a file is in the way" in lines[0] and "\n" not in lines[0], lines
    assert (tmp_path / "a-file").read_text() == "not a folder"


def test_an_object_replaced_on_a_server_without_etag_or_last_modified_is_never_served_old(range_server, tmp_path):
    # The client gives such an object the Unix epoch as its modification time: every version had one cache key,
    # and a process after the replacement was served the old bytes.
    range_server.hide_identity()
    url = range_server.url + "obj.bin"
    for version in range(2):
        data = random.Random(version).randbytes(3 * PIECE)  # same size, other bytes
        (range_server.root / "obj.bin").write_bytes(data)
        proc = _child(url, tmp_path, 0)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out.split()[-2] == hashlib.sha256(data).hexdigest()
    assert _pieces(tmp_path) == []


def test_an_object_without_etag_or_last_modified_warns_once_and_streams_on_uncached(range_server, tmp_path):
    # Without either, a changed object could not be told from the one cached: not cached, and said so.
    range_server.hide_identity()
    url = range_server.url + "store.h5"
    opts = dict(batch_size=500, seed=3, memory_budget="256MiB")
    with pytest.warns(UserWarning) as caught:
        with h5stream.open(url, **opts, cache_dir=tmp_path, remote={"timeout_s": 10, "cache_piece": PIECE}) as stream:
            got = [[(x.copy(), y.copy()) for x, y in stream] for _ in range(2)]
    with h5stream.open(str(range_server.root / "store.h5"), **opts) as stream:
        want = [[(x.copy(), y.copy()) for x, y in stream] for _ in range(2)]
    for a, b in zip(got, want, strict=True):
        for (xa, ya), (xb, yb) in zip(a, b, strict=True):
            np.testing.assert_array_equal(xa, xb)
            np.testing.assert_array_equal(ya, yb)
    lines = [str(w.message) for w in caught if "ETag" in str(w.message)]
    assert len(lines) == 1 and "without the cache" in lines[0] and "\n" not in lines[0], lines
    assert _pieces(tmp_path) == []


def test_the_limit_evicts_least_recently_used_pieces(range_server, tmp_path):
    url = range_server.url + "store.h5"
    limit = 3 * (PIECE + TRAILER_BYTES)
    with _cached(url, RemoteOptions(timeout_s=10), tmp_path, limit=limit) as src:
        for index in range(8):  # in order: pieces 0, 1, 2... used in turn
            out = bytearray(1000)
            src.readinto(index * PIECE, [out])
            assert bytes(out) == _local_bytes(range_server.root / "store.h5")[index * PIECE:index * PIECE + 1000]
            assert sum(os.path.getsize(p) for p in _pieces(tmp_path)) <= limit
    left = sorted(int(os.path.basename(p).split(".")[0]) for p in _pieces(tmp_path))
    assert left and left == list(range(8 - len(left), 8))  # the newest remain
    assert evict(str(tmp_path), limit) <= limit


EVICT_CHILD = textwrap.dedent("""
    import sys
    from h5stream.remote import cache_evict

    def pause_at_the_removal_of_a_tmp(frame, event, arg):
        # Instrumentation, not a stand-in: the real evict() runs, and stops just as it removes a leftover .tmp.
        if (event == "call" and frame.f_code.co_name == "unlink" and frame.f_globals is vars(cache_evict)
                and str(frame.f_locals.get("path", "")).endswith(".tmp")):
            print("removing", flush=True)
            sys.stdin.readline()

    sys.settrace(pause_at_the_removal_of_a_tmp)
    print("left", cache_evict.evict(sys.argv[1], int(sys.argv[2])), flush=True)
""")


def test_eviction_removes_a_leftover_tmp_only_while_holding_its_piece_s_lock(tmp_path):
    """A fill killed midway leaves ``N.tmp``; eviction removes it when no process holds ``N.lock``.  It used to
    let the lock go between finding it free and removing the file, so a fill that started in between (lock
    taken, a new ``N.tmp`` made) lost its file and failed its rename.  Now, at the moment of removal, the lock is
    the evictor's: no fill can start then."""
    import fcntl

    folder = tmp_path / "objects" / "key"
    folder.mkdir(parents=True)
    (folder / "0.tmp").write_bytes(b"left by a killed fill")
    (folder / "0.lock").touch()
    proc = subprocess.Popen([sys.executable, "-c", EVICT_CHILD, str(tmp_path), str(1 << 30)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "removing\n", proc.stderr.read()
        lock = os.open(folder / "0.lock", os.O_RDWR)
        try:
            try:  # a fill starting now, as the cache's fill does: the piece's lock, then a new N.tmp
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                started = True
                os.unlink(folder / "0.tmp")
                (folder / "0.tmp").write_bytes(b"a new fill's bytes")
            except BlockingIOError:
                started = False
            proc.stdin.write("\n")
            proc.stdin.flush()
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0 and out.startswith("left"), err
            if started:
                assert (folder / "0.tmp").read_bytes() == b"a new fill's bytes", "the new fill's file was removed"
        finally:
            os.close(lock)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert not started, "a fill could take the piece's lock while eviction was removing its .tmp"
    assert not (folder / "0.tmp").exists()


@pytest.mark.parametrize("cache", [True, False], ids=["cached", "uncached"])
def test_reads_through_the_cache_are_checked_once_as_a_local_file_s(range_server, tmp_path, cache):
    """verify_reads="once": a block read from the cache's immutable, CRC-checked pieces is checked on its first
    read, as a local file's; one fetched from the server on every read, as before."""
    url = range_server.url + "store.h5"
    with h5stream.open(url, batch_size=500, cache_dir=tmp_path if cache else None, remote={"timeout_s": 10}) as s:
        list(s)
        assert s._feed.reader._check.every_read is (not cache)


STREAM_CHILD = textwrap.dedent("""
    import hashlib, sys
    import h5stream
    url, cache = sys.argv[1], sys.argv[2]
    digest = hashlib.sha256()
    with h5stream.open(url, batch_size=100, seed=7, cache_dir=cache,
                       remote={"timeout_s": 10, "cache_piece": 1 << 20}) as stream:
        for x, y in stream:
            digest.update(x.tobytes()); digest.update(y.tobytes())
    print(digest.hexdigest(), flush=True)
""")


def test_four_ranks_streaming_one_url_on_one_cache_fetch_each_piece_once(range_server, tmp_path):
    """Four processes stream the same URL with one cache folder (ranks on a node): every piece of the object is
    fetched by one of them once (the server's own log of ranges), and each gets the local file's batches."""
    url = range_server.url + "store.h5"
    with h5stream.open(str(range_server.root / "store.h5"), batch_size=100, seed=7) as stream:
        digest = hashlib.sha256()
        for x, y in stream:
            digest.update(x.tobytes())
            digest.update(y.tobytes())
    # The ranges an open reads (HDF5's metadata, through the remote file's own blocks, not the cache): one of them
    # may have a piece's span (the object's tail), and each process opens.
    first = len(range_server.ranges)
    h5stream.open(url, batch_size=100, seed=7, cache_dir=None, remote={"timeout_s": 10}).close()
    opened = set(range_server.ranges[first:])
    procs = [subprocess.Popen([sys.executable, "-c", STREAM_CHILD, url, str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err for _, err in outs]
    assert {out.strip() for out, _ in outs} == {digest.hexdigest()}
    size = (range_server.root / "store.h5").stat().st_size
    spans = {(s, min(s + PIECE, size)) for s in range(0, size, PIECE)}
    pieces = [r for r in range_server.ranges[first:] if r in spans and r not in opened]
    assert len(pieces) >= 7 and len(pieces) == len(set(pieces))  # 7.7 MB of pixels: each piece once, 4 readers
    assert len(pieces) <= len(_pieces(tmp_path)) <= len(pieces) + len(spans & opened)


def test_other_loaders_names_for_the_cache_say_what_h5stream_calls_them():
    with pytest.raises(ConfigError, match="it is cache_limit"):
        h5stream.open("s3://b/k.h5", max_cache_size="10GB")
    with pytest.raises(ConfigError, match="cache_dir: a folder, 'auto'"):
        h5stream.open("s3://b/k.h5", cache=False)


def test_threads_reading_one_piece_at_once_fetch_it_once(served_store, tmp_path):
    import threading

    local, url, options = served_store
    want = _local_bytes(local)[PIECE:2 * PIECE]
    barrier = threading.Barrier(8)
    got, errors = [None] * 8, []

    def read(i):
        try:
            out = bytearray(PIECE)
            barrier.wait()
            src.readinto(PIECE, [out])
            got[i] = bytes(out)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with _cached(url, options, tmp_path) as src:
        threads = [threading.Thread(target=read, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and got == [want] * 8
        assert src.pieces_fetched == 1 and src.bytes_read == PIECE
