"""Featurewise statistics of a store's rows: per-channel mean and std in one streaming pass, never written to it.

:func:`compute_feature_stats` reads a range of committed rows (by default all
of them; :func:`h5stream.open` passes the training rows) block by block with
h5py (memory: one block of ``block_rows`` rows plus 256 counters per channel)
and builds an exact per-channel histogram of the uint8 pixels, from which mean
and population std (numpy's ``ddof=0``, what Keras' ``ImageDataGenerator.fit``
uses) follow without rounding drift.

Reading never changes the store: the statistics are kept in this process's
memory (:data:`CACHE_ENTRIES` results, thread-safe), keyed by the file's
identity (path, device, inode, size, modification time; for a URL, its address
and size) and the row range, so opening the training and the validation
stream of one store in one process reads the training rows once, and any
change to the file (appended rows, a rewrite) computes afresh.  A set of parts
(:class:`~h5stream.store.partset.PartSetMeta`) is one store of the parts' rows
laid end to end: :func:`feature_stats` adds up the histograms of each part's
rows in the range, so the set gets the statistics one store of the same rows
gives (exact counts: equal up to the float rounding of the last division).
Stores written
by earlier versions may carry ``feature_mean`` / ``feature_std`` /
``feature_stats_rows`` attributes; they are ignored.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

import numpy as np

from h5stream.errors import ConfigError
from h5stream.store import schema
from h5stream.store.access import open_h5_readonly
from h5stream.store.meta import read_meta

CACHE_ENTRIES = 16
"""Results the in-memory cache keeps (the least recently used goes first)."""

_cache: OrderedDict[tuple, tuple[np.ndarray, np.ndarray]] = OrderedDict()
_cache_lock = threading.Lock()


def histogram_stats(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and population std per channel from ``counts[C, 256]`` pixel-value histograms."""
    counts = np.asarray(counts, dtype=np.float64)
    levels = np.arange(counts.shape[1], dtype=np.float64)
    total = counts.sum(axis=1)
    if np.any(total == 0):
        raise ValueError("histogram_stats: a channel has no pixels")
    mean = counts @ levels / total
    var = (counts * (levels[None, :] - mean[:, None]) ** 2).sum(axis=1) / total
    return mean, np.sqrt(var)


def _identity(meta) -> tuple:
    """What tells this version of the store from any other: a changed or replaced file gives another key."""
    if meta.remote is not None:
        return (meta.path, meta.file_bytes)
    st = os.stat(meta.path)
    return (os.path.realpath(meta.path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def compute_feature_stats(path, block_rows: int | None = None, *, rows: tuple[int, int] | None = None,
                          use_cache: bool = True, remote=None) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel ``(mean[C], std[C])`` of the store's rows ``[start, stop)``, in pixel units (0..255).

    ``path``: a store, or a set of parts as :func:`h5stream.open` takes one (a list, a glob, a manifest: the
    statistics of its rows laid end to end).  ``rows``: ``(start, stop)`` within the committed rows (default:
    all of them).  One sequential pass
    (``block_rows`` rows at a time, default the store's block) unless this process already computed the same
    range of the same, unchanged file (``use_cache``).  The file is opened read-only and never written.
    Raises :class:`StoreNotFoundError` / :class:`StoreFormatError` as :func:`read_meta` does, and
    :class:`ConfigError` for an empty or out-of-range ``rows``.  A URL is read with the ``remote`` options.
    Safe to call from any thread.
    """
    from h5stream.store.partset import join_parts, part_paths

    paths = part_paths(path)  # a set of parts (a list, a glob, a manifest), as h5stream.open takes one
    if paths is None:
        meta = read_meta(os.fspath(path), remote=remote)
    else:
        meta = join_parts([read_meta(p, remote=remote) for p in paths], paths[0] if len(paths) == 1 else
                          f"{paths[0]} (+{len(paths) - 1} parts)")
    return feature_stats(meta, block_rows, rows=rows, use_cache=use_cache)


def feature_stats(meta, block_rows: int | None = None, *, rows: tuple[int, int] | None = None,
                  use_cache: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """:func:`compute_feature_stats` of an open store's ``meta``: a :class:`~h5stream.store.meta.StoreMeta`, or
    a set of parts (``meta.parts``, their first logical rows ``meta.starts``), whose logical rows ``rows``
    are read part by part (each part's own ``remote`` options) into one histogram.  Any thread."""
    start, stop = (0, meta.rows) if rows is None else (int(rows[0]), int(rows[1]))
    if not 0 <= start < stop <= meta.rows:
        what = "no committed rows" if meta.rows == 0 else f"rows {start}..{stop} of its {meta.rows} committed rows"
        raise ConfigError(f"{meta.path}: featurewise statistics need rows to compute them from, and this is "
                          f"{what}; ingest images first, or pass a non-empty range of committed rows")
    if block_rows is not None and int(block_rows) < 1:
        raise ConfigError(f"compute_feature_stats: block_rows={block_rows} must be >= 1")
    pieces = _pieces(meta, start, stop)
    key = tuple((*_identity(part), a, b) for part, a, b in pieces)
    if use_cache:
        with _cache_lock:
            hit = _cache.get(key)
            if hit is not None:
                _cache.move_to_end(key)
                return hit[0].copy(), hit[1].copy()
    counts = sum(_histogram_pass(part, a, b, part.block_rows if block_rows is None else int(block_rows))
                 for part, a, b in pieces)
    mean, std = histogram_stats(counts)
    with _cache_lock:
        _cache[key] = (mean.copy(), std.copy())
        while len(_cache) > CACHE_ENTRIES:
            _cache.popitem(last=False)
    return mean, std


def _pieces(meta, start: int, stop: int) -> list[tuple]:
    """``(store meta, first row, stop row)`` of each store holding logical rows ``[start, stop)`` of ``meta``:
    ``meta`` itself, or the parts of a set the range overlaps (rows made the part's own).  Pure."""
    parts = getattr(meta, "parts", ())
    if not parts:
        return [(meta, start, stop)]
    out = []
    for part, first in zip(parts, meta.starts):
        a, b = max(start, first), min(stop, first + part.rows)
        if a < b:
            out.append((part, a - first, b - first))
    return out


def _histogram_pass(meta, start: int, stop: int, step: int) -> np.ndarray:
    """``counts[C, 256]``: each channel's pixel-value histogram of one store's rows ``[start, stop)``."""
    h, w, channels = meta.image_shape
    counts = np.zeros((channels, 256), dtype=np.int64)
    buf = np.empty((min(step, stop - start), h, w, channels), dtype=np.uint8)
    with open_h5_readonly(meta.path, remote=meta.remote) as f:
        images = f[schema.IMAGES] if not meta.encoded else None
        for a in range(start, stop, step):
            b = min(stop, a + step)
            block = buf[: b - a]
            if images is None:  # an encoded store's rows, decoded (see store/encoded.py)
                from h5stream.store.encoded import EncodedArray
                from h5stream.store.jpeg import decode_rows

                decode_rows(EncodedArray.of(f).read(a, b), a, block, meta.path)
            else:
                images.read_direct(block, np.s_[a:b], np.s_[0 : b - a])
            pixels = block.reshape(-1, channels)
            for ch in range(channels):
                counts[ch] += np.bincount(pixels[:, ch], minlength=256)
    return counts
