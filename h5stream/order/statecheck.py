"""A resumed state looked at before any of it is used: what ``open(resume=...)`` and ``Stream.restore`` take is
the dict ``Stream.state()`` returned, perhaps through JSON or a checkpoint, and a damaged or cut one is one
:class:`~h5stream.ConfigError` line naming the key, never a ``ValueError`` from deep inside nor a resume that
checks less than it should.  Pure functions over plain values.
"""

from __future__ import annotations

import numbers

from h5stream.errors import ConfigError

INT_KEYS = ("version", "epoch", "batch", "seed", "rows", "row_start", "row_stop", "batch_size", "rows_per_fill",
            "unit_rows", "piece_rows", "shard_index", "shard_count", "shuffle", "drop_remainder", "rows_consumed")
"""The keys of a state that hold one integer (``shuffle`` and ``drop_remainder`` as 0 or 1)."""

REQUIRED_SINCE_2 = ("seed", "rows", "row_start", "row_stop", "batch_size", "rows_per_fill", "unit_rows",
                    "shard_index", "shard_count", "shuffle", "drop_remainder", "stages", "rows_consumed")
"""Keys every state of version 2 and later has held (``piece_rows`` and ``subset`` came later, with defaults):
without one, the checks of a resume cannot all be made, so such a state is a cut copy."""

_FIX = "pass the dict Stream.state() returned, unchanged (saved as JSON, say)"


def check_values(state: dict) -> None:
    """ConfigError naming the first key of ``state`` whose value is not what ``Stream.state()`` puts there: an
    integer (an integral float, as some formats give back, is fine) for :data:`INT_KEYS`, a shard that exists."""
    for key in INT_KEYS:
        if key in state and not _integral(state[key]):
            raise ConfigError(f"cannot resume: the state's {key!r} is {_show(state[key])}, not an integer; {_FIX}")
    if "store" in state and not isinstance(state["store"], str):
        raise ConfigError(f"cannot resume: the state's 'store' is {_show(state['store'])}, not a string; {_FIX}")
    if "shard_count" in state and int(state["shard_count"]) < 1:
        raise ConfigError(f"cannot resume: the state's shard_count is {int(state['shard_count'])}, not >= 1; {_FIX}")
    if {"shard_index", "shard_count"} <= state.keys() and \
            not 0 <= int(state["shard_index"]) < int(state["shard_count"]):
        raise ConfigError(f"cannot resume: the state's shard_index {int(state['shard_index'])} is not a shard of "
                          f"{int(state['shard_count'])}; {_FIX}")


def check_complete(state: dict) -> None:
    """ConfigError naming the keys a state of version 2 or later lacks (see :data:`REQUIRED_SINCE_2`)."""
    if int(state["version"]) < 2:
        return
    missing = [key for key in REQUIRED_SINCE_2 if key not in state]
    if missing:
        raise ConfigError(f"cannot resume: the state (version {int(state['version'])}) has no "
                          f"{', '.join(map(repr, missing))}; it was cut or edited; {_FIX}")


def _integral(value) -> bool:
    if isinstance(value, numbers.Integral):
        return True
    return isinstance(value, numbers.Real) and float(value).is_integer()


def _show(value) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def check_given(state: dict, given: dict) -> None:
    """ConfigError for the first option the caller passed that contradicts ``state``.

    ``given``: ``{option as passed (say "seed=5" or "read_unit='1MiB'"): (state key, the value it gives)}`` for
    each order-shaping option the caller named; one a state does not record (an older state) is not checked.
    Resuming continues the state's order: an option that would change it is refused, never silently overridden
    by the state (nor the state by it)."""
    for option, (key, value) in given.items():
        if key in state and int(state[key]) != int(value):
            name = option.split("=", 1)[0]
            shown = option if option.endswith(f"={value}") else f"{option} (which gives {key}={value})"
            raise ConfigError(f"cannot resume: {shown} was given, but the state was saved with {key}={state[key]}; "
                              f"drop {name}= (resume= continues the state's order) or pass the value the state "
                              "was saved with")
