"""A byte source over one remote object: ranged GETs through obstore, straight into the caller's buffers.

:class:`RemoteSource` implements the reader's byte-source contract (``name``, ``size``, ``max_in_flight``,
``readinto(offset, buffers)``, ``close()``; see :mod:`h5stream.read.source`) for ``s3://`` and ``http(s)://``
URLs.  Opening it sends one ``HEAD`` (or a ranged ``GET`` of the first byte, see :meth:`RemoteSource._head`): the
object's size, ETag and modification time as of open.  Every read is then one ranged ``GET`` per
:data:`MAX_REQUEST_BYTES` or less carrying ``If-Match`` with that ETag, so a store
replaced or rewritten underneath fails with :class:`StoreChangedError` instead of mixing two versions (the
response's own ETag and size are checked too, for servers that ignore ``If-Match``).  A body of at most
:data:`COLLECT_BYTES` is collected whole by the client and copied from there straight into the buffers, once; a
longer one is copied in pieces of :data:`STREAM_CHUNK_BYTES` as it arrives, so a read in flight holds about as
much either way (what :data:`~h5stream.remote.config.CLIENT_PER_READ_BYTES` counts).  Collected where memory
allows because the client hands a streamed piece over as a new Python ``bytes`` (zero-filled, then copied into):
two more passes over every byte, and a round trip between threads per piece.

Retries, timeouts and backoff are the client's, configured from ``timeout_s`` (see
:func:`~h5stream.remote.config.client_settings`): server errors, throttling, dropped connections and stalls
are retried, and a request that cannot succeed fails within ``timeout_s``.  Failures are h5stream's one-line
errors (see :mod:`h5stream.remote.failures`).

Thread-safety: ``readinto`` may be called from several threads at once (each call is its own request; the
client pools connections).  ``close`` is idempotent.
"""

from __future__ import annotations

import base64
import os
import threading
from collections.abc import Mapping, Sequence

from h5stream import _deps
from h5stream.errors import H5StreamError, RemoteError, StoreFormatError
from h5stream.remote.calls import interruptible, on_main_thread
from h5stream.remote.config import (
    Location,
    RemoteOptions,
    client_settings,
    home_aws_files,
    malformed,
    parse_url,
    read_profile,
    s3_settings,
)
from h5stream.remote.failures import changed, http_status, no_range, translate

MAX_REQUEST_BYTES = 64 << 20
"""Longer reads are split into requests of equal size, at most this many bytes each, so a request that fails
midway costs at most this much to send again."""

COLLECT_BYTES = 3 << 19
"""A response of at most this many bytes (1.5 MiB) is collected whole before it is copied out; what that holds per
read in flight stays within :data:`~h5stream.remote.config.CLIENT_PER_READ_BYTES` (docs/performance.md, "Design
figures")."""

STREAM_CHUNK_BYTES = 256 << 10
"""A longer response arrives in pieces of about this size, each copied into the buffers as it comes."""


def make_store(location: Location, options: RemoteOptions, env: Mapping[str, str] | None = None):
    """The obstore store holding ``location``'s object, configured from ``options`` and the environment."""
    _deps.obstore()
    from obstore.store import HTTPStore, S3Store

    client, retry = client_settings(options)
    if location.scheme != "s3":
        if location.basic_auth is not None and not any(k.lower() == "authorization" for k in options.headers):
            token = base64.b64encode(":".join(location.basic_auth).encode()).decode()
            client["default_headers"] = {**client.get("default_headers", {}), "Authorization": f"Basic {token}"}
        # A URL with a query string (a presigned link, a CDN's token) is the store's own URL, read at key "": the
        # client keeps a base URL's query on every request, and drops one given with a key.
        base = location.target if location.query else location.container + "/"
        try:
            return HTTPStore(base, client_options=client, retry_config=retry)
        except ValueError as exc:  # the client's URL parser: "invalid port number", "empty host"...
            raise malformed(location.url, str(exc)) from None
    env = os.environ if env is None else env
    creds_file, config_file = home_aws_files(env)
    profile = options.profile or env.get("AWS_PROFILE") or "default"
    settings = s3_settings(location, options, env, read_profile(profile, _text(creds_file), _text(config_file)))
    bucket = settings.pop("bucket")
    return S3Store(bucket, config=settings, client_options=client, retry_config=retry)


def _text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError):
        return None


class _Scatter:
    """Copies byte pieces, in order, into consecutive buffers (``preadv`` order)."""

    __slots__ = ("views", "index", "within", "filled")

    def __init__(self, views: list[memoryview]):
        self.views = views
        self.index = 0
        self.within = 0
        self.filled = 0

    def write(self, piece: memoryview) -> None:
        pos, n = 0, len(piece)
        while pos < n:
            if self.index == len(self.views):
                raise OverflowError("more bytes than asked for")
            dst = self.views[self.index]
            k = min(n - pos, len(dst) - self.within)
            dst[self.within:self.within + k] = piece[pos:pos + k]
            pos += k
            self.within += k
            self.filled += k
            if self.within == len(dst):
                self.index += 1
                self.within = 0


