"""Augmenting stream vs. ImageDataGenerator and tf.data, in one run, with the pipeline's targets.

For each size (128x128x3, then 32x32x3), with ``Augment.preset("standard")``
(rotation 45, shifts 0.1, zoom [0.8, 1], channel shift 20, horizontal flip,
fill nearest), on the same images:

1. **keras idg** -- ``ImageDataGenerator(**standard).flow(x, y, batch_size=32)``
   over rows held in memory (one core: scipy / numpy run single-threaded),
   one pass per round of the stream measurements (median).
   Also the ``standard`` Augment alone: one core, and 1 vs 2 independent
   processes (no I/O, no IPC) -- how far two cores of this machine scale
   pure augmentation, the ceiling for the 2-worker / 1-worker ratio.
2. **stream wN** -- ``h5stream.open(store, augment=..., workers=N)`` end to end
   (read + shuffle + augment), N = 0, 1, 2, warm page cache.
3. **cold** -- the same stream with 2 workers while
   :class:`~h5stream.measure.PeriodicEvictor` keeps the file out of the page
   cache (as ``h5stream bench --cold`` does), vs. ``tf.data`` from the JPEG
   folder: ``keras.utils.image_dataset_from_directory`` mapped through
   RandomFlip / RandomRotation / RandomZoom / RandomTranslation (fill nearest;
   no channel shift: Keras has no such layer, which flatters tf.data) and
   prefetched, with the JPEGs evicted before each pass.
4. **stall** -- a consumer that sleeps a fixed time per batch (a simulated
   GPU step) set to half the cold stream's measured capacity; the share of
   wall time it waits for data, from ``stream.stats()["wait_s"]`` and from its
   own clock around ``next()``.

The JPEG folders come from :mod:`benchmarks.data` (photo-like ~500x375 JPEGs
for the 128 table, the ingest benchmark's; 32x32 JPEGs for the CIFAR-size
table) and are ingested with h5stream's own ingest, so every pipeline sees the
same images; all of it is cached under ``--data``.  Stream rates are images/s
in the epochs after the first (a training run's steady rate); the first batch
(start-up) and the first epoch (first touch of every buffer) are timed apart
and shown in the note column; medians of interleaved passes.
ImageDataGenerator runs in a subprocess that imports TensorFlow before any
stream is timed and then makes one pass at the start of every round, so it is
sampled under the same drift of the machine as the streams it is compared
with; TensorFlow is imported into this process only after every stream
measurement (for the tf.data baseline), so its thread pools never share the
cores with a stream.  No library is pinned to one thread: the pipelines get
the machine as a user's would.

Usage::

    python -m benchmarks.pipeline                 # both tables (minutes on 2 cores; the first run makes the data)
    python -m benchmarks.pipeline --json          # one JSON object
    python -m benchmarks.pipeline --quick         # tiny and fast, for trying it out and the test
"""

from __future__ import annotations

import contextlib
import itertools
import os
import platform
import statistics
import sys
import time

import numpy as np

from benchmarks.augment import BATCH_SIZE, PRESET, measure_transform, measure_transform_processes
from benchmarks.data import ensure_folder, ensure_store, read_rows
from benchmarks.harness import (add_data_option, add_json_option, available_cores, by_name, cores_busy, cpu_seconds,
                                emit, interleave, kept_cold, log, new_parser, probe_cores, warm)
from benchmarks.keras_baselines import IdgServer, keras_available, measure_tf_folder

BUDGET = "256MiB"

TARGET_SIZE = 128
"""The targets are stated for 128x128x3 rows; other sizes are shown against them for reference only."""
TARGETS = {
    "per_core_vs_idg": 20.0,
    "w2_vs_w1": 1.7,
    "cold_vs_tf_data": 10.0,
    "stall_fraction": 0.02,
}


# -- measurements -----------------------------------------------------------------------
def endless(stream):
    """Batches of ``stream`` across epoch boundaries (each ``iter`` is one epoch)."""
    while True:
        yield from stream


