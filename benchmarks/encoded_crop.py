"""Decode + random resized crop + flip per core: h5stream on a JPEG q90 store against FFCV on the same images.

Part of :mod:`benchmarks.encoded` (``--crop 112``): the JPEG q90 store of ``--size`` px rows is streamed with
``Augment(output_size=(c, c), horizontal_flip=True)`` (``crop="random_resized"``, each row decoded at the scale its
crop needs) by the consumer's thread (``workers=0``, one core); FFCV 1.0.2 gets the same pixels (the raw store's
rows), written with its ``DatasetWriter`` as JPEG q90, and streams them with ``RandomResizedCropRGBImageDecoder((c,
c))`` + ``RandomHorizontalFlip()``, ``num_workers=1``, ``order=RANDOM``, ``os_cache=True``, timed after its first
epoch (its JIT), in a child process run by FFCV's own venv's python (:mod:`benchmarks.ffcv_crop`; ``--ffcv-python``,
default ``$H5STREAM_FFCV_PYTHON`` or ``.venv-ffcv/bin/python`` at the repository root, built as
docs/performance.md's "Peer loaders' venvs" says).  DALI's CPU pipeline gets the JPEG q90
store's own bytes and streams them with ``fn.decoders.image_random_crop(device="cpu")`` + ``fn.resize`` +
``fn.flip``, ``num_threads=1``, no GPU (:mod:`benchmarks.dali_crop`, run by DALI's venv's python,
``--dali-python``, default ``$H5STREAM_DALI_PYTHON`` or ``.venv-dali/bin/python`` at the repository root: ``python
-m venv .venv-dali && .venv-dali/bin/pip install nvidia-dali-cuda120``).  Without that python a column is skipped
with a line saying so.  Every rate is images per CPU-second of the process that decodes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from benchmarks.harness import REPO, log, median, self_and_children_cpu_s

DEFAULT_FFCV_PYTHON = os.environ.get("H5STREAM_FFCV_PYTHON", os.path.join(REPO, ".venv-ffcv", "bin", "python"))
DEFAULT_DALI_PYTHON = os.environ.get("H5STREAM_DALI_PYTHON", os.path.join(REPO, ".venv-dali", "bin", "python"))
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
    try:
        return peer_child(python, "ffcv_crop.py", "FFCV", images_npy, labels_npy, workdir, crop, rounds)
    finally:
        for p in (images_npy, labels_npy):
            os.unlink(p)


def dali_rates(jpeg_store: str, crop: int, rounds: int, workdir: str, python: str) -> dict:
    """DALI's CPU pipeline's rates on the JPEG store's own bytes (see the module doc), or ``{"skipped": why}``."""
    import h5py
    import numpy as np

    from h5stream.store import schema

    if not os.path.exists(python):
        return {"skipped": f"no DALI venv at {python} (--dali-python): DALI not measured"}
    jpegs = os.path.join(workdir, "dali-jpegs.npz")
    with h5py.File(jpeg_store, "r") as f:
        np.savez(jpegs, data=f[schema.IMAGE_BYTES][:], ends=f[schema.IMAGE_ENDS][:])
    try:
        return peer_child(python, "dali_crop.py", "DALI", jpegs, crop, rounds)
    finally:
        os.unlink(jpegs)


def peer_child(python: str, script: str, name: str, *args) -> dict:
    """``python benchmarks/<script> args...`` without this repository on its path: its last line's JSON, or
    ``{"skipped": "<name>'s run failed (<its last line of stderr>)"}``."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), script)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([python, path, *map(str, args)], capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"skipped": f"{name}'s run failed ({tail})"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_crop(stores: dict, crop: int, rounds: int, workdir: str, python: str = DEFAULT_FFCV_PYTHON,
             dali_python: str = DEFAULT_DALI_PYTHON) -> dict:
    """h5stream's rounds on the JPEG q90 store, FFCV's on the same pixels and DALI's on the same JPEGs: medians
    and the ratios of medians."""
    if stores.get("jpeg q90") is None or stores.get("raw") is None:
        raise SystemExit("benchmarks.encoded: --crop needs the raw and jpeg q90 stores")
    ours = []
    for r in range(rounds):
        ours.append(h5stream_rate(stores["jpeg q90"], crop))
        log(f"  round {r + 1}/{rounds}: crop {crop}, h5stream jpeg q90: {ours[-1]['images_per_cpu_s']:,.0f} img/CPU-s")
    out = {"output": crop, "h5stream": {"rounds": ours, "images_per_s": median(x["images_per_s"] for x in ours),
                                        "images_per_cpu_s": median(x["images_per_cpu_s"] for x in ours)}}
    for peer, theirs in (("ffcv", ffcv_rates(stores["raw"], crop, rounds, workdir, python)),
                         ("dali", dali_rates(stores["jpeg q90"], crop, rounds, workdir, dali_python))):
        out[peer] = theirs
        if "skipped" in theirs:
            log(theirs["skipped"])
            continue
        theirs["images_per_s"] = median(x["images_per_s"] for x in theirs["rounds"])
        theirs["images_per_cpu_s"] = median(x["images_per_cpu_s"] for x in theirs["rounds"])
        out[f"per_core_vs_{peer}"] = out["h5stream"]["images_per_cpu_s"] / theirs["images_per_cpu_s"]
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
    dali = crop.get("dali", {"skipped": "not run"})
    if "skipped" in dali:
        lines.append(f"| DALI CPU pipeline | skipped: {dali['skipped']} | |")
    else:
        lines.append(f"| DALI {dali.get('version', '')} CPU pipeline, the store's JPEGs, num_threads=1, no GPU | "
                     f"{dali['images_per_s']:,.0f} | {dali['images_per_cpu_s']:,.0f} |")
    lines.append("")
    for peer, name in (("ffcv", "FFCV"), ("dali", "DALI")):
        if f"per_core_vs_{peer}" in crop:
            lines.append(f"h5stream per core / {name} per core: {crop[f'per_core_vs_{peer}']:.2f}x")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit("run it as: python -m benchmarks.encoded --crop 112")
