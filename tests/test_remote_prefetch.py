"""Pieces of the disk cache fetched ahead of the reads (h5stream/remote/prefetch.py), against the tests' HTTP server:
each piece fetched once, in whole aligned GETs, before the reads want it; no more ahead than the cache's limit
allows; the stream's batches unchanged; no thread left; a server gone mid-epoch fails the stream in one line."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import h5stream
from h5stream.errors import ReaderError, RemoteUnavailableError
from h5stream.remote.cache import CachedSource
from h5stream.remote.config import RemoteOptions
from h5stream.remote.source import RemoteSource

pytestmark = pytest.mark.usefixtures("no_leaks")

PIECE = 1 << 20


def _cached(range_server, cache_dir, **kw) -> CachedSource:
    return CachedSource(RemoteSource(range_server.url + "store.h5", RemoteOptions(timeout_s=10)), str(cache_dir),
                        piece_bytes=PIECE, **kw)


def _prefetch_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("h5stream-prefetch")]


def test_advised_pieces_are_fetched_ahead_once_each_and_the_reads_fetch_nothing(range_server, tmp_path):
    want = (range_server.root / "store.h5").read_bytes()
    n = -(-len(want) // PIECE)
    with _cached(range_server, tmp_path) as src:
        order = list(range(n - 1, -1, -1))  # first touch: the last piece first
        for index in order:
            src.advise_willneed(index * PIECE + 10, 100)
        src.advise_willneed(0, len(want))  # advised again: nothing more
        assert src._prefetch.wait_idle(60)
        assert src.prefetched == n and src.pieces_fetched == n
        assert sorted(range_server.ranges) == [(i * PIECE, min(len(want), (i + 1) * PIECE)) for i in range(n)]
        out = bytearray(len(want))
        for start in range(0, len(want), 300_000):
            src.readinto(start, [memoryview(out)[start:start + 300_000]])
        assert bytes(out) == want
        assert len(range_server.ranges) == n  # the reads took every byte from the cache
        src.advise_willneed(0, len(want))  # all present now: nothing queued
        assert src._prefetch.wait_idle(60) and src.prefetched == n
    assert _prefetch_threads() == []


def test_no_more_pieces_are_fetched_ahead_than_half_the_cache_limit(range_server, tmp_path):
    size = (range_server.root / "store.h5").stat().st_size
    with _cached(range_server, tmp_path, limit=4 * PIECE) as src:  # ahead: 2 pieces
        src.advise_willneed(0, size)
        assert src._prefetch.wait_idle(60)
        assert sorted(range_server.ranges) == [(0, PIECE), (PIECE, 2 * PIECE)]
        src.readinto(0, [bytearray(10)])  # piece 0 read: room for piece 2
        assert src._prefetch.wait_idle(60)
        assert sorted(range_server.ranges) == [(0, PIECE), (PIECE, 2 * PIECE), (2 * PIECE, 3 * PIECE)]


def test_a_cached_stream_fetches_each_piece_once_ahead_and_gives_the_local_files_batches(range_server, tmp_path):
    local = str(range_server.root / "store.h5")
    opts = dict(batch_size=100, seed=5, memory_budget="256MiB")
    size = os.path.getsize(local)
    with h5stream.open(range_server.url + "store.h5", **opts, cache_dir=tmp_path,
                       remote={"timeout_s": 10, "cache_piece": PIECE}) as remote, h5stream.open(local, **opts) as plain:
        opened = len(range_server.ranges)  # the open's header and chunk-index reads (not cached)
        got = [(x.copy(), y.copy()) for x, y in remote]
        assert len(got) == len(plain)
        for (xa, ya), (xb, yb) in zip(got, plain):
            np.testing.assert_array_equal(xa, xb)
            np.testing.assert_array_equal(ya, yb)
        fetched = range_server.ranges[opened:]
        pieces = [(s, e) for s, e in fetched if s % PIECE == 0 and (e - s == PIECE or e == size)]
        assert len(pieces) == len(set(pieces)) >= 7  # 7.7 MB of pixels in whole pieces, each fetched once
        assert all(e - s <= 128 << 10 for s, e in set(fetched) - set(pieces))  # the rest: the reader's metadata
    assert _prefetch_threads() == []


def test_a_server_gone_while_a_piece_is_prefetched_fails_the_cached_stream_in_one_line(range_server, tmp_path):
    range_server.stall_bytes(3 * PIECE + 10, 3 * PIECE + 11)  # piece 3's GET never answered
    stream = h5stream.open(range_server.url + "store.h5", batch_size=100, seed=1, timeout_s=30, cache_dir=tmp_path,
                           remote={"timeout_s": 1.5, "cache_piece": PIECE})
    try:
        it = iter(stream)
        assert range_server.stalled.wait(60)  # the prefetch of piece 3 is in flight (the first fill wants it)
        range_server.stop()
        with pytest.raises(ReaderError) as info:
            for _ in range(3):
                for _ in it:
                    pass
                it = iter(stream)
        assert "\n" not in str(info.value)
        assert isinstance(info.value.__cause__, RemoteUnavailableError)
    finally:
        stream.close()
    assert _prefetch_threads() == []


def test_a_piece_written_as_it_arrives_has_the_body_s_digest_and_a_local_write_failure_is_not_the_server_s(
        range_server, tmp_path):
    import xxhash

    from h5stream.errors import RemoteError
    from h5stream.remote.piecefile import PieceWriter, WriteFailed

    want = (range_server.root / "store.h5").read_bytes()[PIECE:3 * PIECE]
    src = RemoteSource(range_server.url + "store.h5", RemoteOptions(timeout_s=10))
    errors = []

    def fill(path, flags):
        fd = os.open(path, flags, 0o644)
        try:
            writer = PieceWriter(fd, len(want))
            src.stream_range(PIECE, 3 * PIECE, writer)  # streamed in parts: off the main thread
            return writer
        except BaseException as exc:  # noqa: BLE001 - checked below
            errors.append(exc)
        finally:
            os.close(fd)

    try:
        good = tmp_path / "good"
        out = []
        t = threading.Thread(target=lambda: out.append(fill(good, os.O_RDWR | os.O_CREAT)))
        t.start()
        t.join()
        assert not errors and good.read_bytes() == want and out[0].digest == xxhash.xxh3_64_intdigest(want)
        ro = tmp_path / "read-only"
        ro.write_bytes(b"")
        t = threading.Thread(target=fill, args=(ro, os.O_RDONLY))  # every write fails (EBADF)
        t.start()
        t.join()
        assert len(errors) == 1 and isinstance(errors[0], WriteFailed) and not isinstance(errors[0], RemoteError)
        with pytest.raises(OverflowError):
            PieceWriter(-1, 3).write(memoryview(b"abcd"))
    finally:
        src.close()
