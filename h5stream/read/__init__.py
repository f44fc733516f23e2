"""Reading: memory budget -> plan (pure), and the reader thread with its bounded queue."""

from h5stream.read.plan import ReadPlan, format_bytes, parse_bytes, plan_read

__all__ = ["ReadPlan", "format_bytes", "parse_bytes", "plan_read"]
