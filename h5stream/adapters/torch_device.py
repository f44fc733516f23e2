"""PyTorch on a device: ``stream.torch(device="cuda")`` yields batches already there, uploaded ahead.

The GPU never waits on the host: each batch is copied to the device on a CUDA
stream of h5stream's, ``batches_ahead`` batches before the training loop takes
it, and an event is recorded; the training loop's stream only *waits on that
event* (``wait_event``, a GPU-side dependency), never on the host.  By default
(``upload="inline"``) the training loop's own ``next()`` issues the copies of
the batches ahead, so no other thread of the training process takes the GIL per
batch; ``upload="thread"`` has a thread of h5stream's (``h5stream-upload``) do
it.  The model is FFCV's loader (``ffcv/loader/epoch_iterator.py``, ``ToDevice``):

* **page-locked memory, no second host copy**: the pixels are uploaded from
  the memory the stream made the batch in (its recycled batch arrays, or the
  worker pool's shared-memory slots).  Each such allocation is registered
  once with ``cudaHostRegister`` (:class:`HostPins`) the first time a batch
  lies in it, and unregistered when it is freed, so the copy is a real
  asynchronous DMA and nothing is allocated per batch.  That memory is the
  stream's, already counted in its memory budget (``stream.plan``); the
  adapter adds only :data:`HOST_SLOTS` small page-locked label buffers;
* **a slot is written again only after its upload finished**: the upload
  thread keeps the host batch of each of its :data:`HOST_SLOTS` ring
  positions until that position's *copied* event has completed, and waits on
  that event (in the upload thread) before reusing the position.  The stream
  recycles a batch's memory only once nobody holds it, so the DMA never reads
  memory being rewritten, and the stream's plan (which lets the consumer
  hold ``HANDED_OUT`` = 2 batches) still holds;
* **a ring of ``batches_ahead + 2`` device positions**, each with its own
  *ready* event: at most ``batches_ahead`` uploaded batches wait in the
  queue, one is being uploaded and one is in the training loop's hands, so a
  position's event is recorded again only after the training stream has
  enqueued its wait on it.  Device tensors come from torch's caching
  allocator and are marked used by the consuming stream (``record_stream``),
  so a batch the model keeps stays valid;
* **conversions run on the device** (uint8 crosses the bus): ``dtype``
  (uint8, float16, bfloat16, float32), ``layout`` (``"NHWC"`` as stored,
  ``"NCHW"``, ``"channels_last"``: NCHW shape, NHWC memory) and ``mean`` /
  ``std`` normalisation (:func:`convert`).

``device="cpu"`` (or any non-CUDA device) runs the same pipeline -- upload
thread, ring, conversions, one copy into fresh tensors standing for the
upload -- without streams, events or pinning, which only a CUDA device has.

``drop_remainder=True`` on the stream gives every batch the same shape, which
CUDA graphs and ``torch.compile(mode="reduce-overhead")`` need.

Threads (``upload="thread"``; inline, none): one upload thread per pass (``iter``), started by the first ``next``
and stopped by the next ``iter``, by the iterator's ``close()`` or garbage
collection, by :meth:`DeviceIterable.close` and by ``stream.close()`` (it
polls the stream's state every :data:`~h5stream._wait.POLL_S`).  The thread holds the stream
but nothing holds the thread's iterator, so dropping the iterator stops it.
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
from h5stream._wait import Channel, Stopped
from h5stream.adapters._passes import passes_for
from h5stream.errors import ConfigError, ReaderError, StreamClosedError

torch = _deps.torch()
from torch.utils.data import IterableDataset  # noqa: E402 - after the guarded import of torch

from h5stream.adapters._devices import unavailable  # noqa: E402 - imports torch too

HOST_SLOTS = 2
"""Host batches the upload thread holds at once (the stream's plan lets its consumer hold two)."""

DTYPES = {"uint8": torch.uint8, "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
LAYOUTS = ("NHWC", "NCHW", "channels_last")
OPTIONS = ("dtype", "layout", "mean", "std", "batches_ahead", "upload")
UPLOADS = ("inline", "thread")
"""``upload=``: ``"inline"`` (the default), the training loop's own ``next()`` issues the uploads of the batches
ahead (no thread: no GIL hand-over per batch); ``"thread"``, an upload thread of h5stream's takes each batch and
issues its copy (it keeps uploading while the training loop is busy, should the stream ever be slow to hand a batch
over).  On an H200 with ResNet-18 (launch-bound: the training thread is the bottleneck), inline cost the training
process 0.57 CPU-ms per batch against 0.84 for the thread, with the feeder."""


@dataclass(frozen=True)
class DeviceOptions:
    """What :func:`convert` does and where; made by :func:`device_options`, which validates."""

    device: torch.device
    dtype: torch.dtype | None = None  # None: as the stream yields (float32 when normalising)
    layout: str = "NHWC"
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    batches_ahead: int = 2
    upload: str = "inline"

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def ring(self) -> int:
        """Device positions: ``batches_ahead`` queued, one uploading, one in the training loop's hands."""
        return self.batches_ahead + 2


def device_options(device, *, dtype=None, layout="NHWC", mean=None, std=None, batches_ahead=2, upload="inline",
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
    if upload not in UPLOADS:
        raise ConfigError(f"{caller}(upload={upload!r}): choose one of {list(UPLOADS)}")
    return DeviceOptions(dev, dtype, layout, mean, std, int(batches_ahead), upload)


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


# -- page-locked memory ---------------------------------------------------------------------------------------
def owner_array(a: np.ndarray) -> np.ndarray:
    """The outermost ndarray ``a``'s memory belongs to: follow ``.base`` while it is an ndarray.  Its data is
    the allocation (numpy's own, or the mapping of a shared-memory segment) that ``a`` views."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class HostPins:
    """Registers the stream's batch memory with ``cudaHostRegister``, once per allocation.

    ``register`` / ``unregister`` are ``(ptr, nbytes) -> None`` and
    ``ptr -> None`` (``cudaHostRegister`` / ``cudaHostUnregister`` by
    default; tests pass recorders).  An allocation is registered the first
    time a batch lies in it and unregistered just before it is freed (a
    ``weakref.finalize`` on its owning array, which numpy runs before it
    frees the memory; the upload thread holds a batch until its copy
    finished, so no copy reads freed memory), or at :meth:`close`.  Used by
    the upload thread; ``close`` by whoever closes the adapter, after the
    upload thread ended.  A failed registration is not retried: that
    allocation is copied from pageable memory (correct, only slower), and
    ``failures`` counts it.
    """

    def __init__(self, register=None, unregister=None):
        if register is None:
            register, unregister = _cuda_register, _cuda_unregister
        self._register, self._unregister = register, unregister
        self._lock = threading.Lock()
        self._pins: dict[int, tuple[int, weakref.finalize | None]] = {}  # ptr -> (nbytes, finalizer)
        self.failures = 0

    def pin(self, a: np.ndarray) -> bool:
        """Make sure the allocation ``a`` lies in is registered; whether it is page-locked now."""
        owner = owner_array(a)
        ptr, nbytes = owner.ctypes.data, owner.nbytes
        if nbytes == 0:
            return False
        with self._lock:
            known = self._pins.get(ptr)
            if known is not None and known[0] >= nbytes:
                return known[1] is not None
        try:
            self._register(ptr, nbytes)
        except Exception:
            with self._lock:
                self._pins[ptr] = (nbytes, None)
                self.failures += 1
            return False
        fin = weakref.finalize(owner, self._forget, ptr)
        fin.atexit = False  # at exit the process's mappings go with it
        with self._lock:
            self._pins[ptr] = (nbytes, fin)
        return True

    def _forget(self, ptr: int) -> None:
        with self._lock:
            entry = self._pins.pop(ptr, None)
        if entry is not None and entry[1] is not None:
            try:
                self._unregister(ptr)
            except Exception:  # noqa: S110 - a context already torn down at exit has nothing left to unregister
                pass

    @property
    def pinned(self) -> dict[int, int]:
        """``ptr -> nbytes`` of the allocations registered now."""
        with self._lock:
            return {p: n for p, (n, fin) in self._pins.items() if fin is not None}

    def close(self) -> None:
        """Unregister everything (idempotent)."""
        with self._lock:
            entries = list(self._pins.items())
            self._pins.clear()
        for ptr, (_, fin) in entries:
            if fin is not None:
                fin.detach()
                try:
                    self._unregister(ptr)
                except Exception:  # noqa: S110 - see _forget
                    pass


def _cuda_register(ptr: int, nbytes: int) -> None:
    # cudaHostRegisterDefault (0): page-locked, usable by every context of this process.
    torch.cuda.check_error(torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0))


def _cuda_unregister(ptr: int) -> None:
    torch.cuda.check_error(torch.cuda.cudart().cudaHostUnregister(ptr))


# -- the upload thread ----------------------------------------------------------------------------------------
@dataclass
class _Ready:
    """One uploaded batch: tensors on the device and (CUDA) the event its conversion recorded."""

    x: object
    y: object
    event: object = None


END = object()


class _Uploader:
    """The upload thread of one pass, and the ring it uploads through.  Owns the thread; stopped by
    :meth:`close` (any thread; idempotent)."""

    def __init__(self, passes, pass_id: int, opts: DeviceOptions, pins: HostPins | None, cuda_stream, stats: dict):
        self._cpu_before = stats["upload_cpu_s"]  # earlier passes' threads
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
        self._start()

    def _start(self) -> None:
        self._queue = Channel(self._opts.batches_ahead)
        self._thread = threading.Thread(target=self._run, name="h5stream-upload", daemon=True)
        self._thread.start()

    def _upload_next(self, k: int) -> _Ready | None:
        """The stream's next batch uploaded as batch ``k``, or None at the end of the pass.  The uploading thread
        (the upload thread, or the consumer's inline)."""
        batch = self._passes.next_batch(self._pass_id)
        if batch is None:
            return None
        x, y = batch if isinstance(batch, tuple) else (batch, None)  # label_mode=None: images alone
        ready = self._upload(x, y, k)
        self._stats["batches"] += 1
        return ready

    # -- upload thread ------------------------------------------------------------------------------------
    def _run(self) -> None:
        t_cpu = time.thread_time()
        k = 0
        try:
            while not self._stop.is_set():
                ready = self._upload_next(k)
                if ready is None:
                    self._put(END)
                    return
                self._stats["upload_cpu_s"] = self._cpu_before + time.thread_time() - t_cpu
                if not self._put(ready):
                    return
                k += 1
        except BaseException as exc:  # handed to the consumer, which raises it
            self._put(exc)
        finally:
            self._release_host()

    def _upload(self, x: np.ndarray, y: np.ndarray | None, k: int) -> _Ready:
        """Batch ``k`` on the device (``y`` None: a stream without labels).  Upload thread."""
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

    def _put(self, item) -> bool:
        """Queue ``item`` for the consumer; False once stopped or the stream closed.  Upload thread."""
        try:
            self._queue.put(item, check=self._check_stop)
        except Stopped:
            return False
        return True

    def _check_stop(self) -> None:
        if self._stop.is_set() or self._stream.closed:
            raise Stopped

    def _release_host(self) -> None:
        if self._copied_events is not None:
            for ev in self._copied_events:
                ev.synchronize()
        self._held = [None] * HOST_SLOTS

    # -- consumer side ------------------------------------------------------------------------------------
    def get(self):
        """The next :class:`_Ready`, ``END``, or raises what the upload thread raised.  In the consumer's
        thread."""
        deadline = time.monotonic() + self._stream.timeout_s
        t0 = time.perf_counter()
        try:
            item = self._queue.get(deadline=deadline, check=self._check_consumer)
        except TimeoutError:
            raise ReaderError(f"{self._stream.meta.path}: no uploaded batch in {self._stream.timeout_s:.0f}"
                              " s; raise timeout_s if reading is that slow") from None
        self._stats["wait_s"] += time.perf_counter() - t0
        if isinstance(item, BaseException):
            raise item
        return item

    def _check_consumer(self) -> None:
        """Consumer thread, while :meth:`get` waits: the stream closed, or the thread ended with nothing queued."""
        if self._stream.closed:
            raise StreamClosedError(f"{self._stream.meta.path}: the stream was closed while the torch "
                                    "adapter waited for a batch")
        if not self._thread.is_alive() and self._queue.empty():
            raise ReaderError(f"{self._stream.meta.path}: the upload thread ended without a batch or an error")

    def close(self) -> None:
        """Stop the thread and wait for it (it ends within a batch and a poll).  Any thread."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


class _InlineUploader(_Uploader):
    """``upload="inline"``: the same ring, filled by the consumer's own :meth:`get` (no thread).  Each ``get``
    issues the uploads of the batches ahead (up to ``batches_ahead`` waiting), then hands over the oldest: its copy
    and conversion were queued on the upload stream one or more ``next()`` calls earlier, so they ran while the
    model computed.  The training thread pays the launches, and no other thread of the training process takes
    the GIL per batch.  An error of the stream is raised after the batches uploaded before it.  All in the
    consumer's thread."""

    def _start(self) -> None:
        self._pending: collections.deque = collections.deque()
        self._k = 0
        self._done = False
        self._error: BaseException | None = None
        self._cpu_s = 0.0

    def _fill(self) -> None:
        """Issue uploads until ``batches_ahead`` wait, the pass ended, or it failed (kept for after them)."""
        t_cpu = time.thread_time()
        try:
            while not self._done and len(self._pending) < self._opts.batches_ahead:
                ready = self._upload_next(self._k)
                if ready is None:
                    self._done = True
                    break
                self._pending.append(ready)
                self._k += 1
        except Exception as exc:  # raised once the batches before it are handed over
            self._error, self._done = exc, True
        finally:
            self._cpu_s += time.thread_time() - t_cpu
            self._stats["upload_cpu_s"] = self._cpu_before + self._cpu_s

    def get(self):
        """The next :class:`_Ready` or ``END``; raises the stream's error after the batches before it.  In the
        consumer's thread."""
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
        """Let go of the host batches once their copies finished.  Idempotent; any thread, as the thread
        uploader's (but not while :meth:`get` runs)."""
        if not self._stop.is_set():
            self._stop.set()
            self._pending.clear()
            self._release_host()

    @property
    def alive(self) -> bool:
        return False


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
    with ``num_workers=0``), with an upload thread per pass.  Owns that thread
    and the :class:`HostPins`; ``close()`` (idempotent) stops the thread and
    unregisters; dropping the dataset and its iterators does the same.
    """

    def __init__(self, stream, opts: DeviceOptions):
        super().__init__()
        self.stream = stream
        self.options = opts
        self._passes = passes_for(stream)
        self._state = DeviceState(opts)
        self._finalizer = weakref.finalize(self, self._state.close)

    def __len__(self) -> int:
        return self._passes.n

    def __iter__(self):
        from h5stream.adapters.torch import check_iteration

        check_iteration(self, 2)
        self._state.stop_uploader()  # a new pass replaces the live one, as a new iter(stream) does
        return self._batches()

    def _batches(self):
        state = self._state
        if state.closed:
            raise StreamClosedError(f"{self.stream.meta.path}: this torch dataset is closed")
        uploader = state.start(self._passes, self._passes.begin_pass())
        try:
            while True:
                item = uploader.get()
                if item is END:
                    return
                yield hand_over(item, self.options)
        finally:
            state.stop_uploader(uploader)

    def stats(self) -> dict:
        """``batches`` uploaded, ``wait_s`` the training loop waited for them, ``upload_cpu_s`` CPU time of the
        upload threads (``upload_copy_cpu_s`` of it: copying and converting on a host device), ``pinned_bytes``
        registered now, ``pin_failures``."""
        return self._state.snapshot()

    def close(self) -> None:
        """Stop the upload thread and unregister the page-locked memory.  Idempotent; the stream stays open."""
        self._finalizer()

    def __getstate__(self):
        raise ConfigError("an h5stream torch dataset cannot be pickled; use DataLoader(ds, batch_size=None, "
                          "num_workers=0)")


class DeviceState:
    """What a device dataset (:class:`DeviceIterable`, the Keras adapter's ``DeviceBatches``) owns: its upload
    thread of the moment, the page-locked registrations, the CUDA stream and the counters; kept apart from the
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
            kind = _InlineUploader if self.opts.upload == "inline" else _Uploader
            up = kind(passes, pass_id, self.opts, self.pins, self.cuda_stream, self.stats)
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
        up = self.uploader
        s["upload_alive"] = up is not None and up.alive
        return s

    def close(self) -> None:
        self.closed = True
        self.stop_uploader()
        if self.pins is not None:
            self.pins.close()
