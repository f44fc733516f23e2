"""The skip report ``OUT.skipped.csv``: one ``path,reason`` row per file an ingest did not store, over all runs.

Files that could not be ingested are counted as skipped (the store's
``skipped_files`` attribute); what was left out on purpose has a reason
starting with :data:`LEFT_OUT` and is listed without being counted.

The report is opened in spreadsheets, and file names are chosen by whoever
made the images: a cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or a
carriage return would run as a formula (CSV injection), so it is written with
a single quote in front, as OWASP advises; a cell that starts with a quote
gets one more, so :func:`read_report` gives back every name exactly.

The report is read, created and appended to without following a link at its
name, and only when it is a regular file of ours (:mod:`h5stream.store.sidecar`):
a link planted there is refused in one line, its target never written.
"""

from __future__ import annotations

import csv
import os

from h5stream.errors import StoreExistsError, StoreWriteError
from h5stream.store import schema, sidecar

#: Reasons in the skip report that start with this are left out on purpose; the others count as skipped.
LEFT_OUT = "left out: "
#: First characters that make a spreadsheet read a cell as a formula (OWASP, CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def escape_cell(text: str) -> str:
    """``text`` as written to the report: a quote in front of a formula start or of a quote (pure)."""
    return "'" + text if text.startswith(FORMULA_STARTS + ("'",)) else text


def unescape_cell(text: str) -> str:
    """Inverse of :func:`escape_cell` (pure)."""
    return text[1:] if text.startswith("'") else text


def read_report(path: str) -> dict[str, str]:
    """{path: reason} of an existing skip report."""
    try:
        fd = sidecar.open_fd(path, os.O_RDONLY)
    except FileNotFoundError:
        return {}
    except StoreExistsError:
        raise
    except OSError as exc:
        raise StoreWriteError(f"{path}: cannot read the skip report ({exc.strerror})", errno=exc.errno,
                              strerror=exc.strerror) from exc
    try:
        with open(fd, newline="", encoding="utf-8", errors="surrogateescape") as fh:
            rows = list(csv.reader(fh))
    except OSError as exc:
        raise StoreWriteError(f"{path}: cannot read the skip report ({exc.strerror})", errno=exc.errno,
                              strerror=exc.strerror) from exc
    return {unescape_cell(r[0]): (unescape_cell(r[1]) if len(r) > 1 else "") for r in rows[1:] if r}


