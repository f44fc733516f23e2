"""Feeding a torch training loop: the same run, the same model, five ways of getting the batches there.

    python -m benchmarks.gpu                            # device cuda if torch sees one, else cpu
    python -m benchmarks.gpu --rows 2048 --size 32 --steps 60 --json

Loaders, each for ``--steps`` training steps of the same model:

* ``limit`` -- one batch already on the device, reused: the model alone;
* ``ram`` -- the whole array in RAM, shuffled batches sliced and copied up;
* ``h5stream cpu`` -- ``stream.torch()``: CPU tensors, converted and copied up
  in the training loop;
* ``h5stream device`` -- ``stream.torch(device=...)``: uploaded ahead (the
  training loop's ``next()`` issues the copies of the batches ahead) and converted
  on the device;
* ``torchvision`` -- ``ImageFolder`` + ``DataLoader(pin_memory=True)`` over
  ``--tv-images`` JPEGs already at ``--size`` (decoded, augmented alike, cycled),
  if torchvision is installed (otherwise the row says so).

Per loader: images/s, its ratio to the limit, cores busy (this process's CPU
time plus its children's, over wall time) and, on a GPU with NVML
(``pynvml``), mean GPU utilisation.

Without a GPU the model is a small CNN on CPU, and two more figures say what
h5stream costs the training process: the CPU milliseconds per batch of
h5stream's threads in it (each thread's own CPU clock), and the rate of a
pure-Python stand-in training step (which holds the GIL, as Python training
code does) while the stream feeds it, against its rate alone.

On any device, a table of h5stream's CPU in the training process per batch,
thread by thread (:func:`thread_breakdown`), for ``--breakdown-workers`` x
``--breakdown-batches``: the ``next()`` calls in the training thread, the
reader thread, its I/O threads and the pool's collector thread (builds that have one),
over a whole epoch in steady state, with workers both without and with ``open(..., feeder=True)`` (the reader
and the pool in a process of their own).  ``--workers N`` makes every h5stream row augment in N workers
(:data:`AUGMENT`) and torchvision's row augment alike, and adds the row "h5stream device feeder".
``--breakdown-only`` prints just the per-thread table::

    python -m benchmarks.gpu --breakdown-only --rows 16384 --size 64 --torch-threads 1
"""

from __future__ import annotations

import os
import sys
import threading
import time

from benchmarks.harness import log, new_parser, run_cli

MEAN, STD = 127.5, 64.0

#: The augmentation of every augmenting loader (h5stream's ``Augment`` and torchvision's transforms alike).
AUGMENT = dict(rotation_range=15, width_shift_range=0.1, height_shift_range=0.1, zoom_range=0.1,
               horizontal_flip=True)


def thread_cpu_s(prefix: str = "h5stream") -> float:
    """CPU seconds of this process's live threads whose name starts with ``prefix`` (each thread's own clock)."""
    total = 0.0
    for t in threading.enumerate():
        if t.name.startswith(prefix) and t.ident is not None:
            try:
                total += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except (OSError, AttributeError):  # ended meanwhile, or no per-thread clocks here
                pass
    return total


THREAD_GROUPS = (("h5stream-pool-collector", "collector"),
                 ("h5stream-reader-io", "io"), ("h5stream-reader", "reader"))
"""Thread name prefix -> the part of h5stream it is (first match wins)."""


def thread_clocks() -> dict[int, tuple[str, float]]:
    """``ident -> (group, CPU seconds)`` of this process's live h5stream threads (each thread's own clock)."""
    out = {}
    for t in threading.enumerate():
        group = next((g for prefix, g in THREAD_GROUPS if t.name.startswith(prefix)), None)
        if group is None and t.name.startswith("h5stream"):
            group = "other"
        if group is None or t.ident is None:
            continue
        try:
            out[t.ident] = (group, time.clock_gettime(time.pthread_getcpuclockid(t.ident)))
        except (OSError, AttributeError):  # ended meanwhile, or no per-thread clocks here
            pass
    return out


def clock_delta(before: dict, after: dict) -> dict[str, float]:
    """CPU seconds per group between two :func:`thread_clocks` (a thread started meanwhile counts from 0)."""
    out: dict[str, float] = {}
    for ident, (group, cpu) in after.items():
        out[group] = out.get(group, 0.0) + cpu - before.get(ident, (group, 0.0))[1]
    return out


