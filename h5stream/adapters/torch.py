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
pool, and cannot be copied into DataLoader workers.  Iterating a loader that
would batch again, or run the dataset in its workers, raises
:class:`~h5stream.ConfigError` (see :mod:`h5stream.adapters._dataloader`).
"""

from __future__ import annotations

from h5stream import _deps
from h5stream.adapters._dataloader import check_iteration, refuse_pickling, replaced
from h5stream.adapters._passes import passes_for
from h5stream.errors import ConfigError

torch = _deps.torch()
from torch.utils.data import IterableDataset  # noqa: E402 - after the guarded import of torch


class StreamIterable(IterableDataset):
    """``len(stream)`` tensor batches per iteration; an iteration that a newer one replaced raises
    :class:`~h5stream.StreamIterationError` at its next ``next()``."""

    def __init__(self, stream):
        super().__init__()
        self.stream = stream
        self._passes = passes_for(stream)

    def __len__(self) -> int:
        return self._passes.n

    def __iter__(self):
        check_iteration(self, 2)
        return self._batches()

    def state(self) -> dict:
        """``stream.state()`` after the last batch handed to the training loop (what a checkpoint saves; the same
        as ``stream.state()`` here, which nothing reads ahead of, and the call :class:`DeviceIterable
        <h5stream.adapters.torch_device.DeviceIterable>` needs)."""
        return self.stream.state()

    def _batches(self):
        pass_id = self._passes.begin_pass()
        served = 0
        while True:
            batch = self._passes.next_batch(pass_id)
            if batch is None:
                if served < self._passes.n:
                    raise replaced(self, served)
                return
            served += 1
            if isinstance(batch, tuple):
                yield tuple(torch.from_numpy(a) for a in batch)
            else:  # label_mode=None: images alone
                yield torch.from_numpy(batch)

    def __getstate__(self):
        refuse_pickling()


def as_torch(stream, device=None, **opts):
    """The stream as a ``torch.utils.data.IterableDataset``, one epoch per iteration.

    Iterate it directly, or wrap it as ``DataLoader(ds, batch_size=None, num_workers=0)``.

    Args:
        stream: an open :class:`h5stream.Stream`; the dataset uses only its public API and shares its batch
            sequence with every other adapter of it.
        device: None for CPU tensors sharing memory with the stream's batches.  A torch device (``"cuda"``,
            ``"cuda:1"``, ``"cpu"``, a ``torch.device``) for batches already there, each uploaded
            ``batches_ahead`` batches before the training loop takes it.
        **opts: with ``device`` only: ``dtype`` (``"uint8"``, ``"float16"``, ``"bfloat16"``, ``"float32"``;
            default as the stream yields, float32 when normalising), ``layout`` (``"NHWC"`` as stored, the
            default; ``"NCHW"``; ``"channels_last"``: NCHW shape, NHWC memory), ``mean`` / ``std`` (a number or
            one per channel, in stored pixel units), ``batches_ahead`` (an int >= 1, default 2).

    Returns:
        ``len(stream)`` batches per iteration: ``(x, y)`` tensors, or ``x`` alone for a stream opened with
        ``label_mode=None``.  For a checkpoint, save ``ds.state()`` (the position after the batches the loop
        took), not ``stream.state()``, which with ``device`` runs ahead by the batches uploaded ahead.
        Without ``device`` a :class:`StreamIterable`; with it a
        :class:`~h5stream.adapters.torch_device.DeviceIterable`, whose ``close()`` lets go of the page-locked
        registrations (the stream stays open).

    Raises:
        ConfigError: an option without ``device``, an unknown option or a bad value (the message names it and
            the valid choices), a CUDA device this torch cannot see; when iterated, a ``DataLoader`` that
            would batch the batches again or run the dataset in worker processes; when pickled.
        MissingDependencyError: torch cannot be imported (an ImportError; the message names what to install).
    """
    if device is None:
        if opts:
            raise ConfigError(f"stream.torch({', '.join(f'{k}=...' for k in opts)}) converts on a device: give "
                              "device= too (device='cpu' for CPU tensors)")
        return StreamIterable(stream)
    from h5stream.adapters.torch_device import DeviceIterable, device_options_for

    return DeviceIterable(stream, device_options_for(stream, device, opts, caller="stream.torch"))
