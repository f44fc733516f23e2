"""Deterministic sample image sets for tests, the demo and benchmarks.

Every generator is a pure function of its arguments (``seed`` included): the
same call writes byte-identical files.  Labels are encoded in pixel content so
a test can check that each stored row carries the right label:

* class sets: the background of image ``i`` of class ``k`` is
  :func:`class_colour` ``(k)`` (plus mild noise and one shape in a nearby
  shade, so JPEG has something real to encode); :func:`nearest_class` recovers
  ``k`` from any resized/cropped/padded copy by the median colour.
* regression sets: target ``t[j]`` in [0, 1] sets channel ``j`` (K <= 3) to
  ``target_level(t[j])``; :func:`targets_from_pixels` reads it back.

Only numpy and Pillow are used; a few thousand small images take seconds.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw

# Well separated in RGB and in luma (so channels=1 ingests stay decodable).
_PALETTE = np.array(
    [
        (210, 40, 40), (40, 200, 40), (40, 40, 210), (220, 210, 40),
        (200, 40, 200), (40, 200, 210), (120, 120, 120), (30, 30, 30),
    ],
    dtype=np.int64,
)
_LUMA = np.array([0.299, 0.587, 0.114])

FORMATS = ("jpg", "png", "mixed")


def class_colour(k: int) -> tuple[int, int, int]:
    """Background colour of class ``k`` (at most 8 classes)."""
    if not 0 <= k < len(_PALETTE):
        raise ValueError(f"class index {k} out of range; sample sets support 1..{len(_PALETTE)} classes")
    return tuple(int(v) for v in _PALETTE[k])


def nearest_class(image: np.ndarray, n_classes: int) -> int:
    """Class index whose colour (or luma, for 1-channel images) is nearest the image's median pixel."""
    pixels = np.asarray(image).reshape(-1, np.asarray(image).shape[-1]).astype(np.float64)
    median = np.median(pixels, axis=0)
    palette = _PALETTE[:n_classes].astype(np.float64)
    if median.shape[0] == 1:
        dist = np.abs(palette @ _LUMA - median[0])
    else:
        dist = np.linalg.norm(palette - median[:3], axis=1)
    return int(np.argmin(dist))


def target_level(t: float) -> int:
    """Pixel value that encodes a target ``t`` in [0, 1]."""
    return int(round(30 + 190 * float(t)))


def targets_from_pixels(image: np.ndarray, k: int) -> np.ndarray:
    """Inverse of :func:`target_level` per channel, from the median pixel (float64, shape (k,))."""
    pixels = np.asarray(image).reshape(-1, np.asarray(image).shape[-1]).astype(np.float64)
    median = np.median(pixels, axis=0)[:k]
    return (median - 30) / 190


def _noisy_canvas(rng: np.random.Generator, colour: Sequence[int], size: tuple[int, int], noise: int) -> np.ndarray:
    h, w = size
    base = np.empty((h, w, 3), dtype=np.int16)
    base[:] = np.asarray(colour, dtype=np.int16)
    if noise:
        base += rng.integers(-noise, noise + 1, size=(h, w, 3), dtype=np.int16)
    return np.clip(base, 0, 255).astype(np.uint8)


def _draw_shape(rng: np.random.Generator, im: Image.Image, colour: Sequence[int], shade: int) -> None:
    """One ellipse or rectangle covering at most ~25% of the image, in a shade near ``colour``."""
    w, h = im.size
    bw, bh = max(1, int(w * rng.uniform(0.15, 0.45))), max(1, int(h * rng.uniform(0.15, 0.45)))
    x0, y0 = int(rng.integers(0, max(1, w - bw))), int(rng.integers(0, max(1, h - bh)))
    delta = int(rng.integers(-shade, shade + 1))
    fill = tuple(int(np.clip(c + delta, 0, 255)) for c in colour)
    draw = ImageDraw.Draw(im)
    box = (x0, y0, x0 + bw, y0 + bh)
    if rng.random() < 0.5:
        draw.ellipse(box, fill=fill)
    else:
        draw.rectangle(box, fill=fill)


def _save(im: Image.Image, path: str, fmt: str) -> None:
    if fmt == "jpg":
        im.save(path, format="JPEG", quality=92)
    else:
        im.save(path, format="PNG", compress_level=1)


def _pick_format(fmt: str, i: int) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "mixed":
        return "jpg" if i % 2 == 0 else "png"
    return fmt


