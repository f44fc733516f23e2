"""What one store takes, a set of parts takes too: ``direct_io``, featurewise statistics and compressed parts, each
giving the batches one store of the same rows gives (in the same order, through resume, with and without workers)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import h5stream
from h5stream.errors import ConfigError, StoreBusyError
from h5stream.store.writer import write_arrays

from conftest import direct_io_folder

pytestmark = pytest.mark.usefixtures("no_leaks")

SIZES = (70, 101, 45)  # no part a multiple of the 32-row blocks: runs stop at every part's end
CLASSES = 3
NAMES = [f"c{i}" for i in range(CLASSES)]


def _rows(n, first=0, side=6):
    """Rows ``first .. first + n - 1`` of one sequence (the same row whichever store holds it), ``side``-square."""
    images = np.random.default_rng(0).integers(0, 255, (first + n, side, side, 3), dtype=np.uint8)[first:]
    ids = np.arange(first, first + n)
    images[:, 0, 0, 0], images[:, 0, 0, 1] = ids % 256, ids // 256
    return images, (ids * 7) % CLASSES


def _ids(x):
    return x[:, 0, 0, 0].astype(np.int64) + 256 * x[:, 0, 0, 1].astype(np.int64)


def _write_set(root, side=6, compressions=(None, None, None), whole_compression=None):
    """(parts, whole): part stores of SIZES rows (each with its compression) and one store of all their rows."""
    parts, first = [], 0
    for k, (n, compression) in enumerate(zip(SIZES, compressions)):
        images, labels = _rows(n, first, side)
        path = os.path.join(root, f"part-{k}.h5")
        write_arrays(path, images, labels, block_rows=32, storage_order="shuffled", class_names=NAMES,
                     compression=compression)
        parts.append(path)
        first += n
    images, labels = _rows(first, 0, side)
    whole = os.path.join(root, "whole.h5")
    write_arrays(whole, images, labels, block_rows=32, storage_order="shuffled", class_names=NAMES,
                 compression=whole_compression)
    return parts, whole


def _one_ingest(made):
    """``made`` (parts, whole) with the parts marked as the parts of one ``ingest --part`` set, which
    ``validation_split`` takes (its last rows, the last part's, sample the set); any other set is refused."""
    import h5py

    from h5stream.store.partattr import PartInfo, encode

    parts, _ = made
    for k, path in enumerate(parts):
        with h5py.File(path, "r+") as f:
            f.attrs["part"] = encode(PartInfo(k, len(parts), "0" * 32))
    return made


def _batches(spec, **kw):
    with h5stream.open(spec, **kw) as s:
        return [(x.copy(), y.copy()) for x, y in s]


def _same(a, b, exact=True):
    assert len(a) == len(b) and len(a) > 0
    for (xa, ya), (xb, yb) in zip(a, b):
        assert xa.shape == xb.shape and np.array_equal(ya, yb)
        assert np.array_equal(xa, xb) if exact else np.allclose(xa, xb, rtol=1e-5, atol=1e-5)


def _resumed(spec, at, **kw):
    """The batches of an epoch served as ``at`` batches, a saved state, and the rest from a new stream."""
    with h5stream.open(spec, **kw) as s:
        it = iter(s)
        head = [tuple(v.copy() for v in next(it)) for _ in range(at)]
        state = s.state()
    with h5stream.open(spec, resume=state, **kw) as s:
        return head + [(x.copy(), y.copy()) for x, y in s]


# -- direct_io -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def direct_set(tmp_path_factory):
    """Parts and a whole store of 12 KiB rows on a file system that takes O_DIRECT (reads of 8 rows, 96 KiB, go
    past the page cache)."""
    with direct_io_folder(str(tmp_path_factory.mktemp("direct"))) as folder:
        yield _write_set(folder, side=64)


DIRECT_KW = dict(batch_size=24, seed=3, read_unit=8 * 64 * 64 * 3, rows_per_fill=64, verify_reads=True)


@pytest.mark.parametrize("workers", [0, 2])
def test_direct_io_reads_every_local_part_past_the_page_cache(direct_set, workers):
    parts, whole = direct_set
    kw = dict(DIRECT_KW, workers=workers)
    with h5stream.open(parts, direct_io=True, **kw) as s:
        assert s.direct_io
        got = [(x.copy(), y.copy()) for x, y in s]
        stats = s.stats()
    assert stats["direct_io"] == 1 and stats["in_place_bytes"] > 0  # read with O_DIRECT, straight into batches
    _same(got, _batches(whole, direct_io=True, **kw))
    _same(got, _batches(parts, direct_io=False, **kw))
    assert sorted(np.concatenate([_ids(x) for x, _ in got]).tolist()) == list(range(sum(SIZES)))


def test_direct_io_set_resumes_mid_epoch_as_one_store(direct_set):
    parts, whole = direct_set
    kw = dict(DIRECT_KW, direct_io=True, shard=(1, 2))
    _same(_resumed(parts, 2, **kw), _batches(whole, **kw))


def test_direct_io_per_part_auto_as_for_one_store_of_the_set(monkeypatch, tmp_path):
    """'auto' weighs the local parts together against the page cache (one store of the same rows); each local
    part whose file system takes O_DIRECT is then read so; URL parts never; True names a part that refuses."""
    from h5stream.read import source

    paths = []
    for k, size in enumerate((3000, 5000)):
        paths.append(str(tmp_path / f"p{k}.h5"))
        with open(paths[-1], "wb") as fh:
            fh.write(b"\0" * size)
    refused = {paths[1]: "Invalid argument"}
    monkeypatch.setattr(source, "_direct_refused", lambda p: refused.get(p))
    monkeypatch.setattr(source, "cacheable_bytes", lambda: 7000)  # each part fits, the set (8000 B) does not
    assert source.resolve_direct_io_parts([paths[0], None, paths[1]], "auto") == (True, False, False)
    assert source.resolve_direct_io_parts([paths[0], paths[1]], False) == (False, False)
    monkeypatch.setattr(source, "cacheable_bytes", lambda: 9000)  # the set fits: the page cache keeps it
    assert source.resolve_direct_io_parts([paths[0], paths[1]], "auto") == (False, False)
    refused.clear()
    assert source.resolve_direct_io_parts([paths[0], None, paths[1]], True) == (True, False, True)
    refused[paths[1]] = "Invalid argument"
    with pytest.raises(ConfigError, match=r"p1\.h5: direct_io=True, but the file system of this part refuses "
                                          r"O_DIRECT reads \(Invalid argument\)"):
        source.resolve_direct_io_parts([paths[0], paths[1]], True)
    with pytest.raises(ConfigError, match="every part of this set is at a URL"):
        source.resolve_direct_io_parts([None, None], True)


# -- featurewise statistics ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plain_set(tmp_path_factory):
    return _one_ingest(_write_set(str(tmp_path_factory.mktemp("plain"))))


FEATURE = h5stream.Augment(featurewise_center=True, featurewise_std_normalization=True)


@pytest.mark.parametrize("workers", [0, 2])
def test_featurewise_statistics_are_fitted_over_the_whole_set(plain_set, workers):
    parts, whole = plain_set
    kw = dict(batch_size=24, seed=2, rows_per_fill=64, augment=FEATURE, workers=workers, validation_split=0.1,
              subset="training")
    with h5stream.open(parts, **kw) as s, h5stream.open(whole, **kw) as w:
        mine, theirs = s.config.augment, w.config.augment
        start, stop = s.config.rows
        assert start == 0 and SIZES[0] + SIZES[1] < stop < sum(SIZES)  # the training rows span all three parts
        assert np.allclose(mine.feature_mean, theirs.feature_mean, rtol=1e-12)
        assert np.allclose(mine.feature_std, theirs.feature_std, rtol=1e-12)
    x = _rows(sum(SIZES))[0][:stop].reshape(-1, 3).astype(np.float64)
    assert np.allclose(mine.feature_mean, x.mean(axis=0)) and np.allclose(mine.feature_std, x.std(axis=0))
    got = _batches(parts, **kw)
    _same(got, _batches(whole, **kw), exact=False)
    _same(_resumed(parts, 2, **kw), got, exact=False)


def test_featurewise_statistics_of_a_set_are_its_parts_rows_counted_once(plain_set):
    from h5stream.augment.stats import compute_feature_stats, feature_stats
    from h5stream.store.partset import read_any

    parts, whole = plain_set
    meta = read_any(parts, None, 10.0)
    for rows in [(0, sum(SIZES)), (60, 80), (71, 172), (171, 216)]:  # within a part, across one or two ends
        mean, std = feature_stats(meta, rows=rows, use_cache=False)
        ref_mean, ref_std = compute_feature_stats(whole, rows=rows, use_cache=False)
        assert np.allclose(mean, ref_mean, rtol=1e-12) and np.allclose(std, ref_std, rtol=1e-12)
    mean, std = compute_feature_stats(parts, rows=(10, 200))  # the public function takes a set as open does
    ref_mean, ref_std = compute_feature_stats(whole, rows=(10, 200))
    assert np.allclose(mean, ref_mean, rtol=1e-12) and np.allclose(std, ref_std, rtol=1e-12)


# -- compressed parts ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def zlib_set(tmp_path_factory):
    """Every part compressed, and one compressed store of their rows."""
    return _one_ingest(_write_set(str(tmp_path_factory.mktemp("zlib")), compressions=("zlib",) * 3,
                                  whole_compression="zlib"))


@pytest.fixture(scope="module")
def mixed_set(tmp_path_factory):
    """A compressed part between two uncompressed ones, and one compressed store of their rows."""
    return _one_ingest(_write_set(str(tmp_path_factory.mktemp("mixed")), compressions=(None, "zlib", None),
                                  whole_compression="zlib"))


@pytest.mark.parametrize("which", ["zlib_set", "mixed_set"])
@pytest.mark.parametrize("workers", [0, 2])
def test_compressed_parts_stream_the_batches_of_one_compressed_store(request, which, workers):
    parts, whole = request.getfixturevalue(which)
    kw = dict(batch_size=24, seed=4, memory_budget="64MiB", workers=workers, verify_reads=True)
    with h5stream.open(parts, **kw) as s, h5stream.open(whole, **kw) as w:
        assert s.plan.unit_rows == w.plan.unit_rows == 32  # compressed chunks are decoded whole: a block a unit
    got = _batches(parts, **kw)
    _same(got, _batches(whole, **kw))
    assert sorted(np.concatenate([_ids(x) for x, _ in got]).tolist()) == list(range(sum(SIZES)))


@pytest.mark.parametrize("which", ["zlib_set", "mixed_set"])
def test_compressed_parts_resume_shard_and_split_as_one_store(request, which):
    parts, whole = request.getfixturevalue(which)
    kw = dict(batch_size=16, seed=5, rows_per_fill=64, shard=(0, 2), validation_split=0.2, subset="training",
              verify_reads="once")
    _same(_resumed(parts, 3, **kw), _batches(whole, **kw))


def test_compressed_parts_with_the_feeder_and_labels_read_run_by_run(zlib_set):
    parts, whole = zlib_set
    kw = dict(batch_size=24, seed=9, rows_per_fill=64, workers=1, feeder=True, label_mode="categorical")
    _same(_batches(parts, **kw), _batches(whole, **kw))


def test_a_damaged_compressed_part_is_named(tmp_path):
    """A compressed part's rows are checked against its block checksums, as one compressed store's are."""
    import h5py

    parts, _ = _write_set(str(tmp_path), compressions=("zlib",) * 3, whole_compression="zlib")
    with h5py.File(parts[1], "r+") as f:  # new pixels, compressed anew: only the checksums can tell
        images = f["images"][40:41]
        f["images"][40:41] = 255 - images
    with pytest.raises(h5stream.ChecksumError, match=r"part-1\.h5: row 40 \(block 1\)"):
        _batches(parts, batch_size=24, seed=0, verify_reads=True)


def test_a_compressed_part_being_written_is_refused_in_one_line_naming_it(tmp_path):
    """Only HDF5 decodes a compressed part, and it trusts metadata a writer rewrites: as one compressed store,
    the set is refused while the part is written, and streams once the writer is done."""
    from test_faults_runtime import start_writer, stop_writer

    plain = tmp_path / "a.h5"
    ids = np.arange(40)
    write_arrays(plain, np.broadcast_to((ids % 251).astype(np.uint8)[:, None, None, None], (40, 8, 8, 3)),
                 ids % 3, block_rows=16, class_names=["a", "b", "c"])
    busy = tmp_path / "z.h5"
    writer = start_writer(busy, "hold", compression="zlib")
    try:
        with pytest.raises(StoreBusyError, match=rf"z\.h5: .*process {writer.pid} is writing this file"
                           ) as caught:
            with h5stream.open([str(plain), str(busy)], batch_size=16) as s:
                next(iter(s))
        assert "\n" not in str(caught.value)
    finally:
        stop_writer(writer)
    with h5stream.open([str(plain), str(busy)], batch_size=16) as s:
        assert sum(len(y) for _, y in s) == 40 + 80


def test_compressed_parts_at_urls_stream_the_batches_of_one_compressed_store(mixed_set, tmp_path):
    pytest.importorskip("obstore")
    import shutil

    from remote_servers import RangeServerProcess

    parts, whole = mixed_set
    for p in parts:
        shutil.copy(p, tmp_path)
    # The server runs in a process of its own: HDF5 reads a compressed part at a URL in many small requests, and
    # the test's own threads (the reader's, HDF5's) then never compete with the server's for this interpreter.
    with RangeServerProcess(tmp_path) as server:
        kw = dict(batch_size=24, seed=6, rows_per_fill=64, verify_reads=True, cache_dir=None, timeout_s=120,
                  remote=h5stream.RemoteOptions(timeout_s=120))
        urls = [server.url + os.path.basename(p) for p in parts]
        _same(_batches(urls, **kw), _batches(whole, **kw))
        _same(_batches([urls[0], parts[1], urls[2]], **kw), _batches(whole, **kw))  # local and URL parts mixed
