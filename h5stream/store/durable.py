"""The file side of a store's writer: every write made so that a failure never publishes a row.

:class:`DurableFile` owns one PyTables file handle being written, its file descriptor, the disk-space guard, the
direct-write I/O (:mod:`h5stream.store.rawchunks`) and the store's
:class:`~h5stream.store.lock.StoreLock`; :class:`~h5stream.store.writer.StoreWriter` adds the store's rows and
its commits on top.  Used from one thread (the ingest writer).

A write that fails (disk full, file size limit, I/O error) never publishes a row.  HDF5 reports failed writes late
or not at all (PyTables ignores what ``H5Fflush`` and ``H5Fclose`` return), and a flush that fails half-way can
leave a file that no longer opens.  So failures are made to happen before HDF5 writes:

* the file space HDF5 will take for the rows being appended (their chunks and room for index metadata) is
  allocated first with ``posix_fallocate``; a full disk or a size limit fails there, with HDF5 untouched
  (:class:`~h5stream.store.space.SpaceGuard`, which the writer owns);
* HDF5's chunk cache is off, so pixel chunks are written inside
  :meth:`~h5stream.store.writer.StoreWriter.append`, label and path chunks (a few hundred bytes a row, kept until
  then) inside :meth:`~h5stream.store.writer.StoreWriter.commit`, one write per array (PyTables checks those
  writes), into that space, and the end of HDF5's file is checked to lie inside it.  Whole blocks of pixels are
  written as raw chunks, one write each from the caller's rows (no fill, no copy in HDF5): in a new store, where
  HDF5 allocates chunks as the array grows, straight to the disk at the chunk's offset
  (:mod:`h5stream.store.rawchunks`, no copy into the page cache either, by an I/O thread while the caller goes on
  when it appends with ``wait=False``), otherwise through HDF5; a block's bytes are the same either way;
* :meth:`~h5stream.store.writer.StoreWriter.commit` flushes, checks again and calls ``fsync`` (an I/O error on
  write-back surfaces there) before it raises the count.

On a failure the writer raises :class:`~h5stream.errors.StoreWriteError`, points HDF5's file descriptor at
/dev/null (nothing HDF5 still buffers can reach the file), closes it and cuts the file back to its size at the last
good flush: the file holds its last commit again, the same rows and the same structure (a partly filled chunk
rewritten in place may hold, past the committed rows, bytes of the rows that were being appended; nothing reads
them).

A new store is written under a temporary name, ``OUT`` + :data:`~h5stream.store.schema.CREATING_SUFFIX`, next to
``OUT``, and renamed to ``OUT`` (then the folder synced) once its first commit of rows is durable, or when it is
closed.  HDF5 updates its headers in place, several writes per flush and the superblock last, so a process killed
inside the first flush that adds rows can leave a file no tool opens; under the temporary name such a file is never
taken for the store.  The temporary name is the writer's alone while it holds the store's lock: the next create
reuses it, and :meth:`~h5stream.store.writer.StoreWriter.open_append` removes one left beside a store.  A writer
that fails or is discarded before the rename removes it.

Once published, the store is rewritten in place by every flush (and by the close): meanwhile a marker lies beside
it (:func:`~h5stream.store.schema.flushing_path`), removed once the flush is durable.  A marker left behind (a
writer killed mid-flush, or a flush that failed) makes readers refuse the store, and
:meth:`~h5stream.store.writer.StoreWriter.open_append` too: whoever appends rebuilds it from its committed rows
first (:mod:`h5stream.store.rebuild`).
"""

from __future__ import annotations

import os
import time

import tables

from h5stream.errors import ConfigError, StoreWriteError
from h5stream.store import handle, schema, sidecar
from h5stream.store.lock import StoreLock
from h5stream.store.rawchunks import RawChunks
from h5stream.store.space import SpaceGuard


