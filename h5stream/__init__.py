"""h5stream: feed a training loop from an HDF5 image store far larger than RAM.

Public names only; importing this package never imports keras, tensorflow or torch.
"""

from h5stream.augment import Augment
from h5stream.errors import (
    BudgetError,
    ConfigError,
    H5StreamError,
    ReaderError,
    SourceError,
    StoreExistsError,
    StoreFormatError,
    StoreNotFoundError,
    StreamClosedError,
    WorkerError,
)
from h5stream.store import StoreMeta, read_meta
from h5stream.stream import Stream, open  # noqa: A004

__version__ = "0.1.0"

__all__ = [
    "Augment",
    "BudgetError",
    "ConfigError",
    "H5StreamError",
    "ReaderError",
    "SourceError",
    "StoreExistsError",
    "StoreFormatError",
    "StoreMeta",
    "StoreNotFoundError",
    "Stream",
    "StreamClosedError",
    "WorkerError",
    "open",
    "read_meta",
]
