"""How an ingest decodes its files, and the errors that are never a skip: what the process that writes the store
needs of the decoder without importing it (OpenCV and Pillow load only where files are decoded: in the decode
workers, or in the calling thread with ``workers=0``).

OpenCV's wheels bring an OpenBLAS of their own, whose threads (one per core) spin for a while after every wake-up:
in the writing process they would take the cores the decode workers need, and count as its CPU."""

from __future__ import annotations

import errno
from dataclasses import dataclass

RESIZE_MODES = ("stretch", "crop", "pad")
DEFAULT_BACKGROUND = (255, 255, 255)
DEFAULT_PAD_FILL = (0, 0, 0)
MAX_PIXELS = 1 << 27
"""Files whose header declares more pixels (~134 megapixels) are skipped as absurdly large."""
#: Failures to open a file that say nothing about the file (this process or the system has too many open):
#: raised, never a skip, so a good image is not reported bad.
FD_LIMIT_ERRNOS = (errno.EMFILE, errno.ENFILE)


@dataclass(frozen=True)
class DecodeSpec:
    """How every file of one ingest is decoded.  ``size`` is (height, width); ``background`` is what alpha is
    composited on, ``pad_fill`` what ``pad`` fills around the image."""

    size: tuple[int, int]
    resize: str = "stretch"
    channels: int = 3
    background: tuple[int, int, int] = DEFAULT_BACKGROUND
    pad_fill: tuple[int, int, int] = DEFAULT_PAD_FILL
    max_pixels: int = MAX_PIXELS
    encoding: str = "raw"  # "jpeg": rows go back encoded (see ingest/encode.py); "probe": measured for auto
    quality: int = 90

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.size[0], self.size[1], self.channels)