class SkipReport:
    """The skip report CSV (``path,reason``), opened on the first new entry; one row per path over all runs,
    cells escaped against formula injection (:func:`escape_cell`).

    :meth:`flush` makes the rows added so far durable; :meth:`discard` drops the ones added since, so a run
    that fails leaves no half-written line.  Paths are written as :func:`h5stream.store.schema.encode_path`
    stores them (a name that is not valid UTF-8 keeps its bytes).  Write failures raise StoreWriteError;
    something else than a report of ours at ``path`` (a link, a folder, another user's file) raises
    StoreExistsError at the first entry, with nothing written.
    """

    def __init__(self, path: str, reported: dict[str, str]):
        self.path = path
        self.paths = set(reported)
        self._reasons = dict(reported)  # an earlier run's entries, which :meth:`forget` may drop
        self._forgotten: set[str] = set()
        self._replaced = False  # an earlier entry replaced by one of the other kind: the report is rewritten
        self.skipped = sum(not why.startswith(LEFT_OUT) for why in reported.values())  # the skipped_files count
        self._fh = None
        self._csv = None
        self._good_size = 0  # bytes of the report that were durable at the last flush
        self._created = False

    def _failed(self, exc: OSError) -> StoreWriteError:
        return StoreWriteError(f"{self.path}: cannot write the skip report ({exc.strerror or exc})",
                               errno=exc.errno, strerror=exc.strerror)

    def add(self, rel: str, why: str) -> None:
        if rel in self.paths:
            earlier = self._reasons.get(rel)
            if earlier is None or earlier.startswith(LEFT_OUT) == why.startswith(LEFT_OUT):
                return
            # An earlier run's entry of the other kind (left out then, skipped now, or the other way round): this
            # one is appended, and read back it is the one that counts (the last); close() drops the old one.
            self.forget([rel])
            self._forgotten.discard(rel)
            self._replaced = True
        try:
            if self._fh is None:
                self._fh = open(self._open_fd(), "a", newline="", encoding="utf-8", errors="surrogateescape")
                self._good_size = self._fh.tell()
                self._csv = csv.writer(self._fh)
                if self._good_size == 0:
                    self._csv.writerow(["path", "reason"])
            self._csv.writerow([escape_cell(rel), escape_cell(why)])
        except StoreExistsError:
            raise
        except OSError as exc:
            raise self._failed(exc) from exc
        self.paths.add(rel)
        self.skipped += not why.startswith(LEFT_OUT)

    def _open_fd(self) -> int:
        """The report opened for appending, created (``O_EXCL``) if it is not there; never through a link."""
        flags = os.O_WRONLY | os.O_APPEND
        try:
            fd = sidecar.open_fd(self.path, flags | os.O_CREAT | os.O_EXCL, owner=False)  # new: ours
            self._created = True
        except FileExistsError as exc:
            if isinstance(exc, StoreExistsError):  # something not ours is there
                raise
            fd = sidecar.open_fd(self.path, flags)  # a report of ours from an earlier run (or a refusal)
            self._created = False
        return fd

    def flush(self) -> None:
        if self._fh is not None:
            try:
                self._fh.flush()
                os.fsync(self._fh.fileno())
            except OSError as exc:
                raise self._failed(exc) from exc
            self._good_size = self._fh.tell()

    def forget(self, rels) -> None:
        """Drop an earlier run's entries for ``rels``, files now stored (fixed since, or newly listed): no longer
        counted in :attr:`skipped` from now on, and gone from the file at :meth:`close`.  So the count the store
        commits may be below the file's entries until then, never above them."""
        for rel in set(rels) & set(self._reasons):
            self.skipped -= not self._reasons.pop(rel).startswith(LEFT_OUT)
            self.paths.discard(rel)
            self._forgotten.add(rel)

    def close(self) -> None:
        if self._fh is not None:
            self.flush()
            self._fh.close()
            self._fh = None
        if self._forgotten or self._replaced:
            self._rewrite()

    def _rewrite(self) -> None:
        """The report without the forgotten entries: written whole to a new file of ours, synced, renamed over
        it (a crash leaves the old report, which lists files now stored, or the new one); removed when none is
        left."""
        kept = {rel: why for rel, why in read_report(self.path).items() if rel not in self._forgotten}
        tmp = self.path + schema.REPORT_REWRITE_SUFFIX
        try:
            if not kept:  # every entry stored now: no report, as after a run that skipped nothing
                sidecar.clear(self.path)
                self._forgotten, self._replaced = set(), False
                return
            sidecar.clear(tmp)  # a killed rewrite's leftover, ours; anything else there is refused
            with open(sidecar.open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, owner=False), "w", newline="",
                      encoding="utf-8", errors="surrogateescape") as fh:
                writer = csv.writer(fh)
                writer.writerow(["path", "reason"])
                writer.writerows([escape_cell(rel), escape_cell(why)] for rel, why in kept.items())
                fh.flush()
                os.fsync(fh.fileno())
            os.rename(tmp, self.path)
        except StoreExistsError:
            raise
        except OSError as exc:
            raise self._failed(exc) from exc
        self._forgotten, self._replaced = set(), False

    def discard(self) -> None:
        """Close, cutting the file back to its last flush (removing it if this run created it and nothing
        of it was flushed)."""
        if self._fh is None:
            return
        fh, self._fh = self._fh, None
        fd = None
        try:
            fd = os.dup(fh.fileno())  # cut back through the file opened, never through whatever has its name now
        except OSError:
            pass
        try:
            fh.close()  # may fail to write its buffer: what it did write is cut off below
        except OSError:
            pass
        if fd is None:
            return
        try:
            if self._created and self._good_size == 0:
                sidecar.check_same(self.path, fd)
                os.unlink(self.path)
            elif os.fstat(fd).st_size > self._good_size:
                os.ftruncate(fd, self._good_size)
        except OSError:
            pass
        finally:
            os.close(fd)
