"""Numpy arrays in POSIX shared memory, with one owner per segment.

:class:`SharedArray` is how pixels cross process boundaries: the worker pool's
output slots and the stream's input slots (for fills the workers do not read
straight from the page cache) live in segments created here, and worker
processes attach to them by :class:`SharedSpec` (a small, picklable
``(name, shape, dtype)``).

Ownership: the process that calls :meth:`SharedArray.create` owns the segment
and is the only one that unlinks it (``close()``, or a ``weakref.finalize``
safety net at garbage collection / interpreter exit).  The creator also
registers the name with multiprocessing's resource tracker, so a creator killed
by SIGKILL still has its segments unlinked once the tracker sees it (and its
workers) gone.  :meth:`SharedArray.attach` never registers, never unlinks.
Names carry the creator's pid and start time (:func:`new_prefix`): where the
tracker died too (a whole process group killed), the next stream or ingest
unlinks what the dead process left (:func:`sweep_stale_segments`).  Names start
with a namespace, ``h5s`` unless ``$H5STREAM_SHM_NAMESPACE`` names another
(:func:`shm_namespace`); a process sweeps only its own namespace's segments.

Why not ``multiprocessing.shared_memory.SharedMemory`` directly:

* Before Python 3.13 attaching registers the segment with the resource tracker.
  Spawned children share the parent's tracker, whose registry is a set, so the
  usual "unregister after attach" workaround would delete the *creator's*
  registration (and the creator's later unlink then makes the tracker print a
  KeyError); not registering at all is the only correct option.
* ``SharedMemory.close()`` unmaps the memory even while numpy views exist
  (numpy 2 arrays reference the mmap without holding a buffer export), so a
  view kept past ``close()`` segfaults on access.  Here the ndarray's base is
  the ``mmap`` object itself and nothing ever calls ``mmap.close()``: closing a
  ``SharedArray`` unlinks the name at once, and the mapping goes away when the
  last view does, so a view kept by a caller never dangles.

Both use the same ``_posixshmem`` calls ``SharedMemory`` uses; Windows is not
supported (the worker pool is POSIX-only; ``workers=0`` works everywhere).
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import re
import secrets
import weakref
from dataclasses import dataclass
from multiprocessing import resource_tracker

import numpy as np

from h5stream.memory.lend import Lender
from h5stream.errors import BudgetError, ConfigError, ResourceLimitError, StreamClosedError, WorkerError

try:  # CPython on POSIX; the module multiprocessing.shared_memory is built on
    import _posixshmem
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None

__all__ = ["SharedArray", "SharedSpec", "new_prefix", "segment_limit_bytes", "segment_names", "shm_free_bytes",
           "shm_namespace", "sweep_stale_segments", "NAMESPACE_ENV", "SHM_DIR"]

#: Where Linux exposes POSIX shared memory; used for diagnostics and tests only.
SHM_DIR = "/dev/shm"

#: The environment variable naming the namespace of this process's segment names (see :func:`shm_namespace`).
NAMESPACE_ENV = "H5STREAM_SHM_NAMESPACE"
DEFAULT_NAMESPACE = "h5s"
_NAMESPACE = re.compile(r"^[A-Za-z0-9]{1,16}$")

_RTYPE = "shared_memory"  # resource-tracker type whose cleanup is shm_unlink
_counter = itertools.count()


@dataclass(frozen=True)
class SharedSpec:
    """What a process needs to attach to a segment; small and picklable.

    ``name`` has no leading slash; ``dtype`` is a numpy dtype string.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def shm_namespace() -> str:
    """The first part of every segment name this process makes, and of those it sweeps: ``$H5STREAM_SHM_NAMESPACE``
    (1 to 16 letters or digits), else ``h5s``.

    Processes of different namespaces never sweep each other's segments (:func:`sweep_stale_segments`); a job
    whose processes must find what one of them left after a kill (a test suite, say) gives them a namespace of
    their own.  Read from the environment at each call, so child processes follow their own environment.
    Raises ConfigError for a value that is not such a name.
    """
    namespace = os.environ.get(NAMESPACE_ENV) or DEFAULT_NAMESPACE
    if not _NAMESPACE.match(namespace):
        raise ConfigError(f"{NAMESPACE_ENV}={namespace!r}: the namespace of h5stream's shared-memory names must be "
                          f"1 to 16 letters or digits (default {DEFAULT_NAMESPACE}); set such a name or unset it")
    return namespace


def new_prefix() -> str:
    """A segment-name prefix unique to one stream: ``<namespace>_<pid>_s<start>_<4 hex>`` (the namespace is
    :func:`shm_namespace`'s, ``h5s`` by default).

    ``<start>`` is when this process started (hex clock ticks since boot, from
    ``/proc``), so a segment left by a dead process is recognisable even after
    its pid has been reused (see :func:`sweep_stale_segments`).  The random
    part keeps two streams in one process from colliding.  Where the start time
    is unknown (no ``/proc``): ``<namespace>_<pid>_<8 hex>``.
    """
    namespace, pid = shm_namespace(), os.getpid()
    start = _start_ticks(pid)
    if start is None:
        return f"{namespace}_{pid}_{secrets.token_hex(4)}"
    return f"{namespace}_{pid}_s{start:x}_{secrets.token_hex(2)}"


