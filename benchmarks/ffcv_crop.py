"""FFCV's decode + random resized crop + flip rate on given images, run by FFCV's own venv's python (a child of
:mod:`benchmarks.encoded_crop`; this file imports nothing of h5stream).

    /path/to/ffcv-venv/bin/python benchmarks/ffcv_crop.py IMAGES.npy LABELS.npy WORKDIR OUTPUT EPOCHS

Writes the uint8 ``(n, H, W, 3)`` images with ``DatasetWriter`` (``RGBImageField(write_mode="jpg",
jpeg_quality=90)``, an ``IntField`` label), then streams them with ``Loader(batch_size=64, num_workers=1,
order=OrderOption.RANDOM, os_cache=True)`` through ``RandomResizedCropRGBImageDecoder((OUTPUT, OUTPUT))`` +
``RandomHorizontalFlip()``: one epoch not timed (numba's compilation), then ``EPOCHS`` timed.  Prints one JSON
object: images/s and images per CPU-second (this process's CPU time, all its threads) per timed epoch, and the
bytes per image FFCV stored.
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


class _Rows:
    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return np.ascontiguousarray(self.images[i]), int(self.labels[i])  # a memory-mapped array's row too


def main(argv) -> int:
    if len(argv) != 5:  # --help, or run by hand: the usage line, not a traceback
        return usage(__doc__, argv)
    images_npy, labels_npy, workdir, output, epochs = argv
    from ffcv.fields import IntField, RGBImageField
    from ffcv.fields.decoders import IntDecoder
    from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip
    from ffcv.writer import DatasetWriter

    images, labels = np.load(images_npy), np.load(labels_npy)
    beton = os.path.join(workdir, f"ffcv-{len(images)}-{images.shape[1]}.beton")
    DatasetWriter(beton, {"image": RGBImageField(write_mode="jpg", jpeg_quality=90), "label": IntField()},
                  num_workers=1).from_indexed_dataset(_Rows(images, labels))
    size = int(output)
    loader = Loader(beton, batch_size=64, num_workers=1, order=OrderOption.RANDOM, os_cache=True,
                    pipelines={"image": [RandomResizedCropRGBImageDecoder((size, size)), RandomHorizontalFlip()],
                               "label": [IntDecoder()]})
    shape = None
    for x, _ in loader:  # numba compiles here
        shape = tuple(x.shape[1:])
    rounds = []
    for _ in range(int(epochs)):
        t0, c0 = time.perf_counter(), time.process_time()
        n = sum(len(x) for x, _ in loader)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        rounds.append({"images_per_s": n / seconds, "images_per_cpu_s": n / max(cpu, 1e-9)})
    print(json.dumps({"rounds": rounds, "shape": shape, "file_bytes_per_image": os.path.getsize(beton) / len(images)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
