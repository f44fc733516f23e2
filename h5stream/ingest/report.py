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

A new store written over an old one (``--overwrite``) writes its report under
:data:`REPLACING_SUFFIX` beside the old report until the new store takes its
name (its first commit), then renames it over the old report
(:meth:`SkipReport.published`): a run that stores nothing, fails or is stopped
before then leaves the old store with its own report.  A run killed between
the two renames leaves the new report under its temporary name, which the
next ``--append`` puts in place (:func:`settle_replacement`).
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
REPLACING_SUFFIX = schema.REPORT_REPLACING_SUFFIX

def settle_replacement(report_path: str, store_creating: str) -> None:
    """Finish or drop what a killed ``--overwrite`` left at ``report_path`` + :data:`REPLACING_SUFFIX` (run by an
    ``--append`` before it reads the report): put in place when its store took its name (``store_creating``, the
    new store's temporary name, is gone), removed when the store did not (the old store stays, with its report).
    Anything not ours there is refused (StoreExistsError)."""
    pending = report_path + REPLACING_SUFFIX
    if not sidecar.check(pending):
        return
    try:
        if os.path.lexists(store_creating):
            os.unlink(pending)
        else:
            os.replace(pending, report_path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise StoreWriteError(f"{pending}: cannot settle the skip report ({exc.strerror})", errno=exc.errno,
                              strerror=exc.strerror) from exc


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

    ``replacing``: the report of a new store that replaces an old one: written under ``path`` +
    :data:`REPLACING_SUFFIX` (made at once, so a run killed after its store took its name always leaves a report
    to put in place) until :meth:`published`; closed or discarded before that, it is removed and the old report
    at ``path`` is left as it was.
    """

    def __init__(self, path: str, reported: dict[str, str], replacing: bool = False):
        self.path = path
        self._final: str | None = None  # while replacing: the old report's name, taken at published()
        self.first: tuple[str, str] | None = None  # this run's first skipped file (rel, reason)
        self._rows = len(reported)  # entries the file holds
        self.paths = set(reported)
        self._reasons = dict(reported)  # an earlier run's entries, which :meth:`forget` may drop
        self._forgotten: set[str] = set()
        self._replaced = False  # an earlier entry replaced by one of the other kind: the report is rewritten
        self.skipped = sum(not why.startswith(LEFT_OUT) for why in reported.values())  # the skipped_files count
        self._fh = None
        self._csv = None
        self._good_size = 0  # bytes of the report that were durable at the last flush
        self._created = False
        if replacing:
            self._final, self.path = path, path + REPLACING_SUFFIX
            try:
                sidecar.clear(self.path)  # a killed run's leftover, ours; anything else is refused
                self._open()
                self.flush()
            except StoreExistsError:
                raise
            except OSError as exc:
                raise self._failed(exc) from exc

    def _failed(self, exc: OSError) -> StoreWriteError:
        return StoreWriteError(f"{self.path}: cannot write the skip report ({exc.strerror or exc})",
                               errno=exc.errno, strerror=exc.strerror)

    def add(self, rel: str, why: str) -> None:
        if rel in self.paths:
            earlier = self._reasons.get(rel)
            if earlier is None or earlier == why:
                return
            # An earlier run's entry with another reason (left out then, skipped now, or the other way round; a
            # file the decoder died on that now decodes to an ordinary refusal): this one is appended, and read
            # back it is the one that counts (the last); close() drops the old one.
            self.forget([rel])
            self._forgotten.discard(rel)
            self._replaced = True
        try:
            if self._fh is None:
                self._open()
            self._csv.writerow([escape_cell(rel), escape_cell(why)])
        except StoreExistsError:
            raise
        except OSError as exc:
            raise self._failed(exc) from exc
        if self.first is None and not why.startswith(LEFT_OUT):
            self.first = (rel, why)
        self._rows += 1
        self.paths.add(rel)
        self.skipped += not why.startswith(LEFT_OUT)

    def _open(self) -> None:
        self._fh = open(self._open_fd(), "a", newline="", encoding="utf-8", errors="surrogateescape")
        self._good_size = self._fh.tell()
        self._csv = csv.writer(self._fh)
        if self._good_size == 0:
            self._csv.writerow(["path", "reason"])

    @property
    def replacing(self) -> bool:
        """Whether this is a new store's report that has not yet replaced the old one (see :meth:`published`)."""
        return self._final is not None

    def published(self, store_published: bool = True) -> None:
        """Once ``store_published`` (the new store this report belongs to has taken its name): a replacing report
        (flushed) is renamed over the old one, and from now on is the report.  Idempotent; nothing for a report
        that replaces none."""
        if self._final is None or not store_published:
            return
        self.flush()
        try:
            os.replace(self.path, self._final)
        except OSError as exc:
            raise self._failed(exc) from exc
        self.path, self._final = self._final, None

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
        """Flush and close; a replacing report whose store never took its name is removed (the old one stays),
        and one that lists nothing is not left behind."""
        if self._fh is not None:
            self.flush()
            self._fh.close()
            self._fh = None
        if self._final is not None or (self._rows == 0 and self._created):
            try:
                sidecar.clear(self.path)
            except OSError as exc:
                raise self._failed(exc) from exc
            return
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
        if self._final is not None:  # never put in place: the old report stays
            if self._fh is not None:
                try:
                    self._fh.close()
                except OSError:
                    pass
                self._fh = None
            try:
                sidecar.clear(self.path)
            except OSError:
                pass
            return
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
