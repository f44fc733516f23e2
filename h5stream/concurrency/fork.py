"""Fork safety: a process forked after ``open`` copies the parent's streams, and nothing it does reaches them.

``os.fork()`` (a ``multiprocessing`` pool or a torch ``DataLoader`` with the
``fork`` start method, a pre-forking web server) copies every stream object
into the child: the pids of the workers and of the feeder, the parent's ends
of their pipes, the names of the shared-memory segments, but none of the
threads.  Those all belong to the parent, and the child must not stop,
signal, join, read, unlink or close any of them -- not when it uses the copy,
and not when it exits (``sys.exit``, an exception, ``os._exit``, garbage
collection, ``atexit``, ``weakref.finalize``).  So:

* every owner of a resource records the pid that made it, and its cleanup
  does nothing in another process: :class:`OwnerOnly` wraps a finalizer (the
  stream's, the adapters', the writer's lock's, ingest's decode pool's); the
  worker pool's state, the shared segments
  (:mod:`h5stream.memory.shm`) and the feeder's state (a ``multiprocessing``
  ``Finalize``, pid-checked by ``multiprocessing``) check it themselves;
* ``multiprocessing`` keeps the processes it started in a set the child
  inherits (``multiprocessing.process._children``), and its exit handler, in
  the child too, SIGTERMs the daemonic ones (the augment and decode workers)
  and joins the rest (the feeder: "can only join a child process").  The processes
  h5stream starts are registered here (:func:`disown_in_forks`) and removed
  from the child's copy of that set right after a fork (``os.register_at_fork``).
  There is no public API for it; where the set is not there (another Python),
  nothing is removed;
* the child's copies of the parent's ends of the workers' and the feeder's
  pipes (:func:`release_in_forks`) are pointed at ``/dev/null`` in the child
  right after the fork: a worker or feeder whose parent dies sees its pipe end
  and exits, as it does unforked, not only once the last forked child is gone
  too.  The fd numbers stay taken, so the copies the child's objects close
  later are those of ``/dev/null``, never a file the child opened since;
* using a stream in the child (``iter``, ``next``, ``state``, ``restore``,
  ``stats``, the adapters) raises :class:`~h5stream.errors.ForkedStreamError`
  (:func:`check_owner`) before it touches anything; ``close()`` there only
  marks the child's copy closed.  A child opens a stream of its own.
"""

from __future__ import annotations

import multiprocessing.process
import os
import weakref
from collections.abc import Callable, Iterable

from h5stream.errors import ForkedStreamError

_started: weakref.WeakSet = weakref.WeakSet()
"""The ``multiprocessing`` processes h5stream started in this process (workers, feeder)."""
_ends: weakref.WeakSet = weakref.WeakSet()
"""This process's ends of the pipes to those processes (objects with ``fileno()``)."""


def owner_pid() -> int:
    """The pid to record in a resource's owner: this process's."""
    return os.getpid()


def in_owner(pid: int) -> bool:
    """Whether this process is the one with pid ``pid`` (False in a child forked from it)."""
    return os.getpid() == pid


def forked_message(where: str, pid: int) -> str:
    """The one line of :class:`ForkedStreamError` for a stream of ``where`` opened in process ``pid`` (pure but for
    this process's pid)."""
    return (f"{where}: opened in process {pid}, used in forked child {os.getpid()}: open a stream in the child "
            "(h5stream.open(...) after the fork)")


def check_owner(pid: int, where: str) -> None:
    """Raise :class:`ForkedStreamError` unless this is process ``pid``, the one that opened the stream of
    ``where`` (its path)."""
    if os.getpid() != pid:
        raise ForkedStreamError(forked_message(where, pid))


class OwnerOnly:
    """``fn`` for ``weakref.finalize``: called in the process that made this, nothing in a forked child.

    Holds ``fn`` only (a bound method of what the finalizer cleans up, never the object it watches)."""

    __slots__ = ("_fn", "pid")

    def __init__(self, fn: Callable[[], object]):
        self._fn = fn
        self.pid = os.getpid()

    def __call__(self) -> None:
        if os.getpid() == self.pid:
            self._fn()


def disown_in_forks(procs: Iterable) -> None:
    """Register started ``multiprocessing`` processes: a child forked from here leaves them alone at its exit.
    Any thread."""
    for proc in procs:
        _started.add(proc)


def release_in_forks(ends: Iterable) -> None:
    """Register this process's ends of pipes to its workers or feeder (``Connection`` or ``socket`` objects): a
    child forked from here does not hold them open.  Any thread."""
    for end in ends:
        _ends.add(end)


def _after_fork_in_child() -> None:
    """Right after ``os.fork()``, in the child (its only thread): forget the parent's h5stream processes and let go
    of its pipe ends."""
    children = getattr(multiprocessing.process, "_children", None)
    if isinstance(children, set):
        for proc in list(_started):
            children.discard(proc)
    _started.clear()
    ends = list(_ends)
    _ends.clear()
    if not ends:
        return
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    try:
        for end in ends:
            try:
                fd = end.fileno()
                if fd >= 0 and fd != null:
                    os.dup2(null, fd, inheritable=False)
            except (OSError, ValueError):
                pass  # closed already: nothing of the parent's held
    finally:
        os.close(null)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
