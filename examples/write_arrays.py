"""Arrays in memory, as ``keras.datasets`` gives them, into a store, then streamed back.

    python examples/write_arrays.py                 # MNIST-shaped random arrays, into a temporary folder
    python examples/write_arrays.py --out mnist.h5  # keep the store

With Keras at hand the real data set is one line away: ``(x_train, y_train), _ = keras.datasets.mnist.load_data()``
gives exactly the arrays this script makes up (uint8 ``N x 28 x 28`` images, int labels).  ``h5stream.write``
stores them shuffled (seed 0; ``order="sorted"`` keeps their order) in blocks, with checksums, and
``h5stream.open`` streams them under a memory budget, whatever their number.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

import h5stream


def load_data(rows: int, seed: int = 0):
    """Stand-in for ``keras.datasets.mnist.load_data()[0]``: uint8 (N, 28, 28) images, int labels 0-9."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (rows, 28, 28), dtype=np.uint8), rng.integers(0, 10, rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="the store to write (default: in a temporary folder, removed at the end)")
    p.add_argument("--rows", type=int, default=6000)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="h5stream-write-") as tmp:
        out = args.out or os.path.join(tmp, "mnist.h5")
        x_train, y_train = load_data(args.rows)
        result = h5stream.write(out, (x_train, y_train), overwrite=True)
        print(f"wrote {result.rows} rows to {out} at {result.rows_per_s:,.0f} rows/s")
        with h5stream.open(out, batch_size=256, seed=0) as stream:
            seen = sum(len(labels) for _, labels in stream)
            print(f"streamed one epoch: {seen} rows in {len(stream)} batches, classes {stream.class_names}")
        assert seen == args.rows
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
