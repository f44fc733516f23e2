"""Stores read over the network: ``s3://bucket/key`` and ``http(s)://host/path`` URLs.

:mod:`~h5stream.remote.config` turns a URL and the usual AWS settings into client settings (pure);
:mod:`~h5stream.remote.source` is the byte source the reader reads pixels and labels through;
:mod:`~h5stream.remote.fileobj` is the block-cached file object h5py reads the metadata through.
Importing this package is cheap: the client library (obstore, the ``[remote]`` extra) loads when a URL is opened.
"""

from __future__ import annotations

from h5stream.remote.config import RemoteOptions, is_url

__all__ = ["RemoteOptions", "is_url"]
