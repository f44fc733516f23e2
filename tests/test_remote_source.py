"""The remote byte source against real servers on 127.0.0.1: SeaweedFS's S3 and an HTTP server with Range.

Reads must equal the local file's bytes; every failure must be one h5stream error of the right class, within
``timeout_s``, leaving no thread or process behind.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from conftest import finishes_within

from h5stream.errors import (
    RemoteError,
    RemoteUnavailableError,
    StoreChangedError,
    StoreFormatError,
    StoreNotFoundError,
    StorePermissionError,
)
from h5stream.remote.config import RemoteOptions

pytestmark = pytest.mark.usefixtures("no_leaks")
pytest.importorskip("obstore")

from h5stream.remote.source import RemoteSource  # noqa: E402 - after the skip without the client


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert text and "\n" not in text, text
    return text


def test_a_long_read_goes_out_as_equal_requests_of_at_most_max_request_bytes(tmp_path, monkeypatch):
    """A read longer than MAX_REQUEST_BYTES is cut into the fewest requests that each hold at most that many bytes,
    of equal size, in order (what benchmarks.remote's stream_requests predicts); the bytes land right across the
    cuts."""
    from remote_servers import RangeServer

    from h5stream.remote import source as remote_source

    most = 1 << 20
    monkeypatch.setattr(remote_source, "MAX_REQUEST_BYTES", most)
    (tmp_path / "www").mkdir()
    data = np.random.default_rng(0).integers(0, 256, 3 * most, np.uint8).tobytes()
    (tmp_path / "www" / "blob").write_bytes(data)
    server = RangeServer(tmp_path / "www")
    try:
        with RemoteSource(server.url + "blob", RemoteOptions(timeout_s=10)) as source:
            offset, length = 12_345, 2 * most + 100_001
            buffers = [bytearray(n) for n in (1, 49_152, length - 49_153)]
            source.readinto(offset, buffers)
            assert b"".join(buffers) == data[offset:offset + length]
            starts = [offset + length * i // 3 for i in range(4)]
            assert server.ranges == list(zip(starts[:-1], starts[1:]))
            server.ranges.clear()
            source.readinto(7, [bytearray(most)])  # exactly the most: one request
            assert server.ranges == [(7, 7 + most)]
    finally:
        server.stop()


def test_random_ranges_read_into_several_buffers_equal_the_local_bytes(served_store):
    local, url, options = served_store
    data = open(local, "rb").read()
    rng = np.random.default_rng(0)
    with RemoteSource(url, options) as source:
        assert source.size == len(data) and source.name == url and source.max_in_flight == options.max_in_flight
        for _ in range(20):
            sizes = rng.integers(1, 300_000, rng.integers(1, 5))
            offset = int(rng.integers(0, len(data) - sizes.sum()))
            buffers = [np.empty(int(n), np.uint8) for n in sizes]
            source.readinto(offset, [memoryview(b) for b in buffers])
            assert b"".join(b.tobytes() for b in buffers) == data[offset:offset + int(sizes.sum())]
        tail = bytearray(100)
        source.readinto(len(data) - 100, [tail])  # the last byte of the object
        assert bytes(tail) == data[-100:]
        source.readinto(5, [])  # nothing asked, nothing sent
        assert source.requests == 22  # the HEAD, then one GET per read


def test_reads_from_many_threads_at_once_each_get_their_own_bytes(served_store):
    local, url, options = served_store
    data = open(local, "rb").read()
    offsets = np.random.default_rng(1).integers(0, len(data) - (1 << 20), 32)
    with RemoteSource(url, options) as source:
        def read(offset):
            out = np.empty(1 << 20, np.uint8)
            source.readinto(int(offset), [memoryview(out)])
            return out.tobytes() == data[offset:offset + (1 << 20)]

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            assert all(pool.map(read, offsets))


def test_a_range_past_the_end_is_refused_before_any_request(served_store):
    _, url, options = served_store
    with RemoteSource(url, options) as source:
        sent = source.requests
        with pytest.raises(StoreFormatError, match="outside the object"):
            source.readinto(source.size - 10, [bytearray(11)])
        with pytest.raises(StoreFormatError):
            source.readinto(-1, [bytearray(1)])
        assert source.requests == sent


def test_a_missing_object_is_one_line_not_found(served_store):
    _, url, options = served_store
    missing = url.replace("store.h5", "missing.h5")
    with pytest.raises(StoreNotFoundError) as info:
        RemoteSource(missing, options)
    assert isinstance(info.value, FileNotFoundError)
    assert one_line(info.value).startswith(missing + ": not found")


def test_wrong_credentials_are_one_line_permission_error(aws_env, s3_store, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(StorePermissionError) as info:
        RemoteSource(s3_store[1], RemoteOptions(timeout_s=10))
    assert isinstance(info.value, PermissionError)
    assert "access denied (HTTP 403" in one_line(info.value) and "AWS_SECRET_ACCESS_KEY" in str(info.value)


def test_missing_credentials_are_one_line_and_send_nothing(aws_env, s3_store, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(StorePermissionError, match="no AWS credentials found") as info:
        RemoteSource(s3_store[1])
    one_line(info.value)


def test_credentials_from_a_profile_in_the_shared_files(aws_env, s3_store, monkeypatch, tmp_path):
    from benchmarks.seaweed import ACCESS_KEY, SECRET_KEY

    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    (tmp_path / "credentials").write_text(f"[test]\naws_access_key_id = {ACCESS_KEY}\n"
                                          f"aws_secret_access_key = {SECRET_KEY}\n")
    (tmp_path / "config").write_text(f"[profile test]\nendpoint_url = {aws_env.endpoint}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_PROFILE", "test")
    with RemoteSource(s3_store[1]) as source:
        assert source.read(0, 8) == b"\x89HDF\r\n\x1a\n"


def test_an_s3_object_replaced_after_open_is_one_line_changed_error(aws_env, remote_store_file, tmp_path):
    key = "replaced/store.h5"
    aws_env.put(key, remote_store_file)
    url = f"s3://{aws_env.bucket}/{key}"
    with RemoteSource(url, RemoteOptions(timeout_s=10)) as source:
        first = source.read(0, 4096)
        other = tmp_path / "other.h5"
        other.write_bytes(b"\x00" * 4096 + open(remote_store_file, "rb").read()[4096:])
        aws_env.put(key, other)
        with pytest.raises(StoreChangedError) as info:
            source.read(0, 4096)
    assert isinstance(info.value, OSError) and first[:4] == b"\x89HDF"
    assert one_line(info.value).startswith(url + ": the object changed after it was opened")


def test_a_file_rewritten_on_the_web_server_is_one_line_changed_error(range_server):
    path = range_server.root / "store.h5"
    with RemoteSource(range_server.url + "store.h5", RemoteOptions(timeout_s=10)) as source:
        source.read(0, 100)
        data = path.read_bytes()
        tmp = path.with_suffix(".new")
        tmp.write_bytes(data + b"more")
        os.replace(tmp, path)
        with pytest.raises(StoreChangedError) as info:
            source.read(0, 100)
    one_line(info.value)


def test_503s_are_retried_and_the_read_succeeds(range_server):
    data = (range_server.root / "store.h5").read_bytes()
    with RemoteSource(range_server.url + "store.h5", RemoteOptions(timeout_s=20)) as source:
        gets = range_server.requests.get("GET", 0)
        range_server.fail_next(3, 503)
        range_server.fail_next(1, 429)  # throttled
        assert source.read(1000, 50_000) == data[1000:51_000]
    assert range_server.requests["GET"] - gets == 5


def test_a_body_cut_short_is_fetched_again(range_server):
    data = (range_server.root / "store.h5").read_bytes()
    with RemoteSource(range_server.url + "store.h5", RemoteOptions(timeout_s=20)) as source:
        range_server.cut_next(after_bytes=300_000)
        out = np.empty(2_000_000, np.uint8)
        source.readinto(12_345, [memoryview(out)])
    assert out.tobytes() == data[12_345:2_012_345]


def test_a_server_that_keeps_failing_is_one_line_within_timeout_s(range_server):
    with RemoteSource(range_server.url + "store.h5", RemoteOptions(timeout_s=1)) as source:
        range_server.fail_next(1000, 503)
        with pytest.raises(RemoteUnavailableError) as info:
            finishes_within(lambda: source.read(0, 100), 30)
    assert isinstance(info.value, ConnectionError) and "HTTP 503" in one_line(info.value)


def test_a_stalled_server_is_an_error_within_timeout_s(range_server):
    threads = threading.active_count()
    with RemoteSource(range_server.url + "store.h5", RemoteOptions(timeout_s=1.5)) as source:
        for _ in range(50):  # every attempt, first and retried, gets no answer
            range_server.stall_next()
        with pytest.raises(RemoteUnavailableError) as info:
            finishes_within(lambda: source.read(0, 100), 30)
    one_line(info.value)
    range_server.stop()  # releases the stalled handler threads
    assert threading.active_count() <= threads + 1  # the server's own thread is gone too, or about to be


def test_a_web_server_stopped_mid_read_is_an_error_within_timeout_s(range_server):
    with RemoteSource(range_server.url + "store.h5", RemoteOptions(timeout_s=1.5)) as source:
        source.read(0, 100)
        range_server.stall_next()  # the next read is in flight when the server goes away
        failed = concurrent.futures.Future()
        reader = threading.Thread(target=lambda: _into(failed, lambda: source.read(0, 1 << 20)), daemon=True)
        reader.start()
        finishes_within(lambda: _until(lambda: range_server.requests.get("GET", 0) >= 2), 30)  # it has arrived
        range_server.stop()
        reader.join(30)
        assert not reader.is_alive()
        with pytest.raises(RemoteUnavailableError) as info:
            failed.result()
    one_line(info.value)


def _until(condition):
    while not condition():
        threading.Event().wait(0.01)  # polls a counter another thread sets


def _into(future, call):
    try:
        future.set_result(call())
    except BaseException as exc:  # noqa: BLE001
        future.set_exception(exc)


def test_seaweedfs_killed_while_a_store_is_open_is_an_error_within_timeout_s(aws_env, remote_store_file, tmp_path):
    from benchmarks.seaweed import SeaweedS3

    server = SeaweedS3(tmp_path / "own")  # this test's own server: it dies halfway
    try:
        server.put("store.h5", remote_store_file)
        url = f"s3://{server.bucket}/store.h5"
        os.environ["AWS_ENDPOINT_URL"] = server.endpoint  # aws_env's monkeypatch restores it
        with RemoteSource(url, RemoteOptions(timeout_s=2)) as source:
            data = open(remote_store_file, "rb").read()
            assert source.read(0, 1 << 20) == data[:1 << 20]
            server.stop()
            with pytest.raises(RemoteUnavailableError) as info:
                finishes_within(lambda: source.read(1 << 20, 1 << 20), 30)
        assert url in one_line(info.value) and "timeout_s=2" in str(info.value)
    finally:
        server.stop()
    assert server.process.poll() is not None


def test_read_after_close_is_an_error_and_close_is_idempotent(range_server):
    source = RemoteSource(range_server.url + "store.h5")
    source.close()
    source.close()
    with pytest.raises(OSError, match="after close"):
        source.read(0, 1)


MISSING_SCRIPT = r"""
import json, sys
sys.modules["obstore"] = None
from h5stream.remote.source import RemoteSource
from h5stream.errors import MissingDependencyError
try:
    RemoteSource("s3://bucket/store.h5")
except MissingDependencyError as exc:
    print(json.dumps({"error": str(exc), "import_error": isinstance(exc, ImportError)}))
"""


def test_without_the_client_library_opening_a_url_names_the_extra_to_install():
    proc = subprocess.run([sys.executable, "-c", MISSING_SCRIPT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["import_error"] and "\n" not in result["error"]
    assert "pip install obstore" in result["error"] and "pip install -e '.[remote]'" in result["error"]
    assert "'h5stream[remote]'" not in result["error"]  # h5stream is installed from a clone, not an index


def test_a_web_server_that_wants_a_header_gets_it_from_the_options(range_server):
    range_server.required_headers["Authorization"] = "Bearer s3cret"
    url = range_server.url + "store.h5"
    with pytest.raises(StorePermissionError, match="pass the headers it needs") as info:
        RemoteSource(url)
    assert "HTTP 401" in one_line(info.value)
    with RemoteSource(url, RemoteOptions(headers={"Authorization": "Bearer s3cret"})) as source:
        assert source.read(0, 4) == b"\x89HDF"


def test_a_compressed_store_at_a_url_is_read_with_the_streams_remote_options(range_server, tmp_path):
    # Only HDF5 reads a compressed store's rows: its file on the URL gets the options (here the header the
    # server wants) as the byte source does.
    import h5stream
    from h5stream.store.writer import write_arrays

    rng = np.random.default_rng(4)
    images = rng.integers(0, 256, (64, 8, 8, 3), dtype=np.uint8)
    write_arrays(str(range_server.root / "zlib.h5"), images, np.arange(64) % 4, block_rows=16, compression="zlib")
    range_server.required_headers["Authorization"] = "Bearer s3cret"
    with h5stream.open(str(range_server.root / "zlib.h5"), batch_size=16, seed=2) as local:
        want = [(x.copy(), y.copy()) for x, y in local]
    with h5stream.open(range_server.url + "zlib.h5", batch_size=16, seed=2, cache_dir=None,
                       remote={"headers": {"Authorization": "Bearer s3cret"}, "timeout_s": 20}) as remote:
        got = [(x.copy(), y.copy()) for x, y in remote]
    assert len(got) == len(want) == 4
    for (gx, gy), (wx, wy) in zip(got, want):
        np.testing.assert_array_equal(gx, wx)
        np.testing.assert_array_equal(gy, wy)


def test_a_server_answering_other_bytes_than_the_range_is_one_line_at_once_not_a_timeout(range_server):
    with RemoteSource(range_server.url + "store.h5", RemoteOptions(timeout_s=20)) as source:
        gets = range_server.requests.get("GET", 0)
        range_server.shorten_ranges(10)  # a well-formed 206 for bytes 1000..5990 when 1000..6000 was asked
        with pytest.raises(RemoteError) as info:
            source.read(1000, 5000)
    text = one_line(info.value)
    assert not isinstance(info.value, RemoteUnavailableError) and "timeout_s" not in text
    assert "asked for bytes 1000..6000, the server answered with bytes 1000..5990" in text
    assert "does not honour Range" in text
    assert range_server.requests["GET"] - gets == 1  # not retried: the server answers the same way every time


def test_a_request_the_client_cannot_build_is_named_so_not_a_timeout():
    # The client's own error for a request it refuses to build (plain http where it was not allowed): it never
    # leaves the process, so no timeout ran out.
    import obstore
    from obstore.store import HTTPStore

    from h5stream.remote.failures import translate

    with pytest.raises(Exception) as raised:
        obstore.head(HTTPStore("http://127.0.0.1:1/"), "x.h5")
    err = translate(raised.value, "http://127.0.0.1:1/x.h5", s3=False, timeout_s=30)
    assert type(err) is RemoteError
    assert "could not build a request" in one_line(err) and "timeout_s" not in str(err)


@pytest.mark.parametrize("name, url_path", [("a b.h5", "a b.h5"), ("a b.h5", "a%20b.h5"), ("100%.h5", "100%25.h5"),
                                            ("é.h5", "%C3%A9.h5"), ("é.h5", "é.h5"), ("a+b.h5", "a+b.h5"),
                                            ("a#b.h5", "a%23b.h5"), ("a?b.h5", "a%3Fb.h5")])
def test_keys_with_spaces_and_percent_encoded_characters_reach_their_object(range_server, name, url_path):
    import shutil

    shutil.copyfile(range_server.root / "store.h5", range_server.root / name)
    with RemoteSource(range_server.url + url_path) as source:
        assert source.read(0, 4) == b"\x89HDF" and source.size == (range_server.root / name).stat().st_size


def test_a_range_sent_gzip_compressed_is_named_so_not_a_connection_that_ended_early(range_server):
    with RemoteSource(range_server.url + "store.h5", RemoteOptions(timeout_s=20)) as source:
        range_server.compress_ranges()  # the store's zero padding compresses: a body far shorter than the range
        gets = range_server.requests.get("GET", 0)
        with pytest.raises(RemoteError) as info:
            source.read(0, 100_000)
    text = one_line(info.value)
    assert "Content-Encoding: gzip" in text and "ended early" not in text and "timeout_s" not in text
    assert range_server.requests["GET"] - gets == 1


def test_a_refused_connection_and_an_unknown_host_say_which_not_just_error_sending_request():
    import socket

    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RemoteUnavailableError) as refused:
        RemoteSource(f"http://127.0.0.1:{port}/store.h5", RemoteOptions(timeout_s=1))
    assert "Connection refused" in one_line(refused.value)
    with pytest.raises(RemoteUnavailableError) as unknown:
        RemoteSource("http://no-such-host.invalid/store.h5", RemoteOptions(timeout_s=1))
    assert "lookup" in one_line(unknown.value)  # the resolver's words: "failed to lookup address information: ..."
