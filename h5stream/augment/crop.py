"""Fixed output sizes with torchvision's crop semantics: the box of every crop from pure functions, then one resize.

``Augment(output_size=(h, w), crop="random_resized" | "center")`` crops each stored image and resizes the crop to
``output_size`` before the rest of the augmentation runs at that size.

* ``"random_resized"`` is torchvision's ``RandomResizedCrop(output_size, scale, ratio)``: up to 10 tries of an
  area fraction drawn uniformly from ``scale`` and an aspect ratio drawn log-uniformly from ``ratio``, the first
  box that fits taken at a uniform position; after 10 misses, the centre crop of the whole image clamped to
  ``ratio`` (:func:`crop_box_from_draws` is ``RandomResizedCrop.get_params`` line for line, in float64).  Its
  uniform draws come from :mod:`h5stream.augment.rng` keyed by ``(seed, epoch, row_id)``
  (:func:`random_resized_boxes`), so a row gets the same box in every worker.
* ``"center"`` is torchvision's ``Resize(resize)`` + ``CenterCrop(output_size)``: the short side scaled to
  ``resize`` (the long side ``int(resize * long / short)``), then the middle ``output_size`` pixels at
  ``round((H' - h) / 2)``, ``round((W' - w) / 2)`` (:func:`center_geometry`).  ``resize`` defaults to
  ``round(max(output_size) * 256 / 224)`` (the ImageNet recipe: 256 for 224).

The resize is OpenCV's, one thread: bilinear with half-pixel centres (``INTER_LINEAR``, torch's
``align_corners=False``) when either side grows, area averaging (``INTER_AREA``, an anti-aliased shrink as
torchvision's default ``antialias=True``, and FFCV's choice) when both shrink.  So the boxes match torchvision's
exactly for the same draws, and the pixels within interpolation rounding when a crop grows on both sides, within a
level or two when it shrinks by up to 1.5x (against torch's antialiased bilinear on a 300 -> 224 shrink: 0.4 levels on
average, 2.6 at most).  Two cases are further from torch's filter: a crop that grows on one side and shrinks on the
other (about 1 in 5 random resized crops of an image stored at 256 for 224) is bilinear on both, so its shrinking
side is not anti-aliased (200x300 -> 224: 0.45 levels on average, 3.3 at most); and a larger shrink averages a box
where torch weighs a triangle, so fine detail differs more (448 -> 224: 1.4 on average, 7.2 at most, on blurred
noise).

A JPEG decoder can call :func:`random_resized_boxes` / :func:`center_geometry` before decoding, with the stored
height and width, to learn which part of the image and at what scale the crop needs: :func:`reduced_scale` is the
largest of libjpeg's DCT scalings (1/2, 1/4, 1/8) that still leaves the box at least ``output_size``; the box in an
image decoded at ``1/d`` is the box divided by ``d``.  Every function here is pure and thread-safe.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from h5stream.augment import rng
from h5stream.errors import ConfigError

CROPS = ("random_resized", "center")
"""The values ``Augment(crop=...)`` takes."""

DEFAULT_SCALE = (0.08, 1.0)
DEFAULT_RATIO = (3.0 / 4.0, 4.0 / 3.0)
"""RandomResizedCrop's defaults: the area fraction and the width / height ratio drawn from."""

TRIES = 10
"""RandomResizedCrop's attempts at a box of the drawn area and ratio before the centre fallback."""

# Streams of the crop's draws (part of the reproducibility contract, as rng's): one per try for area and ratio.
STREAM_AREA = tuple(range(100, 100 + TRIES))
STREAM_RATIO = tuple(range(120, 120 + TRIES))
STREAM_TOP = 140
STREAM_LEFT = 141
CROP_STREAMS = (*STREAM_AREA, *STREAM_RATIO, STREAM_TOP, STREAM_LEFT)


