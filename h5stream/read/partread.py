"""Reading a set of part stores as one store: runs that never cross a part, one byte source per part.

The stream sees a set of parts (:class:`~h5stream.store.partset.PartSetMeta`: ``parts`` and their first
logical rows ``starts``) as one store whose rows are the parts' rows laid end to end; the epoch order, the fills
and the batches are the one store's.  Here a fill's segments (logical row ranges, in buffer order) become runs
(:func:`plan_part_runs`): each segment is cut where a part begins and where a chunk of a part begins, so every
run lies in one part and is one contiguous read of its file; ``Run.src`` stays the logical row and
``Run.offset`` is the offset in that part's file.  :class:`PartRows` reads a run through the
:class:`~h5stream.read.rows.RowReader` of its part (that part's byte source, chunk offsets and block check), so
every guarantee of one store's reads (scatter reads into the batches, read-ahead advice, ``verify_reads``)
holds part by part.  An encoded part's rows are byte ranges of its ``/image_bytes``
(:mod:`h5stream.read.encbytes`), its runs planned over whole rows.  A compressed part is read as one compressed
store is, through HDF5 (its runs have no byte offset, ``Run.offset`` None); a set with one reads every run in the
reader thread, no I/O threads, as a compressed store does.  Each local part is read past the page cache
(``O_DIRECT``) where the stream decided so for it (:func:`~h5stream.read.source.resolve_direct_io_parts`), the
direct parts sharing one store's bounce buffers.

Pure functions, and :func:`run_parts`, which opens the parts in the reader thread.
"""

from __future__ import annotations

import threading
from collections import defaultdict

import numpy as np

from h5stream.read.bounce import BouncePool
from h5stream.read.locate import locate
from h5stream.read.rows import RowReader, drain_runs
from h5stream.read.runs import Run
from h5stream.read.source import open_source
from h5stream.read.verify import BlockCheck, check_buffers, checks_every_read, row_digest_reader


def part_cuts(starts, rows, block_rows) -> np.ndarray:
    """Logical rows where a part or a chunk of a part begins, sorted (pure)."""
    cuts = [np.arange(int(s), int(s) + int(n), int(b), dtype=np.int64) for s, n, b in zip(starts, rows, block_rows)]
    return np.concatenate(cuts) if cuts else np.zeros(0, np.int64)


