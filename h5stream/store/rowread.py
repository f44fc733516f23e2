"""Reading row ranges of a store's arrays into caller-owned buffers, through plain h5py or (for filters h5py lacks)
PyTables: what ``verify`` and ``repair`` read with."""

from __future__ import annotations

import contextlib

import numpy as np

from h5stream.store import pathrows, schema


def readable_by_h5py(dataset) -> bool:
    """Whether plain h5py has every filter of h5py ``dataset`` (not blosc, without hdf5plugin)."""
    import h5py

    dcpl = dataset.id.get_create_plist()
    return all(h5py.h5z.filter_avail(dcpl.get_filter(i)[0]) for i in range(dcpl.get_nfilters()))


class _H5pyRows:
    """Reads row ranges of the three arrays into caller-owned buffers with h5py ``read_direct``; variable-length
    paths (:attr:`vlen_paths`) into :class:`~h5stream.store.pathrows.PathRows` of their own."""

    errors = (OSError,)

    def __init__(self, path: str, remote=None):
        from h5stream.store.access import open_h5_readonly

        self._stack = contextlib.ExitStack()
        self._f = self._stack.enter_context(open_h5_readonly(path, native_driver=True, remote=remote, rdcc_nbytes=0))
        self.vlen_paths = pathrows.is_vlen(self._f)
        self._ds = {name: self._f[name] for name in (schema.IMAGES, schema.LABELS, pathrows.row_node(self._f))}
        self._ds[schema.PATHS] = self._ds[pathrows.row_node(self._f)]
        if schema.ROW_DIGESTS in self._f:
            self._ds[schema.ROW_DIGESTS] = self._f[schema.ROW_DIGESTS]

    @property
    def row_digests(self) -> bool:
        """Whether the store keeps ``/row_digests`` (read as ``read("row_digests", ...)``)."""
        return schema.ROW_DIGESTS in self._ds

    def read(self, name: str, start: int, stop: int, out: np.ndarray | None):
        """Rows ``start..stop-1`` of ``name`` (``"paths"`` for the paths of either layout): ``out[:stop - start]``
        filled, or, for variable-length paths (``out`` unused, may be None), a new ``PathRows``."""
        if name == schema.PATHS and self.vlen_paths:
            return pathrows.read_h5py(self._f, start, stop)
        self._ds[name].read_direct(out, np.s_[start:stop], np.s_[0:stop - start])
        return out[:stop - start]

    def close(self) -> None:
        self._stack.close()


class _TablesRows(_H5pyRows):
    """The same through PyTables, for filters plain h5py lacks (blosc)."""

    errors = (OSError, RuntimeError)  # PyTables raises HDF5ExtError, a RuntimeError

    def __init__(self, path: str):
        import tables

        self._f = tables.open_file(path, "r")
        root = self._f.root
        self.vlen_paths = pathrows.is_vlen(root)
        self._ds = {name: root._f_get_child(name) for name in (schema.IMAGES, schema.LABELS, pathrows.row_node(root))}
        self._ds[schema.PATHS] = self._ds[pathrows.row_node(root)]
        if schema.ROW_DIGESTS in root:
            self._ds[schema.ROW_DIGESTS] = root._f_get_child(schema.ROW_DIGESTS)

    def read(self, name: str, start: int, stop: int, out: np.ndarray | None):
        if name == schema.PATHS and self.vlen_paths:
            return pathrows.read_tables(self._f.root, start, stop)
        self._ds[name].read(start, stop, out=out[:stop - start])
        return out[:stop - start]

    def close(self) -> None:
        self._f.close()


def row_reader(path: str, via_h5py: bool, remote=None):
    """A reader of row ranges of a store's three arrays into caller-owned buffers (``read(name, start, stop,
    out)``, ``close()``, ``errors``): plain h5py (a URL with the ``remote`` options), or PyTables, for a local
    file, where h5py lacks a filter (``via_h5py`` False, see :func:`readable_by_h5py`)."""
    return _H5pyRows(path, remote) if via_h5py else _TablesRows(path)
