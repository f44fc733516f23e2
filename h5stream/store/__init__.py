"""The file schema: node and attribute names, and validated metadata for readers."""

from h5stream.store.meta import StoreMeta, read_meta

__all__ = ["StoreMeta", "read_meta"]
