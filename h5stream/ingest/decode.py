"""Decode one image file into a fixed-size uint8 array (pure: no process set-up, no global state).

The decode pool (:mod:`h5stream.ingest.pool`) runs it in its worker processes, or in the calling thread.

:func:`decode_file` returns ``(H, W, C)`` uint8 or raises :class:`SkipFile`
with a one-line reason; it never returns a partial image.  Steps:

1. Open with Pillow; refuse files whose header declares more than
   ``max_pixels`` pixels before any pixel is decoded.
2. JPEG: ``draft()`` lets libjpeg decode at 1/2, 1/4 or 1/8 scale when the
   result still covers the target (for all resize modes), which is most of
   the speed-up over decoding at full size.  A whole 8-bit RGB or grayscale
   JPEG is then decoded by OpenCV's ``imdecode`` at that same scale (the same
   libjpeg-turbo work, the same pixels, less CPU than Pillow's load, which
   feeds the decoder in blocks and stores RGB as RGBX);
   everything else, and any JPEG that does not end in its EOI marker (it may
   be truncated), goes through Pillow, which says what is wrong with it.
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
5. Resize to ``size`` = (height, width): ``stretch`` ignores aspect (Keras
   ``target_size``), ``crop`` scales to cover and takes the centre, ``pad``
   scales to fit and centres it on ``pad_fill`` (default black, 0, as Keras'
   ``pad_to_aspect_ratio`` / ``tf.image.resize_with_pad``).  What is left to shrink
   after ``draft()`` is under 2x for JPEGs; such steps (and enlarging) are
   bilinear (OpenCV), which is also closer to a full-resolution Lanczos
   reference than an area average here.  Shrinking by 2x or more (PNGs, huge
   JPEGs) averages areas (Pillow ``BOX`` after an integer ``reduce``) so
   nothing aliases.
"""

from __future__ import annotations

import io
import os
import warnings

import numpy as np
from PIL import Image, UnidentifiedImageError

from h5stream import _deps
from h5stream.ingest.spec import (  # noqa: F401 - the decoder's settings, also under this module's name
    DEFAULT_BACKGROUND,
    DEFAULT_PAD_FILL,
    FD_LIMIT_ERRNOS,
    MAX_PIXELS,
    RESIZE_MODES,
    DecodeSpec,
)

cv2 = _deps.cv2()


_SHRINK = Image.Resampling.BOX  # area averaging for reductions of 2x or more: antialiased
_REDUCING_GAP = 2.0  # big reductions go through Image.reduce() first (integer box, fast)
_AREA_FROM = 2.0  # shrink factors from here on average areas; below it bilinear samples every source pixel


def _resized(arr: np.ndarray, size: tuple[int, int], box=None) -> np.ndarray:
    """``arr`` (H x W or H x W x C uint8), or its ``box`` (left, top, right, bottom in source pixels), resized
    to ``size`` = (width, height): bilinear below a 2x reduction, area averaging from 2x on."""
    h, w = arr.shape[:2]
    left, top, right, bottom = box if box is not None else (0, 0, w, h)
    fx, fy = (right - left) / size[0], (bottom - top) / size[1]  # source pixels per output pixel
    if fx >= _AREA_FROM or fy >= _AREA_FROM:
        im = Image.fromarray(arr)
        return np.asarray(im.resize(size, _SHRINK, box=box, reducing_gap=_REDUCING_GAP))
    if box is None:
        return cv2.resize(arr, size, interpolation=cv2.INTER_LINEAR)
    # Output pixel centre (x + 0.5) maps to source left + (x + 0.5) * fx, a pixel centre being at i + 0.5.
    m = np.array([[fx, 0.0, left + 0.5 * fx - 0.5], [0.0, fy, top + 0.5 * fy - 0.5]])
    return cv2.warpAffine(arr, m, size, flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP, borderMode=cv2.BORDER_REPLICATE)


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
#: The same transpositions on arrays (rows = y), for images OpenCV decoded.
_ORIENT_ARRAY = {
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.swapaxes(0, 1),
    6: lambda a: np.rot90(a, -1),
    7: lambda a: a[::-1, ::-1].swapaxes(0, 1),
    8: lambda a: np.rot90(a),
}
#: ``imdecode`` flags per draft scale (libjpeg's scale_denom), colour and grayscale.
_CV_COLOR = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
             8: cv2.IMREAD_REDUCED_COLOR_8}
