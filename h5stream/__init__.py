"""h5stream: feed a training loop from an HDF5 image store far larger than RAM.

Public names only.  Importing this package is cheap: it loads the error
classes, and the rest (h5py, OpenCV, the stream) on first use of a name
(PEP 562), so the processes that ingest or augment start fast.  It never
imports keras, tensorflow or torch: ``h5stream.keras`` is there without an
import of its own, and imports keras on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from h5stream.errors import (
    BudgetError,
    ChecksumError,
    ConfigError,
    ForkedStreamError,
    H5StreamError,
    ImageDecodeError,
    MissingDependencyError,
    OptionNameError,
    OutputWriteError,
    ReaderError,
    RemoteError,
    RemoteUnavailableError,
    ResourceLimitError,
    SourceError,
    StoreBusyError,
    StoreChangedError,
    StoreExistsError,
    StoreFormatError,
    StoreNotFoundError,
    StorePathError,
    StorePermissionError,
    StoreReadError,
    StoreWriteError,
    StreamClosedError,
    StreamIterationError,
    WorkerError,
)

if TYPE_CHECKING:
    from h5stream import keras  # noqa: F401 - loaded on first access, see __getattr__
    from h5stream.augment import Augment
    from h5stream.ingest.pywrite import Writer
    from h5stream.ingest.writesource import write
    from h5stream.remote import RemoteOptions
    from h5stream.store import StoreMeta, read_meta
    from h5stream.streaming.api import open  # noqa: A004
    from h5stream.streaming.stream import Stream

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)

_LAZY = {
    "Augment": "h5stream.augment",
    "RemoteOptions": "h5stream.remote",
    "StoreMeta": "h5stream.store",
    "read_meta": "h5stream.store",
    "Stream": "h5stream.streaming.stream",
    "open": "h5stream.streaming.api",
    "write": "h5stream.ingest.writesource",
    "Writer": "h5stream.ingest.pywrite",
}
#: Submodules reachable as attributes (``h5stream.keras.ResumeCallback``), imported on first access.
_LAZY_SUBMODULES = ("keras",)

__all__ = [
    "Augment",
    "BudgetError",
    "ChecksumError",
    "ConfigError",
    "ForkedStreamError",
    "H5StreamError",
    "ImageDecodeError",
    "MissingDependencyError",
    "OptionNameError",
    "OutputWriteError",
    "ReaderError",
    "RemoteError",
    "RemoteOptions",
    "RemoteUnavailableError",
    "ResourceLimitError",
    "SourceError",
    "StoreBusyError",
    "StoreChangedError",
    "StoreExistsError",
    "StoreFormatError",
    "StoreMeta",
    "StoreNotFoundError",
    "StorePathError",
    "StorePermissionError",
    "StoreReadError",
    "StoreWriteError",
    "Stream",
    "StreamClosedError",
    "StreamIterationError",
    "WorkerError",
    "Writer",
    "open",
    "read_meta",
    "write",
]


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"h5stream.{name}")  # the import also sets the attribute
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'h5stream' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_LAZY_SUBMODULES))