def known_time(last_modified):
    """``last_modified`` as the client gives it, or None where the server sent none: the client then fills in the
    Unix epoch, which would make every version of the object look the same (the disk cache's key) and condition
    every read on a date before any write (pure)."""
    if last_modified is None or getattr(last_modified, "timestamp", lambda: 1)() == 0:
        return None
    return last_modified


def request_spans(offset: int, length: int, most: int) -> list[tuple[int, int]]:
    """``[start, end)`` of the requests reading ``length`` bytes at ``offset``: as few as hold at most ``most``
    bytes each, of equal size (to a byte), in order (pure)."""
    if length <= 0:
        return []
    n = -(-length // most)
    cuts = [offset + length * i // n for i in range(n + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def checked_range(name: str, size: int, offset: int, buffers: Sequence) -> tuple[list[memoryview], int, int]:
    """``(byte views of buffers, offset, length)`` of a read of ``size``-byte object ``name`` at ``offset``;
    :class:`StoreFormatError` for a range outside it (the store's metadata does not match its data)."""
    views = byte_views(buffers)
    length = sum(len(v) for v in views)
    offset = int(offset)
    if offset < 0 or offset + length > size:
        raise StoreFormatError(f"{name}: bytes {offset}..{offset + length} lie outside the object's "
                               f"{size} bytes; the store's metadata does not match its data")
    return views, offset, length


def byte_views(buffers: Sequence) -> list[memoryview]:
    """Each buffer as a writable, flat memoryview of bytes (a view, not a copy); empty ones left out."""
    views = []
    for b in buffers:
        v = memoryview(b)
        if v.readonly:
            raise ValueError("readinto needs writable buffers")
        if v.format != "B" or v.ndim != 1:
            v = v.cast("B")
        if len(v):
            views.append(v)
    return views


class RemoteSource:
    """Random-access, read-only bytes of one remote object (an ``s3://`` or ``http(s)://`` URL).

    Raises, at open: :class:`ConfigError` for a malformed URL or options, :class:`StoreNotFoundError`,
    :class:`StorePermissionError` (no or wrong credentials, refused), :class:`RemoteUnavailableError` (no answer
    within ``timeout_s``), :class:`MissingDependencyError` without obstore.  ``requests`` counts the requests
    sent (the ``HEAD`` included, retries not), ``bytes_read`` the bytes of the requests completed, ``landed`` the
    bytes received so far, counted as they arrive (a stream's reader counts them as progress: a long request on a
    slow link is moving, not stalled).
    """

    def __init__(self, url: str, options: RemoteOptions | None = None):
        self.options = options if options is not None else RemoteOptions()
        self.location = parse_url(url)
        self.name = self.location.url  # a password in the URL shown as ***
        self.max_in_flight = self.options.max_in_flight
        self._store = make_store(self.location, self.options)
        self._lock = threading.Lock()
        self.requests = 0
        self.bytes_read = 0
        self.landed = 0
        self._key = "" if self.location.query else self.location.key  # see make_store
        self._count(requests=1)
        failure = None
        try:
            meta = interruptible(self._head)
        except H5StreamError:
            raise
        except Exception as exc:  # noqa: BLE001 - every client failure becomes an h5stream error
            failure = self._error(exc)
        if failure is not None:  # raised outside the except: the client's error, which names the URL whole
            raise failure  # (a presigned link's signature), is not kept as its __context__
        self.size = int(meta["size"])
        self.etag: str | None = meta.get("e_tag") or None
        self.last_modified = known_time(meta.get("last_modified"))
        self._conditions = {}
        if self.etag and not self.etag.startswith("W/"):  # weak ETags never match If-Match
            self._conditions["if_match"] = self.etag
        elif self.last_modified is not None:
            self._conditions["if_unmodified_since"] = self.last_modified

    def _head(self) -> dict:
        """The object's size, ETag and modification time: a ``HEAD``, or the first byte's ranged ``GET`` where that
        cannot work: for a URL with a query string, and after an HTTP ``HEAD`` refused with 403 or 405 (a URL that
        redirects to such a link).  A presigned link is signed for one method (``GET``): S3 refuses a ``HEAD``
        through it."""
        import obstore

        if not self.location.query:
            try:
                return obstore.head(self._store, self._key)
            except Exception as exc:  # noqa: BLE001 - the client's own exception classes
                if self.location.scheme == "s3" or http_status(str(exc)) not in (403, 405):
                    raise
                self._count(requests=1)
        result = obstore.get(self._store, self._key, options={"range": (0, 1)})
        if tuple(result.range) != (0, 1):
            raise no_range(self.name)
        result.bytes()
        return result.meta

    @property
    def closed(self) -> bool:
        return self._store is None

    def close(self) -> None:
        """Drop the client (its pooled connections close with it).  Idempotent."""
        self._store = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def readinto(self, offset: int, buffers: Sequence) -> None:
        """Fill ``buffers`` completely, in order, with the bytes at ``offset`` onward (``preadv`` semantics).

        Raises :class:`StoreFormatError` for a range past the end of the object (as of open),
        :class:`StoreChangedError` if the object changed since open, :class:`RemoteUnavailableError` when the
        server does not answer within ``timeout_s``, or another h5stream ``OSError`` naming the cause.
        Buffers are left partly written when it raises.
        """
        views, offset, length = checked_range(self.name, self.size, offset, buffers)
        sink = _Scatter(views)
        for start, end in request_spans(offset, length, MAX_REQUEST_BYTES):
            if not on_main_thread():
                self._get(start, end, sink)
                continue
            # On a thread of its own, so Ctrl-C is raised at once, and into memory of its own, which a request
            # given up on may go on writing: the caller's buffers may be freed by then.
            piece = bytearray(end - start)
            interruptible(self._get, start, end, _Scatter([memoryview(piece)]))
            sink.write(memoryview(piece))

    def stream_range(self, start: int, end: int, sink) -> None:
        """Hand bytes ``[start, end)`` to ``sink`` as they arrive (``sink.write(memoryview)`` in order,
        ``sink.filled`` the bytes it took), one request per :data:`MAX_REQUEST_BYTES`.  Raises as
        :meth:`readinto`; an h5stream error raised by ``sink.write`` passes as it is.  Not on the main thread
        (a request there could not be interrupted by Ctrl-C: use :meth:`readinto`)."""
        if start < 0 or end > self.size:
            raise StoreFormatError(f"{self.name}: bytes {start}..{end} lie outside the object's {self.size} bytes; "
                                   "the store's metadata does not match its data")
        for s, e in request_spans(start, end - start, MAX_REQUEST_BYTES):
            self._get(s, e, sink)

    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` as a new bytes object (for small reads; see :meth:`readinto`)."""
        out = bytearray(length)
        self.readinto(offset, [out])
        return bytes(out)

    def _get(self, start: int, end: int, sink: _Scatter) -> None:
        import obstore

        store = self._store
        if store is None:
            raise RemoteError(f"{self.name}: read after close()")
        self._count(requests=1)
        begin = sink.filled
        failure = None
        try:
            result = obstore.get(store, self._key, options={"range": (start, end), **self._conditions})
            meta = result.meta
            if self.etag and meta.get("e_tag") and meta["e_tag"] != self.etag:
                raise changed(self.name, f"ETag {meta['e_tag']} instead of {self.etag}")
            if meta.get("size") is not None and int(meta["size"]) != self.size:
                raise changed(self.name, f"{meta['size']} bytes instead of {self.size}")
            if tuple(result.range) != (start, end):
                raise no_range(self.name)
            encoding = (getattr(result, "attributes", None) or {}).get("Content-Encoding")
            if encoding and encoding.strip().lower() != "identity":  # none was asked for (no Accept-Encoding)
                raise RemoteError(f"{self.name}: the server sent bytes {start}..{end} compressed (Content-Encoding: "
                                  f"{encoding}) though no encoding was asked for; serve the file without "
                                  "compression (e.g. gzip off for it) so that ranges are its bytes")
            if end - start <= COLLECT_BYTES:
                with memoryview(result.bytes()) as body:
                    sink.write(body)
                    self._count(landed=len(body))
            else:
                for piece in result.stream(min_chunk_size=STREAM_CHUNK_BYTES):
                    sink.write(memoryview(piece))
                    self._count(landed=len(piece))
        except H5StreamError:
            raise
        except OverflowError:
            raise RemoteError(f"{self.name}: the server sent more than the {end - start} bytes asked for "
                              f"at {start}") from None
        except Exception as exc:  # noqa: BLE001 - the client's own exception classes
            failure = self._error(exc)
        if failure is not None:  # outside the except, as in __init__
            raise failure
        got = sink.filled - begin
        self._count(nbytes=got)
        if got != end - start:
            raise RemoteError(f"{self.name}: short read at byte {start}: {got} of {end - start} bytes; the "
                              "connection ended early")

    def _count(self, *, requests: int = 0, nbytes: int = 0, landed: int = 0) -> None:
        """Any thread making requests."""
        with self._lock:
            self.requests += requests
            self.bytes_read += nbytes
            self.landed += landed

    def _error(self, exc: BaseException) -> Exception:
        return translate(exc, self.name, s3=self.location.scheme == "s3", timeout_s=self.options.timeout_s,
                         etag=getattr(self, "etag", None), query=self.location.query)


def open_source(url: str, options: RemoteOptions | None = None) -> RemoteSource:
    """A :class:`RemoteSource` on ``url``: one ``HEAD`` request, or the one-line error saying why it failed."""
    return RemoteSource(url, options)