def measure_stream_rate(path: str, *, workers: int, repeats: int = 3, images_per_repeat: int = 0,
                        cold: bool = False, batch_size: int = BATCH_SIZE, budget: str = BUDGET, seed: int = 0,
                        warmup_epoch: bool = True) -> dict:
    """Images/s of ``h5stream.open(path, augment=standard, workers=workers)``, shuffled, median of ``repeats``.

    One stream is opened; the first batch (worker start-up, first fill) is
    timed apart as ``first_batch_s``, and the whole first epoch (with
    ``warmup_epoch``) as ``first_epoch_images_per_s``; each repeat then times
    ``images_per_repeat`` images (default: one epoch's worth) in the
    following epochs: the steady rate of a training run.  Warm runs read
    the file once first; ``cold=True`` keeps it out of the page cache
    throughout.  Also reports CPU cores busy in this process (reader thread +
    consumer, + the transform when ``workers == 0``) and in the workers.
    """
    import h5stream
    from h5stream.measure import cached_fraction

    meta = h5stream.read_meta(path)
    per_repeat = images_per_repeat or meta.rows
    if not cold:
        warm(path)
    augment = h5stream.Augment.preset(PRESET)
    rates, main_cores, worker_cores = [], [], []
    with contextlib.ExitStack() as stack:
        evictor = stack.enter_context(kept_cold(path, cold))
        cached_at_open = cached_fraction(path)
        t_open = time.perf_counter()
        stream = stack.enter_context(h5stream.open(path, batch_size=batch_size, memory_budget=budget, shuffle=True,
                                                   seed=seed, augment=augment, workers=workers))
        epoch0 = iter(stream)
        x, _ = next(epoch0)
        first_batch_s = time.perf_counter() - t_open
        out_dtype = str(x.dtype)
        worker_pids = list(stream.stats().get("worker_pids", []))
        # The rest of the first epoch is timed apart too: it pays one-off costs (first touch of the shared
        # and recycled buffers, OpenCV's first calls); training runs many epochs, so the repeats are steady.
        t_first = time.perf_counter()
        n_first = len(x)
        if warmup_epoch:
            for x, _ in epoch0:  # the rest of epoch 0 (a new iter(stream) would leave it and start epoch 1)
                n_first += len(x)
        first_epoch_s = time.perf_counter() - t_first + first_batch_s
        batches = endless(stream) if warmup_epoch else itertools.chain(epoch0, endless(stream))
        for _ in range(repeats):
            n = 0
            cpu0 = cpu_seconds([os.getpid(), *worker_pids])
            t0 = time.perf_counter()
            while n < per_repeat:
                x, _ = next(batches)
                n += len(x)
            seconds = time.perf_counter() - t0
            cpu1 = cpu_seconds([os.getpid(), *worker_pids])
            rates.append(n / seconds)
            main_cores.append(cores_busy(cpu0, cpu1, seconds, [os.getpid()]))
            worker_cores.append(cores_busy(cpu0, cpu1, seconds, worker_pids))
        del x
        stats = stream.stats()
    return {
        "images_per_s": statistics.median(rates),
        "repeats_images_per_s": rates,
        "images_per_repeat": per_repeat,
        "first_batch_s": first_batch_s,
        "first_epoch_images_per_s": n_first / first_epoch_s if warmup_epoch else None,
        "workers": workers,
        "cold": cold,
        "cached_fraction_at_open": cached_at_open,
        "evictions": evictor.evictions if evictor is not None else 0,
        "main_process_cores": statistics.median(main_cores),
        "worker_cores": statistics.median(worker_cores),
        "read_mb_per_s": stats["read_bytes"] / 1e6 / max(stats["read_s"], 1e-9) if stats.get("read_s") else None,
        "output_dtype": out_dtype,
    }


def merge_runs(runs: list[dict]) -> dict:
    """One figure from several :func:`measure_stream_rate` results of one configuration: medians, all rates kept."""
    out = dict(runs[0])
    out["repeats_images_per_s"] = [v for r in runs for v in r["repeats_images_per_s"]]
    for key in ("images_per_s", "first_batch_s", "main_process_cores", "worker_cores"):
        out[key] = statistics.median(r[key] for r in runs)
    firsts = [r["first_epoch_images_per_s"] for r in runs if r.get("first_epoch_images_per_s")]
    out["first_epoch_images_per_s"] = statistics.median(firsts) if firsts else None
    out["statistic"] = f"median of {len(runs)} interleaved runs"
    return out