#: After ``<namespace>_``: ``<pid>_`` then, in names from :func:`new_prefix` that carry it, ``s<start ticks, hex>_``.
_NAME = re.compile(r"^[A-Za-z0-9]+_(\d+)_(?:s([0-9a-f]+)_)?")


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) of ``pid`` from ``/proc``; None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
        fields = data[data.rindex(b")") + 2:].split()  # after "pid (comm) ": state is field 3, starttime 22
        return fields[0].decode(), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _start_ticks(pid: int) -> int | None:
    stat = _proc_stat(pid)
    return None if stat is None else stat[1]


def _creator_gone(pid: int, start: int | None) -> bool:
    """Whether process ``pid``, started at ``start`` ticks (None: unknown), no longer runs.

    A process of another user counts as running; so does a pid whose start
    time cannot be compared (it may be the creator).  A zombie has exited.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    stat = _proc_stat(pid)
    if stat is None:
        return False
    state, ticks = stat
    return state == "Z" or (start is not None and ticks != start)


def sweep_stale_segments() -> list[str]:
    """Unlink every h5stream segment in :data:`SHM_DIR` whose creating process is gone; return their names.

    A process killed by SIGKILL together with its resource tracker (a whole
    process group: a scheduler cancelling a job, a container stop) cannot
    unlink its segments; every stream :func:`~h5stream.open` and every ingest
    calls this first, so such leftovers live until the next h5stream command.
    The creator is recognised by the pid and start time in the name (a reused
    pid does not keep a dead process's segments alive).  Segments of running
    processes, of other users, of other namespaces (:func:`shm_namespace`) and
    names this module did not make are left alone.  Linux only; [] elsewhere.
    """
    removed = []
    gone: dict[tuple[int, int | None], bool] = {}
    for name in segment_names(shm_namespace() + "_"):
        m = _NAME.match(name)
        if m is None:
            continue
        key = (int(m.group(1)), None if m.group(2) is None else int(m.group(2), 16))
        if key not in gone:
            gone[key] = _creator_gone(*key)
        if not gone[key]:
            continue
        try:
            _posixshmem.shm_unlink("/" + name)
        except OSError:  # unlinked meanwhile, or not ours to unlink
            continue
        removed.append(name)
    return removed


def segment_names(prefix: str = "h5s_") -> list[str]:
    """Names of the segments in :data:`SHM_DIR` starting with ``prefix`` (Linux; [] elsewhere)."""
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix))
    except OSError:
        return []


def shm_free_bytes() -> int | None:
    """Bytes an unprivileged process may still allocate in :data:`SHM_DIR`, or None where it is not a mount."""
    try:
        st = os.statvfs(SHM_DIR)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def segment_limit_bytes() -> int | None:
    """The largest segment this process may create: its file size limit (``ulimit -f``, ``RLIMIT_FSIZE``),
    which binds the files of :data:`SHM_DIR` as it binds any other; None when unlimited (or unknown)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _over_file_size_limit(nbytes: int, limit: int | None) -> ResourceLimitError:
    at = "" if limit is None else f" ({limit / 2**20:.1f} MiB)"
    return ResourceLimitError(
        f"cannot create a shared-memory segment of {nbytes / 2**20:.1f} MiB: over this process's file size limit"
        f"{at}, which binds {SHM_DIR} too; raise it (ulimit -f unlimited)", errno=errno.EFBIG)


def _require_posix() -> None:
    if _posixshmem is None:  # pragma: no cover - Windows
        raise ConfigError(
            "shared-memory workers need POSIX shared memory (Linux, macOS); use workers=0 on this platform"
        )


def _validate(shape, dtype) -> tuple[tuple[int, ...], np.dtype]:
    try:
        shape = tuple(int(s) for s in shape)
        dtype = np.dtype(dtype)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"shared array shape/dtype invalid ({shape!r}, {dtype!r}): {exc}") from None
    if not shape or any(s <= 0 for s in shape):
        raise ConfigError(f"shared array shape must be non-empty with positive sizes, got {shape}")
    if dtype.hasobject:
        raise ConfigError(f"shared array dtype must hold plain numbers, got {dtype}")
    return shape, dtype


def _map(fd: int, nbytes: int) -> mmap.mmap:
    return mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


def _release(state: dict) -> None:
    """Drop the mapping, and unlink the name if this process created it.

    Runs from ``close()``, from ``weakref.finalize`` at garbage collection or at
    interpreter exit; must not reference the SharedArray.  A forked child
    inherits the finalizer but not the ownership (pid check).
    """
    # Never mmap.close(): numpy (2.x) arrays keep the mmap as their base without
    # holding a buffer export, so close() would unmap under a live view and the
    # next access would segfault.  Dropping our references unmaps once the last
    # view is gone.
    state["array"] = None
    state["mmap"] = None
    if state.get("owner_pid") == os.getpid():
        state["owner_pid"] = None
        posix_name = "/" + state["name"]
        try:
            _posixshmem.shm_unlink(posix_name)
        except FileNotFoundError:
            pass
        resource_tracker.unregister(posix_name, _RTYPE)


