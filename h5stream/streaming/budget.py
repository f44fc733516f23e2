"""The memory budget: every allocation a stream makes, counted in one place.  Pure arithmetic, no I/O.

:func:`plan_memory` splits ``memory_budget`` into the parts a
:class:`StreamPlan` lists, and the feed and the worker pool allocate exactly
the counts the plan names (``reader_batches``, ``input_slots``,
``out_slots``, ``lent_slots``, ``consumer_sets``), so the plan is what runs:

* **batches** -- ``reader_batches`` batches of stored rows (pixels, labels,
  row ids, file offsets): those of two fills (one being handed out while the
  next is read; a fill touches one batch more than it fills), the queue, and
  :data:`HANDED_OUT` more.  Rows are read straight into them, so they are the
  shuffle buffer.  With workers they live in the shared input ring, which
  has one more slot per output slot (a task keeps its input until its result
  is taken);
* **fill index** -- per row of the two fills, where it lands and what it is;
* **output** -- with augmentation, ``consumer_sets`` arrays of the output
  dtype recycled on the consumer side (and the encoded labels);
* **workers** -- each worker's measured fixed cost and its gather buffer,
  the output slots, the input ring's slots for tasks, and once the library
  code they load and multiprocessing's resource tracker;
* **transform** -- augmenting in the training process instead: the library
  it loads and the heap it grows there;
* **label cache** -- every label, when they take at most 1/16 of the budget;
* **bookkeeping** -- a fixed allowance plus the chunk offsets and the
  epoch's segment table;
* **remote client** -- for a store read from a URL, what the client holds
  (its library, connections, pieces of responses in flight);
* **JPEG reads** -- for an encoded store, the committed rows' ends, a block
  of encoded bytes per read in flight and a row per decoder
  (:func:`h5stream.read.encbytes.encoded_read_bytes`);
* **direct I/O** -- for a store read past the page cache (``direct_io``),
  the bounce buffers of the reads in flight;
* **checksums** -- with ``verify_reads`` on a store that has checksums, a
  digest per row and the block buffers of the check
  (:func:`h5stream.read.verify.check_memory_bytes`);
* **chunk cache** -- for a store whose chunks split images (laid out by
  another tool), the HDF5 chunk cache that reads each band of chunks once.
* **piece window** -- for a URL read in the two-level order
  (``piece_bytes``), the whole pieces held in memory
  (:func:`h5stream.order.twolevel.window_pieces_bytes`), with the remote
  client's share.

The fill size ``rows_per_fill`` is whatever the budget leaves after
everything else, in whole blocks; a budget that cannot hold one batch per
fill and two queued batches raises :class:`BudgetError` naming the minimum.

Without a budget (``None``) the plan takes :data:`DEFAULT_BUDGET_BYTES` for
reading and shuffling and gives augmentation (workers or the inline
transform), a remote client, JPEG reads, direct I/O and the checksums their shares on top, so adding
workers, or reading the same file from a URL or past the page cache, neither
fails nor changes the epoch order.
With a budget, those shares come out of it, and the order depends on the
worker count through ``rows_per_fill``; a caller that needs the same order
whatever the workers (or the budget) fixes ``rows_per_fill`` instead, and the
plan checks that it fits.  A URL gets its local file's fill under the same
budget, or :class:`BudgetError` when the client does not fit beside it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


from h5stream import _optnames as opt
from h5stream.errors import BudgetError, ConfigError
from h5stream.read.plan import budget_error, format_bytes, mib_at_least

DEFAULT_BUDGET_BYTES = 256 << 20
"""Memory for reading and shuffling when no budget is given; augmentation gets its share on top."""

BOOKKEEPING_BYTES = 6 << 20
"""Fixed allowance for Python objects, thread stacks, HDF5's metadata and small arrays."""

MAX_QUEUE_DEPTH = 16

FILLS = 2
"""Fills in memory at once: one being handed out, the next being read."""

HANDED_OUT = 2
"""Reader batches beyond the fills and the queue: one being handed to the consumer, one it still holds."""

FILL_INDEX_ROW_BYTES = 48
"""Per row of a fill, besides its label: the batch and offset it lands at, its row id and file offset (int64
each), and the temporaries of laying the fill out.  A fill read into its batches by address keeps a 16-byte
``struct iovec`` a row instead of file offsets (:mod:`h5stream.read.iovec`), within the same bytes (the rare fill
that has both, some batches read here and some by workers, takes the temporaries' share)."""

BATCH_INDEX_ROW_BYTES = 16
"""Per row of a batch, besides pixels and label: its row id and file offset (int64 each)."""

