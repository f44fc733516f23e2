"""URL streams through redirects and over IPv6, against real HTTP servers on the loopback: a download link that
redirects (301, 302, 307) to another host's presigned link (which, as S3, refuses ``HEAD`` and any request without
its exact query string; the link's ``Authorization`` header is not sent there), a server on ``[::1]``, and one on
``https://`` whose certificate is self-signed."""

from __future__ import annotations

import shutil
import socket
import subprocess

import pytest
from conftest import assert_same_batches

import h5stream
from h5stream.errors import RemoteError, RemoteUnavailableError, StoreNotFoundError

pytestmark = pytest.mark.usefixtures("no_leaks")
pytest.importorskip("obstore")

QUERY = "X-Amz-Credential=AKIAEXAMPLE%2F20260101&X-Amz-Signature=feedfacecafe"


def _batches(path, **kwargs):
    with h5stream.open(path, batch_size=500, seed=4, **kwargs) as stream:
        return [(x.copy(), y.copy()) for x, y in stream]


@pytest.mark.parametrize("status", [301, 302, 307])
def test_a_link_redirecting_to_another_hosts_presigned_url_gives_the_local_files_batches(range_server, tmp_path,
                                                                                        status):
    from remote_servers import RedirectServer

    range_server.require_query(QUERY)  # HEAD refused: the size and ETag come from a GET of the first byte
    target = range_server.url.replace("127.0.0.1", "localhost") + f"store.h5?{QUERY}"
    redirect = RedirectServer(status, target)
    try:
        want = _batches(str(range_server.root / "store.h5"))
        got = _batches(redirect.url + "download/store.h5", cache_dir=tmp_path / "cache", timeout_s=20,
                       remote={"headers": {"Authorization": "Bearer for-the-link-only"}})
    finally:
        redirect.stop()
    assert_same_batches(got, want)
    assert redirect.requests.get("GET", 0) >= 2  # each request went through the link
    assert set(range_server.queries) == {QUERY} and range_server.requests.get("GET", 0) >= 2
    assert set(range_server.authorizations) == {None}  # the link's credentials never reach the other host


def test_a_store_on_the_ipv6_loopback_gives_the_local_files_batches_and_names_its_url(tmp_path, remote_store_file):
    from remote_servers import RangeServer

    try:
        socket.socket(socket.AF_INET6).close()
        server = RangeServer(tmp_path, host="::1")
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    try:
        shutil.copyfile(remote_store_file, tmp_path / "store.h5")
        assert server.url.startswith("http://[::1]:")
        assert_same_batches(_batches(server.url + "store.h5", cache_dir=tmp_path / "cache", timeout_s=20),
              _batches(str(tmp_path / "store.h5")))
        with pytest.raises(StoreNotFoundError) as info:
            h5stream.open(server.url + "absent.h5?token=abc", batch_size=4, timeout_s=20)
        assert str(info.value).startswith(f"{server.url}absent.h5?...: not found") and "abc" not in str(info.value)
    finally:
        server.stop()


def test_redirects_that_never_end_are_one_line_at_once_not_a_server_that_is_down(tmp_path):
    from remote_servers import RedirectServer

    redirect = RedirectServer(302, "set below")
    try:
        redirect.to = redirect.url + "loop.h5?token=abc"  # a loop: the link leads back to itself
        with pytest.raises(RemoteError) as info:
            h5stream.open(redirect.url + "loop.h5?token=abc", batch_size=4, timeout_s=20)
        gets = redirect.requests.get("GET", 0) + redirect.requests.get("HEAD", 0)
    finally:
        redirect.stop()
    text = str(info.value)
    assert not isinstance(info.value, RemoteUnavailableError) and "timeout_s" not in text
    assert "redirects never lead to the object" in text and "\n" not in text and "abc" not in text
    assert gets <= 11  # the first request and the client's ten redirects (a query string: no HEAD), no retries


def test_a_self_signed_certificate_is_one_line_naming_the_certificate_not_a_server_that_is_down(tmp_path):
    from remote_servers import RangeServer

    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate with")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    server = RangeServer(tmp_path, tls=(str(cert), str(key)))
    try:
        with pytest.raises(RemoteError) as info:
            h5stream.open(server.url + "store.h5?token=abc", batch_size=4, timeout_s=4)
    finally:
        server.stop()
    text = str(info.value)
    assert server.url.startswith("https://") and not isinstance(info.value, RemoteUnavailableError)
    assert "TLS certificate was refused" in text and "\n" not in text and "abc" not in text
