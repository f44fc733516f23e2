"""Scaling with workers: ``h5stream ingest`` and the augmenting stream at 1, 2, 4, ... workers, and the cost of
the one stage that runs once, in the parent.

One run ingests a cached folder of photo-like JPEGs (``--source`` px, resized to
``--size``) with ``--workers N`` for each N, then streams the store it wrote
with ``h5stream.open(path, batch_size=256, workers=N, augment=AUGMENT)``.  Each
measurement runs in a fresh interpreter (imports excluded), which is the
*parent*: its CPU (``getrusage(RUSAGE_SELF)``: the main thread and its threads,
not the worker processes) is the serial stage every worker waits on.  So
besides img/s the table gives

* ``ingest parent us/row``: the parent's CPU per ingested row, the whole
  ingest (walk, pool start, writes, commits) included;
* ``past start-up``: the same per row once the run is going, from a second
  ingest of a quarter as many photos (the difference of the two runs' CPU
  over the difference of their rows), with ``start-up ms`` what is left
  (store created, pool started and stopped), the same for any number of rows;
* ``steady img/s``: the ingest's rate past start-up, as of an ingest many
  times longer (the long run's extra rows over its extra seconds), with its
  own ``x linear``: the workers' boot is paid once per ingest, so a short
  benchmark ingest understates how a long one scales;
* ``stream parent ms/batch``: the parent's CPU per batch of 256 over the timed
  epochs (after one warm-up epoch); with ``--epochs-per-worker``, N workers
  stream N times as many epochs, so that every measurement lasts about as long
  (a fast stream's few hundred milliseconds would weigh its first and last
  batches, where the workers are not all busy);
* ``cap``: ``1 / that cost``, the rate no number of workers can pass while the
  parent's work stays as it is (rows/s for ingest, img/s for the stream; for
  a long ingest, the cap past start-up);
* ``x linear``: the rate over ``workers`` times the one-worker rate, and
  ``machine``: the same ratio for that many bare processes doing the workers'
  work alone (decoding and resizing the JPEGs; augmenting a batch of rows),
  started together: what the machine itself keeps of one core's rate when that
  many cores are busy (clocks, memory, shared cores).  ``x linear`` over
  ``machine`` is the share of the machine's own scaling h5stream reaches.

On a machine with fewer cores than the curve needs, the cap still says where
it would end.  A shared machine only ever adds time and CPU: each measurement
is repeated ``--rounds`` times, interleaved, and the best kept.

Usage::

    python -m benchmarks.scaling                       # workers 1, 2, 4, ... up to the machine's cores
    python -m benchmarks.scaling --workers 1,2 --n 2000 --json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from benchmarks.harness import (add_data_option, add_json_option, available_cores, by_name, child_command, child_env,
                                emit, interleave, log, new_parser, write_json)

BATCH = 256
AUGMENT = dict(rotation_range=15, width_shift_range=0.1, height_shift_range=0.1, zoom_range=0.1,
               horizontal_flip=True)
"""The augmentation the stream applies (the geometry of a typical image classifier's training)."""
TARGET_INGEST_US_PER_ROW = 25.0
TARGET_STREAM_MS_PER_BATCH = 0.5


def default_workers(cores: int) -> list[int]:
    """1, 2, 4, ... up to ``cores``, and ``cores`` itself (pure)."""
    out, w = [], 1
    while w < cores:
        out.append(w)
        w *= 2
    return out + [max(1, cores)]


def ensure_jpegs(data_dir: str, n: int, side: int, seed: int = 0) -> str:
    """A cached folder of ``n`` photo-like ``side`` x ``side`` JPEGs in 4 class folders, made on every core."""
    from benchmarks.data import ensure_folder

    return ensure_folder(data_dir, n, side, seed, at_size=True)[0]


# -- the child side: one measurement in a fresh interpreter, the parent of its workers ------------
def _self_cpu_s() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def ingest_child(argv: list[str]) -> int:
    """``ingest_child ROOT OUT SIZE WORKERS``: one ingest; prints ``{"rows", "seconds", "parent_cpu_s", "phases",
    "disk_wait_s"}`` (``phases``: the ingest's own wall and CPU seconds per stage, ``IngestResult.phases``;
    ``disk_wait_s``: its wait for the disk's direct writes)."""
    import time

    import multiprocessing.popen_spawn_posix  # noqa: F401 - what ingest imports when it first runs: outside the clock
    import multiprocessing.synchronize  # noqa: F401

    import h5py  # noqa: F401
    import numpy.random  # noqa: F401
    import tqdm  # noqa: F401

    import h5stream.memory.shm  # noqa: F401
    import h5stream.store.writer  # noqa: F401
    from h5stream.ingest.pack import IngestOptions, ingest

    root, out, size, workers = argv[0], argv[1], int(argv[2]), int(argv[3])
    t0, c0 = time.perf_counter(), _self_cpu_s()
    result = ingest(IngestOptions(src=root, out=out, size=(size, size), workers=workers, overwrite=True,
                                  progress=False))
    seconds, cpu = time.perf_counter() - t0, _self_cpu_s() - c0
    if result.skipped:
        print(f"ingest skipped {result.skipped} files; see {result.report_path}", file=sys.stderr)
        return 1
    print(json.dumps({"rows": result.ingested, "seconds": seconds, "parent_cpu_s": cpu, "phases": result.phases,
                      "disk_wait_s": result.disk_wait_s}))
    return 0


def stream_child(argv: list[str]) -> int:
    """``stream_child STORE WORKERS EPOCHS``: one warm-up epoch, then ``EPOCHS`` timed ones; prints
    ``{"images", "batches", "seconds", "parent_cpu_s"}``."""
    import time

    import h5stream

    store, workers, epochs = argv[0], int(argv[1]), int(argv[2])
    with h5stream.open(store, batch_size=BATCH, workers=workers, augment=h5stream.Augment(**AUGMENT)) as stream:
        for _ in stream:  # warm-up: workers started, file in the page cache
            pass
        images = batches = 0
        t0, c0 = time.perf_counter(), _self_cpu_s()
        for _ in range(epochs):
            for _, y in stream:
                images += len(y)
                batches += 1
        seconds, cpu = time.perf_counter() - t0, _self_cpu_s() - c0
    print(json.dumps({"images": images, "batches": batches, "seconds": seconds, "parent_cpu_s": cpu}))
    return 0


def kernel_child(argv: list[str]) -> int:
    """``kernel_child KIND SOURCE SIZE SECONDS``: the workers' own work with nothing around it for SECONDS, once a
    line on stdin says go (so that N such processes run together; it prints ``ready`` first): ``decode`` (a file of
    the JPEG folder SOURCE decoded and resized as the ingest does, the first 256 files in turn) or ``augment`` (256
    rows of the store SOURCE at a time, read from the file in shuffled order and augmented, as a pool worker does
    with a cached uncompressed store); prints ``{"images", "seconds"}``."""
    import time

    import numpy as np

    kind, source, size, seconds = argv[0], argv[1], int(argv[2]), float(argv[3])
    if kind == "decode":
        from h5stream.ingest.decode import DecodeSpec, decode_file

        spec = DecodeSpec(size=(size, size))
        files = sorted(os.path.join(d, f) for d, _, names in os.walk(source) for f in names
                       if f.lower().endswith((".jpg", ".jpeg")))[:256]

        def work(i):
            decode_file(files[i % len(files)], spec)
            return 1
    else:
        import h5stream
        from h5stream.augment.worker import FileSource, _FileRows
        from h5stream.read.locate import locate
        from h5stream.store.meta import read_meta

        # As a pool worker reads a cached uncompressed store: 256 rows at their byte offsets, in shuffled order,
        # into one buffer, augmented into another.
        meta = read_meta(source)
        chunks = locate(meta, cache_labels=False).image_chunks
        if chunks is None:
            raise SystemExit(f"{source}: its rows cannot be read by byte offset")
        rows = _FileRows(FileSource(source, (meta.rows, *meta.image_shape), "uint8"))
        order = np.random.default_rng(0).permutation(meta.rows)
        offsets = chunks[order // meta.block_rows] + (order % meta.block_rows) * meta.row_bytes
        augment, n = h5stream.Augment(**AUGMENT), min(BATCH, meta.rows)
        batch = np.empty((n, *meta.image_shape), np.uint8)
        out = np.empty((n, *meta.image_shape), augment.output_dtype())

        def work(i):
            at = (i * n) % (meta.rows - n + 1)
            rows.read(offsets[at:at + n], batch)
            augment(batch, seed=0, epoch=i, row_ids=order[at:at + n], out=out)
            return n
    work(0)  # warm: imports, first allocations
    print("ready", flush=True)
    sys.stdin.readline()
    images, i, t0 = 0, 1, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        images += work(i)
        i += 1
    print(json.dumps({"images": images, "seconds": time.perf_counter() - t0}))
    return 0


def machine_rate(kind: str, source: str, size: int, processes: int, seconds: float = 1.0) -> float:
    """Images/s of ``processes`` :func:`kernel_child` processes running together (their rates summed): what this
    machine gives that many independent workers, with no pool, parent or pipe."""
    from h5stream.concurrency.spawn import SINGLE_THREAD_ENV  # what h5stream's workers run with: one BLAS thread each

    procs = [subprocess.Popen(child_command("benchmarks.scaling:kernel_child", kind, source, size, seconds),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=child_env(**SINGLE_THREAD_ENV))
             for _ in range(processes)]
    for proc in procs:  # every one imported and warmed, then all of them go at once
        if proc.stdout.readline().strip() != "ready":
            for p in procs:
                p.kill()
            err = [p.communicate()[1] for p in procs]
            raise SystemExit(f"kernel_child {kind} failed: {[e.strip().splitlines()[-1:] for e in err if e]}")
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    rate = 0.0
    for proc in procs:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"kernel_child {kind} failed: {err.strip().splitlines()[-1:]}")
        r = json.loads(out.strip().splitlines()[-1])
        rate += r["images"] / r["seconds"]
    return rate


def _run_child(entry: str, *args) -> dict:
    proc = subprocess.run(child_command(entry, *args), capture_output=True, text=True, env=child_env())
    if proc.returncode != 0:
        raise SystemExit(f"{entry} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- the run ------------------------------------------------------------------------------------
def past_startup(runs: list[dict], small_runs: list[dict]) -> tuple[float | None, float | None]:
    """(parent CPU per row once the run is going in us, start-up CPU in ms) from the rounds of a long and a
    short ingest (pure): the least CPU of each, a straight line through the two; (None, None) without the
    short one or with as many rows, and where noise makes the longer run cost no more than the shorter (a slope
    of zero or less measures nothing)."""
    if not small_runs:
        return None, None
    big = min(runs, key=lambda r: r["parent_cpu_s"])
    small = min(small_runs, key=lambda r: r["parent_cpu_s"])
    if big["rows"] <= small["rows"]:
        return None, None
    per_row_s = (big["parent_cpu_s"] - small["parent_cpu_s"]) / (big["rows"] - small["rows"])
    if per_row_s <= 0:
        return None, None
    return 1e6 * per_row_s, 1e3 * (small["parent_cpu_s"] - per_row_s * small["rows"])


def steady_rate(runs: list[dict], small_runs: list[dict]) -> float | None:
    """Rows per second once an ingest is going (pure): the rows the long ingest has over the short one, over the
    seconds it takes longer (the fastest round of each), so that start-up (workers booting, the store created)
    drops out: the rate of an ingest many times longer.  None without the short one, or where noise makes the
    longer run no slower."""
    if not small_runs:
        return None
    big = min(runs, key=lambda r: r["seconds"])
    small = min(small_runs, key=lambda r: r["seconds"])
    if big["rows"] <= small["rows"] or big["seconds"] <= small["seconds"]:
        return None
    return (big["rows"] - small["rows"]) / (big["seconds"] - small["seconds"])


def summarise(workers: int, ingest_runs: list[dict], stream_runs: list[dict],
              small_ingest_runs: list[dict] = (), decode_rates: list[float] = (),
              augment_rates: list[float] = ()) -> dict:
    """One table row from the rounds of one worker count (pure): best rate, least parent CPU, and the caps;
    with the rounds of a shorter ingest, the cost per row past start-up and the start-up's; with the rounds of
    :func:`machine_rate`, the best rate of that many bare decode / augment processes."""
    ing = max(r["rows"] / r["seconds"] for r in ingest_runs)
    ing_us = min(1e6 * r["parent_cpu_s"] / r["rows"] for r in ingest_runs)
    run_us, startup_ms = past_startup(ingest_runs, list(small_ingest_runs))
    least = min(ingest_runs, key=lambda r: r["parent_cpu_s"])
    phases = least.get("phases") or {}
    st = max(r["images"] / r["seconds"] for r in stream_runs)
    st_ms = min(1e3 * r["parent_cpu_s"] / r["batches"] for r in stream_runs)
    return {
        "workers": workers,
        "ingest_images_per_s": ing,
        "ingest_steady_images_per_s": steady_rate(ingest_runs, list(small_ingest_runs)),
        "ingest_parent_us_per_row": ing_us,
        "ingest_cap_rows_per_s": 1e6 / ing_us if ing_us > 0 else None,
        "ingest_parent_us_per_row_past_startup": run_us,
        "ingest_startup_ms": startup_ms,
        "ingest_cap_past_startup_rows_per_s": 1e6 / run_us if run_us and run_us > 0 else None,
        "ingest_stages_ms": {name: {"wall": 1e3 * wall, "cpu": 1e3 * cpu} for name, (wall, cpu) in phases.items()},
        "ingest_disk_wait_ms": 1e3 * least["disk_wait_s"] if "disk_wait_s" in least else None,
        "stream_images_per_s": st,
        "stream_images": stream_runs[0]["images"],
        "stream_parent_ms_per_batch": st_ms,
        "stream_cap_images_per_s": 1e3 * BATCH / st_ms if st_ms > 0 else None,
        "machine_decode_images_per_s": max(decode_rates) if decode_rates else None,
        "machine_augment_images_per_s": max(augment_rates) if augment_rates else None,
    }


def add_efficiency(rows: list[dict]) -> list[dict]:
    """Each row with its rates over ``workers`` times the one-worker row's (``*_x_linear``), and, where the
    machine's own rates were measured, the machine's (``machine_*_x_linear``: what that many bare processes keep
    of one's rate) and h5stream's over the machine's (``*_x_machine``: the share of what the machine allows) (pure)."""
    one = next((r for r in rows if r["workers"] == 1), None)
    out = []
    for r in rows:
        r = dict(r)
        if one is not None:
            if r.get("ingest_steady_images_per_s") and one.get("ingest_steady_images_per_s"):
                r["ingest_steady_x_linear"] = r["ingest_steady_images_per_s"] / (
                    r["workers"] * one["ingest_steady_images_per_s"])
            for key, machine in (("ingest_images_per_s", "machine_decode_images_per_s"),
                                 ("stream_images_per_s", "machine_augment_images_per_s")):
                name = key.split("_")[0]
                r[f"{name}_x_linear"] = r[key] / (r["workers"] * one[key])
                if r.get(machine) and one.get(machine):
                    kernel = machine.split("_")[1]
                    r[f"machine_{kernel}_x_linear"] = r[machine] / (r["workers"] * one[machine])
                    r[f"{name}_x_machine"] = r[f"{name}_x_linear"] / r[f"machine_{kernel}_x_linear"]
        out.append(r)
    return out


def table(workers: list[int], per_round: dict[str, list]) -> list[dict]:
    """The table's rows from the measurements' results by name (:func:`~benchmarks.harness.by_name`), one per
    worker count that has both its ingest and its stream measured (pure)."""
    return add_efficiency([summarise(w, per_round[f"ingest {w}"], per_round[f"stream {w}"],
                                     per_round.get(f"ingest {w} short", ()), per_round.get(f"decode {w}", ()),
                                     per_round.get(f"augment {w}", ()))
                           for w in workers if per_round.get(f"ingest {w}") and per_round.get(f"stream {w}")])


def run(*, n: int, source: int, size: int, workers: list[int], epochs: int, rounds: int, data_dir: str,
        machine: bool = True, machine_seconds: float = 1.0, epochs_per_worker: bool = False,
        partial: str | None = None) -> dict:
    """Every measurement, ``rounds`` interleaved rounds; the ``--json`` object.  ``machine``: also the same decode
    and augment work in that many bare processes (:func:`machine_rate`), the machine's own scaling;
    ``epochs_per_worker``: the stream with N workers times ``epochs * N`` epochs; ``partial``: a file that holds
    the object as it stands after each measurement (``"complete": false`` until the last), so that a run cut
    short leaves what it measured."""
    def result(per_round: dict[str, list], complete: bool) -> dict:
        return {
            "images": n, "short_images": small, "source": f"{source}x{source} JPEG", "out_size": size,
            "batch_size": BATCH, "augment": AUGMENT, "epochs": epochs, "epochs_per_worker": epochs_per_worker,
            "rounds": rounds, "complete": complete, "cpus": available_cores(), "rows": table(workers, per_round),
            "targets": {"ingest_parent_us_per_row": TARGET_INGEST_US_PER_ROW,
                        "stream_parent_ms_per_batch": TARGET_STREAM_MS_PER_BATCH},
        }

    def save(rounds_so_far: list[dict]) -> None:
        write_json(partial, rounded(result(by_name(rounds_so_far), complete=False)))

    root = ensure_jpegs(data_dir, n, source)
    small = n // 4
    small_root = ensure_jpegs(data_dir, small, source) if small >= 1 else None
    os.makedirs(data_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=data_dir) as tmp:
        stores = {w: os.path.join(tmp, f"w{w}.h5") for w in workers}
        measurements = {}
        for w in workers:
            measurements[f"ingest {w}"] = lambda w=w: _run_child("benchmarks.scaling:ingest_child", root,
                                                                 stores[w], size, w)
            if small_root is not None:
                measurements[f"ingest {w} short"] = lambda w=w: _run_child(
                    "benchmarks.scaling:ingest_child", small_root, os.path.join(tmp, f"short{w}.h5"), size, w)
            measurements[f"stream {w}"] = lambda w=w: _run_child("benchmarks.scaling:stream_child", stores[w], w,
                                                                 epochs * w if epochs_per_worker else epochs)
            if machine:
                measurements[f"decode {w}"] = lambda w=w: machine_rate("decode", root, size, w, machine_seconds)
                measurements[f"augment {w}"] = lambda w=w: machine_rate("augment", stores[w], size, w,
                                                                        machine_seconds)
        per_round = by_name(interleave(measurements, rounds, progress=True,
                                       after_each=save if partial else None))
    out = result(per_round, complete=True)
    if partial:
        write_json(partial, rounded(out))
    return out


COLUMNS = (
    ("workers", "workers", "{:d}"),
    ("ingest_images_per_s", "ingest img/s", "{:,.0f}"),
    ("ingest_parent_us_per_row", "parent us/row", "{:.1f}"),
    ("ingest_cap_rows_per_s", "cap rows/s", "{:,.0f}"),
    ("ingest_parent_us_per_row_past_startup", "past start-up us/row", "{:.1f}"),
    ("ingest_startup_ms", "start-up ms", "{:.0f}"),
    ("ingest_cap_past_startup_rows_per_s", "cap rows/s", "{:,.0f}"),
    ("ingest_x_linear", "x linear", "{:.2f}"),
    ("ingest_steady_images_per_s", "steady img/s", "{:,.0f}"),
    ("ingest_steady_x_linear", "x linear", "{:.2f}"),
    ("machine_decode_x_linear", "machine", "{:.2f}"),
    ("stream_images_per_s", "stream img/s", "{:,.0f}"),
    ("stream_parent_ms_per_batch", "parent ms/batch", "{:.2f}"),
    ("stream_cap_images_per_s", "cap img/s", "{:,.0f}"),
    ("stream_x_linear", "x linear", "{:.2f}"),
    ("machine_augment_x_linear", "machine", "{:.2f}"),
)
"""(key, heading, format) of each table column, in order."""


def rounded(result: dict) -> dict:
    """``result`` with its figures rounded for the JSON output."""
    def r(v):
        if isinstance(v, dict):
            return {k: r(x) for k, x in v.items()}
        return round(v, 3) if isinstance(v, float) else v
    return dict(result, rows=[{k: r(v) for k, v in row.items()} for row in result["rows"]])


def aligned(cells: list[list[str]]) -> list[str]:
    """Rows of cells as text lines, each column right-aligned to its widest cell (pure)."""
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]


def format_table(result: dict) -> str:
    lines = [f"{result['images']} JPEGs {result['source']} -> {result['out_size']}x{result['out_size']} RGB; "
             f"stream batch {result['batch_size']}, {result['epochs']} epochs"
             f"{' per worker' if result.get('epochs_per_worker') else ''} after a warm-up; "
             f"{result['cpus']} CPUs, best of {result['rounds']}; parent = the process the workers serve"
             + (f"; past start-up: against {result['short_images']} JPEGs" if result.get("short_images") else "")]
    if result.get("complete") is False:
        lines.append("CUT SHORT: the rows are what the run had measured (a row once its ingest and stream were; "
                     "fewer rounds than stated)")
    cells = [[h for _, h, _ in COLUMNS]]
    for row in result["rows"]:
        cells.append([("-" if row.get(k) is None else fmt.format(row[k])) for k, _, fmt in COLUMNS])
    lines += aligned(cells)
    stages = [name for name in ("find", "create", "write", "finish")
              if any(name in row.get("ingest_stages_ms", {}) for row in result["rows"])]
    if stages:
        lines.append("ingest by stage, the run of least parent CPU: wall ms / parent CPU ms ("
                     "find: walk and validate; create: pool and store; write: every row; finish: close; "
                     "disk wait: ms the parent waited for its direct writes, within write and finish)")
        cells = [["workers"] + stages + ["disk wait"]]
        for row in result["rows"]:
            got = row.get("ingest_stages_ms", {})
            wait = row.get("ingest_disk_wait_ms")
            cells.append([str(row["workers"])] + [f"{got[n]['wall']:,.0f} / {got[n]['cpu']:,.0f}" if n in got else "-"
                                                  for n in stages] + ["-" if wait is None else f"{wait:,.0f}"])
        lines += aligned(cells)
    t = result["targets"]
    lines.append("x linear: img/s over workers x the one-worker rate; steady: the ingest's rate past start-up (the "
                 "long run's extra rows over its extra seconds against the short one), as of a long ingest; "
                 "machine: the same for that many bare processes doing the workers' decode / augment work alone "
                 "(what the machine itself keeps)")
    lines.append(f"targets: ingest parent <= {t['ingest_parent_us_per_row']:g} us/row "
                 f"(cap >= {1e6 / t['ingest_parent_us_per_row']:,.0f} rows/s); stream parent <= "
                 f"{t['stream_parent_ms_per_batch']:g} ms/batch (cap >= "
                 f"{1e3 * BATCH / t['stream_parent_ms_per_batch']:,.0f} img/s)")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = new_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=4000, help="number of JPEGs")
    parser.add_argument("--source", type=int, default=192, help="side of the source JPEGs")
    parser.add_argument("--size", type=int, default=128, help="side of the stored rows")
    parser.add_argument("--workers", default=None,
                        help="comma-separated worker counts (default 1, 2, 4, ... up to the CPU count)")
    parser.add_argument("--epochs", type=int, default=3, help="timed stream epochs")
    parser.add_argument("--epochs-per-worker", action="store_true",
                        help="N workers stream --epochs times N epochs (every measurement about as long)")
    parser.add_argument("--rounds", type=int, default=2, help="repeat each measurement, keep the best")
    parser.add_argument("--no-machine", action="store_true",
                        help="skip the machine's own scaling (the workers' work in that many bare processes)")
    parser.add_argument("--partial", metavar="FILE",
                        help="after each measurement, write the JSON so far to FILE (what a run cut short leaves)")
    parser.add_argument("--machine-seconds", type=float, default=1.0,
                        help="how long each bare process works, seconds")
    add_data_option(parser)
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.workers is None:
        workers = default_workers(os.cpu_count() or 1)
    else:
        workers = [int(w) for w in args.workers.split(",") if w.strip()]
    if not workers or min(workers) < 1:
        parser.error(f"--workers needs worker counts >= 1, got {args.workers!r}")
    for flag, value in (("--n", args.n), ("--epochs", args.epochs), ("--rounds", args.rounds)):
        if value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    log(f"scaling: {args.n} JPEGs, workers {workers}")
    result = run(n=args.n, source=args.source, size=args.size, workers=workers, epochs=args.epochs,
                 rounds=args.rounds, data_dir=args.data, machine=not args.no_machine,
                 machine_seconds=args.machine_seconds, epochs_per_worker=args.epochs_per_worker, partial=args.partial)
    emit(rounded(result) if args.json else result, as_json=args.json, format_text=format_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
