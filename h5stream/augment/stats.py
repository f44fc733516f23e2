"""Featurewise statistics of a store: per-channel mean and std in one streaming pass, cached in the file.

:func:`compute_feature_stats` reads the committed rows block by block with
h5py (memory: one block of ``block_rows`` rows plus 256 counters per channel)
and builds an exact per-channel histogram of the uint8 pixels, from which mean
and population std (numpy's ``ddof=0``, what Keras' ``fit`` uses) follow
without rounding drift.

The result is cached as root attributes of the file::

    feature_mean        str  JSON list of C floats (raw pixel units, 0..255)
    feature_std         str  JSON list of C floats
    feature_stats_rows  int  committed row count the statistics cover

and reused while ``committed_rows`` is unchanged; appending rows makes the
next call recompute.  Writing the cache opens the file with h5py in "a"
(read/write) mode for a moment, so call this before any reader holds the file
open; if the file cannot be opened for writing (read-only file or filesystem,
HDF5 lock held by another process) the statistics are still returned, just
not cached.
"""

from __future__ import annotations

import json
import os

import h5py
import numpy as np

from h5stream.store import schema
from h5stream.store.access import open_h5_readonly
from h5stream.store.meta import read_meta

ATTR_FEATURE_MEAN = "feature_mean"
ATTR_FEATURE_STD = "feature_std"
ATTR_FEATURE_ROWS = "feature_stats_rows"


def _cached(path: str, rows: int, channels: int, remote=None):
    with open_h5_readonly(path, remote=remote) as f:
        attrs = f.attrs
        if ATTR_FEATURE_ROWS not in attrs or int(attrs[ATTR_FEATURE_ROWS]) != rows:
            return None
        try:
            mean = json.loads(attrs[ATTR_FEATURE_MEAN])
            std = json.loads(attrs[ATTR_FEATURE_STD])
        except (KeyError, TypeError, ValueError):
            return None  # damaged cache: recompute
        if len(mean) != channels or len(std) != channels:
            return None
        return np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64)


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


def compute_feature_stats(path, block_rows: int | None = None, *, use_cache: bool = True,
                          remote=None) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel ``(mean[C], std[C])`` of every committed row of the store at ``path``, in pixel units.

    One sequential pass (``block_rows`` rows at a time, default the store's
    chunk length) unless the file's cache covers the current row count.
    Raises :class:`StoreNotFoundError` / :class:`StoreFormatError` as
    :func:`read_meta` does, and ``ValueError`` for a store with no rows.  A URL is read with the ``remote``
    options, and its statistics are not cached (the object is not written to).
    """
    path = os.fspath(path)
    meta = read_meta(path, remote=remote)
    rows = meta.rows
    h, w, channels = meta.image_shape
    if rows == 0:
        from h5stream.errors import ConfigError

        raise ConfigError(f"{path}: no committed rows, so featurewise statistics are undefined; ingest images first")
    if use_cache:
        hit = _cached(path, rows, channels, meta.remote)
        if hit is not None:
            return hit
    step = int(block_rows or meta.block_rows)
    if step < 1:
        from h5stream.errors import ConfigError

        raise ConfigError(f"compute_feature_stats: block_rows={block_rows} must be >= 1")
    counts = np.zeros((channels, 256), dtype=np.int64)
    buf = np.empty((step, h, w, channels), dtype=np.uint8)
    with open_h5_readonly(path, remote=meta.remote) as f:
        images = f[schema.IMAGES]
        for start in range(0, rows, step):
            stop = min(rows, start + step)
            block = buf[: stop - start]
            images.read_direct(block, np.s_[start:stop], np.s_[0 : stop - start])
            pixels = block.reshape(-1, channels)
            for ch in range(channels):
                counts[ch] += np.bincount(pixels[:, ch], minlength=256)
    mean, std = histogram_stats(counts)
    if meta.remote is None:
        _store_cache(path, rows, mean, std)
    return mean, std


def _store_cache(path: str, rows: int, mean: np.ndarray, std: np.ndarray) -> None:
    try:
        with h5py.File(path, "a") as f:
            f.attrs[ATTR_FEATURE_MEAN] = json.dumps([float(v) for v in mean])
            f.attrs[ATTR_FEATURE_STD] = json.dumps([float(v) for v in std])
            f.attrs[ATTR_FEATURE_ROWS] = int(rows)
    except OSError:
        # Read-only file or an HDF5 lock held elsewhere: the values are right, only uncached.
        pass
