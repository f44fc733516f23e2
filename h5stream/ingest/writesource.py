"""``h5stream.write(path, source)``: a whole Python source (arrays, a map-style dataset, an iterable) through one
:class:`~h5stream.ingest.pywrite.Writer`, in storage order, continued from the position the store recorded when
``resume=True`` (see :mod:`h5stream.ingest.pywrite`).  Run in the calling thread.
"""

from __future__ import annotations

import numpy as np

from h5stream.errors import ConfigError
from h5stream.ingest.pywrite import Writer, WriteResult

__all__ = ["write"]


def write(path, source, *, resume: bool = False, **options) -> WriteResult:
    """Write a whole Python source to the store ``path``; the shape of FFCV's ``DatasetWriter.from_indexed_dataset``
    and LitData's ``optimize``: one call over a dataset.

    Args:
        path: the ``.h5`` store to write.
        source: ``(images, labels)`` numpy arrays (``keras.datasets`` style) or ``images`` alone, a map-style
            dataset (``__len__`` and ``__getitem__``: a torch / torchvision ``Dataset``), or any iterable of items
            (a generator); an item is ``(image, label)``, ``{"image": ..., "label": ...}`` or a bare image (see
            :mod:`h5stream.ingest.sources` and :mod:`h5stream.ingest.items`).
        resume: continue the store an interrupted write of the same source left (:mod:`h5stream.ingest.pywrite`
            says how it knows where it stopped); the items it consumed are not read again (an iterable is
            advanced past them).
        **options: as ``h5stream ingest`` takes them (:mod:`~h5stream.ingest.writeoptions`): ``size`` (int or
            (height, width); default the first image's), ``resize`` (stretch, crop, pad), ``channels`` (1 or 3),
            ``pad_fill``, ``classes`` (class names, in index order: int labels index them, str labels name them,
            others are skipped), ``label_kind``, ``order`` (``"shuffled"``, the default for a source with a length,
            or ``"sorted"``: the source's order; an iterable is stored in its order), ``seed``, ``block_rows``,
            ``compression``, ``encoding`` (``"raw"``, ``"jpeg"`` or ``"auto"``) and ``quality`` (JPEG, default 90),
            ``row_digests`` (default True: a digest per row, what reads are checked against; False: by whole
            blocks only, 8 bytes a row less), ``overwrite``, ``strict`` (stop at the first item that cannot
            become a row, the rows before it kept), ``commit_rows`` (rows between commits, default 1024; from
            arrays whose rows already have the store's shape, by default also at least 32 MiB of them: such rows
            cost no decoding to write again, and a commit costs two ``fsync``).

    Returns:
        A :class:`WriteResult`.

    An exception raised by the source itself (a ``__getitem__`` that fails, a generator that raises) stops the
    write and is raised as it is, after the items added before it are committed: the store reads as unfinished,
    and ``resume=True`` continues at that item.

    Raises:
        ConfigError: a source that is none of these, an unknown option or a bad value, an iterable asked to be
            stored shuffled, a resume that does not fit the store (other options, another source length).
        SourceError: no item became a row (no store is created); with ``strict``, the first bad item.
        StoreExistsError: ``path`` exists and neither ``overwrite`` nor ``resume`` is given.
        StoreBusyError: another writer holds ``path``.
        StoreWriteError: a write failed (a full disk): the store is as its last commit; ``resume=True`` continues.
    """
    from h5stream.ingest.pack import storage_permutation
    from h5stream.ingest.sources import ArraySource, classify, items_from

    src = classify(source)
    sized = isinstance(src, ArraySource) or hasattr(src, "item")
    if not sized and options.get("order") == "shuffled":
        raise ConfigError(f"an iterable ({type(source).__name__}) has no length, so it is stored in its own order; "
                          "drop order='shuffled', or give a map-style dataset (__len__ and __getitem__) or arrays")
    total = len(src) if sized else None
    with Writer(path, resume=resume, total=total, _order="shuffled" if sized else "sorted", **options) as w:
        order = storage_permutation(total, w.opts.order, w.opts.seed) if sized else None
        if isinstance(src, ArraySource):
            _write_arrays(w, src, order)
        else:
            for index, image, label in items_from(src, order, w.consumed):
                w.add(image, label, index=index)
    return w.close()


def _write_arrays(w: Writer, src, order: np.ndarray) -> None:
    """Arrays in blocks: a first item alone (it makes the store), then runs that end on block boundaries, appended
    whole where their images already have the store's shape and every label fits (:meth:`Writer.add_rows`)."""
    pos, n = w.consumed, len(order)
    while pos < n and not w.created:
        index = int(order[pos])
        w.add(*src.item(index), index=index)
        pos += 1
    if pos >= n:
        return
    block_rows = w.block_rows
    want = w.row_shape
    while pos < n:
        k = min(n - pos, block_rows - w.rows % block_rows)
        indices = order[pos:pos + k]
        images, labels = src.block(indices)
        if images.ndim == 3:
            images = images[..., None]
        if images.shape[1:] == want:
            w.add_rows(images, labels, indices)
        else:
            for j, index in enumerate(indices):
                w.add(images[j], None if labels is None else labels[j], index=int(index))
        pos += k
