"""Checking what the stream reads against the store's block checksums, on every read path.

The store keeps xxh3-64 digests per *block* (``block_rows`` rows, the chunk
of ``/images``) of its image bytes and of its labels (see
:mod:`h5stream.store.checksum`).  The stream reads units of 1 to 4 MiB:
a whole block under the default budget, but a part of one under a small
budget (which the shuffle spreads over different fills on purpose), and a
shard or a validation split may own only part of a block.  A read may
therefore hold only part of a block, and the xxh3 of a block cannot be put
together from digests of its parts.  So:

* **Images.**  The first read that touches a block has the rest of the block
  read (:meth:`BlockCheck.learn`; from the page cache, where a local read may
  have just put it; over a URL, bytes fetched once more), puts it together
  with its own rows, checks the whole against its stored digest and keeps the
  xxh3 of each of its rows (8 bytes a row).  Should that check fail, the block
  is read whole and the read's own rows are checked against it, so the error
  still names them.  Every read from then on -- any rows,
  by any I/O thread or worker process -- is checked row by row against those
  (:func:`~h5stream.memory.rawio.first_mismatch`), right after it lands, while the rows are still in
  the CPU's cache.  A read that holds a whole block learns it from its own
  rows and reads nothing again.  Checking each block once (``every_read=False``:
  ``verify_reads="once"`` on a local file), nothing reads a learned block's row
  digests, so a block learned around a read's rows is checked with one digest of
  the whole and keeps none (no step per row: the first batch of a store of many
  small rows learns a block of 65,536 rows for each unit of 8,192 it reads).
* **Labels** are small (8 bytes a row): each label read is widened to whole
  blocks and every block checked against its digest (:meth:`BlockCheck.labels`).

* **Images, by row.**  A store with row digests (``/row_digests``, see :mod:`h5stream.store.rowdigest`) is
  checked at the granularity it is read: every row read is checked against its own digest right after it
  lands, and nothing is read twice.  ``"once"`` checks each row on its first read (a flag per row says which
  are checked): a read reads the digests of its own unchecked rows alongside (8 bytes a row, contiguous, through
  the same byte source) and keeps none.  ``True`` (and a URL under ``"once"``) checks every read: the first read
  that touches a block reads the block's row digests, kept (8 bytes a row) for the reads after it.

Blocks without a trusted digest (a store written without checksums, a last
block whose digests are for another row count) are not checked.  A mismatch
raises :class:`~h5stream.errors.ChecksumError` before any row of the read is
handed out.

Worker processes check rows with the same :func:`h5stream.memory.rawio.first_mismatch`
and :meth:`ChecksumError.for_rows <h5stream.errors.ChecksumError.for_rows>`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence

import numpy as np
import xxhash

from h5stream.memory.rawio import aligned_empty, first_mismatch
from h5stream.errors import ChecksumError
from h5stream.read.runs import chunk_pieces

ReadBlock = Callable[[int, int, memoryview], None]
"""``read_block(start, stop, out)``: read the image bytes of rows ``[start, stop)`` (one block) into ``out``."""


MAX_BUFFERS = 4
"""Block-sized buffers a :class:`BlockCheck` makes at most (one per read in flight that learns a block)."""


def checks_every_read(verify: bool | str, remote: bool) -> bool:
    """Whether every read of a learned block is checked row by row (pure): with ``verify_reads=True``, and with
    ``"once"`` for a store read from a URL.  ``"once"`` trusts a block already checked because a local file's
    bytes stay put; a URL's are fetched again on every read, from a server or proxy that may serve other bytes
    under the same ETag, and they are in memory anyway, so checking them costs one hash per row."""
    return verify is True or (verify == "once" and remote)


def check_buffers(max_in_flight: int) -> int:
    """Block-sized buffers a :class:`BlockCheck` may make for a source keeping ``max_in_flight`` reads going."""
    return min(MAX_BUFFERS, max(2, int(max_in_flight)))


def check_memory_bytes(rows: int, block_rows: int, row_bytes: int, max_in_flight: int, *, by_row: bool = False,
                       every_read: bool = True) -> int:
    """What a :class:`BlockCheck` over a store of ``rows`` rows holds at most (pure): five small per-block arrays
    (19 bytes a block); by row (``by_row``: a store with row digests) under ``"once"`` (not ``every_read``) a
    flag per row, which rows were checked (1 byte); else a digest per row (8 bytes) and, by blocks only,
    :func:`check_buffers` block-sized buffers to learn blocks with (page-aligned, so a page more each)."""
    n_blocks = -(-int(rows) // int(block_rows)) if rows else 0
    per_row = 1 if by_row and not every_read else 8
    buffers = 0 if by_row else check_buffers(max_in_flight) * (int(block_rows) * int(row_bytes) + 4096)
    return int(rows) * per_row + n_blocks * 19 + buffers


ReadRowDigests = Callable[[int, int], np.ndarray]
"""``read_row_digests(start, stop)``: the stored digests (uint64) of rows ``[start, stop)``, read from the store."""


class BlockCheck:
    """A store's trusted block digests, the row digests of the blocks learned so far, and the checks of reads.

    ``image_digests`` / ``label_digests``: uint64 per block; ``trusted``: bool
    per block, False where the store has no digest to trust.  Keeps at most
    ``max_buffers`` block-sized buffers for :meth:`learn`, made on first use.
    ``every_read=False`` checks the images of a block on its first read only
    (the read that learns it); labels are checked on every read either way.
    ``row_digests``: where the store keeps a digest per row, what reads them (:data:`ReadRowDigests`); a block
    is then learned by reading its rows' digests, and each row read is checked against its own
    (:attr:`by_row`).

    Thread-safety: every method may run on several I/O threads at once.  A
    thread that needs a block another thread is learning waits for that read
    (which ends, failed or not, within the source's own timeouts) instead of
    reading it again; a block counts as learned only once its row digests are in.
    """

    def __init__(self, path: str, rows: int, block_rows: int, row_bytes: int, image_digests: np.ndarray,
                 label_digests: np.ndarray, trusted: np.ndarray, *, max_buffers: int = 2, every_read: bool = True,
                 row_digests: ReadRowDigests | None = None):
        self.path = path
        self.rows = int(rows)
        self.block_rows = int(block_rows)
        self.row_bytes = int(row_bytes)
        self._images = np.asarray(image_digests, np.uint64)
        self._labels = np.asarray(label_digests, np.uint64)
        self.trusted = np.asarray(trusted, bool)
        self.every_read = bool(every_read)
        # Pages untouched until their blocks are learned.  None by row under "once": each read reads its own rows'
        # digests alongside it and keeps none (a digest is needed only until its row was checked).
        self.row_digests = None if row_digests is not None and not self.every_read else np.zeros(self.rows, np.uint64)
        self._learned = np.zeros(len(self.trusted), bool)
        self._buffers: queue.Queue = queue.Queue()
        self._made = 0
        self._max_buffers = max(1, int(max_buffers))
        self._lock = threading.Lock()
        self._learning: dict[int, threading.Event] = {}  # block -> set when the thread learning it is done
        self.learned_bytes = 0  # bytes read again to learn blocks
        self._read_row_digests = row_digests
        # By row under "once": which rows were checked, and the blocks whose every row was.
        self._checked = np.zeros(self.rows, bool) if row_digests is not None and not self.every_read else None
        self._done = np.zeros(len(self.trusted), bool)
        self.digest_bytes = 0  # bytes of row digests read

    @property
    def by_row(self) -> bool:
        """Whether rows are checked against their own stored digests (a store with ``/row_digests``)."""
        return self._read_row_digests is not None

    @classmethod
    def from_digests(cls, path: str, rows: int, block_rows: int, row_bytes: int, digests, **kw) -> BlockCheck | None:
        """From :func:`h5stream.store.checksum.trusted_digests`' list (``None`` per untrusted block); None when
        there is nothing to check (no checksums, or none trusted)."""
        if not digests or all(d is None for d in digests):
            return None
        trusted = np.array([d is not None for d in digests], bool)
        images = np.array([0 if d is None else d[0] for d in digests], np.uint64)
        labels = np.array([0 if d is None else d[1] for d in digests], np.uint64)
        return cls(path, rows, block_rows, row_bytes, images, labels, trusted, **kw)

    def image_digest(self, block: int) -> int:
        """The trusted digest of ``block``'s images (an encoded store's: of its encoded rows)."""
        return int(self._images[block])

    # -- geometry --------------------------------------------------------------------
    def span(self, block: int) -> tuple[int, int]:
        """Rows ``[start, stop)`` of ``block``."""
        start = block * self.block_rows
        return start, min(self.rows, start + self.block_rows)

    def blocks(self, src: int, n: int) -> range:
        """The blocks rows ``[src, src + n)`` touch."""
        return range(src // self.block_rows, (src + n - 1) // self.block_rows + 1) if n > 0 else range(0)

    def widen(self, src: int, n: int) -> tuple[int, int] | None:
        """Rows ``[src, src + n)`` widened to whole blocks, or None when no block of them is trusted."""
        blocks = self.blocks(src, n)
        if not self.trusted[blocks.start:blocks.stop].any():
            return None
        return self.span(blocks.start)[0], self.span(blocks.stop - 1)[1]

    # -- images ----------------------------------------------------------------------
    def learn(self, block: int, read_block: ReadBlock, have: tuple[int, Sequence] | None = None) -> bool:
        """Read ``block`` whole with ``read_block``, check it against its digest and keep its rows' digests.
        ``have``: ``(first_row, views)``, rows of the block already read (one view per row, in order), so only
        the rest of the block is read.  No-op for a block learned before or not trusted.  Raises
        :class:`ChecksumError` on a mismatch.  Without ``every_read`` a block learned from ``have`` keeps no
        row digests (nothing asks for them: its rows were checked with it); True then, and for a block learned
        before (trusted), so the caller checks nothing more; False when its rows are to be checked against the
        row digests kept.  (A store with row digests: its stored digests are loaded, and False.)"""
        if self._read_row_digests is not None:
            if self.row_digests is not None:  # every read checked: the block's digests kept
                self._once(block, lambda: self._load(block))
            return False
        return self._once(block, lambda: self._learn(block, read_block, have))

    def _once(self, block: int, learn: Callable[[], bool | None]) -> bool:
        """Run ``learn`` (which sets the block learned) unless ``block`` is learned or not trusted; a thread that
        finds another learning the block waits for it instead of reading it again.  What ``learn`` returns, or
        for a block learned before (or not trusted) whether no read of it needs checking again."""
        while True:
            if not self.trusted[block] or self._learned[block]:
                return not self.every_read
            with self._lock:
                if self._learned[block]:  # learned since the look above (flag set before the event goes)
                    return not self.every_read
                busy = self._learning.get(block)
                if busy is None:
                    mine = self._learning[block] = threading.Event()
            if busy is None:
                break
            busy.wait()  # then learned, or that read failed and this thread reads the block itself
        try:
            return bool(learn())
        finally:
            with self._lock:
                del self._learning[block]
            mine.set()

    def _load(self, block: int) -> None:
        """Read the stored digests of ``block``'s rows (see :meth:`learn`: once)."""
        start, stop = self.span(block)
        self.row_digests[start:stop] = self._read_row_digests(start, stop)
        with self._lock:
            self.digest_bytes += (stop - start) * 8
        self._learned[block] = True

    def _rows(self, src: int, views: Sequence) -> None:
        """:meth:`images` of a store checked by row: each row read (not None) against its own digest, under
        ``"once"`` only the rows not checked before."""
        n = len(views)
        for block in self.blocks(src, n):
            if not self.trusted[block] or self._done[block]:
                continue
            start, stop = self.span(block)
            a, b = max(src, start), min(src + n, stop)
            rows = np.array([r for r in range(a, b) if views[r - src] is not None], np.int64)
            if self._checked is not None:
                rows = rows[~self._checked[rows]]
            if not len(rows):
                continue
            bad = first_mismatch([views[r - src] for r in rows.tolist()], self._digests_of(block, rows))
            if bad >= 0:
                raise ChecksumError.for_rows(self.path, int(rows[bad]), int(rows[bad]), "images", block)
            if self._checked is not None:
                self._checked[rows] = True
                if self._checked[start:stop].all():
                    self._done[block] = True

    def _digests_of(self, block: int, rows: np.ndarray) -> np.ndarray:
        """The stored digests of ``rows`` (sorted, all in ``block``): kept ones (:meth:`learn`), or, by row under
        ``"once"``, read now, one piece per run of consecutive rows."""
        if self.row_digests is not None:
            self.learn(block, None)
            return self.row_digests[rows]
        runs = np.split(rows, np.flatnonzero(np.diff(rows) != 1) + 1)
        out = np.concatenate([self._read_row_digests(int(r[0]), int(r[-1]) + 1) for r in runs])
        with self._lock:
            self.digest_bytes += len(rows) * 8
        return out

    def to_check(self, row_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """``(digests, checked)`` of rows ``row_ids`` for a reader elsewhere (a worker process) to check them by,
        or None where it checks nothing: :meth:`expected` with ``every_read``; by row under ``"once"``, the rows
        not checked before, counted as checked from here on (a mismatch there fails the stream).  The rows'
        blocks must have been learned (:meth:`learn_rows`).  Reader thread."""
        if self.every_read:
            return self.expected(row_ids)
        if self._checked is None:
            return None  # learning the blocks checked them
        row_ids = np.asarray(row_ids, np.int64)
        checked = self.trusted[row_ids // self.block_rows] & ~self._checked[row_ids]
        digests = np.zeros(len(row_ids), np.uint64)
        want = np.flatnonzero(checked)
        if len(want):  # read the digests of the rows to check, block by block
            order = want[np.argsort(row_ids[want], kind="stable")]
            blocks = row_ids[order] // self.block_rows
            for part in np.split(order, np.flatnonzero(np.diff(blocks)) + 1):
                digests[part] = self._digests_of(int(row_ids[part[0]]) // self.block_rows, row_ids[part])
        self._checked[row_ids] = True
        return digests, checked

    def _learn(self, block: int, read_block: ReadBlock, have: tuple[int, Sequence] | None) -> bool:
        start, stop = self.span(block)
        rb = self.row_bytes
        buf = self._take()
        try:
            view = memoryview(buf)[:(stop - start) * rb]
            if have is not None:
                try:
                    self._learn_around(block, view, read_block, *have)
                    return not self.every_read
                except ChecksumError:
                    pass  # read the block whole: the rows already read are then checked row by row, by name
            self._read_rows(start, stop, start, view, read_block)
            self._record(block, [view[i * rb:(i + 1) * rb] for i in range(stop - start)])
            return False
        finally:
            self._buffers.put(buf)

    def _learn_around(self, block: int, view: memoryview, read_block: ReadBlock, first: int,
                      views: Sequence) -> None:
        """Learn ``block`` into its buffer ``view`` from ``views``, rows ``first, first + 1, ...`` already read,
        and the rest of the block, read before and after them: a remote source then fetches the block once more
        in part instead of whole.  Without ``every_read``, one digest of the whole buffer (no row digests)."""
        start, stop = self.span(block)
        rb = self.row_bytes
        end = first + len(views)
        at = (first - start) * rb
        for v in views:
            view[at:at + rb] = _byte_view(v)
            at += rb
        self._read_rows(start, first, start, view, read_block)
        self._read_rows(end, stop, start, view, read_block)
        if not self.every_read:
            if xxhash.xxh3_64_intdigest(view) != int(self._images[block]):
                raise ChecksumError.for_rows(self.path, start, stop - 1, "images", block)
            self._learned[block] = True
            return
        self._record(block, [view[i * rb:(i + 1) * rb] for i in range(stop - start)])

    def _read_rows(self, a: int, b: int, start: int, view: memoryview, read_block: ReadBlock) -> None:
        """Read rows ``[a, b)`` into their place in a block buffer (``view``, whose first row is ``start``)."""
        if b <= a:
            return
        rb = self.row_bytes
        read_block(a, b, view[(a - start) * rb:(b - start) * rb])
        with self._lock:
            self.learned_bytes += (b - a) * rb

    def learn_rows(self, src: int, n: int, read_block: ReadBlock) -> None:
        """:meth:`learn` every block rows ``[src, src + n)`` touch."""
        for block in self.blocks(src, n):
            self.learn(block, read_block)

    def quiet(self, src: int, n: int) -> bool:
        """Whether :meth:`images` of rows ``[src, src + n)`` would check nothing: no block of them trusted, or
        (checking each block once) every trusted one checked already.  Any thread."""
        if self.every_read:
            return False
        if self._read_row_digests is None:
            return all(self._learned[b] or not self.trusted[b] for b in self.blocks(src, n))
        if all(self._done[b] or not self.trusted[b] for b in self.blocks(src, n)):
            return True
        return bool(self._checked[src:src + n].all())  # rows checked one by one (not every row of their blocks)

    def images(self, src: int, views: Sequence, read_block: ReadBlock) -> None:
        """Check rows ``src, src + 1, ...`` just read: ``views[i]`` holds the bytes of row ``src + i``, or is
        None for a row read but not used (not checked).  Blocks not learned yet are learned first (from these
        views where they hold the whole block).  Raises :class:`ChecksumError` naming the first bad rows."""
        if self._read_row_digests is not None:
            self._rows(src, views)
            return
        n = len(views)
        for block in self.blocks(src, n):
            if not self.trusted[block]:
                continue
            start, stop = self.span(block)
            a, b = max(src, start), min(src + n, stop)
            mine = views[a - src:b - src]
            if self._learned[block]:
                if not self.every_read:
                    continue
            elif (a, b) == (start, stop) and all(v is not None for v in mine):
                self._record(block, mine)
                continue  # checked whole against the stored digest
            elif self.learn(block, read_block, (a, mine) if all(v is not None for v in mine) else None):
                continue  # checked with the block it was learned from
            whole = all(v is not None for v in mine)
            if not whole:
                served = [i for i, v in enumerate(mine) if v is not None]
                bad = first_mismatch([mine[i] for i in served], self.row_digests[[a + i for i in served]])
                bad = served[bad] if bad >= 0 else -1
            else:
                bad = first_mismatch(mine, self.row_digests[a:b])
            if bad >= 0:
                raise ChecksumError.for_rows(self.path, a + bad, a + bad, "images", block)

    def _record(self, block: int, rows: Sequence) -> None:
        """Check ``rows`` (the whole block, in order) against the block's digest; keep each row's digest."""
        start, stop = self.span(block)
        whole = xxhash.xxh3_64()
        digests = []
        for r in rows:  # row by row, so the second hash of a row finds it in the CPU's cache
            whole.update(r)
            digests.append(xxhash.xxh3_64_intdigest(r))
        if whole.intdigest() != int(self._images[block]):
            raise ChecksumError.for_rows(self.path, start, stop - 1, "images", block)
        self.row_digests[start:stop] = digests
        self._learned[block] = True

    def expected(self, row_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(digests, checked)`` of rows ``row_ids``, for a reader elsewhere (a worker process): the rows of
        trusted blocks must have been learned (see :meth:`learn_rows`)."""
        row_ids = np.asarray(row_ids, np.int64)
        checked = self.trusted[row_ids // self.block_rows]
        return self.row_digests[row_ids], checked

    def _take(self) -> np.ndarray:
        """A block buffer: a free one, a new one while fewer than ``max_buffers`` exist, else wait for one
        (a learning read in another thread gives it back when it ends, failed or not)."""
        try:
            return self._buffers.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            make = self._made < self._max_buffers
            self._made += make
        if make:
            return aligned_empty(self.block_rows * self.row_bytes)  # page-aligned: O_DIRECT reads land in place
        return self._buffers.get()

    # -- labels ----------------------------------------------------------------------
    def labels(self, start: int, labels: np.ndarray) -> None:
        """Check labels of rows ``[start, start + len(labels))``, whole blocks (as :meth:`widen` gives), in the
        store's dtype.  Raises :class:`ChecksumError` for the first block that differs."""
        labels = np.asarray(labels)
        if labels.dtype.byteorder == ">":
            labels = labels.astype(labels.dtype.newbyteorder("<"))
        for block in self.blocks(start, len(labels)):
            if not self.trusted[block]:
                continue
            a, b = self.span(block)
            if xxhash.xxh3_64_intdigest(np.ascontiguousarray(labels[a - start:b - start])) != int(self._labels[block]):
                raise ChecksumError.for_rows(self.path, a, b - 1, "labels", block)


def _byte_view(row) -> memoryview:
    """A row (a memoryview or a C-contiguous array) as a flat memoryview of its bytes."""
    m = memoryview(row)
    return m if m.ndim == 1 and m.format == "B" else m.cast("B")


def row_digest_reader(source, chunks: tuple[np.ndarray, int] | None) -> ReadRowDigests | None:
    """What reads stored row digests by byte offset through ``source`` (the stream's byte source: a file,
    direct I/O, a URL), from ``chunks``, :attr:`Locations.row_digests <h5stream.read.locate.Locations>`; None
    for a store without them.  Runs on whichever thread checks (an I/O thread or the reader thread)."""
    if chunks is None:
        return None
    offsets, chunk_rows = chunks

    def read(start: int, stop: int) -> np.ndarray:
        out = np.empty(stop - start, np.uint64)
        view = memoryview(out.view(np.uint8))
        for first, chunk, within, m in chunk_pieces(start, stop - start, chunk_rows):
            source.readinto(int(offsets[chunk]) + within * 8, [view[first * 8:(first + m) * 8]])
        return out

    return read
