"""Whether this torch can use a device of a type other than CUDA (MPS, XPU, ...), and why not.

Torch accepts ``torch.device("mps")`` on any machine and fails only at the first tensor put there, each backend
with an exception of its own (``NotImplementedError`` for MPS without it, ``AssertionError`` for XPU, a
``RuntimeError`` elsewhere): the adapter asks before it starts, so the caller gets one :class:`ConfigError`.
"""

from __future__ import annotations

import torch

MAX_REASON = 200


def unavailable(dev: torch.device) -> str | None:
    """Why this torch cannot put tensors on ``dev``, in a few words, or None where it can (``cpu``, ``meta``; CUDA
    is the caller's own check)."""
    if dev.type in ("cpu", "cuda", "meta"):
        return None
    for owner in (getattr(torch.backends, dev.type, None), getattr(torch, dev.type, None)):
        probe = getattr(owner, "is_available", None)
        if callable(probe):
            try:
                ok = bool(probe())
            except Exception:  # noqa: BLE001 - a backend that cannot even say counts as absent
                ok = False
            if not ok:
                where = "torch.backends" if owner is getattr(torch.backends, dev.type, None) else "torch"
                return f"{where}.{dev.type}.is_available() is False"
            break
    try:
        torch.empty(1, device=dev)
    except Exception as exc:  # noqa: BLE001 - each backend raises its own class
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return first if len(first) <= MAX_REASON else first[:MAX_REASON - 3] + "..."
    return None
