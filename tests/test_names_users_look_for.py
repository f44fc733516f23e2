"""The names users of h5py, PyTables, Keras and torchvision look for: `info` lists the HDF5 nodes, and a stream
has `file_paths` and `class_to_idx`."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest

import h5stream
from h5stream import cli
from h5stream.store import pathrows

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture
def store(small_class_store):
    return small_class_store


def test_info_names_the_hdf5_nodes_with_their_shapes_and_types(h5cli, store):
    code, out, err = h5cli("info", store, "--json")
    assert code == 0, err
    nodes = json.loads(out)["nodes"]
    with h5py.File(store, "r") as f:
        rows = f["images"].shape[0]
        assert nodes == {"/images": {"shape": [rows, 8, 8, 3], "dtype": "uint8"},
                         "/labels": {"shape": [rows], "dtype": "int64"},
                         "/path_bytes": {"shape": list(f["path_bytes"].shape), "dtype": "uint8"},
                         "/path_ends": {"shape": [rows], "dtype": "int64"},
                         "/checksums": {"shape": list(f["checksums"].shape), "dtype": "uint64"},
                         "/row_digests": {"shape": [rows], "dtype": "uint64"}}
    code, out, err = h5cli("info", store)
    assert code == 0, err
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  HDF5 nodes"))
    assert lines[start].split()[2:] == ["/images", f"({rows},", "8,", "8,", "3)", "uint8"]
    assert [line.split()[0] for line in lines[start + 1:start + 5]] == ["/labels", "/path_bytes", "/path_ends",
                                                                        "/checksums"]


def test_file_paths_are_the_stores_paths_in_row_order_for_the_subset(store, class_src):
    with h5py.File(store, "r") as f:
        stored = [p.decode() for p in pathrows.stored_bytes(f, 0, f["images"].shape[0])]
        labels = f["labels"][:]
    assert sorted(stored) == sorted(rel for rel, _label in class_src[1])
    with h5stream.open(store, batch_size=4) as whole:
        assert whole.file_paths == stored
        whole.file_paths.clear()  # the caller's copy: the stream's own is untouched
        assert whole.file_paths == stored
        to_idx = whole.class_to_idx
    train, val = h5stream.open(store, batch_size=4, validation_split=0.25, subset="both")
    with train, val:
        assert train.file_paths + val.file_paths == stored
        assert len(train.file_paths) == train.rows and len(val.file_paths) == val.rows
        for path, label in zip(val.file_paths, np.concatenate([y for _x, y in val])):  # validation: file order
            assert to_idx[path.split("/")[0]] == label
    assert [to_idx[p.split("/")[0]] for p in stored] == labels.tolist()


def test_class_to_idx_maps_each_class_name_to_its_label_and_is_none_for_regression(store, regression_src, tmp_path):
    with h5stream.open(store, batch_size=4) as s:
        assert s.class_to_idx == {"bird": 0, "cat": 1, "dog": 2}
        assert list(s.class_to_idx) == s.class_names
    root, csv_path, _rows = regression_src
    out = tmp_path / "r.h5"
    assert cli.main(["ingest", root, str(out), "--labels", csv_path, "--size", "8", "--workers", "0"]) == 0
    with h5stream.open(out, batch_size=4) as s:
        assert s.class_to_idx is None and len(s.file_paths) == s.rows
        assert all(os.path.exists(os.path.join(root, p)) for p in s.file_paths)


def test_file_paths_of_a_url_store_are_read_with_the_streams_timeout(store, range_server):
    """``file_paths`` of a store at a URL reads its paths with the stream's remote options (``timeout_s`` too): a
    server that stalls midway through that read fails within the stream's 4 s of silence, not the client's 30."""
    import shutil

    from conftest import finishes_within

    shutil.copyfile(store, range_server.root / "paths.h5")
    with h5py.File(store, "r") as f:
        stored = [p.decode() for p in pathrows.stored_bytes(f, 0, f["images"].shape[0])]
    url = range_server.url + "paths.h5"
    with h5stream.open(url, batch_size=4, cache_dir=None, timeout_s=4) as s:
        assert s.file_paths == stored
    with h5stream.open(url, batch_size=4, cache_dir=None, timeout_s=4) as s:
        for _ in range(64):  # every response from now on (the reader's reads ahead too) stalls after 10 bytes
            range_server.hang_next(after_bytes=10)
        with pytest.raises(h5stream.RemoteUnavailableError) as info:
            finishes_within(lambda: s.file_paths, 60)
    assert "timeout_s=4 s" in str(info.value) and "\n" not in str(info.value)
