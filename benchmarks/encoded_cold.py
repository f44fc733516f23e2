"""Cold, on a store larger than the memory its reader may use in raw form but not as JPEG: epoch rates and disk bytes.

    python -m benchmarks.encoded_cold                                   # 2,000 photos at 224 px, 256 MiB, 3 epochs
    python -m benchmarks.encoded_cold --photos 600 --epochs 2          # a smoke run
    python -m benchmarks.encoded_cold --photos 20000 --cold-limit 1GiB  # raw 2.8 GiB: 2.8x the limit
    python -m benchmarks.encoded_cold --json                           # one JSON object

The same photo-like JPEGs (:func:`benchmarks.data.ensure_photos`) ingested at ``--size`` px as a raw store and as
a JPEG q90 store (the caches of :mod:`benchmarks.encoded`).  A store larger than the machine's RAM is not needed:
each store is read by a fresh process whose memory, **page cache included**, is bounded by a memory cgroup of
``--cold-limit`` bytes (cgroup v1: a child of this process's memory cgroup with ``memory.limit_in_bytes``; cgroup
v2: ``systemd-run --scope -p MemoryMax=``).  The raw store must be larger than the limit and the JPEG store
smaller (less the reader's own memory), or the run is refused with the sizes.  Where no cgroup can be made, the
reader drops the store from the page cache (``POSIX_FADV_DONTNEED``) before every epoch instead, and the output
says ``"method": "fadvise"``: every epoch is then cold for both stores, which is not the case measured.

Each store is dropped from the page cache first, then the reader streams it for ``--epochs`` epochs
(``workers=--workers``, ``--augment`` preset or none, ``memory_budget=--budget``, ``direct_io="auto"``, or ``True`` for
the raw store with ``--raw-direct-io``; ``"auto"`` sees the cgroup's limit, v1 or v2, and reads a raw store larger than
it past the page cache): per epoch
images/s and the bytes its process tree read from the disk (``read_bytes`` of ``/proc/PID/io``, with the workers').
The raw store is read again from the disk every epoch; the JPEG store once.  Ratios are JPEG over raw, per epoch,
in the same run; ``--rounds`` repeats the pair (order alternating) and the table gives medians.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time

from benchmarks.harness import add_data_option, add_json_option, child_command, child_env, emit, log, median, new_parser
from h5stream.read.source import cgroup_paths

KINDS = ("raw", "jpeg q90")
BATCH = 64
CGROUP_V1 = "/sys/fs/cgroup/memory"
CGROUP_V2 = "/sys/fs/cgroup/cgroup.controllers"


# -- the reader (a child process) -----------------------------------------------------------------------------------
def tree_read_bytes() -> int:
    """Bytes this process and its live descendants have read from storage (``/proc/PID/io`` ``read_bytes``)."""
    import psutil

    me = psutil.Process()
    total = 0
    for p in [me, *me.children(recursive=True)]:
        try:
            total += p.io_counters().read_bytes
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def reader(argv: list[str]) -> int:
    """The child: ``PATH EPOCHS WORKERS AUGMENT BUDGET CGROUP_DIR|- EVICT(0/1) [DIRECT_IO(auto/0/1)]``; prints one
    JSON object."""
    path, epochs, workers, augment, budget, cgroup_dir, evict, *direct = argv
    direct_io = {"auto": "auto", "1": True, "0": False}[direct[0] if direct else "auto"]
    if cgroup_dir != "-":  # before anything is imported or read: what follows is charged to the limited cgroup
        with open(os.path.join(cgroup_dir, "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
    import h5stream
    from h5stream.measure.cold import evict_from_page_cache
    from h5stream.read.source import resolve_direct_io

    aug = None if augment == "none" else h5stream.Augment.preset(augment)
    out = {"direct_io": resolve_direct_io(path, direct_io), "epochs": []}
    with h5stream.open(path, batch_size=BATCH, seed=0, augment=aug, workers=int(workers),
                       memory_budget=budget, direct_io=direct_io) as stream:
        for _ in range(int(epochs)):
            if evict == "1":
                evict_from_page_cache(path)
            b0, t0 = tree_read_bytes(), time.perf_counter()
            n = sum(len(x) for x, _ in stream)
            seconds = time.perf_counter() - t0
            out["epochs"].append({"images": n, "seconds": seconds, "images_per_s": n / seconds,
                                  "read_bytes": tree_read_bytes() - b0})
    if cgroup_dir != "-" and os.path.exists(os.path.join(cgroup_dir, "memory.max_usage_in_bytes")):
        with open(os.path.join(cgroup_dir, "memory.max_usage_in_bytes")) as fh:
            out["cgroup_peak_bytes"] = int(fh.read())
    print(json.dumps(out))
    return 0


# -- the limit ----------------------------------------------------------------------------------------------------
class Limit:
    """Owns a memory cgroup of ``limit`` bytes for one reader at a time (v1), or the ``systemd-run`` prefix (v2),
    or nothing (``method == "fadvise"``: the reader evicts each epoch).  :meth:`close` removes the cgroup."""

    def __init__(self, limit: int):
        self.limit, self.dir, self.prefix, self.method, self.why = limit, None, [], "fadvise", ""
        if os.path.isdir(CGROUP_V1) and os.path.exists(os.path.join(CGROUP_V1, "memory.limit_in_bytes")):
            with open("/proc/self/cgroup") as fh:
                rel = cgroup_paths(fh.read())[1]
            try:
                self.dir = os.path.join(CGROUP_V1, (rel or "/").lstrip("/"), f"h5stream-cold-{os.getpid()}")
                os.makedirs(self.dir)
                with open(os.path.join(self.dir, "memory.limit_in_bytes"), "w") as fh:
                    fh.write(str(limit))
                self.method = "cgroup v1 memory.limit_in_bytes"
                return
            except OSError as e:
                self.why = f"cgroup v1: {e}"
                self.close()
        if os.path.exists(CGROUP_V2) and shutil.which("systemd-run"):
            probe = subprocess.run(["systemd-run", "--scope", "--quiet", "-p", f"MemoryMax={limit}", "true"],
                                   capture_output=True, text=True, check=False)
            if probe.returncode == 0:
                self.prefix = ["systemd-run", "--scope", "--quiet", "-p", f"MemoryMax={limit}", "--"]
                self.method = "cgroup v2 systemd-run MemoryMax"
                return
            self.why += f"; systemd-run: {probe.stderr.strip()}"

    def fresh(self) -> None:
        """Empty the v1 cgroup's page cache charges left by the previous reader (it has exited)."""
        if self.dir:
            try:
                with open(os.path.join(self.dir, "memory.force_empty"), "w") as fh:
                    fh.write("0")
                with open(os.path.join(self.dir, "memory.max_usage_in_bytes"), "w") as fh:
                    fh.write("0")
            except OSError:
                pass

    def close(self) -> None:
        if self.dir and os.path.isdir(self.dir):
            self.fresh()
            try:
                os.rmdir(self.dir)
            except OSError as e:
                log(f"could not remove {self.dir}: {e}")
        self.dir = None


