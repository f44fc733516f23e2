"""Reading byte ranges of a file: the one ``preadv`` loop the reader thread and the augment workers share.

Low-level: imports nothing from h5stream.
"""

from __future__ import annotations

import os


def preadv_all(fd: int, views: list, offset: int, path: str) -> None:
    """``preadv`` from ``offset`` until every view is full (short reads are legal); end of file first is an error."""
    while views:
        got = os.preadv(fd, views, offset)
        if got == 0:
            raise OSError(f"{path}: unexpected end of file at byte {offset} (file truncated?)")
        offset += got
        rest = []
        for v in views:
            if got >= len(v):
                got -= len(v)
            else:
                rest.append(v[got:] if got else v)
                got = 0
        views = rest
