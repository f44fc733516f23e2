"""The client's exceptions as h5stream's one-line errors: what failed, the server's reason, how to fix it.

The client (obstore) raises classes per cause (not found, permission denied, precondition failed) and a
generic error carrying the HTTP status and the server's body in its text, followed by a multi-line debug dump.
:func:`translate` keeps the first line's facts (status, the S3 error code and message) and maps them:

=====================================  ===============================
404, no such bucket/key                :class:`StoreNotFoundError`
401, 403, no or wrong credentials      :class:`StorePermissionError`
(or an expired presigned link)
412 (ETag no longer matches), 416      :class:`StoreChangedError`
a whole file for a ranged GET          :class:`RemoteError` (:func:`no_range`)
other bytes than the range asked for   :class:`RemoteError`, at once
a request the client cannot build      :class:`RemoteError`, at once
redirects that never end (a loop)      :class:`RemoteError`, at once
a TLS certificate refused              :class:`RemoteError`, after the client's retries
connection refused/reset, timeouts,    :class:`RemoteUnavailableError`
5xx and 429 after retries, a body
that stops midway
anything else                          :class:`RemoteError`
=====================================  ===============================
"""

from __future__ import annotations

import re

from h5stream.errors import (
    RemoteError,
    RemoteUnavailableError,
    StoreChangedError,
    StoreNotFoundError,
    StorePermissionError,
    hide_passwords,
)

_STATUS = re.compile(r"status code: (\d{3})(?: ([A-Za-z][A-Za-z ]*[A-Za-z]))?")
_S3_CODE = re.compile(r"<Code>([^<]*)</Code>")
_S3_MESSAGE = re.compile(r"<Message>([^<]*)</Message>")
_RETRIES = re.compile(r"after (\d+) retries")
_OS_CAUSE = re.compile(r'(?:message|error): "([^"\n]{1,160})"')
_UNEXPECTED_RANGE = re.compile(r"Requested (\d+)\.\.(\d+), got (\d+)\.\.(\d+)")
_BUILDER = re.compile(r"HTTP error: builder error|kind: Builder")
# rustls' reason, under the client's wrappers: "InvalidCertificate(Other(OtherError(CaUsedAsEndEntity)))",
# "InvalidCertificate(UnknownIssuer)".
_CERTIFICATE = re.compile(r"InvalidCertificate(?:\(\s*(?:(?:Other|OtherError)\(\s*)*([A-Za-z]+))?"
                          r"|invalid peer certificate")
_BODY_TIMEOUT = re.compile(r"kind: Timeout\b|source: TimedOut\b")
MAX_REASON = 240


def http_status(message: str) -> int | None:
    """The HTTP status named in a client error's text, or None (a connection error has none)."""
    m = _STATUS.search(message)
    return int(m.group(1)) if m else None


def reason(message: str) -> str:
    """A short, one-line account of a client error: the status and the server's own code and message, or the
    transport error, without the client's debug dump."""
    head = message.split("\n\nDebug source:")[0]
    status = _STATUS.search(head)
    code, text = _S3_CODE.search(head), _S3_MESSAGE.search(head)
    if status:
        out = f"HTTP {status.group(1)}" + (f" {status.group(2)}" if status.group(2) else "")
        if code:
            out += f", {code.group(1)}" + (f": {text.group(1)}" if text else "")
    else:
        first = head.splitlines()[0] if head.strip() else type(message).__name__
        # "Generic S3 error: Error performing GET URL in 3.5s, after 10 retries, ... - HTTP error: error sending
        # request": the part after the last " - " is the cause.
        out = first.rsplit(" - ", 1)[-1].strip() or first
        # The operating system's words ("Connection refused", "failed to lookup address information: ...") are
        # only in the debug dump; "error sending request" alone does not tell a stopped server from a typo.
        cause = _OS_CAUSE.search(message)
        notes = [cause.group(1)] if cause else []
        retries = _RETRIES.search(head)
        if retries:
            notes.append(f"after {retries.group(1)} retries")
        if notes:
            out += f" ({'; '.join(notes)})"
    out = " ".join(out.split())
    return out if len(out) <= MAX_REASON else out[:MAX_REASON - 3] + "..."


