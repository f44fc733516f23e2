"""A set of part stores streams as one store: the same batches as one store of the same rows in the same order."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

import h5stream
from h5stream.errors import ConfigError
from h5stream.store.writer import write_arrays

pytestmark = pytest.mark.usefixtures("no_leaks")

SIZES = (137, 250, 91)  # no part a multiple of the 32-row blocks: runs must stop at every part's end
CLASSES = 4


def _ids(x):
    return x[:, 0, 0, 0].astype(np.int64) + 256 * x[:, 0, 0, 1].astype(np.int64)


def _rows(n, first=0):
    """Rows ``first .. first + n - 1`` of one sequence (the same row, whichever store holds it)."""
    images = np.random.default_rng(0).integers(0, 255, (first + n, 6, 6, 3), dtype=np.uint8)[first:]
    ids = np.arange(first, first + n)
    images[:, 0, 0, 0], images[:, 0, 0, 1] = ids % 256, ids // 256
    return images, (ids * 7) % CLASSES


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """(parts, whole): three part stores and one store holding their rows in the same order."""
    root = tmp_path_factory.mktemp("parts")
    names = [f"c{i}" for i in range(CLASSES)]
    parts, first = [], 0
    for k, n in enumerate(SIZES):
        images, labels = _rows(n, first)
        path = root / f"part-{k}.h5"
        write_arrays(path, images, labels, block_rows=32, storage_order="shuffled", class_names=names)
        parts.append(str(path))
        first += n
    images, labels = _rows(first)
    write_arrays(root / "whole.h5", images, labels, block_rows=32, storage_order="shuffled", class_names=names)
    return parts, str(root / "whole.h5")


def _batches(spec, **kw):
    with h5stream.open(spec, **kw) as s:
        return [(x.copy(), y.copy()) for x, y in s]


def _same(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert np.array_equal(xa, xb) and np.array_equal(ya, yb)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_set_streams_the_batches_of_one_store(stores, workers):
    parts, whole = stores
    kw = dict(batch_size=24, seed=3, memory_budget="64MiB", workers=workers, verify_reads=True)
    got = _batches(parts, **kw)
    _same(got, _batches(whole, **kw))
    assert sorted(np.concatenate([_ids(x) for x, _ in got]).tolist()) == list(range(sum(SIZES)))


def test_glob_and_manifest_name_the_same_set(stores, tmp_path):
    parts, whole = stores
    kw = dict(batch_size=32, seed=1, rows_per_fill=96)
    want = _batches(whole, **kw)
    _same(_batches(parts[0].replace("part-0", "part-*"), **kw), want)
    manifest = tmp_path / "set.json"
    manifest.write_text(json.dumps({"h5stream_parts": 1, "parts": parts}))
    _same(_batches(str(manifest), **kw), want)


def _one_ingest(parts, folder):
    """Copies of ``parts`` in ``folder``, marked as the parts of one ``ingest --part`` set (which
    ``validation_split`` takes: its last rows, the last part's, sample the set; any other set is refused)."""
    import shutil

    from h5stream.store.partattr import PartInfo, encode

    out = []
    for k, path in enumerate(parts):
        out.append(shutil.copy(path, folder / f"part-{k}.h5"))
        with h5py.File(out[-1], "r+") as f:
            f.attrs["part"] = encode(PartInfo(k, len(parts), "0" * 32))
    return out


def test_resume_mid_epoch_shards_and_validation_split(stores, tmp_path):
    parts, whole = stores
    with pytest.raises(ConfigError, match="set of 3 parts"):  # hand-made parts: the last one need not sample the set
        h5stream.open(parts, batch_size=16, validation_split=0.2, subset="validation")
    parts = _one_ingest(parts, tmp_path)
    kw = dict(batch_size=16, seed=5, rows_per_fill=64, shard=(1, 2), validation_split=0.2, subset="training")
    with h5stream.open(parts, **kw) as s:
        it = iter(s)
        head = [next(it)[0].copy() for _ in range(4)]
        state = s.state()
    with h5stream.open(parts, resume=state, **kw) as s:
        tail = [x.copy() for x, _ in s]
    ref = [x for x, _ in _batches(whole, **kw)]
    assert len(head) + len(tail) == len(ref)
    for a, b in zip(head + tail, ref):
        assert np.array_equal(a, b)
    with h5stream.open(parts, batch_size=16, validation_split=0.2, subset="validation") as v:
        val = np.concatenate([_ids(x) for x, _ in v])
    assert sorted(val.tolist()) == list(range(sum(SIZES) - len(val), sum(SIZES)))  # the last rows of the set


def test_feeder_process(stores):
    parts, whole = stores
    kw = dict(batch_size=24, seed=9, rows_per_fill=96, workers=1, feeder=True)
    _same(_batches(parts, **kw), _batches(whole, **kw))


def test_parts_that_disagree_are_named(stores, tmp_path):
    parts, _ = stores
    odd = tmp_path / "odd.h5"
    images, labels = _rows(40)
    write_arrays(odd, images[:, :5], labels, block_rows=32, class_names=[f"c{i}" for i in range(CLASSES)])
    with pytest.raises(ConfigError,
                       match=r"odd\.h5: this part's image shape \(\(5, 6, 3\)\) differs from .*'s \(\(6, 6, 3\)\)"):
        h5stream.open(parts + [str(odd)], batch_size=8)
    other = tmp_path / "other.h5"
    write_arrays(other, images, labels, block_rows=32, class_names=["a", "b", "c", "d"])
    with pytest.raises(ConfigError,
                       match=r"other\.h5: this part's class names \(a, b, c, d\) differs from .*'s \(c0, c1, c2, c3\)"):
        h5stream.open([parts[0], str(other)], batch_size=8)


def _mark(path, index, count, listing="L"):
    with h5py.File(path, "r+") as f:
        f.attrs["part"] = json.dumps({"index": index, "count": count, "listing": listing})


def test_a_part_set_must_be_whole_and_of_one_listing(stores, tmp_path):
    import shutil

    parts, _ = stores
    copies = []
    for k, p in enumerate(parts):
        copies.append(str(tmp_path / f"p{k}.h5"))
        shutil.copy(p, copies[-1])
        _mark(copies[-1], k, 3)
    with pytest.raises(ConfigError, match=r"missing part 1/3 \(2 of 3 given\)"):
        h5stream.open([copies[0], copies[2]], batch_size=8)
    with h5stream.open([copies[2], copies[0], copies[1]], batch_size=8, seed=0) as s:  # ordered by index
        ordered = np.concatenate([_ids(x) for x, _ in s])
    with h5stream.open(parts, batch_size=8, seed=0) as s:
        assert np.array_equal(np.concatenate([_ids(x) for x, _ in s]), ordered)
    _mark(copies[1], 1, 3, listing="M")
    with pytest.raises(ConfigError, match=r"p1\.h5: part 1/3 was cut from another source listing"):
        h5stream.open(copies, batch_size=8)
    _mark(copies[1], 0, 3)
    with pytest.raises(ConfigError, match=r"p1\.h5: part 0/3 is listed twice"):
        h5stream.open(copies, batch_size=8)


def test_a_store_listed_twice_by_any_name_is_refused_in_one_line(stores, tmp_path):
    import os
    import subprocess
    import sys

    parts, _ = stores
    folder = os.path.dirname(parts[0])
    os.symlink(parts[1], tmp_path / "link.h5")
    os.link(parts[1], tmp_path / "hard.h5")
    (tmp_path / "set.json").write_text(json.dumps({"h5stream_parts": 1, "parts": parts + [parts[0]]}))
    for spec, twice in [
        (parts + [parts[2]], "part-2.h5"),
        ([parts[0], os.path.join(folder, ".", "part-1.h5"), parts[1]], "part-1.h5"),
        (parts + [str(tmp_path / "link.h5")], "link.h5"),
        ([str(tmp_path / "hard.h5")] + parts, "part-1.h5"),
        (str(tmp_path / "set.json"), "part-0.h5"),
    ]:
        with pytest.raises(ConfigError, match=rf"{twice}: this store is listed twice in the set.*list each part once"):
            h5stream.open(spec, batch_size=8)
    done = subprocess.run([sys.executable, "-m", "h5stream", "verify", parts[0], parts[1], parts[0]],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.startswith("h5stream: error: ") and "listed twice" in done.stderr
    assert done.stderr.count("\n") == 1


OUT_OF_FILES = r"""
import resource, sys
import h5stream
resource.setrlimit(resource.RLIMIT_NOFILE, (96, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
try:
    with h5stream.open(sys.argv[1], batch_size=16, workers=int(sys.argv[2])) as s:
        for _ in s:
            pass
    print("streamed")
except Exception as exc:
    print(type(exc).__name__, exc)
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_a_set_of_more_parts_than_files_may_be_open_is_one_line_naming_the_limit_not_damage(tmp_path, workers):
    import subprocess
    import sys

    for k in range(60):
        images, labels = _rows(5, 5 * k)
        write_arrays(tmp_path / f"part-{k:02d}.h5", images, labels, block_rows=4)
    done = subprocess.run([sys.executable, "-c", OUT_OF_FILES, str(tmp_path / "part-*.h5"), str(workers)],
                          capture_output=True, text=True, timeout=300)
    out = done.stdout.strip()
    assert done.returncode == 0 and out.count("\n") == 0, (out, done.stderr[-2000:])
    assert out.startswith("ReaderError ") and "damaged" not in out
    assert "too many open files for this process (ulimit -n is 96); raise it (e.g. ulimit -n 4096), or write " \
           "fewer, larger parts (each of this set's 60 parts keeps about 2 files open while it streams)" in out


def test_parts_at_urls_and_a_manifest_at_a_url(stores, tmp_path):
    pytest.importorskip("obstore")
    import shutil

    from remote_servers import RangeServer

    parts, whole = stores
    root = tmp_path / "www"
    root.mkdir()
    for p in parts:
        shutil.copy(p, root)
    (root / "set.json").write_text(json.dumps({"h5stream_parts": 1,
                                               "parts": ["part-0.h5", "part-1.h5", "part-2.h5"]}))
    server = RangeServer(root)
    try:
        kw = dict(batch_size=24, seed=4, rows_per_fill=96, verify_reads=True)
        want = _batches(whole, **kw)
        _same(_batches([server.url + f"part-{k}.h5" for k in range(3)], **kw), want)
        _same(_batches(server.url + "set.json", **kw), want)
    finally:
        server.stop()


def test_a_manifest_at_a_url_resolves_parts_outside_its_folder_and_names_with_a_colon(stores, tmp_path):
    pytest.importorskip("obstore")
    import shutil

    from remote_servers import RangeServer

    parts, whole = stores
    root = tmp_path / "www"
    (root / "sets").mkdir(parents=True)
    names = ["part-0.h5", "part-1-12:00.h5", "part-2.h5"]
    for p, name in zip(parts, names):
        shutil.copy(p, root / name)
    (root / "sets" / "set.json").write_text(json.dumps({"h5stream_parts": 1, "parts": [f"../{n}" for n in names]}))
    shutil.copy(parts[0], root / "sets" / "part-0.h5")
    (root / "sets" / "here.json").write_text(json.dumps({"h5stream_parts": 1, "parts": ["part-0.h5"]}))
    server = RangeServer(root)
    try:
        kw = dict(batch_size=24, seed=4, rows_per_fill=96)
        _same(_batches(server.url + "sets/set.json", **kw), _batches(whole, **kw))
        _same(_batches(server.url + "sets/here.json", **kw), _batches(parts[0], **kw))
    finally:
        server.stop()


@pytest.mark.parametrize("seed", range(20))
def test_runs_of_a_set_never_cross_a_part_and_put_every_row_at_its_byte(seed):
    """plan_part_runs against a row-by-row answer: random part sizes, block sizes, chunk placement, segments."""
    from h5stream.read.partread import part_cuts, plan_part_runs

    rng = np.random.default_rng(seed)
    n_parts = int(rng.integers(1, 5))
    sizes = rng.integers(1, 90, n_parts)
    blocks = rng.choice([4, 8, 16], n_parts)
    row_bytes = 10
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    offsets = []
    for n, b in zip(sizes, blocks):  # chunks in a random order in the file, some back to back
        n_chunks = -(-int(n) // int(b))
        order = rng.permutation(n_chunks) if rng.random() < 0.5 else np.arange(n_chunks)
        offsets.append(1000 + order.astype(np.int64) * int(b) * row_bytes)
    total = int(sizes.sum())
    unit = 4
    units = rng.permutation(-(-total // unit))
    segments = [(u * unit, min(total, (u + 1) * unit)) for u in units]

    def where(row):
        p = int(np.searchsorted(starts, row, side="right")) - 1
        local = row - int(starts[p])
        return p, int(offsets[p][local // int(blocks[p])]) + (local % int(blocks[p])) * row_bytes

    runs = plan_part_runs(segments, starts, part_cuts(starts, sizes, blocks), offsets, blocks, row_bytes)
    rows_in_order = [r for a, b in segments for r in range(a, b)]
    assert sum(r.rows for r in runs) == len(rows_in_order)
    for run in runs:
        parts = {where(run.src + k)[0] for k in range(run.rows)}
        assert len(parts) == 1  # one part
        for k in range(run.rows):
            assert rows_in_order[run.dest + k] == run.src + k
            assert where(run.src + k)[1] == run.offset + k * row_bytes  # one contiguous read of that part's file


def test_a_manifest_longer_than_a_mebibyte_lists_every_part(tmp_path):
    from h5stream.errors import StoreFormatError
    from h5stream.store.partset import part_paths

    names = [f"shard-{k:06d}-of-040000-{'x' * 16}.h5" for k in range(40_000)]
    manifest = tmp_path / "set.json"
    manifest.write_text(json.dumps({"h5stream_parts": 1, "parts": names}))
    assert manifest.stat().st_size > 1 << 20
    assert part_paths(str(manifest)) == [str(tmp_path / n) for n in names]
    manifest.write_text(json.dumps({"h5stream_parts": 1, "parts": names, "pad": " " * (64 << 20)}))
    with pytest.raises(StoreFormatError, match=r"set\.json: a manifest of more than 64 MiB; list fewer, larger parts"):
        part_paths(str(manifest))
