"""PyTorch on a device: ``stream.torch(device="cuda")`` yields batches already there, uploaded ahead.

The GPU never waits on the host: each batch is copied to the device on a CUDA
stream of h5stream's, ``batches_ahead`` batches before the training loop takes
it, and an event is recorded; the training loop's stream only *waits on that
event* (``wait_event``, a GPU-side dependency), never on the host.  The
training loop's own ``next()`` issues the copies of the batches ahead
(:class:`_Uploader`), so no other thread of the training process takes the
GIL per batch.  The model is FFCV's loader (``ffcv/loader/epoch_iterator.py``,
``ToDevice``):

* **page-locked memory, no second host copy**: the pixels are uploaded from
  the memory the stream made the batch in (its recycled batch arrays, or the
  worker pool's shared-memory slots).  Each such allocation is registered
  once with ``cudaHostRegister`` (:class:`HostPins`) the first time a batch
  lies in it, and unregistered when it is freed, so the copy is a real
  asynchronous DMA and nothing is allocated per batch.  That memory is the
  stream's, already counted in its memory budget (``stream.plan``); the
  adapter adds only :data:`HOST_SLOTS` small page-locked label buffers;
* **a host batch is let go only after its upload finished**: the uploader
  keeps the host batch of each of its :data:`HOST_SLOTS` positions until that
  position's *copied* event has completed, and waits on that event before
  reusing the position.  The stream recycles a batch's memory only once
  nobody holds it, so the DMA never reads memory being rewritten, and the
  stream's plan (which lets the consumer hold ``HANDED_OUT`` = 2 batches)
  still holds;
* **a ring of ``batches_ahead + 2`` device positions**, each with its own
  *ready* event: at most ``batches_ahead`` uploaded batches wait, one is being
  uploaded and one is in the training loop's hands, so a position's event is
  recorded again only after the training stream has enqueued its wait on it.
  Device tensors come from torch's caching allocator and are marked used by
  the consuming stream (``record_stream``), so a batch the model keeps stays
  valid;
* **conversions run on the device** (uint8 crosses the bus): ``dtype``
  (uint8, float16, bfloat16, float32), ``layout`` (``"NHWC"`` as stored,
  ``"NCHW"``, ``"channels_last"``: NCHW shape, NHWC memory) and ``mean`` /
  ``std`` normalisation (:func:`convert`).

``device="cpu"`` (or any non-CUDA device) runs the same pipeline -- ring,
conversions, one copy into fresh tensors standing for the upload -- without
streams, events or pinning, which only a CUDA device has.

``drop_remainder=True`` on the stream gives every batch the same shape, which
CUDA graphs and ``torch.compile(mode="reduce-overhead")`` need.

Threads: none of its own; everything runs in the thread that iterates (the
training loop's).  A pass's uploads end with the pass, at the next ``iter``,
at the iterator's ``close()`` or garbage collection, at
:meth:`DeviceIterable.close`, and at ``stream.close()`` (the next ``next()``
raises :class:`~h5stream.StreamClosedError`).
"""

from __future__ import annotations

import collections
import functools
import numbers
import threading
import time
import weakref
from dataclasses import dataclass

import numpy as np

from h5stream import _deps
from h5stream.concurrency.fork import OwnerOnly
from h5stream.adapters._dataloader import check_iteration, refuse_pickling, replaced
from h5stream.adapters._host_pins import HostPins
from h5stream.adapters._passes import passes_for
from h5stream.errors import ConfigError, StreamClosedError

torch = _deps.torch()
from torch.utils.data import IterableDataset  # noqa: E402 - after the guarded import of torch

from h5stream.adapters._devices import unavailable  # noqa: E402 - imports torch too

HOST_SLOTS = 2
"""Host batches the uploader holds at once (the stream's plan lets its consumer hold two)."""

