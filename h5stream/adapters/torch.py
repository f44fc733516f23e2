"""PyTorch: ``as_torch(stream)`` -- a ``torch.utils.data.IterableDataset`` of tensor batches.

Each ``iter`` is one pass of the stream's shared feed: ``len(stream)``
batches ``(x, y)`` as tensors sharing memory with the stream's numpy arrays
(``x`` is ``(n, H, W, C)``, channels last as stored; permute for NCHW models).
The batches are already made, so wrap it as ``DataLoader(ds, batch_size=None)``
and keep ``num_workers=0``: the stream has its own reader thread and worker
pool, and cannot be copied into DataLoader workers.
"""

from __future__ import annotations

from h5stream import _deps
from h5stream.adapters._feed import feed_for
from h5stream.errors import ConfigError

torch = _deps.torch()
from torch.utils.data import IterableDataset, get_worker_info  # noqa: E402 - after the guarded import of torch


class StreamIterable(IterableDataset):
    """``len(stream)`` tensor batches per iteration."""

    def __init__(self, stream):
        super().__init__()
        self.stream = stream
        self._feed = feed_for(stream)

    def __len__(self) -> int:
        return self._feed.n

    def __iter__(self):
        if get_worker_info() is not None:
            raise ConfigError(
                "an h5stream torch dataset cannot run in DataLoader worker processes; "
                "use DataLoader(ds, batch_size=None, num_workers=0) and h5stream.open(..., workers=N)"
            )
        pass_id = self._feed.begin_pass()
        while True:
            batch = self._feed.next_batch(pass_id)
            if batch is None:
                return
            x, y = batch
            yield torch.from_numpy(x), torch.from_numpy(y)

    def __getstate__(self):
        raise ConfigError("an h5stream torch dataset cannot be pickled; keep DataLoader num_workers=0")


def as_torch(stream) -> StreamIterable:
    """``torch.utils.data.IterableDataset`` yielding ``(x, y)`` tensors, one epoch per iteration."""
    return StreamIterable(stream)
