"""From a URL and the environment to client settings: pure functions, no network, no client library.

:func:`parse_url` splits ``s3://bucket/key`` and ``http(s)://host/path``; :class:`RemoteOptions` holds what a
caller may choose (endpoint, region, profile, anonymous access, timeout, reads in flight); :func:`s3_settings`
resolves S3 settings the way the AWS command-line tools do, from (in this order) the options, the environment
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``/``AWS_DEFAULT_REGION``,
``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``, ``AWS_PROFILE``), and the profile in the shared credentials and
config files (``~/.aws/credentials``, ``~/.aws/config``, or ``AWS_SHARED_CREDENTIALS_FILE``/``AWS_CONFIG_FILE``);
:func:`client_settings` turns ``timeout_s`` into the client's timeouts and retry schedule.
"""

from __future__ import annotations

import configparser
import math
import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from h5stream.errors import ConfigError, StorePermissionError, hide_passwords

SCHEMES = ("s3", "http", "https")
_URL = re.compile(r"^(s3|https?)://", re.IGNORECASE)
_ANY_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_BAD_HEADER_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_BAD_URL_CHARS = re.compile(r"[\x00-\x20\x7f]")
_BUCKET = re.compile(r"[A-Za-z0-9._-]+")

DEFAULT_REGION = "us-east-1"
"""What S3 clients assume when no region is configured (non-AWS stores mostly ignore it)."""

