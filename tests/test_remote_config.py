"""Remote settings as pure functions: URL parsing, AWS settings resolution, timeouts, error summaries."""

from __future__ import annotations

import pytest

from h5stream.errors import ConfigError, StorePermissionError
from h5stream.remote.config import (
    RemoteOptions,
    client_settings,
    is_url,
    parse_url,
    read_profile,
    s3_settings,
    stream_remote,
)
from h5stream.remote.failures import http_status, reason


def test_urls_are_told_from_paths():
    assert is_url("s3://b/k.h5") and is_url("https://h/x.h5") and is_url("HTTP://h/x.h5")
    assert not is_url("/data/x.h5") and not is_url("x.h5") and not is_url("gs://b/k") and not is_url(None)


def test_parse_url_splits_container_and_key():
    loc = parse_url("s3://bucket/dir/my%20store.h5")
    assert (loc.scheme, loc.container, loc.key) == ("s3", "bucket", "dir/my store.h5")
    loc = parse_url("https://data.example.org:8443/sets/val.h5")
    assert (loc.scheme, loc.container, loc.key) == ("https", "https://data.example.org:8443", "sets/val.h5")


@pytest.mark.parametrize("url, says", [
    ("s3:///key.h5", "no bucket"),
    ("s3://bucket", "no object key"),
    ("s3://bucket/dir/", "no object key"),
    ("https://host/", "names a folder"),
    ("https://host/x.h5#frag", "fragment"),
    ("s3://bucket/x.h5?versionId=1", "takes no query string"),
    ("ftp://host/x.h5", "not a store URL"),
])
def test_bad_urls_say_what_to_write(url, says):
    with pytest.raises(ConfigError, match=says) as info:
        parse_url(url)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kwargs, says", [
    ({"timeout_s": 0}, "timeout_s"), ({"timeout_s": float("inf")}, "timeout_s"),
    ({"max_in_flight": 0}, "max_in_flight"), ({"endpoint": "localhost:9000"}, "endpoint"),
    ({"headers": {"Authorization": "Bearer a\nX-Injected: 1"}}, "header 'Authorization' holds a line break"),
    ({"headers": {"Bad Name": "v"}}, "header name 'Bad Name' is not a valid"),
])
def test_bad_options_are_config_errors(kwargs, says):
    # A bad header was a ValueError traceback from the client (or a "malformed URL"), at the first open.
    with pytest.raises(ConfigError, match=says) as info:
        RemoteOptions(**kwargs)
    assert "\n" not in str(info.value) and "Bearer" not in str(info.value)


@pytest.mark.parametrize("timeout_s", [0.5, 2, 60, 600])
def test_a_request_with_every_retry_still_ends_within_timeout_s_of_silence(timeout_s):
    client, retry = client_settings(RemoteOptions(timeout_s=timeout_s))
    # The last attempt may start just before the retry window closes, after the longest backoff, and wait its
    # longest silence (the connection, or the read timeout that each byte received starts again).
    silence = max(client["connect_timeout"], client["read_timeout"])
    worst = retry["retry_timeout"] + retry["backoff"]["max_backoff"] + silence
    assert worst.total_seconds() <= timeout_s + 1e-9
    assert client["connect_timeout"] <= client["read_timeout"] or client["connect_timeout"].total_seconds() == 10
    # The whole request is not bounded by timeout_s: a slow link's long body is not cut off and retried.
    assert client["timeout"].total_seconds() >= 3600
    assert retry["max_retries"] > 0


S3 = parse_url("s3://bucket/k.h5")
CREDENTIALS = """
[default]
aws_access_key_id = FILEKEY
aws_secret_access_key = FILESECRET

[other]
aws_access_key_id = OTHERKEY
aws_secret_access_key = OTHERSECRET
aws_session_token = OTHERTOKEN
"""
CONFIG = """
[default]
region = eu-west-3

[profile other]
region = ap-south-1
endpoint_url = http://minio.local:9000
s3 =
    addressing_style = path
"""


def test_profiles_come_from_both_files_and_the_config_file_names_them_profile_x():
    assert read_profile("default", CREDENTIALS, CONFIG) == {
        "region": "eu-west-3", "aws_access_key_id": "FILEKEY", "aws_secret_access_key": "FILESECRET"}
    other = read_profile("other", CREDENTIALS, CONFIG)
    assert other["endpoint_url"] == "http://minio.local:9000" and other["aws_session_token"] == "OTHERTOKEN"
    assert "s3" not in other  # nested sections are not settings
    assert read_profile("missing", CREDENTIALS, CONFIG) is None
    assert read_profile("default", None, "not an ini file [") is None


def test_environment_keys_win_over_the_profile_and_options_win_over_the_environment():
    env = {"AWS_ACCESS_KEY_ID": "ENVKEY", "AWS_SECRET_ACCESS_KEY": "ENVSECRET", "AWS_REGION": "us-west-2",
           "AWS_ENDPOINT_URL": "http://env:9000"}
    settings = s3_settings(S3, RemoteOptions(), env, read_profile("default", CREDENTIALS, CONFIG))
    assert settings == {"bucket": "bucket", "region": "us-west-2", "endpoint": "http://env:9000",
                        "access_key_id": "ENVKEY", "secret_access_key": "ENVSECRET"}
    chosen = s3_settings(S3, RemoteOptions(endpoint="http://opt:1", region="eu-north-1"), env, None)
    assert (chosen["endpoint"], chosen["region"]) == ("http://opt:1", "eu-north-1")


