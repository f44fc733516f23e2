"""The plan of a stream over one store: :func:`~h5stream.streaming.budget.plan_memory` asked with the store's
sizes and the stream's options, and what to lower when it does not fit the budget or the machine.

:func:`plan_stream` is pure apart from reading the memory available once (``available_bytes="auto"``); the
arithmetic of every allocation is :mod:`h5stream.streaming.budget`'s.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np

from h5stream import _optnames as opt
from h5stream.concurrency.cores import suggested_workers, usable_cores
from h5stream.errors import BudgetError
from h5stream.read.plan import budget_error, default_unit_bytes, format_bytes, unit_rows_for, url_plan
from h5stream.streaming.budget import StreamPlan, plan_memory


def available_memory_bytes() -> int | None:
    """Memory this process could allocate now: ``MemAvailable`` capped by its cgroup's limit (None: unknown)."""
    from h5stream.read.source import cacheable_bytes

    return cacheable_bytes()


def plan_stream(meta, budget_bytes: int | None, batch_size: int, *, augment=None, workers: int = 0,
                rows_per_fill: int | None = None, epoch_rows: int | None = None,
                out_label_row_bytes: int = 0, direct_io: bool = False, unit_bytes: int | None = None,
                available_bytes: int | None | str = "auto", verify_reads: bool | str = False,
                chunk_cache_bytes: int = 0, feeder: bool = False, piece_bytes: int | None = None) -> StreamPlan:
    """The plan a stream over the store ``meta`` (a :class:`~h5stream.store.meta.StoreMeta`) runs by (what
    ``Stream.plan`` holds).  ``augment``: an :class:`~h5stream.Augment` or None; ``direct_io``: the store is
    read past the page cache; ``unit_bytes``: the shuffle's unit, a contiguous read (default: 1 to 4 MiB,
    :func:`~h5stream.read.plan.default_unit_bytes` of the fill and the epoch);
    ``verify_reads``: the stream's option of that name (its memory counts when the store has checksums);
    ``chunk_cache_bytes``: HDF5's chunk cache for a store whose chunks split images; ``feeder``: the reader and
    the pool run in a feeder process (``open(..., feeder=True)``); ``piece_bytes``: the two-level order's
    pieces (None: the one-level order), whose window a URL holds counts with the remote client.

    ``budget_bytes=None`` is the default budget (see :func:`plan_memory`).  A budget below the minimum raises
    :class:`BudgetError` naming the budget that fits and, where there is one, the largest worker count and the
    largest batch size that fit this budget.

    ``available_bytes``: the memory the plan may take at most, the machine's (:func:`available_memory_bytes`,
    read once) for ``"auto"``, no limit for None (a plan only reported, never allocated).  A plan that needs
    more raises :class:`BudgetError` naming the largest batch size (and budget) that fits, instead of a
    stream that fails allocating, or is killed for memory, later.  Pure apart from that one reading.
    """
    out_row_bytes = None
    if augment is not None:
        out_shape = augment.output_shape(meta.image_shape)  # output_size, or the stored size
        out_row_bytes = int(np.prod(out_shape, dtype=np.int64)) * np.dtype(augment.output_dtype()).itemsize
    client = 0
    parts = getattr(meta, "parts", ())  # a set of parts: a client per URL part (h5stream.read.partread)
    if getattr(meta, "remote", None) is not None or parts:
        from h5stream.remote.config import parts_client_memory_bytes

        client = parts_client_memory_bytes(parts or (meta,))
    encoded = local_encoded = 0
    if getattr(meta, "encoding", "raw") != "raw":
        from h5stream.read.encbytes import encoded_read_bytes
        from h5stream.read.source import LocalFile

        encoded = encoded_read_bytes(meta, workers, direct_io)
        # What the local file through the page cache holds for them: part of the local file's own plan.
        local_encoded = encoded_read_bytes(meta, workers, direct_io, in_flight=LocalFile.max_in_flight)
    direct = 0
    if direct_io:
        from h5stream.read.source import DIRECT_IO_BYTES

        direct = DIRECT_IO_BYTES
    from h5stream.read.source import DIRECT_IN_FLIGHT, LocalFile
    from h5stream.read.verify import check_buffers, check_memory_bytes, checks_every_read

    def verify_bytes(in_flight: int) -> int:
        if not verify_reads or getattr(meta, "checksum", None) is None:
            return 0
        extra = 0
        if parts:  # each part's check gets a share of the buffers, and one at least (read.partread)
            extra = max(0, len(parts) - check_buffers(in_flight)) * (meta.block_rows * meta.row_bytes + 4096)
        # A URL is counted as checked on every read (a URL through the local cache is checked once: less)
        every_read = checks_every_read(verify_reads, getattr(meta, "remote", None) is not None)
        return check_memory_bytes(meta.rows, meta.block_rows, meta.row_bytes, in_flight,
                                  by_row=getattr(meta, "row_digests", False), every_read=every_read) + extra

    remote = getattr(meta, "remote", None)
    verify = verify_bytes(remote.max_in_flight if remote is not None else DIRECT_IN_FLIGHT if direct_io
                          else LocalFile.max_in_flight)

    piece_rows = window = 0
    if piece_bytes is not None:
        from h5stream.order.twolevel import piece_rows_for, window_pieces_bytes

        piece_rows = piece_rows_for(meta.block_rows, meta.row_bytes, piece_bytes)
        if remote is not None:
            # The pieces are disjoint spans of the committed rows: the window never holds more than all of them
            # (a piece_bytes larger than the store is one piece of the store's bytes, not window_capacity of it).
            window = min(window_pieces_bytes(piece_rows, meta.row_bytes, remote.max_in_flight),
                         int(meta.rows) * int(meta.row_bytes))

    def plan(budget, workers, batch_size, fill=rows_per_fill, client=client, verify=verify, encoded=encoded,
             window=window):
        # The window of pieces belongs to the URL's client: the local file's plan (client=0) has neither.
        return plan_memory(
            budget, rows=meta.rows, row_bytes=meta.row_bytes, label_row_bytes=meta.label_row_bytes,
            block_rows=meta.block_rows, batch_size=batch_size, out_row_bytes=out_row_bytes,
            out_label_row_bytes=out_label_row_bytes, augment=augment is not None, workers=workers,
            unit_rows=unit_rows_for(meta.block_rows, meta.row_bytes, meta.compression is not None, unit_bytes),
            rows_per_fill=fill, epoch_rows=epoch_rows, remote_client_bytes=client, encoded_read_bytes=encoded,
            direct_io_bytes=direct,
            verify_bytes=verify, chunk_cache_bytes=chunk_cache_bytes, feeder=feeder,
            piece_window_bytes=window if client else 0,
        )

    def minimum(workers, batch_size):
        return plan(None, workers, batch_size, fill=None).min_budget_bytes  # independent of budget and fill

    if budget_bytes is not None and budget_bytes < minimum(workers, batch_size):
        alternatives = []
        fewer = [w for w in range(workers) if minimum(w, batch_size) <= budget_bytes]
        if fewer:  # and no more than the cores take, as the stream's warning about workers says
            w = min(fewer[-1], suggested_workers(usable_cores()))
            inline = f" ({'augment' if augment is not None else 'read'} in the training process)" if w == 0 else ""
            alternatives.append(f"use {opt.setting('workers', w)}{inline}")
        if batch_size > 1 and minimum(workers, 1) <= budget_bytes:
            lo, hi = 1, batch_size - 1  # the largest batch size that fits: the minimum grows with it
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if minimum(workers, mid) <= budget_bytes else (lo, mid - 1)
            alternatives.append(f"lower {opt.name('batch_size')} to {lo}")
        if client and window:
            smaller = _fitting_piece_bytes(budget_bytes - plan(None, workers, batch_size, fill=None,
                                                               window=0).min_budget_bytes,
                                           meta, remote.max_in_flight)
            if smaller:
                alternatives.append(f"lower {opt.name('piece_bytes')} to {smaller} ({format_bytes(smaller)})")
        raise budget_error(budget_bytes, minimum(workers, batch_size),
                           f"{opt.setting('batch_size', batch_size)}, {meta.block_rows}-row blocks"
                           + (f" and {workers} workers" if workers else "")
                           + (" and the remote client" if client else "")
                           + (" and its window of pieces" if client and window else "")
                           + (" and the JPEG rows' reads" if encoded else ""), tuple(alternatives))
    if client and budget_bytes is not None and rows_per_fill is None:  # the local file's order, or BudgetError
        # What the URL holds beyond its local file: the client, and JPEG reads with more requests in flight.
        result = url_plan(partial(plan, budget_bytes, workers, batch_size), meta.path, budget_bytes,
                          client + encoded - local_encoded, verify_bytes(LocalFile.max_in_flight), local_encoded)
    else:
        result = plan(budget_bytes, workers, batch_size)
    if unit_bytes is None and meta.compression is None:
        # The default unit grows with the fill (planned with the smallest one, whose bookkeeping is the largest).
        epoch_bytes = (meta.rows if epoch_rows is None else int(epoch_rows)) * meta.row_bytes
        unit_rows = unit_rows_for(meta.block_rows, meta.row_bytes, False,
                                  default_unit_bytes(result.rows_per_fill * meta.row_bytes, epoch_bytes))
        result = replace(result, unit_rows=unit_rows)
    if piece_rows:
        result = replace(result, piece_rows=piece_rows)
    if available_bytes == "auto":
        available_bytes = available_memory_bytes()
    if available_bytes is not None and result.total_bytes > available_bytes:
        raise _unallocatable(result, int(available_bytes), batch_size, workers, budget_bytes,
                             lambda bs: minimum(workers, bs))
    return result


