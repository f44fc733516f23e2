"""Writing a command's output file (``preview --out``, ``bench --plot``) whole or not at all.

The file is written under a temporary name in its folder and renamed over ``path`` once complete, so a write
that fails (disk full, ``RLIMIT_FSIZE``, an I/O error) leaves whatever was at ``path`` as it was and no partial
file; a symbolic link planted at ``path`` is replaced, never written through.  A failure is one
:class:`~h5stream.errors.OutputWriteError` naming the option, the file and the reason.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable


def write_output(path: str | os.PathLike, write: Callable[[str], None], *, option: str) -> None:
    """``write(tmp_path)`` a complete file, then rename it to ``path`` (mode 0666 less the umask, as ``open``
    would create it).  ``option`` (``"--out"``) names the argument in the error."""
    from h5stream.errors import OutputWriteError

    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=os.path.splitext(name)[1] + ".tmp", dir=folder)
        os.close(fd)
        os.chmod(tmp, 0o666 & ~_umask())
        write(tmp)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise OutputWriteError(f"{option} {path}: cannot write it ({reason}); nothing was written there: free space, "
                               "or choose a folder you may write to", errno=exc.errno) from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _umask() -> int:
    """The process's umask (read by setting it and putting it back: the command's main thread calls this)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
