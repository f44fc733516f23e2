"""A set of part stores read as one: what :func:`h5stream.open` makes of a list of stores, a glob or a manifest.

:func:`read_any` is the stream's ``read_meta``: a path (or URL) of one store gives that store's
:class:`~h5stream.store.meta.StoreMeta`; a list or tuple of stores, a string with glob characters (``*?[``), or a
manifest (a ``.json`` file or URL, :func:`read_manifest`) gives a :class:`PartSetMeta`: one logical store whose rows
are the parts' committed rows laid end to end (part order: by part index for the parts of one ``ingest --part``
set, else as listed, a glob's matches sorted by name in code point order, so never in the order a directory
lists them, which differs between machines and file systems).  Everything above the read layer (the epoch order,
the budget, the subset split, shards, resume) sees one store of ``rows`` rows; the reader reads each part
through a byte source of its own, or HDF5 for a compressed part (:mod:`h5stream.read.partread`), a run of rows
never crossing a part's end.

The parts must agree on what a batch holds: image shape, label kind, shape and dtype, class names and label
columns, and encoding (raw pixels, or JPEG rows decoded where the batch is augmented).  Uncompressed parts are read
by byte offset (an encoded part's rows as byte ranges of its ``/image_bytes``), compressed ones through HDF5 a
whole chunk at a time, as one compressed store is; a set with a compressed part has the compressed store's
shuffle unit, a whole block.  The parts of an
``ingest --part`` set must be the whole set: one part of each index, all cut from the same source listing; a
missing part is named.  No store may be listed twice, by any name (another spelling of its path, a symbolic or
hard link, a manifest naming it twice): its rows would be served twice an epoch.  Each check is one line naming
the part that differs and how.

Manifest format (JSON, UTF-8)::

    {"h5stream_parts": 1, "parts": ["part-0.h5", "part-1.h5", "s3://bucket/part-2.h5"]}

``parts`` lists the stores, each a path or URL; a relative path is relative to the manifest's own folder (or, for
a manifest at a URL, resolved against its URL as a link is: ``../part-0.h5`` is a part beside the manifest's
folder).  Read in the calling thread (the stream's ``open``).
"""

from __future__ import annotations

import dataclasses
import glob as globlib
import hashlib
import json
import os

from h5stream.errors import ConfigError, StoreFormatError, StoreNotFoundError, StorePathError
from h5stream.remote.config import is_url, stream_remote
from h5stream.store.meta import StoreMeta, read_meta

MANIFEST_KEY = "h5stream_parts"
MANIFEST_VERSION = 1
GLOB_CHARS = frozenset("*?[")
MANIFEST_MAX_BYTES = 64 << 20
"""The most a manifest may hold (about a million parts' names): read whole, never cut short."""


@dataclasses.dataclass(frozen=True)
class PartSetMeta(StoreMeta):
    """One logical store over ``parts`` (their :class:`StoreMeta`, in row order): part ``k`` holds the logical rows
    ``[starts[k], starts[k] + parts[k].rows)``; ``rows`` is their sum.  Frozen, picklable (a feeder process gets
    it inside the stream's configuration)."""

    parts: tuple = ()
    starts: tuple = ()

    def part_of(self, row: int) -> int:
        """The index (in ``parts``) of the part holding logical row ``row``."""
        import bisect

        return bisect.bisect_right(self.starts, int(row)) - 1

    @property
    def open_files_hint(self) -> str:
        """What an error of running out of file descriptors adds for a set: every part is open while it streams."""
        return (f", or write fewer, larger parts (each of this set's {len(self.parts)} parts keeps about 2 files "
                "open while it streams)")


def is_part_set(meta) -> bool:
    """Whether ``meta`` is a :class:`PartSetMeta` (a set of parts, not one store)."""
    return bool(getattr(meta, "parts", ()))