def thread_breakdown(path: str, batch_size: int, workers: int, device: str | None = "cpu",
                     feeder: bool = False) -> dict:
    """CPU milliseconds per batch of every h5stream thread in this process, over a whole epoch in steady state.

    ``consumer``: the ``next()`` calls in the taking (training) thread, the uploads of a device included; the
    others by thread (``reader``, ``io``, ``collector``), each from its own CPU clock.  ``workers > 0`` augments
    in that many processes (their CPU is not the training process's).  ``device``: through ``stream.torch(device=...)``
    as uint8 NHWC (no conversion: on CUDA that would be GPU work), or None for the plain numpy iterator;
    ``upload copy`` is the part of ``consumer`` that copies the pixels into the new tensors, what a CUDA
    device's DMA does without the CPU.  The first epoch is left out (opening, the first fill, the page
    cache); the second is measured but for its last batches.  A stream of
    fewer than 5 batches an epoch is skipped.  ``feeder``: ``open(..., feeder=True)``, the reader and the pool in
    a process of their own (needs ``workers > 0``).
    """
    import h5stream

    augment = h5stream.Augment(**AUGMENT) if workers else None
    with h5stream.open(path, batch_size=batch_size, seed=0, drop_remainder=True, workers=workers,
                       augment=augment, feeder=feeder) as s:
        if len(s) < 5:
            return {"batch_size": batch_size, "workers": workers, "feeder": feeder,
                    "skipped": f"{len(s)} batches an epoch"}
        ds = s.torch(device=device) if device is not None else s
        for _ in ds:
            pass
        steps = len(s) - 3  # the steady state: not the pass's last uploads, issued with nothing left to read
        it = iter(ds)
        consumer = 0.0
        copy0 = ds.stats()["upload_copy_cpu_s"] if device is not None else 0.0
        before = thread_clocks()
        t0 = time.perf_counter()
        for _ in range(steps):
            c0 = time.thread_time()
            next(it)
            consumer += time.thread_time() - c0
        wall = time.perf_counter() - t0
        spent = clock_delta(before, thread_clocks())
        if device is not None:
            spent["upload copy"] = ds.stats()["upload_copy_cpu_s"] - copy0
            ds.close()
    ms = {"consumer": 1e3 * consumer / steps, **{g: 1e3 * v / steps for g, v in sorted(spent.items())}}
    ms["total"] = sum(v for g, v in ms.items() if g != "upload copy")
    ms["total less copy"] = ms["total"] - ms.get("upload copy", 0.0)
    return {"batch_size": batch_size, "workers": workers, "feeder": feeder, "steps": steps,
            "device": device, "images_per_s": steps * batch_size / wall, "cpu_ms_per_batch": ms}


def process_cpu_s() -> float:
    import psutil

    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.Error:
            pass
    return total


class GpuSampler:
    """Mean GPU utilisation (NVML) over a run, sampled every 0.1 s by a thread; None without NVML."""

    def __init__(self, device):
        self.values: list[int] = []
        self._stop = threading.Event()
        self._handle = None
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        except Exception:
            return
        self._thread = threading.Thread(target=self._run, name="bench-nvml", daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.1):
            self.values.append(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)

    def stop(self) -> float | None:
        if self._handle is None:
            return None
        self._stop.set()
        self._thread.join()
        return sum(self.values) / len(self.values) if self.values else None


MODELS = ("small", "resnet18", "resnet50")
"""``--model``: a small CNN (the CPU default), or torchvision's ResNet-18/50 (untrained, 10 classes)."""


