"""`h5stream preview FILE --out grid.png`: a grid of images as the stream yields them.

The file's format is the one its name asks for (``.png``, ``.jpg``, ``.webp``,
... any Pillow writes; see :func:`image_format`); a name without a known
extension is refused before anything is read.

The first ``rows x cols`` rows of epoch 0 of ``h5stream.open(FILE, seed=S,
augment=...)`` -- shuffled and augmented exactly as training would see them --
each tile titled with its label (class name, or the regression values).  The
same file, seed and augmentation give the same PNG.

Grid geometry (what the tests check): every tile is the image scaled by an
integer ``scale`` (the smallest that makes it at least ``MIN_TILE_PX`` wide,
unless ``--scale`` is given; see :mod:`h5stream.commands.arguments`) under a
``TITLE_PX`` title strip, with ``PAD_PX`` between and around tiles::

    width  = cols * W * scale + (cols + 1) * PAD_PX
    height = rows * (H * scale + TITLE_PX) + (rows + 1) * PAD_PX
"""

from __future__ import annotations

import math
import os

import numpy as np

from h5stream.commands._common import augment_from_arg
from h5stream.commands.arguments import MIN_TILE_PX

TITLE_PX = 14
PAD_PX = 4
MAX_GRID_PIXELS = 89_478_485
"""Largest grid ``preview`` writes: Pillow's ``Image.MAX_IMAGE_PIXELS``, above which Pillow warns that an image it
opens may be a decompression bomb (and refuses at twice that)."""
BACKGROUND = (255, 255, 255)


