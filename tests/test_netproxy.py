"""benchmarks/netproxy.py: the latency-and-bandwidth proxy between a client and a server on 127.0.0.1, over real
sockets (an HTTP server with Range from tests/remote_servers.py), and its use by ``benchmarks.remote``.

Timing is checked only from below (a proxy that adds a delay cannot make a response arrive sooner), on monotonic
clocks; nothing sleeps to synchronise.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from benchmarks.netproxy import NetProxy, RequestCounter, TokenBucket

pytestmark = pytest.mark.usefixtures("no_leaks")


def _port(server) -> int:
    return server.server_address[1]


def _request(method: str, path: str, headers: dict | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _read_response(sock: socket.socket, head_only: bool = False) -> tuple[bytes, bytes]:
    """One whole response from ``sock``: ``(raw bytes, body)`` (``Content-Length`` framing, as the server uses)."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        piece = sock.recv(65536)
        assert piece, f"connection closed mid-head: {raw!r}"
        raw += piece
    head, _, body = raw.partition(b"\r\n\r\n")
    length = 0 if head_only else int(re.search(rb"Content-Length: (\d+)", head).group(1))
    while len(body) < length:
        piece = sock.recv(1 << 20)
        assert piece, "connection closed mid-body"
        body += piece
    assert len(body) == length, "more bytes than the response announced"
    return head + b"\r\n\r\n" + body, body


def _store(range_server) -> bytes:
    return (range_server.root / "store.h5").read_bytes()


def test_the_proxy_forwards_the_bytes_exactly(range_server):
    """A ranged GET, a HEAD and a whole-file GET through the proxy answer what the server answers directly."""
    data = _store(range_server)
    with NetProxy(("127.0.0.1", _port(range_server)), latency_ms=1, bandwidth_mbs=500) as proxy, \
            socket.create_connection(("127.0.0.1", proxy.port)) as sock:
        sock.sendall(_request("GET", "/store.h5", {"Range": "bytes=1000-1999999"}))
        _, body = _read_response(sock)
        assert body == data[1000:2000000]
        sock.sendall(_request("HEAD", "/store.h5"))
        raw, _ = _read_response(sock, head_only=True)
        assert f"Content-Length: {len(data)}".encode() in raw
        sock.sendall(_request("GET", "/store.h5"))
        _, body = _read_response(sock)
        assert body == data
    assert proxy.stats().requests == 3


def test_the_proxy_counts_requests_and_bytes_of_a_kept_alive_connection(range_server):
    """Four requests on one connection, some sent in pieces and two in one write: four requests by method, every
    byte sent up and every byte received down, one connection."""
    sent = received = 0
    requests = [_request("GET", "/store.h5", {"Range": "bytes=0-99"}),
                _request("GET", "/store.h5", {"Range": "bytes=5000-69999"}),
                _request("HEAD", "/store.h5"),
                _request("GET", "/store.h5", {"Range": "bytes=100-199"})]
    with NetProxy(("127.0.0.1", _port(range_server))) as proxy, \
            socket.create_connection(("127.0.0.1", proxy.port)) as sock:
        first = requests[0]
        for i in range(0, len(first), 7):  # the first head in pieces of 7 bytes, then one by itself
            sock.sendall(first[i:i + 7])
        raw, body = _read_response(sock)
        sent, received = sent + len(first), received + len(raw)
        assert len(body) == 100
        sock.sendall(requests[1])
        raw, body = _read_response(sock)
        sent, received = sent + len(requests[1]), received + len(raw)
        assert len(body) == 65000
        sock.sendall(requests[2])
        raw, _ = _read_response(sock, head_only=True)
        sent, received = sent + len(requests[2]), received + len(raw)
        sock.sendall(requests[3])
        raw, body = _read_response(sock)
        sent, received = sent + len(requests[3]), received + len(raw)
        stats = proxy.stats()
    assert (stats.requests, stats.methods) == (4, {"GET": 3, "HEAD": 1})
    assert (stats.bytes_up, stats.bytes_down, stats.connections) == (sent, received, 1)
    assert range_server.requests == {"GET": 3, "HEAD": 1}


