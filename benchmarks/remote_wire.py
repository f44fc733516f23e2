"""What :mod:`benchmarks.remote` sends over the wire: its runs routed through :class:`~benchmarks.netproxy.NetProxy`
(a delay before each response's first byte, a bandwidth per connection, as a cloud object store has), and the
requests and bytes the proxy counted for each run: requests per GB and bytes fetched per epoch.

``--proxy on`` (or either knob given: ``--latency-ms``, ``--bandwidth-mbs``) sends every run over a URL through
the proxy -- one proxy in front of the S3 gateway, one in front of the filer's HTTP -- and ``--proxy both`` measures
each run both directly and through it (the proxied run's name ends with :data:`PROXIED`).  The time to describe the
store and the fsspec baseline go through the proxy whenever it is on.  The proxies live in the benchmark's own
process (one thread, not pinned) and stop with the server.
"""

from __future__ import annotations

import contextlib
import urllib.parse
from dataclasses import dataclass, field

from benchmarks.harness import median
from benchmarks.netproxy import BURST_BYTES, NetProxy

PROXIED = "_proxied"
"""Suffix of a run, and of a condition (``cold_proxied``), measured through the proxy."""
DEFAULT_LATENCY_MS = 20.0
DEFAULT_BANDWIDTH_MBS = 100.0


def add_options(parser) -> None:
    parser.add_argument("--proxy", choices=("off", "on", "both"), default=None,
                        help="route the runs over a URL through a latency-and-bandwidth proxy (on), or measure each "
                             "both directly and through it (both); default: on if --latency-ms or --bandwidth-mbs "
                             "is given, else off")
    parser.add_argument("--latency-ms", type=float, default=None,
                        help=f"the proxy's delay before each response's first byte (default {DEFAULT_LATENCY_MS:g})")
    parser.add_argument("--bandwidth-mbs", type=float, default=None,
                        help=f"the proxy's MB/s per connection and direction, 0 for no limit (default "
                             f"{DEFAULT_BANDWIDTH_MBS:g})")
    parser.add_argument("--burst-kib", type=int, default=BURST_BYTES >> 10,
                        help="the proxy's token bucket per connection, KiB")


def proxy_settings(args) -> dict | None:
    """The proxy the options ask for: ``{"mode", "latency_ms", "bandwidth_mbs", "burst_bytes"}`` (bandwidth None:
    no limit), or None for none; SystemExit for options that contradict or are out of range."""
    knobs = args.latency_ms is not None or args.bandwidth_mbs is not None
    mode = args.proxy or ("on" if knobs else "off")
    if mode == "off":
        if knobs:
            raise SystemExit("benchmarks.remote: --latency-ms and --bandwidth-mbs set the proxy, which --proxy off "
                             "turns off; leave --proxy out or give --proxy on or both")
        return None
    latency = DEFAULT_LATENCY_MS if args.latency_ms is None else args.latency_ms
    bandwidth = DEFAULT_BANDWIDTH_MBS if args.bandwidth_mbs is None else args.bandwidth_mbs
    if latency < 0 or bandwidth < 0 or args.burst_kib <= 0:
        raise SystemExit(f"benchmarks.remote: --latency-ms {latency:g} and --bandwidth-mbs {bandwidth:g} must not be "
                         f"negative and --burst-kib {args.burst_kib} must be positive")
    return {"mode": mode, "latency_ms": latency, "bandwidth_mbs": bandwidth or None,
            "burst_bytes": args.burst_kib << 10}


@dataclass
class Route:
    """How a run reaches the server: directly, or through a proxy per server port (``suffix`` :data:`PROXIED`).
    ``urls``: stream name -> URL; ``endpoint``: the S3 endpoint the children are given; ``proxies``: stream name
    -> the proxy its URL goes through (S3's also carries the open and fsspec runs)."""

    suffix: str
    urls: dict[str, str]
    endpoint: str
    proxies: dict[str, NetProxy] = field(default_factory=dict)

    @contextlib.contextmanager
    def counted(self, name: str, result: dict | None = None):
        """Count what the run inside the block sends through ``name``'s proxy; the counts go into the dict the
        block yields under ``"wire"`` once it ends (nothing without a proxy).  Call from the owner's thread."""
        out = {} if result is None else result
        proxy = self.proxies.get(name)
        before = proxy.stats() if proxy else None
        yield out
        if proxy is not None:
            out["wire"] = proxy.stats().minus(before)