def _fitting_piece_bytes(room: int, meta, in_flight: int) -> int | None:
    """The largest ``piece_bytes`` (whole blocks) whose window of pieces fits in ``room`` bytes, or None where not
    even one block's pieces do (pure)."""
    from h5stream.order.twolevel import window_capacity

    block_bytes = meta.block_rows * meta.row_bytes
    blocks = room // (window_capacity(in_flight) * block_bytes) if room > 0 else 0
    return int(blocks * block_bytes) if blocks >= 1 else None


def _unallocatable(result: StreamPlan, available: int, batch_size: int, workers: int, budget_bytes: int | None,
                   minimum_for) -> BudgetError:
    """The error for a plan of ``result.total_bytes`` on a machine with ``available`` bytes free: what to lower.

    ``minimum_for(bs)``: the smallest budget of a stream with batch size ``bs`` (grows with ``bs``)."""
    fixes = []
    at_most = f"{max(1, available >> 20)}MiB"
    if result.min_budget_bytes <= available:  # the batch fits: the budget is what the machine cannot hold
        fixes.append(f"set {opt.name('memory_budget')} to {opt.value('memory_budget', at_most)} or less")
    elif batch_size > 1 and minimum_for(1) <= available:
        lo, hi = 1, batch_size - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if minimum_for(mid) <= available else (lo, mid - 1)
        fixes.append(f"lower {opt.name('batch_size')} to {lo}"
                     + (f" and {opt.name('memory_budget')} to {opt.value('memory_budget', at_most)} or less"
                        if budget_bytes is not None and budget_bytes > available else ""))
    if workers:
        fixes.append(f"use fewer {opt.name('workers')}")
    fixes.append("free memory on this machine")
    what = opt.setting("batch_size", batch_size) + (f" with {workers} workers" if workers else "")
    budget = "the default budget" if budget_bytes is None else f"a memory budget of {format_bytes(budget_bytes)}"
    return BudgetError(
        f"{what} under {budget} would allocate {format_bytes(result.total_bytes)}, but this machine has only "
        f"{format_bytes(available)} of memory available: " + ", or ".join(fixes)
    )
