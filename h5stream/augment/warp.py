"""One affine warp per image with OpenCV, with scipy.ndimage's (hence Keras') fill-mode conventions.

:func:`affine_matrices` composes Keras' rotation, shift, shear and zoom (and
output flips) into inverse maps, vectorised over a batch;
:func:`apply_affine_transform` is Keras' function of the same name for one
H x W x C image.  Pure functions; OpenCV is imported on first use.

Fill modes map onto OpenCV as follows (scipy semantics, checked against Keras
in tests/test_augment_parity.py):

* ``nearest`` -> ``BORDER_REPLICATE``
* ``reflect`` -> ``BORDER_REFLECT`` (half-sample symmetric, ``d c b a | a b c d``)
* ``constant`` -> replicate, then ``cval`` wherever the sample point lies
  outside ``[0, W-1] x [0, H-1]`` (scipy does not blend the edge with cval;
  OpenCV's ``BORDER_CONSTANT`` would)
* ``wrap`` -> coordinates folded with period ``n - 1`` (scipy's legacy wrap,
  where first and last samples overlap), then ``remap``; OpenCV's
  ``BORDER_WRAP`` has period ``n``

The centre of rotation, shear and zoom is the image centre
``((W-1)/2, (H-1)/2)``; Keras uses ``(H-1)/2`` for the column centre too,
which only differs when H != W.
"""

from __future__ import annotations

import functools
import math
import numbers
import threading

import numpy as np

from h5stream import _deps
from h5stream.errors import ConfigError

FILL_MODES = ("constant", "nearest", "reflect", "wrap")
_WARP_DTYPES = (np.uint8, np.uint16, np.int16, np.float32, np.float64)
# OpenCV's uint8 bilinear warp is vectorised on 4 channels, not on 3, which pays
# for the RGB->RGBA->RGB conversions on images of at least this many pixels; on
# smaller ones the conversions cost more than they save.
_FAST_PATH_MIN_PIXELS = 64 * 64

def _cv2():
    # Imported lazily: `import h5stream` must stay cheap, and workers import it once.
    return _deps.cv2()


def _check_fill_mode(fill_mode):
    if fill_mode not in FILL_MODES:
        raise ConfigError(f"fill_mode={fill_mode!r} is not supported; use one of {', '.join(FILL_MODES)}")



# --------------------------------------------------------------------------- geometry


def affine_matrices(theta, tx, ty, shear, zx, zy, height, width, flip_h=None, flip_v=None) -> np.ndarray:
    """Inverse affine maps, float64 ``(n, 2, 3)``, vectorised over samples.

    Parameters follow Keras' ``apply_affine_transform``: ``theta`` and ``shear``
    in degrees, ``tx`` / ``ty`` in pixels along x (columns) / y (rows), ``zx`` /
    ``zy`` zoom factors (> 1 shows a smaller image).  The matrix is Keras'
    ``rotation @ shift @ shear @ zoom`` about the image centre; a flip of the
    output (``flip_h`` / ``flip_v`` bool arrays) is folded into it, so one warp
    does everything.  ``M`` maps an output pixel ``(x, y, 1)`` to the source
    point it samples: OpenCV's ``WARP_INVERSE_MAP`` convention.
    """
    theta = np.deg2rad(np.asarray(theta, dtype=np.float64).reshape(-1))
    n = theta.shape[0]

    def col(v):
        # (n,) or (1,): the arithmetic below broadcasts (np.broadcast_to costs more than the maths at n = 32).
        v = np.asarray(v, dtype=np.float64).reshape(-1)
        if v.shape[0] not in (1, n):
            raise ConfigError(f"affine_matrices: {v.shape[0]} values for {n} samples; pass one per sample or one")
        return v

    tx, ty, zx, zy = col(tx), col(ty), col(zx), col(zy)
    shear = np.deg2rad(col(shear))
    cos_t, sin_t = np.cos(theta), np.sin(theta)
    # rotation @ shear == [[cos t, -sin(t + s)], [sin t, cos(t + s)]]
    m = np.empty((n, 2, 3), dtype=np.float64)
    m[:, 0, 0] = cos_t * zx
    m[:, 0, 1] = -np.sin(theta + shear) * zy
    m[:, 1, 0] = sin_t * zx
    m[:, 1, 1] = np.cos(theta + shear) * zy
    ox, oy = (width - 1) / 2.0, (height - 1) / 2.0
    # translation: rotation @ t, then conjugate by the centre offset.
    m[:, 0, 2] = cos_t * tx - sin_t * ty + ox - (m[:, 0, 0] * ox + m[:, 0, 1] * oy)
    m[:, 1, 2] = sin_t * tx + cos_t * ty + oy - (m[:, 1, 0] * ox + m[:, 1, 1] * oy)
    # A flip of the output, x -> (W-1) - x, folds into column 0 (y into column 1).  np.where rather than
    # boolean-mask assignment: the same values, cheaper on a batch.
    for flip, axis, size in ((flip_h, 0, width), (flip_v, 1, height)):
        if flip is not None:
            f = np.asarray(flip, dtype=bool).reshape(-1, 1)
            m[:, :, 2] = np.where(f, m[:, :, 2] + m[:, :, axis] * (size - 1), m[:, :, 2])
            m[:, :, axis] = np.where(f, -m[:, :, axis], m[:, :, axis])
    return m


