"""The resource sampler of a measurement: memory of this process tree, CPU per thread and per child, marks.

* :class:`ResourceSampler` -- samples, at a fixed rate and from a separate
  monitor process (:mod:`h5stream.measure.monitor`, so the GIL cannot delay
  it), the memory of this process and its children (sum of PSS: a page shared
  by k processes counts 1/k in each, so once in the sum), the CPU % of every
  thread of this process (grouped by thread name; the consumer is the thread
  that started the sampler) and of every child process, into a
  :class:`Timeline` of numpy arrays, next to values the consumer marks
  (samples so far, queue fill) on the same clock.
* :func:`reset_peak_rss` / :func:`peak_rss_bytes` -- the kernel's exact RSS
  high-water mark of this process (catches spikes between samples).

Linux is the target; elsewhere the high-water helpers return ``False`` /
``None`` instead of failing.  psutil is a core dependency.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field

import numpy as np

from h5stream.errors import ConfigError

CONSUMER = "consumer"
"""Label of the thread that created the sampler (the one iterating the stream)."""

READER_THREAD = "h5stream-reader"
"""Name the stream gives its reader thread."""

SAMPLER_THREAD = "h5stream-sampler"
OTHER_THREADS = "other"
"""Threads not created by :mod:`threading` (C libraries' pools) are summed under this label."""


# -- memory ---------------------------------------------------------------------------
def reset_peak_rss() -> bool:
    """Reset this process's RSS high-water mark (``VmHWM``) to its current RSS; ``False`` if unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int | None:
    """This process's RSS high-water mark since start or :func:`reset_peak_rss` (``None`` if unknown)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# -- the sampler ----------------------------------------------------------------------
@dataclass
class Timeline:
    """What a :class:`ResourceSampler` recorded.

    Resource samples (one entry per sample): ``t_s`` seconds since the sampler
    started; ``mem_bytes`` sum of PSS of the process tree (the monitor process
    excluded); ``cpu_pct`` maps a label to CPU % (100 = one core; NaN before the
    label existed): ``"consumer"`` (the thread that started the sampler), a
    thread name such as ``"h5stream-reader"`` (threads sharing a name, and the
    ``PREFIX_0``, ``PREFIX_1`` ... threads of one thread pool, are summed under one
    label; threads not made by :mod:`threading` go under ``"other"``), and
    ``"worker-1"``, ``"worker-2"`` ... for child processes in the order they
    appeared (``child_pids`` maps these labels to pids), except multiprocessing's
    own helpers (``"mp-resource-tracker"`` ...).

    Marks (one entry per :meth:`ResourceSampler.mark` call, on the same clock):
    ``mark_t_s`` and ``marks`` (name -> values; NaN where a call omitted it).
    """

    t_s: np.ndarray
    mem_bytes: np.ndarray
    cpu_pct: dict[str, np.ndarray] = field(default_factory=dict)
    child_pids: dict[str, int] = field(default_factory=dict)
    mark_t_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    marks: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def peak_mem_bytes(self) -> int:
        return int(self.mem_bytes.max()) if self.mem_bytes.size else 0

    def rate(self, mark: str, window_s: float = 0.25) -> tuple[np.ndarray, np.ndarray]:
        """``(t_s, per_second)`` of a cumulative mark (e.g. samples yielded) over windows of ``window_s``."""
        t, v = self.mark_t_s, self.marks.get(mark, np.zeros(0))
        ok = np.isfinite(v)
        t, v = t[ok], v[ok]
        if t.size < 2 or t[-1] <= t[0]:
            return np.zeros(0), np.zeros(0)
        window_s = min(window_s, (t[-1] - t[0]) / 10)  # short runs still get ~10 points
        edges = np.arange(t[0], t[-1] + window_s, window_s)
        at = np.interp(edges, t, v)
        return edges[1:], np.diff(at) / window_s

    def cpu_seconds(self, label: str) -> float:
        """CPU seconds ``label`` used between the first and the last sample (integral of its CPU %)."""
        pct = self.cpu_pct.get(label)
        if pct is None or pct.size < 2:
            return 0.0
        return float(np.nansum(pct[1:] * np.diff(self.t_s)) / 100.0)

    def mean_cpu_pct(self) -> dict[str, float]:
        """Mean CPU % per label over the samples where it existed."""
        return {k: float(np.nanmean(v)) if np.isfinite(v).any() else 0.0 for k, v in self.cpu_pct.items()}


class ResourceSampler:
    """Samples memory and CPU of this process tree every ``interval_s``; owns a monitor process.

    The sampling runs in a separate small process (:mod:`h5stream.measure.monitor`)
    so it stays on time while this process's threads hold the GIL.  This
    process keeps one light thread that records thread names (to label CPU
    by thread) every ``interval_s``.  :meth:`mark` records caller values
    (e.g. samples so far, queue depth) on the same clock; call it from the
    consumer loop.  Use as a context manager or :meth:`start` / :meth:`stop`;
    :meth:`stop` returns the :class:`Timeline` and is idempotent.  The thread
    that calls :meth:`start` is labelled ``"consumer"``.
    """

    def __init__(self, interval_s: float = 0.05, start_timeout_s: float = 30.0):
        if not interval_s > 0:
            raise ConfigError(f"interval_s must be > 0, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self.start_timeout_s = float(start_timeout_s)
        self._proc: subprocess.Popen | None = None
        self._names: dict[int, str] = {}
        self._stop = threading.Event()
        self._tracker: threading.Thread | None = None
        self._mark_t: list[float] = []
        self._mark_rows: list[dict] = []
        self._timeline: Timeline | None = None
        self._finalizer = None

    def start(self) -> ResourceSampler:
        if self._proc is not None:
            raise ConfigError("ResourceSampler.start: already started; make a new sampler per measurement")
        self._consumer_tid = threading.get_native_id()
        self._note_thread_names()
        monitor = os.path.join(os.path.dirname(os.path.abspath(__file__)), "monitor.py")
        self._proc = subprocess.Popen(
            [sys.executable, "-I", monitor, str(os.getpid()), repr(self.interval_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        self._finalizer = weakref.finalize(self, _kill, self._proc)
        ready, _, _ = select.select([self._proc.stdout], [], [], self.start_timeout_s)
        if not ready or self._proc.stdout.readline().strip() != "ready":
            self._finalizer()
            raise RuntimeError(f"resource monitor {monitor} did not start within {self.start_timeout_s} s")
        self._t0 = time.monotonic()
        self._tracker = threading.Thread(target=self._track, name=SAMPLER_THREAD, daemon=True)
        self._tracker.start()
        return self

    def mark(self, **values: float) -> None:
        """Record named values now (a clock read, an append, a look at thread names).  Call from one thread.

        Every call is kept, so throttle it in a tight loop (e.g. once per ``interval_s / 2``).
        """
        self._mark_t.append(time.monotonic())
        self._mark_rows.append(values)
        self._note_thread_names()  # catches threads that live shorter than the tracker's period

    def stop(self) -> Timeline:
        if self._timeline is None:
            samples: list = []
            if self._proc is not None:
                self._stop.set()
                self._tracker.join()
                self._note_thread_names()
                try:
                    out, _ = self._proc.communicate(input="", timeout=self.start_timeout_s)
                    samples = json.loads(out) if out.strip() else []
                except (subprocess.TimeoutExpired, ValueError):
                    samples = []
                finally:
                    self._finalizer()
            self._timeline = self._build(samples)
        return self._timeline

    close = stop

    def __enter__(self) -> ResourceSampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def timeline(self) -> Timeline | None:
        """The result once stopped, else ``None``."""
        return self._timeline

    def _track(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._note_thread_names()

    def _note_thread_names(self) -> None:
        for t in threading.enumerate():
            if t.native_id is not None:
                self._names[t.native_id] = t.name

    def _label(self, tid: int) -> str:
        if tid == self._consumer_tid:
            return CONSUMER
        name = self._names.get(tid, OTHER_THREADS)
        # ThreadPoolExecutor names its threads PREFIX_0, PREFIX_1 ...: one label per pool.
        prefix, sep, index = name.rpartition("_")
        return prefix if sep and index.isdigit() and prefix else name

    def _build(self, samples: list) -> Timeline:
        t0 = getattr(self, "_t0", samples[0]["t"] if samples else 0.0)
        child_labels: dict[str, str] = {}
        cmdlines: dict[str, str] = {}
        cumulative = []  # per sample: label -> cumulative CPU seconds
        for s in samples:
            cpu: dict[str, float] = {}
            for tid, seconds in s["threads"].items():
                label = self._label(int(tid))
                cpu[label] = cpu.get(label, 0.0) + seconds
            for pid, line in s.get("cmdlines", {}).items():
                cmdlines.setdefault(pid, line)
            for pid, seconds in s["children"].items():
                if pid not in child_labels:
                    child_labels[pid] = _child_label(cmdlines.get(pid, ""), child_labels)
                label = child_labels[pid]
                cpu[label] = cpu.get(label, 0.0) + seconds
            cumulative.append(cpu)
        labels = sorted({k for c in cumulative for k in c}, key=_label_order)
        t = np.array([s["t"] - t0 for s in samples], dtype=np.float64)
        cpu_pct = {}
        for label in labels:
            seconds = np.array([c.get(label, np.nan) for c in cumulative], dtype=np.float64)
            pct = np.full(t.size, np.nan)
            if t.size > 1:
                prev = seconds[:-1].copy()
                # A label that appears after the first sample did not exist before: it had used 0 s.
                prev[np.isnan(prev) & ~np.isnan(seconds[1:])] = 0.0
                # Summed CPU steps back when one of a label's threads exits; clip at 0.
                pct[1:] = np.clip(100.0 * (seconds[1:] - prev) / np.maximum(np.diff(t), 1e-9), 0.0, None)
            cpu_pct[label] = pct
        names = sorted({k for row in self._mark_rows for k in row})
        return Timeline(
            t_s=t,
            mem_bytes=np.array([s["mem"] for s in samples], dtype=np.int64),
            cpu_pct=cpu_pct,
            child_pids={label: int(pid) for pid, label in child_labels.items()},
            mark_t_s=np.array(self._mark_t, dtype=np.float64) - t0,
            marks={k: np.array([row.get(k, np.nan) for row in self._mark_rows], dtype=np.float64) for k in names},
        )


HELPER_PROCESSES = ("resource_tracker", "semaphore_tracker", "forkserver")
"""Children that multiprocessing starts for itself; labelled by role, not counted as workers."""


def _child_label(cmdline: str, taken: dict[str, str]) -> str:
    for helper in HELPER_PROCESSES:
        if helper in cmdline:
            return f"mp-{helper.replace('_', '-')}"
    n_workers = sum(1 for label in taken.values() if label.startswith("worker-"))
    return f"worker-{n_workers + 1}"


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None and not stream.closed:
            stream.close()


def _label_order(label: str) -> tuple:
    fixed = {CONSUMER: 0, READER_THREAD: 1}
    if label in fixed:
        return (fixed[label], 0, label)
    if label.startswith("worker-") and label[7:].isdigit():
        return (2, int(label[7:]), label)
    return (3, 0, label)
