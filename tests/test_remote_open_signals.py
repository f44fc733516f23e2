"""Opening a URL whose server stopped answering: Ctrl-C is raised at once, and the stream's own ``timeout_s``
bounds the open and is the one named.  A real HTTP server on 127.0.0.1 that takes requests and never answers
(:meth:`remote_servers.RangeServer.stall_next`), a real SIGINT to a real Python process."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.usefixtures("no_leaks")
pytest.importorskip("obstore")

SAFETY_S = 60  # a failure detector only: the interrupt comes within a fraction of a second

CHILD = r"""
import sys
import h5stream
print("opening", flush=True)
try:
    # The client's own timeout is far beyond the test's safety net: only the interrupt can end this open in time.
    h5stream.open(sys.argv[1], batch_size=8, remote={"timeout_s": 600})
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
    sys.exit(130)
print("opened", flush=True)
"""


def test_ctrl_c_during_an_open_of_a_url_whose_server_stopped_answering_raises_keyboard_interrupt(range_server):
    range_server.stall_next(1000)  # every request is taken and never answered
    proc = subprocess.Popen([sys.executable, "-c", CHILD, range_server.url + "store.h5"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "opening\n"
        assert range_server.stalled.wait(SAFETY_S), "the open never reached the server"
        proc.send_signal(signal.SIGINT)  # the child is now inside the client's request
        out, err = proc.communicate(timeout=SAFETY_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130 and out == "KeyboardInterrupt\n", (proc.returncode, out, err)


def test_an_open_of_a_url_whose_server_stopped_answering_ends_within_the_streams_timeout_s_and_names_it(
        range_server):
    import h5stream
    from h5stream.errors import RemoteUnavailableError

    range_server.stall_next(1000)
    with pytest.raises(RemoteUnavailableError) as info:
        h5stream.open(range_server.url + "store.h5", batch_size=8, timeout_s=2)
    msg = str(info.value)
    assert "timeout_s=2 s" in msg and "\n" not in msg, msg  # the caller's, not the client's default 30 s
