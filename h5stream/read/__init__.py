"""Reading: byte sizes and read units (pure), and the reader thread with its bounded queue."""

from h5stream.read.plan import format_bytes, parse_bytes

__all__ = ["format_bytes", "parse_bytes"]
