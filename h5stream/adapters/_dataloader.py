"""What both torch datasets (:mod:`h5stream.adapters.torch`, :mod:`h5stream.adapters.torch_device`) check when a
``DataLoader`` starts an iteration, and the one way to wrap them (:data:`USE`).

The batches are already made, so a ``DataLoader`` must not batch them again:
``DataLoader(ds)`` with torch's default ``batch_size=1`` would stack each batch
into a batch of one (5-D images).  It is told apart by the loader's fetcher,
the object that calls ``iter(ds)``
(``torch.utils.data._utils.fetch._IterableDatasetFetcher``, with its
``auto_collation`` flag, unchanged since torch 1.2); a torch that starts
iterations some other way gets no check.  A dataset cannot run in loader
worker processes either: the stream has its own reader thread and worker
pool.
"""

from __future__ import annotations

import sys

from h5stream import _deps
from h5stream.adapters._passes import replaced_error
from h5stream.errors import ConfigError, StreamIterationError

_deps.torch()  # one error line naming what to install, where torch is missing
from torch.utils.data import get_worker_info  # noqa: E402 - after the guarded import of torch

USE = "DataLoader(ds, batch_size=None, num_workers=0)"


def check_iteration(ds, depth: int) -> None:
    """Refuse an ``iter(ds)`` that a DataLoader would batch again or run in a worker process.

    Args:
        ds: the dataset being iterated (it has a ``stream``).
        depth: frames from this call up to the caller of ``ds.__iter__``.  Called in ``__iter__``, not in a
            generator: the caller's frame is the loader's fetcher only at that call.

    Raises:
        ConfigError: the loader would batch the batches again, or ``ds`` runs in a loader worker process.
    """
    if _loader_batches_again(sys._getframe(depth)):
        raise ConfigError(
            f"DataLoader(ds) batches the stream's batches again (torch's default batch_size=1 gives 5-D "
            f"images of shape (1, {ds.stream.batch_size}, H, W, C)); the stream already yields batches of "
            f"batch_size={ds.stream.batch_size}: use {USE}"
        )
    if get_worker_info() is not None:
        raise ConfigError(
            "an h5stream torch dataset cannot run in DataLoader worker processes; "
            f"use {USE} and h5stream.open(..., workers=N)"
        )
    ds._passes.check_process()  # a process forked from the stream's: before anything takes a lock


def refuse_pickling():
    """What a torch dataset's ``__getstate__`` does: it holds a live stream, which cannot be copied."""
    raise ConfigError(f"an h5stream torch dataset cannot be pickled; use {USE}")


def _loader_batches_again(frame) -> bool:
    """Whether ``frame`` is a DataLoader fetcher that collates items into batches (``batch_size`` not None)."""
    try:
        from torch.utils.data._utils.fetch import _BaseDatasetFetcher
    except ImportError:  # a torch without it: no check
        return False
    if frame is None or frame.f_globals.get("__name__") != _BaseDatasetFetcher.__module__:
        # Only the fetcher's frame is looked into: reading a frame's f_locals makes Python keep a snapshot of
        # its locals on it, which would keep whatever the caller deletes after iter(ds) alive.
        return False
    caller = frame.f_locals.get("self")
    return isinstance(caller, _BaseDatasetFetcher) and bool(getattr(caller, "auto_collation", False))


def replaced(ds, served: int) -> StreamIterationError:
    """What an iteration of a torch dataset raises when a newer pass replaced it (:func:`replaced_error`)."""
    return replaced_error(ds.stream.meta.path, "the torch dataset", served, len(ds))
