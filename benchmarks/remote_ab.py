"""Epoch 1 of a URL stream through an empty disk cache, two versions of h5stream interleaved, with the server's
aligned limit in every round: is a change to the first epoch within noise?

    python -m benchmarks.remote_ab --base REV                       # REV against this checkout, s3:// and http://
    python -m benchmarks.remote_ab --base REV --gb 0.25 --rounds 6 --scheme s3 --json

A store of ``--gb`` GB (:func:`benchmarks.data.make_bench_file`, as :mod:`benchmarks.remote` makes it) is uploaded
to a SeaweedFS server on 127.0.0.1 (:class:`benchmarks.seaweed.SeaweedS3`).  Every round runs, for each scheme,
the aligned limit (:func:`benchmarks.remote._ceiling`: the whole object in plain 4 MiB GETs, 8 in flight, bodies
dropped) and each version's stream, alternating which version goes first; each in a fresh interpreter whose
``PYTHONPATH`` puts that version's ``h5stream`` first (:func:`benchmarks.ab.unpack`).  A stream run opens the URL
with default options and a new empty ``cache_dir``, batch 64, seed 0, and reads epoch 1; it reports the rows'
MB/s from ``open()`` returning to the epoch's last batch, the time to its first batch, and its process's CPU
seconds (``getrusage``, every thread) per GB from just before ``open()`` to the last batch, the modules a stream
imports imported before (:func:`benchmarks.remote.import_stream_modules`), and the same split by thread (from
``/proc/self/task``, the last batch's: ``io`` the reader's I/O threads, ``prefetch`` the disk cache's fetch
threads, ``client`` the HTTP client's own runtime, ``reader`` and ``main``; ``rest``: ``close()`` and threads that
ended before the last batch).  The table gives medians per version,
each over the limit of its own round (x limit), and the median of the per-round ratios head / base.

On fewer than 5 CPUs the server, the client and whatever else runs share the cores: the CPU per GB is then the
figure that speaks for the client, and a rate speaks for the machine's load as much as for the change.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import tempfile
import time

from benchmarks.harness import (REPO, by_name, child_command, child_env, log, median, new_parser, run_cli,
                                same_round_ratios)

SCHEMES = ("s3", "http")
KEY = "ab/store.h5"
BATCH = 64


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


THREAD_GROUPS = (("h5stream-reader-io", "io"), ("h5stream-prefetch", "prefetch"), ("h5stream-reader", "reader"),
                 ("MainThread", "main"))
"""Python thread name prefix -> the part of the stream it is (first match wins); a thread Python did not start
(the HTTP client's own runtime) is ``client``, any other Python thread ``other``."""


def thread_cpu_s() -> dict[int, tuple[str, float]]:
    """``native thread id -> (group, CPU seconds)`` of every live thread of this process (``/proc/self/task``:
    each thread's ``schedstat``, in nanoseconds; the group from :data:`THREAD_GROUPS`), or {} where ``/proc``
    cannot be read."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return {}
    for tid in map(int, tids):
        try:  # nanoseconds on a CPU; the clock ticks of stat (10 ms apiece) where the kernel keeps no schedstat
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                seconds = int(f.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:  # ended meanwhile
                continue
            seconds = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
        name = names.get(tid)
        group = "client" if name is None else next((g for p, g in THREAD_GROUPS if name.startswith(p)), "other")
        out[tid] = (group, seconds)
    return out


def cpu_by_group(before: dict, after: dict) -> dict[str, float]:
    """CPU seconds per thread group between two :func:`thread_cpu_s` snapshots (pure; a thread not in
    ``before`` started after it, from 0; one gone from ``after`` is not counted)."""
    groups: dict[str, float] = {}
    for tid, (group, seconds) in after.items():
        groups[group] = groups.get(group, 0.0) + seconds - before.get(tid, (group, 0.0))[1]
    return groups


# -- the child side -----------------------------------------------------------------------------
def epoch1(argv: list[str]) -> int:
    """``epoch1 URL CACHE_DIR``: print one JSON object with epoch 1's figures (see the module doc)."""
    url, cache_dir = argv
    import h5stream

    try:
        from benchmarks.remote import import_stream_modules

        import_stream_modules()
    except ImportError:  # a module the base version does not have: it is imported on open, as before
        pass
    threads0 = thread_cpu_s()
    cpu0, t0 = _cpu_s(), time.monotonic()
    with h5stream.open(url, batch_size=BATCH, seed=0, cache_dir=cache_dir) as stream:
        opened = time.monotonic()
        first, nbytes = None, 0
        for x, _ in stream:
            if first is None:
                first = time.monotonic() - opened
            nbytes += x.nbytes
        seconds = time.monotonic() - opened
        threads = cpu_by_group(threads0, thread_cpu_s())  # before close(): the stream's threads still live
    cpu_s = _cpu_s() - cpu0
    gb = nbytes / 1e9
    print(json.dumps({"mb_per_s": nbytes / seconds / 1e6, "first_batch_s": first, "open_s": opened - t0,
                      "cpu_s_per_gb": cpu_s / gb, "h5stream": h5stream.__file__,
                      **{f"cpu_s_per_gb_{g}": s / gb for g, s in sorted(threads.items())},
                      **({"cpu_s_per_gb_rest": (cpu_s - sum(threads.values())) / gb} if threads else {})}))
    return 0


def ceiling(argv: list[str]) -> int:
    """``ceiling URL``: the aligned limit (:func:`benchmarks.remote._ceiling`) as one JSON object."""
    from benchmarks.remote import _ceiling

    r = _ceiling(argv[0])
    print(json.dumps({"mb_per_s": r["mb_per_s"], "cpu_s_per_gb": r["client_cpu_s"] / (r["bytes"] / 1e9)}))
    return 0


# -- the parent side ----------------------------------------------------------------------------
def _child(entry: str, args: list, env: dict, cwd: str) -> dict:
    # `python -c` puts its working directory first on sys.path: run it from the version's own folder.
    proc = subprocess.run(child_command(f"benchmarks.remote_ab:{entry}", *args), env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"benchmarks.remote_ab: {entry} {args[0]} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(args) -> dict:
    from benchmarks.ab import unpack
    from benchmarks.data import make_bench_file, rows_for_gb
    from benchmarks.seaweed import ACCESS_KEY, SECRET_KEY, SeaweedS3

    versions = {"base": unpack(args.base, args.data), "head": REPO}
    local = os.path.join(args.data, f"remote-{args.gb:g}g.h5")
    make_bench_file(local, rows=rows_for_gb(args.gb, 128, 3), size=128, progress=False)
    schemes = SCHEMES if args.scheme == "both" else (args.scheme,)
    results = []
    with tempfile.TemporaryDirectory(dir=args.data, prefix="seaweed-") as workdir:
        server = SeaweedS3(workdir)
        try:
            server.put(KEY, local)
            urls = {"s3": f"s3://{server.bucket}/{KEY}", "http": server.http_url(KEY)}
            env = child_env(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                            AWS_ENDPOINT_URL=server.endpoint, AWS_EC2_METADATA_DISABLED="true",
                            OPENBLAS_NUM_THREADS="1")
            for i in range(args.rounds):
                row = {}
                for scheme in schemes:
                    log(f"  round {i + 1}/{args.rounds}: {scheme}, limit")
                    row[f"{scheme} | limit"] = _child("ceiling", [urls[scheme]], env, REPO)
                    for version in (("base", "head") if i % 2 == 0 else ("head", "base")):
                        log(f"  round {i + 1}/{args.rounds}: {scheme}, {version}")
                        venv = {**env, "PYTHONPATH": os.pathsep.join([versions[version], REPO])}
                        with tempfile.TemporaryDirectory(dir=workdir, prefix="cache-") as cache:
                            got = _child("epoch1", [urls[scheme], cache], venv, versions[version])
                        if not got.pop("h5stream").startswith(versions[version]):
                            raise SystemExit(f"{version}: imported another h5stream than {versions[version]}'s")
                        got["x_limit"] = got["mb_per_s"] / row[f"{scheme} | limit"]["mb_per_s"]
                        row[f"{scheme} | {version}"] = got
                results.append(row)
        finally:
            server.stop()
    table = {}
    for key, runs in by_name(results).items():
        table[key] = {k: median(r[k] for r in runs if k in r) for k in set().union(*runs)}
    for scheme in schemes:
        for figure in ("mb_per_s", "cpu_s_per_gb"):
            pairs = [{"h": r[f"{scheme} | head"][figure], "b": r[f"{scheme} | base"][figure]} for r in results]
            table[f"{scheme} | head/base {figure}"] = same_round_ratios(pairs, "h", "b")
    return {"base": args.base, "head": "working tree", "rounds": args.rounds, "store_gb": args.gb,
            "cpus": os.cpu_count(), "load_average": os.getloadavg(), "table": table, "rounds_raw": results}


def format_text(r: dict) -> str:
    t = r["table"]
    lines = [f"epoch 1 of a URL stream into an empty disk cache: h5stream {r['base']} (base) vs this checkout (head),"
             f" {r['rounds']} rounds, medians, {r['store_gb']:g} GB store, {r['cpus']} CPUs",
             f"  {'run':<14}{'MB/s':>8}{'x limit':>9}{'CPU-s/GB':>10}{'first batch s':>15}"]
    for scheme in SCHEMES:
        if f"{scheme} | limit" not in t:
            continue
        lim = t[f"{scheme} | limit"]
        lines.append(f"  {scheme + ' limit':<14}{lim['mb_per_s']:>8.0f}{'':>9}{lim['cpu_s_per_gb']:>10.2f}")
        for version in ("base", "head"):
            v = t[f"{scheme} | {version}"]
            split = "  ".join(f"{k[len('cpu_s_per_gb_'):]} {v[k]:.2f}" for k in sorted(v)
                              if k.startswith("cpu_s_per_gb_"))
            lines.append(f"  {scheme + ' ' + version:<14}{v['mb_per_s']:>8.0f}{v['x_limit']:>9.2f}"
                         f"{v['cpu_s_per_gb']:>10.2f}{v['first_batch_s']:>15.2f}"
                         + (f"   by thread: {split}" if split else ""))
        for figure, label in (("mb_per_s", "MB/s"), ("cpu_s_per_gb", "CPU-s/GB")):
            ratio = t[f"{scheme} | head/base {figure}"]
            lines.append(f"  {scheme} head/base {label}, same round: {ratio['median']:.2f}x "
                         f"({ratio['min']:.2f}-{ratio['max']:.2f})")
    lines.append(f"  load average at the end: {', '.join(f'{x:.2f}' for x in r['load_average'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = new_parser(__doc__.splitlines()[0], prog="python -m benchmarks.remote_ab")
    parser.add_argument("--base", required=True, help="the commit to compare this checkout with")
    parser.add_argument("--gb", type=float, default=0.25, help="store size, GB")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each running both versions")
    parser.add_argument("--scheme", choices=(*SCHEMES, "both"), default="both",
                        help="which server the streams read from")
    return run_cli(parser, argv, run, format_text)


if __name__ == "__main__":
    raise SystemExit(main())