def _source_coords(matrix, height, width):
    """Float64 (H, W) source x and y of every output pixel."""
    cols = np.arange(width, dtype=np.float64)
    rows = np.arange(height, dtype=np.float64)
    xs = (matrix[0, 1] * rows + matrix[0, 2])[:, None] + (matrix[0, 0] * cols)[None, :]
    ys = (matrix[1, 1] * rows + matrix[1, 2])[:, None] + (matrix[1, 0] * cols)[None, :]
    return xs, ys


def _warp_channels(cv2, src, matrix, dst, fill_mode, cval, interp, offset=0):
    """Warp an (H, W, C<=4) image into ``dst`` with scipy.ndimage's fill-mode conventions.

    ``offset`` > 0 means ``src`` is the image padded by that many replicated
    pixels on every side ("nearest" / "constant" only); ``matrix`` always
    refers to the unpadded image.
    """
    h, w = dst.shape[:2]
    flags = interp | cv2.WARP_INVERSE_MAP
    warp_matrix = matrix
    if offset:
        warp_matrix = matrix.copy()
        warp_matrix[:, 2] += offset
    if fill_mode == "nearest":
        cv2.warpAffine(src, warp_matrix, (w, h), dst=dst, flags=flags, borderMode=cv2.BORDER_REPLICATE)
    elif fill_mode == "reflect":
        # scipy "reflect" is half-sample symmetric (d c b a | a b c d): OpenCV's BORDER_REFLECT.
        cv2.warpAffine(src, matrix, (w, h), dst=dst, flags=flags, borderMode=cv2.BORDER_REFLECT)
    elif fill_mode == "constant":
        # scipy "constant" does not blend the edge with cval: a sample point
        # outside [0, W-1] x [0, H-1] is cval, one inside interpolates the
        # image only.  OpenCV's BORDER_CONSTANT would blend a 1-pixel fringe, so
        # warp with replicated edges and paint the outside exactly.
        cv2.warpAffine(src, warp_matrix, (w, h), dst=dst, flags=flags, borderMode=cv2.BORDER_REPLICATE)
        xs, ys = _source_coords(matrix, h, w)
        outside = (xs < 0) | (xs > w - 1) | (ys < 0) | (ys > h - 1)
        dst.reshape(h, w, -1)[outside] = cval
    else:  # "wrap"
        # scipy "wrap" repeats with period n-1 (first and last samples
        # overlap), unlike OpenCV's BORDER_WRAP (period n): fold the
        # coordinates ourselves and remap.
        xs, ys = _source_coords(matrix, h, w)
        xs = np.mod(xs, w - 1) if w > 1 else np.zeros_like(xs)
        ys = np.mod(ys, h - 1) if h > 1 else np.zeros_like(ys)
        cv2.remap(
            src, xs.astype(np.float32), ys.astype(np.float32), interp, dst=dst, borderMode=cv2.BORDER_REPLICATE
        )


