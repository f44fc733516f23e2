"""Residency: which byte ranges of a file are wholly in the page cache (mincore), on a real file."""

import os

import pytest

from h5stream.measure import evict_from_page_cache
from h5stream.read.pagecache import Residency


def test_a_range_counts_as_cached_only_when_every_page_is(tmp_path):
    path = tmp_path / "f.bin"
    size = 64 * 4096
    path.write_bytes(os.urandom(size))
    fd = os.open(path, os.O_RDONLY)
    r = Residency(fd)
    try:
        if not r.available:
            pytest.skip("mincore is not available here")
        os.pread(fd, size, 0)
        assert r.cached(0, size) and r.cached(5000, 3 * 4096)
        assert evict_from_page_cache(path)
        assert not r.cached(0, size) and not r.cached(10, 1)
        os.pread(fd, 8 * 4096, 16 * 4096)  # pages 16..23 (the kernel may read some ahead, never behind)
        assert r.cached(16 * 4096 + 100, 7 * 4096)
        assert not r.cached(15 * 4096, 2 * 4096)  # page 15 is missing
        assert not r.cached(size - 10, 20) and not r.cached(-1, 5) and not r.cached(0, 0)  # outside: unknown
    finally:
        r.close()
        os.close(fd)


def test_whole_range_answer_agrees_with_the_page_by_page_one(tmp_path):
    """cached() (cachestat where the kernel has it) says True exactly when mincore finds every page."""
    import numpy as np

    path = tmp_path / "g.bin"
    pages = 256
    path.write_bytes(os.urandom(pages * 4096))
    fd = os.open(path, os.O_RDONLY)
    r = Residency(fd)
    try:
        if r.method != "cachestat":
            pytest.skip("cachestat is not available here (Linux < 6.5, or filtered)")
        assert evict_from_page_cache(path)
        rs = np.random.default_rng(0)
        for start in rs.integers(0, pages, 12):  # scattered cached islands
            os.pread(fd, int(rs.integers(1, 16)) * 4096, int(start) * 4096)
        answers = set()
        for _ in range(400):
            offset = int(rs.integers(0, pages * 4096 - 1))
            length = int(rs.integers(1, min(40 * 4096, pages * 4096 - offset) + 1))
            want = bool(r.pages(offset, length).all())
            assert r.cached(offset, length) == want, (offset, length)
            answers.add(want)
        assert answers == {True, False}
    finally:
        r.close()
        os.close(fd)
