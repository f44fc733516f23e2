"""The skip report ``OUT.skipped.csv``: one ``path,reason`` row per file an ingest did not store, over all runs.

Files that could not be ingested are counted as skipped (the store's
``skipped_files`` attribute); what was left out on purpose has a reason
starting with :data:`LEFT_OUT` and is listed without being counted.

The report is opened in spreadsheets, and file names are chosen by whoever
made the images: a cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or a
carriage return would run as a formula (CSV injection), so it is written with
a single quote in front, as OWASP advises; a cell that starts with a quote
gets one more, so :func:`read_report` gives back every name exactly.
"""

from __future__ import annotations

import csv
import os

from h5stream.errors import StoreWriteError

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
    if not os.path.exists(path):
        return {}
    try:
        with open(path, newline="", encoding="utf-8", errors="surrogateescape") as fh:
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
    stores them (a name that is not valid UTF-8 keeps its bytes).  Write failures raise StoreWriteError.
    """

    def __init__(self, path: str, reported: dict[str, str]):
        self.path = path
        self.paths = set(reported)
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
            return
        try:
            if self._fh is None:
                self._created = not os.path.exists(self.path)
                self._fh = open(self.path, "a", newline="", encoding="utf-8", errors="surrogateescape")
                self._good_size = self._fh.tell()
                self._csv = csv.writer(self._fh)
                if self._good_size == 0:
                    self._csv.writerow(["path", "reason"])
            self._csv.writerow([escape_cell(rel), escape_cell(why)])
        except OSError as exc:
            raise self._failed(exc) from exc
        self.paths.add(rel)
        self.skipped += not why.startswith(LEFT_OUT)

    def flush(self) -> None:
        if self._fh is not None:
            try:
                self._fh.flush()
                os.fsync(self._fh.fileno())
            except OSError as exc:
                raise self._failed(exc) from exc
            self._good_size = self._fh.tell()

    def close(self) -> None:
        if self._fh is not None:
            self.flush()
            self._fh.close()
            self._fh = None

    def discard(self) -> None:
        """Close, cutting the file back to its last flush (removing it if this run created it and nothing
        of it was flushed)."""
        if self._fh is None:
            return
        fh, self._fh = self._fh, None
        try:
            fh.close()  # may fail to write its buffer: what it did write is cut off below
        except OSError:
            pass
        try:
            if self._created and self._good_size == 0:
                os.unlink(self.path)
            elif os.path.getsize(self.path) > self._good_size:
                os.truncate(self.path, self._good_size)
        except OSError:
            pass