def read_store(path: str, limit: Limit, args, direct_io: str = "auto") -> dict:
    from h5stream.measure.cold import evict_from_page_cache

    limit.fresh()
    evict_from_page_cache(path)
    cmd = limit.prefix + child_command("benchmarks.encoded_cold:reader", path, args.epochs, args.workers,
                                       args.augment, args.budget, limit.dir or "-",
                                       "1" if limit.method == "fadvise" else "0", direct_io)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), check=False)
    if proc.returncode != 0:
        raise SystemExit(f"benchmarks.encoded_cold: the reader of {path} failed (exit {proc.returncode}; "
                         f"-9 is the cgroup's OOM killer: raise --cold-limit or lower --budget): "
                         f"{(proc.stderr.strip().splitlines() or ['(no output)'])[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def epoch_ratios(raw: dict, jpeg: dict) -> list[float]:
    """JPEG over raw images/s, epoch by epoch, of one round (pure)."""
    return [j["images_per_s"] / r["images_per_s"] for r, j in zip(raw["epochs"], jpeg["epochs"])]


def summarise(rounds: list[dict], epochs: int) -> dict:
    """Per kind and epoch the median images/s and read bytes over ``rounds``; per epoch the median same-round
    JPEG/raw ratio (pure)."""
    out = {}
    for kind in KINDS:
        out[kind] = [{"images_per_s": median(r[kind]["epochs"][e]["images_per_s"] for r in rounds),
                      "read_bytes": median(r[kind]["epochs"][e]["read_bytes"] for r in rounds)}
                     for e in range(epochs)]
    out["jpeg_vs_raw"] = [median(epoch_ratios(r["raw"], r["jpeg q90"])[e] for r in rounds) for e in range(epochs)]
    return out


def run(args) -> dict:
    from benchmarks.data import ensure_photos
    from benchmarks.encoded import ensure_kind
    from h5stream.read.plan import parse_bytes

    limit_bytes = parse_bytes(args.cold_limit, "--cold-limit")
    photos = ensure_photos(args.data, args.photos)
    stores = {kind: ensure_kind(args.data, photos, args.size, kind) for kind in KINDS}
    sizes = {kind: os.path.getsize(p) for kind, p in stores.items()}
    if not sizes["jpeg q90"] < limit_bytes < sizes["raw"]:
        raise SystemExit(f"benchmarks.encoded_cold: --cold-limit {limit_bytes:,} B must lie between the JPEG store "
                         f"({sizes['jpeg q90']:,} B) and the raw store ({sizes['raw']:,} B): change --photos, --size "
                         f"or --cold-limit")
    limit = Limit(limit_bytes)
    if limit.method == "fadvise":
        log(f"no memory cgroup ({limit.why.strip('; ')}): evicting the store before every epoch instead")
    rounds = []
    try:
        for r in range(args.rounds):
            got = {}
            for kind in (KINDS if r % 2 == 0 else KINDS[::-1]):
                direct_io = "1" if kind == "raw" and args.raw_direct_io else "auto"
                got[kind] = read_store(stores[kind], limit, args, direct_io)
                log(f"  round {r + 1}/{args.rounds}, {kind}: " + ", ".join(
                    f"{e['images_per_s']:,.0f} img/s {e['read_bytes'] / 2**20:,.0f} MiB" for e in got[kind]["epochs"]))
            rounds.append(got)
    finally:
        limit.close()
    return {"photos": photos, "size": args.size, "cold_limit_bytes": limit_bytes, "method": limit.method,
            "store_bytes": sizes, "epochs": args.epochs, "workers": args.workers, "augment": args.augment,
            "budget": args.budget, "batch_size": BATCH, "direct_io": {k: rounds[0][k]["direct_io"] for k in KINDS},
            "cgroup_peak_bytes": {k: rounds[0][k].get("cgroup_peak_bytes") for k in KINDS},
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
            "rounds": rounds, "summary": summarise(rounds, args.epochs)}


def table(out: dict) -> str:
    s, mib = out["summary"], 2 ** 20
    peak = ", ".join(f"{k} {v / mib:,.0f} MiB" for k, v in out["cgroup_peak_bytes"].items() if v)
    lines = [f"{out['size']} px rows of {out['photos']}: raw store {out['store_bytes']['raw'] / mib:,.0f} MiB, "
             f"JPEG q90 {out['store_bytes']['jpeg q90'] / mib:,.0f} MiB; reader bounded to "
             f"{out['cold_limit_bytes'] / mib:,.0f} MiB by {out['method']}" + (f" (peak {peak})" if peak else ""),
             f"workers={out['workers']}, augment={out['augment']}, budget {out['budget']}, batch {out['batch_size']}, "
             f"direct_io resolved {out['direct_io']}; {len(out['rounds'])} rounds, medians; {out['machine']}", "",
             "| epoch | raw img/s | raw MiB read | JPEG q90 img/s | JPEG q90 MiB read | JPEG / raw |",
             "| --- | --- | --- | --- | --- | --- |"]
    for e in range(out["epochs"]):
        raw, jpg = s["raw"][e], s["jpeg q90"][e]
        lines.append(f"| {e + 1} | {raw['images_per_s']:,.0f} | {raw['read_bytes'] / mib:,.1f} | "
                     f"{jpg['images_per_s']:,.0f} | {jpg['read_bytes'] / mib:,.1f} | {s['jpeg_vs_raw'][e]:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = new_parser(__doc__.split("\n\n")[0])
    p.add_argument("--photos", type=int, default=2000, help="photos to ingest")
    p.add_argument("--size", type=int, default=224, help="stored side in px")
    p.add_argument("--cold-limit", default="256MiB",
                   help="memory (page cache included) of the reading process")
    p.add_argument("--epochs", type=int, default=3, help="cold epochs per stream")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds; medians")
    p.add_argument("--workers", type=int, default=0, help="the streams' augmenting workers")
    p.add_argument("--augment", default="none", help="an Augment preset, or none")
    p.add_argument("--raw-direct-io", action="store_true",
                   help="read the raw store with direct_io=True; default: direct_io='auto' for both (which "
                   "sees the cgroup's limit)")
    p.add_argument("--budget", default="96MiB", help="the reader's memory_budget")
    add_data_option(p)
    add_json_option(p)
    args = p.parse_args(argv)
    emit(run(args), as_json=args.json, format_text=table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
