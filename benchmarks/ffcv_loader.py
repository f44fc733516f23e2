"""FFCV's loader alone on raw rows, run by FFCV's own venv's python (a child of :mod:`benchmarks.loader`; this file
imports nothing of h5stream).

    /path/to/ffcv-venv/bin/python benchmarks/ffcv_loader.py IMAGES.npy LABELS.npy BETON BATCH THREADS EPOCHS

Writes the uint8 ``(n, H, W, 3)`` rows of ``IMAGES.npy`` (read through a memory map) to ``BETON`` with
``DatasetWriter`` (``RGBImageField(write_mode="raw")``, an ``IntField`` label) unless it exists, reads the file once
(warm page cache, as the h5stream rows of the same round), then streams it with ``Loader(batch_size=BATCH,
num_workers=THREADS, order=OrderOption.RANDOM, os_cache=True)`` through ``SimpleRGBImageDecoder()`` (no
augmentation): the first epoch timed from the loader's creation (numba's compilation included, as a user meets it),
then ``EPOCHS`` steady epochs.  Prints one JSON object: first batch seconds, first-epoch and steady rows per second,
and this process's CPU time per steady row (all its threads).
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
try:
    from peer_usage import usage  # beside this file (run as a script by a peer's venv: its folder is on the path)
except ImportError:  # python -m benchmarks.<this>
    from benchmarks.peer_usage import usage


def main(argv) -> int:
    if len(argv) != 6:  # --help, or run by hand: the usage line, not a traceback
        return usage(__doc__, argv)
    images_npy, labels_npy, beton, batch, threads, epochs = argv
    from ffcv.fields import IntField, RGBImageField
    from ffcv.fields.decoders import IntDecoder, SimpleRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.writer import DatasetWriter
    from ffcv_crop import _Rows  # beside this file (run as a script: its folder is on the path)

    if not os.path.exists(beton):
        images, labels = np.load(images_npy, mmap_mode="r"), np.load(labels_npy)
        tmp = beton + ".tmp"
        DatasetWriter(tmp, {"image": RGBImageField(write_mode="raw"), "label": IntField()},
                      num_workers=1).from_indexed_dataset(_Rows(images, labels))
        os.replace(tmp, beton)
    with open(beton, "rb") as fh:  # warm, as the h5stream store is
        while fh.read(64 << 20):
            pass
    t0 = time.perf_counter()
    loader = Loader(beton, batch_size=int(batch), num_workers=int(threads), order=OrderOption.RANDOM, os_cache=True,
                    pipelines={"image": [SimpleRGBImageDecoder()], "label": [IntDecoder()]})
    rows, first_batch = 0, None
    for x, _ in loader:
        if first_batch is None:
            first_batch = time.perf_counter() - t0
        rows += len(x)
    first_epoch = rows / (time.perf_counter() - t0)
    t1, c1, rows = time.perf_counter(), time.process_time(), 0
    for _ in range(int(epochs)):
        for x, _ in loader:
            rows += len(x)
    wall, cpu = time.perf_counter() - t1, time.process_time() - c1
    print(json.dumps({"first_batch_s": first_batch, "first_epoch_rows_s": first_epoch, "steady_rows_s": rows / wall,
                      "cpu_us_per_row": cpu / rows * 1e6}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
