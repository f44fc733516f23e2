"""A byte flipped in a store's HDF5 structure (a dataset's object header, the root attributes, a chunk index) is
damage that ``verify``, ``repair``, ``info`` and ``preview`` report in one line with a non-zero exit: never a
Python traceback, never "OK".

The pixel, label, path and digest bytes themselves are covered by the block checksums (tests/test_verify.py);
here the flips land in what HDF5 needs to find them.
"""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest

import h5stream

pytestmark = pytest.mark.usefixtures("no_leaks")

NODES = ("images", "labels", "path_ends", "path_bytes", "checksums", "row_digests")


def one_line(err: str) -> bool:
    return err.count("\n") == 1 and err.startswith("h5stream: error: ") and "Traceback" not in err


def _flip(path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([byte ^ 0xFF]))


@pytest.fixture
def store(small_class_store, tmp_path):
    path = tmp_path / "s.h5"
    shutil.copyfile(small_class_store, path)
    return path


def _first_flip(path, offsets, broken) -> int:
    """The first of ``offsets`` whose flip makes ``broken(h5py.File)`` true, the file left flipped there."""
    for offset in offsets:
        _flip(path, offset)
        try:
            with h5py.File(path, "r", locking=False) as f:
                if broken(f):
                    return offset
        except (OSError, KeyError, TypeError):  # broken some other way: not the damage wanted
            pass
        _flip(path, offset)
    raise AssertionError("no such byte")


def _raises(call, *errors) -> bool:
    try:
        call()
    except errors:
        return True
    return False


@pytest.mark.parametrize("node", NODES)
def test_a_damaged_object_header_is_one_line_from_every_command(store, tmp_path, h5cli, node):
    with h5py.File(store, "r", locking=False) as f:
        header = h5py.h5o.get_info(f[node].id).addr
    _flip(store, header)  # the header's version byte
    for args in (["verify", store], ["repair", store], ["info", store],
                 ["preview", store, "--out", tmp_path / "grid.png"]):
        code, _out, err = h5cli(*args)
        assert code == 1 and one_line(err), (args[0], code, err)
        assert "damaged" in err and "restore it from a copy" in err or args[0] == "preview", err


def test_an_attribute_hdf5_cannot_decode_is_named(store, h5cli):
    data = open(store, "rb").read()
    name = data.index(b"checksum_tail\0")
    _first_flip(store, range(name, name + 64),
                lambda f: _raises(lambda: f.attrs["checksum_tail"], TypeError))  # its string datatype
    for command in ("verify", "info", "repair"):
        code, _out, err = h5cli(command, store)
        assert code == 1 and one_line(err), (command, err)
        assert "checksum_tail" in err and "the file is damaged" in err, err


def test_verify_reports_row_digests_whose_chunk_index_cannot_be_read(store, h5cli):
    data = open(store, "rb").read()
    trees = [i for i in range(len(data)) if data.startswith(b"TREE", i)]

    def only_row_digests_unreadable(f):
        return (_raises(lambda: f["row_digests"][:], OSError)
                and not any(_raises(lambda n=n: f[n][:], OSError) for n in NODES if n != "row_digests"))

    _first_flip(store, trees, only_row_digests_unreadable)
    code, _out, err = h5cli("verify", store)
    assert code == 1 and one_line(err), err
    assert "cannot be read (/row_digests: " in err, err
    code, _out, err = h5cli("repair", store)  # not "nothing to repair"
    assert code == 1 and one_line(err), err


def test_verify_reports_a_chunk_whose_recorded_size_plain_h5py_cannot_read(store, h5cli):
    """A flipped byte in the size of /labels' chunk entry: h5stream's readers (and verify, which reads without the
    chunk cache) take the rows' bytes from the offset and are untouched, so verify said OK while `info` and plain
    h5py called the file damaged."""
    with h5py.File(store, "r", locking=False) as f:
        labels = f["labels"][:]
        info = f["labels"].id.get_chunk_info(0)
    data = open(store, "rb").read()
    size = int(info.size).to_bytes(4, "little")  # as the index's B-tree node records it
    candidates = [i + 2 for i in range(len(data) - 4) if data[i:i + 4] == size]
    _first_flip(store, candidates, lambda f: f["labels"].id.get_chunk_info(0).size != info.size)
    with h5py.File(store, "r", locking=False) as f:
        assert _raises(lambda: f["labels"][:], OSError)  # plain h5py cannot read the labels
    code, _out, err = h5cli("verify", store)
    assert code == 1 and one_line(err), err
    assert "the chunk of /labels from row 0 " in err and "chunk index is damaged" in err, err
    with h5stream.open(str(store), batch_size=32, shuffle=False) as s:  # yet the stream reads the stored labels
        assert np.array_equal(np.concatenate([y for _x, y in s]), labels)


@pytest.mark.parametrize("name", ["committed_rows", "row_digests"])
def test_a_name_that_is_no_longer_text_is_damage_not_absence(store, h5cli, name):
    """A flipped byte in the attribute name `committed_rows` made the store read as one of another tool (every
    stored row usable, uncommitted ones too), in `/row_digests`' link name as a store without row digests: verify
    said OK to both."""
    data = open(store, "rb").read()
    at = [i + 3 for i in range(len(data)) if data.startswith(name.encode(), i)]
    _first_flip(store, at, lambda f: any(isinstance(n, bytes) for n in [*f.attrs, *f]))
    for command in ("verify", "info"):
        code, _out, err = h5cli(command, store)
        assert code == 1 and one_line(err), (command, err)
        assert "which is not text: the file is damaged" in err, err


def test_an_h5stream_store_without_its_committed_count_is_damage(store, h5cli):
    """A flip that made HDF5 drop the `committed_rows` attribute read the store as one of another tool, every
    stored row usable (uncommitted ones too), and verify said OK.  Plain files of other tools, without
    h5stream's format attribute, still read so."""
    with h5py.File(store, "a") as f:
        del f.attrs["committed_rows"]
    for command in ("verify", "info"):
        code, _out, err = h5cli(command, store)
        assert code == 1 and one_line(err), (command, err)
        assert "attribute committed_rows is missing, which every h5stream store has" in err, err
    with h5py.File(store, "a") as f:
        del f.attrs["h5stream_format"]
    assert h5cli("info", store)[0] == 0
