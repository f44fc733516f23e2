"""Exceptions raised by h5stream.

Every error is an :class:`H5StreamError`; each subclass also derives from the
builtin it resembles, so ``except ValueError`` / ``except OSError`` keep working
for callers who do not know this package.  Messages say what went wrong, where,
and how to fix it, in one line.
"""

from __future__ import annotations

import errno
import re
import resource  # here, not where a limit is met: importing its extension then needs a descriptor


_URL_PASSWORD = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:]*):[^\s/?#]*@")
# A URL's query string up to the next space, or to a ':', ',', ';' or ')' ending a phrase ("URL: what failed").
_URL_QUERY = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://[^\s?#]*)\?(?!\.\.\.(?:[\s:,;)]|$))[^\s#]+?(?=[:,;)]?(?:\s|$))")


def hide_passwords(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` in it shown as ``***``, and the query string
    of every URL in it (a presigned link's signature, a token) as ``...`` (pure)."""
    if "@" in text:
        text = _URL_PASSWORD.sub(r"\1:***@", text)
    return _URL_QUERY.sub(r"\1?...", text) if "?" in text else text


class H5StreamError(Exception):
    """Base class of every error h5stream raises on purpose.  A URL's password in the message (an HTTP store
    opened as ``https://user:password@host/...``) is shown as ``***``, and its query string (a presigned link's
    signature) as ``...``, whichever code named the URL."""

    def __init__(self, *args):
        super().__init__(*args)
        if args and isinstance(args[0], str) and ("@" in args[0] or "?" in args[0]):
            self.args = (hide_passwords(args[0]), *args[1:])


class ConfigError(H5StreamError, ValueError):
    """An argument is out of range or malformed (batch size, shard, budget string...)."""


class OptionNameError(ConfigError, TypeError):
    """A keyword argument names no option (often another library's name for one); a ``TypeError`` too, as Python's
    own unexpected-keyword error is."""


class StorePathError(ConfigError, TypeError):
    """What ``open()`` was given names no store: not a path, a URL or a list of them (a TypeError, as Python's own
    for a wrong type; a ConfigError, so ``except ValueError`` and ``except H5StreamError`` work too)."""


class BudgetError(ConfigError):
    """The memory budget cannot hold the minimum the stream needs; the message says the minimum."""


class SourceError(H5StreamError, ValueError):
    """The ingest source (folder, labels CSV) is unusable."""


class StoreNotFoundError(H5StreamError, FileNotFoundError):
    """The HDF5 file does not exist."""


class StoreFormatError(H5StreamError, ValueError):
    """The file exists but is not an h5stream store (not HDF5, missing /images, bad shapes...)."""


class StoreExistsError(H5StreamError, FileExistsError):
    """Ingest would overwrite an existing file without --append / --overwrite."""


class ReaderError(H5StreamError, RuntimeError):
    """The reader thread failed (I/O error, file vanished, corrupt chunk); ``__cause__`` holds the original."""


class ChecksumError(ReaderError):
    """Bytes read from a store do not match the store's block checksums (the file is damaged: bit rot, a bad
    copy, a chunk index pointing at the wrong bytes); the message names the file, the rows and what to do."""

    @classmethod
    def for_rows(cls, path: str, first: int, last: int, what: str, block: int | None = None) -> ChecksumError:
        """The error for rows ``first..last`` (inclusive) of ``path`` whose ``what`` ("images", "labels") differ."""
        where = (f"row {first}" if first == last else f"rows {first}-{last}") + ("" if block is None else
                                                                                 f" (block {block})")
        return cls(f"{path}: {where}: the {what} read from the file do not match the store's checksum, the file is "
                   f"damaged (bit rot, a bad copy); run `h5stream verify {path}` to list every damaged block, then "
                   "restore the file from a copy or re-ingest it (verify_reads=False streams it unchecked)")


class ImageDecodeError(ReaderError):
    """An encoded store's row did not decode to an image of the store's shape (a damaged file whose bytes still
    match their checksum, or a store read unchecked); the message names the file and the row."""


class WorkerError(H5StreamError, RuntimeError):
    """An augmenting worker raised or died; the message carries the worker's traceback or exit signal."""


class StreamClosedError(H5StreamError, RuntimeError):
    """The stream was used after ``close()``."""


class StreamIterationError(H5StreamError, RuntimeError):
    """A stream was iterated against its contract: from two threads at once, or through an iterator that a newer
    ``iter(stream)`` (or ``restore``) replaced."""


class ForkedStreamError(StreamIterationError):
    """A stream was used in a process forked from the one that opened it (``os.fork``, a ``fork`` pool or
    DataLoader): its threads, workers and pipes are the parent's; the child opens a stream of its own."""


class MissingDependencyError(H5StreamError, ImportError):
    """A package h5stream needs here (OpenCV, a framework) cannot be imported; the message names what to install."""


class StoreWriteError(H5StreamError, OSError):
    """Writing a store failed (disk full, file size limit, I/O error).

    The rows committed before the failure are intact and stay readable; ``rows_committed`` says how many
    (None when the store was never created), ``errno`` is the operating system's error number when known.
    """

    def __init__(self, message: str, *, errno: int | None = None, strerror: str | None = None,
                 rows_committed: int | None = None):
        super().__init__(message)
        self.errno = errno
        self.strerror = strerror
        self.rows_committed = rows_committed

    def __str__(self) -> str:  # OSError would print "[Errno N] strerror" instead of the message
        return str(self.args[0]) if self.args else ""


class StoreBusyError(H5StreamError, BlockingIOError):
    """Another process is writing the store: a second writer is refused, or a read cannot be done meanwhile.

    The message names that process; ``pid`` holds it when known.
    """

    def __init__(self, message: str, *, pid: int | None = None):
        super().__init__(message)
        self.pid = pid


class ResourceLimitError(H5StreamError, OSError):
    """A limit of this process stopped the job (too many open files, ``ulimit -n``; a shared-memory segment
    over the file size limit, ``ulimit -f``); the message names the limit and how to raise it.  ``errno`` is
    the operating system's error number."""

    def __init__(self, message: str, *, errno: int | None = None):
        super().__init__(message)
        self.errno = errno

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def descriptor_limit(code: int | None) -> tuple[str, str] | None:
    """``(what, how to fix)`` for running out of file descriptors (EMFILE, ENFILE), None for another errno."""
    if code == errno.EMFILE:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        limit = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
        return f"too many open files for this process (ulimit -n is {limit})", "raise it (e.g. ulimit -n 4096)"
    if code == errno.ENFILE:
        return "too many open files on this system", "close other programs or raise fs.file-max"
    return None


class StorePermissionError(H5StreamError, PermissionError):
    """The store (or a folder on its path) exists but this user may not read it."""


class StoreChangedError(H5StreamError, OSError):
    """The store was replaced or modified after it was opened (a remote object's ETag or size changed); reopen it."""


class RemoteError(H5StreamError, OSError):
    """A request to a remote store (``s3://``, ``http(s)://``) failed; the message gives the server's reason."""


class RemoteUnavailableError(RemoteError, ConnectionError):
    """A remote store could not be reached, or kept failing, until its ``timeout_s`` ran out (retries included)."""


class StoreReadError(H5StreamError, OSError):
    """The operating system failed to read the store's bytes (an I/O error: a failing disk, a lost network
    file system), as opposed to bytes that are there but wrong (:class:`StoreFormatError`).

    ``errno`` is the operating system's error number, ``filename`` the store's path."""

    def __init__(self, message: str, *, errno: int | None = None, filename: str | None = None):
        super().__init__(message)
        self.errno = errno
        self.filename = filename

    def __str__(self) -> str:  # OSError would print "[Errno N] strerror" instead of the message
        return str(self.args[0]) if self.args else ""


class OutputWriteError(H5StreamError, OSError):
    """A command could not write the file it was asked for (``preview --out``, ``bench --plot``): disk full, file
    size limit, no permission.  Whatever was at that path before is left as it was.  ``errno`` is the operating
    system's error number."""

    def __init__(self, message: str, *, errno: int | None = None):
        super().__init__(message)
        self.errno = errno

    def __str__(self) -> str:  # OSError would print "[Errno N] strerror" instead of the message
        return str(self.args[0]) if self.args else ""

    @classmethod
    def of_stdout(cls, exc: OSError) -> OutputWriteError:
        """The error for ``exc``, raised writing the command's standard output (``> out.json`` on a full disk)."""
        return cls(f"cannot write the output to stdout ({exc.strerror or exc}); free space where it goes, or send it "
                   "elsewhere", errno=exc.errno)