def translate(exc: BaseException, url: str, *, s3: bool, timeout_s: float, etag: str | None = None,
              query: str = "") -> Exception:
    """The h5stream error for the client exception ``exc`` raised while reading ``url``; ``query`` is the URL's
    query string (a presigned link's signature), never repeated from the client's text."""
    import obstore.exceptions as oe  # the [remote] extra is installed: a client exception exists

    message = hide_passwords(str(exc).replace(query, "...") if query else str(exc))
    status = http_status(message)
    why = reason(message)
    if isinstance(exc, oe.NotFoundError) or status == 404:
        where = "bucket and key" if s3 else "URL"
        return StoreNotFoundError(f"{url}: not found ({why}); check the {where}")
    if isinstance(exc, (oe.PermissionDeniedError, oe.UnauthenticatedError)) or status in (401, 403):
        if query:
            return StorePermissionError(f"{url}: access denied ({why}); the link was refused: a presigned link "
                                        "that has expired or was signed for another object or method; get a fresh "
                                        "link")
        if s3:
            fix = ("check the credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE and "
                   "~/.aws/credentials) and that they may read this object")
        else:
            fix = "the server refuses this request; pass the headers it needs (e.g. Authorization)"
        return StorePermissionError(f"{url}: access denied ({why}); {fix}")
    if isinstance(exc, oe.PreconditionError) or status == 412:
        return changed(url, f"its ETag is no longer {etag}" if etag else why)
    if status == 416:
        return changed(url, "it is shorter than when it was opened")
    if isinstance(exc, oe.NotSupportedError) and "range" in message.lower():
        return no_range(url)
    other = _UNEXPECTED_RANGE.search(message)
    if other:
        return RemoteError(f"{url}: asked for bytes {other.group(1)}..{other.group(2)}, the server answered with "
                           f"bytes {other.group(3)}..{other.group(4)}; it (or a proxy in between) does not honour "
                           "Range requests: serve the file with a server that does, e.g. nginx or an S3 store")
    if status is None and _BUILDER.search(message):
        return RemoteError(f"{url}: the client could not build a request for it ({why}); check the URL, the "
                           "endpoint and the remote headers")
    if status is None and "credential" in message.lower():
        from h5stream.remote.config import missing_credentials

        return missing_credentials(url)
    cert = _CERTIFICATE.search(message)
    if status is None and cert:
        return RemoteError(f"{url}: the server's TLS certificate was refused ({cert.group(1) or 'invalid'}); serve "
                           "it with a certificate for this host name, signed by an authority this machine trusts")
    if status is None and "error following redirect" in message:
        return RemoteError(f"{url}: {why}: the server's redirects never lead to the object (a loop, or more than "
                           "ten); open the URL the link should end at, or fix the server's redirect")
    if status is None and "body error" in why and _BODY_TIMEOUT.search(message):
        return RemoteUnavailableError(f"{url}: {why}: no bytes for {timeout_s / 2:g} s midway through a response "
                                      f"(half of timeout_s={timeout_s:g} s, the longest wait for the next bytes); "
                                      "check that the server is up and reachable, or raise timeout_s")
    if status is None or status >= 500 or status in (408, 429):
        return RemoteUnavailableError(f"{url}: {why}; still failing when timeout_s={timeout_s:g} s ran out, "
                                      "retries included (check that the server is up and reachable)")
    return RemoteError(f"{url}: request failed ({why})")


def changed(url: str, detail: str) -> StoreChangedError:
    """The one-line error for an object replaced or modified after it was opened."""
    return StoreChangedError(f"{url}: the object changed after it was opened ({detail}); reopen it to read the "
                             "new version, and do not replace a store while it is being read")


def no_range(url: str) -> RemoteError:
    """The one-line error for a web server that answers a ranged GET with the whole file (no ``Range`` support,
    as ``python -m http.server``): retrying cannot help, so it is raised at once."""
    return RemoteError(f"{url}: this server ignores Range requests: serve the file with a server that supports "
                       "them, e.g. nginx, Apache, `caddy file-server` or an S3 store (`python -m http.server` "
                       "does not)")
