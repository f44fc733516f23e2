"""A TCP proxy on 127.0.0.1 that makes a local server cost what a cloud object store costs: time to first byte and
bandwidth per connection, and counts what crosses it.

A server on 127.0.0.1 answers in microseconds and at memory speed, so a benchmark against it cannot see what
S3 or GCS charge for every request (10-50 ms to its first byte) nor the bandwidth of one connection (about
100 MB/s): the number and size of requests hardly show.  :class:`NetProxy` sits between the client and that
server and adds both:

* **latency** -- every response's first byte is held until ``latency_ms`` after its request's head arrived.
  HTTP/1.1 requests on one connection are sequential (the clients used here -- obstore, urllib, http.client --
  do not pipeline), so the bytes the server sends after a request belong to that request's response: each
  request on a kept-alive connection pays the delay, not only the connection's first;
* **bandwidth** -- each direction of each connection goes through its own token bucket of ``bandwidth_mbs``
  MB/s (10**6 bytes) holding at most ``burst_bytes``: ``B`` bytes take at least ``B / rate - burst / rate``;
* **counts** -- requests (HTTP/1.1 request heads, parsed by :class:`RequestCounter`; bodies with
  ``Content-Length`` or chunked are skipped, not taken for requests), per method, bytes client -> server
  (``bytes_up``) and server -> client (``bytes_down``), connections; :meth:`NetProxy.stats` reads them.

It listens on 127.0.0.1 only and forwards to a loopback address only.  Its event loop runs in one thread of the
process that owns it (never a process of its own, so it cannot outlive its owner); :meth:`NetProxy.close` (or
leaving the ``with`` block, or the facade being garbage-collected) closes the listening socket and every
connection, ends the loop and joins the thread.  From a shell::

    python -m benchmarks.netproxy --upstream 127.0.0.1:8333 --latency-ms 20 --bandwidth-mbs 100 --seconds 600

prints the address it listens on, forwards until ``--seconds`` have passed or it gets SIGINT/SIGTERM, then prints
its counts as one JSON object.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import signal
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field

from benchmarks.harness import new_parser

READ_BYTES = 256 << 10
"""Most bytes read from a socket at once (one step of the token bucket)."""
BURST_BYTES = 256 << 10
"""Default size of a token bucket: the bytes a connection may send at once after a pause."""
MAX_HEAD_BYTES = 64 << 10
"""A request head longer than this is not HTTP as far as the counter is concerned; it stops counting that
connection (its bytes are still forwarded and counted)."""
START_S = 10.0
"""How long :class:`NetProxy` waits for its thread to listen, and for its loop to stop, before giving up."""


def loopback_address(host: str, port: int, what: str) -> tuple[str, int]:
    """``(host, port)`` checked: a loopback address (``127.0.0.0/8``, ``::1`` or ``localhost``) and a port in
    1-65535; ValueError naming ``what`` and the fix otherwise."""
    try:
        loop = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loop = False
    if not loop:
        raise ValueError(f"{what}: {host!r} is not a loopback address; the proxy forwards to a server on this "
                         "machine only (127.0.0.1, ::1 or localhost)")
    if not 0 < int(port) < 65536:
        raise ValueError(f"{what}: port {port} is not in 1-65535")
    return host, int(port)


def parse_host_port(text: str, what: str) -> tuple[str, int]:
    """``"127.0.0.1:8333"`` (or ``"[::1]:8333"``) -> ``("127.0.0.1", 8333)``, checked by :func:`loopback_address`."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{what}: {text!r} is not HOST:PORT (e.g. 127.0.0.1:8333)")
    return loopback_address(host.strip("[]"), int(port), what)


