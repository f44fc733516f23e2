"""Files that crash the decoder: found by decoding them alone, skipped with why, never retried blindly.

A native decoder (libjpeg, libpng, libtiff, OpenCV) can take its process
down on a file: a segmentation fault, an abort, the out-of-memory killer.
Where that process is a decode worker, the pool (:mod:`h5stream.ingest.pool`)
hands the files it had in flight to :func:`find_culprits`, which decodes them
one at a time in a process of its own (:data:`PROBE_ROLE`) and names each file
the probe died on, with how it died (:func:`crash_reason`); the pool then
replaces the worker and decodes the rest again.  A file whose probe finishes is
not the cause: the death is reported as a worker's death, as before.

Where the ingest itself dies (``--workers 0`` decodes in its own process, or
the whole run was killed), the files it was decoding are known from the
in-flight record beside the store (:class:`InFlight`, ``OUT`` +
:data:`~h5stream.store.schema.DECODING_SUFFIX`, rewritten before each task
is handed out, not synced: it has to outlive the process, not the machine).  The
next ``--append`` probes those files, and the ones an earlier run skipped
because the decoder died on them, before it decodes anything
(:func:`suspects`): a file that still kills the probe is skipped again, one
that decodes now is ingested.  So no resume meets the same fatal file
unprepared, and no row of a file the decoder died on is ever written.

Runs in the ingest's thread; the probe's worker side (:func:`_probe_setup`,
:func:`_probe_one`) runs in the probe process.
"""

from __future__ import annotations

import os
import signal
from collections import deque

from h5stream.concurrency.procpool import DONE, ERROR, EXITED, FATAL, READY, Workers
from h5stream.errors import WorkerError
from h5stream.store import sidecar

#: How the probe's process is named in reports.
PROBE_ROLE = "decode probe"
#: What every skip reason of a file the decoder died on starts with.
CRASH_REASON_START = "the decoder process "
#: How long the probe may take to stop once its work is done or it failed.
_STOP_TIMEOUT_S = 10.0


def crash_reason(exitcode: int | None) -> str:
    """The skip reason of a file a decoder process died on, by its exit code (pure): ``the decoder process died
    with SIGSEGV`` (a negative code is the signal), ``... exited with code 3``."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (perhaps the out-of-memory killer)" if -exitcode == signal.SIGKILL else ""
        return f"{CRASH_REASON_START}died with {name}{hint}"
    return f"{CRASH_REASON_START}exited with code {exitcode}"


def is_crash_reason(why: str) -> bool:
    """Whether a skip reason says the decoder died on the file (pure)."""
    return why.startswith(CRASH_REASON_START)


# -- the probe's process --------------------------------------------------------------------------------------------


def _probe_setup():
    """The probe's set-up: one core's worth of OpenCV, as a decode worker."""
    from h5stream.ingest.decode import cv2

    cv2.setNumThreads(1)


def _probe_one(_state, task) -> str | None:
    """Decode one file as a decode worker would (its pixels thrown away); its skip reason or None."""
    from h5stream.ingest.decode import SkipFile, decode_file

    path, spec = task
    try:
        decode_file(path, spec)
    except SkipFile as exc:
        return str(exc) or "skipped"
    return None


# -- the ingest's side ----------------------------------------------------------------------------------------------


def find_culprits(root: str, relpaths: list[str], spec, timeout_s: float) -> dict[str, str]:
    """Decode ``relpaths`` (under ``root``, with ``spec``) one at a time in a process of their own, a new one after
    each death; returns {relpath: :func:`crash_reason`} of each file the process died on (empty: none did).
    Raises :class:`WorkerError` when the probe fails to start, fails otherwise than by dying, or answers nothing
    for ``timeout_s``.  The caller's thread; the probe is stopped before this returns."""
    culprits: dict[str, str] = {}
    left = list(relpaths)
    while left:
        done = _probe_until_death(root, left, spec, timeout_s)
        if done is None:
            break
        answered, exitcode = done
        culprits[left[answered]] = crash_reason(exitcode)
        left = left[answered + 1:]
    return culprits


