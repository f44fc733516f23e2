"""Which part of a set a store is: the ``part`` root attribute that ``h5stream ingest --part i/N`` writes.

The attribute is JSON text, ``{"index": i, "count": N, "listing": "<hex>"}``: part ``i`` (0-based) of ``N``, and
``listing``, a hash of the whole source listing the N parts were cut from (every file discovered, with its label,
and the class list), the same in every part of one set.  A reader of a set (:mod:`h5stream.store.partset`)
tells a missing part by its index and a foreign one by its listing.  Pure functions over plain values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class PartInfo:
    """Part ``index`` (0-based) of ``count`` parts cut from the source listing whose hash is ``listing``."""

    index: int
    count: int
    listing: str

    @property
    def label(self) -> str:
        """``i/N``, as ``--part`` takes it."""
        return f"{self.index}/{self.count}"


def encode(part: PartInfo) -> str:
    """The attribute's text for ``part``."""
    return json.dumps({"index": part.index, "count": part.count, "listing": part.listing})


def decode(text) -> PartInfo | None:
    """The :class:`PartInfo` in attribute text ``text``, None when it is not one (a damaged attribute)."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return None
    if not isinstance(value, dict):
        return None
    index, count, listing = value.get("index"), value.get("count"), value.get("listing")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (index, count)) \
            or not isinstance(listing, str) or not 0 <= index < count:
        return None
    return PartInfo(index, count, listing)