def crop_box_from_draws(u_area, u_ratio, u_top, u_left, height, width, scale, ratio) -> np.ndarray:
    """int64 ``(n, 4)`` boxes ``(top, left, h, w)``: ``RandomResizedCrop.get_params`` for given uniform draws.

    ``u_area``, ``u_ratio``: float ``(n, TRIES)`` on ``[0, 1)``, the draws of the tries in order (torchvision's
    ``uniform_(scale)`` and ``uniform_(log(ratio))`` are ``low + (high - low) * u``); ``u_top``, ``u_left``:
    float ``(n,)``, the position of the accepted box (``randint(0, H - h + 1)`` is ``floor(u * (H - h + 1))``).
    ``height``, ``width``: the stored images' (ints, or int arrays ``(n,)`` for rows of different sizes).  Pure.
    """
    u_area = np.atleast_2d(np.asarray(u_area, dtype=np.float64))
    u_ratio = np.atleast_2d(np.asarray(u_ratio, dtype=np.float64))
    u_top = np.asarray(u_top, dtype=np.float64).reshape(-1)
    u_left = np.asarray(u_left, dtype=np.float64).reshape(-1)
    n = u_area.shape[0]
    height = np.broadcast_to(np.asarray(height, dtype=np.int64), (n,))
    width = np.broadcast_to(np.asarray(width, dtype=np.int64), (n,))
    area = (height * width).astype(np.float64)[:, None]
    lo_r, hi_r = math.log(ratio[0]), math.log(ratio[1])
    target = area * (scale[0] + (scale[1] - scale[0]) * u_area)
    aspect = np.exp(lo_r + (hi_r - lo_r) * u_ratio)
    # Python's round() (half to even) as torchvision's int(round(...)); np.rint rounds the same way.
    ws = np.rint(np.sqrt(target * aspect)).astype(np.int64)
    hs = np.rint(np.sqrt(target / aspect)).astype(np.int64)
    fits = (ws > 0) & (ws <= width[:, None]) & (hs > 0) & (hs <= height[:, None])
    first = np.argmax(fits, axis=1)
    found = fits[np.arange(n), first]
    h = np.where(found, hs[np.arange(n), first], 0)
    w = np.where(found, ws[np.arange(n), first], 0)
    top = np.minimum(np.floor(u_top * (height - h + 1)).astype(np.int64), height - h)
    left = np.minimum(np.floor(u_left * (width - w + 1)).astype(np.int64), width - w)
    boxes = np.stack([top, left, h, w], axis=1)
    missed = ~found
    if missed.any():
        boxes[missed] = _fallback_boxes(height[missed], width[missed], ratio)
    return boxes