def make_class_folder(
    root: str | os.PathLike,
    *,
    classes: Sequence[str] | int = 3,
    per_class: int | Sequence[int] = 10,
    size: tuple[int, int] = (32, 48),
    fmt: str = "mixed",
    seed: int = 0,
    noise: int = 6,
) -> list[tuple[str, int]]:
    """Write ``root/<class>/<class>_<i>.<ext>`` and return ``[(relpath, class_index)]`` in walk order.

    ``classes`` is a list of names (index = position in sorted order, as ingest
    assigns them) or a count (names ``class_0``...).  ``per_class`` is one count
    or one per class.  ``size`` is (height, width).  ``fmt`` is ``jpg``, ``png``
    or ``mixed`` (alternating).
    """
    names = [f"class_{k}" for k in range(classes)] if isinstance(classes, int) else list(classes)
    names = sorted(names)
    counts = [per_class] * len(names) if isinstance(per_class, int) else list(per_class)
    if len(counts) != len(names):
        raise ValueError(f"per_class has {len(counts)} counts for {len(names)} classes")
    root = os.fspath(root)
    written: list[tuple[str, int]] = []
    for k, name in enumerate(names):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        colour = class_colour(k)
        for i in range(counts[k]):
            rng = np.random.default_rng([seed, k, i])
            im = Image.fromarray(_noisy_canvas(rng, colour, size, noise))
            _draw_shape(rng, im, colour, shade=25)
            ext = _pick_format(fmt, i)
            rel = f"{name}/{name}_{i:05d}.{ext}"
            _save(im, os.path.join(root, rel), ext)
            written.append((rel, k))
    return written


def make_regression_folder(
    root: str | os.PathLike,
    n: int = 20,
    *,
    targets: int = 2,
    size: tuple[int, int] = (32, 48),
    fmt: str = "png",
    seed: int = 0,
    noise: int = 3,
    csv_name: str = "labels.csv",
    path_column: str = "filename",
) -> tuple[str, list[tuple[str, tuple[float, ...]]]]:
    """Write ``root/images/img_<i>.<ext>`` and ``root/<csv_name>``; return (csv path, [(relpath, targets)]).

    The CSV has ``path_column`` (relative to ``root``) and columns ``t0..t{K-1}``
    holding targets in [0, 1] (rounded to 4 decimals), K = ``targets`` <= 3.
    Channel ``j`` of each image is ``target_level(t_j)``; unused channels are 128.
    """
    if not 1 <= targets <= 3:
        raise ValueError(f"targets must be 1..3 (one per colour channel), got {targets}")
    root = os.fspath(root)
    os.makedirs(os.path.join(root, "images"), exist_ok=True)
    rows: list[tuple[str, tuple[float, ...]]] = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        t = tuple(round(float(v), 4) for v in rng.uniform(0, 1, size=targets))
        colour = [128, 128, 128]
        for j, v in enumerate(t):
            colour[j] = target_level(v)
        ext = _pick_format(fmt, i)
        rel = f"images/img_{i:05d}.{ext}"
        _save(Image.fromarray(_noisy_canvas(rng, colour, size, noise)), os.path.join(root, rel), ext)
        rows.append((rel, t))
    csv_path = os.path.join(root, csv_name)
    with open(csv_path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow([path_column, *[f"t{j}" for j in range(targets)]])
        for rel, t in rows:
            out.writerow([rel, *t])
    return csv_path, rows


def realistic_image(seed: int, size: tuple[int, int] = (375, 500)) -> Image.Image:
    """A photo-like RGB image: smooth colour field, a dozen shapes, texture noise (for JPEG benchmarks)."""
    h, w = size
    rng = np.random.default_rng(seed)
    field = Image.fromarray(rng.integers(0, 256, size=(4, 5, 3), dtype=np.uint8)).resize((w, h), Image.BICUBIC)
    draw = ImageDraw.Draw(field)
    for _ in range(12):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x1, y1 = x0 + int(rng.integers(10, w // 2)), y0 + int(rng.integers(10, h // 2))
        fill = tuple(int(v) for v in rng.integers(0, 256, size=3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=fill)
    pixels = np.asarray(field, dtype=np.int16)
    texture = rng.integers(-14, 15, size=(h, w, 1), dtype=np.int16)  # luminance grain, like sensor noise
    return Image.fromarray(np.clip(pixels + texture, 0, 255).astype(np.uint8))


def make_realistic_jpegs(
    root: str | os.PathLike,
    n: int = 3000,
    *,
    classes: int = 4,
    size: tuple[int, int] = (375, 500),
    quality: int = 90,
    seed: int = 0,
    start: int = 0,
) -> list[tuple[str, int]]:
    """Write ``n`` photo-like JPEGs (``size`` = (height, width), ~500x375 default) into ``classes`` folders.

    Photo ``i`` depends only on ``seed`` and ``i``: ``start`` writes photos ``start`` to ``n - 1`` alone, so that
    processes can each make a part of one folder."""
    root = os.fspath(root)
    written = []
    for k in range(classes):
        os.makedirs(os.path.join(root, f"class_{k}"), exist_ok=True)
    for i in range(start, n):
        k = i % classes
        rel = f"class_{k}/img_{i:06d}.jpg"
        realistic_image(seed * 1_000_003 + i, size).save(os.path.join(root, rel), format="JPEG", quality=quality)
        written.append((rel, k))
    return written
