"""Ingest: discover (folders or CSV -> items), decode (Pillow + OpenCV -> resized uint8), pack (parallel,
resumable writer).

Names load on first use, so a decode worker that imports :mod:`h5stream.ingest.decode`
pulls in numpy, Pillow and OpenCV only.
"""

import importlib

__all__ = ["IngestOptions", "IngestResult", "ingest"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module("h5stream.ingest.pack"), name)
    raise AttributeError(f"module 'h5stream.ingest' has no attribute {name!r}")
