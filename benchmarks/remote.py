"""A store served by a local SeaweedFS (S3 and plain HTTP): the stream over a URL against the server's own limit
(plain ranged GETs), the same file streamed locally from the disk, and h5py over fsspec (s3fs) reading the same
batches; the client's CPU per GB; memory against the budget; time to the first batch.

    python -m benchmarks.remote                  # 1.1 GB store, default options, the table and the target checks
    python -m benchmarks.remote --json           # one JSON object with every run
    python -m benchmarks.remote --gb 0.2 --epochs 1 --no-fsspec   # a quick try

Makes the store with :func:`benchmarks.data.make_bench_file` when missing, starts ``weed server -s3`` on
127.0.0.1 (:class:`benchmarks.seaweed.SeaweedS3`, data under ``--data``), uploads the store, and runs each
measurement in a fresh process (``h5stream bench``'s :func:`~h5stream.measure.passes.measure_stream` for the
streams, so memory is sampled the same way).  The streams use h5stream's default options unless
``--memory-budget`` or ``--read-unit`` is given: over a URL, the disk cache, in a new empty folder per stream
(``XDG_CACHE_HOME`` of the child), so a URL stream's rate set against the limit is its epoch 1 after ``open()``
(every piece fetched from the server), and its epochs 2+ (read from the cache) are reported apart.

Like with like: the streams over a URL and the server's limit are measured under the same server cache
(``--server-cache``): ``cold``, the server's volume files evicted before the run and every 0.5 s during it
(the bytes come from its disk), or ``warm``, its files read into the page cache first and left there (the
server answers from memory); each ratio sets a stream against the limit of the same cache.  The limit is the
whole object fetched once with plain ranged GETs (obstore, 4 MiB, 8 in flight, bodies dropped: no HDF5, no
stream), measured twice: with aligned 4 MiB ranges (the server's limit, which the target is measured against), and
with the stream's own ranges (the requests of its first epoch: whole units, at offsets the store's layout decides,
as :class:`~h5stream.remote.source.RemoteSource` cuts them), which some servers serve at a lower rate: SeaweedFS
reads whole 4 MiB internal chunks, so a 3 MiB range costs it about what a 4 MiB one does, or twice that where it
straddles two.  The local stream is read with ``O_DIRECT`` (every byte from the disk).  The fsspec baseline opens the
object with s3fs's defaults and reads each batch of the stream's own first-epoch order with one h5py fancy-index
read, for at most ``--fsspec-seconds``; its rate is extrapolated, which the table says.

CPU: the client's own CPU seconds per GB of rows it streamed (``getrusage`` of the client process, all its threads, from
just before ``open()`` to the last batch; the modules a stream imports are imported before, as a training process has
them: :func:`import_stream_modules`), and the server's (psutil, all its threads).  The client's is split into
the first epoch (the open, the first fill, the block checksums learned) and the epochs after it (steady, from the
sampler), and the steady figure is set against the limit's with the stream's own ranges: what h5stream costs on
top of its GETs.  Where more than :data:`PIN_ABOVE_CPUS` CPUs are available the server is pinned to the first half
and every client to the other (``taskset``); ``--server-cpus``/``--client-cpus`` choose them; on fewer the two
share the cores, which the table says (there the server's CPU is part of what a rate measures, and the client's
CPU per GB is the figure that speaks for the client).  Rounds (``--rounds``) are interleaved; rates are medians,
memory the largest peak.

Targets: a URL stream with default options >= 0.8x the server's limit (same cache), the client <= 1 CPU
second per GB, peak memory <= the budget.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from benchmarks.data import make_bench_file, rows_for_gb
from benchmarks.harness import (by_name, child_command, child_env, evict_folder, interleave, log, median, new_parser,
                                run_cli, warm)
from benchmarks.remote_wire import add_options, condition_label, proxy_settings, routes, wire_lines, wire_row

KEY = "bench/store.h5"
EVICT_EVERY_S = 0.5
PIN_ABOVE_CPUS = 4
"""More CPUs than this: server and client pinned to separate halves; this many or fewer: they share them."""
CACHES = ("cold", "warm")
STREAMS = ("remote", "remote_http")
LIMITS = {"remote": "ceiling", "remote_http": "ceiling_http"}
OWN = "_own"
"""Suffix of a limit measured with the stream's own ranges (``ceiling_own_cold``...)."""
LABELS = {"remote": "s3://", "remote_http": "http://"}


