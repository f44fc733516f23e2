"""Decoding one encoded row: a JPEG file's bytes into a uint8 image, straight into the caller's buffer.

libjpeg-turbo through ``simplejpeg`` (decoding into a buffer the caller owns: 53 us for a 128 px q90 photo against
78 us for OpenCV's ``imdecode`` plus the copy, on one loaded core), one call per row, the GIL released while it
decodes.  ``scale`` 2, 4 or 8 decodes at a reduced scale (libjpeg's DCT scaling: the image comes out about that
many times smaller on each side, for a fraction of the work), for a crop much smaller than the stored image.

Pure functions: any thread or process may call them (an augmenting worker, the consumer's thread).
"""

from __future__ import annotations

import numpy as np

from h5stream.errors import ImageDecodeError

SCALES = (1, 2, 4, 8)


def scaled_shape(shape: tuple[int, int, int], scale: int = 1) -> tuple[int, int, int]:
    """The shape a row of ``shape`` (H, W, C) decodes to at ``scale`` (libjpeg rounds up)."""
    h, w, c = shape
    return -(-h // scale), -(-w // scale), c


def decode_into(data, out: np.ndarray, scale: int = 1, size: tuple[int, int] | None = None) -> np.ndarray:
    """Decode the JPEG bytes ``data`` into ``out`` (uint8, C-contiguous, (H, W, 3) RGB or (H, W, 1) grey, at
    ``scale`` the image's shape divided by ``scale``, rounded up); returns ``out``.  ``size``: the image's own
    (H, W), needed at ``scale`` > 1.  Raises ValueError (with libjpeg's reason) where the bytes do not decode or
    are an image of another size."""
    import simplejpeg

    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale}")
    channels = out.shape[-1]
    colorspace = "GRAY" if channels == 1 else "RGB"
    buf = data if isinstance(data, (bytes, bytearray, memoryview)) else memoryview(np.ascontiguousarray(data))
    if scale != 1:
        # libjpeg scales an image of another size to out's shape just as well (16x16 at 1/1 where 32x32 at 1/2
        # is meant): its header says which it is (1.5 us, against 27-37 us for the reduced decode of 128 px).
        if size is None:
            raise TypeError("decode_into at a reduced scale needs size=(height, width) of the image")
        height, width = simplejpeg.decode_jpeg_header(buf)[:2]
        if (height, width) != tuple(size):
            raise ValueError(f"is a {width}x{height} image, not {size[1]}x{size[0]}")
    # At a reduced scale libjpeg-turbo picks the smallest of its scales (n/8) that keeps these sizes: 1/scale.
    at_least = {} if scale == 1 else {"min_height": out.shape[0], "min_width": out.shape[1]}
    got = simplejpeg.decode_jpeg(buf, colorspace, buffer=out, **at_least)
    if got.shape[:2] != out.shape[:2]:
        raise ValueError(f"decodes to {got.shape[1]}x{got.shape[0]}, not {out.shape[1]}x{out.shape[0]}")
    return out


def decode(data, shape: tuple[int, int, int], scale: int = 1) -> np.ndarray:
    """:func:`decode_into` a new array of ``shape`` (H, W, C) at ``scale``."""
    out = np.empty(scaled_shape(shape, scale), np.uint8)
    return decode_into(data, out, scale, shape[:2])


def decode_rows(rows, first_row: int, out: np.ndarray, path: str, keep=None) -> None:
    """Decode the :class:`~h5stream.store.encoded.EncodedRows` ``rows`` into ``out`` (one image per row, in
    order); ``first_row`` (the store row of ``rows[0]``) and ``path`` name a row that does not decode in the
    :class:`~h5stream.errors.ImageDecodeError`.  ``keep``: which rows to decode (the others are skipped), all
    when None."""
    for i in range(len(rows)):
        if keep is not None and not keep[i]:
            continue
        try:
            decode_into(rows.row(i), out[i])
        except ValueError as exc:
            raise ImageDecodeError(
                f"{path}: row {first_row + i}: its stored JPEG does not decode to a {out.shape[2]}x{out.shape[1]} "
                f"image ({exc}); the row is damaged: `h5stream verify {path}` checks the file, re-ingest it if "
                "the checksums match (the file was damaged before it was stored)") from None


def decode_slot_rows(images: np.ndarray, lengths: np.ndarray, row_ids: np.ndarray, out: np.ndarray | None = None,
                     path: str | None = None) -> np.ndarray:
    """Decode a batch of an encoded store as the reader left it (see :mod:`h5stream.read.encoded`): row ``k`` of
    ``images`` begins with ``lengths[k]`` bytes of JPEG, or holds pixels already where ``lengths[k]`` is -1.
    Into ``out`` (another array of the same shape), or in place when ``out`` is None (each row's bytes are copied
    out first: a few KiB); returns the decoded array.  An :class:`~h5stream.errors.ImageDecodeError` names the
    row (``row_ids[k]``) and ``path`` (when given) of a row that does not decode.  Any thread or process."""
    target = images if out is None else out
    for k, length in enumerate(np.asarray(lengths).tolist()):
        if length < 0:
            if out is not None:
                out[k] = images[k]
            continue
        data = images[k].reshape(-1)[:length]
        if out is None:
            data = data.copy()
        try:
            decode_into(data, target[k])
        except ValueError as exc:
            where = f"{path}: " if path else ""
            raise ImageDecodeError(
                f"{where}row {int(row_ids[k])}: its stored JPEG does not decode to a {images.shape[2]}x"
                f"{images.shape[1]} image ({exc}); the row is damaged: `h5stream verify` checks the file, and if its "
                "checksums match, the bytes were damaged before they were stored: re-ingest it") from None
    return target