def plan_part_runs(segments, starts, cuts: np.ndarray, offsets: list[np.ndarray], block_rows, row_bytes: int
                   ) -> list[Run]:
    """A fill's ``(k, 2)`` segments (logical row ranges, buffer order) as runs of a part set (pure).

    ``starts[p]``: part ``p``'s first logical row; ``cuts``: :func:`part_cuts`; ``offsets[p]``: the byte offset
    of each chunk of part ``p`` (``block_rows[p]`` rows each), None for a part read through HDF5 (its runs get
    offset None).  Pieces that follow each other in the same part and its file merge into one run, as
    :func:`~h5stream.read.runs.plan_runs` merges them in one store."""
    seg = np.asarray(segments, np.int64).reshape(-1, 2)
    if not len(seg):
        return []
    start, stop = seg[:, 0], seg[:, 1]
    lo = np.searchsorted(cuts, start, side="right")  # cuts strictly inside (start, stop) split the segment
    hi = np.searchsorted(cuts, stop, side="left")
    inner = np.maximum(hi - lo, 0)
    pieces = inner + 1
    seg_id = np.repeat(np.arange(len(seg)), pieces)
    at = np.arange(int(pieces.sum())) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    last = len(cuts) - 1
    p_start = np.where(at == 0, start[seg_id], cuts[np.clip(lo[seg_id] + at - 1, 0, max(last, 0))]
                       if len(cuts) else start[seg_id])
    p_stop = np.where(at == inner[seg_id], stop[seg_id], cuts[np.clip(lo[seg_id] + at, 0, max(last, 0))]
                      if len(cuts) else stop[seg_id])
    n = p_stop - p_start
    dest = np.cumsum(n) - n
    part = np.searchsorted(np.asarray(starts, np.int64), p_start, side="right") - 1
    off = np.empty(len(n), np.int64)
    through_h5 = np.zeros(len(n), bool)
    for p in np.unique(part).tolist():
        mine = part == p
        local = p_start[mine] - int(starts[p])
        if offsets[p] is None:  # read through HDF5: planned over its rows laid end to end, no offset
            off[mine] = local * row_bytes
            through_h5 |= mine
            continue
        b = int(block_rows[p])
        off[mine] = np.asarray(offsets[p], np.int64)[local // b] + (local % b) * row_bytes
    new = np.ones(len(n), bool)
    new[1:] = (p_stop[:-1] != p_start[1:]) | (part[:-1] != part[1:]) | (off[:-1] + n[:-1] * row_bytes != off[1:])
    first = np.flatnonzero(new)
    rows = np.add.reduceat(n, first)
    run_offsets = [None if h5 else o for o, h5 in zip(off[first].tolist(), through_h5[first].tolist())]
    return list(map(Run._make, zip(dest[first].tolist(), p_start[first].tolist(), rows.tolist(), run_offsets)))


class PartChecks:
    """The block checks of the parts, as the reader asks one store's :class:`BlockCheck`: ``labels`` of every
    row at once, ``every_read``, ``learned_bytes``.  ``checks[p]`` is part ``p``'s check or None."""

    def __init__(self, checks: list[BlockCheck | None], starts, rows):
        self._checks, self._starts, self._rows = checks, list(starts), list(rows)
        self.every_read = any(c is not None and c.every_read for c in checks)
        self.by_row = False  # what the reader asks before deferring reads, which a set never does

    def labels(self, start: int, labels: np.ndarray) -> None:
        """Check every label of the set (``start`` 0: all labels read at once).  Reader thread."""
        for check, s, n in zip(self._checks, self._starts, self._rows):
            if check is not None and s >= start:
                check.labels(0, labels[s - start:s - start + n])

    @property
    def learned_bytes(self) -> int:
        return sum(c.learned_bytes for c in self._checks if c is not None)

    @property
    def digest_bytes(self) -> int:
        return sum(c.digest_bytes for c in self._checks if c is not None)

    def expected(self, row_ids):
        raise NotImplementedError("a part set never defers pixel reads to its receivers")


class PartSources:
    """The parts' byte sources as the reader sees its one source: the most reads in flight of any part, whether
    any reads past the page cache, the bytes read in place, ``close`` (all; idempotent as each source's is)."""

    def __init__(self, sources: list):
        self._sources = sources
        self.direct = any(getattr(s, "direct", False) for s in sources)

    @property
    def max_in_flight(self) -> int:
        """The most reads in flight any part asks for now (a URL part's grows once its cache gives up)."""
        return max(int(getattr(s, "max_in_flight", 1)) for s in self._sources)

    @property
    def in_place_bytes(self) -> int:
        return sum(getattr(s, "in_place_bytes", 0) for s in self._sources)

    @property
    def landed(self) -> int:
        """Bytes the parts' remote sources received so far (progress: any thread)."""
        return sum(getattr(s, "landed", 0) for s in self._sources)

    @property
    def close_while_reading(self) -> bool:
        """Whether every part's source may be closed while its reads are in flight (a set of URL parts through
        the disk cache), as :class:`~h5stream.read.source.ByteSource` says."""
        return all(getattr(s, "close_while_reading", False) for s in self._sources)

    def close(self) -> None:
        for source in self._sources:
            source.close()


class PartRows:
    """A :class:`~h5stream.read.rows.RowReader` over a set of parts: each run (:func:`plan_part_runs`) goes to its
    part's reader with its row made local.  Same threads as :class:`RowReader` (``read_runs`` / ``read_pixels`` in
    the I/O threads, the rest in the reader thread)."""

    def __init__(self, readers: list[RowReader], starts, check: PartChecks | None):
        self._readers, self._starts, self.check = readers, np.asarray(starts, np.int64), check

    def _local(self, runs) -> dict[int, list[Run]]:
        """``runs`` grouped by part, each with its row made the part's own."""
        by_part: dict[int, list[Run]] = defaultdict(list)
        for run in runs:
            p = int(np.searchsorted(self._starts, run.src, side="right")) - 1
            by_part[p].append(run._replace(src=run.src - int(self._starts[p])))
        return by_part

    @property
    def advised_bytes(self) -> int:
        return sum(r.advised_bytes for r in self._readers)

    @property
    def progress(self) -> int:
        """Reads done by every part's reader (the consumer's timeout waits while it moves)."""
        return sum(r.progress for r in self._readers)

    def learn_runs(self, runs: list[Run]) -> None:
        for p, local in self._local(runs).items():
            self._readers[p].learn_runs(local)

    def advise(self, runs: list[Run]) -> list[Run]:
        missing = []
        for p, local in self._local(runs).items():
            missing.extend(self._readers[p].advise(local))
        return missing

    def read_runs(self, job, runs, lock: threading.Lock) -> tuple[float, int]:
        return drain_runs(self.read_pixels, job, runs, lock)

    def read_pixels(self, job, run: Run) -> tuple[float, int]:
        ((p, (local,)),) = self._local([run]).items()
        return self._readers[p].read_pixels(job, local)

    def read_labels(self, runs: list[Run], n: int) -> np.ndarray:
        out = None
        for p, local in self._local(runs).items():
            labels = self._readers[p].read_labels(local, n)
            if out is None:
                out = labels
            else:
                for run in local:
                    out[run.dest:run.dest + run.rows] = labels[run.dest:run.dest + run.rows]
        return out


def run_parts(reader, stack, direct_io) -> bool:
    """Open every part of ``reader.meta`` (a part set) for ``reader`` (a :class:`~h5stream.read.reader.Reader`),
    closing them with ``stack``: its sources (part ``p`` read with ``O_DIRECT`` where ``direct_io[p]``; a bool
    is every local part's answer), HDF5 files for compressed parts, row readers, checks, every label when it
    caches them, and the function that turns a fill's segments into runs.  Returns whether every part's pixels
    are read by byte offset (then I/O threads may read them).  Reader thread."""
    meta = reader.meta
    n_parts = len(meta.parts)
    direct = tuple(direct_io) if isinstance(direct_io, (tuple, list)) else (bool(direct_io),) * n_parts
    bounces = BouncePool()  # the direct parts share one store's bounce buffers (what the plan counts)
    stack.callback(bounces.close)
    sources, readers, checks, labels, offsets = [], [], [], [], []
    by_offset = True
    for part, part_direct in zip(meta.parts, direct):
        where = locate(part, reader._cache_labels, digests=reader._verify)
        images = label_set = None
        if (where.image_chunks is None and where.encoded is None) or (where.labels is None and
                                                                      where.label_chunks is None):
            images, label_set = _open_h5(part, stack, reader._stop)
            by_offset = by_offset and (where.image_chunks is not None or where.encoded is not None)
        source = open_source(part.path, direct_io=part_direct and part.remote is None, remote=part.remote,
                             bounces=bounces)
        stack.callback(source.close)
        sources.append(source)
        check = BlockCheck.from_digests(
            part.path, part.rows, part.block_rows, part.row_bytes, where.digests,
            # the parts share the buffers one store's check gets (one each at least): what the plan counts
            max_buffers=max(1, check_buffers(getattr(source, "max_in_flight", 2)) // n_parts),
            every_read=checks_every_read(reader._verify, part.remote is not None),
            row_digests=row_digest_reader(source, where.row_digests))
        checks.append(check)
        readers.append(RowReader(part, source, offsets=where.image_chunks, label_offsets=where.label_chunks,
                                 images=images, labels=label_set, check=check,
                                 stop=reader._stop, encoded=where.encoded))
        labels.append(where.labels)
        reader.parts_opened += 1  # progress: the consumer's wait goes on while parts open (Reader.progress)
        # An encoded part's runs are rows, read as byte ranges by its reader (read/encbytes.py): planned over a
        # stand-in layout of whole rows laid end to end, so rows that follow each other in the part join one run.
        # A part read through HDF5 (None) is planned so too, its runs with no byte offset.
        offsets.append(where.image_chunks if where.encoded is None else
                       np.arange(-(-part.rows // part.block_rows), dtype=np.int64) * part.block_rows * part.row_bytes)
    check = PartChecks(checks, meta.starts, [p.rows for p in meta.parts]) if any(checks) else None
    reader.all_labels = np.concatenate(labels) if reader._cache_labels else None
    if check is not None and reader.all_labels is not None:
        check.labels(0, reader.all_labels)
    reader._source = PartSources(sources)
    reader._counts["direct_io"] = int(reader._source.direct)
    reader._check = check
    reader._rows = PartRows(readers, meta.starts, check)
    cuts = part_cuts(meta.starts, [p.rows for p in meta.parts], [p.block_rows for p in meta.parts])
    block_rows = [p.block_rows for p in meta.parts]
    reader._offsets = offsets  # not None: planned by reader._plan
    reader._plan = lambda segments: plan_part_runs(segments, meta.starts, cuts, offsets, block_rows, meta.row_bytes)
    return by_offset


def _open_h5(part, stack, stop) -> tuple:
    """``(images, labels)``: the HDF5 datasets of a part only HDF5 can read (compressed), opened with ``stack``;
    refused (:class:`~h5stream.errors.StoreBusyError`) while another process writes the part, as one
    compressed store is.  Reader thread."""
    from h5stream.read.locate import images_dataset
    from h5stream.store import schema
    from h5stream.store.access import busy_error, open_h5_readonly, writer_pids

    if part.remote is None:
        writers = writer_pids(part.path)
        if writers:
            raise busy_error(part.path, writers, "a compressed part can only be read through HDF5 metadata that "
                                                 "the writer keeps changing")
    f = stack.enter_context(open_h5_readonly(part.path, rdcc_nbytes=0, stop=stop, remote=part.remote))
    images = images_dataset(f)
    if part.encoded:
        from h5stream.store.encoded import EncodedArray

        images = EncodedArray.of(f)
    return images, f[schema.LABELS]