def part_paths(spec) -> list[str] | None:
    """The stores ``spec`` names when it is a set (a list or tuple, a glob, a manifest), None for one store.
    Raises a one-line :class:`ConfigError` for an empty list or a glob that matches nothing."""
    if isinstance(spec, (list, tuple)):
        paths = [_store_path(p) for p in spec]
        if not paths:
            raise ConfigError("open([...]): the list of parts is empty; name one or more stores")
        return paths
    text = _store_path(spec)
    if not isinstance(text, str):
        return None
    if text.endswith(".json"):
        return read_manifest(text)
    if not is_url(text) and GLOB_CHARS & set(text) and not os.path.exists(text):
        found = sorted(globlib.glob(text))
        if not found:
            raise StoreNotFoundError(f"{text}: no file matches this pattern; check the folder and the pattern")
        return found
    return None


def _store_path(spec):
    """``os.fspath(spec)``, or a one-line error saying why ``spec`` names no store (a wrong type, an empty path, a
    NUL byte)."""
    if not isinstance(spec, (str, bytes, os.PathLike)):
        raise StorePathError(f"open({spec!r:.60}): a store is named by a path (str or os.PathLike), a URL, a glob, a "
                             f".json manifest, or a list of them; got {type(spec).__name__}")
    text = os.fspath(spec)
    if not text or ("\0" if isinstance(text, str) else b"\0") in text:
        raise ConfigError(f"open({text!r:.60}): " + ("the path is empty" if not text else "a path cannot hold a NUL "
                                                      "byte") + "; name the store's file")
    return text


def read_manifest(where: str) -> list[str]:
    """The stores a manifest at ``where`` (a path, or an ``http(s)://`` URL) lists (see the module docstring)."""
    try:
        if is_url(where):
            if not where.startswith(("http://", "https://")):
                raise ConfigError(f"{where}: a manifest URL must be http(s)://; put the manifest on a web server or "
                                  "copy it to a local file (its parts may be s3:// URLs)")
            import urllib.request

            with urllib.request.urlopen(where, timeout=60) as response:
                raw = response.read(MANIFEST_MAX_BYTES + 1)
        else:
            with open(where, "rb") as f:
                raw = f.read(MANIFEST_MAX_BYTES + 1)
    except FileNotFoundError:
        raise StoreNotFoundError(f"{where}: no such manifest file") from None
    except OSError as exc:
        raise StoreNotFoundError(f"{where}: cannot read the manifest ({exc})") from None
    if len(raw) > MANIFEST_MAX_BYTES:
        raise StoreFormatError(f"{where}: a manifest of more than {MANIFEST_MAX_BYTES >> 20} MiB; list fewer, larger "
                               "parts")
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    fix = f'write {{"{MANIFEST_KEY}": {MANIFEST_VERSION}, "parts": ["part-0.h5", "part-1.h5"]}}'
    if not isinstance(value, dict) or value.get(MANIFEST_KEY) != MANIFEST_VERSION:
        raise StoreFormatError(f"{where}: not an h5stream manifest (JSON with \"{MANIFEST_KEY}\": "
                               f"{MANIFEST_VERSION}); {fix}")
    parts = value.get("parts")
    if not isinstance(parts, list) or not parts or not all(isinstance(p, str) and p for p in parts):
        raise StoreFormatError(f"{where}: \"parts\" must be a non-empty list of paths or URLs; {fix}")
    if is_url(where):
        from urllib.parse import urljoin

        # resolved as a browser resolves a link (RFC 3986): "../part-0.h5" climbs out of the manifest's folder;
        # "./" first, so that a name with a colon ("12:00.h5") is never read as a scheme
        return [p if is_url(p) or p.startswith("/") else urljoin(where, "./" + p) for p in parts]
    base = os.path.dirname(os.path.abspath(where))
    return [p if is_url(p) or os.path.isabs(p) else os.path.join(base, p) for p in parts]