_CV_GRAY = {1: cv2.IMREAD_GRAYSCALE, 2: cv2.IMREAD_REDUCED_GRAYSCALE_2, 4: cv2.IMREAD_REDUCED_GRAYSCALE_4,
            8: cv2.IMREAD_REDUCED_GRAYSCALE_8}
_JPEG_EOI = b"\xff\xd9"


class SkipFile(Exception):
    """This file cannot become a row; ``str(exc)`` is the reason written to the skip report."""


def _orientation(im: Image.Image) -> int:
    try:
        return int(im.getexif().get(0x0112, 1) or 1)
    except Exception:  # a broken EXIF block must not cost the image
        return 1


def _draft_box(spec: DecodeSpec, orientation: int) -> tuple[int, int]:
    h, w = spec.size
    return (h, w) if orientation in (5, 6, 7, 8) else (w, h)  # Pillow sizes are (width, height)


def jpeg_by_opencv(im: Image.Image, channels: int) -> np.ndarray | None:
    """Decode an opened (and drafted) 8-bit RGB or grayscale JPEG with OpenCV: (H, W, 3) RGB or (H, W)
    luma at ``im.size``, EXIF orientation *not* applied; None when this is not such a file or OpenCV
    refuses it (the caller then decodes with Pillow, which names the problem)."""
    if im.format != "JPEG" or im.mode not in ("RGB", "L") or channels not in (1, 3):
        return None
    scale = im.decoderconfig[0] if im.decoderconfig else 1
    flags = (_CV_GRAY if channels == 1 else _CV_COLOR).get(scale)
    if flags is None:
        return None
    im.fp.seek(0)
    data = im.fp.read()
    if data.rstrip(b"\0")[-2:] != _JPEG_EOI:  # cut short? some OpenCV releases pad it and return it; Pillow refuses it
        return None
    try:
        arr = cv2.imdecode(np.frombuffer(data, np.uint8), flags | cv2.IMREAD_IGNORE_ORIENTATION)
    except cv2.error:
        return None
    w, h = im.size
    if arr is None or arr.dtype != np.uint8 or arr.shape[:2] != (h, w) or arr.ndim != (2 if channels == 1 else 3):
        return None
    if arr.ndim == 3:
        cv2.cvtColor(arr, cv2.COLOR_BGR2RGB, dst=arr)
    return arr


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


def resize(arr: np.ndarray, size: tuple[int, int], mode: str, pad_fill: tuple[int, int, int]) -> np.ndarray:
    """Resize ``arr`` (H x W x C uint8, C = 1 or 3) to ``size`` = (height, width) by ``mode`` (stretch | crop | pad);
    ``pad`` fills around the image with ``pad_fill`` (its luma for one channel)."""
    th, tw = size
    h, w = arr.shape[:2]
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]  # OpenCV and Pillow take 2-D single-band images
    if mode == "stretch":
        out = arr if (w, h) == (tw, th) else _resized(arr, (tw, th))
    elif mode == "crop":
        scale = max(tw / w, th / h)
        bw, bh = tw / scale, th / scale  # source box with the target aspect, centred
        left, top = (w - bw) / 2, (h - bh) / 2
        out = _resized(arr, (tw, th), box=(left, top, left + bw, top + bh))
    elif mode == "pad":
        scale = min(tw / w, th / h)
        nw, nh = max(1, min(tw, round(w * scale))), max(1, min(th, round(h * scale)))
        fill = pad_fill if arr.ndim == 3 else int(round(np.dot(pad_fill, (0.299, 0.587, 0.114))))
        out = np.empty((th, tw) + arr.shape[2:], np.uint8)
        out[...] = fill
        top, left = (th - nh) // 2, (tw - nw) // 2
        out[top:top + nh, left:left + nw] = _resized(arr, (nw, nh))
    else:
        raise ValueError(f"resize mode must be one of {', '.join(RESIZE_MODES)}, got {mode!r}")
    return out if out.ndim == 3 else out[:, :, None]