def measure_interleaved(path: str, configs: dict[str, dict], *, rounds: int, images_per_repeat: int = 0,
                        warmup_epoch: bool = True, between=None) -> dict:
    """:func:`measure_stream_rate` for every configuration (name -> keyword arguments), round after round.

    Interleaving puts every configuration under the same mix of load from
    other users of the machine, so their ratios hold even when the absolute
    figures drift.  ``between()``, if given, runs at the start of every round
    (another measurement sampled in the same rounds: ImageDataGenerator).
    Returns name -> :func:`merge_runs` of its runs.
    """
    def before_round(i: int) -> None:
        if between is not None:
            log(f"  round {i + 1}/{rounds}: keras idg")
            between()

    measurements = {name: (lambda kwargs=kwargs: measure_stream_rate(
        path, repeats=1, images_per_repeat=images_per_repeat, warmup_epoch=warmup_epoch, **kwargs))
        for name, kwargs in configs.items()}
    runs = by_name(interleave(measurements, rounds, before_round=before_round, progress=True))
    return {name: merge_runs(r) for name, r in runs.items()}


def measure_stall(path: str, *, workers: int, step_s: float, batches: int, cold: bool = True, augment=None,
                  batch_size: int = BATCH_SIZE, budget: str = BUDGET, seed: int = 0) -> dict:
    """A consumer that spends ``step_s`` per batch (sleeping: a simulated GPU step) on the augmenting stream.

    After the first batch (start-up, excluded), ``batches`` batches are
    consumed.  Waiting is measured two ways: the stream's own
    ``stats()["wait_s"]`` (time blocked on the reader / the pool) and this
    consumer's clock around every ``next()`` (that plus the copy out of shared
    memory and the generator's overhead).  Fractions are of the wall time.
    ``augment`` defaults to the ``standard`` preset.
    """
    import h5stream

    if augment is None:
        augment = h5stream.Augment.preset(PRESET)
    waits = np.zeros(batches)
    with contextlib.ExitStack() as stack:
        stack.enter_context(kept_cold(path, cold))
        stream = stack.enter_context(h5stream.open(path, batch_size=batch_size, memory_budget=budget, shuffle=True,
                                                   seed=seed, augment=augment, workers=workers))
        it = endless(stream)
        next(it)
        stats_wait0 = stream.stats()["wait_s"]
        images = 0
        t_start = time.perf_counter()
        for i in range(batches):
            t0 = time.perf_counter()
            x, _ = next(it)
            waits[i] = time.perf_counter() - t0
            images += len(x)
            del x
            time.sleep(step_s)
        wall_s = time.perf_counter() - t_start
        stats_wait_s = stream.stats()["wait_s"] - stats_wait0
    own_wait_s = float(waits.sum())
    return {
        "step_s": step_s,
        "batches": batches,
        "images": images,
        "wall_s": wall_s,
        "consumer_images_per_s": images / wall_s,
        "stats_wait_s": stats_wait_s,
        "own_wait_s": own_wait_s,
        "stats_wait_fraction": stats_wait_s / wall_s,
        "own_wait_fraction": own_wait_s / wall_s,
        # In next() but not blocked: the copy out of the shared-memory slot, queue bookkeeping, the GIL.
        "handoff_s": max(0.0, own_wait_s - stats_wait_s),
        "own_wait_median_ms": float(np.median(waits) * 1e3),
        "own_wait_p99_ms": float(np.percentile(waits, 99) * 1e3),
        "own_wait_max_ms": float(waits.max() * 1e3),
        "workers": workers,
        "cold": cold,
    }


# -- the run ----------------------------------------------------------------------------
def config(quick: bool) -> dict:
    """Sizes of the run: images per folder, IDG rows, images per timed repeat, stall length."""
    if quick:
        return {"images": {128: 64, 32: 64}, "idg_rows": 64, "repeat_images": 0, "repeats": 1,
                "stall_s": 0.3, "tf_repeats": 1}
    # Several epochs of the store per timed repeat, so each lasts seconds; 5 interleaved repeats.
    return {"images": {128: 3000, 32: 6000}, "idg_rows": {128: 512, 32: 2048},
            "repeat_images": {128: 12000, 32: 30000}, "repeats": 5, "stall_s": 4.0, "tf_repeats": 3}


def _per_size(value, size):
    return value[size] if isinstance(value, dict) else value


