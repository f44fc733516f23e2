"""Counter-based per-sample randomness: every draw is a pure function of its keys.

A draw for one sample is ``splitmix64`` applied in a chain to ``(seed, epoch,
row_id, stream)``, where ``stream`` names the parameter being drawn (rotation,
shift, flip...).  Nothing is stateful, so the value a row gets does not depend
on which batch it sits in, the batch's order, which worker computed it, or
when: the property that makes workers=0, 1 and N produce identical batches.

All functions are vectorised over ``row_ids`` and thread-safe (they only read
their arguments).  The hash is splitmix64 (Steele, Lea & Flood 2014), whose
output passes BigCrush when fed a counter; chaining it over the keys gives a
different, decorrelated stream for every (seed, epoch, row, parameter).
"""

from __future__ import annotations

import functools

import numpy as np

_MASK64 = (1 << 64) - 1
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)
_TO_UNIT = 2.0**-53

# One stream per random parameter; the numbers are part of the reproducibility
# contract (changing one changes every augmented batch for that parameter).
STREAM_THETA = 1
STREAM_SHIFT_X = 2
STREAM_SHIFT_Y = 3
STREAM_SHEAR = 4
STREAM_ZOOM_X = 5
STREAM_ZOOM_Y = 6
STREAM_FLIP_H = 7
STREAM_FLIP_V = 8
STREAM_CHANNEL_SHIFT = 9
STREAM_BRIGHTNESS = 10
STREAM_SHIFT_X_SIGN = 11
STREAM_SHIFT_Y_SIGN = 12


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser of ``x + golden gamma``, elementwise on a uint64 array (wraps mod 2**64)."""
    z = x + _GAMMA
    z = (z ^ (z >> _S30)) * _MUL1
    z = (z ^ (z >> _S27)) * _MUL2
    return z ^ (z >> _S31)


def _u64(value: int) -> np.ndarray:
    # Python ints of any sign map onto uint64 by wrapping, so seed=-1 is a valid seed.
    return np.array([int(value) & _MASK64], dtype=np.uint64)


def sample_keys(seed: int, epoch: int, row_ids) -> np.ndarray:
    """uint64[n] keys, one per row: a hash of ``(seed, epoch, row_id)``.

    ``row_ids`` are the rows' global indices in the store (not positions in a
    batch), so a row keeps its key wherever it appears.
    """
    rows = np.asarray(row_ids, dtype=np.int64).reshape(-1).view(np.uint64)
    return splitmix64(_head(int(seed), int(epoch)) ^ rows)


@functools.lru_cache(maxsize=256)
def _head(seed: int, epoch: int) -> np.ndarray:
    """The (seed, epoch) part of every key: the same for a whole epoch's batches, so cached."""
    head = splitmix64(splitmix64(_u64(seed)) ^ _u64(epoch))
    head.flags.writeable = False
    return head


def units(keys: np.ndarray, streams) -> np.ndarray:
    """float64 ``(len(streams), n)`` on ``[0, 1)``: row ``i`` is ``uniform(keys, streams[i])``, in one pass.

    The same bits as calling :func:`uniform` per stream (one vectorised hash
    instead of one per parameter: the per-batch cost of drawing).
    """
    bits = splitmix64(keys[None, :] ^ _salts(tuple(streams))[:, None])
    return (bits >> _S11).astype(np.float64) * _TO_UNIT


@functools.lru_cache(maxsize=64)
def _salts(streams: tuple) -> np.ndarray:
    """uint64 salt per stream (constant; cached, as every batch asks for the same streams)."""
    salts = splitmix64(np.array([int(s) & _MASK64 for s in streams], dtype=np.uint64))
    salts.flags.writeable = False
    return salts


def uniform(keys: np.ndarray, stream: int, low=0.0, high=1.0) -> np.ndarray:
    """float64[n] uniform on ``[low, high)``: one draw per key for parameter ``stream``."""
    return Draws(keys, (stream,)).uniform(stream, low, high)


def integers(keys: np.ndarray, stream: int, count: int) -> np.ndarray:
    """int64[n] uniform on ``{0, ..., count - 1}`` (``count`` >= 1)."""
    return Draws(keys, (stream,)).integers(stream, count)


def coin(keys: np.ndarray, stream: int) -> np.ndarray:
    """bool[n], each True with probability 1/2 (Keras: ``random() < 0.5``)."""
    return Draws(keys, (stream,)).coin(stream)


class Draws:
    """The unit draws of several parameter streams for the same keys, hashed together (:func:`units`).

    ``uniform`` / ``integers`` / ``coin`` give exactly what the module
    functions of those names give for the same keys and stream.
    """

    def __init__(self, keys: np.ndarray, streams):
        self._units = dict(zip(streams, units(keys, streams)))

    def uniform(self, stream: int, low=0.0, high=1.0) -> np.ndarray:
        return low + (high - low) * self._units[stream]

    def integers(self, stream: int, count: int) -> np.ndarray:
        picks = np.floor(self._units[stream] * count).astype(np.int64)
        # floor(u * count) < count for u < 1, but guard the float edge anyway.
        return np.minimum(picks, count - 1)

    def coin(self, stream: int) -> np.ndarray:
        return self._units[stream] < 0.5


ALL_STREAMS = (STREAM_THETA, STREAM_SHIFT_X, STREAM_SHIFT_Y, STREAM_SHEAR, STREAM_ZOOM_X, STREAM_ZOOM_Y,
               STREAM_FLIP_H, STREAM_FLIP_V, STREAM_CHANNEL_SHIFT, STREAM_BRIGHTNESS, STREAM_SHIFT_X_SIGN,
               STREAM_SHIFT_Y_SIGN)
