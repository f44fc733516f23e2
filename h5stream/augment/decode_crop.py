"""An encoded store's rows decoded at the scale their crop needs, cropped and resized, then augmented.

With ``Augment(output_size=...)`` on an encoded (JPEG) store, each row's crop is known before its pixels are: the
box comes from ``(seed, epoch, row_id)`` and the stored height and width alone
(:func:`~h5stream.augment.crop.random_resized_boxes`, :func:`~h5stream.augment.crop.center_geometry`).  So a row
is decoded at the smallest of libjpeg's DCT scales (1/8, 1/4, 1/2) that still leaves its box at least
``output_size`` (:func:`~h5stream.augment.crop.reduced_scale`; the whole resized image, for ``crop="center"``),
as FFCV's ``RandomResizedCropRGBImageDecoder`` does: a fraction of the decoding work where the crop is much smaller
than the stored image.  The box in the image decoded at ``1/d`` is the box's edges divided by ``d``, each rounded
half up (``top' = round(top / d)``, ``bottom' = round((top + h) / d)``): never smaller than ``output_size``, so
the resize still only shrinks.  At ``d = 1`` the pixels are those of decoding in full then cropping
(:func:`~h5stream.augment.crop.crop_batch`); at ``d > 1`` they differ by the DCT scaling's own averaging and by
the box's edges moving up to ``d / 2`` stored pixels: two to six levels on average on photos, but up to most of an
edge's contrast (130 levels and more) on a pixel where a sharp edge lands elsewhere (docs/design.md has the
figures).  Rows the reader decoded already (``length`` -1:
:mod:`h5stream.read.encoded`) are cropped from their pixels at full size.

A row's output depends only on its bytes and ``(seed, epoch, row_id)``: the same batches whichever process decodes
them (an augmenting worker, or the consumer's thread with ``workers=0``).  Pure functions, any thread or process.
"""

from __future__ import annotations

import numpy as np

from h5stream.augment.crop import (_resize_into, center_geometry, crop_batch, in_groups, random_resized_boxes,
                                   reduced_scale)
from h5stream.errors import ImageDecodeError


def crops_while_decoding(transform) -> bool:
    """Whether ``transform`` is an :class:`~h5stream.augment.transforms.Augment` with an ``output_size``: then an
    encoded store's rows go through :func:`decode_augment` instead of a full decode and the transform."""
    from h5stream.augment.transforms import Augment

    return isinstance(transform, Augment) and transform.output_size is not None


def box_at_scale(top: int, left: int, h: int, w: int, d: int, height: int, width: int) -> tuple[int, int, int, int]:
    """The box ``(top, left, h, w)`` of a ``height`` x ``width`` image in that image decoded at ``1/d``: each edge
    divided by ``d`` and rounded half up, within the reduced image (``ceil(height / d)`` x ``ceil(width / d)``),
    at least one pixel.  Pure."""
    rh, rw = -(-height // d), -(-width // d)
    t0 = min(rh - 1, (2 * top + d) // (2 * d))
    t1 = max(t0 + 1, min(rh, (2 * (top + h) + d) // (2 * d)))
    l0 = min(rw - 1, (2 * left + d) // (2 * d))
    l1 = max(l0 + 1, min(rw, (2 * (left + w) + d) // (2 * d)))
    return t0, l0, t1 - t0, l1 - l0


def decode_crop_batch(cv2, images: np.ndarray, lengths, row_ids, out: np.ndarray, crop: str, seed: int, epoch: int,
                      scale, ratio, resize, path: str | None = None) -> None:
    """Rows of an encoded batch as the reader left them (``images`` (n, H, W, C) uint8, row ``k`` beginning with
    ``lengths[k]`` bytes of JPEG, or pixels where -1) decoded at their crop's reduced scale, cropped and resized
    into uint8 ``out`` (n, h, w, C).  ``images`` is not modified.  An :class:`ImageDecodeError` names the row."""
    from h5stream.store.jpeg import decode_into, scaled_shape

    n, height, width, channels = images.shape
    oh, ow = out.shape[1:3]
    rows = np.asarray(row_ids, dtype=np.int64).reshape(-1)
    lengths = np.asarray(lengths).tolist()
    if crop == "random_resized":
        boxes = random_resized_boxes(seed, epoch, rows, height, width, scale, ratio).tolist()
    else:
        (rh, rw), (ctop, cleft, ch, cw) = center_geometry(height, width, (oh, ow), resize)
        staging = np.empty((rh, rw, channels), np.uint8)
        center_d = reduced_scale(height, width, (rh, rw))
    backing = np.empty(height * width * channels, np.uint8)  # one row: every scale's decode is a view of it
    for k in range(n):
        if lengths[k] < 0:  # decoded by the reader already: cropped from its pixels
            crop_batch(cv2, images[k:k + 1], out[k:k + 1], crop, seed, epoch, rows[k:k + 1], scale, ratio, resize)
            continue
        if crop == "random_resized":
            top, left, h, w = boxes[k]
            d = reduced_scale(h, w, (oh, ow))
        else:
            d = center_d
        shape = scaled_shape((height, width, channels), d)
        buf = backing[:shape[0] * shape[1] * shape[2]].reshape(shape)
        try:
            decode_into(images[k].reshape(-1)[:lengths[k]], buf, d, (height, width))
        except ValueError as exc:
            where = f"{path}: " if path else ""
            raise ImageDecodeError(
                f"{where}row {int(rows[k])}: its stored JPEG does not decode to a {width}x{height} image ({exc}); "
                "the row is damaged: `h5stream verify` checks the file, and if its checksums match, the bytes were "
                "damaged before they were stored: re-ingest it") from None
        if crop == "random_resized":
            t, lft, bh, bw = box_at_scale(top, left, h, w, d, height, width)
            _resize_into(cv2, buf[t:t + bh, lft:lft + bw], out[k])
        else:
            _resize_into(cv2, buf, staging)
            np.copyto(out[k], staging[ctop:ctop + ch, cleft:cleft + cw])


def decode_augment(augment, images: np.ndarray, lengths, row_ids, seed: int, epoch: int, out: np.ndarray | None = None,
                   path: str | None = None) -> np.ndarray:
    """``augment(decoded images, ...)`` for an ``augment`` with an ``output_size`` (:func:`crops_while_decoding`),
    each row decoded at its crop's scale (:func:`decode_crop_batch`), a few rows at a time
    (:data:`~h5stream.augment.crop.SCRATCH_BYTES` of cropped rows); into ``out`` (checked as ``Augment`` checks
    it), returned.  OpenCV runs on one thread meanwhile."""
    images, rows, out = augment.checked_call(images, row_ids, out)
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)

    def make_rows(cv2, start, stop, part):
        decode_crop_batch(cv2, images[start:stop], lengths[start:stop], rows[start:stop], part, augment.crop,
                          seed, epoch, augment.scale, augment.ratio, augment.resize, path)

    in_groups(images.shape[0], out, make_rows, augment._augment_into, seed, epoch, rows)
    return out