def run(sizes, *, data_dir: str, quick: bool = False, workers_list=(0, 1, 2)) -> dict:
    """Every measurement for every size; the ``--json`` object."""
    cfg = config(quick)
    os.makedirs(data_dir, exist_ok=True)
    result = {
        "preset": PRESET,
        "batch_size": BATCH_SIZE,
        "memory_budget": BUDGET,
        "cpu": platform.processor() or platform.machine(),
        "cores": available_cores(),
        "quick": quick,
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "sizes": {},
    }
    t_run = time.perf_counter()
    result["cores_available_at_start"] = probe_cores()
    prepared = {}
    # Phase 1: data and every stream measurement, before TensorFlow is imported.
    for size in sizes:
        folder, source = ensure_folder(data_dir, _per_size(cfg["images"], size), size)
        store = ensure_store(data_dir, folder, size)
        prepared[size] = (folder, store)
        import h5stream

        rows = h5stream.read_meta(store).rows
        r = result["sizes"][str(size)] = {"rows": rows, "source": source, "folder": folder, "store": store}
        log(f"{size}px: Augment alone, one core")
        r["transform_1core"] = measure_transform(read_rows(store, _per_size(cfg["idg_rows"], size))[0],
                                                 repeats=cfg["repeats"])
        if not quick:
            log(f"{size}px: Augment alone, 1 and 2 processes")
            r["transform_processes"] = measure_transform_processes(
                read_rows(store, _per_size(cfg["idg_rows"], size))[0])
        per_repeat = _per_size(cfg["repeat_images"], size)
        configs = {f"w{w}": {"workers": w} for w in workers_list}
        # Diagnostic: 4x fewer, larger batches separate per-batch costs (IPC, wake-ups) from per-image work.
        configs.update({f"w{w}_batch128": {"workers": w, "batch_size": 128} for w in (1, 2)})
        configs["cold_w2"] = {"workers": 2, "cold": True}
        idg_server = None
        if keras_available():
            log(f"{size}px: starting keras ImageDataGenerator (a subprocess, sampled in every round)")
            idg_server = IdgServer(store, _per_size(cfg["idg_rows"], size))
        log(f"{size}px: streams {', '.join(configs)}")
        try:
            measured = measure_interleaved(store, configs, rounds=cfg["repeats"], images_per_repeat=per_repeat,
                                           warmup_epoch=not quick,
                                           between=idg_server.measure if idg_server is not None else None)
        finally:
            if idg_server is not None:
                idg_server.close()
        r["idg"] = idg_server.result() if idg_server is not None else None
        r["stream_warm"] = {str(w): measured[f"w{w}"] for w in workers_list}
        r["stream_warm_batch128"] = {str(w): measured[f"w{w}_batch128"] for w in (1, 2)}
        r["stream_cold"] = measured["cold_w2"]
        r["cores_available_after_streams"] = probe_cores()
        capacity = r["stream_cold"]["images_per_s"]
        step_s = 2 * BATCH_SIZE / capacity  # the consumer takes twice the pipeline's time per batch
        batches = max(20, int(cfg["stall_s"] / step_s))
        log(f"{size}px: stall, step {step_s * 1e3:.2f} ms x {batches} batches")
        r["stall"] = measure_stall(store, workers=2, step_s=step_s, batches=batches, cold=True)
        r["stall"]["capacity_images_per_s"] = capacity
    # Phase 2: tf.data in this process (TensorFlow's thread pools exist from here on).
    for size in sizes:
        folder, store = prepared[size]
        r = result["sizes"][str(size)]
        if not keras_available():
            r["tf_data"] = None
            continue
        log(f"{size}px: tf.data from the JPEG folder (cold)")
        r["tf_data"] = measure_tf_folder(folder, size, repeats=cfg["tf_repeats"], cold=True)
    for size in sizes:
        r = result["sizes"][str(size)]
        r["ratios"] = ratios(r)
        r["targets"] = [{**t, "applies": size == TARGET_SIZE} for t in targets(r)]
    result["cores_available_at_end"] = probe_cores()
    result["seconds"] = time.perf_counter() - t_run
    return result


def ratios(r: dict) -> dict:
    w = r["stream_warm"]
    idg = (r.get("idg") or {}).get("images_per_s")
    tf_rate = (r.get("tf_data") or {}).get("images_per_s")
    out = {}
    if idg:
        out["transform_vs_idg"] = r["transform_1core"]["images_per_s"] / idg
        out["transform_batched_vs_idg"] = r["transform_1core"]["batched_images_per_s"] / idg
        for k, v in w.items():
            out[f"w{k}_vs_idg"] = v["images_per_s"] / idg
    if "1" in w and "2" in w:
        out["w2_vs_w1"] = w["2"]["images_per_s"] / w["1"]["images_per_s"]
        # How much more CPU the workers got with two than with one: the most w2_vs_w1 could be here.
        if w["1"]["worker_cores"] > 0:
            out["w2_vs_w1_worker_cores"] = w["2"]["worker_cores"] / w["1"]["worker_cores"]
    big = r.get("stream_warm_batch128") or {}
    if "1" in big and "2" in big:
        out["w2_vs_w1_batch128"] = big["2"]["images_per_s"] / big["1"]["images_per_s"]
    if tf_rate:
        out["cold_vs_tf_data"] = r["stream_cold"]["images_per_s"] / tf_rate
    return out


