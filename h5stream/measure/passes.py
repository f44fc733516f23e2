"""The passes of ``h5stream bench``: the stream, timed and sampled, and the plain-h5py baselines on the same file.

* :func:`measure_stream` -- ``--epochs`` epochs of ``h5stream.open(FILE, ...)``
  while a :class:`~h5stream.measure.ResourceSampler` records memory (sum of PSS
  of the process tree), CPU per thread / worker, and the consumer marks samples
  and queue fill; :func:`epoch_rates` turns its times into start-up, first-epoch
  and steady-state rates.
* :func:`measure_sequential` -- h5py ``read_direct`` of large chunk-aligned
  slices into one preallocated array: the ceiling for reading the file.
* :func:`measure_single_chunk` -- read ``100 x batch`` rows in file order into a
  preallocated buffer, permute them, cut batches (the chunked-PyTables article).
* :func:`measure_random_rows` -- h5py, one row per call in a random order,
  stopped after ``seconds`` and extrapolated to the epoch.

``cold``: each pass runs under a :class:`~h5stream.measure.PeriodicEvictor`
(every :data:`EVICT_INTERVAL_S`).  ``progress``: a bar on stderr when it is a
terminal.  Each pass owns what it opens and closes it before returning.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time

import numpy as np

from h5stream.order.quality import seed_entropy

SEQUENTIAL_SLICE_BYTES = 64 << 20
CHUNK_SHUFFLE_BATCHES = 100
TAU_EPOCH_PAIRS = 5
SAMPLE_INTERVAL_S = 0.05
EVICT_INTERVAL_S = 0.25


def _bar(progress: bool, total: int, desc: str, unit: str = "row"):
    from tqdm.auto import tqdm

    # disable=None: a bar only on a terminal, so --json and pipes stay clean.
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, leave=False, file=sys.stderr,
                disable=None if progress else True)


def _cold(meta, cold: bool):
    from h5stream.measure.cold import PeriodicEvictor

    return PeriodicEvictor(meta.path, EVICT_INTERVAL_S) if cold else contextlib.nullcontext()


def measure_stream(meta, *, batch_size, budget, epochs, seed, cold, augment, workers, progress,
                   interval_s=SAMPLE_INTERVAL_S, rows_per_fill=None, direct_io="auto", read_unit=None,
                   piece_bytes=None):
    """Time ``epochs`` epochs of the stream; returns (figures + orders + yielded labels, Timeline)."""
    import h5stream
    import h5stream.streaming.stream  # noqa: F401 - imported before the baseline sample, so not counted as the stream's
    from h5stream.measure.sampler import ResourceSampler, peak_rss_bytes, reset_peak_rss

    bar = _bar(progress, 0, "stream", unit="row")
    gc.collect()
    with contextlib.ExitStack() as stack:  # unwinds in reverse: stream, bar, sampler, evictor
        stack.enter_context(_cold(meta, cold))
        sampler = stack.enter_context(ResourceSampler(interval_s))  # its first sample is the baseline
        stack.callback(bar.close)
        hwm_reset = reset_peak_rss()
        rss_before = peak_rss_bytes()
        t0 = time.monotonic()
        stream = h5stream.open(meta.path, batch_size=batch_size, memory_budget=budget, shuffle=True, seed=seed,
                               augment=augment, workers=workers, rows_per_fill=rows_per_fill, direct_io=direct_io,
                               read_unit=read_unit, piece_bytes=piece_bytes)
        open_s = time.monotonic() - t0
        stack.callback(stream.close)
        bar.reset(total=epochs * stream.meta.rows)
        yielded, rows, first_batch_s, last_mark = [], 0, None, -1.0
        epoch_ends = []
        sampler.mark(samples=0)
        for epoch in range(epochs):
            for batch in stream:
                x, y = batch if isinstance(batch, tuple) else (batch, None)  # None: a store without labels
                rows += len(x)
                if epoch == 0 and y is not None:
                    yielded.append(y)
                now = time.monotonic()
                if first_batch_s is None:
                    first_batch_s = now - t0
                if now - last_mark >= interval_s / 2:
                    st = _stats(stream)
                    sampler.mark(samples=rows, queue_depth=st.get("queue_depth"),
                                 queue_capacity=st.get("queue_capacity"), consumer_wait_s=st.get("wait_s"))
                    last_mark = now
                bar.update(len(x))
                del x
            epoch_ends.append(time.monotonic() - t0)
            sampler.mark(samples=rows, epoch_end=epoch + 1)
        seconds = time.monotonic() - t0
        sampler.mark(samples=rows)
        rss_peak = peak_rss_bytes()
        timeline = sampler.stop()  # what follows (epoch orders) is the benchmark's memory, not the stream's
        plan = stream.plan.as_dict() if hasattr(stream.plan, "as_dict") else dict(vars(stream.plan))
        stats = _stats(stream)
        orders = [stream.epoch_order(e) for e in range(TAU_EPOCH_PAIRS + 1)]
    baseline = int(timeline.mem_bytes[0]) if timeline.mem_bytes.size else 0
    figures = {
        "samples_per_s": rows / seconds,
        "mb_per_s": rows * meta.row_bytes / seconds / 1e6,
        "seconds": seconds,
        **epoch_rates(meta.rows, meta.row_bytes, epoch_ends, open_s, first_batch_s),
        "rows_streamed": rows,
        "baseline_mem_bytes": baseline,
        "peak_mem_bytes": max(0, timeline.peak_mem_bytes - baseline),
        "peak_rss_delta_bytes": (rss_peak - rss_before) if hwm_reset and rss_peak and rss_before else None,
        "mem_samples": int(timeline.mem_bytes.size),
        "mean_cpu_pct": timeline.mean_cpu_pct(),
        "plan": plan,
        "stream_stats": {k: v for k, v in stats.items() if isinstance(v, (int, float))},
        "orders": orders,
        "yielded_labels": np.concatenate(yielded) if yielded else np.zeros(0),
    }
    figures["within_budget"] = figures["peak_mem_bytes"] <= int(plan["budget_bytes"])  # the default budget too
    return figures, timeline


def epoch_rates(rows: int, row_bytes: int, epoch_ends, open_s: float, first_batch_s: float) -> dict:
    """Start-up, first-epoch and steady-state figures from the times (since ``open()`` was called) at which
    ``open()`` returned, the first batch came and each epoch ended.

    ``startup_s`` is ``open()`` itself (metadata, plan, buffers, worker processes); the first epoch's rate is
    given with it and without it; ``steady_samples_per_s`` is the rate of epochs 2+ (None with one epoch).
    ``compare_samples_per_s`` is the one to set against the baselines, each of which times one pass over a
    file it has already opened: the steady rate, or with one epoch, epoch 1 from the moment ``open()``
    returned (its first fill is read then, as a baseline reads its first rows); ``compare_basis`` names it.
    """
    first = epoch_ends[0]
    after_open = rows / (first - open_s) if first > open_s else None
    steady = rows * (len(epoch_ends) - 1) / (epoch_ends[-1] - first) if len(epoch_ends) > 1 else None
    basis = "epochs 2+" if steady else "epoch 1 after open()"
    compare = steady or after_open or rows / first
    return {
        "startup_s": open_s,
        "first_batch_s": first_batch_s,
        "epoch_seconds": list(np.diff([0.0, *epoch_ends])),
        "first_epoch_s": first,
        "first_epoch_samples_per_s": rows / first,
        "first_epoch_after_open_samples_per_s": after_open,
        # Epochs after the first: no start-up (first touch of the budget's memory, the first fill).
        "steady_samples_per_s": steady,
        "steady_mb_per_s": steady * row_bytes / 1e6 if steady else None,
        "compare_samples_per_s": compare,
        "compare_mb_per_s": compare * row_bytes / 1e6,
        "compare_basis": basis,
    }


def _stats(stream) -> dict:
    stats = getattr(stream, "stats", None)
    try:
        return dict(stats()) if callable(stats) else {}
    except Exception:  # monitoring must never fail the measurement
        return {}


def measure_sequential(meta, *, cold, progress) -> dict:
    """The ceiling: read every row in file order, ``read_direct`` into one preallocated array."""
    from h5stream.store import schema
    from h5stream.store.access import open_h5_readonly

    slice_rows = max(meta.block_rows, SEQUENTIAL_SLICE_BYTES // meta.row_bytes // meta.block_rows * meta.block_rows)
    slice_rows = min(slice_rows, meta.rows)
    buf = np.empty((slice_rows, *meta.image_shape), dtype=np.uint8)
    bar = _bar(progress, meta.rows, "sequential")
    with _cold(meta, cold), open_h5_readonly(meta.path, native_driver=True) as f:
        images = f[schema.IMAGES]
        t0 = time.monotonic()
        for start in range(0, meta.rows, slice_rows):
            m = min(slice_rows, meta.rows - start)
            images.read_direct(buf, np.s_[start:start + m], np.s_[0:m])
            bar.update(m)
        seconds = time.monotonic() - t0
    bar.close()
    return {"sequential_samples_per_s": meta.rows / seconds,
            "sequential_mb_per_s": meta.rows * meta.row_bytes / seconds / 1e6, "sequential_slice_rows": slice_rows}


def measure_single_chunk(meta, batch_size, *, seed, cold, progress) -> dict:
    """Read ``100 x batch`` rows in order into a buffer, permute them, cut (copied) batches; whole file."""
    from h5stream.store import schema
    from h5stream.store.access import open_h5_readonly

    chunk_rows = min(meta.rows, CHUNK_SHUFFLE_BATCHES * batch_size)
    buf = np.empty((chunk_rows, *meta.image_shape), dtype=np.uint8)
    rng = np.random.default_rng([seed_entropy(seed), 0])
    bar = _bar(progress, meta.rows, "single chunk")
    with _cold(meta, cold), open_h5_readonly(meta.path, native_driver=True) as f:
        images, labels = f[schema.IMAGES], f[schema.LABELS]
        t0 = time.monotonic()
        for start in range(0, meta.rows, chunk_rows):
            m = min(chunk_rows, meta.rows - start)
            images.read_direct(buf, np.s_[start:start + m], np.s_[0:m])
            chunk_labels = labels[start:start + m]
            perm = rng.permutation(m)
            for b in range(0, m, batch_size):
                idx = perm[b:b + batch_size]
                x, y = buf[idx], chunk_labels[idx]  # a batch the caller owns, as a generator would yield
            bar.update(m)
        seconds = time.monotonic() - t0
    bar.close()
    del x, y
    return {"single_chunk_shuffle_samples_per_s": meta.rows / seconds,
            "single_chunk_shuffle_mb_per_s": meta.rows * meta.row_bytes / seconds / 1e6,
            "single_chunk_rows": chunk_rows}


def measure_random_rows(meta, *, seed, seconds, cold, progress) -> dict:
    """h5py, one ``images[i]`` / ``labels[i]`` call per row in a random order, for at most ``seconds``.

    Stops after ``seconds`` (or the whole file); the rate is rows read / time
    taken, and the epoch time is extrapolated from it, which the result says.
    """
    from h5stream.store import schema
    from h5stream.store.access import open_h5_readonly

    order = np.random.default_rng([seed_entropy(seed), 1]).permutation(meta.rows)
    bar = _bar(progress, meta.rows, "random rows")
    done = 0
    with _cold(meta, cold), open_h5_readonly(meta.path, native_driver=True) as f:
        images, labels = f[schema.IMAGES], f[schema.LABELS]
        t0 = time.monotonic()
        deadline = t0 + seconds
        for i in order:
            _row, _label = images[i], labels[i]  # one h5py read per call: the baseline itself
            done += 1
            if done % 64 == 0:
                bar.update(64)
                if time.monotonic() >= deadline:
                    break
        elapsed = time.monotonic() - t0
    bar.close()
    rate = done / elapsed
    return {"random_row_samples_per_s": rate, "random_row_mb_per_s": rate * meta.row_bytes / 1e6,
            "random_row_rows_measured": done, "random_row_seconds_measured": elapsed,
            "random_row_extrapolated": done < meta.rows, "random_row_epoch_s_estimated": meta.rows / rate}
