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