def read_any(spec, remote, timeout_s: float, cache_dir="auto", cache_limit: int | None = None):
    """The metadata of what ``open`` was given: one store's :class:`StoreMeta`, or a :class:`PartSetMeta`; a URL's
    remote options carry the stream's timeout and disk cache (:func:`~h5stream.remote.config.stream_remote`)."""
    paths = part_paths(spec)
    if paths is None:
        return read_meta(spec, remote=stream_remote(spec, remote, timeout_s, cache_dir, cache_limit))
    _refuse_repeats(paths)
    metas = [read_meta(p, remote=stream_remote(p, remote, timeout_s, cache_dir, cache_limit)) for p in paths]
    return join_parts(metas, _name(spec, paths))


def _refuse_repeats(paths: list[str]) -> None:
    """A one-line :class:`ConfigError` when two of ``paths`` are one store: the same URL, or the same local file
    by any name (spelled otherwise, a symbolic or hard link), which would serve its rows twice an epoch.  A path
    that cannot be looked at is left to :func:`read_meta` to name."""
    seen: dict = {}
    for path in paths:
        if is_url(path):
            key = ("url", path)
        else:
            try:
                st = os.stat(path)
            except OSError:
                continue
            key = ("file", st.st_dev, st.st_ino)
        if key in seen:
            same = "" if seen[key] == path else f" (also listed as {seen[key]})"
            raise ConfigError(f"{path}: this store is listed twice in the set{same}, so its rows would be served "
                              "twice an epoch; list each part once")
        seen[key] = path


def _name(spec, paths: list[str]) -> str:
    """What messages call the set: the glob or manifest as given, else the first part and the count."""
    if isinstance(spec, (list, tuple)):
        return f"{paths[0]} (+{len(paths) - 1} parts)" if len(paths) > 1 else paths[0]
    return os.fspath(spec)


_AGREE = (("image_shape", "image shape"), ("label_kind", "label kind"), ("label_shape", "label shape"),
          ("label_dtype", "label dtype"), ("class_names", "class names"), ("label_columns", "label columns"),
          ("encoding", "encoding"))


def join_parts(metas: list[StoreMeta], name: str) -> PartSetMeta:
    """The :class:`PartSetMeta` of ``metas`` (pure): checked to agree, ordered, and summed.  Raises a one-line
    :class:`ConfigError` naming the part that differs (or is missing, or is listed twice)."""
    metas = _ordered(metas)
    first = metas[0]
    for meta in metas:
        for attr, what in _AGREE:
            mine, theirs = getattr(meta, attr), getattr(first, attr)
            if mine != theirs:
                raise ConfigError(f"{meta.path}: this part's {what} ({_show(mine)}) differs from {first.path}'s "
                                  f"({_show(theirs)}); the parts of one set must agree (ingest them with the same "
                                  "options from the same source)")
        if meta.rows == 0:
            raise ConfigError(f"{meta.path}: this part of {name} has no committed rows; ingest it (or leave it out)")
    starts, total = [], 0
    for meta in metas:
        starts.append(total)
        total += meta.rows
    checksums = [m.checksum for m in metas]
    checksum = None if None in checksums else hashlib.sha256("\0".join(checksums).encode()).hexdigest()[:16]
    problems = [m.checksum_problem for m in metas if m.checksum_problem is not None]
    identities = [m.identity for m in metas]  # in the set's order: the same parts in another order differ
    set_identity = None if None in identities else hashlib.sha256("\0".join(identities).encode()).hexdigest()[:16]
    return PartSetMeta(
        path=name, rows=total, image_shape=first.image_shape, label_kind=first.label_kind,
        label_shape=first.label_shape, label_dtype=first.label_dtype, class_names=first.class_names,
        label_columns=first.label_columns, block_rows=max(m.block_rows for m in metas),
        compression=_compression(metas),
        storage_order=first.storage_order if all(m.storage_order == first.storage_order for m in metas)
        else "mixed",
        order_seed=first.order_seed, resize_mode=first.resize_mode,
        skipped_files=sum(m.skipped_files for m in metas), format_version=max(m.format_version for m in metas),
        file_bytes=sum(m.file_bytes for m in metas), checksum=checksum, ingest=None,
        checksum_problem=problems[0] if problems else None,
        row_digest_problem=next((m.row_digest_problem for m in metas if m.row_digest_problem is not None), None),
        row_digests=all(m.row_digests for m in metas),
        uncommitted_rows=0, part=None, remote=first.remote,
        encoding=first.encoding, encoded_bytes=sum(m.encoded_bytes for m in metas),
        jpeg_quality=first.jpeg_quality if all(m.jpeg_quality == first.jpeg_quality for m in metas) else None,
        encoded_block_bytes=max(m.encoded_block_bytes for m in metas), parts=tuple(metas), starts=tuple(starts),
        identity=set_identity,
    )


