"""A generator of encoded images (JPEG bytes, as read from a tar, a database or a web API) into a store, with
the push-style ``h5stream.Writer``, continued after an interruption.

    python examples/write_generator.py
    python examples/write_generator.py --out photos.h5 --stop-after 300   # stop mid-way, then run again

A generator has no length, so its items are stored in the order it gives them.  The store records how many it
consumed; ``Writer(..., resume=True)`` reopens it and ``writer.consumed`` says where to start, so a source that
can be made again (the same items in the same order) is continued without repeating or losing an item.
"""

from __future__ import annotations

import argparse
import io
import itertools
import os
import tempfile

import numpy as np
from PIL import Image

import h5stream

LABELS = ("cat", "dog")


def photos(n: int):
    """``(jpeg bytes, class name)`` items, the same ones each time; every 50th is corrupt (skipped, listed)."""
    rng = np.random.default_rng(0)
    for i in range(n):
        pixels = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
        data = buf.getvalue()
        yield (data[: len(data) // 3] if i % 50 == 49 else data), LABELS[i % 2]


def write(out: str, n: int, stop_after: int | None) -> int:
    """Add the items from where the store stopped; returns the store's rows (``stop_after``: stop early)."""
    with h5stream.Writer(out, resume=True, size=32, classes=LABELS) as writer:
        start = writer.consumed
        for image, label in itertools.islice(photos(n), start, stop_after):
            writer.add(image, label)
    result = writer.close()
    print(f"items {start}-{result.consumed - 1}: {result.written} rows written, {result.skipped} skipped so far, "
          f"{result.rows} in {out}")
    return result.rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="the store to write (default: in a temporary folder, removed at the end)")
    p.add_argument("--rows", type=int, default=500)
    p.add_argument("--stop-after", type=int, default=None, help="stop after this many items (then run again)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="h5stream-write-") as tmp:
        out = args.out or os.path.join(tmp, "photos.h5")
        if args.out is None:  # show the continue: stop half-way, then finish
            write(out, args.rows, args.rows // 2)
        rows = write(out, args.rows, args.stop_after)
        meta = h5stream.read_meta(out)
        print(f"{out}: {meta.rows} rows, classes {list(meta.class_names)}, "
              f"{'finished' if meta.ingest.finished else 'unfinished'}")
        if args.out is None:
            assert rows == args.rows - args.rows // 50
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
