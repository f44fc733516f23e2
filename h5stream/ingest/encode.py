"""Encoding decoded rows for an encoded store (``--encoding jpeg|auto``), in the decode workers.

:func:`encode_rows` turns decoded uint8 rows into JPEG files' bytes with OpenCV's libjpeg-turbo (``cv2.imencode``,
one core), as an :class:`~h5stream.store.encoded.EncodedRows`; what travels back from a decode worker is its bytes
and row ends (:func:`packed`), a fraction of the pixels.

``--encoding auto`` chooses per store, from a sample of its files decoded and encoded once (:func:`probe`, in a
decode worker) by :func:`choose`: JPEG where it makes the rows at least :data:`AUTO_MIN_RATIO` times smaller and
one core decodes them into at least :data:`AUTO_MIN_DECODE_BYTES_PER_S` bytes of pixels a second (CPU time, not
wall time), else raw.  Small images (under about 32 px a side) gain little from JPEG (its headers and 8x8 blocks
are most of the bytes), so they stay raw; photos of 64 px and more are 5-10x smaller as JPEG q90, and the larger
they are the more JPEG saves, as FFCV's ``smart`` mode stores large images as JPEG and small ones raw.  The
decode floor is a rate of pixel bytes, not of images: libjpeg-turbo decodes a few hundred MB of pixels a second
per core whatever the image size, so a floor in images a second (1,000 once) stored every photo of more than
about 500 px a side raw, the rows where JPEG saves the most.

Only the decode workers (or the ingest thread with ``--workers 0``) import OpenCV, through here.
"""

from __future__ import annotations

import time

import numpy as np

from h5stream.store import schema
from h5stream.store.encoded import EncodedRows

AUTO_MIN_RATIO = 3.0
"""``auto`` picks JPEG only where the sample's JPEG rows are at least this many times smaller than raw ones."""

AUTO_MIN_DECODE_BYTES_PER_S = 50e6
"""... and one core decodes them into at least this many bytes of pixels a second (the stream decodes every row it
reads, every epoch): 50 MB/s, a fraction of what libjpeg-turbo gives for baseline JPEGs of 64 px and more (several
hundred MB/s), so a few decoding cores keep up with a fast disk's raw rows."""

DEFAULT_QUALITY = 90
"""The JPEG quality of ``--encoding jpeg|auto`` without ``--quality``."""

AUTO_SAMPLE_FILES = 32
"""Files ``auto`` decodes, encodes and decodes again to choose."""

PROBE_PASSES = 3
"""Times the sample's JPEGs are decoded; the fastest pass is the rate (a few ms for 32 photos)."""

ENCODING_AUTO = "auto"
ENCODING_CHOICES = (schema.ENCODING_RAW, schema.ENCODING_JPEG, ENCODING_AUTO)
ENCODING_PROBE = "probe"
"""The encoding of a decode spec whose task measures (:func:`probe`) instead of returning rows."""


def encode_rows(images: np.ndarray, quality: int) -> EncodedRows:
    """``images`` (n, H, W, C) uint8, RGB (or grey), as JPEG at ``quality`` (1-100).  Channel order: what
    :func:`h5stream.store.jpeg.decode_into` gives back (RGB in, RGB out)."""
    from h5stream.ingest.decode import cv2

    params = [cv2.IMWRITE_JPEG_QUALITY, int(quality)]
    rows = []
    for image in images:
        bgr = image if image.shape[-1] == 1 else image[..., ::-1]  # OpenCV encodes BGR
        ok, buf = cv2.imencode(".jpg", np.ascontiguousarray(bgr), params)
        if not ok:
            raise ValueError(f"OpenCV could not encode a {image.shape} row as JPEG")
        rows.append(buf)
    return EncodedRows.from_bytes(rows)


def packed(rows: EncodedRows) -> tuple[np.ndarray, np.ndarray]:
    """What a worker sends back: the rows' bytes and their ends (two arrays, pickled whole)."""
    return rows.data, rows.ends


def unpacked(message) -> EncodedRows:
    """Inverse of :func:`packed`."""
    data, ends = message
    return EncodedRows(data, ends)


def probe(images: np.ndarray, quality: int) -> dict:
    """Measure ``images`` (a sample of decoded rows): their raw and JPEG bytes and one core's JPEG decode time,
    in CPU seconds of the decoding thread, so that a machine busy with other work makes the same choice (its wall
    time could be many times longer), and the fastest of :data:`PROBE_PASSES` passes over the sample, so that
    neither the first call's set-up nor the cache misses another process causes decide it.  Runs in a decode
    worker; returns plain numbers."""
    from h5stream.store.jpeg import decode_into

    rows = encode_rows(images, quality)
    out = np.empty(images.shape[1:], np.uint8)
    passes = []
    for _ in range(PROBE_PASSES):
        t0 = time.thread_time()  # this thread's CPU clock: time the thread was not running does not count
        for i in range(len(rows)):
            decode_into(rows.row(i), out)
        passes.append(time.thread_time() - t0)
    seconds = min(passes)
    return {"images": len(rows), "raw_bytes": int(images.nbytes), "jpeg_bytes": int(len(rows.data)),
            "decode_s": seconds}


def choose(stats: dict) -> str:
    """The encoding ``auto`` picks from :func:`probe`'s ``stats`` (pure): see the module docstring."""
    if not stats.get("images"):
        return schema.ENCODING_RAW
    ratio = stats["raw_bytes"] / max(1, stats["jpeg_bytes"])
    bytes_per_s = stats["raw_bytes"] / max(1e-9, stats["decode_s"])
    return schema.ENCODING_JPEG if ratio >= AUTO_MIN_RATIO and bytes_per_s >= AUTO_MIN_DECODE_BYTES_PER_S \
        else schema.ENCODING_RAW


def resolve_auto(target, root: str, pending, pool):
    """``target`` (an :class:`~h5stream.ingest.options.IngestTarget` whose spec says ``auto``) with the encoding
    :func:`choose` picks from the first :data:`AUTO_SAMPLE_FILES` files of ``pending`` (storage order: a sample
    of the whole source when shuffled), measured in a decode worker of ``pool`` (or this thread, with none).
    The ingest's thread."""
    from dataclasses import replace

    sample = [it.relpath for it in pending[:AUTO_SAMPLE_FILES]]
    stats: dict = {}
    if sample:
        probe_spec = replace(target.spec, encoding=ENCODING_PROBE)
        for measured, _reasons, _ in pool.imap(root, [sample], probe_spec):
            stats = measured if isinstance(measured, dict) else {}
    return replace(target, spec=replace(target.spec, encoding=choose(stats)))