def child(argv: list[str]) -> int:
    """In a fresh process: ``stream URL_OR_PATH COLD BATCH BUDGET EPOCHS SEED ROWS_PER_FILL READ_UNIT PIECE_BYTES``
    (COLD: ``no``, ``evict`` or ``direct``; BUDGET, ROWS_PER_FILL, READ_UNIT and PIECE_BYTES: ``default`` or a
    value) or
    ``ceiling URL [RANGES.npy]``, ``open URL``, ``fsspec URL ORDER.npy BATCH SECONDS``; prints one JSON object."""
    kind = argv[0]
    if kind == "stream":
        from h5stream.measure.passes import measure_stream
        from h5stream.errors import ConfigError
        from h5stream.read.plan import parse_bytes
        from h5stream.read.source import resolve_direct_io
        from h5stream.store.meta import read_meta

        path, cold, batch, budget, epochs, seed, fill, read_unit, piece_bytes = argv[1], argv[2], int(argv[3]), \
            _given(argv[4]), int(argv[5]), int(argv[6]), _given(argv[7]), _given(argv[8]), _given(argv[9])
        t0 = time.monotonic()
        meta = read_meta(path)
        meta_s = time.monotonic() - t0
        # O_DIRECT where the file system takes it; else (tmpfs) evicting the file as it is read
        try:
            direct = cold == "direct" and resolve_direct_io(path, True)
        except ConfigError:
            direct = False
        import_stream_modules()
        cpu0 = _own_cpu_s()
        figures, timeline = measure_stream(
            meta, batch_size=batch, budget=None if budget is None else parse_bytes(budget), epochs=epochs, seed=seed,
            cold=cold == "evict" or (cold == "direct" and not direct), augment=None, workers=0, progress=False,
            rows_per_fill=None if fill is None else int(fill), direct_io=True if direct else "auto",
            read_unit=read_unit, piece_bytes=piece_bytes)
        cpu_s = _own_cpu_s() - cpu0
        keep = ("samples_per_s", "mb_per_s", "startup_s", "first_batch_s", "epoch_seconds", "steady_mb_per_s",
                "compare_mb_per_s", "compare_basis", "peak_mem_bytes", "peak_rss_delta_bytes", "within_budget",
                "mean_cpu_pct", "rows_streamed")
        out = {k: figures[k] for k in keep}
        out["budget_bytes"] = figures["plan"]["budget_bytes"]
        out["unit_rows"], out["rows_per_fill"] = figures["plan"]["unit_rows"], figures["plan"]["rows_per_fill"]
        out["piece_rows"] = figures["plan"].get("piece_rows", 0)
        out["bytes"] = figures["rows_streamed"] * meta.row_bytes
        first = figures.get("first_epoch_after_open_samples_per_s") or figures["first_epoch_samples_per_s"]
        out["first_epoch_mb_per_s"] = first * meta.row_bytes / 1e6
        out["client_cpu_s"] = cpu_s
        steady = steady_cpu_s(timeline)
        if steady is not None and epochs > 1:
            out["steady_client_cpu_s"], out["steady_bytes"] = steady, (epochs - 1) * meta.rows * meta.row_bytes
        out["read_meta_s"] = meta_s
        out["direct_io"] = direct
        out["first_order_head"] = [int(v) for v in figures["orders"][0][:8]]
    elif kind == "open":
        out = _open_cost(argv[1])
    elif kind == "ceiling":
        out = _ceiling(argv[1], np.load(argv[2]).tolist() if len(argv) > 2 else None)
    else:
        out = _fsspec(argv[1], argv[2], int(argv[3]), float(argv[4]))
    print(json.dumps(out))
    return 0


STREAM_MODULES = ("h5stream.streaming.api", "h5stream.read.reader", "h5stream.read.verify", "h5stream.remote.cache",
                  "h5stream.remote.source", "h5stream.store.rowdigest", "obstore", "numpy.random", "tqdm",
                  "multiprocessing.synchronize")
"""What a stream (and :func:`~h5stream.measure.passes.measure_stream` around it) imports on its first open (listed,
not found by opening one: that would read the store)."""


def import_stream_modules() -> None:
    """Import :data:`STREAM_MODULES` before the client's CPU clock starts: a training process has them already, and
    an environment with ``PYTHONDONTWRITEBYTECODE=1`` (the shared VM's) compiles h5stream's modules from source in
    every child (0.12 CPU-s for h5stream's own modules, measured), which a 0.25 GB store's first epoch would count as
    0.5 s per GB."""
    import importlib

    for name in STREAM_MODULES:
        importlib.import_module(name)


def steady_cpu_s(timeline) -> float | None:
    """CPU seconds the stream's process used after its first epoch ended (every thread the sampler saw, the
    HTTP client's own threads included), from the sampler's CPU % per sample; None without an epoch mark."""
    ends = timeline.marks.get("epoch_end")
    if ends is None or not np.isfinite(ends).any() or timeline.t_s.size < 2:
        return None
    first_end = float(timeline.mark_t_s[np.isfinite(ends)][0])
    t = timeline.t_s
    dt = np.diff(t, prepend=t[0])
    busy = sum(np.nan_to_num(pct) for pct in timeline.cpu_pct.values()) / 100.0
    return float((busy * dt)[t > first_end].sum())


def _given(value: str) -> str | None:
    return None if value == "default" else value