class DurableFile:
    """One PyTables file being written under the commit protocol.  Not thread-safe: one writer thread owns it.

    Every write of array data goes through :meth:`_write_guarded`, every flush through :meth:`_flush`; a failure
    raises :class:`~h5stream.errors.StoreWriteError`, leaves the file as its last good flush (a new store not yet
    published: nothing) and closes this.  ``committed_rows`` is what the last commit published (kept by the
    subclass, named in failure messages).  Owns ``h5file`` and ``lock`` (released by :meth:`discard` and on
    failure; None: the caller keeps its lock).
    """

    def __init__(self, h5file: tables.File, *, lock: StoreLock | None, committed_rows: int):
        self._f = h5file
        self._lock = lock  # owned: released by close() / discard()
        self.path = h5file.filename  # the store's name, in messages
        self._file = h5file.filename  # where it is on disk: the temporary name until published
        self._publish_to: str | None = None  # a new store's name, while it is written under the temporary one
        self._publish_early = True  # a new store takes its name at its first commit of rows (else at close)
        self.committed_rows = committed_rows
        self._fd = handle.file_descriptor(h5file)  # None: not a plain POSIX file, writes checked after the fact
        self._space = SpaceGuard(self._fd, h5file.get_filesize, os.path.getsize(self._file))  # owned
        self._raw: RawChunks | None = None  # owned once opened (by the subclass, for the chunks it writes)
        #: Seconds spent waiting for direct writes to reach the disk (:meth:`wait_direct_writes`, commits
        #: included): where the disk, not this process, held the writing up.
        self.direct_wait_s = 0.0
        self._closed = False

    @property
    def published(self) -> bool:
        """Whether the store is under its name (False for a new one before its first commit of rows)."""
        return self._publish_to is None

    def _publish(self) -> None:
        """Give a new store its name: rename the temporary file (committed, durable), then sync the folder."""
        try:
            sidecar.check_same(self._file, self._fd)  # still the file written (a rename never follows a link)
            os.replace(self._file, self._publish_to)
        except OSError as exc:
            raise self._fail(exc, cut_back=False) from exc
        self._file, self._publish_to = self._publish_to, None
        handle.fsync_folder(self._file)

    # -- the write guard ------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed or not self._f.isopen:
            raise ConfigError(f"{self.path}: this writer is closed")

    def _write_guarded(self, nbytes: int, write) -> None:
        """Run ``write()`` (appends to this file's arrays taking at most ``nbytes`` of new file space) so that it
        cannot fail half-way for want of space, and a failure leaves the file as its last commit.  Every write
        of array data goes through here; StoreWriteError on failure (the writer is closed then)."""
        self._check_open()
        try:
            self._space.reserve(nbytes)
            write()
            self._space.check_within()
        except (OSError, tables.HDF5ExtError) as exc:
            raise self._fail(exc, cut_back=True) from exc

    @property
    def direct_writes(self) -> int:
        """How many blocks were submitted for writing straight to the disk so far (see
        :meth:`wait_direct_writes`)."""
        return self._raw.submitted if self._raw is not None else 0

    def wait_direct_writes(self, upto: int | None = None) -> None:
        """Return once the first ``upto`` blocks submitted for writing straight to the disk (default: all) are
        written: their rows' memory may then change.  :meth:`append` returns once those blocks are submitted,
        not written (the disk writes while the caller goes on); :meth:`commit` waits for all of them first.
        StoreWriteError when one failed."""
        if self._raw is None:
            return
        t0 = time.perf_counter()
        try:
            self._raw.wait(upto)
        except OSError as exc:
            raise self._fail(exc, cut_back=True) from exc
        finally:
            self.direct_wait_s += time.perf_counter() - t0

    def _flush(self) -> None:
        """Everything given to HDF5 so far on disk and durable, or StoreWriteError."""
        self._check_open()
        self.wait_direct_writes()  # the blocks written straight to the disk, before the metadata that names them
        try:
            self._space.reserve(0)
            marked = self._mark_flushing()
        except OSError as exc:
            raise self._fail(exc, cut_back=True) from exc
        try:
            self._f.flush()
            self._space.check_within()
            if self._fd is not None:
                os.fsync(self._fd)
        except (OSError, tables.HDF5ExtError) as exc:
            # HDF5 may have rewritten its index in place by now: the file is not cut back under it, and the
            # marker stays, so the next writer rebuilds it.
            raise self._fail(exc, cut_back=False) from exc
        self._space.flushed()
        self._unmark_flushing(marked)

    def _mark_flushing(self) -> bool:
        """Before HDF5 rewrites a published store in place: the marker beside it (True), so a writer killed
        half-way leaves word that the file's structure may be torn; nothing for a store not yet published (its
        temporary file is never taken for the store).  OSError when it cannot be made."""
        if not self.published:
            return False
        handle.mark_flushing(self._file)
        return True

    def _unmark_flushing(self, marked: bool) -> None:
        """After HDF5's in-place writes are durable: the marker :meth:`_mark_flushing` made goes."""
        if marked:
            handle.remove(schema.flushing_path(self._file))

    def _fail(self, exc: BaseException, *, cut_back: bool) -> StoreWriteError:
        """Close after a failed write (see :meth:`discard`) and say what failed and what is kept."""
        code, reason = handle.describe(exc)
        published = self.published
        kept = self._discard(cut_back=cut_back)
        n = self.committed_rows
        if not published:
            return StoreWriteError(f"{self.path}: cannot write ({reason}); nothing was written", errno=code,
                                   strerror=reason, rows_committed=0)
        if kept:
            what = f"the file is as its last commit left it: {n} complete rows"
        else:
            what = f"{n} rows were committed before it"
        return StoreWriteError(f"{self.path}: cannot write ({reason}); {what}", errno=code, strerror=reason,
                               rows_committed=n)

    def _discard(self, *, cut_back: bool) -> bool:
        """Close without letting anything HDF5 still buffers reach the file; with ``cut_back``, truncate the
        file to its size at the last good flush.  Returns True if the file is now exactly that flush's.  A
        store not yet published is removed."""
        if self._closed:
            return False
        self._closed = True
        done = False
        try:
            self._close_raw()  # nothing more reaches the file through it
            if self._f.isopen:
                cut = handle.close_cut_off(self._f)
                if cut and cut_back and self.published:
                    try:
                        if os.path.getsize(self._file) > self._space.good_size:
                            os.truncate(self._file, self._space.good_size)
                        done = True
                    except OSError:
                        pass
            if not self.published:
                handle.remove(self._file)
        finally:
            self._release_lock()
        return done

    def _close_file(self) -> None:
        """Close HDF5's handle after a commit, first trimming what was reserved past its end (HDF5 may write its
        structure once more as it closes: the flushing marker is there meanwhile)."""
        self._space.trim()
        self._closed = True
        self._close_raw()
        marked = self._mark_flushing()
        self._f.close()
        self._unmark_flushing(marked)

    def _close_raw(self) -> None:
        if self._raw is not None:
            self._raw.close()
            self._raw = None

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # -- closing ------------------------------------------------------------------
    def discard(self) -> None:
        """Close, dropping the rows appended since the last commit: the file stays as its last commit (a new
        store not yet published is removed)."""
        self._discard(cut_back=True)


def write_in_place(path: str, writes) -> None:
    """Overwrite bytes of the existing file ``path`` (a link at that name is refused: ``O_NOFOLLOW``) at each
    ``(offset, bytes)`` of ``writes``, then ``fsync``: what ``repair`` writes back over damaged bytes whose right
    values it knows.  The file's size and structure do not change."""
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for at, data in writes:
            data = memoryview(data).cast("B")
            written = 0
            while written < len(data):
                written += os.pwrite(fd, data[written:], at + written)
        os.fsync(fd)
    finally:
        os.close(fd)
