"""Ingest: discover (folders or CSV -> items), decode (Pillow -> resized uint8), pack (parallel, resumable writer)."""

from h5stream.ingest.pack import IngestOptions, IngestResult, ingest

__all__ = ["IngestOptions", "IngestResult", "ingest"]