DTYPES = {"uint8": torch.uint8, "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
LAYOUTS = ("NHWC", "NCHW", "channels_last")
OPTIONS = ("dtype", "layout", "mean", "std", "batches_ahead")


@dataclass(frozen=True)
class DeviceOptions:
    """What :func:`convert` does and where; made by :func:`device_options`, which validates."""

    device: torch.device
    dtype: torch.dtype | None = None  # None: as the stream yields (float32 when normalising)
    layout: str = "NHWC"
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    batches_ahead: int = 2

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def ring(self) -> int:
        """Device positions: ``batches_ahead`` queued, one uploading, one in the training loop's hands."""
        return self.batches_ahead + 2


def device_options_for(stream, device, opts: dict, *, caller: str) -> DeviceOptions:
    """:func:`device_options` for ``stream``'s images, from the keyword options a user gave ``caller``
    (``stream.torch`` or ``stream.keras``); raises :class:`ConfigError` for an unknown or removed option."""
    if "upload" in opts:
        raise ConfigError(f"{caller}(upload={opts['upload']!r}): the upload option was removed; the default does "
                          f"the same (the training loop's next() issues the uploads ahead): drop upload=")
    unknown = sorted(set(opts) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"{caller}(): unknown option(s) {unknown}; the options are {list(OPTIONS)}")
    shape = stream.image_shape
    channels = shape[-1] if len(shape) == 3 else 1
    return device_options(device, channels=channels, image_dtype=stream.image_dtype, caller=caller, **opts)


def device_options(device, *, dtype=None, layout="NHWC", mean=None, std=None, batches_ahead=2,
                   channels: int | None = None, image_dtype=np.uint8, caller: str = "stream.torch") -> DeviceOptions:
    """Validate ``stream.torch(device=..., ...)``'s options for images of ``channels`` channels and
    ``image_dtype``; raises :class:`ConfigError` naming ``caller``, the option and the valid choices."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"{caller}(device={device!r}): not a torch device ({exc}); "
                          "use e.g. 'cuda', 'cuda:1' or 'cpu'") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{caller}(device={device!r}): this torch sees no CUDA device "
                              "(torch.cuda.is_available() is False); use device='cpu' or a CUDA build of torch")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    elif (why := unavailable(dev)) is not None:
        raise ConfigError(f"{caller}(device={device!r}): this torch cannot use a {dev.type} device ({why}); use "
                          "device='cpu'" + (" or 'cuda'" if torch.cuda.is_available() else ""))
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ConfigError(f"{caller}(dtype={dtype!r}): choose one of {sorted(DTYPES)}")
        dtype = DTYPES[dtype]
    elif dtype is not None and dtype not in DTYPES.values():
        raise ConfigError(f"{caller}(dtype={dtype!r}): choose one of {sorted(DTYPES)} (or the torch dtype)")
    if layout not in LAYOUTS:
        raise ConfigError(f"{caller}(layout={layout!r}): choose one of {list(LAYOUTS)}")
    mean = _per_channel("mean", mean, channels, caller)
    std = _per_channel("std", std, channels, caller)
    if std is not None and min(std) <= 0:
        raise ConfigError(f"{caller}(std={std}): every std must be > 0")
    normalising = mean is not None or std is not None
    if normalising and dtype == torch.uint8:
        raise ConfigError(f"{caller}(dtype='uint8') cannot hold normalised values; use dtype='float32', "
                          "'float16' or 'bfloat16' with mean/std")
    if dtype == torch.uint8 and np.dtype(image_dtype) != np.uint8:
        raise ConfigError(f"{caller}(dtype='uint8'): the stream yields {np.dtype(image_dtype)} images "
                          "(its augmentation's output); choose a float dtype")
    if isinstance(batches_ahead, bool) or not isinstance(batches_ahead, numbers.Integral) or batches_ahead < 1:
        raise ConfigError(f"{caller}(batches_ahead={batches_ahead!r}): must be an int >= 1")
    return DeviceOptions(dev, dtype, layout, mean, std, int(batches_ahead))


def _per_channel(name, value, channels, caller):
    if value is None:
        return None
    values = (value,) if isinstance(value, numbers.Real) else tuple(value)
    try:
        values = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise ConfigError(f"{caller}({name}={value!r}): give a number or one number per channel") from None
    if channels is not None and len(values) not in (1, channels):
        raise ConfigError(f"{caller}({name}={value!r}): {len(values)} values for images of {channels} "
                          f"channels; give one number, or {channels}")
    return values


def convert(x, opts: DeviceOptions):
    """Images ``x`` (``(n, H, W, C)`` or ``(n, H, W)`` tensor, as the stream yields) -> what ``opts`` ask for.

    Pure: a new tensor on ``x``'s device (or ``x`` itself when nothing changes).
    Normalisation is ``(x - mean) / std`` in float32, in the stored pixel units
    (0-255 for uint8), then cast to ``opts.dtype`` (float32 if None).  NCHW
    and channels_last give shape ``(n, C, H, W)``; channels_last keeps NHWC
    memory order (``torch.channels_last``).
    """
    normalising = opts.mean is not None or opts.std is not None
    if normalising:
        x = x.to(torch.float32)
        if opts.mean is not None:
            x = x - _constant(opts.mean, x.device)
        if opts.std is not None:
            x = x / _constant(opts.std, x.device)
    dtype = opts.dtype if opts.dtype is not None else (torch.float32 if normalising else None)
    if dtype is not None and x.dtype != dtype:
        x = x.to(dtype)
    if opts.layout != "NHWC":
        if x.dim() == 3:
            x = x.unsqueeze(-1)
        x = x.permute(0, 3, 1, 2)
        x = x.contiguous() if opts.layout == "NCHW" else x.contiguous(memory_format=torch.channels_last)
    return x


@functools.lru_cache(maxsize=64)
def _constant(values: tuple[float, ...], device):
    """``values`` as a float32 tensor on ``device``, made once: not a host-to-device copy per batch.  (A per-channel
    tensor broadcasts over the last, channel, axis of NHWC images.)"""
    if len(values) == 1:
        return values[0]  # a Python scalar: no tensor at all
    return torch.tensor(values, dtype=torch.float32, device=device)


# -- the uploads --------------------------------------------------------------------------------------------
@dataclass
class _Ready:
    """One uploaded batch: tensors on the device and (CUDA) the event its conversion recorded."""

    x: object
    y: object
    event: object = None


END = object()


class _Uploader:
    """The uploads of one pass, issued by the consumer's own :meth:`get` (no thread): each ``get`` issues the
    uploads of the batches ahead (up to ``batches_ahead`` waiting), then hands over the oldest, whose copy and
    conversion were queued on the upload stream one or more ``get`` calls earlier, so they ran while the model
    computed.  An error of the stream is raised after the batches uploaded before it.  All in the consumer's
    thread; :meth:`close` from any thread, but not while :meth:`get` runs."""

    def __init__(self, passes, pass_id: int, opts: DeviceOptions, pins: HostPins | None, cuda_stream, stats: dict):
        self._cpu_before = stats["upload_cpu_s"]  # earlier passes' uploads
        self._passes, self._pass_id, self._opts, self._pins = passes, pass_id, opts, pins
        self._stream = passes.stream
        self._cuda_stream = cuda_stream
        self._stats = stats
        self._stop = threading.Event()
        cuda = opts.cuda
        self._ready_events = [torch.cuda.Event() for _ in range(opts.ring)] if cuda else None
        self._copied_events = [torch.cuda.Event() for _ in range(HOST_SLOTS)] if cuda else None
        self._held: list = [None] * HOST_SLOTS  # the host batch of each position, until its copy finished
        self._labels: list = [None] * HOST_SLOTS  # page-locked label buffers (CUDA), allocated on first use
        self._pending: collections.deque = collections.deque()
        self._k = 0
        self._done = False
        self._error: BaseException | None = None
        self._cpu_s = 0.0

    def get(self):
        """The next :class:`_Ready` or ``END``; raises the stream's error after the batches before it."""
        self._passes.check_process()  # a process forked from the stream's
        if self._stream.closed:
            raise StreamClosedError(f"{self._stream.meta.path}: the stream was closed while the torch "
                                    "adapter waited for a batch")
        if self._stop.is_set():
            return END
        t0 = time.perf_counter()
        try:
            self._fill()
            if self._pending:
                item = self._pending.popleft()
                self._fill()  # the next batches' copies overlap the step this one feeds
                return item
        finally:
            self._stats["wait_s"] += time.perf_counter() - t0
        if self._error is not None:
            exc, self._error = self._error, None
            raise exc
        return END

    def close(self) -> None:
        """Let go of the host batches once their copies finished.  Idempotent."""
        if not self._stop.is_set():
            self._stop.set()
            self._pending.clear()
            if self._copied_events is not None:
                for ev in self._copied_events:
                    ev.synchronize()
            self._held = [None] * HOST_SLOTS

    def _fill(self) -> None:
        """Issue uploads until ``batches_ahead`` wait, the pass ended, or it failed (kept for after them)."""
        t_cpu = time.thread_time()
        try:
            while not self._done and len(self._pending) < self._opts.batches_ahead:
                batch = self._passes.next_batch(self._pass_id)
                if batch is None:
                    self._done = True
                    break
                x, y = batch if isinstance(batch, tuple) else (batch, None)  # label_mode=None: images alone
                self._pending.append(self._upload(x, y, self._k))
                self._stats["batches"] += 1
                self._k += 1
        except Exception as exc:  # raised once the batches before it are handed over
            self._error, self._done = exc, True
        finally:
            self._cpu_s += time.thread_time() - t_cpu
            self._stats["upload_cpu_s"] = self._cpu_before + self._cpu_s

    def _upload(self, x: np.ndarray, y: np.ndarray | None, k: int) -> _Ready:
        """Batch ``k`` on the device (``y`` None: a stream without labels)."""
        opts = self._opts
        h = k % HOST_SLOTS
        if not opts.cuda:
            # The "upload" to a host device: one copy into fresh tensors, which the consumer owns (timed apart:
            # on a CUDA device the DMA engine does it).
            t0 = time.thread_time()
            ready = _copy_to(x, y, opts)
            self._stats["upload_copy_cpu_s"] += time.thread_time() - t0
            return ready
        copied = self._copied_events[h]
        copied.synchronize()  # this position's previous copy finished: its host batch may be let go and reused
        self._held[h] = None
        if self._pins is not None:
            self._pins.pin(x)
        labels = None if y is None else self._label_buffer(h, y)
        with torch.cuda.stream(self._cuda_stream):
            xd = torch.from_numpy(x).to(opts.device, non_blocking=True)
            yd = None if labels is None else labels.to(opts.device, non_blocking=True)
            copied.record(self._cuda_stream)
            self._held[h] = x  # kept until ``copied`` completed
            xd = convert(xd, opts)
            ready = self._ready_events[k % opts.ring]
            ready.record(self._cuda_stream)
        return _Ready(xd, yd, ready)

    def _label_buffer(self, h: int, y: np.ndarray):
        """``y`` copied into position ``h``'s page-locked buffer (small; allocated once per shape)."""
        buf = self._labels[h]
        if buf is None or tuple(buf.shape[1:]) != y.shape[1:] or buf.shape[0] < len(y) \
                or buf.dtype != torch.from_numpy(y[:0]).dtype:
            rows = max(len(y), self._stream.batch_size)
            buf = torch.empty((rows, *y.shape[1:]), dtype=torch.from_numpy(y[:0]).dtype, pin_memory=True)
            self._labels[h] = buf
        out = buf[:len(y)]
        out.copy_(torch.from_numpy(y))
        return out


def _copy_to(x: np.ndarray, y: np.ndarray | None, opts: DeviceOptions) -> _Ready:
    """``(x, y)`` copied to ``opts.device`` and converted, synchronously, into tensors the caller owns."""
    xd = convert(torch.from_numpy(x).to(opts.device), opts)
    xd = xd.clone() if xd.data_ptr() == x.ctypes.data else xd
    yd = None if y is None else torch.from_numpy(y).to(opts.device, copy=True)
    return _Ready(xd, yd)


def upload_now(batch, opts: DeviceOptions):
    """A stream batch (``(x, y)`` or ``x``) on the device now, in the calling thread, as :func:`hand_over`
    gives it: for a batch taken outside a pass (Keras peeking at one before its first epoch)."""
    x, y = batch if isinstance(batch, tuple) else (batch, None)
    return hand_over(_copy_to(x, y, opts), opts)


def hand_over(item: _Ready, opts: DeviceOptions):
    """``(x, y)`` (``x`` alone for a stream without labels) usable on the caller's current stream: it waits on the
    batch's event (on the GPU)."""
    if item.event is not None:
        consumer = torch.cuda.current_stream(opts.device)
        consumer.wait_event(item.event)
        # Allocated on the upload stream, used on the consumer's: free them only after its work on them.
        item.x.record_stream(consumer)
        if item.y is not None:
            item.y.record_stream(consumer)
    return item.x if item.y is None else (item.x, item.y)


class DeviceIterable(IterableDataset):
    """``len(stream)`` batches per iteration, already on ``opts.device`` and converted.

    Like :class:`h5stream.adapters.torch.StreamIterable` (one pass per
    ``iter``; iterate it directly or through ``DataLoader(ds, batch_size=None)``
    with ``num_workers=0``), with one :class:`_Uploader` per pass.  Owns the
    :class:`HostPins`; ``close()`` (idempotent) ends the pass and unregisters;
    dropping the dataset and its iterators does the same.
    """

    def __init__(self, stream, opts: DeviceOptions):
        super().__init__()
        self.stream = stream
        self.options = opts
        self._passes = passes_for(stream)
        self._state = DeviceState(opts)
        self._finalizer = weakref.finalize(self, OwnerOnly(self._state.close))  # nothing in a forked child
        self._handed_over = 0  # batches of the current pass handed to the training loop

    def __len__(self) -> int:
        return self._passes.n

    def __iter__(self):
        check_iteration(self, 2)
        self._state.stop_uploader()  # a new pass replaces the live one, as a new iter(stream) does
        return self._batches()

    def _batches(self):
        state = self._state
        if state.closed:
            raise StreamClosedError(f"{self.stream.meta.path}: this torch dataset is closed")
        uploader = state.start(self._passes, self._passes.begin_pass())
        served = self._handed_over = 0
        try:
            while True:
                item = uploader.get()
                if item is END:
                    if served < self._passes.n:
                        if state.closed:
                            raise StreamClosedError(f"{self.stream.meta.path}: this torch dataset was closed "
                                                    f"after {served} of the pass's {self._passes.n} batches")
                        raise replaced(self, served)
                    return
                served += 1
                self._handed_over = served
                yield hand_over(item, self.options)
        finally:
            state.stop_uploader(uploader)

    def state(self) -> dict:
        """``stream.state()`` as it was after the last batch this dataset handed to the training loop: what a
        checkpoint saves (``resume=`` it).  ``stream.state()`` itself runs ahead by the batches uploaded ahead,
        which a resume from it would skip.  In the training loop's thread."""
        return self._passes.record(self._handed_over)[0]

    def stats(self) -> dict:
        """``batches`` uploaded, ``wait_s`` the training loop spent in ``next()`` (issuing the uploads included),
        ``upload_cpu_s`` CPU time of the uploads (``upload_copy_cpu_s`` of it: copying and converting on a host
        device), ``pinned_bytes`` registered now, ``pin_failures``."""
        return self._state.snapshot()

    def close(self) -> None:
        """End the pass under way and unregister the page-locked memory.  Idempotent; the stream stays open."""
        self._finalizer()

    def __getstate__(self):
        refuse_pickling()


class DeviceState:
    """What a device dataset (:class:`DeviceIterable`, the Keras adapter's ``DeviceBatches``) owns: the uploader
    of the pass under way, the page-locked registrations, the CUDA stream and the counters; kept apart from the
    dataset so that the dataset's finalizer can run at garbage collection.  ``start`` / ``stop_uploader`` /
    ``close`` from any thread (a lock orders them)."""

    def __init__(self, opts: DeviceOptions):
        self.opts = opts
        self.closed = False
        self.uploader: _Uploader | None = None
        self.pins = HostPins() if opts.cuda else None
        self.cuda_stream = torch.cuda.Stream(device=opts.device) if opts.cuda else None
        self.stats = {"batches": 0, "wait_s": 0.0, "upload_cpu_s": 0.0, "upload_copy_cpu_s": 0.0}
        self._lock = threading.Lock()

    def start(self, passes, pass_id: int) -> _Uploader:
        with self._lock:
            up = _Uploader(passes, pass_id, self.opts, self.pins, self.cuda_stream, self.stats)
            self.uploader = up
            return up

    def stop_uploader(self, which: _Uploader | None = None) -> None:
        with self._lock:
            up = self.uploader
            if up is None or (which is not None and up is not which):
                if which is not None:
                    which.close()
                return
            self.uploader = None
        up.close()

    def snapshot(self) -> dict:
        """The counters (see :meth:`DeviceIterable.stats`)."""
        s = dict(self.stats)
        s["pinned_bytes"] = sum(self.pins.pinned.values()) if self.pins is not None else 0
        s["pin_failures"] = self.pins.failures if self.pins is not None else 0
        return s

    def close(self) -> None:
        self.closed = True
        self.stop_uploader()
        if self.pins is not None:
            self.pins.close()
