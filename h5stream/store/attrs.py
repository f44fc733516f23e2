"""Root attributes of a store read as plain values, each checked: a wrong type or range is one
:class:`~h5stream.errors.StoreFormatError` line naming the attribute (pure apart from reading ``attrs``)."""

from __future__ import annotations

import json

import numpy as np

from h5stream.errors import StoreFormatError

_INT64_MAX = (1 << 63) - 1


def attr_error(path: str, name: str, value, want: str) -> StoreFormatError:
    """The one-line error for root attribute ``name`` holding ``value`` where ``want`` was expected."""
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return StoreFormatError(
        f"{path}: attribute {name!r} is {shown} but must be {want}; the file is damaged or was not written by "
        "h5stream (re-ingest it, or fix the attribute with h5py)"
    )


def scalar_attr(attrs, name, default=None, *, path: str = "the store"):
    """Root attribute ``name`` as a plain Python scalar (bytes decoded as UTF-8), or ``default`` when absent.

    A value that is not one scalar (an array, a compound, text that is not UTF-8) is a :class:`StoreFormatError`.
    """
    if name not in attrs:
        return default
    try:
        value = attrs[name]
    except (OSError, RuntimeError, TypeError, ValueError) as exc:  # a type h5py cannot read back
        raise attr_error(path, name, f"<unreadable: {exc}>", "a plain number or string") from None
    if isinstance(value, np.ndarray):
        if value.shape != () and value.size != 1:
            raise attr_error(path, name, value.tolist() if value.size <= 8 else f"an array of shape {value.shape}",
                       "one value, not an array")
        value = value.reshape(()).item() if value.dtype.kind not in "OV" else value.reshape(())[()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise attr_error(path, name, value, "UTF-8 text") from None
    if not isinstance(value, (str, int, float)):
        raise attr_error(path, name, value, "a plain number or string")
    return value


def int_attr(attrs, name, default, *, path: str, low: int, high: int = _INT64_MAX, want: str | None = None) -> int:
    """Integer root attribute ``name`` (``default`` when absent) in ``[low, high]``, else :class:`StoreFormatError`."""
    value = scalar_attr(attrs, name, default, path=path)
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or (isinstance(value, float) and not value.is_integer()):
        raise attr_error(path, name, value, want or f"an integer >= {low}")
    value = int(value)
    if not low <= value <= high:
        raise attr_error(path, name, value, want or (f"an integer >= {low}" if high == _INT64_MAX else
                                               f"an integer in {low}..{high}"))
    return value


def str_attr(attrs, name, default, *, path: str, choices: tuple[str, ...] | None = None) -> str:
    """Text root attribute ``name`` (``default`` when absent), one of ``choices`` when given."""
    value = scalar_attr(attrs, name, default, path=path)
    if not isinstance(value, str):
        raise attr_error(path, name, value, "text" if choices is None else " or ".join(map(repr, choices)))
    if choices is not None and value not in choices:
        raise attr_error(path, name, value, " or ".join(map(repr, choices)))
    return value


def json_attr(attrs, name, *, path: str = "the store"):
    """A root attribute holding a JSON list of strings (or ``null``): a tuple of str, or None."""
    raw = scalar_attr(attrs, name, path=path)
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise attr_error(path, name, raw, "JSON text: a list of names or null")
    try:
        value = json.loads(raw)
    except ValueError:
        raise attr_error(path, name, raw, "JSON text: a list of names or null") from None
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise attr_error(path, name, raw, "a JSON list of names (strings) or null")
    return tuple(value)
