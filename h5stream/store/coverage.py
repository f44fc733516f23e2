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
read up to where that digest ends (:func:`partial_span`).  Any other state is
damage (a shortened or deleted table, a lost tail, an edited count):
:func:`problem` says which rows are left without a digest, and readers refuse
the store rather than stream those rows unchecked.

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


def problem(committed: int, stored: int, block_rows: int, table_rows: int | None, tail: Tail | None, *,
            has_checksum_attrs: bool) -> str | None:
    """What is wrong with a store's digests, in words, or None when the commit protocol could have left them so.

    ``committed``: ``committed_rows``; ``stored``: rows present in all three arrays; ``table_rows``: rows of
    ``/checksums`` (None: no table); ``tail``: :func:`tail_from_json` of ``checksum_tail`` (None: missing or
    unreadable); ``has_checksum_attrs``: whether the ``checksum`` or ``checksum_tail`` attribute is there.
    """
    if table_rows is None:
        if not has_checksum_attrs:
            return None  # written before checksums existed: read unchecked, as always
        return (f"{_rows(0, committed)} have no checksum (the /{schema.CHECKSUMS} table is gone)" if committed
                else f"the /{schema.CHECKSUMS} table is gone")
    if tail is None:
        first = min(table_rows * block_rows, committed)
        why = f"the {schema.ATTR_CHECKSUM_TAIL} attribute is missing or unreadable"
        return f"{_rows(first, committed)} have no checksum ({why})" if first < committed else why
    tail_rows = tail[0]
    if table_rows != tail_rows // block_rows:
        why = (f"/{schema.CHECKSUMS} has {table_rows} rows, but {schema.ATTR_CHECKSUM_TAIL} was written with "
               f"{tail_rows // block_rows} complete blocks")
        first, last = table_rows * block_rows, min(committed, tail_rows // block_rows * block_rows)
        return f"{_rows(first, last)} have no checksum ({why})" if first < last else why
    if tail_rows < committed:
        return (f"{_rows(tail_rows // block_rows * block_rows, committed)} have no checksum (the checksums cover "
                f"{tail_rows} rows, committed_rows is {committed})")
    if tail_rows > stored:
        return (f"its checksums cover {tail_rows} rows but only {stored} are stored (committed_rows is "
                f"{committed}); rows are written before their checksums, so the arrays were cut short")
    return None


def damage_error(path: str, what: str) -> StoreFormatError:
    """The one-line error for a store whose digests :func:`problem` found wanting."""
    return StoreFormatError(f"{path}: {what}; commits write checksums before they publish rows, so this is damage: "
                            f"{FIX}")


def partial_span(committed: int, block_rows: int, tail: Tail) -> tuple[int, int] | None:
    """For a commit in flight or torn (``tail`` for more rows than ``committed``): rows ``[start, stop)`` whose
    stored digest covers the last, partial committed block -- the block's row in ``/checksums`` (``stop`` its
    end) or the tail (``stop`` its row count); reading them checks the committed rows among them.  None when the
    last committed block is complete or the tail is for ``committed`` rows (the ordinary case)."""
    tail_rows = tail[0]
    if committed % block_rows == 0 or tail_rows <= committed:
        return None
    start = committed // block_rows * block_rows
    return start, min(start + block_rows, tail_rows)


def expected(committed: int, block_rows: int, table: np.ndarray, tail: Tail) -> list[tuple[Digests, int]]:
    """Per committed block, its digests and the row where the rows they cover end (past ``committed`` only for
    the block :func:`partial_span` names), for a store :func:`problem` passed."""
    n_blocks = -(-committed // block_rows)
    out = [(tuple(int(v) for v in table[b]), (b + 1) * block_rows) for b in range(committed // block_rows)]
    if len(out) < n_blocks:
        span = partial_span(committed, block_rows, tail)
        b = n_blocks - 1
        if span is not None and b < len(table):
            out.append((tuple(int(v) for v in table[b]), span[1]))
        else:  # the tail: for committed rows, or for more rows in the same block
            out.append((tail[1], span[1] if span is not None else committed))
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
