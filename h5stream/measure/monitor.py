"""The sampling loop behind :class:`h5stream.measure.ResourceSampler`, run as its own process.

Run by file path (``python monitor.py PID INTERVAL_S``) so it imports only the
standard library and psutil, never the h5stream package.  Sampling from
another process keeps the samples on time even while the measured process's
threads hold the GIL, and keeps the sampler's own memory out of the figures.

Protocol: prints ``ready`` once started; then every ``INTERVAL_S`` records
the monotonic time, the sum of PSS over PID and its descendants (except this
monitor), cumulative CPU seconds of each thread of PID (by thread id) and of
each descendant (by pid).  When its stdin closes it prints all samples as one
JSON list and exits.
"""

import json
import os
import select
import sys
import time

import psutil


def _pss(proc):
    info = proc.memory_full_info()
    return int(getattr(info, "pss", info.rss))


def snapshot(target, me, seen):
    """One sample: {"t", "mem", "threads": {tid: cpu_s}, "children": {pid: cpu_s}, "cmdlines": {pid: str}}.

    A child's command line is sent once, the first time it is seen (``seen``).
    """
    sample = {"t": 0.0, "mem": 0, "threads": {}, "children": {}, "cmdlines": {}}
    try:
        sample["threads"] = {str(t.id): t.user_time + t.system_time for t in target.threads()}
        sample["t"] = time.monotonic()  # right after the CPU times, so CPU % is per the right interval
        sample["mem"] = _pss(target)
        children = target.children(recursive=True)
    except psutil.Error:
        sample["t"] = sample["t"] or time.monotonic()
        return sample
    for child in children:
        if child.pid == me:
            continue
        try:
            times = child.cpu_times()
            sample["mem"] += _pss(child)
        except psutil.Error:
            continue
        sample["children"][str(child.pid)] = times.user + times.system
        if child.pid not in seen:
            seen.add(child.pid)
            try:
                sample["cmdlines"][str(child.pid)] = " ".join(child.cmdline())[:300]
            except psutil.Error:
                pass
    return sample


def main(argv):
    pid, interval_s = int(argv[1]), float(argv[2])
    target, me = psutil.Process(pid), os.getpid()
    seen = set()
    samples = [snapshot(target, me, seen)]
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    stdin = sys.stdin.fileno()
    while True:
        readable, _, _ = select.select([stdin], [], [], interval_s)
        if readable and not os.read(stdin, 4096):
            break  # stdin closed: the measurement is over (or the parent died)
        samples.append(snapshot(target, me, seen))
    samples.append(snapshot(target, me, seen))
    json.dump(samples, sys.stdout)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