def _own_cpu_s() -> float:
    """CPU seconds this process has used so far, all its threads (user + system)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _ceiling(url: str, ranges: list | None = None, request_bytes: int = 4 << 20, in_flight: int = 8) -> dict:
    """The server's own limit here: the whole object fetched once with plain ranged GETs (obstore, 8 in flight,
    bodies dropped), no HDF5 and no stream: aligned ``request_bytes`` ranges, or ``ranges`` (``[start, end)``
    pairs, in order) where given."""
    import concurrent.futures

    import obstore

    from h5stream.remote.config import RemoteOptions, parse_url
    from h5stream.remote.source import make_store

    location = parse_url(url)
    store = make_store(location, RemoteOptions())
    size = int(obstore.head(store, location.key)["size"])
    if ranges is None:
        ranges = [(start, min(start + request_bytes, size)) for start in range(0, size, request_bytes)]
    cpu0, t0 = _own_cpu_s(), time.monotonic()

    def fetch(span):
        return len(obstore.get_range(store, location.key, start=int(span[0]), end=int(span[1])))

    with concurrent.futures.ThreadPoolExecutor(in_flight) as pool:
        got = sum(pool.map(fetch, ranges))
    seconds = time.monotonic() - t0
    return {"mb_per_s": got / seconds / 1e6, "seconds": seconds, "bytes": got, "client_cpu_s": _own_cpu_s() - cpu0,
            "requests": len(ranges)}


def stream_requests(path: str, plan, seed: int, epoch: int = 0) -> list[tuple[int, int]]:
    """``[start, end)`` of every request for pixels that a stream under ``plan`` (seed ``seed``) sends over a URL
    in ``epoch``, in order: each fill's runs (neighbouring units merged) cut as the remote source cuts them, or,
    in the two-level order (``plan.piece_rows``), each piece in the order the fills first need it, whole; from
    the local copy at ``path``, whose bytes the object has."""
    from h5stream.read.locate import locate
    from h5stream.read.runs import plan_runs
    from h5stream.remote.source import MAX_REQUEST_BYTES, request_spans
    from h5stream.store.meta import read_meta
    from h5stream.streaming.config import layout_function

    meta = read_meta(path)
    offsets = locate(meta, cache_labels=False).image_chunks
    if offsets is None:
        raise SystemExit(f"benchmarks.remote: {path} is compressed; its rows are not read by byte range")
    layout = layout_function(meta.rows, plan, seed)(epoch)
    out: list[tuple[int, int]] = []
    if plan.piece_rows:
        from h5stream.read.window import piece_spans

        spans, _ = piece_spans(offsets, meta.block_rows, meta.row_bytes, meta.rows, plan.piece_rows)
        seen: set[int] = set()
        for fill in range(len(layout.fills)):
            for run in plan_runs(layout.fill_segments(fill), offsets, meta.block_rows, meta.row_bytes):
                first = int(np.searchsorted(spans[:, 0], run.offset, side="right")) - 1
                last = int(np.searchsorted(spans[:, 0], run.offset + run.rows * meta.row_bytes, side="left"))
                for i in range(max(first, 0), last):  # a run of neighbouring units may cross into the next piece
                    if i not in seen:
                        seen.add(i)
                        out += request_spans(int(spans[i, 0]), int(spans[i, 1] - spans[i, 0]), MAX_REQUEST_BYTES)
        return out
    for fill in range(len(layout.fills)):
        for run in plan_runs(layout.fill_segments(fill), offsets, meta.block_rows, meta.row_bytes):
            out += request_spans(run.offset, run.rows * meta.row_bytes, MAX_REQUEST_BYTES)
    return out


def _open_cost(url: str) -> dict:
    """Requests and seconds to learn what a stream needs of a remote store before its first read: the
    description, every chunk's offset and every label (what the reader's locate step does)."""
    from h5stream.read.locate import chunk_offsets
    from h5stream.remote.fileobj import remote_h5
    from h5stream.store.meta import _describe as describe

    t0 = time.monotonic()
    with remote_h5(url) as (f, raw):
        meta = describe(url, f)
        offsets = chunk_offsets(f["images"], meta.rows, meta.block_rows, url)
        labels = f["labels"][:meta.rows]
        return {"open_requests": raw.source.requests, "open_s": time.monotonic() - t0, "chunks": len(offsets),
                "label_chunks": -(-len(labels) // f["labels"].chunks[0])}


def _fsspec(url: str, order_path: str, batch: int, seconds: float) -> dict:
    import h5py
    import s3fs

    order = np.load(order_path)
    fs = s3fs.S3FileSystem(endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    t0 = time.monotonic()
    rows = 0
    first_batch_s = None
    with fs.open(url.removeprefix("s3://"), "rb") as fh, h5py.File(fh, "r") as f:
        images, labels = f["images"], f["labels"]
        row_bytes = int(np.prod(images.shape[1:]))
        open_s = time.monotonic() - t0
        start = time.monotonic()
        for b in range(0, len(order), batch):
            idx = np.sort(order[b:b + batch])
            x, y = images[idx], labels[idx]
            rows += len(idx)
            if first_batch_s is None:
                first_batch_s = time.monotonic() - t0
            if time.monotonic() - start >= seconds:
                break
        elapsed = time.monotonic() - start
    del x, y
    rate = rows / elapsed
    return {"samples_per_s": rate, "mb_per_s": rate * row_bytes / 1e6, "rows_read": rows,
            "extrapolated": rows < len(order), "open_s": open_s, "first_batch_s": first_batch_s}


@contextlib.contextmanager
def kept_cold_folder(folder: str, cold: bool = True):
    """Keep every file under ``folder`` out of the page cache while the block runs (a thread evicting it)."""
    if not cold:
        yield
        return
    stop = threading.Event()

    def run():
        while not stop.is_set():
            evict_folder(folder)
            stop.wait(EVICT_EVERY_S)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def parse_cpus(text: str | None) -> list[int] | None:
    """``"0-3,8"`` -> ``[0, 1, 2, 3, 8]`` (taskset's list syntax); None stays None."""
    if text is None:
        return None
    cpus: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            cpus.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise SystemExit(f"benchmarks.remote: cannot read the CPU list {text!r}; write it as taskset does, "
                         "e.g. 0-7 or 0,2,4") from None
    return sorted(set(cpus))


def cpu_split(server: list[int] | None, client: list[int] | None, available: list[int]) -> dict:
    """Which CPUs the server and the clients run on: as given; else, with more than :data:`PIN_ABOVE_CPUS`
    available (and ``taskset``), the first half for the server and the rest for the clients (one given: the
    other gets the rest); else none pinned (they share).
    ``{"server": list | None, "client": list | None, "note": str}``."""
    available = sorted(available)
    if server is None and client is None and len(available) > PIN_ABOVE_CPUS and shutil.which("taskset"):
        half = len(available) // 2
        server, client = available[:half], available[half:]
    elif server is not None and client is None:
        client = [c for c in available if c not in server] or None
    elif client is not None and server is None:
        server = [c for c in available if c not in client] or None
    for name, cpus in (("server", server), ("client", client)):
        if cpus is not None and not set(cpus) <= set(available):
            raise SystemExit(f"benchmarks.remote: --{name}-cpus {cpus} is not among this process's CPUs "
                             f"{available}; pick CPUs from that list")
    if (server is not None or client is not None) and shutil.which("taskset") is None:
        raise SystemExit("benchmarks.remote: pinning server and client needs `taskset` (util-linux); install it "
                         "or run on this machine's shared CPUs with --server-cpus and --client-cpus left out")
    if server is None and client is None:
        note = f"server and client share {len(available)} CPUs (not pinned)"
    else:
        shared = sorted(set(server or available) & set(client or available))
        note = (f"server on CPUs {_cpu_text(server or available)}, client on {_cpu_text(client or available)}"
                + (f" (sharing {_cpu_text(shared)})" if shared else ""))
    return {"server": server, "client": client, "note": note}


def _cpu_text(cpus: list[int]) -> str:
    runs, start = [], None
    for i, c in enumerate(cpus):
        if start is None:
            start = c
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            runs.append(f"{start}" if start == c else f"{start}-{c}")
            start = None
    return ",".join(runs)


def _run(argv: list, env: dict, cpus: list[int] | None = None) -> dict:
    cmd = child_command("benchmarks.remote:child", *argv)
    if cpus:
        from benchmarks.seaweed import pinned

        cmd = pinned(cmd, cpus)
    log("+ " + " ".join(map(str, argv)))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"benchmarks.remote: {argv[0]} run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def server_cache(folder: str, cache: str):
    """The server's files cold (evicted now and every :data:`EVICT_EVERY_S` while the block runs) or warm
    (read into the page cache now, left there)."""
    if cache == "warm":
        for root, _, files in os.walk(folder):
            for name in files:
                with contextlib.suppress(OSError):
                    warm(os.path.join(root, name))
        yield
        return
    evict_folder(folder)
    with kept_cold_folder(folder):
        yield


def run(args) -> dict:
    import h5stream
    from benchmarks.seaweed import ACCESS_KEY, SECRET_KEY, SeaweedS3
    from h5stream.measure import evict_from_page_cache

    proxy = proxy_settings(args)
    size = 128
    local = os.path.join(args.data, f"remote-{args.gb:g}g.h5")
    make_bench_file(local, rows=rows_for_gb(args.gb, size, 3), size=size, progress=True)
    os.makedirs(args.data, exist_ok=True)
    available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count()))
    pins = cpu_split(parse_cpus(args.server_cpus), parse_cpus(args.client_cpus), available)
    caches = CACHES if args.server_cache == "both" else (args.server_cache,)
    with tempfile.TemporaryDirectory(dir=args.data, prefix="seaweed-") as workdir:
        t0 = time.monotonic()
        server = SeaweedS3(workdir, cpus=pins["server"])
        start_s = time.monotonic() - t0
        try:
            t0 = time.monotonic()
            server.put(KEY, local)
            upload_s = time.monotonic() - t0
            url = f"s3://{server.bucket}/{KEY}"
            urls = {"remote": url, "remote_http": server.http_url(KEY)}
            env = child_env(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                            AWS_ENDPOINT_URL=server.endpoint, AWS_EC2_METADATA_DISABLED="true")
            # A given budget: the remote client's memory comes out of it, so the URL may need a fill smaller
            # than the local file's; every stream is given the URL's fill, and all give the same batches.  The
            # default budget gives both the same.
            fill = None if args.memory_budget is None else remote_rows_per_fill(local, args)
            with h5stream.open(local, batch_size=args.batch_size, memory_budget=args.memory_budget,
                               seed=args.seed, rows_per_fill=fill, read_unit=args.read_unit,
                               piece_bytes=args.piece_bytes) as s:
                order = s.epoch_order(0)
                requests = stream_requests(local, s.plan, s.seed)
            order_path = os.path.join(workdir, "order.npy")
            np.save(order_path, order)
            requests_path = os.path.join(workdir, "requests.npy")
            np.save(requests_path, np.array(requests, np.int64))
            stream_args = [args.batch_size, args.memory_budget or "default", args.epochs, args.seed,
                           fill or "default", args.read_unit or "default", args.piece_bytes or "default"]
            client = pins["client"]

            def via(route, name, argv):  # the run's requests and bytes through the route's proxy, if any
                run_env = {**env, "AWS_ENDPOINT_URL": route.endpoint} if route.proxies else dict(env)
                with contextlib.ExitStack() as stack:
                    if argv[0] == "stream":  # the default disk cache: a new empty folder, so epoch 1 fetches all
                        run_env["XDG_CACHE_HOME"] = stack.enter_context(
                            tempfile.TemporaryDirectory(dir=workdir, prefix="cache-"))
                    with route.counted(name) as wire:
                        result = _run(argv, run_env, client)
                return result | wire

            def measured_on_server(argv, cache, route, name="remote"):
                before = _cpu_s(server.process.pid)
                with server_cache(workdir, cache):
                    result = via(route, name, argv)
                result["server_cpu_s"] = _cpu_s(server.process.pid) - before
                return result

            def local_cold():  # O_DIRECT: every byte from the disk, whatever the page cache holds
                evict_from_page_cache(local)
                return _run(["stream", local, "direct", *stream_args], env, client)

            with routes(proxy, urls, server.endpoint) as ways:  # directly, through the proxy, or both
                runs = {}
                for cache in caches:
                    for way in ways:
                        cond = cache + way.suffix
                        for name in STREAMS:
                            on = functools.partial(measured_on_server, cache=cache, route=way, name=name)
                            runs[f"{name}_{cond}"] = functools.partial(on, ["stream", way.urls[name], "no",
                                                                            *stream_args])
                            runs[f"{LIMITS[name]}_{cond}"] = functools.partial(on, ["ceiling", way.urls[name]])
                            runs[f"{LIMITS[name]}{OWN}_{cond}"] = functools.partial(
                                on, ["ceiling", way.urls[name], requests_path])
                runs["local_cold"] = local_cold
                runs["open"] = functools.partial(via, ways[-1], "remote", ["open", url])
                if not args.no_fsspec:
                    runs["fsspec"] = functools.partial(
                        measured_on_server, ["fsspec", url, order_path, args.batch_size, args.fsspec_seconds], "cold",
                        ways[-1])
                rounds = interleave(runs, args.rounds)
                conditions = [cache + way.suffix for cache in caches for way in ways]
        finally:
            server.stop()
    return summarize(by_name(rounds), args, local=local, url=url, start_s=start_s, upload_s=upload_s,
                     caches=caches, pins=pins, requests=requests, conditions=conditions, proxy=proxy)


