"""A labels CSV with a huge line is refused in one line, with memory far below the line's size: a real 1 GB line
(a sparse file) read by a real process whose address space is capped (RLIMIT_AS) 256 MiB above what it has."""

from __future__ import annotations

import subprocess
import sys

CHILD = r"""
import resource, sys
from h5stream.errors import SourceError
from h5stream.ingest.discover import discover_csv

def vm_bytes():
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) << 10 for line in fh if line.startswith("VmSize:"))

limit = vm_bytes() + (256 << 20)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:
    discover_csv(sys.argv[1], sys.argv[2])
except SourceError as exc:
    print("SourceError:", exc)
except MemoryError:
    print("MemoryError")
"""


def test_a_labels_csv_with_a_1_gb_line_is_refused_in_one_line_without_reading_the_line_whole(tmp_path):
    root = tmp_path / "images"
    root.mkdir()
    csv_path = tmp_path / "labels.csv"
    header = b"path,label\n"
    with open(csv_path, "wb") as fh:
        fh.write(header)
        fh.write(b"a.png,1\n")
        fh.truncate(fh.tell() + (1 << 30))  # line 3: a billion NUL characters and no newline, taking no disk
    proc = subprocess.run([sys.executable, "-c", CHILD, str(root), str(csv_path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip()
    assert out.startswith(f"SourceError: {csv_path} line 3: longer than 1,048,576 characters"), out
    assert "\n" not in out
