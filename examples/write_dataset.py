"""A torchvision-style ``Dataset`` (``__len__`` + ``__getitem__`` giving ``(PIL image, class index)``) into a store.

    python examples/write_dataset.py
    python examples/write_dataset.py --out shapes.h5 --size 48

Any map-style dataset works the same way: a ``torchvision.datasets.ImageFolder`` or ``CIFAR10`` (without a
``transform``: the store resizes, and augmentation happens when streaming), a Hugging Face ``datasets.Dataset``
(items ``{"image": ..., "label": ...}``).  Items that cannot become a row are skipped and listed in
``OUT.skipped.csv`` by their index; ``resume=True`` continues a write that was stopped.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
from PIL import Image, ImageDraw

import h5stream


class ShapesDataset:
    """Drawn circles, squares and triangles of varying size, as PIL images: what a torchvision dataset returns
    before its transform."""

    classes = ["circle", "square", "triangle"]

    def __init__(self, n: int, seed: int = 0):
        self.n, self.seed = n, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        rng = np.random.default_rng((self.seed, index))  # the same item for the same index, as resume needs
        label = index % 3
        side = int(rng.integers(40, 90))
        image = Image.new("RGB", (side + 10, side), tuple(int(v) for v in rng.integers(0, 100, 3)))
        draw = ImageDraw.Draw(image)
        box = (5, 5, side - 5, side - 5)
        colour = tuple(int(v) for v in rng.integers(150, 256, 3))
        if label == 0:
            draw.ellipse(box, fill=colour)
        elif label == 1:
            draw.rectangle(box, fill=colour)
        else:
            draw.polygon([(side // 2, 5), (5, side - 5), (side - 5, side - 5)], fill=colour)
        return image, label


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="the store to write (default: in a temporary folder, removed at the end)")
    p.add_argument("--rows", type=int, default=600)
    p.add_argument("--size", type=int, default=32)
    args = p.parse_args(argv)
    dataset = ShapesDataset(args.rows)
    with tempfile.TemporaryDirectory(prefix="h5stream-write-") as tmp:
        out = args.out or os.path.join(tmp, "shapes.h5")
        result = h5stream.write(out, dataset, size=args.size, resize="pad", classes=ShapesDataset.classes,
                                overwrite=True)
        print(f"wrote {result.rows} rows of {args.size}x{args.size} to {out}, {result.skipped} skipped")
        with h5stream.open(out, batch_size=64, seed=0) as stream:
            images, labels = next(iter(stream))
            print(f"first batch: images {images.shape} {images.dtype}, labels {labels[:6].tolist()}..., "
                  f"classes {stream.class_names}")
        assert result.rows == args.rows and images.shape[1:] == (args.size, args.size, 3)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