def targets(r: dict) -> list[dict]:
    """The targets: name, figure, target, met."""
    q = r["ratios"]
    out = []

    def add(name, value, target, met):
        out.append({"name": name, "value": value, "target": target, "met": bool(met)})

    if "transform_vs_idg" in q:
        add("Augment alone (1 core, no I/O) vs ImageDataGenerator", q["transform_vs_idg"], TARGETS["per_core_vs_idg"],
            q["transform_vs_idg"] >= TARGETS["per_core_vs_idg"])
    if "w1_vs_idg" in q:
        add("per core (1 worker) vs ImageDataGenerator", q["w1_vs_idg"], TARGETS["per_core_vs_idg"],
            q["w1_vs_idg"] >= TARGETS["per_core_vs_idg"])
    if "1" in r["stream_warm"]:
        v = r["stream_warm"]["1"]["images_per_s"]
        add("1 worker images/s", v, 10000.0, v >= 10000)
    if "w2_vs_w1" in q:
        add("2 workers / 1 worker", q["w2_vs_w1"], TARGETS["w2_vs_w1"], q["w2_vs_w1"] >= TARGETS["w2_vs_w1"])
    if "cold_vs_tf_data" in q:
        add("cold stream (2 workers) vs tf.data JPEG folder", q["cold_vs_tf_data"], TARGETS["cold_vs_tf_data"],
            q["cold_vs_tf_data"] >= TARGETS["cold_vs_tf_data"])
    s = r["stall"]
    goal = TARGETS["stall_fraction"]
    add("consumer blocked waiting for data (stats wait_s)", s["stats_wait_fraction"], goal,
        s["stats_wait_fraction"] < goal)
    add("consumer inside next() (own clock, incl. hand-off)", s["own_wait_fraction"], goal,
        s["own_wait_fraction"] < goal)
    return out


# -- output -----------------------------------------------------------------------------
def _first_note(s: dict) -> str:
    first = s.get("first_epoch_images_per_s")
    return f"first batch {s['first_batch_s']:.2f} s" + (f", first epoch {first:,.0f}/s" if first else "")