CREDENTIAL_ENV = ("AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                  "AWS_CONTAINER_CREDENTIALS_FULL_URI")
"""Variables that name a credential source the client resolves itself (web identity, container role)."""


PIECE_BYTES = 8 << 20
"""Default piece: the request size S3's guidance gives for ranged GETs, large enough that a request's latency
costs little, small enough that one fetch is not a long stall."""

MIN_PIECE_BYTES = 64 << 10
"""The smallest ``cache_piece``."""

DEFAULT_LIMIT = 100 * 10**9
"""Default ``cache_limit``, 100 GB: LitData's default ``max_cache_size``; a disk that fills first is handled
(see :mod:`h5stream.remote.cache`)."""


def default_cache_dir(env: Mapping[str, str] | None = None) -> str:
    """``$XDG_CACHE_HOME/h5stream`` where that is an absolute path, else ``~/.cache/h5stream`` (pure apart from
    the home folder)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "h5stream")


INDEX_BASE_BYTES = 64 << 10
INDEX_BYTES_PER_PIECE = 160
"""What a source's in-memory index holds: a dictionary entry (piece -> last touch) per piece it used, and a lock
per piece being filled; the pieces held open (:data:`~h5stream.remote.cache.OPEN_PIECES`) are in the base.
Counted in the stream's memory budget (:func:`index_memory_bytes`)."""


def index_memory_bytes(file_bytes: int, piece_bytes: int = PIECE_BYTES) -> int:
    """The memory a cached source's index may hold for an object of ``file_bytes``."""
    return INDEX_BASE_BYTES + INDEX_BYTES_PER_PIECE * -(-int(file_bytes) // int(piece_bytes))


def other_scheme(path) -> str | None:
    """The scheme of ``path`` where it is a URL of one h5stream does not read (``ftp://``, ``gs://``...), else
    None (pure)."""
    m = _ANY_URL.match(path) if isinstance(path, str) else None
    return m.group(1).lower() if m and m.group(1).lower() not in SCHEMES else None


def unsupported_scheme(path: str) -> ConfigError:
    """The one-line error for a path that is a URL of a scheme h5stream does not read."""
    return ConfigError(f"{shown_url(path)}: {other_scheme(path)}:// URLs are not supported; h5stream reads "
                       "s3://bucket/key, http(s)://host/path or a local path (copy the store to one of those)")


def is_url(path) -> bool:
    """Whether ``path`` is a URL h5stream reads remotely (``s3://``, ``http://``, ``https://``)."""
    return isinstance(path, str) and _URL.match(path) is not None


@dataclass(frozen=True)
class Location:
    """Where an object lives: ``url`` (as the user wrote it, a password in it shown as ``***``: the name in every
    message), ``scheme`` (s3, http, https), ``container`` (the bucket, or ``scheme://host[:port]`` for HTTP,
    without credentials), ``key`` (the object's path in it, unquoted) and ``basic_auth`` (``(user, password)``
    written in an HTTP URL as ``user:password@host``, unquoted; never shown), ``query`` (the query string as
    written; never shown) and ``target``."""

    url: str
    scheme: str
    container: str
    key: str
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    query: str = field(default="", repr=False)
    target: str = field(default="", repr=False)
    """For HTTP: what requests go to, the path and the query string (a presigned link's signature, a CDN's token)
    exactly as written, without credentials (they go as a header).  Never shown: ``url`` ends in ``?...``."""


def shown_url(url: str) -> str:
    """``url`` with the password of a ``user:password@`` part replaced by ``***`` and its query string by ``...``
    (pure): what messages name."""
    return hide_passwords(url)


def parse_url(url: str) -> Location:
    """Split a store URL, or raise :class:`ConfigError` saying what is wrong with it."""
    shown = shown_url(url) if isinstance(url, str) else url
    if not is_url(url):
        raise ConfigError(f"{shown!r}: not a store URL; use s3://bucket/key, https://host/path or a local path")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number from 0 to 65535
    except ValueError as exc:
        raise malformed(shown, str(exc)) from None
    scheme = parts.scheme.lower()
    if _BAD_URL_CHARS.search(parts.netloc):
        raise malformed(shown, "a space or a control character in the host")
    if parts.fragment:
        raise ConfigError(f"{shown}: a URL of a store has no #fragment (it is never sent to the server); remove it")
    if parts.query and scheme == "s3":
        raise ConfigError(f"{shown}: an s3:// URL takes no query string; write s3://BUCKET/KEY (a presigned "
                          "link is an https:// URL: open that as it is)")
    key = urllib.parse.unquote(parts.path.lstrip("/"))
    if scheme == "s3":
        if not parts.netloc:
            raise ConfigError(f"{shown}: no bucket; write s3://BUCKET/KEY")
        if "@" in parts.netloc:
            raise ConfigError(f"{shown}: credentials in an s3:// URL are not read; set AWS_ACCESS_KEY_ID and "
                              "AWS_SECRET_ACCESS_KEY (or a profile) and write s3://BUCKET/KEY")
        if not key or key.endswith("/"):
            raise ConfigError(f"{shown}: no object key after the bucket; write s3://{parts.netloc}/path/to/store.h5")
        if not _BUCKET.fullmatch(parts.netloc):
            raise malformed(shown, f"{parts.netloc!r} is not a bucket name (letters, digits, '.', '-' and '_')")
        return Location(url, scheme, parts.netloc, key)
    if not parts.netloc:
        raise ConfigError(f"{shown}: no host; write {scheme}://HOST/path/to/store.h5")
    if not key or key.endswith("/"):
        raise ConfigError(f"{shown}: the URL names a folder, not a file; give the store's full URL")
    host = parts.netloc.rsplit("@", 1)[-1]
    auth = None
    if "@" in parts.netloc:
        auth = (urllib.parse.unquote(parts.username or ""), urllib.parse.unquote(parts.password or ""))
    target = f"{scheme}://{host}{parts.path}" + (f"?{parts.query}" if parts.query else "")
    return Location(shown, scheme, f"{scheme}://{host}", key, auth, parts.query, target)


def malformed(url: str, why: str) -> ConfigError:
    """The one-line error for a URL that no request could be sent to: raised at once, never retried."""
    return ConfigError(f"{url}: malformed URL ({why}); write s3://bucket/key or https://host[:port]/path")


@dataclass(frozen=True)
class RemoteOptions:
    """How to reach a remote store.  Every field is optional; the defaults suit AWS S3 and public web servers.

    ``endpoint``: the S3 service's URL for stores other than AWS (MinIO, SeaweedFS, Ceph, R2...), overriding
    ``AWS_ENDPOINT_URL``.  ``region``: the bucket's region, overriding ``AWS_REGION``.  ``profile``: a profile of
    the shared AWS files, overriding ``AWS_PROFILE``.  ``anonymous``: send unsigned requests (public buckets).
    ``timeout_s`` (default 30): the longest a request waits for bytes, retries included: a dead or stalled server
    (no answer, or a body that stops) raises within it, while a slow link whose bytes keep coming is never cut
    off.  ``max_in_flight`` (default 8, 1 to 256): how many reads the reader keeps going at
    once.  ``headers``: extra HTTP headers sent with every request (an ``Authorization`` for a private web
    server).  ``cache_dir``: the folder of the local disk cache (None: no cache; :func:`h5stream.open` sets it
    from its own ``cache_dir``, whose default ``"auto"`` keeps this one if given, else the user's cache folder).
    ``cache_limit`` (bytes, default 100 GB): what the cache folder may hold; the least recently used pieces are
    removed past it.  ``cache_piece`` (bytes, default 8 MiB, at least 64 KiB): one cache piece, each fetched whole
    in one request.  Sizes are ints here; in the dict form that ``open(remote=...)`` also takes they may be
    strings such as ``"100GB"``.

    Raises :class:`~h5stream.ConfigError` (one line naming the field and what it takes) for a value out of range,
    an endpoint that is not an ``http(s)://`` URL, or a header name or value HTTP cannot carry.
    """

    endpoint: str | None = None
    region: str | None = None
    profile: str | None = None
    anonymous: bool = False
    timeout_s: float = 30.0
    max_in_flight: int = 8
    headers: Mapping[str, str] = field(default_factory=dict)
    """Extra HTTP headers sent with every request (e.g. an ``Authorization`` for a private web server)."""
    cache_dir: str | None = None
    """A folder for the local disk cache of a stream's reads (:mod:`h5stream.remote.cache`); None: no cache
    (:func:`h5stream.open` sets it from its ``cache_dir``, which defaults to the user's cache folder)."""
    cache_limit: int = DEFAULT_LIMIT
    """Bytes the cache folder may hold; the least recently used pieces are removed past it."""
    cache_piece: int = PIECE_BYTES
    """Bytes of one cache piece, each fetched whole in one request."""

    def __repr__(self) -> str:
        """The fields, each header's value shown as ``***`` (an ``Authorization`` is a credential)."""
        shown = {f: getattr(self, f) for f in self.__dataclass_fields__}
        if isinstance(self.headers, Mapping):
            shown["headers"] = {k: "***" for k in self.headers}
        return f"RemoteOptions({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    def __post_init__(self):
        if not (isinstance(self.timeout_s, (int, float)) and math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ConfigError(f"timeout_s must be a positive number of seconds, got {self.timeout_s!r}")
        if not isinstance(self.max_in_flight, int) or not 1 <= self.max_in_flight <= 256:
            raise ConfigError(f"max_in_flight must be an int from 1 to 256, got {self.max_in_flight!r}")
        if self.endpoint is not None and not re.match(r"^https?://[^/]", str(self.endpoint)):
            raise ConfigError(f"endpoint must be an http(s) URL such as https://s3.example.org, got {self.endpoint!r}")
        if not isinstance(self.headers, Mapping):
            raise ConfigError(f"headers must be a dict of header names to values, got {self.headers!r}")
        for name, value in self.headers.items():
            if not (isinstance(name, str) and _HEADER_NAME.fullmatch(name)):
                raise ConfigError(f"header name {name!r} is not a valid HTTP header name (letters, digits and "
                                  "!#$%&'*+-.^_`|~, no spaces)")
            if _BAD_HEADER_VALUE.search(str(value)):
                raise ConfigError(f"the value of header {name!r} holds a line break or control character; "
                                  "give it on one line")
        if self.cache_dir is not None and not isinstance(self.cache_dir, str):
            raise ConfigError(f"cache_dir must be a folder's path or None (no cache), got {self.cache_dir!r}")
        if not _int(self.cache_piece) or self.cache_piece < MIN_PIECE_BYTES:
            raise ConfigError(f"cache_piece must be an int of at least {MIN_PIECE_BYTES} bytes, "
                              f"got {self.cache_piece!r}")
        if not _int(self.cache_limit) or self.cache_limit < self.cache_piece:
            raise ConfigError(f"cache_limit must be bytes, at least one cache piece ({self.cache_piece}), "
                              f"got {self.cache_limit!r}")


def remote_options(value) -> RemoteOptions:
    """``value`` (None, a :class:`RemoteOptions`, or a dict of its fields) as a :class:`RemoteOptions`."""
    if value is None:
        return RemoteOptions()
    if isinstance(value, RemoteOptions):
        return value
    if isinstance(value, Mapping):
        known = set(RemoteOptions.__dataclass_fields__)
        unknown = sorted(set(value) - known)
        if unknown:
            raise ConfigError(f"remote options {', '.join(map(repr, unknown))} unknown; "
                              f"valid: {', '.join(sorted(known))}")
        return RemoteOptions(**value)
    raise ConfigError(f"remote must be None, a dict or h5stream.RemoteOptions, got {type(value).__name__}")


def stream_remote(path, options: RemoteOptions | None, timeout_s: float, cache_dir="auto",
                  cache_limit: int | None = None) -> RemoteOptions | None:
    """The remote options of a stream over ``path`` with ``timeout_s`` (pure apart from the home folder;
    ``options`` as given for a local path): the client's ``timeout_s`` is the stream's where that is shorter,
    unless ``options`` set one other than the default, so ``open(url, timeout_s=5)`` gives up on a server that
    stopped answering within 5 s, and says so.  ``cache_dir`` and ``cache_limit`` are :func:`h5stream.open`'s:
    ``"auto"`` keeps the folder ``options`` name, else :func:`~h5stream.remote.cache.default_cache_dir`; None or
    False turns the cache off; a limit of None keeps ``options``'."""
    if not is_url(path):
        return options
    from dataclasses import replace

    options = RemoteOptions() if options is None else options
    if options.timeout_s == RemoteOptions.timeout_s and timeout_s < options.timeout_s:
        options = replace(options, timeout_s=float(timeout_s))
    if cache_dir == "auto":
        cache_dir = options.cache_dir or default_cache_dir()
    changes = {"cache_dir": os.fspath(cache_dir) if cache_dir else None}
    if cache_limit is not None:
        changes["cache_limit"] = int(cache_limit)
    return replace(options, **changes)


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


WHOLE_REQUEST_S = 24 * 3600.0
"""The client's limit on one request from start to end: a day, none in practice (see :func:`client_settings`)."""


def client_settings(options: RemoteOptions) -> tuple[dict, dict]:
    """``(client_options, retry_config)`` for the client such that a request that stops getting bytes fails within
    ``timeout_s``, while one whose bytes keep coming is never cut off.

    ``timeout_s`` bounds the silence, not the request: each attempt may wait half of it for the connection, the
    answer, or the next bytes of the body (the client's read timeout, which every byte received starts again); a
    request is retried (server errors, throttling, dropped connections, timeouts before the body) with
    exponential backoff while less than 30% of ``timeout_s`` has passed, and the last wait before an attempt is at
    most a fifth, so a request answered by nothing fails within ``timeout_s``.  A body that stops midway fails
    half ``timeout_s`` after its last bytes.  The client's limit on a whole request, :data:`WHOLE_REQUEST_S`, is
    past any request's length: an 8 MiB piece on a slow link may take minutes, and timing it out would only
    retry it from the start, forever.
    """
    t = float(options.timeout_s)
    attempt = timedelta(seconds=t / 2)
    client = {
        "timeout": timedelta(seconds=WHOLE_REQUEST_S),
        "connect_timeout": timedelta(seconds=min(t / 2, 10.0)),
        "read_timeout": attempt,
        "allow_http": True,  # whether plain http is acceptable is decided by the URL the user wrote
        "pool_max_idle_per_host": str(max(2 * options.max_in_flight, 16)),
    }
    if options.headers:
        client["default_headers"] = {str(k): str(v) for k, v in options.headers.items()}
    retry = {
        "max_retries": 20,
        "retry_timeout": timedelta(seconds=0.3 * t),
        "backoff": {"init_backoff": timedelta(seconds=min(0.1, t / 50)), "max_backoff": timedelta(seconds=0.2 * t),
                    "base": 2},
    }
    return client, retry


CLIENT_BASE_BYTES = 12 << 20
"""What the client holds whatever the traffic: its library's pages, its runtime's threads, a connection pool."""

CLIENT_PER_READ_BYTES = 3 << 20
"""What the client holds per read in flight: socket buffers and the response's body, collected whole (at most
:data:`~h5stream.remote.source.COLLECT_BYTES`) or the piece being copied out."""


def client_memory_bytes(options: RemoteOptions, file_bytes: int = 0) -> int:
    """The memory a stream's remote client may hold, counted in its budget: :data:`CLIENT_BASE_BYTES` plus
    :data:`CLIENT_PER_READ_BYTES` per read in flight, each a measurement rounded up (docs/performance.md,
    "Design figures"), plus the disk cache's index for an object of ``file_bytes`` where it is on (its pieces
    are on disk, written through memory maps of their files: page cache, not the process's memory)."""
    if options.cache_dir is not None:
        return (CLIENT_BASE_BYTES + options.max_in_flight * CLIENT_PER_READ_BYTES
                + index_memory_bytes(file_bytes, options.cache_piece))
    return CLIENT_BASE_BYTES + options.max_in_flight * CLIENT_PER_READ_BYTES


CLIENT_POOL_BYTES = 1 << 20
"""What each client beside the first holds (a part of a set at a URL has a client of its own; the library's pages
and runtime are the process's, counted once): its connection pool.  Measured about 160 KiB with one connection
(docs/performance.md, "Design figures"); counted for a few."""


def parts_client_memory_bytes(parts) -> int:
    """The memory the remote clients of a stream over ``parts`` may hold (each has ``remote``, None for a local
    one, and ``file_bytes``), counted in its budget (pure).

    One URL: :func:`client_memory_bytes`.  Several: :data:`CLIENT_BASE_BYTES` once, :data:`CLIENT_POOL_BYTES` per
    client beside the first, each cached part's index, and :data:`CLIENT_PER_READ_BYTES` per read that can be in
    flight: the reader's I/O threads, shared by the parts (the most any part's ``max_in_flight``), plus each cached
    part's prefetch threads (its ``max_in_flight``, at most one per piece of it) -- never more than one
    ``max_in_flight`` per part, what counting each part as one URL gives.  A set of a hundred small parts needed
    a hundred clients' worth (3.5 GiB) before.
    """
    remote = [(p.remote, int(getattr(p, "file_bytes", 0) or 0)) for p in parts if p.remote is not None]
    if len(remote) <= 1:
        return sum(client_memory_bytes(o, n) for o, n in remote)
    shared = max(o.max_in_flight for o, _ in remote)
    ahead = sum(min(o.max_in_flight, max(1, -(-n // o.cache_piece))) for o, n in remote if o.cache_dir is not None)
    reads = min(sum(o.max_in_flight for o, _ in remote), shared + ahead)
    index = sum(index_memory_bytes(n, o.cache_piece) for o, n in remote if o.cache_dir is not None)
    return CLIENT_BASE_BYTES + (len(remote) - 1) * CLIENT_POOL_BYTES + reads * CLIENT_PER_READ_BYTES + index


def home_aws_files(env: Mapping[str, str]) -> tuple[str, str]:
    """Paths of the shared credentials and config files, as the AWS tools find them."""
    home = os.path.expanduser("~")
    return (env.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(home, ".aws", "credentials"),
            env.get("AWS_CONFIG_FILE") or os.path.join(home, ".aws", "config"))


def read_profile(profile: str, credentials_text: str | None, config_text: str | None) -> dict[str, str] | None:
    """The settings of ``profile`` from the two files' text (credentials win), or None when neither has it.

    The config file names profiles ``[profile NAME]`` (``[default]`` for the default); the credentials file
    ``[NAME]``.  Nested per-service settings (``s3 =`` followed by indented lines) are left out.
    """
    found = None
    for text, section in ((config_text, "default" if profile == "default" else f"profile {profile}"),
                          (credentials_text, profile)):
        if text is None:
            continue
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string(text)
        except configparser.Error:
            continue
        if parser.has_section(section):
            found = {**(found or {}), **{k: v.strip() for k, v in parser.items(section) if "\n" not in v}}
    return found


def s3_settings(location: Location, options: RemoteOptions, env: Mapping[str, str],
                profile_settings: dict[str, str] | None) -> dict:
    """The client configuration for ``location`` (an ``s3://`` URL): bucket, region, endpoint, credentials.

    ``profile_settings`` is :func:`read_profile`'s result for the profile in use.  Raises
    :class:`ConfigError` for a profile asked for by name that is not in the files, and
    :class:`StorePermissionError` when no credentials are found and the instance metadata service is switched
    off (``AWS_EC2_METADATA_DISABLED``); otherwise missing credentials are left to the client, which asks the
    web-identity, container or instance metadata sources the way the AWS tools do.
    """
    profile = options.profile or env.get("AWS_PROFILE")
    if profile and profile != "default" and profile_settings is None:
        creds_file, config_file = home_aws_files(env)
        raise ConfigError(f"{location.url}: AWS profile {profile!r} is not in {creds_file} or {config_file}; "
                          "set AWS_PROFILE (or profile=) to a profile that exists")
    prof = profile_settings or {}
    config: dict = {"bucket": location.container}
    config["region"] = (options.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
                        or prof.get("region") or DEFAULT_REGION)
    endpoint = (options.endpoint or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
                or prof.get("endpoint_url"))
    if endpoint:
        config["endpoint"] = checked_endpoint(endpoint, location.url)
    if options.anonymous:
        config["skip_signature"] = True
        return config
    key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    token = env.get("AWS_SESSION_TOKEN")
    if not (key and secret):
        key, secret = prof.get("aws_access_key_id"), prof.get("aws_secret_access_key")
        token = prof.get("aws_session_token")
    if key and secret:
        config["access_key_id"], config["secret_access_key"] = key, secret
        if token:
            config["session_token"] = token
    elif not any(env.get(name) for name in CREDENTIAL_ENV) and _true(env.get("AWS_EC2_METADATA_DISABLED")):
        raise missing_credentials(location.url)
    return config


def checked_endpoint(endpoint: str, url: str) -> str:
    """``endpoint`` (from the options, the environment or a profile), or :class:`ConfigError` where the client
    could not send a request to it (it would fail at the first request, not as a setting)."""
    try:
        parts = urllib.parse.urlsplit(endpoint)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number from 0 to 65535
        ok = parts.scheme.lower() in ("http", "https") and parts.hostname and not _BAD_URL_CHARS.search(endpoint)
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError(f"{url}: the S3 endpoint {endpoint!r} is not a valid http(s) URL; set endpoint= or "
                          "AWS_ENDPOINT_URL to one such as https://s3.example.org:9000")
    return endpoint


def missing_credentials(url: str) -> StorePermissionError:
    """The one-line error for an ``s3://`` URL opened without any credentials."""
    return StorePermissionError(
        f"{url}: no AWS credentials found; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile in "
        "~/.aws/credentials (AWS_PROFILE), or open a public bucket with anonymous=True"
    )


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")