def test_request_heads_are_found_in_any_split_and_bodies_are_not_taken_for_requests():
    """A GET, a PUT whose Content-Length body holds the text of a request, a chunked POST whose chunks and trailer
    do too, then a HEAD after a stray CRLF: four requests, however the bytes are cut."""
    body = b"GET /not-a-request HTTP/1.1\r\n\r\n"
    chunked = (b"POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               + f"{len(body):x};ext=1\r\n".encode() + body + b"\r\n" + b"3\r\nabc\r\n0\r\n"
               + b"X-Trailer: GET / HTTP/1.1\r\n\r\n")
    stream = (_request("GET", "/a") + _request("PUT", "/b", {"Content-Length": len(body)}) + body + chunked
              + b"\r\n" + _request("HEAD", "/c"))
    expected = ["GET", "PUT", "POST", "HEAD"]
    whole = RequestCounter()
    assert whole.feed(stream) == expected
    for cut in range(1, len(stream)):
        counter = RequestCounter()
        assert counter.feed(stream[:cut]) + counter.feed(stream[cut:]) == expected, cut
    counter = RequestCounter()
    assert [m for i in range(len(stream)) for m in counter.feed(stream[i:i + 1])] == expected
    assert not counter.opaque
    junk = RequestCounter()
    assert junk.feed(os.urandom(1 << 17).replace(b"\r\n", b"..")) == [] and junk.opaque


def test_each_response_on_a_kept_alive_connection_waits_for_the_latency(range_server):
    """Four requests, one after the other on one connection, through a 100 ms proxy take at least 4 x 100 ms, and
    each response comes at least 100 ms after its request (a delay per connection would give 100 ms in all: this
    server's own responses take about 40 ms each, Nagle's algorithm meeting delayed ACKs, so the delay is set
    well above that)."""
    latency_s, n = 0.100, 4
    with NetProxy(("127.0.0.1", _port(range_server)), latency_ms=latency_s * 1000) as proxy, \
            socket.create_connection(("127.0.0.1", proxy.port)) as sock:
        t0 = time.monotonic()
        for i in range(n):
            t = time.monotonic()
            sock.sendall(_request("GET", "/store.h5", {"Range": f"bytes={i * 10}-{i * 10 + 9}"}))
            _read_response(sock)
            assert time.monotonic() - t >= latency_s
        assert time.monotonic() - t0 >= n * latency_s
        assert proxy.stats().requests == n


def test_the_bandwidth_cap_bounds_a_transfer_from_below(range_server):
    """4 MB at 20 MB/s through one connection take at least 4/20 s less what the bucket lets through at once."""
    rate_bps, burst, size = 20e6, 64 << 10, 4_000_000
    with NetProxy(("127.0.0.1", _port(range_server)), bandwidth_mbs=rate_bps / 1e6, burst_bytes=burst) as proxy, \
            socket.create_connection(("127.0.0.1", proxy.port)) as sock:
        t0 = time.monotonic()
        sock.sendall(_request("GET", "/store.h5", {"Range": f"bytes=0-{size - 1}"}))
        _, body = _read_response(sock)
        elapsed = time.monotonic() - t0
    assert len(body) == size
    assert elapsed >= size / rate_bps - burst / rate_bps


def test_the_token_bucket_charges_every_byte():
    """Charges of any sizes at any times: the last wait ends no earlier than B / rate - burst / rate after the
    first charge, and a bucket left idle refills to its burst, not beyond."""
    bucket = TokenBucket(1000.0, 100, now_s=0.0)
    now, total = 0.0, 0
    for n in (50, 300, 1, 999, 20):
        now += bucket.wait_s(n, now)
        total += n
        assert now >= total / 1000.0 - 0.1
    idle = now + 60.0
    assert bucket.wait_s(100, idle) == 0.0  # a burst's worth passes at once after a pause
    assert bucket.wait_s(100, idle) == pytest.approx(0.1)  # the next burst waits for its tokens
    assert TokenBucket(None, 100, 0.0).wait_s(10**9, 0.0) == 0.0


