"""Augment's parameters in the forms Keras' ``ImageDataGenerator`` takes them: checked at construction, one
:class:`~h5stream.errors.ConfigError` naming the parameter and what it takes, and the shift drawn per sample as
Keras' ``get_random_transform`` does.  Pure functions.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from h5stream.errors import ConfigError

#: The output dtypes Augment produces (``dtype=``).
OUTPUT_DTYPES = ("uint8", "float16", "float32", "float64")


def number(name, value, low=0.0, high=math.inf):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ConfigError(f"Augment: {name}={value!r} must be a finite number")
    if not low <= value <= high:
        bounds = f">= {low:g}" if high == math.inf else f"in [{low:g}, {high:g}]"
        raise ConfigError(f"Augment: {name}={value!r} must be {bounds}")
    return value


def flag(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"Augment: {name}={value!r} must be True or False")
    return bool(value)


def shift_spec(name, value):
    """Keras' three forms: int n (whole pixels in (-n, n)), float (fraction if < 1, else pixels), list (choices)."""
    if isinstance(value, (list, tuple, np.ndarray)):
        values = np.asarray(value)
        if values.ndim != 1 or values.size == 0 or not np.issubdtype(values.dtype, np.number):
            raise ConfigError(f"Augment: {name}={value!r} must be a number or a non-empty 1-D list of numbers")
        if not np.all(np.isfinite(values)):
            raise ConfigError(f"Augment: {name}={value!r} must contain finite numbers")
        return tuple(float(v) for v in values)
    value = number(name, value)
    if isinstance(value, numbers.Integral):
        return int(value)
    return float(value)


def zoom_spec(value):
    if isinstance(value, (list, tuple, np.ndarray)):
        if len(value) != 2:
            raise ConfigError(f"Augment: zoom_range={value!r} must be a float or a pair [lower, upper]")
        lo, hi = (float(number("zoom_range", v)) for v in value)
    else:
        z = float(number("zoom_range", value))
        lo, hi = 1.0 - z, 1.0 + z
    if not 0 < lo <= hi:
        raise ConfigError(
            f"Augment: zoom_range={value!r} gives zoom factors [{lo:g}, {hi:g}]; they must satisfy 0 < lower <= upper"
        )
    return (lo, hi)


def brightness_spec(value):
    if value is None:
        return None
    if not isinstance(value, (list, tuple, np.ndarray)) or len(value) != 2:
        raise ConfigError(f"Augment: brightness_range={value!r} must be None or a pair [lower, upper], e.g. [0.8, 1.2]")
    lo, hi = (float(number("brightness_range", v)) for v in value)
    if lo > hi:
        raise ConfigError(f"Augment: brightness_range={value!r} must have lower <= upper")
    return (lo, hi)


def draw_shift(spec, draws, value_stream, sign_stream, size):
    """Shift in pixels per sample, drawn as Keras' get_random_transform does (``draws``: :class:`rng.Draws`)."""
    if isinstance(spec, int):
        sign = np.where(draws.coin(sign_stream), 1.0, -1.0)
        return draws.integers(value_stream, spec).astype(np.float64) * sign
    if isinstance(spec, tuple):
        sign = np.where(draws.coin(sign_stream), 1.0, -1.0)
        values = np.asarray(spec, dtype=np.float64)
        shift = values[draws.integers(value_stream, len(spec))] * sign
        return shift * size if values.max() < 1 else shift
    shift = draws.uniform(value_stream, -spec, spec)
    return shift * size if spec < 1 else shift


def dtype_spec(value):
    """``dtype=``: None, or one of :data:`OUTPUT_DTYPES` as a numpy dtype."""
    if value is None:
        return None
    try:
        dtype = np.dtype(value)
    except TypeError as exc:
        raise ConfigError(f"Augment: dtype={value!r} is not a dtype; use one of {', '.join(OUTPUT_DTYPES)}") from exc
    if dtype.name not in OUTPUT_DTYPES:
        raise ConfigError(f"Augment: dtype={dtype} is not supported; use one of {', '.join(OUTPUT_DTYPES)}")
    return dtype
