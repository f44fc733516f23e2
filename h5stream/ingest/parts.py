"""``h5stream ingest --part i/N``: the files of part ``i`` of ``N``, cut from the whole discovered source.

The rule: a file belongs to part ``int.from_bytes(sha256(relpath)[:8], "big") % N``, where ``relpath`` is its
path relative to SRC as the store records it (UTF-8; a name that is not UTF-8 by its original bytes).  It depends
on the file's name alone, so the same discovery on every machine gives the same split, with nothing shared but
SRC; every discovered file (ingested, rejected or left out) is in exactly one part, and its part lists it where it
is skipped.  The class list stays the whole source's, so every part gives a class the same index.

:func:`listing_hash` names the whole listing the parts are cut from; every part records it with its index and count
(:mod:`h5stream.store.partattr`), so a reader of the set tells a missing or a foreign part.  Pure functions.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import replace

from h5stream.errors import ConfigError
from h5stream.ingest.discover import Source
from h5stream.store import schema
from h5stream.store.partattr import PartInfo

MAX_PARTS = 1 << 20


def parse_part(text: str) -> tuple[int, int]:
    """``"2/8"`` -> (2, 8): part 2 (0-based) of 8; a one-line ConfigError for anything else."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not m:
        raise ConfigError(f"--part {text!r}: use INDEX/COUNT with INDEX counted from 0, e.g. --part 0/4")
    index, count = int(m.group(1)), int(m.group(2))
    if not 1 <= count <= MAX_PARTS:
        raise ConfigError(f"--part {text!r}: COUNT must be 1..{MAX_PARTS}")
    if index >= count:
        raise ConfigError(f"--part {text!r}: INDEX counts from 0, so it must be 0..{count - 1} for {count} parts "
                          f"(a 1-based index such as SLURM_ARRAY_TASK_ID from 1: subtract 1)")
    return index, count


def part_of(relpath: str, count: int) -> int:
    """The part (0..count-1) that the file at ``relpath`` (relative to SRC) belongs to."""
    digest = hashlib.sha256(schema.encode_path(relpath)).digest()
    return int.from_bytes(digest[:8], "big") % count


def listing_hash(source: Source) -> str:
    """A hash of the whole discovered listing: label kind, class list, label columns, every file with its label,
    every file rejected.  Hex, 32 digits."""
    h = hashlib.sha256()
    h.update(json.dumps([source.label_kind, list(source.class_names or ()),
                         list(source.label_columns or ())]).encode())
    for item in source.items:
        label = list(item.label) if isinstance(item.label, tuple) else item.label
        h.update(b"\0i" + schema.encode_path(item.relpath) + b"\0" + json.dumps(label).encode())
    for relpath, _ in source.rejected:
        h.update(b"\0r" + schema.encode_path(relpath))
    return h.hexdigest()[:32]


def select_part(source: Source, index: int, count: int) -> tuple[Source, PartInfo]:
    """``source`` cut down to part ``index`` of ``count``: its items, rejected and left-out files (folders left
    out are listed by part 0 alone: they are not files of any part), and the :class:`PartInfo` to record."""
    part = PartInfo(index, count, listing_hash(source))

    def mine(relpath: str) -> bool:
        return part_of(relpath, count) == index

    left_out = tuple(e for e in source.left_out
                     if (index == 0 if e[0].endswith("/") else mine(e[0])))
    return replace(source, items=tuple(i for i in source.items if mine(i.relpath)),
                   rejected=tuple(r for r in source.rejected if mine(r[0])), left_out=left_out), part