class _Scratch:
    """Warp buffers for one call: ``src4`` / ``dst4`` ``(group, H, W, 4)`` or None, and each image's edge padding.

    ``pads[i]`` (ints) is how many replicated pixels image ``i`` gets on every
    side before its warp (0: none); :meth:`padded` is the buffer for it.  The
    buffers come from :func:`_reusable`: owned by the calling thread, valid
    until its next call, never shared between threads.
    """

    __slots__ = ("pads", "full", "src4", "dst4")

    def __init__(self, pads, full, src4, dst4):
        self.pads, self.full, self.src4, self.dst4 = pads, full, src4, dst4

    def padded(self, pad: int, height: int, width: int) -> np.ndarray:
        """Room for one ``height`` x ``width`` image padded by ``pad`` (> 0): the top-left corner of ``full``,
        a buffer sized for the largest pad (OpenCV takes the strided view as it is, without a copy)."""
        return self.full[: height + 2 * pad, : width + 2 * pad]


_local = threading.local()
_REUSABLE_MAX = 8  # distinct buffers kept per thread; more (many image sizes) starts the set afresh


def _reusable(role: str, shape, dtype) -> np.ndarray:
    """An uninitialised array of ``shape``/``dtype`` kept for the calling thread's later calls.

    A worker augments batch after batch of the same shape: allocating the
    scratch afresh each time would page-fault it in again (glibc returns
    large blocks to the kernel).  Keyed by ``role`` so that two buffers of one
    call never alias.
    """
    cache = getattr(_local, "arrays", None)
    if cache is None:
        cache = _local.arrays = {}
    key = (role, tuple(shape), np.dtype(dtype).str)
    arr = cache.get(key)
    if arr is None:
        if len(cache) >= _REUSABLE_MAX:
            cache.clear()
        arr = cache[key] = np.empty(shape, dtype)
    return arr


