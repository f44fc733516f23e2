"""Measuring a stream on this machine: what ``h5stream bench`` runs, and what the benchmarks (``benchmarks/``, in
a clone) build on.

``h5stream bench`` is a command of the installed package, so the measuring core it needs is here, not in
``benchmarks/`` (which is not installed): the resource sampler and its monitor process, page-cache eviction for
``--cold``, and the passes it times.  Nothing of the streaming core imports this package.

* :mod:`h5stream.measure.sampler` -- :class:`ResourceSampler` (memory of the process tree, CPU per thread and
  child, from a monitor process: :mod:`h5stream.measure.monitor`), :class:`Timeline`, the RSS high-water mark;
* :mod:`h5stream.measure.cold` -- :func:`evict_from_page_cache`, :func:`cached_fraction`,
  :class:`PeriodicEvictor` (a file kept cold, as one larger than RAM);
* :mod:`h5stream.measure.passes` -- the passes of ``h5stream bench``: the stream and the plain-h5py baselines.
"""

from h5stream.measure.cold import PeriodicEvictor, cached_fraction, cached_pages, evict_from_page_cache, evict_pages
from h5stream.measure.sampler import CONSUMER, READER_THREAD, ResourceSampler, Timeline, peak_rss_bytes, reset_peak_rss

__all__ = [
    "CONSUMER",
    "READER_THREAD",
    "PeriodicEvictor",
    "ResourceSampler",
    "Timeline",
    "cached_fraction",
    "cached_pages",
    "evict_from_page_cache",
    "evict_pages",
    "peak_rss_bytes",
    "reset_peak_rss",
]