class SharedArray:
    """A numpy array backed by a named POSIX shared-memory segment.

    Use :meth:`create` (owner) or :meth:`attach` (any process).  ``.array`` is
    the ndarray (None after close); ``.spec`` is what to send to another process.
    ``close()`` is idempotent; for the owner it unlinks the name, so new attaches
    fail while existing mappings stay valid until they are dropped.
    Not thread-safe for concurrent close(); reading/writing ``.array`` from
    several threads or processes is the caller's coordination.
    """

    def __init__(self, spec: SharedSpec, mm: mmap.mmap, owner: bool):
        # Private: use create() or attach().
        self.spec = spec
        self.owner = owner
        # The array's base is the mmap object, so every view keeps the mapping alive.
        self.array = np.ndarray(spec.shape, dtype=np.dtype(spec.dtype), buffer=mm)
        self._state = {
            "name": spec.name,
            "mmap": mm,
            "array": self.array,
            "owner_pid": os.getpid() if owner else None,
        }
        self._finalizer = weakref.finalize(self, _release, self._state)

    def lender(self) -> Lender:
        """A :class:`~h5stream.memory.lend.Lender` of the items along axis 0 (lent as arrays made directly on the
        mapping,
        so whether anything still refers to a lent item is known by weak reference).  Like any view, what it
        lends keeps the mapping alive."""
        mm = self._state["mmap"]
        if mm is None:
            raise StreamClosedError(f"shared-memory segment {self.spec.name} is closed")
        return Lender(mm, self.spec.shape, self.spec.dtype)

    @classmethod
    def create(cls, shape, dtype, prefix: str) -> "SharedArray":
        """Create a zero-filled segment named ``<prefix>_<k>``; the caller owns it.

        The segment's memory is reserved up front (``posix_fallocate``), so a
        too-small ``/dev/shm`` (Docker's default is 64 MiB) fails here with
        :class:`BudgetError` instead of a SIGBUS on first write; a segment
        larger than the file size limit (:func:`segment_limit_bytes`) with
        :class:`~h5stream.errors.ResourceLimitError`.
        """
        _require_posix()
        shape, dtype = _validate(shape, dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        free = shm_free_bytes()
        if free is not None and nbytes > free:  # refuse before fallocate fills the tmpfs only to fail
            raise BudgetError(
                f"cannot reserve {nbytes} bytes of shared memory: {SHM_DIR} has {free} free; "
                f"free space in {SHM_DIR} or lower memory_budget (Docker: --shm-size)"
            )
        while True:
            name = f"{prefix}_{next(_counter)}"
            try:
                fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
            except FileExistsError:
                continue
            break
        try:
            try:
                if hasattr(os, "posix_fallocate"):
                    os.posix_fallocate(fd, 0, nbytes)
                else:  # pragma: no cover - macOS
                    os.ftruncate(fd, nbytes)
            except OSError as exc:
                if exc.errno == errno.EFBIG:  # the file size limit (ulimit -f), not a short /dev/shm
                    raise _over_file_size_limit(nbytes, segment_limit_bytes()) from None
                raise BudgetError(
                    f"cannot reserve {nbytes} bytes of shared memory for {name} ({exc.strerror}); "
                    f"free space in {SHM_DIR} or lower memory_budget (Docker: --shm-size)"
                ) from None
            mm = _map(fd, nbytes)
        except BaseException:
            _posixshmem.shm_unlink("/" + name)
            raise
        finally:
            os.close(fd)
        resource_tracker.register("/" + name, _RTYPE)
        return cls(SharedSpec(name, shape, dtype.str), mm, owner=True)

    @classmethod
    def attach(cls, spec: SharedSpec) -> "SharedArray":
        """Map an existing segment; never registers it with the resource tracker, never unlinks.

        Raises :class:`WorkerError` when the segment is gone or smaller than the spec.
        """
        _require_posix()
        try:
            fd = _posixshmem.shm_open("/" + spec.name, os.O_RDWR, mode=0o600)
        except FileNotFoundError:
            raise WorkerError(
                f"shared-memory segment {spec.name} does not exist; its owner closed it or exited"
            ) from None
        try:
            size = os.fstat(fd).st_size
            if size < spec.nbytes:
                raise WorkerError(
                    f"shared-memory segment {spec.name} has {size} bytes, spec needs {spec.nbytes}; stale spec?"
                )
            mm = _map(fd, spec.nbytes)
        finally:
            os.close(fd)
        return cls(spec, mm, owner=False)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def nbytes(self) -> int:
        return self.spec.nbytes

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Unlink (owner) and drop this object's mapping; idempotent."""
        self.array = None
        self._finalizer()

    def __enter__(self) -> "SharedArray":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("owner" if self.owner else "attached")
        return f"SharedArray({self.spec.name!r}, shape={self.spec.shape}, dtype={self.spec.dtype}, {state})"