def _plan_scratch(matrices, shape, dtype, fill_mode, group: int = 1) -> _Scratch:
    """Choose buffers for warping images of ``shape`` (H, W, C) with these (n, 2, 3) matrices.

    Two speed-ups of OpenCV's bilinear warp:
    * 3-channel uint8 goes through RGBA: 4-channel remap is vectorised, 3-channel
      is not, worth it from 64x64 up; ``group`` images are converted per
      OpenCV call;
    * for replicated edges ("nearest", and "constant", which is replicate plus a
      mask) each source is first padded by its own map's largest overshoot, so
      that nearly every sample takes the in-bounds fast path instead of the
      per-pixel border path.  Replicate
      padding followed by a replicate border is the same extended image, so
      the result does not change; and since an image's pad depends on its own
      map alone, neither does it depend on the rest of the batch.
    """
    h, w, c = shape
    n = matrices.shape[0]
    four = c == 3 and np.dtype(dtype) == np.uint8 and h * w >= _FAST_PATH_MIN_PIXELS
    channels = 4 if four else c
    max_pad = max(8, max(h, w) // 4)
    pads = [0] * n
    if fill_mode in ("nearest", "constant") and c <= 4 and h * w >= _FAST_PATH_MIN_PIXELS:
        src = matrices @ _corners(h, w)  # (n, 2, 4); the extreme samples of an affine map are at corners
        over = np.maximum.reduce([-src[:, 0].min(axis=1), src[:, 0].max(axis=1) - (w - 1),
                                  -src[:, 1].min(axis=1), src[:, 1].max(axis=1) - (h - 1)])
        pads = np.where(over > 0, np.minimum(np.ceil(over) + 2, max_pad), 0).astype(np.int64).tolist()
    full = _reusable("padded", (h + 2 * max_pad, w + 2 * max_pad, channels), dtype) if any(pads) else None
    src4 = _reusable("src4", (group, h, w, 4), dtype) if four else None
    dst4 = _reusable("dst4", (group, h, w, 4), dtype) if four else None
    return _Scratch(pads, full, src4, dst4)


@functools.lru_cache(maxsize=16)
def _corners(h: int, w: int) -> np.ndarray:
    """Homogeneous (x, y, 1) columns of an h x w image's four corner pixels (read-only)."""
    corners = np.array([[0, w - 1, 0, w - 1], [0, 0, h - 1, h - 1], [1, 1, 1, 1]], dtype=np.float64)
    corners.flags.writeable = False
    return corners


def _warp_into(cv2, src, matrix, dst, fill_mode, cval, interp, scratch: _Scratch, pad: int):
    """Warp one (H, W, C) image into the C-contiguous ``dst`` of the same shape and dtype (``pad``: its
    scratch.pads)."""
    channels = src.shape[2]
    if channels > 4:
        # OpenCV's remap handles at most 4 channels: go through groups of 4.
        for lo in range(0, channels, 4):
            part = np.ascontiguousarray(src[:, :, lo : lo + 4])
            out = np.empty_like(part)
            _warp_channels(cv2, part, matrix, out, fill_mode, cval, interp)
            dst[:, :, lo : lo + 4] = out
        return
    if scratch.src4 is not None:
        cv2.cvtColor(src, cv2.COLOR_RGB2RGBA, dst=scratch.src4[0])
        src, target = scratch.src4[0], scratch.dst4[0]
    else:
        target = dst
    if pad:
        padded = scratch.padded(pad, *src.shape[:2])
        cv2.copyMakeBorder(src, pad, pad, pad, pad, cv2.BORDER_REPLICATE, dst=padded)
        _warp_channels(cv2, padded, matrix, target, fill_mode, cval, interp, offset=pad)
    else:
        _warp_channels(cv2, src, matrix, target, fill_mode, cval, interp)
    if scratch.src4 is not None:
        cv2.cvtColor(target, cv2.COLOR_RGBA2RGB, dst=dst)


def apply_affine_transform(x, theta=0, tx=0, ty=0, shear=0, zx=1, zy=1, fill_mode="nearest", cval=0.0, order=1):
    """Keras' ``apply_affine_transform`` for one H x W x C image (channels last), via OpenCV.

    Same parameter meaning as ``keras.src.legacy.preprocessing.image.apply_affine_transform``
    called with ``row_axis=0, col_axis=1, channel_axis=2``: ``theta`` and
    ``shear`` in degrees, ``tx`` / ``ty`` in pixels (positive moves the content
    left / up), ``zx`` / ``zy`` zoom factors, ``fill_mode`` one of
    ``constant | nearest | reflect | wrap`` with scipy.ndimage's conventions,
    ``order`` 0 (nearest) or 1 (bilinear).  Returns a new array of ``x``'s
    dtype (uint8, uint16, int16, float32 or float64).  Matches Keras up to
    interpolation rounding (OpenCV samples at 1/32-pixel resolution) on square
    images; on non-square ones the centre differs (see the module docstring).
    """
    x = np.asarray(x)
    if x.ndim != 3:
        raise ConfigError(f"apply_affine_transform: x must be one H x W x C image, got shape {x.shape}")
    if x.dtype.type not in _WARP_DTYPES:
        raise ConfigError(
            f"apply_affine_transform: dtype {x.dtype} is not supported; "
            "use one of uint8, uint16, int16, float32, float64"
        )
    _check_fill_mode(fill_mode)
    if order not in (0, 1):
        raise ConfigError(f"apply_affine_transform: order={order!r}; use 0 (nearest) or 1 (bilinear)")
    if isinstance(cval, bool) or not isinstance(cval, numbers.Real) or not math.isfinite(cval):
        raise ConfigError(f"apply_affine_transform: cval={cval!r} must be a finite number")
    h, w = x.shape[:2]
    if theta == 0 and tx == 0 and ty == 0 and shear == 0 and zx == 1 and zy == 1:
        return x.copy()  # Keras skips the warp entirely for the identity
    matrix = affine_matrices(theta, tx, ty, shear, zx, zy, h, w)[0]
    cv2 = _cv2()
    src = np.ascontiguousarray(x)
    dst = np.empty_like(src)
    interp = cv2.INTER_NEAREST if order == 0 else cv2.INTER_LINEAR
    scratch = _plan_scratch(matrix[None], src.shape, src.dtype, fill_mode)  # the same path Augment takes
    _warp_into(cv2, src, matrix, dst, fill_mode, cval, interp, scratch, scratch.pads[0])
    return dst