def _through(url: str, proxy: NetProxy) -> str:
    """``url`` with its host and port replaced by ``proxy``'s."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc=f"127.0.0.1:{proxy.port}"))


def _upstream(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    return parts.hostname, parts.port


@contextlib.contextmanager
def routes(settings: dict | None, urls: dict[str, str], endpoint: str):
    """The routes the runs take (``urls``: stream name -> direct URL, ``"remote"`` the S3 one reached through
    ``endpoint``): ``[direct]``, ``[proxied]`` or ``[direct, proxied]`` as ``settings`` (:func:`proxy_settings`)
    say; the proxies are started here and closed when the block ends."""
    direct = Route("", dict(urls), endpoint)
    if settings is None:
        yield [direct]
        return
    knobs = {k: settings[k] for k in ("latency_ms", "bandwidth_mbs", "burst_bytes")}
    with contextlib.ExitStack() as stack:
        s3 = stack.enter_context(NetProxy(_upstream(endpoint), **knobs))
        proxies = {"remote": s3}
        proxied_urls = {"remote": urls["remote"]}  # an s3:// URL: the endpoint says where it goes
        for name, url in urls.items():
            if name != "remote":
                proxies[name] = stack.enter_context(NetProxy(_upstream(url), **knobs))
                proxied_urls[name] = _through(url, proxies[name])
        proxied = Route(PROXIED, proxied_urls, s3.url, proxies)
        yield [direct, proxied] if settings["mode"] == "both" else [proxied]


def wire_row(runs: list[dict], passes: int | None) -> dict:
    """The wire's figures of one reader (``runs``: its rounds, each with ``"bytes"`` and the proxy's ``"wire"``;
    ``passes``: how many times it read the store, None where it stopped early): requests, requests per GB of
    rows, bytes fetched (responses, headers included) per pass over the store and over the rows' bytes; ``{}``
    without counts."""
    if not runs or "wire" not in runs[0]:
        return {}
    row = {"wire_requests": median(r["wire"]["requests"] for r in runs),
           "wire_bytes_down": median(r["wire"]["bytes_down"] for r in runs),
           "wire_bytes_up": median(r["wire"]["bytes_up"] for r in runs)}
    if "bytes" in runs[0]:
        row["requests_per_gb"] = median(r["wire"]["requests"] / (r["bytes"] / 1e9) for r in runs)
        row["fetched_over_rows"] = median(r["wire"]["bytes_down"] / r["bytes"] for r in runs)
    if passes:
        row["fetched_bytes_per_epoch"] = row["wire_bytes_down"] / passes
    return row


def condition_label(condition: str) -> str:
    """``"cold"`` -> ``"server cold"``; ``"cold_proxied"`` -> ``"server cold via proxy"``."""
    cache = condition.removesuffix(PROXIED)
    return f"server {cache}" + (" via proxy" if cache != condition else "")


def wire_lines(r: dict, labels: dict[str, str]) -> list[str]:
    """The text block of what the proxy counted, one line per reader that went through it (``labels``: row name
    -> the label of the main table); ``[]`` without a proxy."""
    proxy = r.get("proxy")
    if not proxy:
        return []
    rate = f"{proxy['bandwidth_mbs']:g} MB/s" if proxy["bandwidth_mbs"] else "no bandwidth limit"
    lines = ["", f"through the proxy ({proxy['latency_ms']:g} ms to each response's first byte, {rate} per "
                 f"connection and direction, burst {proxy['burst_bytes'] >> 10} KiB), as the proxy counted them:",
             f"{'reader':<70}{'requests':>10}{'per GB':>10}{'MB per epoch':>14}{'x rows':>8}"]
    for name, row in r["rows"].items():
        if "wire_requests" not in row:
            continue
        per_epoch = row.get("fetched_bytes_per_epoch")
        lines.append(f"{labels.get(name, name):<70}{row['wire_requests']:>10.0f}"
                     f"{_num(row.get('requests_per_gb'), '.0f'):>10}"
                     f"{_num(None if per_epoch is None else per_epoch / 1e6, '.1f'):>14}"
                     f"{_num(row.get('fetched_over_rows'), '.3f'):>8}")
    if r.get("open_wire"):
        w = r["open_wire"]
        lines.append(f"describing the store through the proxy: {w['requests']} requests, "
                     f"{w['bytes_down'] / 1e3:.0f} kB fetched")
    lines.append("requests: HTTP requests the proxy forwarded (HEAD included); per GB: per GB of rows read; MB per "
                 "epoch: response bytes (headers included) per pass over the store; x rows: over the rows' bytes")
    return lines


def _num(v, fmt: str) -> str:
    return format(v, fmt) if v is not None else "-"
