"""h5py over the block-cached remote file object: same metadata and chunk offsets as locally, in few requests."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest

from h5stream.errors import StoreFormatError, StoreNotFoundError
from h5stream.remote.config import RemoteOptions
from h5stream.store import schema
from h5stream.store.access import open_h5_readonly
from h5stream.store.meta import _describe

pytestmark = pytest.mark.usefixtures("no_leaks")
pytest.importorskip("obstore")

from h5stream.remote.fileobj import RemoteFile, block_span, missing_runs, open_h5_remote, remote_h5  # noqa: E402
from h5stream.remote.source import RemoteSource  # noqa: E402


def test_block_span_and_missing_runs():
    assert list(block_span(0, 1, 10)) == [0] and list(block_span(9, 2, 10)) == [0, 1]
    assert list(block_span(10, 10, 10)) == [1] and list(block_span(5, 0, 10)) == []
    assert missing_runs(range(0, 6), {1, 2, 5}) == [(0, 1), (3, 2)]
    assert missing_runs(range(3, 5), {3, 4}) == []


def test_the_file_object_reads_like_a_local_file_under_random_seeks(range_server):
    path = range_server.root / "store.h5"
    rng = np.random.default_rng(3)
    with io.FileIO(path, "rb") as local, RemoteSource(range_server.url + "store.h5") as source, \
            RemoteFile(source, block_bytes=64 << 10, max_blocks=3) as remote:
        assert remote.seek(0, io.SEEK_END) == local.seek(0, io.SEEK_END)
        for _ in range(200):
            where = int(rng.integers(0, local.seek(0, io.SEEK_END) + 10))
            n = int(rng.choice([1, 8, 500, 70_000, 200_000]))
            assert remote.seek(where) == local.seek(where)
            assert remote.read(n) == local.read(n)
            assert remote.tell() == local.tell()
        assert remote.seek(-5, io.SEEK_CUR) == local.seek(-5, io.SEEK_CUR)
        assert remote.read() == local.read()


def test_small_reads_in_one_block_cost_one_request(range_server):
    with RemoteSource(range_server.url + "store.h5") as source, RemoteFile(source, block_bytes=1 << 20) as remote:
        before = source.requests
        for offset in range(0, 1 << 20, 4096):
            remote.seek(offset)
            remote.read(100)
        assert source.requests - before == 1


def _chunk_offsets(data):
    """Byte offset of every chunk of ``data``, in chunk order, read from HDF5's chunk index."""
    found = {}
    data.id.chunk_iter(lambda info: found.__setitem__(info.chunk_offset[0], info.byte_offset))
    return np.array([found[k] for k in sorted(found)], np.int64)


def _local_view(path):
    with open_h5_readonly(path) as f:
        meta = _describe(path, f)
        return meta, _chunk_offsets(f[schema.IMAGES]), f[schema.LABELS][:]


def _remote_view(url, options=None):
    with remote_h5(url, options) as (f, raw):
        meta = _describe(url, f)
        offsets = _chunk_offsets(f[schema.IMAGES])
        return meta, offsets, f[schema.LABELS][:], raw.source.requests


@pytest.mark.parametrize("kind", ["s3", "http"])
def test_h5py_reads_the_same_metadata_and_chunk_offsets_remotely_in_a_few_requests(kind, request):
    if kind == "s3":
        request.getfixturevalue("aws_env")
        local, url = request.getfixturevalue("s3_store")
    else:
        server = request.getfixturevalue("range_server")
        local, url = str(server.root / "store.h5"), server.url + "store.h5"
    meta, offsets, labels = _local_view(local)
    r_meta, r_offsets, r_labels, requests = _remote_view(url, RemoteOptions(timeout_s=10))
    assert dataclasses.replace(r_meta, path=local) == meta
    assert np.array_equal(r_offsets, offsets) and np.array_equal(r_labels, labels)
    assert meta.rows == 2500 and len(offsets) == 3
    assert requests <= 6  # the HEAD, the first block, the last block, a chunk-index node


def test_pixels_read_through_h5py_remotely_equal_the_local_ones(range_server):
    local = str(range_server.root / "store.h5")
    with open_h5_readonly(local) as f:
        expected = f[schema.IMAGES][1000:1600]
    with open_h5_remote(range_server.url + "store.h5") as f:
        assert np.array_equal(f[schema.IMAGES][1000:1600], expected)


def test_an_object_that_is_not_hdf5_is_one_line_format_error(range_server):
    (range_server.root / "notes.h5").write_bytes(b"just some text\n" * 1000)
    with pytest.raises(StoreFormatError, match="not an HDF5 file") as info:
        with open_h5_remote(range_server.url + "notes.h5"):
            pass
    assert "\n" not in str(info.value)


def test_a_missing_object_raises_before_h5py_is_involved(range_server):
    with pytest.raises(StoreNotFoundError):
        with open_h5_remote(range_server.url + "absent.h5"):
            pass


def test_a_failure_inside_an_hdf5_read_surfaces_as_the_sources_error(range_server):
    from h5stream.errors import RemoteUnavailableError

    with pytest.raises(RemoteUnavailableError) as info:
        with open_h5_remote(range_server.url + "store.h5", RemoteOptions(timeout_s=1), block_bytes=4096) as f:
            range_server.fail_next(1000, 503)
            f[schema.IMAGES][:]  # noqa: B018 - the read is the test
    assert "HTTP 503" in str(info.value) and "\n" not in str(info.value)
