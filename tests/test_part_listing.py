"""A set of parts is in the same row order on every machine and rank: a glob's matches sorted by name (code point
order), never in the order the directory lists them; a directory is refused in one line naming the glob."""

from __future__ import annotations

import os

import numpy as np
import pytest

import h5stream
from h5stream.errors import StoreFormatError
from h5stream.store.partset import read_any
from h5stream.store.writer import write_arrays

pytestmark = pytest.mark.usefixtures("no_leaks")

NAMES = ("p-b.h5", "p-E.h5", "p-a.h5", "p-10.h5", "p-2.h5", "p-é.h5", "p-c.h5")  # created in this order


def _write(folder):
    for k, name in enumerate(NAMES):
        images = np.full((9, 2, 2, 3), k, np.uint8)
        write_arrays(os.path.join(folder, name), images, np.zeros(9, np.int64), block_rows=4,
                     storage_order="shuffled")


def test_a_glob_is_in_name_order_whatever_order_the_directory_lists(tmp_path):
    _write(tmp_path)
    listed = [n for n in os.listdir(tmp_path) if n.endswith(".h5")]
    by_name = sorted(NAMES)  # code points: capitals before lower case, "10" before "2", "é" last
    assert by_name == ["p-10.h5", "p-2.h5", "p-E.h5", "p-a.h5", "p-b.h5", "p-c.h5", "p-é.h5"]
    assert listed != by_name  # the folder lists them otherwise, so an order taken from the listing would show
    meta = read_any(str(tmp_path / "p-*.h5"), None, 10.0)
    assert [os.path.basename(p.path) for p in meta.parts] == by_name
    with h5stream.open(str(tmp_path / "p-*.h5"), batch_size=9, shuffle=False) as s:
        firsts = [int(x[0, 0, 0, 0]) for x, _ in s]
    assert firsts == [NAMES.index(n) for n in by_name]  # the rows follow: part by part in name order


def test_a_directory_is_one_line_naming_the_glob_that_reads_it(tmp_path):
    _write(tmp_path)
    with pytest.raises(StoreFormatError, match=r"is a directory.*pass a glob \('.*/\*\.h5'"):
        h5stream.open(str(tmp_path), batch_size=8)
