"""Restore damaged image blocks of a store from the source files they were ingested from (`repair --source`).

A block whose image bytes no longer match their digest, while its labels and
paths still match theirs, names exactly the files its rows came from.  Those
files are decoded again with the store's own decode settings (size, channels,
resize mode, background, pad fill) and, in an encoded store, encoded again at
its JPEG quality, as the ingest did; only when the block has the very digest
the store recorded for it -- the same bytes as were ingested, proven by the
checksum itself -- are they written back, over the block's chunk (an encoded
block: its byte range of ``/image_bytes``, piece by piece over the chunks it
crosses, and only where ``/image_ends`` still gives each row the length it has
again), where h5py's chunk index says it lies, then synced.  A block decoded or
encoded to other bytes (a source file changed since, another decoder or
encoder version) is left as it is and named.

Crash safety: nothing but the pixel bytes of blocks that already fail their
checksum is written, and only with bytes that match it; HDF5's metadata is not
touched.  A process killed mid-write leaves such a block partly restored, still
failing its checksum, and running the repair again restores it.  The caller
holds the store's lock, so no writer works meanwhile.  Compressed stores
(whose chunks change size) are not restored in place: they are named too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import h5py
import numpy as np

from h5stream.ingest.decode import SkipFile, decode_file
from h5stream.ingest.append import schema_background
from h5stream.ingest.spec import DecodeSpec
from h5stream.store import coverage, pathrows, schema
from h5stream.store.checksum import digest, tail_from_json
from h5stream.store.encoded import image_rows, is_encoded
from h5stream.store.durable import write_in_place


@dataclass(frozen=True)
class Outcome:
    """What became of the damaged rows ``[start, stop)``: ``restored``, or the ``reason`` they were not."""

    start: int
    stop: int
    restored: bool
    reason: str = ""


def restore_blocks(path: str, source_root: str, bad, rows: int, block_rows: int) -> list[Outcome]:
    """Restore the blocks ``bad`` (:class:`~h5stream.store.checksum.BadBlock`) of the store at ``path`` (``rows``
    committed rows) from the files under ``source_root``; one :class:`Outcome` per block, in order."""
    background, pad_fill = schema_background(path)
    with h5py.File(path, "r", locking=False) as f:
        images = f[schema.IMAGES]  # an encoded store's is empty, of the decoded shape
        h, w, c = images.shape[1:]
        spec = DecodeSpec(size=(h, w), resize=_str(f.attrs.get(schema.ATTR_RESIZE, "stretch")), channels=c,
                          background=background, pad_fill=pad_fill)
        quality = int(f.attrs[schema.ATTR_JPEG_QUALITY]) if is_encoded(f.attrs) else None
        pixels = images if quality is None else f[schema.IMAGE_BYTES]
        compressed = pixels.id.get_create_plist().get_nfilters() > 0
        table = coverage.read_table(f, path)
        tail = tail_from_json(f.attrs.get(schema.ATTR_CHECKSUM_TAIL))
        stored = min(image_rows(f).shape[0], f[schema.LABELS].shape[0], f[pathrows.row_node(f)].shape[0])
        wants = coverage.expected(rows, block_rows, table, tail, stored)
        named = [b for b in bad if b.parts == ("images",)]  # their paths match their checksum: the files are known
        if compressed:
            places = {}
        elif quality is None:
            places = {b.start: images.id.get_chunk_info_by_coord((b.start, 0, 0, 0)).byte_offset for b in named}
        else:
            places = {b.start: _encoded_place(f, b.start, b.stop) for b in named}
        relpaths = {b.start: pathrows.stored_bytes(f, b.start, b.stop) for b in named}
    out = []
    for b in bad:
        want, covered = wants[b.start // block_rows]
        if b.parts != ("images",):
            why = "they could not be read" if b.parts == ("unreadable",) else f"their {', '.join(b.parts)} differ too"
            out.append(Outcome(b.start, b.stop, False, f"{why}, so their files are not known for sure"))
        elif compressed:
            out.append(Outcome(b.start, b.stop, False, "the store is compressed, so a block cannot be rewritten in "
                                                       "place"))
        elif covered != b.stop:
            out.append(Outcome(b.start, b.stop, False, "their checksum also covers rows that were never committed"))
        elif places[b.start] is None:
            out.append(Outcome(b.start, b.stop, False, f"their row ends in /{schema.IMAGE_ENDS} are damaged too"))
        else:
            out.append(_restore(path, source_root, spec, b.start, b.stop, relpaths[b.start], want[0], places[b.start],
                                quality))
    return out


def _encoded_place(f, start: int, stop: int) -> tuple[np.ndarray, list[tuple[int, int]]] | None:
    """Where encoded rows ``[start, stop)`` of the open store ``f`` lie: their ends relative to the first one's
    start (as :func:`~h5stream.ingest.encode.encode_rows` gives them), and their byte range of ``/image_bytes``
    as ``(file offset, length)`` pieces, one per chunk crossed; None where ``/image_ends`` places them outside
    the stored bytes or backwards (damaged ends)."""
    data = f[schema.IMAGE_BYTES]
    ends = np.asarray(f[schema.IMAGE_ENDS][max(0, start - 1):stop], dtype=np.int64)
    first = int(ends[0]) if start else 0
    ends = ends[1:] if start else ends
    if first < 0 or int(ends[-1]) > data.shape[0] or (np.diff(ends, prepend=first) < 0).any():
        return None
    chunk_bytes = int(data.chunks[0])
    pieces = []
    pos, end = first, int(ends[-1])
    while pos < end:
        chunk, within = divmod(pos, chunk_bytes)
        n = min(end - pos, chunk_bytes - within)
        offset = data.id.get_chunk_info_by_coord((chunk * chunk_bytes,)).byte_offset
        if offset is None:  # a chunk never written
            return None
        pieces.append((offset + within, n))
        pos += n
    return ends - first, pieces


def _restore(path: str, root: str, spec: DecodeSpec, start: int, stop: int, relpaths: list[bytes], want: int,
             at, quality: int | None) -> Outcome:
    """Decode (and, with a JPEG ``quality``, encode) the block's files again; write the result at ``at`` (a raw
    block's chunk offset, or an encoded block's :func:`_encoded_place`) where it has the digest ``want``."""
    block = np.empty((stop - start, *spec.shape), np.uint8)
    for i, rel in enumerate(relpaths):
        name = os.path.join(root, schema.decode_path(rel))
        try:
            block[i] = decode_file(name, spec)
        except SkipFile as exc:
            return Outcome(start, stop, False, f"{name} cannot be decoded ({exc})")
    if quality is None:
        if digest(block) != want:
            return Outcome(start, stop, False, "decoded again, their files give other bytes than were ingested "
                                               "(changed since, or decoded by other library versions)")
        write_in_place(path, [(at, block)])
        return Outcome(start, stop, True)
    from h5stream.ingest.encode import encode_rows

    rows = encode_rows(block, quality)
    if digest(rows) != want:
        return Outcome(start, stop, False, "decoded and encoded again, their files give other bytes than were "
                                           "ingested (changed since, or decoded or encoded by other library versions)")
    ends, pieces = at
    if not np.array_equal(rows.ends, ends):  # the bytes are right, the ends that place them are not
        return Outcome(start, stop, False, f"their row ends in /{schema.IMAGE_ENDS} are damaged too")
    writes, pos = [], 0
    for offset, n in pieces:
        writes.append((offset, rows.data[pos:pos + n]))
        pos += n
    write_in_place(path, writes)
    return Outcome(start, stop, True)


def _str(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
