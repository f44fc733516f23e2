"""An HTTP file server with Range on 127.0.0.1 for the remote-store tests (SeaweedFS's S3 is in
:mod:`benchmarks.seaweed`), and Python's own ``http.server``, which ignores Range.

:class:`RangeServer` serves the files of one folder the way a static web server does (``GET``/``HEAD``, one
``Range`` per request, ``ETag``/``Last-Modified``, ``If-Match``), and can be told to misbehave: answer the next
requests with an error status, cut a body short, or never answer, so the client's retries and error paths run
against real sockets.
"""

from __future__ import annotations

import email.utils
import gzip
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real servers do
    server: RangeServer

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass

    def do_HEAD(self):
        self._serve(body=False)

    def do_GET(self):
        self._serve(body=True)

    def _serve(self, body: bool):
        self.server.count_request(self.command, self.headers.get("Authorization"))
        if self.server.delay_s:  # a far server: every answer comes that much later
            self.server.stopping.wait(self.server.delay_s)
        refused = self.server.refuses(self.command, urllib.parse.urlsplit(self.path).query)
        if refused is not None:  # as S3 answers a presigned link without its signature, expired, or for HEAD
            text = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AccessDenied</Code><Message>{refused}"
                    "</Message></Error>").encode()
            self.send_response(403)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(text)
            return
        required = self.server.required_headers
        if any(self.headers.get(k) != v for k, v in required.items()):
            self._status(401)
            return
        fault = self.server.take_fault()
        if fault is not None and fault[0] == "stall":  # accept the request, never answer it
            self.server.stalled.set()
            self.server.stopping.wait()
            self.close_connection = True
            return
        if fault is not None and fault[0] not in ("cut", "hang"):
            self._status(fault[0])
            return
        path = self.server.root / urllib.parse.unquote(self.path.lstrip("/").split("?")[0])  # as nginx does
        if not path.is_file():
            self._status(404)
            return
        st = path.stat()
        etag = f'"{st.st_mtime_ns:x}-{st.st_size:x}"'
        if_match = self.headers.get("If-Match")
        if if_match is not None and if_match.strip() not in ("*", etag):
            self._status(412)
            return
        size = st.st_size
        start, end = 0, size  # end exclusive
        status = 200
        requested = self.headers.get("Range")
        if requested is not None:
            m = re.fullmatch(r"bytes=(\d*)-(\d*)", requested.strip())
            if m is None or m.groups() == ("", ""):
                self._status(416)
                return
            if m.group(1) == "":
                start = max(0, size - int(m.group(2)))
            else:
                start = int(m.group(1))
                end = min(size, int(m.group(2)) + 1) if m.group(2) else size
            if start >= size or start >= end:
                self._status(416, {"Content-Range": f"bytes */{size}"})
                return
            status = 206
            if body and self.server.short_by:  # a well-formed 206 for fewer bytes than asked
                end = max(start + 1, end - self.server.short_by)
        if body and self.server.stalls(start, end):  # a read of bytes that hang: accept it, answer only if released
            self.server.released.wait()
            if self.server.stopping.is_set():
                self.close_connection = True
                return
        if body:
            self.server.note_range(start, end)
        if body and status == 206 and self.server.gzip_ranges:  # a body of other bytes than the range's
            with open(path, "rb") as fh:
                fh.seek(start)
                packed = gzip.compress(fh.read(end - start))
            self.send_response(status)
            self.send_header("Content-Length", str(len(packed)))
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
            if self.server.identity:
                self.send_header("ETag", etag)
            self.end_headers()
            self.wfile.write(packed)
            return
        self.send_response(status)
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        if self.server.identity:
            self.send_header("ETag", etag)
            self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if not body:
            return
        with open(path, "rb") as fh:
            fh.seek(start)
            remaining = end - start
            if fault is not None:  # ("cut" or "hang", n): send n bytes of the body, then drop the connection or hang
                remaining = min(remaining, fault[1])
            drip = self.server.drip_for(end - start)
            while remaining:
                chunk = fh.read(min(remaining, 1 << 20 if drip is None else drip[0]))
                if not chunk:
                    break
                self.wfile.write(chunk)
                remaining -= len(chunk)
                if drip is not None and remaining:  # a slow link: the next part of the body comes later
                    self.wfile.flush()
                    self.server.stopping.wait(drip[1])
        if fault is not None and fault[0] == "hang":  # the body stops midway, the connection stays open
            self.wfile.flush()
            self.server.stalled.set()
            self.server.stopping.wait()
        if fault is not None:
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)

    def _status(self, code: int, headers: dict | None = None):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()


