"""An HTTP store opened as ``http://user:password@host/...``: the credentials go to the server as Basic auth, and
the password never appears in an error, the CLI's line or the stream's repr (a real Range server on 127.0.0.1)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

import h5stream
from h5stream.errors import H5StreamError, StoreNotFoundError, hide_passwords
from h5stream.remote.config import parse_url

PASSWORD = "pa55w0rd-s3cret"


def with_credentials(url: str) -> str:
    return url.replace("http://", f"http://reader:{PASSWORD}@", 1)


def test_hide_passwords_shows_the_user_and_hides_only_the_password():
    assert hide_passwords("http://u:p%40ss@h:81/a/b.h5: not found") == "http://u:***@h:81/a/b.h5: not found"
    assert hide_passwords("a https://u:p@h/x and http://v:q@g/y") == "a https://u:***@h/x and http://v:***@g/y"
    assert hide_passwords("http://token@h/x.h5, s3://b/k") == "http://token@h/x.h5, s3://b/k"
    loc = parse_url("https://me:p%2Fw@host:8443/sets/x.h5")
    assert (loc.container, loc.key, loc.basic_auth) == ("https://host:8443", "sets/x.h5", ("me", "p/w"))
    assert PASSWORD not in repr(parse_url(with_credentials("http://h/x.h5")))


def test_a_url_with_user_and_password_sends_basic_auth_and_never_shows_the_password(range_server, h5cli):
    range_server.required_headers["Authorization"] = "Basic " + base64.b64encode(
        f"reader:{PASSWORD}".encode()).decode()
    url = with_credentials(range_server.url) + "store.h5"
    with h5stream.open(str(range_server.root / "store.h5"), batch_size=500, seed=3) as local:
        want = [(x.copy(), y.copy()) for x, y in local]
    with h5stream.open(url, batch_size=500, seed=3, cache_dir=None, timeout_s=10) as remote:
        assert PASSWORD not in repr(remote) and "reader:***@" in repr(remote)
        got = [(x.copy(), y.copy()) for x, y in remote]
    assert len(got) == len(want) == 5
    for (gx, gy), (wx, wy) in zip(got, want):
        np.testing.assert_array_equal(gx, wx)
        np.testing.assert_array_equal(gy, wy)

    absent = with_credentials(range_server.url) + "absent.h5"
    with pytest.raises(StoreNotFoundError) as info:
        h5stream.open(absent, batch_size=4, timeout_s=10)
    assert PASSWORD not in str(info.value) and "reader:***@" in str(info.value)
    code, out, err = h5cli("info", absent)
    assert code != 0 and err.startswith("h5stream: error: ") and PASSWORD not in out + err

    # Mid-epoch: the server refuses the reads after open; the stream's error names the URL without the password.
    with h5stream.open(url, batch_size=500, seed=3, cache_dir=None, timeout_s=10) as remote:
        range_server.fail_next(50, 403)
        with pytest.raises(H5StreamError) as info:
            for _ in remote:
                pass
    text = "".join(str(e) for e in (info.value, info.value.__cause__, info.value.__context__) if e is not None)
    assert PASSWORD not in text and "403" in text


def test_info_and_warnings_name_a_url_with_credentials_without_its_password(range_server, h5cli):
    import json
    import shutil
    import warnings

    import h5py

    range_server.required_headers["Authorization"] = "Basic " + base64.b64encode(
        f"reader:{PASSWORD}".encode()).decode()
    code, out, err = h5cli("info", with_credentials(range_server.url) + "store.h5", "--json")
    assert code == 0, err
    assert json.loads(out)["path"] == range_server.url.replace("http://", "http://reader:***@") + "store.h5"
    assert PASSWORD not in out + err
    # A store with rows written and never committed warns at open, naming the URL.
    shutil.copyfile(range_server.root / "store.h5", range_server.root / "low.h5")
    with h5py.File(range_server.root / "low.h5", "r+") as f:
        f.attrs["committed_rows"] = int(f.attrs["committed_rows"]) - 10
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        h5stream.open(with_credentials(range_server.url) + "low.h5", batch_size=4, cache_dir=None).close()
    said = [str(w.message) for w in caught if "never committed" in str(w.message)]
    assert said and all(PASSWORD not in text and "reader:***@" in text for text in said)