def make_model(torch, channels: int, classes: int, device, name: str = "small"):
    """The model, channels_last on ``device``."""
    if name == "small":
        model = torch.nn.Sequential(
            torch.nn.Conv2d(channels, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(), torch.nn.Linear(32, classes),
        )
    else:
        import torchvision

        model = getattr(torchvision.models, name)(weights=None, num_classes=classes)
    return model.to(device, memory_format=torch.channels_last)


def train_step(torch, model, opt, device, amp: str):
    """``step(x, y)``: one SGD step, under bf16 autocast when ``amp == "bf16"``."""
    import contextlib

    def autocast():
        if amp == "bf16":
            return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step(x, y):
        with autocast():
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def on_device(torch, x, y, device):
    """What the training loop does to a CPU uint8 NHWC batch: copy up, normalise, NCHW channels_last."""
    x = torch.as_tensor(x).to(device, non_blocking=True)
    x = ((x.float() - MEAN) / STD).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
    return x, torch.as_tensor(y).to(device, non_blocking=True)


def timed(torch, device, batches, steps: int, step, warmup: int = 0) -> dict:
    """Run ``step(x, y)`` over ``warmup`` then ``steps`` batches of the iterator ``batches``; images/s, cores busy,
    GPU use over the ``steps`` alone (the warm-up takes the loader's start: workers, first fill, pinning)."""
    batches = iter(batches)
    for _ in range(warmup):
        step(*next(batches))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    sampler = GpuSampler(device)
    cpu0, t0 = process_cpu_s(), time.perf_counter()
    images = done = 0
    next_cpu = 0.0
    while done < steps:
        c0 = time.thread_time()
        x, y = next(batches)
        next_cpu += time.thread_time() - c0
        step(x, y)
        images += len(y)
        done += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - t0
    return {"images_per_s": images / wall, "cores_busy": (process_cpu_s() - cpu0) / wall, "gpu_util": sampler.stop(),
            "steps": done, "wall_s": wall, "next_cpu_ms_per_batch": 1e3 * next_cpu / max(done, 1)}


def endless(make_epoch):
    while True:
        yield from make_epoch()


def python_step(work: int):
    """A stand-in training step in pure Python: it holds the GIL the whole time, as Python training code does."""
    def step(x, y):
        s = 0
        for i in range(work):
            s += i * i
        return s
    return step


def run(args) -> dict:
    import numpy as np
    import torch

    import h5stream
    from benchmarks.data import make_bench_file, read_rows

    torch.set_num_threads(args.torch_threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    os.makedirs(args.data, exist_ok=True)
    path = make_bench_file(os.path.join(args.data, f"gpu-{args.rows}-{args.size}.h5"), rows=args.rows,
                           size=args.size, progress=False)
    breakdown = []
    breakdown_device = None if args.breakdown_device == "none" else args.breakdown_device
    feeders = {"off": (False,), "on": (True,), "both": (False, True)}[args.breakdown_feeder]
    for workers in _ints(args.breakdown_workers):
        for feeder in feeders if workers else (False,):
            for bs in _ints(args.breakdown_batches):
                log(f"per-thread CPU: workers={workers}{', feeder' if feeder else ''}, batch {bs}")
                row = attempt(lambda w=workers, f=feeder, b=bs: thread_breakdown(path, b, w, breakdown_device, f))
                breakdown.append({"batch_size": bs, "workers": workers, "feeder": feeder, **row})
    if args.breakdown_only:
        return {"device": "cpu", "rows": args.rows, "size": args.size, "torch": torch.__version__,
                "cpu_count": os.cpu_count(), "breakdown": breakdown}
    bs, steps = args.batch_size, args.steps
    model = make_model(torch, 3, 10, device, args.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    amp = args.amp or ("bf16" if device.type == "cuda" else "none")
    train = train_step(torch, model, opt, device, amp)
    warmup = args.warmup

    rows = {}
    ram_x, ram_y = read_rows(path, args.rows)
    x0, y0 = on_device(torch, ram_x[:bs], ram_y[:bs].astype(np.int64), device)
    for _ in range(3):  # the first steps allocate and pick kernels: out of every loader's timing
        train(x0, y0)
    log("limit: one batch on the device")
    rows["limit"] = timed(torch, device, endless(lambda: [(x0, y0)]), steps, train, warmup)

    log("ram: the whole array in memory")
    rng = np.random.default_rng(0)

    def ram_epoch():
        order = rng.permutation(len(ram_y))
        for i in range(0, len(order) - bs + 1, bs):
            idx = np.sort(order[i:i + bs])
            yield ram_x[idx], ram_y[idx].astype(np.int64)
    rows["ram"] = timed(torch, device, endless(ram_epoch), steps,
                        lambda x, y: train(*on_device(torch, x, y, device)), warmup)

    opts = dict(batch_size=bs, seed=0, drop_remainder=True)
    if args.workers:  # the h5stream rows augment in that many workers, as torchvision's row does
        opts.update(workers=args.workers, augment=h5stream.Augment(**AUGMENT))
    log("h5stream cpu: stream.torch(), copied up in the loop")

    def cpu_row():
        with h5stream.open(path, **opts) as s:
            ds = s.torch()
            return timed(torch, device, endless(lambda: ds), steps,
                         lambda x, y: train(*on_device(torch, x, y, device)), warmup)
    rows["h5stream cpu"] = attempt(cpu_row)
    for name, feeder in (("h5stream device", False), ("h5stream device feeder", True)):
        if feeder and not args.workers:
            continue  # the feeder runs the worker pool: no workers, no feeder
        log(f"{name}: stream.torch(device={str(device)!r})" + (", open(..., feeder=True)" if feeder else ""))
        rows[name] = attempt(lambda f=feeder: device_row(torch, h5stream, device, path, opts, f, steps, warmup,
                                                         train))
    rows["torchvision"] = attempt(lambda: torchvision_row(args, torch, device, steps, train, warmup))
    limit = rows["limit"]["images_per_s"]
    for r in rows.values():
        if r.get("images_per_s"):
            r["ratio_to_limit"] = r["images_per_s"] / limit

    result = {"device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
              "model": args.model, "amp": amp, "warmup": warmup,
              "rows": args.rows, "size": args.size, "batch_size": bs, "steps": steps,
              "workers": args.workers, "augment": AUGMENT if args.workers else None,
              "torch": torch.__version__, "cpu_count": os.cpu_count(), "loaders": rows,
              "note": "a shared machine: provisional figures", "breakdown": breakdown}
    if device.type != "cuda":
        result["python_step"] = python_step_cost(args, h5stream, path, opts)
    return result


def attempt(measure) -> dict:
    """``measure()``, or a row that says how it failed (its traceback on stderr): one loader's failure does not
    lose the others' figures."""
    try:
        return measure()
    except Exception as exc:
        import traceback

        traceback.print_exc()
        return {"skipped": f"failed: {type(exc).__name__}: {exc}"}


def device_row(torch, h5stream, device, path: str, opts: dict, feeder: bool, steps: int, warmup: int,
               train) -> dict:
    """``stream.torch(device=...)`` feeding ``train``: :func:`timed`, plus h5stream's CPU in this process per batch
    over the timed steps (its threads from their own clocks, and the ``next()`` calls, which hold the uploads), the
    page-locked
    bytes, and the peak memory of this process tree (sum of PSS, sampled every 0.1 s from the opening of the
    stream) over the stream's memory budget."""
    from h5stream.measure import ResourceSampler

    with ResourceSampler(0.1) as sampler, h5stream.open(path, **opts, feeder=feeder) as s:
        ds = s.torch(device=device, dtype="float32", layout="channels_last", mean=MEAN, std=STD)
        batches = endless(lambda: ds)
        for _ in range(warmup):
            train(*next(batches))
        before = thread_clocks()
        row = timed(torch, device, batches, steps, train)
        threads_s = sum(clock_delta(before, thread_clocks()).values())
        row["h5stream_thread_cpu_ms_per_batch"] = 1e3 * threads_s / row["steps"] + row["next_cpu_ms_per_batch"]
        row["pinned_bytes"] = ds.stats()["pinned_bytes"]
        row["budget_bytes"] = int(s.plan.budget_bytes)
        ds.close()
        timeline = sampler.stop()
    base = int(timeline.mem_bytes[0]) if timeline.mem_bytes.size else 0
    row["peak_mem_bytes"] = max(0, timeline.peak_mem_bytes - base)
    row["within_budget"] = row["peak_mem_bytes"] <= row["budget_bytes"]
    return row


def python_step_cost(args, h5stream, path, opts) -> dict:
    """The GIL-holding stand-in step's rate alone and while h5stream feeds it (CPU tensors / on the device)."""
    import torch

    step = python_step(args.python_work)
    device = torch.device("cpu")
    x, y = torch.zeros(1), torch.zeros(1)
    alone = timed(torch, device, endless(lambda: [(x, y)]), args.steps, step)["images_per_s"]
    out = {"alone_steps_per_s": alone}
    on_cpu = dict(device="cpu", dtype="float32", layout="channels_last", mean=MEAN, std=STD)
    ways = [("cpu tensors", {}, False), ("device cpu", on_cpu, False)]
    if opts.get("workers"):
        ways += [("cpu tensors, feeder", {}, True), ("device cpu, feeder", on_cpu, True)]
    for name, kwargs, feeder in ways:
        with h5stream.open(path, **opts, feeder=feeder) as s:
            ds = s.torch(**kwargs)
            threads0 = thread_cpu_s()
            r = timed(torch, device, endless(lambda ds=ds: ds), args.steps, step)
            upload = ds.stats()["upload_cpu_s"] if kwargs else 0.0  # issued in next(), on no thread of h5stream's
            fed = r["images_per_s"] / opts["batch_size"]
            out[name] = {"steps_per_s": fed, "vs_alone": fed / alone,
                         "h5stream_thread_cpu_ms_per_batch": 1e3 * (thread_cpu_s() - threads0 + upload) / r["steps"]}
            if kwargs:
                ds.close()
    return out


def torchvision_row(args, torch, device, steps: int, train, warmup: int = 0) -> dict:
    try:
        import torchvision
    except ImportError:
        return {"skipped": "torchvision is not installed (pip install torchvision)"}
    from benchmarks.data import ensure_folder

    # JPEGs already at the rows' size, as the store's rows are: the loader decodes what h5stream streams, no more
    folder, _ = ensure_folder(args.data, args.tv_images, args.size, at_size=True)
    t = torchvision.transforms
    augment = [t.RandomAffine(degrees=AUGMENT["rotation_range"],
                              translate=(AUGMENT["width_shift_range"], AUGMENT["height_shift_range"]),
                              scale=(1 - AUGMENT["zoom_range"], 1 + AUGMENT["zoom_range"])),
               t.RandomHorizontalFlip()] if args.workers else []
    tf = t.Compose([t.Resize((args.size, args.size)), *augment, t.PILToTensor()])
    ds = torchvision.datasets.ImageFolder(folder, transform=tf)
    tv_workers = args.tv_workers if args.tv_workers is not None else args.workers or max(1, (os.cpu_count() or 2) // 2)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, shuffle=True, drop_last=True,
                                         num_workers=tv_workers, pin_memory=device.type == "cuda",
                                         persistent_workers=tv_workers > 0)

    def step(x, y):
        x = x.to(device, non_blocking=True)
        x = ((x.float() - MEAN) / STD).contiguous(memory_format=torch.channels_last)
        train(x, y.to(device, non_blocking=True))

    log("torchvision: ImageFolder + DataLoader")
    return timed(torch, device, endless(lambda: loader), steps, step, warmup)


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def format_breakdown(rows: list[dict]) -> list[str]:
    """The per-thread table: CPU-ms per batch of each h5stream thread of the training process."""
    if not rows:
        return []
    groups = ["consumer", "reader", "io", "collector", "other", "total", "upload copy", "total less copy"]
    device = rows[0].get("device")
    how = f"stream.torch(device={device!r}), uint8 NHWC" if device else "numpy batches"
    lines = [f"h5stream's CPU in the training process, ms per batch over an epoch (thread CPU clocks; {how}; "
             "'upload copy' is what a GPU's DMA does):",
             f"{'workers':>7} {'feeder':>6} {'batch':>5} " + " ".join(f"{g:>11}" for g in groups)
             + f" {'images/s':>9}"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"{r['workers']:>7} {_yes(r):>6} {r['batch_size']:>5} skipped: {r['skipped']}")
            continue
        ms = r["cpu_ms_per_batch"]
        cells = " ".join(f"{ms[g]:>11.3f}" if g in ms else f"{'-':>11}" for g in groups)
        lines.append(f"{r['workers']:>7} {_yes(r):>6} {r['batch_size']:>5} {cells} "
                     f"{r['images_per_s']:>9.0f}")
    return lines


def _yes(row: dict) -> str:
    return "yes" if row.get("feeder") else "no"


def format_text(r: dict) -> str:
    if "loaders" not in r:
        return "\n".join([f"{r['rows']} rows of {r['size']}x{r['size']}x3, torch {r['torch']}",
                          *format_breakdown(r["breakdown"])])
    gpu = f" ({r['gpu']})" if r.get("gpu") else ""
    lines = [f"device {r['device']}{gpu}, {r.get('cpu_count')} CPUs, model {r.get('model', 'small')} "
             f"(autocast {r.get('amp', 'none')}), {r['rows']} rows of {r['size']}x{r['size']}x3, "
             f"batch {r['batch_size']}, {r['workers']} workers, {r['steps']} steps after {r.get('warmup', 0)}, "
             f"torch {r['torch']} ({r['note']})",
             f"{'loader':<22} {'images/s':>10} {'x limit':>8} {'cores':>6} {'GPU %':>6}  note"]
    for name, row in r["loaders"].items():
        if "skipped" in row:
            lines.append(f"{name:<22} {'-':>10} {'-':>8} {'-':>6} {'-':>6}  {row['skipped']}")
            continue
        gpu = f"{row['gpu_util']:.0f}" if row.get("gpu_util") is not None else "-"
        note = f"next() {row['next_cpu_ms_per_batch']:.2f} CPU-ms/batch" if "next_cpu_ms_per_batch" in row else ""
        if "h5stream_thread_cpu_ms_per_batch" in row:
            note = (f"h5stream in this process {row['h5stream_thread_cpu_ms_per_batch']:.2f} CPU-ms/batch; "
                    f"page-locked {row['pinned_bytes'] / 2**20:.0f} MiB; "
                    f"peak memory {row['peak_mem_bytes'] / 2**20:.0f} of {row['budget_bytes'] / 2**20:.0f} MiB budget")
        lines.append(f"{name:<22} {row['images_per_s']:>10.0f} {row['ratio_to_limit']:>8.2f} "
                     f"{row['cores_busy']:>6.2f} {gpu:>6}  {note}")
    p = r.get("python_step")
    if p:
        lines.append(f"pure-Python stand-in step alone: {p['alone_steps_per_s']:.0f} steps/s")
        for name in ("cpu tensors", "device cpu"):
            q = p[name]
            lines.append(f"  fed by h5stream ({name}): {q['steps_per_s']:.0f} steps/s = {q['vs_alone']:.2f} x alone; "
                         f"h5stream threads {q['h5stream_thread_cpu_ms_per_batch']:.2f} CPU-ms/batch")
    lines += format_breakdown(r.get("breakdown", []))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = new_parser(__doc__.splitlines()[0])
    p.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--rows", type=int, default=8192, help="rows of the generated store")
    p.add_argument("--size", type=int, default=64, help="rows' side in px")
    p.add_argument("--batch-size", type=int, default=128, help="rows per training step")
    p.add_argument("--steps", type=int, default=200, help="timed training steps per loader")
    p.add_argument("--warmup", type=int, default=20,
                   help="untimed steps of each loader first (its start: workers, the first fill, page-locking)")
    p.add_argument("--model", choices=MODELS, default="small",
                   help="small: a 2-layer CNN; resnet18/resnet50: torchvision's, untrained (needs torchvision)")
    p.add_argument("--amp", choices=("bf16", "none"), help="autocast (default: bf16 on CUDA, none elsewhere)")
    p.add_argument("--torch-threads", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                   help="torch's intra-op threads: half the cores")
    p.add_argument("--tv-images", type=int, default=2048, help="JPEGs for the torchvision row")
    p.add_argument("--tv-workers", type=int, help="the DataLoader's workers (default: --workers, or half the cores)")
    p.add_argument("--workers", type=int, default=0,
                   help="augmenting workers of the h5stream rows (Augment as in AUGMENT) and, with it, torchvision's "
                        "row augments alike; 0: no augmentation anywhere")
    p.add_argument("--breakdown-workers", default="0,2", help="worker counts of the per-thread CPU table")
    p.add_argument("--breakdown-batches", default="64,256", help="batch sizes of the per-thread CPU table")
    p.add_argument("--breakdown-device", default="cpu",
                   help="the table's stream.torch(device=...), uint8 NHWC; 'none': the plain numpy iterator")
    p.add_argument("--breakdown-feeder", choices=("off", "on", "both"), default="both",
                   help="rows with workers measured without and/or with open(..., feeder=True)")
    p.add_argument("--breakdown-only", action="store_true", help="only the per-thread CPU table")
    p.add_argument("--python-work", type=int, default=20000, help="loop iterations of the stand-in step (no GPU)")
    return run_cli(p, argv, run, format_text)


if __name__ == "__main__":
    sys.exit(main())