def format_table(result: dict) -> str:
    lines = [f"h5stream pipeline benchmark: preset {result['preset']}, batch {result['batch_size']}, "
             f"budget {result['memory_budget']}, {result['cores']} cores ({result['cpu']})"
             + (" [--quick]" if result["quick"] else ""),
             f"CPU this run could get (2 spinning processes): {result['cores_available_at_start']:.2f} cores at start, "
             + ", ".join(f"{r['cores_available_after_streams']:.2f} after the {k}px streams"
                         for k, r in result["sizes"].items())
             + f", {result['cores_available_at_end']:.2f} at end",
             "stream rates: medians of interleaved runs, epochs after the first (its rate is in the note); "
             "cores busy = CPU seconds / wall seconds of this process "
             "(reader thread + consumer) + the worker processes",
             ""]
    for size, r in result["sizes"].items():
        lines.append(f"{size}x{size}x3: {r['rows']} images ({r['source']} folder, ingested at {size}px)")
        lines.append(f"  {'pipeline':<44}{'images/s':>10}{'vs idg':>9}  {'cores busy (main+workers)':<27}note")
        idg = (r.get("idg") or {}).get("images_per_s")

        def row(name, rate, note="", cores="", idg=idg):
            vs = f"{rate / idg:>8.1f}x" if idg else f"{'-':>9}"
            if result["quick"] and cores:
                cores = "- (too short to sample)"
            lines.append(f"  {name:<44}{rate:>10,.0f}{vs}  {cores:<27}{note}")

        if idg:
            row("keras ImageDataGenerator.flow (in memory)", idg, f"{r['idg']['images']} rows, float32 out",
                "1 (single-threaded)")
        t1 = r["transform_1core"]
        row("h5stream Augment alone, 1 core, no I/O", t1["images_per_s"],
            f"{t1['images']} rows in one call, {t1['statistic']}", "1")
        row(f"  same, one call per {t1['batch_size']} rows", t1["batched_images_per_s"],
            "per-batch costs included", "1")
        tp = r.get("transform_processes")
        if tp:
            row(f"  same, {tp['procs']} independent processes", tp["many_images_per_s"],
                f"{tp['scaling']:.2f}x one process: the ceiling for {tp['procs']} workers here", str(tp["procs"]))
        for w, s in r["stream_warm"].items():
            row(f"h5stream stream, workers {w}, warm", s["images_per_s"], _first_note(s),
                f"{s['main_process_cores']:.2f} + {s['worker_cores']:.2f}")
        for w, s in (r.get("stream_warm_batch128") or {}).items():
            row(f"  (diagnostic) workers {w}, warm, batch 128", s["images_per_s"], "per-batch costs / 4",
                f"{s['main_process_cores']:.2f} + {s['worker_cores']:.2f}")
        c = r["stream_cold"]
        cold_note = (f"cached at open {c['cached_fraction_at_open']:.0%}, {_first_note(c)}"
                     if c["cached_fraction_at_open"] is not None else _first_note(c))
        row("h5stream stream, workers 2, COLD", c["images_per_s"], cold_note,
            f"{c['main_process_cores']:.2f} + {c['worker_cores']:.2f}")
        t = r.get("tf_data")
        if t:
            row("tf.data JPEG folder + keras layers, COLD", t["images_per_s"],
                f"first batch {t['first_batch_s']:.2f} s; all cores")
        s = r["stall"]
        lines.append(
            f"  stall: consumer step {s['step_s'] * 1e3:.2f} ms/batch "
            f"(half of {s['capacity_images_per_s']:,.0f} img/s, "
            f"cold, 2 workers), {s['batches']} batches in {s['wall_s']:.1f} s:")
        lines.append(
            f"         blocked waiting for data {s['stats_wait_fraction']:.2%} of wall time (stats()['wait_s']); "
            f"inside next() {s['own_wait_fraction']:.2%} (own clock: median {s['own_wait_median_ms']:.2f} ms, "
            f"p99 {s['own_wait_p99_ms']:.2f} ms per batch; the difference is the hand-off: "
            "queue and slot bookkeeping, the reader thread holding the GIL)")
        q = r["ratios"]
        if "w2_vs_w1" in q:
            ceiling = (r.get("transform_processes") or {}).get("scaling")
            lines.append(f"  scaling: 2 workers / 1 worker {q['w2_vs_w1']:.2f}x with batch 32 "
                         f"(the workers got {q.get('w2_vs_w1_worker_cores', float('nan')):.2f}x the CPU), "
                         f"{q.get('w2_vs_w1_batch128', float('nan')):.2f}x with batch 128"
                         + (f"; pure augmentation in 2 processes scales {ceiling:.2f}x on this machine"
                            if ceiling else ""))
        applies = any(tg.get("applies", True) for tg in r["targets"])
        lines.append("  targets:" if applies else
                     f"  targets: stated for {TARGET_SIZE}x{TARGET_SIZE}; the same checks at this size, for reference:")
        for tg in r["targets"]:
            if tg["name"].startswith("consumer"):  # fractions of wall time
                fig, goal = f"{tg['value']:.2%}", f"< {tg['target']:.0%}"
            elif tg["name"].endswith("images/s"):
                fig, goal = f"{tg['value']:,.0f}", f">= {tg['target']:,.0f}"
            else:
                fig, goal = f"{tg['value']:.2f}x", f">= {tg['target']:g}x"
            verdict = ("met   " if tg["met"] else "MISSED") if applies else ("ok    " if tg["met"] else "below ")
            lines.append(f"    {verdict} {tg['name']:<48} {fig:>9}  (target {goal})")
        lines.append("")
    lines.append(f"total {result['seconds']:.0f} s")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = new_parser(__doc__.splitlines()[0])
    add_data_option(parser)
    parser.add_argument("--sizes", default="128,32", help="square sizes, comma-separated")
    parser.add_argument("--quick", action="store_true", help="64 images per size, one repeat: seconds, not minutes")
    add_json_option(parser)
    args = parser.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes {args.sizes!r}: use comma-separated integers, e.g. 128,32")
    if not sizes or any(s < 8 for s in sizes):
        parser.error(f"--sizes {args.sizes!r}: every size must be >= 8")
    result = run(sizes, data_dir=args.data, quick=args.quick)
    result["command"] = " ".join(["python -m benchmarks.pipeline", *(argv if argv is not None else sys.argv[1:])])
    emit(result, as_json=args.json, format_text=format_table)
    return 0


if __name__ == "__main__":
    # TensorFlow reads this when it loads (late in this process, for the tf.data baseline): errors only.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.exit(main())
