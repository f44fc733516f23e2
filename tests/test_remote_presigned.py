"""URLs with a query string (presigned S3/GCS/Azure links, CDN tokens) against a real HTTP server on 127.0.0.1 that
serves a presigned ``GET`` link as S3 does: ``403 AccessDenied`` to a request without the exact query string, to a
``HEAD``, and to everything once the link has expired.  The query string goes out on every request as written, never
appears in an error, the CLI's line or the stream's repr, and is not part of the disk cache's key."""

from __future__ import annotations

import datetime
import json

import pytest
from conftest import assert_same_batches

import h5stream
from h5stream.errors import ConfigError, StorePermissionError, hide_passwords
from h5stream.remote.config import RemoteOptions, parse_url

pytestmark = pytest.mark.usefixtures("no_leaks")
pytest.importorskip("obstore")

from h5stream.remote.source import RemoteSource  # noqa: E402 - after the skip without the client

SIGNATURE = "5ec7e75157a7e6f0c0ffee"
KEY_ID = "AKIAEXAMPLEKEYID"


def link(signature: str = SIGNATURE, date: str = "20260101T000000Z") -> str:
    """A presigned link's query string, as AWS writes it: encoded '/' in the credential, several parameters."""
    return (f"X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={KEY_ID}%2F20260101%2Fus-east-1%2Fs3%2Faws4_request"
            f"&X-Amz-Date={date}&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&X-Amz-Signature={signature}")


def secret_free(text: str) -> bool:
    return SIGNATURE not in text and KEY_ID not in text and "other-signature" not in text


def _batches(stream):
    with stream:
        return [(x.copy(), y.copy()) for x, y in stream]


def test_a_url_with_a_query_string_keeps_it_for_requests_and_shows_it_as_dots():
    loc = parse_url(f"https://bucket.s3.amazonaws.com/sets/my%20x.h5?{link()}")
    assert loc.url == "https://bucket.s3.amazonaws.com/sets/my%20x.h5?..."
    assert loc.target == f"https://bucket.s3.amazonaws.com/sets/my%20x.h5?{link()}"  # as written, to the byte
    assert (loc.container, loc.key) == ("https://bucket.s3.amazonaws.com", "sets/my x.h5")
    assert secret_free(repr(loc))
    shown = hide_passwords(f"see https://h/x.h5?{link()}: access denied (HTTP 403), or (https://h/y?a=b)")
    assert shown == "see https://h/x.h5?...: access denied (HTTP 403), or (https://h/y?...)"
    with pytest.raises(ConfigError, match="takes no query string") as info:
        parse_url(f"s3://bucket/x.h5?{link()}")
    assert secret_free(str(info.value))
    with pytest.raises(ConfigError, match="fragment"):
        parse_url("https://host/x.h5#part")


def test_a_presigned_link_sends_its_query_string_on_every_request_and_gives_the_local_files_batches(range_server,
                                                                                                   h5cli):
    range_server.require_query(link())
    url = f"{range_server.url}store.h5?{link()}"
    with pytest.raises(StorePermissionError):  # the server checks: the plain URL is refused
        RemoteSource(range_server.url + "store.h5", RemoteOptions(timeout_s=20))
    want = _batches(h5stream.open(str(range_server.root / "store.h5"), batch_size=500, seed=3))
    before = len(range_server.queries)
    stream = h5stream.open(url, batch_size=500, seed=3, cache_dir=None, timeout_s=20)
    assert secret_free(repr(stream)) and "store.h5?..." in repr(stream)
    assert_same_batches(_batches(stream), want)
    sent = range_server.queries[before:]
    assert len(sent) > 3 and set(sent) == {link()}  # every request, the metadata's and the pixels', as written
    code, out, err = h5cli("info", "--json", url)
    assert code == 0, err
    assert json.loads(out)["path"] == f"{range_server.url}store.h5?..." and secret_free(out + err)


def test_an_expired_link_is_one_line_saying_so_at_open_and_mid_read_without_a_retry(range_server, h5cli):
    range_server.require_query(link())
    url = f"{range_server.url}store.h5?{link()}"
    with RemoteSource(url, RemoteOptions(timeout_s=20)) as source:
        assert source.read(0, 4) == b"\x89HDF"
        range_server.expire_query()
        gets = range_server.requests["GET"]
        with pytest.raises(StorePermissionError) as info:
            source.read(1000, 100_000)
        assert range_server.requests["GET"] == gets + 1  # refused once, not retried until timeout_s
    text = str(info.value)
    chained = " ".join(str(e) for e in (info.value.__cause__, info.value.__context__) if e is not None)
    assert secret_free(chained), chained  # the client's own error, which names the URL whole, is not kept
    assert "\n" not in text and "expired" in text and "fresh link" in text and "HTTP 403" in text
    assert secret_free(text) and text.startswith(f"{range_server.url}store.h5?...: ")

    with pytest.raises(StorePermissionError, match="expired") as info:
        h5stream.open(url, batch_size=500, cache_dir=None, timeout_s=20)
    assert secret_free(str(info.value))
    assert all(secret_free(str(e)) for e in (info.value.__cause__, info.value.__context__) if e is not None)
    code, out, err = h5cli("info", url)
    assert code == 1 and err.startswith("h5stream: error: ") and err.count("\n") == 1 and "expired" in err
    assert secret_free(out + err)