def run(args) -> int:
    from h5stream.errors import ConfigError

    for name in ("rows", "cols"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.scale is not None and args.scale < 1:
        raise ConfigError(f"--scale must be >= 1, got {args.scale}")
    fmt = image_format(args.out)
    from h5stream.commands._partset import store_or_set
    from h5stream.store.partset import read_any

    spec, augment = store_or_set(args.path), augment_from_arg(args.augment)
    stored = read_any(spec, None, 60.0).image_shape  # before any row is read: the grid must fit first
    shape = augment.output_shape(stored) if augment is not None else stored
    check_grid(args.rows, args.cols, tuple(shape[:2]), args.scale)
    images, labels, meta = first_images(spec, args.rows * args.cols, seed=args.seed, augment=augment,
                                        memory_budget=args.memory_budget)
    titles = [label_title(y, meta) for y in labels]
    grid = render_grid(images, titles, rows=args.rows, cols=args.cols, scale=args.scale)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        raise ConfigError(f"--out {args.out}: folder {out_dir} does not exist; create it first")
    from h5stream.commands._common import write_output

    write_output(args.out, lambda tmp: grid.save(tmp, format=fmt), option="--out")
    print(f"wrote {args.out} ({grid.width}x{grid.height} px, {len(titles)} images, seed {args.seed})")
    return 0


def image_format(out: str) -> str:
    """Pillow's format name for the file name ``out`` (``grid.jpg`` -> ``"JPEG"``); :class:`ConfigError` for a
    name whose extension Pillow cannot write."""
    from PIL import Image

    from h5stream.errors import ConfigError

    ext = os.path.splitext(out)[1].lower()
    fmt = Image.registered_extensions().get(ext)
    if fmt is None or fmt not in Image.SAVE:
        raise ConfigError(f"--out {out}: cannot tell which image format to write from "
                          f"{ext or 'a name without an extension'!r}; name the file .png (or .jpg, .webp)")
    return fmt


def first_images(path, n: int, *, seed: int, augment=None, memory_budget=None):
    """The first ``n`` (or all, if fewer) images and labels of epoch 0 of the stream, and the store's meta."""
    import h5stream

    with h5stream.open(path, batch_size=n, memory_budget=memory_budget, shuffle=True, seed=seed, augment=augment) as s:
        xs, ys, have = [], [], 0
        for batch in s:
            x, y = batch if isinstance(batch, tuple) else (batch, np.full(len(batch), -1))  # a store without labels
            xs.append(x)
            ys.append(y)
            have += len(x)
            if have >= n:
                break
        meta = s.meta
    return np.concatenate(xs)[:n], np.concatenate(ys)[:n], meta


def label_title(label, meta) -> str:
    """A tile's title: the class name (class files) or the values, 3 significant digits (regression)."""
    values = np.atleast_1d(np.asarray(label))
    if meta.label_kind == "none":
        return ""
    if meta.label_kind == "class":
        k = int(values[0])
        names = meta.class_names or ()
        return names[k] if 0 <= k < len(names) else str(k)
    return ", ".join(f"{float(v):.3g}" for v in values)


def to_display(image: np.ndarray) -> np.ndarray:
    """An H x W x C image as uint8 RGB/L for display.

    uint8 passes through.  Floats in [0, 1] are scaled by 255, floats within
    [0, 255] are clipped, anything else (e.g. standardised) is min-max scaled
    per image.  Grayscale stays one channel; more than 3 channels keep the first 3.
    """
    x = np.asarray(image)
    if x.ndim == 2:
        x = x[..., None]
    if x.shape[-1] == 2 or x.shape[-1] > 3:
        x = x[..., :1] if x.shape[-1] == 2 else x[..., :3]
    if x.dtype == np.uint8:
        return x
    x = x.astype(np.float64)
    lo, hi = float(np.nanmin(x)), float(np.nanmax(x))
    if lo >= 0 and hi <= 1.0:
        x = x * 255.0
    elif not (lo >= 0 and hi <= 255.0):
        x = (x - lo) / (hi - lo) * 255.0 if hi > lo else np.zeros_like(x)
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def grid_size(rows: int, cols: int, image_hw: tuple[int, int], scale: int | None = None) -> tuple[int, int, int]:
    """``(width_px, height_px, scale)`` of a grid (see the module doc)."""
    h, w = image_hw
    scale = scale or max(1, -(-MIN_TILE_PX // w))
    width = cols * w * scale + (cols + 1) * PAD_PX
    height = rows * (h * scale + TITLE_PX) + (rows + 1) * PAD_PX
    return width, height, scale


def check_grid(rows: int, cols: int, image_hw: tuple[int, int], scale: int | None) -> None:
    """:class:`ConfigError` for a grid of more than :data:`MAX_GRID_PIXELS`, naming the ``--rows``/``--cols`` (or
    ``--scale``) that fit: the canvas is allocated whole, and would not fit in memory long before that."""
    from h5stream.errors import ConfigError

    width, height, scale = grid_size(rows, cols, image_hw, scale)
    if width * height <= MAX_GRID_PIXELS:
        return
    tile_w, tile_h = image_hw[1] * scale + PAD_PX, image_hw[0] * scale + TITLE_PX + PAD_PX
    side = math.isqrt(MAX_GRID_PIXELS // (tile_w * tile_h))
    while side and math.prod(grid_size(side, side, image_hw, scale)[:2]) > MAX_GRID_PIXELS:  # the outer padding
        side -= 1
    fix = (f"--rows {side} --cols {side} fit" if side >= 1 else
           f"even one tile of {tile_w - PAD_PX} px wide does not fit: lower --scale")
    raise ConfigError(f"--rows {rows} --cols {cols} (tiles scaled {scale}x): a grid of {width:,} x {height:,} px, "
                      f"more than the {MAX_GRID_PIXELS:,} pixels a preview may have (Pillow's own limit for opening an "
                      f"image); {fix}")


def render_grid(images: np.ndarray, titles: list[str], *, rows: int, cols: int, scale: int | None = None):
    """A Pillow RGB image of ``images`` laid out row-major with ``titles`` above; empty cells stay blank."""
    from PIL import Image, ImageDraw

    h, w = images.shape[1:3]
    width, height, scale = grid_size(rows, cols, (h, w), scale)
    canvas = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    font = _font()
    tile_w, tile_h = w * scale, h * scale
    for i, (image, title) in enumerate(zip(images[: rows * cols], titles)):
        r, c = divmod(i, cols)
        left = PAD_PX + c * (tile_w + PAD_PX)
        top = PAD_PX + r * (tile_h + TITLE_PX + PAD_PX)
        pixels = to_display(image)
        tile = Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels)
        if scale != 1:
            tile = tile.resize((tile_w, tile_h), Image.NEAREST)
        canvas.paste(tile.convert("RGB"), (left, top + TITLE_PX))
        draw.text((left + 1, top + 1), _fit(draw, title, font, tile_w - 2), fill=(0, 0, 0), font=font)
    return canvas


def _font():
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=11)
    except TypeError:  # Pillow < 10.1 has only the fixed bitmap font
        return ImageFont.load_default()


def _fit(draw, text: str, font, max_px: int) -> str:
    """``text`` shortened with an ellipsis until it fits ``max_px``."""
    if draw.textlength(text, font=font) <= max_px:
        return text
    while text and draw.textlength(text + "...", font=font) > max_px:
        text = text[:-1]
    return text + "..."