class RequestCounter:
    """Finds the HTTP/1.1 request heads in the bytes a client sends, fed in pieces of any size (pure: no I/O).

    :meth:`feed` returns the methods of the request heads completed by that piece, in order.  A body announced by
    ``Content-Length`` or ``Transfer-Encoding: chunked`` is skipped (text in a body is never a request).  A head
    longer than :data:`MAX_HEAD_BYTES` or a chunk size that is not hex turns the counter off for good
    (``opaque``): the stream is not HTTP as this counter knows it.
    """

    def __init__(self):
        self._head = bytearray()  # the head (or chunk-size / trailer line) being assembled
        self._body_left = 0  # bytes of a Content-Length body, or of a chunk's data and its CRLF, still to skip
        self._state = "head"  # head, body, chunk_size, chunk_data, trailer
        self.opaque = False

    def feed(self, data: bytes) -> list[str]:
        methods: list[str] = []
        view = memoryview(data)
        while len(view) and not self.opaque:
            if self._state in ("body", "chunk_data"):
                take = min(self._body_left, len(view))
                self._body_left -= take
                view = view[take:]
                if self._body_left == 0:
                    self._state = "head" if self._state == "body" else "chunk_size"
                continue
            end = b"\r\n\r\n" if self._state == "head" else b"\r\n"
            # the terminator may straddle the previous piece: search from just before the new bytes
            start = max(0, len(self._head) - len(end) + 1)
            self._head += view
            at = self._head.find(end, start)
            if at < 0:
                view = view[len(view):]
                if len(self._head) > MAX_HEAD_BYTES:
                    self.opaque = True
                continue
            rest = len(self._head) - (at + len(end))
            line, view = bytes(self._head[:at]).lstrip(b"\r\n"), view[len(view) - rest:]
            self._head.clear()
            method = self._line(line)
            if method is not None:
                methods.append(method)
        return methods

    def _line(self, line: bytes) -> str | None:
        """Act on a completed head, chunk-size line or trailer line; the method where it was a request head."""
        if self._state == "head":
            if not line.strip():  # stray CRLFs between requests (RFC 9112 lets a server ignore them)
                return None
            first, *headers = line.split(b"\r\n")
            length, chunked = 0, False
            for header in headers:
                name, _, value = header.partition(b":")
                name = name.strip().lower()
                if name == b"content-length" and value.strip().isdigit():
                    length = int(value)
                elif name == b"transfer-encoding" and b"chunked" in value.lower():
                    chunked = True
            if chunked:
                self._state = "chunk_size"
            elif length:
                self._state, self._body_left = "body", length
            return first.split(b" ", 1)[0].decode("latin-1")
        if self._state == "chunk_size":
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                self.opaque = True
                return None
            if size == 0:
                self._state = "trailer"
            else:
                self._state, self._body_left = "chunk_data", size + 2  # the data and its CRLF
            return None
        if not line:  # the empty line ending the trailer (a non-empty line is a trailer field: skipped)
            self._state = "head"
        return None


class TokenBucket:
    """A rate limit of ``rate_bps`` bytes per second holding at most ``burst_bytes`` (pure: it computes waits, the
    caller sleeps).  :meth:`wait_s` charges ``n`` bytes at ``now_s`` (a monotonic clock) and returns how long to
    wait before sending them; after any sequence of charges totalling ``B`` bytes from ``t0``, the last wait
    ends no earlier than ``t0 + B / rate - burst / rate``.  ``rate_bps`` None: no limit."""

    def __init__(self, rate_bps: float | None, burst_bytes: int, now_s: float):
        self.rate_bps = rate_bps
        self.tolerance_s = burst_bytes / rate_bps if rate_bps else 0.0
        self._due_s = now_s  # when the bytes charged so far are paid for at the rate

    def wait_s(self, n: int, now_s: float) -> float:
        if not self.rate_bps:
            return 0.0
        self._due_s = max(self._due_s, now_s) + n / self.rate_bps
        return max(0.0, self._due_s - self.tolerance_s - now_s)


@dataclass
class ProxyStats:
    """What crossed the proxy: requests (heads, with their methods), bytes per direction, connections accepted,
    connections to the server that failed, connections whose bytes were not HTTP to the counter."""

    requests: int = 0
    methods: dict[str, int] = field(default_factory=dict)
    bytes_up: int = 0
    bytes_down: int = 0
    connections: int = 0
    upstream_failures: int = 0
    opaque_connections: int = 0

    def copy(self) -> ProxyStats:
        return ProxyStats(self.requests, dict(self.methods), self.bytes_up, self.bytes_down, self.connections,
                          self.upstream_failures, self.opaque_connections)

    def minus(self, before: ProxyStats) -> dict:
        """What crossed between the snapshot ``before`` and this one, as a plain dict."""
        methods = {k: v - before.methods.get(k, 0) for k, v in self.methods.items()
                   if v - before.methods.get(k, 0)}
        return {"requests": self.requests - before.requests, "methods": methods,
                "bytes_up": self.bytes_up - before.bytes_up, "bytes_down": self.bytes_down - before.bytes_down,
                "connections": self.connections - before.connections,
                "upstream_failures": self.upstream_failures - before.upstream_failures}

    def as_dict(self) -> dict:
        return self.minus(ProxyStats()) | {"opaque_connections": self.opaque_connections}


class _Link:
    """One client connection and its connection to the server: the latest request's arrival, the buckets."""

    def __init__(self, rate_bps: float | None, burst_bytes: int):
        now = time.monotonic()
        self.up = TokenBucket(rate_bps, burst_bytes, now)
        self.down = TokenBucket(rate_bps, burst_bytes, now)
        self.counter = RequestCounter()
        self.awaiting_since: float | None = None  # arrival of the request whose response has not begun
        self.opaque = False  # counted among the opaque connections