def test_a_fresh_link_to_the_same_object_reads_from_the_disk_cache(range_server, tmp_path):
    piece = 1 << 20
    opts = dict(batch_size=500, seed=3, cache_dir=tmp_path / "cache", remote={"timeout_s": 20, "cache_piece": piece})
    range_server.require_query(link())
    first = _batches(h5stream.open(f"{range_server.url}store.h5?{link()}", **opts))
    assert max(e - s for s, e in range_server.ranges) >= piece  # the first link filled the cache
    fresh = link("other-signature", date="20260102T000000Z")
    range_server.require_query(fresh)  # the first link is refused from now on
    before = len(range_server.ranges)
    again = _batches(h5stream.open(f"{range_server.url}store.h5?{fresh}", **opts))
    later = range_server.ranges[before:]  # the first byte, the header and the chunk indexes: no piece
    assert later and max(e - s for s, e in later) < piece, later
    assert set(range_server.queries[-len(later):]) == {fresh}
    assert_same_batches(again, first)


def test_a_slow_link_longer_than_the_clients_timeout_s_is_read_whole(range_server):
    # Every body of 1 MiB or more comes 256 KiB at a time, 0.5 s apart: 3 MiB take 6 s, longer than half of
    # timeout_s=8 (the whole request's limit before) while no gap between two parts comes near the 4 s the client
    # waits for the next bytes, even on a busy machine.
    data = (range_server.root / "store.h5").read_bytes()
    range_server.drip(1 << 20, 256 << 10, 0.5)
    with RemoteSource(range_server.url + "store.h5", RemoteOptions(timeout_s=8)) as source:
        got = source.read(4096, 3 << 20)
    assert got == data[4096:4096 + (3 << 20)]
    assert (4096, 4096 + (3 << 20)) in range_server.ranges and range_server.requests["GET"] == 1


def test_a_body_that_stops_midway_fails_within_timeout_s(range_server):
    from conftest import finishes_within
    from h5stream.errors import RemoteUnavailableError

    with RemoteSource(range_server.url + "store.h5", RemoteOptions(timeout_s=4)) as source:
        range_server.hang_next(after_bytes=100_000)  # headers and 100 kB, then nothing, the connection open
        with pytest.raises(RemoteUnavailableError) as info:
            finishes_within(lambda: source.read(0, 2 << 20), 60)
    assert "\n" not in str(info.value) and "no bytes for 2 s midway through a response" in str(info.value)
    assert "timeout_s=4 s" in str(info.value) and range_server.stalled.is_set()


def test_a_link_presigned_by_an_s3_store_gives_the_local_files_batches_and_a_bad_one_says_refused(aws_env, s3_store,
                                                                                                  tmp_path):
    # SeaweedFS checks the signature as S3 does: obstore.sign makes the link the way the AWS tools do.
    import obstore
    from obstore.store import S3Store

    from benchmarks.seaweed import ACCESS_KEY, SECRET_KEY

    local, url = s3_store
    bucket, key = url[len("s3://"):].split("/", 1)
    store = S3Store(bucket, config={"endpoint": aws_env.endpoint, "access_key_id": ACCESS_KEY,
                                    "secret_access_key": SECRET_KEY, "region": "us-east-1"},
                    client_options={"allow_http": True})
    presigned = obstore.sign(store, "GET", key, datetime.timedelta(hours=1))
    assert "X-Amz-Signature=" in presigned
    want = _batches(h5stream.open(local, batch_size=500, seed=3))
    got = _batches(h5stream.open(presigned, batch_size=500, seed=3, cache_dir=tmp_path / "c", timeout_s=20))
    assert_same_batches(got, want)
    signature = presigned.split("X-Amz-Signature=")[1].split("&")[0]
    forged = presigned.replace(f"X-Amz-Signature={signature}", "X-Amz-Signature=" + "0" * len(signature))
    with pytest.raises(StorePermissionError, match="link was refused") as info:
        h5stream.open(forged, batch_size=500, cache_dir=None, timeout_s=20)
    assert signature not in str(info.value) and "0" * len(signature) not in str(info.value)
    assert "\n" not in str(info.value)


def test_info_and_verify_of_presigned_links_and_of_a_set_of_them_never_print_the_query_string(range_server, h5cli):
    import shutil

    shutil.copyfile(range_server.root / "store.h5", range_server.root / "copy.h5")
    range_server.require_query(link())
    one = f"{range_server.url}store.h5?{link()}"
    both = [one, f"{range_server.url}copy.h5?{link()}"]
    for args in (["info", *both], ["info", "--json", *both], ["verify", one], ["verify", *both]):
        code, out, err = h5cli(*args)
        assert code == 0, err
        assert secret_free(out + err), args
        assert f"{range_server.url}store.h5?..." in out


def test_a_stream_resumed_on_a_fresh_link_continues_with_the_batches_it_would_have_given(range_server):
    opts = dict(batch_size=250, seed=5, cache_dir=None, timeout_s=20)
    want = _batches(h5stream.open(str(range_server.root / "store.h5"), batch_size=250, seed=5))
    range_server.require_query(link())
    with h5stream.open(f"{range_server.url}store.h5?{link()}", **opts) as first:
        it = iter(first)
        for _ in range(3):
            next(it)
        state = first.state()
    fresh = link("other-signature", date="20260102T000000Z")
    range_server.require_query(fresh)  # the first link has expired
    with pytest.raises(StorePermissionError, match="link was refused"):
        h5stream.open(f"{range_server.url}store.h5?{link()}", **opts)
    assert_same_batches(_batches(h5stream.open(f"{range_server.url}store.h5?{fresh}", resume=state, **opts)), want[3:])