CONSUMER_SETS = 4
"""Output arrays recycled on the consumer side (augmented batches in the consumer's hands)."""

LENT_SLOTS = 2
"""Output slots a pooled feed hands to the consumer without copying; batches it keeps beyond these are copies."""

KEPT_SLOTS = 1
"""Lent output slots a consumer may keep for good (a batch still held :data:`LENT_SLOTS` batches later, such as
``x, y = next(iter(stream))`` kept for its shapes) without making every later batch a copy: they stop
counting among the :data:`LENT_SLOTS`, and the pool runs with that many slots fewer (out of the two it holds for
finished batches, see :func:`out_slots`).  Batches kept beyond these are copies."""

WORKER_OVERHEAD_BYTES = 24 << 20
"""Private memory of one worker process besides its gather buffer: its interpreter, the heap numpy and the
h5stream modules build, its copies of library pages, and the transform's scratch arrays."""

TRANSFORM_LIBRARY_BYTES = 64 << 20
"""Library code the transform maps (OpenCV and what it loads): resident once, in the training process when it
augments there, else shared by every worker.  How much of OpenCV's 74 MB library a process maps depends on how
much of it sits in the page cache (the kernel maps cached neighbours of every page it faults in), so this is
the most seen, right after the library was installed, with room to spare."""

TRANSFORM_SCRATCH_BYTES = 8 << 20
"""Heap the transform grows in the training process when it augments there (OpenCV's state, warp scratch)."""

RESOURCE_TRACKER_BYTES = 8 << 20
"""multiprocessing's resource tracker, which the first spawned worker of an interpreter starts."""

FEEDER_IN_FLIGHT = 2
"""Batches a feeder process (``open(..., feeder=True)``) keeps on their way to the training process: output
slots on top of :func:`out_slots`, answered or being made while the consumer trains on the one before."""

FEEDER_OVERHEAD_BYTES = 48 << 20
"""Private memory of the feeder process besides what the plan counts anyway (its batches, fill index, label
cache and the byte source's buffers, which it holds instead of the training process): an interpreter with
numpy, h5py and HDF5 loaded, and its copies of library pages (what it was sized from: docs/performance.md,
"Design figures")."""


def out_slots(workers: int) -> int:
    """Output slots of a pool: two tasks per worker (one running, one waiting in its pipe), two finished on
    their way to the consumer, and the lent ones."""
    return 2 * workers + 2 + LENT_SLOTS if workers else 0


def whole_blocks(rows: int, block_rows: int) -> int:
    """``rows`` rounded down to whole blocks of ``block_rows``: what a given ``rows_per_fill`` becomes (pure)."""
    return int(rows) // int(block_rows) * int(block_rows)