def _fallback_boxes(height: np.ndarray, width: np.ndarray, ratio) -> np.ndarray:
    """:func:`fallback_box` for int64 arrays of sizes: ``(n, 4)``."""
    lo, hi = min(ratio), max(ratio)
    in_ratio = width.astype(np.float64) / height.astype(np.float64)
    narrow, wide = in_ratio < lo, in_ratio > hi
    h = np.where(narrow, np.rint(width / lo).astype(np.int64), height)
    w = np.where(wide & ~narrow, np.rint(height * hi).astype(np.int64), width)
    return np.stack([(height - h) // 2, (width - w) // 2, h, w], axis=1)


def fallback_box(height: int, width: int, ratio) -> tuple[int, int, int, int]:
    """RandomResizedCrop's box after 10 misses: the whole image, cut to the nearest ratio in ``ratio``, centred."""
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return ((height - h) // 2, (width - w) // 2, h, w)


def random_resized_boxes(seed: int, epoch: int, row_ids, height, width, scale, ratio) -> np.ndarray:
    """int64 ``(n, 4)`` boxes ``(top, left, h, w)`` of the random resized crops of rows ``row_ids`` (global ids)
    of ``height`` x ``width`` images in ``epoch``: what ``Augment(crop="random_resized")`` crops.  ``height`` and
    ``width`` may be int arrays ``(n,)`` (encoded rows of different sizes): a row's box depends on its own size
    only.  Pure."""
    keys = rng.sample_keys(seed, epoch, row_ids)
    u = rng.units(keys, CROP_STREAMS)
    return crop_box_from_draws(u[:TRIES].T, u[TRIES:2 * TRIES].T, u[2 * TRIES], u[2 * TRIES + 1],
                               height, width, scale, ratio)


def resized_shape(height: int, width: int, resize: int) -> tuple[int, int]:
    """torchvision ``Resize(resize)`` (an int): the short side becomes ``resize``, the long ``int(resize * long /
    short)``."""
    if height <= width:
        return resize, int(resize * width / height)
    return int(resize * height / width), resize


def center_geometry(height: int, width: int, output_size,
                    resize: int) -> tuple[tuple[int, int], tuple[int, int, int, int]]:
    """``((H', W'), (top, left, h, w))``: ``Resize(resize)`` gives ``H' x W'``, ``CenterCrop(output_size)`` takes
    the box of it.  (A decoder may decode at any scale giving at least ``H' x W'``.)  Pure.

    Raises :class:`ConfigError` when ``H' x W'`` is smaller than ``output_size`` (torchvision would pad)."""
    rh, rw = resized_shape(height, width, resize)
    oh, ow = output_size
    if rh < oh or rw < ow:
        raise ConfigError(f"Augment: crop='center' with resize={resize} makes {height}x{width} images {rh}x{rw}, "
                          f"smaller than output_size=({oh}, {ow}); raise resize to {max(oh, ow)} or more")
    return (rh, rw), (int(round((rh - oh) / 2.0)), int(round((rw - ow) / 2.0)), oh, ow)


def reduced_scale(box_h: int, box_w: int, output_size, scales=(8, 4, 2)) -> int:
    """The largest ``d`` of ``scales`` (libjpeg's DCT scalings, ``cv2.IMREAD_REDUCED_*``) for which a
    ``box_h`` x ``box_w`` box decoded at ``1/d`` is still at least ``output_size`` on both sides (no upscaling
    that a full decode would not need); 1 if none.  Pure."""
    oh, ow = output_size
    return next((int(d) for d in sorted(scales, reverse=True) if box_h // d >= oh and box_w // d >= ow), 1)


def default_resize(output_size) -> int:
    """The short side ``crop="center"`` resizes to when ``resize`` is not given: ``max(output_size) * 256 / 224``."""
    return int(round(max(output_size) * 256 / 224))


# --------------------------------------------------------------------------- parameters


def check_crop_options(output_size, crop, scale, ratio, resize):
    """``(output_size, crop, scale, ratio, resize)`` checked and normalised (``Augment``'s crop options), or one
    :class:`ConfigError` naming the parameter and what it takes.  ``output_size=None`` needs ``crop=None``."""
    if output_size is None or crop == "center":
        for name, value in (("scale", scale), ("ratio", ratio)):
            if value is not None:
                raise ConfigError(f"Augment: {name}={value!r} is for crop='random_resized' (with output_size); "
                                  "drop it" + (" for crop='center'" if crop == "center" else ""))
    if output_size is None:
        if crop is not None:
            raise ConfigError(f"Augment: crop={crop!r} needs output_size=(height, width), the size the crops are "
                              "resized to")
        if resize is not None:
            raise ConfigError("Augment: resize= is for crop='center'; give output_size and crop='center'")
        return None, None, None, None, None
    output_size = _size(output_size)
    if crop is None:
        crop = "random_resized"
    if crop not in CROPS:
        raise ConfigError(f"Augment: crop={crop!r} is not a crop; choose one of {', '.join(map(repr, CROPS))}")
    scale = _pair("scale", DEFAULT_SCALE if scale is None else scale)
    if not 0 < scale[0] <= scale[1] <= 1:
        raise ConfigError(f"Augment: scale={scale!r} must satisfy 0 < min <= max <= 1 (fractions of the image's area)")
    ratio = _pair("ratio", DEFAULT_RATIO if ratio is None else ratio)
    if not 0 < ratio[0] <= ratio[1]:
        raise ConfigError(f"Augment: ratio={ratio!r} must satisfy 0 < min <= max (width / height)")
    if resize is not None:
        if crop != "center":
            raise ConfigError(f"Augment: resize={resize!r} is for crop='center' (crop={crop!r} resizes its own crop)")
        if isinstance(resize, (bool, np.bool_)) or not isinstance(resize, numbers.Integral) or \
                resize < min(output_size):
            raise ConfigError(f"Augment: resize={resize!r} must be an int >= min(output_size) = {min(output_size)} "
                              "(the short side before the centre crop)")
        resize = int(resize)
    elif crop == "center":
        resize = default_resize(output_size)
    return output_size, crop, scale, ratio, resize


def _size(value) -> tuple[int, int]:
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        value = (value, value)
    if not isinstance(value, (tuple, list)) or len(value) != 2 or any(
            isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral) or v < 1 for v in value):
        raise ConfigError(f"Augment: output_size={value!r} must be (height, width), two positive ints (or one int)")
    return (int(value[0]), int(value[1]))


def _pair(name, value) -> tuple[float, float]:
    if not isinstance(value, (tuple, list)) or len(value) != 2 or any(
            isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real) or not math.isfinite(v)
            for v in value):
        raise ConfigError(f"Augment: {name}={value!r} must be a pair (min, max) of finite numbers")
    return (float(value[0]), float(value[1]))


# --------------------------------------------------------------------------- pixels


def _resize_into(cv2, src: np.ndarray, dst: np.ndarray) -> None:
    """``src`` resized to ``dst``'s height and width, into ``dst`` (see the module doc for the interpolation)."""
    oh, ow = dst.shape[:2]
    sh, sw = src.shape[:2]
    interp = cv2.INTER_AREA if (sh >= oh and sw >= ow) else cv2.INTER_LINEAR
    if (sh, sw) == (oh, ow):
        np.copyto(dst, src)
        return
    result = cv2.resize(np.ascontiguousarray(src), (ow, oh), interpolation=interp)
    dst[...] = result.reshape(dst.shape)


SCRATCH_BYTES = 1 << 20
"""The most bytes of cropped rows :func:`crop_then` holds at once (at least one row): the transform's scratch in
the memory plan stays the same whatever the batch size."""


def in_groups(n: int, out: np.ndarray, make_rows, augment_into, seed: int, epoch: int, row_ids) -> None:
    """The ``n`` rows of ``out`` a few at a time (:data:`SCRATCH_BYTES` of them): ``make_rows(cv2, start, stop,
    scratch)`` writes rows ``start..stop-1`` (cropped to ``out``'s row shape) into ``scratch``, with OpenCV on one
    thread (one worker process = one core), then ``augment_into(scratch, seed, epoch, row_ids[start:stop],
    out[start:stop])``.  A row's output depends only on its pixels and ``(seed, epoch, row_id)``, so the grouping
    changes nothing."""
    from h5stream.augment.warp import _cv2

    row_bytes = int(np.prod(out.shape[1:], dtype=np.int64))
    chunk = max(1, min(n, SCRATCH_BYTES // max(1, row_bytes)))
    scratch = np.empty((chunk, *out.shape[1:]), np.uint8)
    cv2 = _cv2()
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        part = scratch[:stop - start]
        threads = cv2.getNumThreads()
        cv2.setNumThreads(1)
        try:
            make_rows(cv2, start, stop, part)
        finally:
            cv2.setNumThreads(threads)
        augment_into(part, seed, epoch, row_ids[start:stop], out[start:stop])


def crop_then(augment_into, images: np.ndarray, out: np.ndarray, crop: str, seed: int, epoch: int, row_ids,
              scale, ratio, resize) -> None:
    """Crop and resize uint8 ``images`` (n, H, W, C) to ``out``'s rows a few at a time, each group then handed to
    ``augment_into(cropped, seed, epoch, row_ids, out_rows)`` (:func:`in_groups`)."""
    rows = np.asarray(row_ids, dtype=np.int64).reshape(-1)

    def make_rows(cv2, start, stop, part):
        crop_batch(cv2, images[start:stop], part, crop, seed, epoch, rows[start:stop], scale, ratio, resize)

    in_groups(images.shape[0], out, make_rows, augment_into, seed, epoch, rows)


def crop_batch(cv2, images: np.ndarray, out: np.ndarray, crop: str, seed: int, epoch: int, row_ids,
               scale, ratio, resize) -> None:
    """Each image of uint8 ``images`` (n, H, W, C) cropped and resized into uint8 ``out`` (n, h, w, C)."""
    n, height, width = images.shape[:3]
    oh, ow = out.shape[1:3]
    if crop == "random_resized":
        boxes = random_resized_boxes(seed, epoch, row_ids, height, width, scale, ratio)
        for i in range(n):
            top, left, h, w = (int(v) for v in boxes[i])
            _resize_into(cv2, images[i, top:top + h, left:left + w], out[i])
        return
    (rh, rw), (top, left, h, w) = center_geometry(height, width, (oh, ow), resize)
    staging = np.empty((rh, rw, images.shape[3]), np.uint8)
    for i in range(n):
        _resize_into(cv2, images[i], staging)
        np.copyto(out[i], staging[top:top + h, left:left + w])