class NetProxy:
    """Forward ``127.0.0.1:port`` to ``upstream`` (a loopback ``(host, port)``) with ``latency_ms`` before each
    response's first byte and ``bandwidth_mbs`` MB/s per connection and direction (None or 0: no limit).

    ``port`` 0 picks a free one; :attr:`port`, :attr:`url` (``http://127.0.0.1:PORT``) say which.  The proxy
    listens from the constructor's return until :meth:`close` (idempotent; also on leaving ``with`` and when the
    object is garbage-collected), which closes every socket and joins the loop's thread.  :meth:`stats` may be
    called from any thread; the counts are updated by the loop's thread before the bytes they count are
    forwarded, so a client that has received a response has been counted with it.
    """

    def __init__(self, upstream: tuple[str, int], *, latency_ms: float = 0.0, bandwidth_mbs: float | None = None,
                 burst_bytes: int = BURST_BYTES, port: int = 0):
        self.upstream = loopback_address(*upstream, "the proxy's upstream")
        if latency_ms < 0 or (bandwidth_mbs is not None and bandwidth_mbs < 0) or burst_bytes <= 0:
            raise ValueError(f"the proxy's latency_ms ({latency_ms}) and bandwidth_mbs ({bandwidth_mbs}) must not be "
                             f"negative and burst_bytes ({burst_bytes}) must be positive")
        self.latency_s = latency_ms / 1000.0
        self.rate_bps = bandwidth_mbs * 1e6 if bandwidth_mbs else None
        self.burst_bytes = int(burst_bytes)
        self._state = _LoopState()
        self._finalizer = weakref.finalize(self, self._state.stop)
        self._state.start(self, port)
        self.port = self._state.port
        self.url = f"http://127.0.0.1:{self.port}"

    def stats(self) -> ProxyStats:
        """A snapshot of the counts so far (any thread)."""
        with self._state.lock:
            return self._state.stats.copy()

    def close(self) -> None:
        """Stop listening, close every connection, end the loop and join its thread (idempotent; owner's thread)."""
        self._finalizer()

    def __enter__(self) -> NetProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def describe(self) -> str:
        rate = f"{self.rate_bps / 1e6:g} MB/s" if self.rate_bps else "unlimited"
        return (f"{self.latency_s * 1000:g} ms to first byte, {rate} per connection (burst "
                f"{self.burst_bytes >> 10} KiB)")