def _probe_until_death(root: str, relpaths: list[str], spec, timeout_s: float) -> tuple[int, int | None] | None:
    """One probe process over ``relpaths`` in order: None when it decoded them all, else (how many it answered
    before it died, its exit code)."""
    probe = Workers(PROBE_ROLE)
    try:
        probe.start(_probe_setup, _probe_one, "decode", [()], name="h5stream-probe")
        answered = 0
        while answered < len(relpaths):
            events = probe.wait(timeout_s)
            if not events:
                raise WorkerError(f"a {PROBE_ROLE} produced nothing for {timeout_s:.0f} s on "
                                  f"{os.path.join(root, relpaths[answered])}; rerun with --append")
            for _w, msg in events:
                kind = msg[0]
                if kind == READY:
                    probe.send(0, answered, (os.path.join(root, relpaths[answered]), spec))
                elif kind == DONE:
                    answered += 1
                    if answered < len(relpaths):
                        probe.send(0, answered, (os.path.join(root, relpaths[answered]), spec))
                elif kind in (ERROR, FATAL):
                    raise WorkerError(f"a {PROBE_ROLE} failed: {msg[-1].summary}; rerun with --append")
                elif kind == EXITED:
                    if 0 not in probe.started:
                        raise WorkerError(f"{probe.death(0, oom_fix='pass fewer --workers')}; rerun with --append")
                    if answered < len(relpaths):
                        return answered, msg[1]
        return None
    finally:
        probe.stop(_STOP_TIMEOUT_S)


# -- what a killed ingest was decoding --------------------------------------------------------------------------------


class InFlight:
    """The record beside a store of the files its ingest is decoding now (``path``: ``OUT`` +
    :data:`~h5stream.store.schema.DECODING_SUFFIX`): NUL-separated relative paths, rewritten in place at each task
    handed out (:meth:`submitted`), removed by :meth:`close` once the run ends alive.  A task's names are encoded
    once, when it is handed out; a record costs a join and one write of the tasks in flight.  Owned by the
    ingest's thread."""

    def __init__(self, path: str):
        self.path = path
        sidecar.clear(path)  # an earlier run's, read already (see suspects); anything not ours is refused
        self._fd = sidecar.open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, owner=False)
        self._tasks: deque[bytes] = deque()  # the tasks in flight, oldest first, each its names encoded

    def submitted(self, relpaths) -> None:
        """A task of ``relpaths`` is handed out: the record is now every task in flight."""
        self._tasks.append(b"\0".join(os.fsencode(rel) for rel in relpaths))
        data = b"\0".join(self._tasks)
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))

    def delivered(self) -> None:
        """The oldest task in flight came back (decoded, or its files skipped): the next record leaves it out."""
        if self._tasks:
            self._tasks.popleft()

    def close(self) -> None:
        """Remove the record: the run ends without dying (an error, Ctrl-C, or done), so no file it was decoding
        killed it.  Idempotent."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        self._tasks.clear()
        os.close(fd)
        try:
            sidecar.clear(self.path)
        except OSError:
            pass


def read_in_flight(path: str) -> list[str]:
    """The files an earlier ingest recorded at ``path`` as being decoded when it stopped (none: no record)."""
    try:
        fd = sidecar.open_fd(path, os.O_RDONLY)
    except FileNotFoundError:
        return []
    with open(fd, "rb") as fh:
        data = fh.read()
    return [os.fsdecode(rel) for rel in data.split(b"\0") if rel]


def suspects(in_flight: list[str], reported: dict[str, str], pending: set[str]) -> list[str]:
    """The pending files to decode alone before a resume decodes anything (pure): those a killed run was decoding
    (``in_flight``) and those an earlier run skipped because the decoder died on them (``reported``)."""
    named = dict.fromkeys(in_flight)
    named.update(dict.fromkeys(rel for rel, why in reported.items() if is_crash_reason(why)))
    return [rel for rel in named if rel in pending]
