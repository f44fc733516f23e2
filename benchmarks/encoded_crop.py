"""Decode + random resized crop + flip per core: h5stream on a JPEG q90 store against FFCV on the same images.

Part of :mod:`benchmarks.encoded` (``--crop 112``): the JPEG q90 store of ``--size`` px rows is streamed with
``Augment(output_size=(c, c), horizontal_flip=True)`` (``crop="random_resized"``, each row decoded at the scale its
crop needs) by the consumer's thread (``workers=0``, one core); FFCV 1.0.2 gets the same pixels (the raw store's
rows), written with its ``DatasetWriter`` as JPEG q90, and streams them with ``RandomResizedCropRGBImageDecoder((c,
c))`` + ``RandomHorizontalFlip()``, ``num_workers=1``, ``order=RANDOM``, ``os_cache=True``, timed after its first
epoch (its JIT), in a child process run by FFCV's own venv's python (:mod:`benchmarks.ffcv_crop`; ``--ffcv-python``,
default ``$H5STREAM_FFCV_PYTHON`` or ``/work/peers/ffcv/bin/python``).  Without that python the FFCV column is
skipped with a line saying so.  Both rates are images per CPU-second of the process that decodes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from benchmarks.harness import log, median, self_and_children_cpu_s

DEFAULT_FFCV_PYTHON = os.environ.get("H5STREAM_FFCV_PYTHON", "/work/peers/ffcv/bin/python")
BATCH = 64


def warm_epoch_rate(path: str, augment) -> dict:
    """One warm epoch of ``path`` with ``augment`` (after one not timed), workers=0: images/s and images per
    CPU-second."""
    import h5stream

    with h5stream.open(path, batch_size=BATCH, seed=0, augment=augment, workers=0) as stream:
        for _ in stream:
            pass
        t0, c0 = time.perf_counter(), self_and_children_cpu_s()
        n = sum(len(x) for x, _ in stream)
        seconds, cpu = time.perf_counter() - t0, self_and_children_cpu_s() - c0
    return {"images_per_s": n / seconds, "images_per_cpu_s": n / max(cpu, 1e-9)}


def h5stream_rate(path: str, crop: int) -> dict:
    """One warm epoch of the random resized crop + flip stream (after one not timed), workers=0."""
    import h5stream

    return warm_epoch_rate(path, h5stream.Augment(output_size=(crop, crop), horizontal_flip=True))


def ffcv_rates(raw_store: str, crop: int, rounds: int, workdir: str, python: str) -> dict:
    """FFCV's rates on the raw store's pixels (see the module doc), or ``{"skipped": why}``."""
    import h5py
    import numpy as np

    from h5stream.store import schema

    if not os.path.exists(python):
        return {"skipped": f"no FFCV venv at {python} (--ffcv-python): FFCV not measured"}
    with h5py.File(raw_store, "r") as f:
        images, labels = f[schema.IMAGES][:], f[schema.LABELS][:]
    images_npy, labels_npy = os.path.join(workdir, "ffcv-images.npy"), os.path.join(workdir, "ffcv-labels.npy")
    np.save(images_npy, images)
    np.save(labels_npy, labels.astype(np.int64).reshape(len(labels), -1)[:, 0])
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ffcv_crop.py")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([python, script, images_npy, labels_npy, workdir, str(crop), str(rounds)],
                          capture_output=True, text=True, env=env, check=False)
    for p in (images_npy, labels_npy):
        os.unlink(p)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"skipped": f"FFCV's run failed ({tail})"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_crop(stores: dict, crop: int, rounds: int, workdir: str, python: str = DEFAULT_FFCV_PYTHON) -> dict:
    """h5stream's rounds on the JPEG q90 store and FFCV's on the same pixels: medians and the ratio of medians."""
    if stores.get("jpeg q90") is None or stores.get("raw") is None:
        raise SystemExit("benchmarks.encoded: --crop needs the raw and jpeg q90 stores")
    ours = []
    for r in range(rounds):
        ours.append(h5stream_rate(stores["jpeg q90"], crop))
        log(f"  round {r + 1}/{rounds}: crop {crop}, h5stream jpeg q90: {ours[-1]['images_per_cpu_s']:,.0f} img/CPU-s")
    out = {"output": crop, "h5stream": {"rounds": ours, "images_per_s": median(x["images_per_s"] for x in ours),
                                        "images_per_cpu_s": median(x["images_per_cpu_s"] for x in ours)}}
    theirs = ffcv_rates(stores["raw"], crop, rounds, workdir, python)
    if "skipped" in theirs:
        log(theirs["skipped"])
        out["ffcv"] = theirs
        return out
    theirs["images_per_s"] = median(x["images_per_s"] for x in theirs["rounds"])
    theirs["images_per_cpu_s"] = median(x["images_per_cpu_s"] for x in theirs["rounds"])
    out["ffcv"] = theirs
    out["per_core_vs_ffcv"] = out["h5stream"]["images_per_cpu_s"] / theirs["images_per_cpu_s"]
    return out


def crop_table(crop: dict) -> str:
    """The comparison's lines for :func:`benchmarks.encoded.table`."""
    c, ours, theirs = crop["output"], crop["h5stream"], crop["ffcv"]
    lines = ["", f"Decode + random resized crop to {c}x{c} + flip, one core (medians):", "",
             "| loader | img/s | img/CPU-s |", "| --- | --- | --- |",
             f"| h5stream, JPEG q90 store, workers=0 | {ours['images_per_s']:,.0f} | {ours['images_per_cpu_s']:,.0f} |"]
    if "skipped" in theirs:
        lines.append(f"| FFCV 1.0.2 | skipped: {theirs['skipped']} | |")
    else:
        lines.append(f"| FFCV 1.0.2, JPEG q90, num_workers=1, after its first epoch | {theirs['images_per_s']:,.0f} | "
                     f"{theirs['images_per_cpu_s']:,.0f} |")
        lines.append(f"\nh5stream per core / FFCV per core: {crop['per_core_vs_ffcv']:.2f}x")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit("run it as: python -m benchmarks.encoded --crop 112")
