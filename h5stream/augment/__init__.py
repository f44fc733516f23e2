"""Augmentation: Keras ImageDataGenerator's transforms, per-sample RNG from (seed, epoch, row), featurewise stats.

Pure code (batch in, batch out); the worker pool that runs it lives beside it.
Importing this package imports neither OpenCV (loaded on first use) nor keras.
"""

from h5stream.augment.stats import compute_feature_stats
from h5stream.augment.transforms import PRESETS, Augment
from h5stream.augment.warp import FILL_MODES, apply_affine_transform

__all__ = ["FILL_MODES", "PRESETS", "Augment", "apply_affine_transform", "compute_feature_stats"]