def reader_batches(rows_per_fill: int, batch_size: int, queue_depth: int) -> int:
    """Batches of stored rows alive at once: those of :data:`FILLS` fills (each touching one batch more than it
    fills), the queue, and :data:`HANDED_OUT`."""
    return FILLS * (-(-rows_per_fill // batch_size) + 1) + queue_depth + HANDED_OUT


@dataclass(frozen=True)
class StreamPlan:
    """How a stream splits its memory budget: the counts the feed allocates by, and every allocation in bytes.

    ``total_bytes`` is the sum of the ``*_bytes`` parts (:meth:`allocations`) and never exceeds ``budget_bytes``.
    """

    budget_bytes: int
    batch_size: int
    block_rows: int
    unit_rows: int
    rows_per_fill: int
    queue_depth: int
    workers: int
    # counts the feed and the pool allocate
    reader_batches: int  # batch arrays of stored rows (the inline arena; with workers, part of the input ring)
    input_slots: int  # the pooled feed's shared input ring (0 without workers)
    out_slots: int  # the pool's shared output slots (0 without workers; FEEDER_IN_FLIGHT more with a feeder)
    lent_slots: int  # output slots lent to the consumer without a copy (0 without workers)
    consumer_sets: int  # output arrays recycled on the consumer side (0 without augmentation)
    # bytes
    batches_bytes: int
    fill_index_bytes: int
    output_bytes: int
    pool_bytes: int  # worker processes, their slots and the library they share
    transform_bytes: int  # the transform run in the training process (workers=0)
    label_cache_bytes: int  # all labels held in memory (0: read with the pixels, fill by fill)
    bookkeeping_bytes: int
    min_budget_bytes: int
    default_budget: bool = False  # no budget was given: DEFAULT_BUDGET_BYTES plus the augmentation's share
    remote_client_bytes: int = 0  # the client of a store read from a URL
    encoded_read_bytes: int = 0  # an encoded store's row ends, encoded blocks in flight and a row per decoder
    direct_io_bytes: int = 0  # the bounce buffers of reads past the page cache
    verify_bytes: int = 0  # row digests and block buffers of verify_reads
    chunk_cache_bytes: int = 0  # HDF5's chunk cache, for a store whose chunks split images
    feeder: bool = False  # reader and pool run in a feeder process (its memory is in pool_bytes)
    piece_rows: int = 0  # rows per piece of the two-level order (0: the one-level order)
    piece_window_bytes: int = 0  # pieces a URL holds in memory under the two-level order

    def allocations(self) -> dict[str, int]:
        """Every part of the plan, in bytes, by name."""
        return {"batches": self.batches_bytes, "fill index": self.fill_index_bytes, "output": self.output_bytes,
                "workers": self.pool_bytes, "transform": self.transform_bytes, "label cache": self.label_cache_bytes,
                "bookkeeping": self.bookkeeping_bytes, "remote client": self.remote_client_bytes,
                "JPEG reads": self.encoded_read_bytes, "direct I/O": self.direct_io_bytes,
                "checksums": self.verify_bytes, "chunk cache": self.chunk_cache_bytes,
                "piece window": self.piece_window_bytes}

    @property
    def total_bytes(self) -> int:
        return sum(self.allocations().values())

    @property
    def augment_bytes(self) -> int:
        """What augmentation takes besides its output arrays: the workers, or the transform run inline."""
        return self.pool_bytes + self.transform_bytes

    @property
    def blocks_per_fill(self) -> int:
        return self.rows_per_fill // self.block_rows

    @property
    def n_buffers(self) -> int:
        return FILLS

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(total_bytes=self.total_bytes, blocks_per_fill=self.blocks_per_fill, n_buffers=FILLS)
        return d

    def describe(self) -> str:
        """One line: the budget and how it is split.  A budget given in SI units (``"1GB"``) is stated as such
        with its binary size (``1 GB = 10^9 bytes = 953.7 MiB``): every figure after it is binary (MiB)."""
        budget = format_bytes(self.budget_bytes)
        si = _si_bytes(self.budget_bytes)
        if si is not None and not self.default_budget:
            budget = f"{si} = {budget}; MB/GB are powers of 1000, MiB/GiB of 1024"
        if self.default_budget:
            share = ""
            if self.workers:
                share = f" + {format_bytes(self.augment_bytes)} for {self.workers} workers"
            elif self.transform_bytes:
                share = f" + {format_bytes(self.augment_bytes)} for augmentation"
            if self.remote_client_bytes:
                share += f" + {format_bytes(self.remote_client_bytes)} for the remote client"
            if self.encoded_read_bytes:
                share += f" + {format_bytes(self.encoded_read_bytes)} for JPEG reads"
            if self.direct_io_bytes:
                share += f" + {format_bytes(self.direct_io_bytes)} for direct I/O"
            if self.verify_bytes:
                share += f" + {format_bytes(self.verify_bytes)} for checksums"
            if self.chunk_cache_bytes:
                share += f" + {format_bytes(self.chunk_cache_bytes)} for HDF5's chunk cache"
            if self.piece_window_bytes:
                share += f" + {format_bytes(self.piece_window_bytes)} for the window of pieces"
            reading = (self.budget_bytes - self.augment_bytes - self.remote_client_bytes - self.encoded_read_bytes
                       - self.direct_io_bytes - self.verify_bytes - self.chunk_cache_bytes - self.piece_window_bytes)
            budget += f" (default: {format_bytes(reading)} for reading{share})"
        parts = ", ".join(f"{name} {format_bytes(n)}" for name, n in self.allocations().items() if n)
        pieces = f", two-level order in pieces of {self.piece_rows} rows" if self.piece_rows else ""
        return (f"budget {budget}: {FILLS} fills x {self.rows_per_fill} rows "
                f"({self.rows_per_fill // self.unit_rows} units of {self.unit_rows}{pieces}), "
                f"{self.reader_batches} batches of {self.batch_size} in memory ({self.queue_depth} queued); {parts}")


def _si_bytes(n: int) -> str | None:
    """``"1 GB = 10^9 bytes"`` for a whole number of SI megabytes that is no whole number of MiB, else None."""
    n = int(n)
    if n % 10**6 or not n % (1 << 20):
        return None
    exponent, unit = next((e, u) for e, u in ((12, "TB"), (9, "GB"), (6, "MB")) if n >= 10**e)
    value = n / 10**exponent
    return f"1 {unit} = 10^{exponent} bytes" if value == 1 else f"{value:g} {unit} = {value:g} x 10^{exponent} bytes"


def plan_memory(
    budget_bytes: int | None,
    *,
    rows: int,
    row_bytes: int,
    label_row_bytes: int,
    block_rows: int,
    batch_size: int,
    out_row_bytes: int | None = None,
    out_label_row_bytes: int = 0,
    augment: bool = False,
    workers: int = 0,
    unit_rows: int | None = None,
    rows_per_fill: int | None = None,
    epoch_rows: int | None = None,
    remote_client_bytes: int = 0,
    encoded_read_bytes: int = 0,
    direct_io_bytes: int = 0,
    verify_bytes: int = 0,
    chunk_cache_bytes: int = 0,
    feeder: bool = False,
    piece_window_bytes: int = 0,
) -> StreamPlan:
    """Split ``budget_bytes`` between everything a stream over a store of ``rows`` rows allocates.

    ``budget_bytes=None``: :data:`DEFAULT_BUDGET_BYTES` plus augmentation's share (see the module doc).
    ``augment``: batches are transformed, in the training process or in ``workers`` processes (which copy rows
    without it); ``out_row_bytes`` is one output row (differs from ``row_bytes`` when augmentation emits
    float32); ``out_label_row_bytes`` is what a yielded label takes besides the stored one (a one-hot row, say).
    ``rows_per_fill`` fixes the fill size (rounded down to whole blocks, at most the epoch) instead of taking what
    the budget leaves;
    :class:`BudgetError` if it does not fit.  ``epoch_rows`` (default
    ``rows``) is how many contiguous rows an epoch covers when it streams part
    of the file (a validation split).  ``remote_client_bytes``: what the client of
    a store read from a URL holds, on top of the default budget like
    augmentation's share, out of a given one; ``encoded_read_bytes`` likewise, what reading an encoded store's
    rows holds; ``direct_io_bytes`` likewise, the bounce buffers of reads past
    the page cache, ``verify_bytes``, what checking reads against the block checksums holds, and
    ``chunk_cache_bytes``, HDF5's chunk cache for a store whose chunks split images, and
    ``piece_window_bytes``, the pieces a URL read in the two-level order holds
    (:func:`h5stream.order.twolevel.window_pieces_bytes`).
    ``feeder`` (with ``workers``): the reader and the pool run in a feeder process, whose own memory
    (:data:`FEEDER_OVERHEAD_BYTES`) and :data:`FEEDER_IN_FLIGHT` more output slots count with the workers.
    """
    if batch_size < 1:
        raise ConfigError(f"{opt.name('batch_size')} must be >= 1, got {batch_size}")
    transforms, augment = bool(augment), bool(augment or workers)  # workers without a transform copy rows
    bs = int(batch_size)
    out_row_bytes = row_bytes if out_row_bytes is None else out_row_bytes
    epoch_rows = rows if epoch_rows is None else int(epoch_rows)
    unit_rows = int(unit_rows or block_rows)
    n_blocks = -(-rows // block_rows) if rows else 0
    # Blocks one epoch touches: a part of the file that starts inside a block touches one more.
    epoch_blocks = n_blocks if epoch_rows >= rows else min(n_blocks, -(-epoch_rows // block_rows) + 1)
    n_units = -(-epoch_rows // unit_rows) + (1 if epoch_rows < rows else 0)
    bookkeeping = BOOKKEEPING_BYTES + n_blocks * 8 + n_units * 48  # chunk offsets; segment table + fill schedule

    batch_bytes = bs * (row_bytes + label_row_bytes + BATCH_INDEX_ROW_BYTES)
    fill_row_bytes = label_row_bytes + FILL_INDEX_ROW_BYTES
    consumer_sets = CONSUMER_SETS if augment or out_label_row_bytes else 0
    output = consumer_sets * bs * ((out_row_bytes if augment else 0) + out_label_row_bytes)
    feeder = bool(feeder and workers)
    n_out = out_slots(workers) + (FEEDER_IN_FLIGHT if feeder else 0)
    pool = transform = 0
    if workers:
        pool = (workers * (WORKER_OVERHEAD_BYTES + bs * row_bytes) + RESOURCE_TRACKER_BYTES
                + (TRANSFORM_LIBRARY_BYTES if transforms else 0)
                + n_out * (batch_bytes + bs * out_row_bytes)  # an input slot per output slot, and the output slot
                + (FEEDER_OVERHEAD_BYTES if feeder else 0))
    elif augment:
        transform = TRANSFORM_LIBRARY_BYTES + TRANSFORM_SCRATCH_BYTES
    client = (int(remote_client_bytes) + int(encoded_read_bytes) + int(direct_io_bytes) + int(verify_bytes)
              + int(chunk_cache_bytes) + int(piece_window_bytes))  # what the byte source holds
    fixed = bookkeeping + output + pool + transform + client

    def total(fill_rows: int, depth: int, label_cache: int = 0) -> int:
        return (fixed + label_cache + reader_batches(fill_rows, bs, depth) * batch_bytes
                + FILLS * fill_rows * fill_row_bytes)

    min_rows = -(-bs // block_rows) * block_rows  # a fill holds at least one batch
    most_rows = max(1, epoch_blocks) * block_rows
    min_budget = total(min_rows, 2)
    default = budget_bytes is None
    if default:
        budget_bytes = max(DEFAULT_BUDGET_BYTES + pool + transform + client, min_budget)
    if budget_bytes < min_budget:
        raise budget_error(budget_bytes, min_budget, f"{opt.setting('batch_size', bs)}, {block_rows}-row blocks"
                           + (f" and {workers} workers" if workers else ""))
    # What augmentation leaves is the memory for reading; the queue and the label cache are sized from it.
    reading = budget_bytes - pool - transform - client
    label_bytes = rows * label_row_bytes
    label_cache = label_bytes if label_bytes <= reading // 16 and min_budget + label_bytes <= budget_bytes else 0

    def most_fill(depth: int) -> int:
        """The largest fill (whole blocks, at least min_rows, at most the epoch's) that fits; min_rows if none."""
        lo, hi = min_rows // block_rows, most_rows // block_rows
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if total(mid * block_rows, depth, label_cache) <= budget_bytes else (lo, mid - 1)
        return lo * block_rows

    fixed_fill = None
    if rows_per_fill is not None:
        if isinstance(rows_per_fill, bool) or int(rows_per_fill) < 1:
            raise ConfigError(f"{opt.name('rows_per_fill')} must be a positive number of rows, got {rows_per_fill!r}")
        fixed_fill = max(min_rows, min(whole_blocks(rows_per_fill, block_rows), most_rows))
        if total(fixed_fill, 2, label_cache) > budget_bytes:
            most = most_fill(2)
            need = total(fixed_fill, 2)
            raise BudgetError(
                f"{opt.setting('rows_per_fill', rows_per_fill)} needs a memory budget of about {format_bytes(need)}"
                + (f" with {workers} workers" if workers else "")
                + f"; this budget ({format_bytes(budget_bytes)}) holds at most {most} rows per fill: "
                f"raise {opt.name('memory_budget')} to {opt.value('memory_budget', mib_at_least(need))} or lower "
                f"{opt.name('rows_per_fill')}"
            )
    # Queue: about a tenth of the reading memory, between 2 and MAX_QUEUE_DEPTH batches, shrunk until the
    # smallest fill (or the fixed one) fits.
    queue_depth = int(max(2, min(MAX_QUEUE_DEPTH, (reading // 10) // max(1, batch_bytes))))
    while queue_depth > 2 and total(fixed_fill or min_rows, queue_depth, label_cache) > budget_bytes:
        queue_depth -= 1
    fill = fixed_fill if fixed_fill is not None else most_fill(queue_depth)
    n_batches = reader_batches(fill, bs, queue_depth)
    return StreamPlan(
        budget_bytes=int(budget_bytes),
        batch_size=bs,
        block_rows=int(block_rows),
        unit_rows=unit_rows,
        rows_per_fill=int(fill),
        queue_depth=queue_depth,
        workers=int(workers),
        reader_batches=n_batches,
        input_slots=n_batches + n_out if workers else 0,
        out_slots=n_out,
        lent_slots=LENT_SLOTS if workers else 0,
        consumer_sets=consumer_sets,
        batches_bytes=int(n_batches * batch_bytes),
        fill_index_bytes=int(FILLS * fill * fill_row_bytes),
        output_bytes=int(output),
        pool_bytes=int(pool),
        transform_bytes=int(transform),
        label_cache_bytes=int(label_cache),
        bookkeeping_bytes=int(bookkeeping),
        min_budget_bytes=int(min_budget),
        default_budget=default,
        remote_client_bytes=int(remote_client_bytes),
        encoded_read_bytes=int(encoded_read_bytes),
        direct_io_bytes=int(direct_io_bytes),
        verify_bytes=int(verify_bytes),
        chunk_cache_bytes=int(chunk_cache_bytes),
        feeder=feeder,
        piece_window_bytes=int(piece_window_bytes),
    )
