"""direct_io="auto" sees the memory cgroup's limit, v1 or v2: the page cache a store may count on is bounded by it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from h5stream.read.source import V1_NO_LIMIT, cgroup_paths, v1_room

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_v2_path_and_the_v1_memory_path_are_found_in_proc_cgroup():
    hybrid = "12:pids:/a\n4:cpu,memory:/process_api/abc\n0::/user.slice\n"
    assert cgroup_paths(hybrid) == ("/user.slice", "/process_api/abc")
    assert cgroup_paths("0::/user.slice\n") == ("/user.slice", None)
    assert cgroup_paths("4:memory:/x\n") == (None, "/x")
    assert cgroup_paths("") == (None, None)


def test_the_v1_room_is_the_effective_limit_less_the_anonymous_memory():
    stat = "cache 100\nrss 5\nhierarchical_memory_limit 1000\ntotal_rss 30\ntotal_cache 500\n"
    assert v1_room(stat) == 970  # the hierarchy's rss, not only the cgroup's own
    assert v1_room("rss 5\nhierarchical_memory_limit 1000\n") == 995
    assert v1_room(f"rss 5\nhierarchical_memory_limit {V1_NO_LIMIT}\n") is None
    assert v1_room("hierarchical_memory_limit 9223372036854771712\n") is None  # how the kernel writes "none"
    assert v1_room("rss 2000\nhierarchical_memory_limit 1000\n") == 0
    assert v1_room("rss 5\n") is None


def _own_v1_memory_dir() -> str | None:
    with open("/proc/self/cgroup") as fh:
        rel = cgroup_paths(fh.read())[1]
    base = "/sys/fs/cgroup/memory"
    if rel is None or not os.path.exists(os.path.join(base, "memory.limit_in_bytes")):
        return None
    return os.path.join(base, rel.lstrip("/"))


def test_a_process_in_a_limited_v1_memory_cgroup_counts_on_no_more_page_cache_than_the_limit():
    own = _own_v1_memory_dir()
    if own is None:
        pytest.skip("no cgroup v1 memory hierarchy on this machine")
    child = os.path.join(own, f"h5stream-test-{os.getpid()}")
    try:
        os.makedirs(child)
        with open(os.path.join(child, "memory.limit_in_bytes"), "w") as fh:
            fh.write(str(256 << 20))
    except OSError as e:
        if os.path.isdir(child):
            os.rmdir(child)
        pytest.skip(f"cannot make a memory cgroup here: {e}")
    code = ("import os, sys\n"
            "open(os.path.join(sys.argv[1], 'cgroup.procs'), 'w').write(str(os.getpid()))\n"
            "from h5stream.read.source import cacheable_bytes, use_direct_io\n"
            "room = cacheable_bytes()\n"
            "print(room, use_direct_io('auto', 1 << 30, room))\n")
    try:
        done = subprocess.run([sys.executable, "-c", code, child], capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                  p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)))
    finally:
        os.rmdir(child)  # the child process has exited: the cgroup is empty
    assert done.returncode == 0, done.stderr
    room, direct = done.stdout.split()
    assert 0 < int(room) <= 256 << 20
    assert direct == "True"  # a 1 GiB store cannot live in a 256 MiB cgroup's page cache: read past it
