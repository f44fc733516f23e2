"""Ingest a folder as N parts on a Dask cluster, then stream the parts as one dataset.

Each part is one task: ``h5stream ingest SRC OUT_DIR/part-I.h5 --part I/N --append`` in a process of its own (so
a part that fails or is killed never takes the worker down), on whichever worker Dask gives it.  ``--append``
makes a task safe to run again: it creates the part, or finishes one a killed attempt left (the same rows in the
same order), or has nothing left to do; Dask retries a failed task (``retries``).  Nothing is shared between the
tasks but SRC: each discovers the same files and keeps its own (docs/parts.md says the rule).  The parts are then
listed in a manifest, ``OUT_DIR/parts.json``, that ``h5stream.open`` streams as one store.

    python examples/ingest_parts_dask.py SRC OUT_DIR --parts 8                       # a local cluster, 2 workers
    python examples/ingest_parts_dask.py SRC OUT_DIR --parts 64 --scheduler tcp://head:8786  # an existing one
    python examples/ingest_parts_dask.py --quick --work /tmp/demo                   # tiny generated data

Every other flag after ``--`` goes to each ``h5stream ingest`` (``-- --size 64 --labels none``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def ingest_part(src: str, out: str, index: int, count: int, options: tuple[str, ...] = ()) -> dict:
    """Run part ``index`` of ``count`` (on a Dask worker): the ingest's summary line, or RuntimeError with its
    one-line error."""
    cmd = [sys.executable, "-m", "h5stream", "ingest", src, out, "--part", f"{index}/{count}", "--append",
           "--workers", "0", *options]  # one decoding process per task (pass -- --workers N for more)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"]
        raise RuntimeError(f"part {index}/{count}: {lines[-1]}")
    return {"index": index, "out": out, "summary": proc.stdout.strip().splitlines()[0]}


def ingest_parts(client, src: str, out_dir: str, count: int, options=(), retries: int = 2) -> str:
    """Ingest ``src`` as ``count`` parts in ``out_dir`` on the Dask ``client``'s cluster; returns the manifest's
    path once every part is done (a part that still fails after ``retries`` raises its error here)."""
    os.makedirs(out_dir, exist_ok=True)
    src = os.path.abspath(src)
    outs = [os.path.join(os.path.abspath(out_dir), f"part-{i}.h5") for i in range(count)]
    futures = [client.submit(ingest_part, src, out, i, count, tuple(options), key=f"h5stream-part-{i}-of-{count}",
                             retries=retries, pure=False)
               for i, out in enumerate(outs)]
    for result in client.gather(futures):
        print(result["summary"])
    manifest = os.path.join(out_dir, "parts.json")
    with open(manifest + ".tmp", "w") as f:  # renamed whole: a reader never sees half a manifest
        json.dump({"h5stream_parts": 1, "parts": [os.path.basename(o) for o in outs]}, f)
    os.replace(manifest + ".tmp", manifest)
    return manifest


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", nargs="?")
    p.add_argument("out_dir", nargs="?")
    p.add_argument("--parts", type=int, default=4)
    p.add_argument("--scheduler", default=None, help="address of a running Dask scheduler (default: a local "
                   "cluster of --workers processes)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="ingest tiny generated data")
    p.add_argument("--work", default=None, help="with --quick: the folder to work in")
    args = p.parse_args(argv)
    from dask.distributed import Client, LocalCluster

    import h5stream

    if args.quick:
        from h5stream.samples import make_class_folder

        work = args.work or "parts-demo"
        args.src, args.out_dir = os.path.join(work, "src"), os.path.join(work, "parts")
        make_class_folder(args.src, classes=("a", "b", "c"), per_class=(8, 8, 8), size=(24, 24), fmt="png", seed=0)
        extra = extra or ["--size", "16"]
    if not args.src or not args.out_dir:
        p.error("give SRC and OUT_DIR (or --quick)")
    if args.scheduler:
        client = Client(args.scheduler)
        cluster = None
    else:
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
    try:
        manifest = ingest_parts(client, args.src, args.out_dir, args.parts, extra)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    with h5stream.open(manifest, batch_size=32) as stream:
        rows = sum(len(x) for x, _ in stream)
    print(f"{manifest}: {args.parts} parts, one epoch of {rows} rows streamed as one dataset")
    return 0


if __name__ == "__main__":
    sys.exit(main())