def _compression(metas: list[StoreMeta]) -> str | None:
    """The set's compression: None when no part is compressed, else the parts' one compression, or ``"mixed"``
    (either way the set is planned as a compressed store: its shuffle unit is a whole block)."""
    kinds = {m.compression for m in metas if m.compression is not None}
    if not kinds:
        return None
    return kinds.pop() if len(kinds) == 1 and all(m.compression is not None for m in metas) else "mixed"


def _show(value) -> str:
    if isinstance(value, tuple) and value and all(isinstance(v, str) for v in value):
        return ", ".join(value)
    return "none" if value is None else str(value)


def _ordered(metas: list[StoreMeta]) -> list[StoreMeta]:
    """``metas`` in row order: by part index when they are the parts of one ``ingest --part`` set (checked
    complete), else as listed."""
    marked = [m for m in metas if m.part is not None]
    if not marked:
        return list(metas)
    if len(marked) != len(metas):
        odd = next(m for m in metas if m.part is None)
        raise ConfigError(f"{odd.path}: not a part of an ingest --part set, but {marked[0].path} is (part "
                          f"{marked[0].part.label}); list the parts of one set only")
    first = marked[0].part
    by_index: dict[int, StoreMeta] = {}
    for meta in metas:
        part = meta.part
        if part.count != first.count:
            raise ConfigError(f"{meta.path}: part {part.label} is one of {part.count} parts, but {metas[0].path} "
                              f"is one of {first.count}; list the parts of one set only")
        if part.listing != first.listing:
            raise ConfigError(f"{meta.path}: part {part.label} was cut from another source listing than "
                              f"{metas[0].path} (its files or options differ); re-ingest the parts of one set "
                              "from the same source with the same options")
        if part.index in by_index:
            raise ConfigError(f"{meta.path}: part {part.label} is listed twice (also {by_index[part.index].path}); "
                              "list each part once")
        by_index[part.index] = meta
    missing = [i for i in range(first.count) if i not in by_index]
    if missing:
        names = ", ".join(f"{i}/{first.count}" for i in missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise ConfigError(f"{metas[0].path}: the set is missing part{'s' if len(missing) > 1 else ''} {names} "
                          f"({len(by_index)} of {first.count} given); add "
                          f"{'them' if len(missing) > 1 else 'it'} (h5stream ingest SRC OUT.h5 --part "
                          f"{missing[0]}/{first.count})")
    return [by_index[i] for i in range(first.count)]


def read_paths_any(meta, start: int, stop: int, *, remote=None) -> list[str]:
    """``/paths`` of logical rows ``[start, stop)`` of one store or of a set (each part's own relative paths)."""
    from h5stream.store.meta import read_paths

    if not is_part_set(meta):
        return read_paths(meta.path, start, stop, remote=remote)
    out: list[str] = []
    for part, first in zip(meta.parts, meta.starts):
        a, b = max(start, first), min(stop, first + part.rows)
        if a < b:
            out += read_paths(part.path, a - first, b - first, remote=part.remote)
    return out