def decode_file(path: str, spec: DecodeSpec) -> np.ndarray:
    """Decode ``path`` to a ``spec.shape`` uint8 array, or raise :class:`SkipFile` with the reason.  Running out
    of file descriptors (:data:`FD_LIMIT_ERRNOS`) raises that OSError: it is not the file's fault."""
    try:
        if os.path.getsize(path) == 0:
            raise SkipFile("empty file (0 bytes)")
    except OSError as exc:
        raise SkipFile(f"unreadable: {exc.strerror or exc}") from None
    return _decode_opened(path, spec)


def decode_bytes(data: bytes, spec: DecodeSpec) -> np.ndarray:
    """Decode the encoded image ``data`` (the bytes of a JPEG, PNG, ... file) exactly as :func:`decode_file`
    decodes a file holding them, or raise :class:`SkipFile` with the reason."""
    if not len(data):
        raise SkipFile("empty image bytes (0 bytes)")
    return _decode_opened(io.BytesIO(data), spec)


def _decode_opened(path, spec: DecodeSpec) -> np.ndarray:
    """:func:`decode_file` past its size check: ``path`` is a file name or a binary file object."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DecompressionBombWarning etc.: our own limit below decides
            im = Image.open(path)
    except UnidentifiedImageError:
        raise SkipFile("not an image Pillow can read") from None
    except Image.DecompressionBombError as exc:
        raise SkipFile(f"too large: {exc}") from None
    except OSError as exc:
        if exc.errno in FD_LIMIT_ERRNOS:
            raise
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
            decoded = None
            if im.format == "JPEG":
                draft_mode = "L" if spec.channels == 1 and im.mode == "RGB" else None
                im.draft(draft_mode, _draft_box(spec, orientation))
                decoded = jpeg_by_opencv(im, spec.channels)
            if decoded is not None:
                if orientation in _ORIENT_ARRAY:
                    decoded = np.ascontiguousarray(_ORIENT_ARRAY[orientation](decoded))
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    im.load()
                out = im
                if orientation in _ORIENT_TRANSPOSE:
                    out = out.transpose(_ORIENT_TRANSPOSE[orientation])
                out = to_rgb_or_l(out, spec.channels, spec.background)
                decoded = np.asarray(out, dtype=np.uint8)
            arr = resize(decoded, spec.size, spec.resize, spec.pad_fill)
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
    if arr.shape != spec.shape:  # a bug, not a bad file; still never a partial row
        raise SkipFile(f"decoded to {arr.shape}, expected {spec.shape}")
    return arr


def decode_each(root: str, relpaths: list[str], spec: DecodeSpec, out: np.ndarray) -> list[str | None]:
    """Decode ``relpaths`` into ``out`` (rows x H x W x C), the good ones packed from row 0 in order;
    returns each file's skip reason, or None for a file that became a row."""
    reasons, k = [], 0
    for rel in relpaths:
        try:
            out[k] = decode_file(os.path.join(root, rel), spec)
            k += 1
            reasons.append(None)
        except SkipFile as exc:
            reasons.append(str(exc) or "skipped")
    return reasons


def decode_task(root: str, relpaths: list[str], spec: DecodeSpec) -> tuple[np.ndarray, list[str | None]]:
    """Decode ``relpaths`` in this process; returns (the good ones' images, per-file skip reason or None)."""
    out = np.empty((len(relpaths), *spec.shape), dtype=np.uint8)
    reasons = decode_each(root, relpaths, spec, out)
    return out[:reasons.count(None)], reasons
