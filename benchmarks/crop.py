"""Random resized crop + horizontal flip on one core: h5stream's Augment against Pillow doing what torchvision does.

Rows stored at ``--stored`` px (photo-like smooth noise), cropped with ``RandomResizedCrop(--size, scale=(0.08,
1), ratio=(3/4, 4/3))`` and flipped half the time, one batch of ``--batch`` rows per call, one thread:

* ``h5stream``        -- ``Augment(output_size=size, horizontal_flip=True)`` on the uint8 batch
* ``pillow (tv)``     -- torchvision's PIL path: ``Image.resize(size, BILINEAR, box=crop)`` (crop + antialiased
  resize in one call, as ``F.resized_crop``), ``transpose(FLIP_LEFT_RIGHT)``, the same boxes
  (:func:`h5stream.augment.crop.random_resized_boxes`), then ``np.asarray`` into the batch
* ``h5stream center`` -- ``Augment(output_size=size, crop="center")``: the validation transform

Figures are images/s, the median of ``--repeats`` interleaved rounds, and each one's ratio to Pillow's in the same
round.

Usage::

    python -m benchmarks.crop                       # stored 256, output 224
    python -m benchmarks.crop --stored 160 --size 128 --json
"""

from __future__ import annotations

import os

if __name__ == "__main__":
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.data import smooth_rows  # noqa: E402
from benchmarks.harness import add_json_option, emit, log, median, new_parser  # noqa: E402
from h5stream.augment import Augment  # noqa: E402
from h5stream.augment.crop import random_resized_boxes  # noqa: E402

SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)


def pillow_batch(images: np.ndarray, boxes: np.ndarray, flips: np.ndarray, size: int, out: np.ndarray) -> None:
    """torchvision's PIL path for each image: crop + antialiased bilinear resize in one call, then the flip."""
    from PIL import Image

    for i, (top, left, h, w) in enumerate(boxes.tolist()):
        img = Image.fromarray(images[i]).resize((size, size), Image.BILINEAR, box=(left, top, left + w, top + h))
        if flips[i]:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        out[i] = np.asarray(img)


def run(args) -> dict:
    images = smooth_rows(args.batch, args.stored)
    rows = np.arange(args.batch)
    train = Augment(output_size=args.size, horizontal_flip=True)
    center = Augment(output_size=args.size, crop="center")
    out = np.empty((args.batch, args.size, args.size, 3), np.uint8)

    def h5(epoch):
        train(images, seed=0, epoch=epoch, row_ids=rows, out=out)

    def pil(epoch):
        boxes = random_resized_boxes(0, epoch, rows, args.stored, args.stored, SCALE, RATIO)
        flips = train.draw(0, epoch, rows, args.size, args.size)["flip_horizontal"]
        pillow_batch(images, boxes, flips, args.size, out)

    def cen(epoch):
        center(images, seed=0, epoch=epoch, row_ids=rows, out=out)

    cases = {"h5stream": h5, "pillow (tv)": pil, "h5stream center": cen}
    rounds = []
    for r in range(args.repeats):
        got = {}
        for name, fn in cases.items():
            t = time.perf_counter()
            fn(r)
            got[name] = args.batch / (time.perf_counter() - t)
        rounds.append(got)
        log(f"round {r}: " + ", ".join(f"{k} {v:,.0f}" for k, v in got.items()))
    result = {"stored": args.stored, "size": args.size, "batch": args.batch, "repeats": args.repeats,
              "machine": platform.platform(), "images_per_s": {}, "vs_pillow": {}}
    for name in cases:
        result["images_per_s"][name] = median(g[name] for g in rounds)
        result["vs_pillow"][name] = median(g[name] / g["pillow (tv)"] for g in rounds)
    return result


def format_text(r: dict) -> str:
    lines = [f"random resized crop {r['stored']} -> {r['size']} px + flip, one core, batches of {r['batch']}, "
             f"median of {r['repeats']} rounds", f"{'':<18}{'images/s':>10}{'x pillow':>10}"]
    for name, v in r["images_per_s"].items():
        lines.append(f"{name:<18}{v:>10,.0f}{r['vs_pillow'][name]:>10.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = new_parser(__doc__.splitlines()[0], prog="python -m benchmarks.crop")
    parser.add_argument("--stored", type=int, default=256, help="stored rows' side in px")
    parser.add_argument("--size", type=int, default=224, help="the crops' output side in px")
    parser.add_argument("--batch", type=int, default=64, help="rows per batch")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds; medians")
    add_json_option(parser)
    args = parser.parse_args(argv)
    emit(run(args), as_json=args.json, format_text=format_text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