class _LoopState:
    """The loop, its thread, the listening server and the open connections: kept apart from :class:`NetProxy` so
    its finalizer can stop them without holding the facade."""

    def __init__(self):
        self.lock = threading.Lock()
        self.stats = ProxyStats()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.port = 0
        self._stopping: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._tasks: set[asyncio.Task] = set()

    def start(self, proxy: NetProxy, port: int) -> None:
        """Start the loop's thread and return once it listens (owner's thread)."""
        settings = (proxy.upstream, proxy.latency_s, proxy.rate_bps, proxy.burst_bytes)
        self.thread = threading.Thread(target=self._run, args=(settings, port), name="h5stream-netproxy",
                                       daemon=True)
        self.thread.start()
        if not self._ready.wait(START_S):
            self.stop()
            raise RuntimeError(f"the proxy did not listen on 127.0.0.1 within {START_S:g} s")
        if self._error is not None:
            self.thread.join()
            raise RuntimeError(f"the proxy could not listen on 127.0.0.1:{port}: {self._error}") from self._error

    def _run(self, settings, port: int) -> None:
        """The loop's thread: serve until :meth:`stop`."""
        try:
            asyncio.run(self._main(settings, port))
        except BaseException as exc:  # noqa: BLE001 - reported to the owner by start()
            self._error = exc
        finally:
            self._ready.set()

    async def _main(self, settings, port: int) -> None:
        upstream, latency_s, rate_bps, burst_bytes = settings
        self.loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()

        async def serve(reader, writer):
            task = asyncio.current_task()
            self._tasks.add(task)
            try:
                await self._connection(reader, writer, upstream, latency_s, rate_bps, burst_bytes)
            except asyncio.CancelledError:  # the proxy stopping; ends quietly (3.11's streams log a cancelled task)
                pass
            finally:
                self._tasks.discard(task)

        server = await asyncio.start_server(serve, "127.0.0.1", port, limit=READ_BYTES)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stopping.wait()
            server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _connection(self, c_reader, c_writer, upstream, latency_s, rate_bps, burst_bytes) -> None:
        """One client connection: connect to the server, pump both ways until both ends are done; close both."""
        with self.lock:
            self.stats.connections += 1
        s_writer = None
        try:
            try:
                s_reader, s_writer = await asyncio.open_connection(*upstream, limit=READ_BYTES)
            except OSError:
                with self.lock:
                    self.stats.upstream_failures += 1
                return
            link = _Link(rate_bps, burst_bytes)
            up = asyncio.ensure_future(self._requests(c_reader, s_writer, link))
            down = asyncio.ensure_future(self._responses(s_reader, c_writer, link, latency_s))
            try:
                # A client's EOF was passed on to the server, whose answer still flows; the server's end, or a
                # failed or reset side, ends both.
                done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_EXCEPTION)
                if down in done or any(t.exception() is not None for t in done):
                    up.cancel()
                    down.cancel()
            finally:  # also when the proxy stops (this task cancelled)
                up.cancel()
                down.cancel()
                await asyncio.gather(up, down, return_exceptions=True)
        finally:
            writers = [w for w in (c_writer, s_writer) if w is not None]
            try:
                for w in writers:
                    w.close()  # what is still buffered is sent first
                for w in writers:
                    with contextlib.suppress(OSError):
                        await w.wait_closed()
            finally:  # cancelled (the proxy stopping) while a peer does not read: drop what is buffered
                for w in writers:
                    w.transport.abort()

    async def _requests(self, reader, writer, link: _Link) -> None:
        """Client -> server: count the request heads (each restarts the response delay), throttle, forward."""
        while data := await reader.read(READ_BYTES):
            methods = link.counter.feed(data)
            newly_opaque, link.opaque = link.counter.opaque and not link.opaque, link.counter.opaque
            with self.lock:
                self.stats.bytes_up += len(data)
                self.stats.requests += len(methods)
                for m in methods:
                    self.stats.methods[m] = self.stats.methods.get(m, 0) + 1
                self.stats.opaque_connections += newly_opaque
            if methods:
                link.awaiting_since = time.monotonic()  # set before the server can see the request
            await _throttle(link.up, len(data))
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    async def _responses(self, reader, writer, link: _Link, latency_s: float) -> None:
        """Server -> client: hold a response's first byte until its request is ``latency_s`` old, throttle,
        count, forward."""
        while data := await reader.read(READ_BYTES):
            if link.awaiting_since is not None:
                wait = link.awaiting_since + latency_s - time.monotonic()
                link.awaiting_since = None
                if wait > 0:
                    await asyncio.sleep(wait)
            await _throttle(link.down, len(data))
            with self.lock:
                self.stats.bytes_down += len(data)
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    def stop(self) -> None:
        """Stop the loop and join its thread (idempotent; any thread but the loop's)."""
        thread, loop, stopping = self.thread, self.loop, self._stopping
        if thread is None or not thread.is_alive():
            return
        if thread is threading.current_thread():  # collected on the loop's own thread: it ends on its own
            loop.call_soon(stopping.set)
            return
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(stopping.set)
        thread.join(START_S)
        if thread.is_alive():
            raise RuntimeError(f"the proxy's thread did not stop within {START_S:g} s")


async def _throttle(bucket: TokenBucket, n: int) -> None:
    wait = bucket.wait_s(n, time.monotonic())
    if wait > 0:
        await asyncio.sleep(wait)


def main(argv=None) -> int:
    parser = new_parser(__doc__.splitlines()[0], prog="python -m benchmarks.netproxy")
    parser.add_argument("--upstream", required=True, help="the server, HOST:PORT on this machine (e.g. 127.0.0.1:8333)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on, on 127.0.0.1 (default: a free one)")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="delay before each response")
    parser.add_argument("--bandwidth-mbs", type=float, default=100.0,
                        help="MB/s per connection and direction; 0: no limit")
    parser.add_argument("--burst-kib", type=int, default=BURST_BYTES >> 10, help="token bucket size")
    parser.add_argument("--seconds", type=float, default=600.0, help="stop after this long, seconds")
    args = parser.parse_args(argv)
    try:
        upstream = parse_host_port(args.upstream, "--upstream")
        proxy = NetProxy(upstream, latency_ms=args.latency_ms, bandwidth_mbs=args.bandwidth_mbs or None,
                         burst_bytes=args.burst_kib << 10, port=args.port)
    except (ValueError, RuntimeError) as exc:
        print(f"netproxy: error: {exc}", file=sys.stderr)
        return 2
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    with proxy:
        print(f"listening on {proxy.url} -> {upstream[0]}:{upstream[1]}, {proxy.describe()}", flush=True)
        done.wait(args.seconds)
        stats = proxy.stats()
    print(json.dumps(stats.as_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
