"""Augmentation: Keras ImageDataGenerator's transforms, per-sample RNG from (seed, epoch, row), featurewise stats.

Pure code (batch in, batch out); the worker pool that runs it lives beside it.
Importing this package imports neither OpenCV (loaded on first use) nor keras,
nor h5py: :func:`compute_feature_stats` (which reads the store) is loaded on
first use, so a worker process that unpickles an :class:`Augment` maps no HDF5
library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from h5stream.augment.transforms import PRESETS, Augment
from h5stream.augment.warp import FILL_MODES, apply_affine_transform

if TYPE_CHECKING:
    from h5stream.augment.stats import compute_feature_stats

__all__ = ["FILL_MODES", "PRESETS", "Augment", "apply_affine_transform", "compute_feature_stats"]


def __getattr__(name: str):
    if name != "compute_feature_stats":
        raise AttributeError(f"module 'h5stream.augment' has no attribute {name!r}")
    value = importlib.import_module("h5stream.augment.stats").compute_feature_stats
    globals()[name] = value
    return value