def _own_sockets(server_port: int, proxy_port: int) -> list:
    """This process's TCP sockets of the proxy's (listening on its port, or connected to the server from this side)
    and its unix sockets (the event loop's self-pipe), with the file descriptors that are not sockets (its epoll)."""
    me = psutil.Process()
    tcp = [c for c in me.net_connections("tcp")
           if c.laddr.port == proxy_port or (c.raddr and c.raddr.port == server_port)]
    others = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # the listing's own descriptor, closed by now
            continue
        if not target.startswith("socket:"):
            others.append(target)
    return [tcp, len(me.net_connections("unix")), sorted(others)]


def test_the_proxy_stops_with_no_thread_and_no_socket_left(range_server):
    """Closed with an idle kept-alive connection and a request the server never answers: the client connections
    see the end, the port refuses, neither its thread nor any socket or descriptor of the proxy's is left, and
    closing again is harmless."""
    server_port = _port(range_server)
    before = _own_sockets(server_port, 0)
    range_server.stall_next(1, after=1)
    proxy = NetProxy(("127.0.0.1", server_port), latency_ms=1)
    idle = socket.create_connection(("127.0.0.1", proxy.port))
    stalled = socket.create_connection(("127.0.0.1", proxy.port))
    with idle, stalled:
        idle.sendall(_request("GET", "/store.h5", {"Range": "bytes=0-9"}))
        _read_response(idle)
        stalled.sendall(_request("GET", "/store.h5", {"Range": "bytes=0-9"}))
        assert range_server.stalled.wait(10)
        assert len(_own_sockets(server_port, proxy.port)[0]) == 5  # listening, two accepted, two to the server
        proxy.close()
        idle.settimeout(10)
        stalled.settimeout(10)
        assert idle.recv(1) == b"" and stalled.recv(1) == b""
    proxy.close()
    assert not [t for t in threading.enumerate() if t.name == "h5stream-netproxy"]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=5).close()
    assert _own_sockets(server_port, proxy.port) == before


def test_the_proxy_forwards_to_loopback_addresses_only():
    with pytest.raises(ValueError, match="not a loopback address"):
        NetProxy(("10.0.0.1", 80))
    with pytest.raises(ValueError, match="not a loopback address"):
        NetProxy(("example.com", 80))
    with pytest.raises(ValueError, match="must not be negative"):
        NetProxy(("127.0.0.1", 80), latency_ms=-1)


def test_a_stream_through_the_proxy_sends_what_the_server_receives(range_server):
    """h5stream reading a URL through the proxy gets the local file's batches; the proxy counted every request the
    server received, and more response bytes than the rows'."""
    import numpy as np

    import h5stream

    local = str(range_server.root / "store.h5")
    with NetProxy(("127.0.0.1", _port(range_server)), latency_ms=2, bandwidth_mbs=200) as proxy:
        with h5stream.open(f"{proxy.url}/store.h5", batch_size=100, seed=1) as remote, \
                h5stream.open(local, batch_size=100, seed=1) as plain:
            for (x, y), (lx, ly) in zip(remote, plain, strict=True):
                assert np.array_equal(x, lx) and np.array_equal(y, ly)
            row_bytes = remote.meta.row_bytes * remote.meta.rows
        stats = proxy.stats()
    assert stats.requests == sum(range_server.requests.values()) > 1
    assert stats.bytes_down > row_bytes


def test_the_proxy_runs_from_the_command_line_until_told_to_stop(range_server):
    """``python -m benchmarks.netproxy`` prints where it listens, forwards, and on SIGTERM prints its counts."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.netproxy", "--upstream",
                             f"127.0.0.1:{_port(range_server)}", "--latency-ms", "1", "--seconds", "120"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        port = int(re.search(r"127\.0\.0\.1:(\d+) ->", line).group(1))
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(_request("GET", "/store.h5", {"Range": "bytes=0-9"}))
            _, body = _read_response(sock)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    stats = json.loads(out.strip().splitlines()[-1])
    assert body == _store(range_server)[:10]
    assert (stats["requests"], stats["methods"], stats["connections"]) == (1, {"GET": 1}, 1)
    bad = subprocess.run([sys.executable, "-m", "benchmarks.netproxy", "--upstream", "192.0.2.1:80"],
                         capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and bad.stderr.startswith("netproxy: error: ") and "loopback" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