def test_the_profile_supplies_keys_token_region_and_endpoint():
    settings = s3_settings(S3, RemoteOptions(profile="other"), {}, read_profile("other", CREDENTIALS, CONFIG))
    assert settings == {"bucket": "bucket", "region": "ap-south-1", "endpoint": "http://minio.local:9000",
                        "access_key_id": "OTHERKEY", "secret_access_key": "OTHERSECRET",
                        "session_token": "OTHERTOKEN"}
    assert s3_settings(S3, RemoteOptions(), {}, None)["region"] == "us-east-1"


def test_a_named_profile_that_does_not_exist_is_one_line():
    with pytest.raises(ConfigError, match="profile 'nope' is not in") as info:
        s3_settings(S3, RemoteOptions(), {"AWS_PROFILE": "nope"}, None)
    assert "\n" not in str(info.value)


def test_no_credentials_anywhere_is_one_line_when_instance_metadata_is_off():
    env = {"AWS_EC2_METADATA_DISABLED": "true"}
    with pytest.raises(StorePermissionError, match="no AWS credentials found") as info:
        s3_settings(S3, RemoteOptions(), env, None)
    assert "\n" not in str(info.value) and "anonymous=True" in str(info.value)
    # A role the client resolves itself, or anonymous access, needs no keys.
    assert "access_key_id" not in s3_settings(S3, RemoteOptions(), {**env, "AWS_WEB_IDENTITY_TOKEN_FILE": "/t"}, None)
    assert s3_settings(S3, RemoteOptions(anonymous=True), env, None)["skip_signature"] is True


S3_ERROR = (
    "Generic S3 error: Error performing GET http://127.0.0.1:1/b/k in 1.2ms - Server returned non-2xx status code: "
    "403 Forbidden: <?xml version=\"1.0\"?><Error><Code>SignatureDoesNotMatch</Code><Message>The request signature "
    "we calculated does not match</Message></Error>\n\nDebug source:\nGeneric {\n    store: \"S3\",\n}"
)
CONNECTION_ERROR = (
    "Generic S3 error: Error performing GET http://127.0.0.1:1/b/k in 3.5s, after 10 retries, max_retries: 10, "
    "retry_timeout: 3s  - HTTP error: error sending request\n\nDebug source:\nGeneric {}"
)


def test_error_summaries_keep_the_status_and_the_servers_words_on_one_line():
    assert http_status(S3_ERROR) == 403 and http_status(CONNECTION_ERROR) is None
    assert reason(S3_ERROR) == ("HTTP 403 Forbidden, SignatureDoesNotMatch: The request signature we calculated "
                                "does not match")
    assert reason(CONNECTION_ERROR) == "HTTP error: error sending request (after 10 retries)"
    assert len(reason("x" * 5000)) <= 240


def test_the_client_library_loads_only_when_a_url_is_opened():
    import subprocess
    import sys

    code = ("import sys, h5stream; h5stream.RemoteOptions(timeout_s=5); "
            "from h5stream.remote.source import RemoteSource; from h5stream.remote.fileobj import RemoteFile; "
            "print('obstore' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


@pytest.mark.parametrize("url, says", [
    ("http://host:99999/x.h5", "Port out of range"),
    ("http://host:abc/x.h5", "malformed URL"),
    ("http://[::1/x.h5", "Invalid IPv6"),
    ("https://ho st/x.h5", "space or a control character in the host"),
    ("s3://my bucket/x.h5", "space or a control character"),
    ("s3://bucket:9000/x.h5", "not a bucket name"),
])
def test_a_url_no_request_can_be_sent_to_is_named_malformed_at_once(url, says):
    with pytest.raises(ConfigError, match=says) as info:
        parse_url(url)
    assert "malformed URL" in str(info.value) and "\n" not in str(info.value)


def test_an_s3_endpoint_no_request_can_be_sent_to_is_one_config_error():
    env = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_ENDPOINT_URL": "http://host:99999"}
    with pytest.raises(ConfigError, match="endpoint 'http://host:99999' is not a valid") as info:
        s3_settings(S3, RemoteOptions(), env, None)
    assert "\n" not in str(info.value)
    assert s3_settings(S3, RemoteOptions(), {**env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9000"},
                       None)["endpoint"] == "http://127.0.0.1:9000"


def test_the_repr_of_remote_options_names_the_headers_but_never_their_values():
    options = RemoteOptions(headers={"Authorization": "Bearer s3cret-token", "X-Team": "vision"}, timeout_s=7)
    text = repr(options)
    assert "s3cret-token" not in text and "vision" not in text
    assert "'Authorization': '***'" in text and "timeout_s=7" in text
    assert "Bearer s3cret-token" not in repr(stream_remote("https://h/x.h5", options, 5, cache_dir=None))
