"""Decode one image file into a fixed-size uint8 array (pure; runs in worker processes).

:func:`decode_file` returns ``(H, W, C)`` uint8 or raises :class:`SkipFile`
with a one-line reason; it never returns a partial image.  Steps:

1. Open with Pillow; refuse files whose header declares more than
   ``max_pixels`` pixels before any pixel is decoded.
2. JPEG: ``draft()`` lets libjpeg decode at 1/2, 1/4 or 1/8 scale when the
   result still covers the target (for all resize modes), which is most of
   the speed-up over decoding at full size.
3. EXIF orientation is applied (the target box is rotated first so draft
   stays correct).
4. Mode conversion to RGB or L, done explicitly so nothing is silently clipped:

   =========================  ============================================
   ``1``, ``L``, ``P``        to L / RGB (palette transparency honoured)
   ``LA``, ``PA``, ``RGBA``,  alpha composited over ``background``
   ``La``, ``RGBa``           (default white (255, 255, 255))
   ``CMYK``, ``YCbCr``, ...   Pillow conversion to RGB
   ``I;16*``                  16-bit: value / 257, rounded
   ``I``, ``F``               by range: [0, 1] floats x255; [0, 255] kept;
                              [0, 65535] / 257; otherwise min-max to [0, 255]
   =========================  ============================================

   ``channels=1`` converts RGB to L with ITU-R 601 luma (Pillow's ``L``).
5. Resize to ``size`` = (height, width) -- area averaging (Pillow ``BOX``,
   antialiased) when shrinking, bilinear when enlarging:
   ``stretch`` ignores aspect (Keras ``target_size``), ``crop`` scales to cover
   and takes the centre, ``pad`` scales to fit and centres it on
   ``background``.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, UnidentifiedImageError

RESIZE_MODES = ("stretch", "crop", "pad")
DEFAULT_BACKGROUND = (255, 255, 255)
MAX_PIXELS = 1 << 27
"""Files whose header declares more pixels (~134 megapixels) are skipped as absurdly large."""

_SHRINK = Image.Resampling.BOX  # area averaging: antialiased, and ~35% cheaper than bilinear after draft()
_ENLARGE = Image.Resampling.BILINEAR
_REDUCING_GAP = 2.0  # big reductions go through Image.reduce() first (integer box, fast)


def _resized(im: Image.Image, size: tuple[int, int], box=None) -> Image.Image:
    """``im`` (or its ``box``) resized to ``size`` = (width, height): area averaging down, bilinear up."""
    src_w, src_h = (box[2] - box[0], box[3] - box[1]) if box is not None else im.size
    if size[0] <= src_w and size[1] <= src_h:
        return im.resize(size, _SHRINK, box=box, reducing_gap=_REDUCING_GAP)
    return im.resize(size, _ENLARGE, box=box)
_ORIENT_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_ALPHA_MODES = {"LA", "PA", "RGBA", "La", "RGBa"}


class SkipFile(Exception):
    """This file cannot become a row; ``str(exc)`` is the reason written to the skip report."""


@dataclass(frozen=True)
class DecodeSpec:
    """How every file of one ingest is decoded.  ``size`` is (height, width)."""

    size: tuple[int, int]
    resize: str = "stretch"
    channels: int = 3
    background: tuple[int, int, int] = DEFAULT_BACKGROUND
    max_pixels: int = MAX_PIXELS

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.size[0], self.size[1], self.channels)


def _orientation(im: Image.Image) -> int:
    try:
        return int(im.getexif().get(0x0112, 1) or 1)
    except Exception:  # a broken EXIF block must not cost the image
        return 1


def _draft_box(spec: DecodeSpec, orientation: int) -> tuple[int, int]:
    h, w = spec.size
    return (h, w) if orientation in (5, 6, 7, 8) else (w, h)  # Pillow sizes are (width, height)


def _scale_to_uint8(arr: np.ndarray, mode: str) -> np.ndarray:
    """Map a high-depth single-band array to uint8 by the rule in the module docstring."""
    if mode.startswith("I;16"):
        return np.clip(np.rint(arr.astype(np.float64) / 257.0), 0, 255).astype(np.uint8)
    arr = arr.astype(np.float64)
    finite = arr[np.isfinite(arr)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
    arr = np.nan_to_num(arr, nan=lo, posinf=hi, neginf=lo)
    if mode == "F" and lo >= 0 and hi <= 1.0:
        out = arr * 255.0
    elif lo >= 0 and hi <= 255:
        out = arr
    elif lo >= 0 and hi <= 65535:
        out = arr / 257.0
    else:
        out = (arr - lo) * (255.0 / (hi - lo))
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def to_rgb_or_l(im: Image.Image, channels: int, background: tuple[int, int, int]) -> Image.Image:
    """Convert any Pillow mode to ``RGB`` (channels=3) or ``L`` (channels=1), compositing alpha on ``background``."""
    mode = im.mode
    if mode == "P":
        im = im.convert("RGBA" if "transparency" in im.info else "RGB")
    elif mode == "1":
        im = im.convert("L")
    elif mode.startswith("I;16") or mode in ("I", "F"):
        im = Image.fromarray(_scale_to_uint8(np.asarray(im), mode), "L")
    elif mode in ("La", "RGBa"):
        im = im.convert("RGBA")  # un-premultiply
    if im.mode in _ALPHA_MODES:
        rgba = im.convert("RGBA")
        base = Image.new("RGBA", rgba.size, (*background, 255))
        im = Image.alpha_composite(base, rgba).convert("RGB")
    if channels == 1:
        return im if im.mode == "L" else (im if im.mode == "RGB" else im.convert("RGB")).convert("L")
    return im if im.mode == "RGB" else im.convert("RGB")


def resize(im: Image.Image, size: tuple[int, int], mode: str, background: tuple[int, int, int]) -> Image.Image:
    """Resize ``im`` to ``size`` = (height, width) by ``mode`` (stretch | crop | pad)."""
    th, tw = size
    w, h = im.size
    if mode == "stretch":
        return im if (w, h) == (tw, th) else _resized(im, (tw, th))
    if mode == "crop":
        scale = max(tw / w, th / h)
        bw, bh = tw / scale, th / scale  # source box with the target aspect, centred
        left, top = (w - bw) / 2, (h - bh) / 2
        return _resized(im, (tw, th), box=(left, top, left + bw, top + bh))
    if mode == "pad":
        scale = min(tw / w, th / h)
        nw, nh = max(1, min(tw, round(w * scale))), max(1, min(th, round(h * scale)))
        fill = background if im.mode == "RGB" else int(round(np.dot(background, (0.299, 0.587, 0.114))))
        canvas = Image.new(im.mode, (tw, th), fill)
        canvas.paste(_resized(im, (nw, nh)), ((tw - nw) // 2, (th - nh) // 2))
        return canvas
    raise ValueError(f"resize mode must be one of {', '.join(RESIZE_MODES)}, got {mode!r}")


def decode_file(path: str, spec: DecodeSpec) -> np.ndarray:
    """Decode ``path`` to a ``spec.shape`` uint8 array, or raise :class:`SkipFile` with the reason."""
    try:
        if os.path.getsize(path) == 0:
            raise SkipFile("empty file (0 bytes)")
    except OSError as exc:
        raise SkipFile(f"unreadable: {exc.strerror or exc}") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DecompressionBombWarning etc.: our own limit below decides
            im = Image.open(path)
    except UnidentifiedImageError:
        raise SkipFile("not an image Pillow can read") from None
    except Image.DecompressionBombError as exc:
        raise SkipFile(f"too large: {exc}") from None
    except OSError as exc:
        if exc.errno is not None:  # the OS refused (permissions, I/O error, dangling link)
            raise SkipFile(f"unreadable: {exc.strerror or exc}") from None
        raise SkipFile(f"truncated or corrupt: {exc}") from None  # Pillow's own OSError: bad bytes
    except Exception as exc:  # Pillow plugins raise assorted types on malformed headers
        raise SkipFile(f"unreadable header: {type(exc).__name__}: {exc}") from None
    with im:
        try:
            w, h = im.size
            if w < 1 or h < 1:
                raise SkipFile(f"empty image ({w}x{h})")
            if w * h > spec.max_pixels:
                raise SkipFile(f"too large: {w}x{h} = {w * h} pixels > limit {spec.max_pixels}")
            orientation = _orientation(im)
            if im.format == "JPEG":
                draft_mode = "L" if spec.channels == 1 and im.mode == "RGB" else None
                im.draft(draft_mode, _draft_box(spec, orientation))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                im.load()
            out = im
            if orientation in _ORIENT_TRANSPOSE:
                out = out.transpose(_ORIENT_TRANSPOSE[orientation])
            out = to_rgb_or_l(out, spec.channels, spec.background)
            out = resize(out, spec.size, spec.resize, spec.background)
            arr = np.asarray(out, dtype=np.uint8)
        except SkipFile:
            raise
        except Image.DecompressionBombError as exc:
            raise SkipFile(f"too large: {exc}") from None
        except (OSError, SyntaxError, ValueError) as exc:
            raise SkipFile(f"truncated or corrupt: {exc}") from None
        except MemoryError:
            raise SkipFile(f"out of memory decoding {w}x{h}") from None
        except Exception as exc:
            raise SkipFile(f"decode failed: {type(exc).__name__}: {exc}") from None
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.shape != spec.shape:  # a bug, not a bad file; still never a partial row
        raise SkipFile(f"decoded to {arr.shape}, expected {spec.shape}")
    return arr


# -- worker side (this module imports only numpy and Pillow, so decode processes start fast) --


def init_worker() -> None:
    """In a spawned worker: leave Ctrl-C to the parent (which commits and stops the pool), and exit as
    soon as the parent dies, even by SIGKILL, so no orphan keeps decoding.  (SIGINT is already ignored
    from birth when :meth:`DecodePool.start` launched it; this covers a pool started another way.)"""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch():
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="h5stream-parent-watch", daemon=True).start()


def decode_task(root: str, relpaths: list[str], spec: DecodeSpec) -> tuple[np.ndarray, list[str | None]]:
    """Decode ``relpaths``; returns (stacked images of the good ones, per-file skip reason or None)."""
    good, reasons = [], []
    for rel in relpaths:
        try:
            good.append(decode_file(os.path.join(root, rel), spec))
            reasons.append(None)
        except SkipFile as exc:
            reasons.append(str(exc) or "skipped")
    images = np.stack(good) if good else np.empty((0, *spec.shape), dtype=np.uint8)
    return images, reasons
