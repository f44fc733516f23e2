"""Which committed rows of a store have block digests, and what it means when some have none.

A commit stages its digests -- complete blocks appended to ``/checksums``, the
partial last block's in the ``checksum_tail`` attribute, which names the row
count ``R`` it was computed for -- and flushes them with the rows, before it
raises ``committed_rows`` (:meth:`StoreWriter.commit
<h5stream.store.writer.StoreWriter.commit>`: ``_write_pending(checksums=True)``,
a flush, then the count, a second flush).  So whenever a reader can see the
file (a flush interrupted half-way leaves the flushing marker, and readers
refuse such a file until it is rebuilt):

* ``/checksums`` holds exactly ``R // block_rows`` rows;
* ``R >= committed_rows``: every committed row has a digest;
* ``R <=`` the rows stored in the arrays: digests never run ahead of their rows.

``R > committed_rows`` is a commit in flight, or a writer stopped between the
two flushes (a *torn commit*): the rows up to ``R`` are on disk, so the block
holding the last committed rows is checked against the digest that covers it,
read up to where that digest ends (:func:`partial_source`).  A committed row
left without a digest is damage (a shortened or deleted table, a lost tail, an
edited count): :func:`problem` names those rows, and readers refuse the store
rather than stream them unchecked.  (A writer killed inside a flush may leave
the tail unreadable; the flushing marker then makes the store be rebuilt, and
that needs digests only for the committed rows.)

A store with neither ``/checksums`` nor the ``checksum`` and ``checksum_tail``
attributes was written before checksums existed (format version 1 covers such
stores too, see :mod:`h5stream.store.schema`) and is read unchecked, as before.
Pure functions, except :func:`read_table`, which reads the table from an open
h5py file.
"""

from __future__ import annotations

import json

import numpy as np

from h5stream.errors import StoreFormatError
from h5stream.store import schema

PARTS = ("images", "labels", "paths")
"""Column order of ``/checksums`` and keys of ``checksum_tail``."""

Digests = tuple[int, int, int]
Tail = tuple[int, "Digests | None"]
"""``checksum_tail`` parsed: the row count it was written for and the partial block's digests (None on a block
boundary)."""

FIX = "restore the file from a copy or re-ingest it"


def tail_from_json(text) -> Tail | None:
    """Parse ``checksum_tail``; ``None`` when it is missing or unreadable."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    try:
        value = json.loads(str(text))
        rows = int(value["rows"])
        digests = tuple(int(value[name], 16) for name in PARTS) if PARTS[0] in value else None
    except (TypeError, ValueError, KeyError):
        return None
    if rows < 0:
        return None
    return rows, digests


def _rows(a: int, b: int) -> str:
    """Rows ``[a, b)`` as people read them."""
    return f"row {a}" if b - a == 1 else f"rows {a}-{b - 1}"


def partial_source(committed: int, block_rows: int, table_rows: int, tail: Tail | None,
                   stored: int) -> tuple[str, int] | None:
    """Where the digest of the last committed block comes from when that block is partial: ``("tail", stop)``
    or ``("table", stop)``, ``stop`` being the row where the rows it covers end (past ``committed`` for a commit
    in flight or torn); None when no digest covers the block or the rows it covers are not all stored."""
    b = committed // block_rows
    if tail is not None and tail[1] is not None and committed <= tail[0] < (b + 1) * block_rows \
            and tail[0] <= stored:
        return "tail", tail[0]
    if table_rows > b and (b + 1) * block_rows <= stored:
        return "table", (b + 1) * block_rows
    return None


def problem(committed: int, stored: int, block_rows: int, table_rows: int | None, tail: Tail | None, *,
            has_checksum_attrs: bool) -> str | None:
    """Which committed rows have no digest to be checked with, and why, in words; None when every one has.

    ``committed``: ``committed_rows``; ``stored``: rows present in all three arrays; ``table_rows``: rows of
    ``/checksums`` (None: no table); ``tail``: :func:`tail_from_json` of ``checksum_tail`` (None: missing or
    unreadable); ``has_checksum_attrs``: whether the ``checksum`` or ``checksum_tail`` attribute is there.
    """
    if table_rows is None:
        if not has_checksum_attrs:
            return None  # written before checksums existed: read unchecked, as always
        return (f"{_rows(0, committed)} have no checksum (the /{schema.CHECKSUMS} table is gone)" if committed
                else None)
    complete = committed // block_rows
    first = end = min(table_rows, complete) * block_rows
    if table_rows < complete:
        end = complete * block_rows
    if committed % block_rows and partial_source(committed, block_rows, table_rows, tail, stored) is None:
        end = committed
    if first >= end:
        return None
    if table_rows < complete:
        why = f"/{schema.CHECKSUMS} has {table_rows} rows for {complete} complete committed blocks"
    elif tail is None:
        why = f"the {schema.ATTR_CHECKSUM_TAIL} attribute is missing or unreadable"
    elif tail[0] < committed:
        why = f"the checksums cover {tail[0]} rows, committed_rows is {committed}"
    elif tail[0] > stored:
        why = (f"its checksums cover {tail[0]} rows but only {stored} are stored; rows are written before their "
               "checksums, so the arrays were cut short")
    else:
        why = "no checksum covers the last committed block"
    return f"{_rows(first, end)} have no checksum ({why})"


def damage_error(path: str, what: str) -> StoreFormatError:
    """The one-line error for a store whose digests :func:`problem` found wanting."""
    return StoreFormatError(f"{path}: {what}; commits write checksums before they publish rows, so this is damage: "
                            f"{FIX}")


def expected(committed: int, block_rows: int, table: np.ndarray, tail: Tail | None,
             stored: int) -> list[tuple[Digests, int]]:
    """Per committed block, its digests and the row where the rows they cover end (past ``committed`` only for
    a partial last block whose digest also covers rows not committed, see :func:`partial_source`), for a store
    :func:`problem` passed."""
    out = [(tuple(int(v) for v in table[b]), (b + 1) * block_rows) for b in range(committed // block_rows)]
    if committed % block_rows:
        where, stop = partial_source(committed, block_rows, len(table), tail, stored)
        b = committed // block_rows
        out.append((tail[1] if where == "tail" else tuple(int(v) for v in table[b]), stop))
    return out


def read_table(f, path: str, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Rows ``[start, stop)`` (default: to the end) of ``/checksums`` of the open h5py file ``f``; a table HDF5
    cannot read (a damaged index or chunk) is a :class:`StoreFormatError` naming it, in one line."""
    table = f[schema.CHECKSUMS]
    stop = table.shape[0] if stop is None else min(int(stop), table.shape[0])
    try:
        return np.asarray(table[start:stop], dtype=np.uint64)
    except (OSError, RuntimeError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise StoreFormatError(f"{path}: the block checksum table /{schema.CHECKSUMS} cannot be read ({detail}); "
                               f"the file is damaged: {FIX}") from exc