class RangeServer(http.server.ThreadingHTTPServer):
    """Serves the files under ``root`` on ``http://127.0.0.1:PORT/`` from a thread; :meth:`stop` ends it.

    Faults queued with :meth:`fail_next`, :meth:`cut_next` or :meth:`stall_next` are served to the next
    requests in order; :meth:`cut_every` truncates every response after those.  ``requests`` counts the
    requests received, by method; ``ranges`` lists the ``[start, end)`` of every body it began to send.
    """

    daemon_threads = True
    block_on_close = False
    # Connections the kernel holds until the serving thread accepts them. socketserver's default, 5, is fewer than
    # a stream keeps in flight: while the test's own thread holds the GIL, the rest of a burst of connections
    # waited for SYN retransmits (1 s, 3 s, ...) and a client could give up before it was accepted.
    request_queue_size = 128

    def __init__(self, root: str | os.PathLike, host: str = "127.0.0.1", tls: tuple[str, str] | None = None):
        if ":" in host:  # an IPv6 address such as ::1
            self.address_family = socket.AF_INET6
        super().__init__((host, 0), _Handler)
        if tls is not None:  # (certificate file, key file): https
            import ssl

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.socket = context.wrap_socket(self.socket, server_side=True)
        self.root = Path(root)
        scheme = "http" if tls is None else "https"
        self.url = f"{scheme}://{f'[{host}]' if ':' in host else host}:{self.server_address[1]}/"
        self.requests: dict[str, int] = {}
        self.ranges: list[tuple[int, int]] = []
        self.required_headers: dict[str, str] = {}  # answered 401 without them
        self.required_query: str | None = None  # see require_query
        self.query_expired = False
        self.queries: list[str] = []  # the query string of every request received, in order
        self.authorizations: list[str | None] = []  # the Authorization header of every request (None: none)
        self._faults: list[tuple | None] = []
        self._always: tuple | None = None  # served once the queue is empty
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self.stopping = threading.Event()
        self.stalled = threading.Event()  # set when the first request stalled (stall_next, stall_bytes) arrives
        self.released = threading.Event()  # set by release_stalled or stop: stall_bytes' requests go on
        self.identity = True  # ETag and Last-Modified sent (see hide_identity)
        self.short_by = 0  # see shorten_ranges
        self.gzip_ranges = False  # see compress_ranges
        self.delay_s = 0.0  # see delay_each
        self._stall_span: tuple[int, int] | None = None
        self._drip: tuple[int, int, float] | None = None
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def fail_next(self, n: int, status: int = 503, *, after: int = 0) -> None:
        """Serve ``after`` requests normally, then answer the next ``n`` with ``status`` and no body."""
        with self._lock:
            self._faults.extend([None] * after + [(status,)] * n)

    def cut_next(self, after_bytes: int) -> None:
        """Send the next response's headers and ``after_bytes`` of its body, then close the connection."""
        with self._lock:
            self._faults.append(("cut", after_bytes))

    def hang_next(self, after_bytes: int) -> None:
        """Send the next response's headers and ``after_bytes`` of its body, then nothing more, the connection
        open (until :meth:`stop`): a body that stalls midway.  :attr:`stalled` is set when it does."""
        with self._lock:
            self._faults.append(("hang", after_bytes))

    def delay_each(self, seconds: float) -> None:
        """From now on, answer every request ``seconds`` after it arrives (a server far away)."""
        self.delay_s = float(seconds)

    def require_query(self, query: str) -> None:
        """From now on, answer 403 (S3's ``AccessDenied`` body) a request whose query string is not exactly
        ``query``, and every ``HEAD``, as S3 serves a presigned ``GET`` link."""
        with self._lock:
            self.required_query = query
            self.query_expired = False

    def expire_query(self) -> None:
        """From now on, answer 403 ``Request has expired`` to every request, as S3 does once a presigned link's
        time is up."""
        with self._lock:
            self.query_expired = True

    def refuses(self, method: str, query: str) -> str | None:
        """The reason a request is refused (see :meth:`require_query`), or None; notes its query string."""
        with self._lock:
            self.queries.append(query)
            if self.required_query is None:
                return None
            if self.query_expired:
                return "Request has expired"
            if query != self.required_query:
                return "Query-string authentication requires the Signature, Expires and AWSAccessKeyId parameters"
            if method == "HEAD":
                return "The request signature we calculated does not match the signature you provided"
            return None

    def cut_every(self, after_bytes: int) -> None:
        """From now on, cut every response's body after ``after_bytes`` bytes and close the connection (a proxy or
        server that truncates everything it sends)."""
        with self._lock:
            self._always = ("cut", after_bytes)

    def stall_next(self, n: int = 1, *, after: int = 0) -> None:
        """Serve ``after`` requests normally, then read the next ``n`` and never answer them (until :meth:`stop`)."""
        with self._lock:
            self._faults.extend([None] * after + [("stall",)] * n)

    def drip(self, min_bytes: int, chunk_bytes: int, pause_s: float) -> None:
        """From now on, send the body of every GET of ``min_bytes`` or more ``chunk_bytes`` at a time, ``pause_s``
        apart (a slow but healthy link: the bytes keep coming); smaller answers go at full speed."""
        with self._lock:
            self._drip = (int(min_bytes), int(chunk_bytes), float(pause_s))

    def drip_for(self, nbytes: int) -> tuple[int, float] | None:
        """``(chunk_bytes, pause_s)`` for a body of ``nbytes`` (see :meth:`drip`), or None: at full speed."""
        with self._lock:
            drip = self._drip
        return None if drip is None or nbytes < drip[0] else drip[1:]

    def stall_bytes(self, start: int, stop: int) -> None:
        """From now on, never answer a GET of a range that overlaps bytes ``[start, stop)`` (until :meth:`stop` or
        :meth:`release_stalled`), as a hung disk never returns a read; :attr:`stalled` is set when the first such
        request arrives."""
        with self._lock:
            self._stall_span = (int(start), int(stop))

    def stop_stalling(self) -> None:
        """Answer every range again (undoes :meth:`stall_bytes` for requests from now on)."""
        with self._lock:
            self._stall_span = None

    def shorten_ranges(self, nbytes: int) -> None:
        """From now on, answer a ranged GET with a 206 whose ``Content-Range`` and body end ``nbytes`` before the
        range asked for (a server or proxy that rewrites ranges)."""
        self.short_by = int(nbytes)

    def compress_ranges(self) -> None:
        """From now on, send each ranged GET's bytes gzip-compressed (``Content-Encoding: gzip``) though the client
        asked for no encoding (a misconfigured server or proxy)."""
        self.gzip_ranges = True

    def hide_identity(self) -> None:
        """From now on, send neither ``ETag`` nor ``Last-Modified`` (a server that says nothing of an object's
        version)."""
        self.identity = False

    def release_stalled(self) -> None:
        """Answer the requests :meth:`stall_bytes` holds now, late but whole (a server that was only slow), and
        every range from now on."""
        self.stop_stalling()
        self.released.set()

    def stalls(self, start: int, end: int) -> bool:
        """Whether a read of bytes ``[start, end)`` hangs (see :meth:`stall_bytes`); notes that one did."""
        with self._lock:
            span = self._stall_span
        if span is None or end <= span[0] or start >= span[1]:
            return False
        self.stalled.set()
        return True

    def take_fault(self):
        with self._lock:
            return self._faults.pop(0) if self._faults else self._always  # None: serve normally

    def count_request(self, method: str, authorization: str | None = None) -> None:
        with self._lock:
            self.requests[method] = self.requests.get(method, 0) + 1
            self.authorizations.append(authorization)

    def note_range(self, start: int, end: int) -> None:
        with self._lock:
            self.ranges.append((start, end))

    def process_request(self, request, client_address):
        with self._lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        with self._lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def stop(self) -> None:
        """Stop serving, drop every open connection and close the listening socket (idempotent): from then on
        connections are refused, as from a server that is gone.  The serving loop ends and the listening socket
        closes *before* stalled requests are let go, so a client retrying the moment its stalled request is
        dropped is refused, never served by a loop still running."""
        if self._thread.is_alive():
            self.shutdown()
            self._thread.join()
        self.socket.close()
        self.stopping.set()
        self.released.set()
        self.server_close()
        with self._lock:
            open_now = list(self._open)
        for conn in open_now:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Redirect(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: RedirectServer

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass

    def do_HEAD(self):
        self._redirect()

    def do_GET(self):
        self._redirect()

    def _redirect(self):
        self.server.count_request(self.command)
        self.send_response(self.server.status)
        self.send_header("Location", self.server.to)
        self.send_header("Content-Length", "0")
        self.end_headers()


class RedirectServer(http.server.ThreadingHTTPServer):
    """Answers every request on ``http://127.0.0.1:PORT/`` with ``status`` (301, 302, 307...) and ``Location: to``,
    from a thread, as a download link in front of a CDN or a presigned S3 link does; :meth:`stop` ends it.
    ``requests`` counts the requests it answered, by method."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 128

    def __init__(self, status: int, to: str):
        super().__init__(("127.0.0.1", 0), _Redirect)
        self.status, self.to = int(status), to
        self.url = f"http://127.0.0.1:{self.server_address[1]}/"
        self.requests: dict[str, int] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def count_request(self, method: str) -> None:
        with self._lock:
            self.requests[method] = self.requests.get(method, 0) + 1

    def stop(self) -> None:
        """Stop serving and close the listening socket (idempotent)."""
        if self._thread.is_alive():
            self.shutdown()
            self._thread.join()
        self.server_close()


class PlainHTTPServer:
    """``python -m http.server`` serving ``root`` on 127.0.0.1, in a process of its own: the first server a user
    tries, which answers every ranged GET with the whole file.  ``url`` ends with a slash; :meth:`stop` ends
    the process and reaps it (idempotent)."""

    def __init__(self, root: str | os.PathLike):
        self.process = subprocess.Popen(
            [sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", str(root)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
        line = self.process.stdout.readline()  # "Serving HTTP on 127.0.0.1 port N ...", printed once it listens
        m = re.search(r" port (\d+)", line)
        if m is None:
            self.stop()
            raise RuntimeError(f"python -m http.server did not start: {line!r}")
        self.url = f"http://127.0.0.1:{m.group(1)}/"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.process.stdout.close()



_SERVE_IN_PROCESS = """
import json, sys
sys.path.insert(0, sys.argv[1])
from remote_servers import RangeServer
server = RangeServer(sys.argv[2])
print(json.dumps(server.url), flush=True)
for line in sys.stdin:  # one call a line, answered with its result (JSON) once done; the end of input stops it
    name, args, kwargs = json.loads(line)
    if name == "stalled_wait":
        out = server.stalled.wait(*args)
    elif name == "stalled_is_set":
        out = server.stalled.is_set()
    elif name == "require_header":
        server.required_headers[args[0]] = args[1]
        out = None
    elif name in ("requests", "ranges", "queries", "authorizations"):
        out = dict(server.requests) if name == "requests" else list(getattr(server, name))
    else:
        out = getattr(server, name)(*args, **kwargs)
    print(json.dumps(out), flush=True)
server.stop()
"""


class _Stalled:
    """``server.stalled`` of a :class:`RangeServerProcess`: ``wait(timeout)`` and ``is_set()``."""

    def __init__(self, server: RangeServerProcess):
        self._server = server

    def wait(self, timeout: float | None = None) -> bool:
        return self._server.call("stalled_wait", timeout)

    def is_set(self) -> bool:
        return self._server.call("stalled_is_set")


class _Headers:
    """``server.required_headers`` of a :class:`RangeServerProcess`: set items only."""

    def __init__(self, server: RangeServerProcess):
        self._server = server

    def __setitem__(self, key: str, value: str) -> None:
        self._server.call("require_header", key, value)


class RangeServerProcess:
    """A :class:`RangeServer` over ``root`` in a process of its own, used as one in this process: nothing the
    test's interpreter does (its threads, a client library holding its GIL, what earlier tests left in it) can slow
    or stop the serving, as nothing in a client's process does to a real server.  Each method call (``fail_next``,
    ``cut_every``, ``stall_bytes``, ``stop``...) is made in the server's process and is in force when it returns;
    ``requests`` and ``ranges`` are read from it; ``stalled`` waits on it.  :meth:`close` ends the process and
    reaps it (idempotent); a context manager."""

    def __init__(self, root: str | os.PathLike):
        here = os.path.dirname(os.path.abspath(__file__))
        self.root = Path(root)
        self.process = subprocess.Popen([sys.executable, "-c", _SERVE_IN_PROCESS, here, str(root)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        first = self.process.stdout.readline().strip()
        self.url = json.loads(first) if first.startswith('"') else first
        if not str(self.url).startswith("http://127.0.0.1:"):
            self.close()
            raise RuntimeError(f"the HTTP range server did not start (it printed {first!r})")
        self.server_address = ("127.0.0.1", int(self.url.rstrip("/").rsplit(":", 1)[1]))
        self.stalled = _Stalled(self)
        self.required_headers = _Headers(self)

    def call(self, name: str, *args, **kwargs):
        """``name(*args, **kwargs)`` in the server's process; its result."""
        self.process.stdin.write(json.dumps([name, args, kwargs]) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"the HTTP range server ended before it answered {name}{args}")
        return json.loads(answer)

    def __getattr__(self, name: str):
        if name.startswith("_") or name in ("process", "root", "url", "server_address", "stalled",
                                            "required_headers"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self.call(name, *args, **kwargs)

    @property
    def requests(self) -> dict:
        return self.call("requests")

    @property
    def ranges(self) -> list[tuple[int, int]]:
        return [tuple(r) for r in self.call("ranges")]

    @property
    def queries(self) -> list[str]:
        return self.call("queries")

    @property
    def authorizations(self) -> list[str | None]:
        return self.call("authorizations")

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.close()  # the server stops at the end of its input
                self.process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.process.stdout.close()

    def __enter__(self) -> RangeServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
