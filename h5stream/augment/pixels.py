"""The uint8 pixel stage of :class:`~h5stream.augment.transforms.Augment`: Keras' channel shift and brightness, and
the batched warp + shift of the common case.

:func:`color_into` is Keras' ``apply_channel_shift`` then ``apply_brightness_shift`` on one uint8 image, in
place; :func:`warp_rgba_padded_shift` runs, for a whole batch, the same OpenCV calls as the per-image path of
:func:`h5stream.augment.warp._warp_into` (fill "nearest", RGBA scratch, replicate padding) and the channel shift,
with the per-image Python glue hoisted out.  Functions of their arguments only, writing into arrays the caller
owns; ``cv2`` is passed in (the caller imports it lazily).
"""

from __future__ import annotations

import numpy as np

TRUNC = 2  # cv2.THRESH_TRUNC (cv2 itself is imported lazily)


def shift_into(cv2, flat, shift):
    """Keras' ``apply_channel_shift`` in place on a 2-D uint8 view: ``clip(x + shift, min(x), max(x))``.

    ``shift`` is a non-zero int.  Each step (cv2.threshold TRUNC, numpy add or
    subtract with a scalar) is one SIMD pass that never leaves [0, 255]; cv2.min
    / cv2.add and numpy's minimum with a scalar are slower.
    """
    lo, hi = cv2.minMaxLoc(flat)[:2]
    lo, hi = int(lo), int(hi)
    if shift > 0:
        if hi - shift < lo:
            flat.fill(hi)  # every x + shift lies above the image's max
        else:
            cv2.threshold(flat, hi - shift, 255, TRUNC, flat)  # min(x, hi - shift)
            np.add(flat, shift, out=flat)
        return
    down = -shift
    if lo + down > hi:
        flat.fill(lo)
    else:
        # max(x - down, lo) == (hi - down) - min(hi - x, hi - lo - down), every term in [0, 255].
        np.subtract(hi, flat, out=flat)
        cv2.threshold(flat, hi - lo - down, 255, TRUNC, flat)
        np.subtract(hi - down, flat, out=flat)


def color_into(cv2, img, shift, brightness):
    """Keras' channel shift then brightness, in place on one uint8 image.

    ``shift`` (int, already rounded) is added to every channel and clipped to
    the image's own [min, max], as ``apply_channel_shift`` does;
    ``brightness`` (float or None) scales like PIL's ``ImageEnhance.Brightness``
    (multiply, truncate, clip to 255), as ``apply_brightness_shift`` does.
    """
    flat = img.reshape(img.shape[0], -1)  # 2-D view: a scalar then applies to every channel
    if brightness is None:
        if shift != 0:
            shift_into(cv2, flat, shift)
        return
    levels = np.arange(256, dtype=np.int32)
    if shift != 0:
        lo, hi = (int(v) for v in cv2.minMaxLoc(flat)[:2])
        levels = np.clip(levels + shift, lo, hi)
    # PIL blends with black in single precision and truncates.
    scaled = np.floor(levels.astype(np.float32) * np.float32(brightness))
    lut = np.clip(scaled, 0, 255).astype(np.uint8)
    cv2.LUT(flat, lut, dst=flat)


# Images per RGB <-> RGBA conversion call in the fast path: one call per group instead of two per image saves
# the call overhead, and the group's two RGBA buffers stay small enough to share a core's cache with the padded
# source.
GROUP_BYTES = 256 << 10


def group_size(h, w) -> int:
    return max(1, GROUP_BYTES // (h * w * 4))


def warp_rgba_padded_shift(cv2, images, matrices, scratch, out, shifts):
    """``warp._warp_into`` (fill "nearest", RGBA scratch, replicate padding) + ``color_into`` (shift only), batched.

    The same OpenCV operations per image as the general path, hence the same
    pixels; the conversions run once per group of images, arguments are
    positional (the bindings parse keywords slowly), and the channel shift is
    a last pass over ``out``.
    """
    n, h, w, c = images.shape
    src4, dst4 = scratch.src4, scratch.dst4
    group = src4.shape[0]
    size, flags, replicate = (w, h), cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP, cv2.BORDER_REPLICATE
    to4, to3 = cv2.COLOR_RGB2RGBA, cv2.COLOR_RGBA2RGB
    pads, full = scratch.pads, scratch.full
    mats = matrices.copy()
    mats[:, :, 2] += np.asarray(pads, np.float64)[:, None]  # the matrices refer to the unpadded images
    for start in range(0, n, group):
        stop = min(start + group, n)
        k = stop - start
        cv2.cvtColor(images[start:stop].reshape(k * h, w, c), to4, src4[:k].reshape(k * h, w, 4))
        for s4, d4, mat, pad in zip(src4[:k], dst4[:k], mats[start:stop], pads[start:stop]):
            if pad:
                padded = full[: h + 2 * pad, : w + 2 * pad]  # scratch.padded(pad, h, w), inline
                cv2.copyMakeBorder(s4, pad, pad, pad, pad, replicate, padded)
                cv2.warpAffine(padded, mat, size, d4, flags, replicate)
            else:
                cv2.warpAffine(s4, mat, size, d4, flags, replicate)
        cv2.cvtColor(dst4[:k].reshape(k * h, w, 4), to3, out[start:stop].reshape(k * h, w, c))
    for flat, shift in zip(out.reshape(n, h, w * c), shifts.tolist()):
        if shift:
            shift_into(cv2, flat, shift)


def flip_into(cv2, src: np.ndarray, dst: np.ndarray, horizontal: bool, vertical: bool) -> None:
    """``src`` (H, W, C) uint8, mirrored left-right and/or upside down as asked, into ``dst`` of the same shape.

    ``cv2.flip`` where it applies (contiguous images of 1 to 4 channels): the same pixels as numpy's reversed-view
    copy, which runs about 100x slower on 224-px RGB rows (a strided copy of 3-byte pixels).
    """
    code = {(True, False): 1, (False, True): 0, (True, True): -1}.get((bool(horizontal), bool(vertical)))
    if code is None:
        np.copyto(dst, src)
    elif src.shape[-1] <= 4 and src.flags.c_contiguous and dst.flags.c_contiguous:
        cv2.flip(src, code, dst=dst.reshape(dst.shape[0], dst.shape[1], -1) if dst.ndim == 3 else dst)
    else:
        view = src[:, ::-1] if horizontal else src
        np.copyto(dst, view[::-1] if vertical else view)
