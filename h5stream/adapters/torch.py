"""PyTorch: ``as_torch(stream)`` -- a ``torch.utils.data.IterableDataset`` of tensor batches.

``as_torch(stream, device=...)`` (``stream.torch(device="cuda")``) yields
them already on the device, uploaded ahead and converted there: see
:mod:`h5stream.adapters.torch_device`.  Without ``device``, as below.

Each ``iter`` is one pass (see :mod:`h5stream.adapters._passes`): ``len(stream)``
batches ``(x, y)`` as tensors sharing memory with the stream's numpy arrays
(``x`` is ``(n, H, W, C)``, channels last as stored; permute for NCHW models).

The batches are already made, so a ``DataLoader`` must not batch them again:
wrap it as ``DataLoader(ds, batch_size=None)`` (or iterate ``ds`` directly),
and keep ``num_workers=0``: the stream has its own reader thread and worker
pool, and cannot be copied into DataLoader workers.  ``DataLoader(ds)`` with
torch's default ``batch_size=1`` would stack each batch into a batch of one
(5-D images); iterating such a loader raises :class:`~h5stream.ConfigError`
instead.  It is told apart by the loader's fetcher, the object that calls
``iter(ds)`` (``torch.utils.data._utils.fetch._IterableDatasetFetcher``, with
its ``auto_collation`` flag, unchanged since torch 1.2); a torch that
starts iterations some other way gets no check.
"""

from __future__ import annotations

import sys

from h5stream import _deps
from h5stream.adapters._passes import passes_for
from h5stream.errors import ConfigError

torch = _deps.torch()
from torch.utils.data import IterableDataset, get_worker_info  # noqa: E402 - after the guarded import of torch

_USE = "DataLoader(ds, batch_size=None, num_workers=0)"


class StreamIterable(IterableDataset):
    """``len(stream)`` tensor batches per iteration."""

    def __init__(self, stream):
        super().__init__()
        self.stream = stream
        self._passes = passes_for(stream)

    def __len__(self) -> int:
        return self._passes.n

    def __iter__(self):
        check_iteration(self, 2)
        return self._batches()

    def _batches(self):
        pass_id = self._passes.begin_pass()
        while True:
            batch = self._passes.next_batch(pass_id)
            if batch is None:
                return
            if isinstance(batch, tuple):
                yield tuple(torch.from_numpy(a) for a in batch)
            else:  # label_mode=None: images alone
                yield torch.from_numpy(batch)

    def __getstate__(self):
        raise ConfigError(f"an h5stream torch dataset cannot be pickled; use {_USE}")


def check_iteration(ds, depth: int) -> None:
    """Refuse an ``iter(ds)`` that a DataLoader would batch again or run in a worker process.  ``depth``: frames
    from this call up to the caller of ``ds.__iter__``.  Called in ``__iter__``, not in a generator: the caller's
    frame is the loader's fetcher only at that call."""
    if _loader_batches_again(sys._getframe(depth)):
        raise ConfigError(
            f"DataLoader(ds) batches the stream's batches again (torch's default batch_size=1 gives 5-D "
            f"images of shape (1, {ds.stream.batch_size}, H, W, C)); the stream already yields batches of "
            f"batch_size={ds.stream.batch_size}: use {_USE}"
        )
    if get_worker_info() is not None:
        raise ConfigError(
            "an h5stream torch dataset cannot run in DataLoader worker processes; "
            f"use {_USE} and h5stream.open(..., workers=N)"
        )
    ds._passes.check_process()  # a process forked from the stream's: before anything takes a lock


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


def as_torch(stream, device=None, **opts):
    """``torch.utils.data.IterableDataset`` yielding ``(x, y)`` tensors, one epoch per iteration; wrap it as
    ``DataLoader(ds, batch_size=None)``.

    ``device`` None: CPU tensors sharing memory with the stream's batches
    (:class:`StreamIterable`).  A device (``"cuda"``, ``"cuda:1"``, ``"cpu"``, a
    ``torch.device``): a :class:`~h5stream.adapters.torch_device.DeviceIterable`
    whose batches are already there, with ``opts``: ``dtype`` (``"uint8"``,
    ``"float16"``, ``"bfloat16"``, ``"float32"``), ``layout`` (``"NHWC"`` as
    stored, ``"NCHW"``, ``"channels_last"``), ``mean`` / ``std`` (a number or one
    per channel, in stored pixel units), ``batches_ahead`` (default 2), ``upload`` (``"inline"``, the default:
    ``next()`` issues the uploads ahead; ``"thread"``: an upload thread does).
    """
    if device is None:
        if opts:
            raise ConfigError(f"stream.torch({', '.join(f'{k}=...' for k in opts)}) converts on a device: give "
                              "device= too (device='cpu' for CPU tensors)")
        return StreamIterable(stream)
    from h5stream.adapters.torch_device import OPTIONS, DeviceIterable, device_options

    unknown = sorted(set(opts) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"stream.torch(): unknown option(s) {unknown}; the options are {list(OPTIONS)}")
    shape = stream.meta.image_shape
    channels = shape[-1] if len(shape) == 3 else 1
    return DeviceIterable(stream, device_options(device, channels=channels, image_dtype=stream.image_dtype, **opts))