def remote_rows_per_fill(local: str, args) -> int:
    """The fill a stream of this store over a URL plans under ``--memory-budget`` (no request needed)."""
    import dataclasses

    from h5stream.streaming.planning import plan_stream
    from h5stream.errors import BudgetError
    from h5stream.read.plan import parse_bytes
    from h5stream.remote import RemoteOptions
    from h5stream.store.meta import read_meta

    meta = dataclasses.replace(read_meta(local), remote=RemoteOptions())
    unit = None if args.read_unit is None else parse_bytes(args.read_unit, what="read_unit")
    try:
        pieces = None if args.piece_bytes is None else parse_bytes(args.piece_bytes, what="piece_bytes")
        return plan_stream(meta, parse_bytes(args.memory_budget), args.batch_size, unit_bytes=unit,
                           available_bytes=None, piece_bytes=pieces).rows_per_fill
    except BudgetError as exc:  # the local file's fill leaves no room for the client: the most that does
        if getattr(exc, "rows_per_fill", None) is None:
            raise
        return exc.rows_per_fill


def _cpu_s(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def summarize(results: dict, args, **facts) -> dict:
    """The medians, ratios and target checks of every run (``results``: name -> list of runs)."""
    store_bytes = os.path.getsize(facts["local"])
    out = {
        "command": "python -m benchmarks.remote " + " ".join(sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "system": platform.platform()},
        "cpus": facts["pins"]["note"], "server_cpus": facts["pins"]["server"], "client_cpus": facts["pins"]["client"],
        "store_bytes": store_bytes, "url": facts["url"],
        "server_start_s": facts["start_s"],
        "upload_mb_per_s": store_bytes / facts["upload_s"] / 1e6,
        "memory_budget": args.memory_budget, "read_unit": args.read_unit,
        "piece_bytes": getattr(args, "piece_bytes", None), "rounds": args.rounds,
        "epochs": args.epochs, "server_caches": list(facts["caches"]),
        "conditions": list(facts.get("conditions") or facts["caches"]), "proxy": facts.get("proxy"),
        "runs": results,
    }
    opens = results.get("open", [])
    if opens:
        out["open_requests"] = max(r["open_requests"] for r in opens)
        out["open_s"] = median(r["open_s"] for r in opens)
        out["chunks"], out["label_chunks"] = opens[0]["chunks"], opens[0]["label_chunks"]
        out["open_wire"] = opens[0].get("wire")
    rows = {}
    for name, runs in results.items():
        if name == "open" or not runs:
            continue
        rate_key = "mb_per_s" if name.startswith("ceiling") or name == "fsspec" else "compare_mb_per_s"
        if name.startswith("remote") and "first_epoch_mb_per_s" in runs[0]:
            rate_key = "first_epoch_mb_per_s"  # a URL's epochs 2+ are read from the disk cache: epoch 1 fetches
        row = {"mb_per_s": median(r[rate_key] for r in runs)}
        if rate_key == "first_epoch_mb_per_s" and runs[0].get("steady_mb_per_s") is not None:
            row["later_epochs_mb_per_s"] = median(r["steady_mb_per_s"] for r in runs)
        if "bytes" in runs[0]:
            row["client_cpu_s_per_gb"] = median(r["client_cpu_s"] / (r["bytes"] / 1e9) for r in runs)
            if "steady_client_cpu_s" in runs[0]:
                row["steady_client_cpu_s_per_gb"] = median(r["steady_client_cpu_s"] / (r["steady_bytes"] / 1e9)
                                                           for r in runs)
                # what the epochs after the first did not cost: the open, the first fill, learning the checksums
                row["first_epoch_client_cpu_s_per_gb"] = median(
                    (r["client_cpu_s"] - r["steady_client_cpu_s"]) / ((r["bytes"] - r["steady_bytes"]) / 1e9)
                    for r in runs)
            if "server_cpu_s" in runs[0]:
                row["server_cpu_s_per_gb"] = median(r["server_cpu_s"] / (r["bytes"] / 1e9) for r in runs)
        if "peak_mem_bytes" in runs[0]:
            row["peak_mem_bytes"] = max(r["peak_mem_bytes"] for r in runs)
            row["budget_bytes"] = runs[0]["budget_bytes"]
            row["unit_rows"] = runs[0]["unit_rows"]
            row["piece_rows"] = runs[0].get("piece_rows", 0)
        if "first_batch_s" in runs[0]:
            row["first_batch_s"] = median(r["first_batch_s"] for r in runs)
        if name == "fsspec":
            row["extrapolated"] = any(r.get("extrapolated") for r in runs)
        if "requests" in runs[0]:
            row["requests"] = runs[0]["requests"]
        row.update(wire_row(runs, args.epochs if name.startswith(("remote", "local")) else
                            None if name == "fsspec" else 1))
        rows[name] = row
    out["rows"] = rows
    same = [r["first_order_head"] for name, runs in results.items() if name.startswith(("remote", "local"))
            for r in runs]
    out["same_order"] = bool(same) and all(h == same[0] for h in same)
    requests = facts.get("requests") or []
    if requests:
        sizes = [end - start for start, end in requests]
        out["stream_requests"] = {"count": len(sizes), "mean_bytes": sum(sizes) / len(sizes),
                                  "aligned_4mib": sum(1 for s, e in requests if s % (4 << 20) == 0)}
    conds = out["conditions"]
    for cache in conds:
        for name in STREAMS:
            stream, limit = rows.get(f"{name}_{cache}"), rows.get(f"{LIMITS[name]}_{cache}")
            own = rows.get(f"{LIMITS[name]}{OWN}_{cache}")
            if stream and limit:
                out[f"{name}_{cache}_vs_server_limit"] = stream["mb_per_s"] / limit["mb_per_s"]
            if stream and own:
                out[f"{name}_{cache}_vs_own_ranges_limit"] = stream["mb_per_s"] / own["mb_per_s"]
            if limit and own:
                out[f"{name}_{cache}_own_ranges_vs_aligned"] = own["mb_per_s"] / limit["mb_per_s"]
            if stream and own and stream.get("steady_client_cpu_s_per_gb") is not None:
                out[f"{name}_{cache}_over_own_gets_cpu_s_per_gb"] = (stream["steady_client_cpu_s_per_gb"]
                                                                     - own["client_cpu_s_per_gb"])
    ratios = [v for k, v in out.items() if k.endswith("_vs_server_limit")]
    streams = [rows[f"{n}_{c}"] for n in STREAMS for c in conds if f"{n}_{c}" in rows]
    cpu = [r["client_cpu_s_per_gb"] for r in streams]
    cold, fs = rows.get("local_cold"), rows.get("fsspec")
    remote = rows.get(f"remote_{conds[0]}")
    out["remote_vs_local_cold"] = remote["mb_per_s"] / cold["mb_per_s"] if remote and cold else None
    out["remote_vs_fsspec"] = remote["mb_per_s"] / fs["mb_per_s"] if remote and fs else None
    defaults = all(getattr(args, k, None) is None for k in ("memory_budget", "read_unit", "piece_bytes"))
    out["targets"] = {
        ">= 0.8x the server's limit" + ("" if defaults else " (not default options)"):
            min(ratios) >= 0.8 if ratios else None,
        "client <= 1 CPU-s per GB": max(cpu) <= 1.0 if cpu else None,
        "peak <= budget": all(r["peak_mem_bytes"] <= r["budget_bytes"] for r in streams) if streams else None,
        ">= 10x h5py+fsspec": None if out["remote_vs_fsspec"] is None else out["remote_vs_fsspec"] >= 10,
    }
    return out


def format_text(r: dict) -> str:
    mib = 1 << 20
    budget = r["memory_budget"] or "default"
    width = 70 if r.get("proxy") else 60
    lines = [
        f"{r['command']}",
        f"store {r['store_bytes'] / 1e9:.2f} GB at {r['url']} (SeaweedFS on 127.0.0.1, started in "
        f"{r['server_start_s']:.1f} s, upload {r['upload_mb_per_s']:.0f} MB/s); memory_budget {budget}, "
        f"read_unit {r.get('read_unit') or 'default'}, piece_bytes {r.get('piece_bytes') or 'none'}; "
        f"{r['epochs']} epoch(s), {r['rounds']} round(s), medians; "
        f"{r['machine']['cpus']} CPUs: {r['cpus']}",
        "",
        f"{'reader':<{width}}{'MB/s':>7}{'x limit':>9}{'x own':>7}{'client CPU':>15}{'server CPU':>12}"
        f"{'first batch':>13}{'peak / budget':>17}",
        f"{'':<{width}}{'':>7}{'':>9}{'':>7}{'s/GB (steady)':>15}{'s/GB':>12}{'':>13}{'MiB':>17}",
    ]

    def num(v, fmt):
        return format(v, fmt) if v is not None else "-"

    shown = {}  # row name -> its label, for the proxy's block

    def line(label, key, ratio=None, own=None, extra=""):
        row, shown[key] = r["rows"][key], label
        peak = (f"{row['peak_mem_bytes'] / mib:.0f} / {row['budget_bytes'] / mib:.0f}"
                if "peak_mem_bytes" in row else "-")
        first = f"{row['first_batch_s']:.2f}s" if row.get("first_batch_s") is not None else "-"
        client = num(row.get("client_cpu_s_per_gb"), ".2f")
        if row.get("steady_client_cpu_s_per_gb") is not None:
            client += f" ({row['steady_client_cpu_s_per_gb']:.2f})"
        lines.append(f"{label:<{width}}{row['mb_per_s']:>7.0f}{num(ratio, '.2f'):>9}{num(own, '.2f'):>7}"
                     f"{client:>15}{num(row.get('server_cpu_s_per_gb'), '.1f'):>12}"
                     f"{first:>13}{peak:>17}{extra}")

    rows = r["rows"]
    conds = r.get("conditions") or r["server_caches"]
    for cache in conds:
        where = condition_label(cache)
        for name in STREAMS:
            if f"{name}_{cache}" in rows:
                unit, pieces = rows[f"{name}_{cache}"].get("unit_rows"), rows[f"{name}_{cache}"].get("piece_rows")
                what = f"unit {unit} rows" + (f", pieces of {pieces}" if pieces else "")
                line(f"h5stream, {LABELS[name]} ({where}, {what})", f"{name}_{cache}",
                     r.get(f"{name}_{cache}_vs_server_limit"), r.get(f"{name}_{cache}_vs_own_ranges_limit"))
            if f"{LIMITS[name]}_{cache}" in rows:
                line(f"server limit, {LABELS[name]}, aligned 4 MiB ({where})", f"{LIMITS[name]}_{cache}")
            if f"{LIMITS[name]}{OWN}_{cache}" in rows:
                line(f"server limit, {LABELS[name]}, the stream's ranges ({where})",
                     f"{LIMITS[name]}{OWN}_{cache}", r.get(f"{name}_{cache}_own_ranges_vs_aligned"))
    if "local_cold" in rows:
        line("h5stream, local file (O_DIRECT)", "local_cold")
    if "fsspec" in rows:
        line("h5py over fsspec (s3fs, server cold" + (" via proxy)" if r.get("proxy") else ")"), "fsspec",
             extra=" (extrapolated)" if rows["fsspec"].get("extrapolated") else "")
    lines.append("")
    later = [(LABELS[n], c, rows[f"{n}_{c}"]["later_epochs_mb_per_s"]) for c in conds for n in STREAMS
             if rows.get(f"{n}_{c}", {}).get("later_epochs_mb_per_s") is not None]
    if later:
        lines.append("h5stream over a URL: MB/s is epoch 1 after open() (every piece fetched into an empty disk cache, "
                     "the default); epochs 2+ read the cache: " + ", ".join(
                         f"{label} ({condition_label(c)}) {v:.0f} MB/s" for label, c, v in later))
    lines.append("server limit: the whole object once, plain ranged GETs, 8 in flight, bodies dropped: aligned 4 MiB "
                 "ranges, or the stream's own first-epoch requests; x limit: the stream over the aligned limit of the "
                 "same server cache (the target's reference); x own: over the limit of its own ranges (on a limit "
                 "row: own ranges over aligned); client CPU: the whole run from before open(), and (steady) the "
                 "epochs after the first")
    for cache in conds:
        for name in STREAMS:
            row, over = rows.get(f"{name}_{cache}"), r.get(f"{name}_{cache}_over_own_gets_cpu_s_per_gb")
            if row and over is not None:
                lines.append(f"client CPU, {LABELS[name]} ({condition_label(cache)}): first epoch "
                             f"{row['first_epoch_client_cpu_s_per_gb']:.2f} s/GB (open, checksums learned), then "
                             f"{row['steady_client_cpu_s_per_gb']:.2f}, of which {over:+.2f} on top of the same GETs "
                             "with the bodies dropped (the copy into the batches, the reader, the consumer)")
    if r.get("stream_requests"):
        q = r["stream_requests"]
        lines.append(f"the stream's requests in one epoch: {q['count']}, {q['mean_bytes'] / mib:.2f} MiB on average, "
                     f"{q['aligned_4mib']} of them at a 4 MiB boundary")
    if "open_requests" in r:
        lines.append(f"describe the store, list its {r['chunks']} chunks and read its labels ({r['label_chunks']} "
                     f"chunks): {r['open_requests']} requests, {r['open_s']:.2f} s")
    if r["remote_vs_local_cold"] is not None:
        lines.append(f"s3:// / local O_DIRECT: {r['remote_vs_local_cold']:.2f}x")
    if r["remote_vs_fsspec"] is not None:
        lines.append(f"s3:// / h5py+fsspec: {r['remote_vs_fsspec']:.1f}x")
    lines += wire_lines(r, shown)
    lines.append(f"same batches remote and local: {r['same_order']}")
    lines += [f"target {name}: {'met' if ok else ('not met' if ok is not None else 'not measured')}"
              for name, ok in r["targets"].items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = new_parser(__doc__.splitlines()[0], prog="python -m benchmarks.remote")
    parser.add_argument("--gb", type=float, default=1.1, help="store size, GB")
    parser.add_argument("--batch-size", type=int, default=64, help="rows per batch")
    parser.add_argument("--memory-budget", default=None, help="the streams' memory_budget (default: h5stream's)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per stream")
    parser.add_argument("--seed", type=int, default=0, help="the streams' seed")
    parser.add_argument("--read-unit", default=None, help="the streams' read_unit (default: h5stream's; e.g. 4MiB)")
    parser.add_argument("--piece-bytes", default=None,
                        help="the streams' piece_bytes: the two-level order, read in pieces of this size (e.g. 8MiB)")
    parser.add_argument("--server-cache", choices=(*CACHES, "both"), default="both",
                        help="the server's page cache during the streams and the limit alike")
    parser.add_argument("--server-cpus", default=None,
                        help="CPUs for the server, as taskset lists them (e.g. 0-7); default: the first half of "
                             f"this machine's where it has more than {PIN_ABOVE_CPUS}, else not pinned")
    parser.add_argument("--client-cpus", default=None,
                        help="CPUs for every client process (e.g. 8-15); default: the CPUs the server does not have")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds; medians")
    parser.add_argument("--fsspec-seconds", type=float, default=60.0, help="time limit of the fsspec baseline")
    parser.add_argument("--no-fsspec", action="store_true", help="skip the fsspec baseline (needs s3fs)")
    add_options(parser)
    return run_cli(parser, argv, run, format_text)


if __name__ == "__main__":
    sys.exit(main())
