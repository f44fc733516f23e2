"""The Python sources :func:`h5stream.write` takes, as one shape: items ``(image, label)`` in storage order, from a
position on.

* **arrays**: a tuple ``(images, labels)`` of numpy arrays (``keras.datasets``' ``(x_train, y_train)``), or
  ``images`` alone (no labels).  Rows are taken by index, in blocks (:meth:`ArraySource.block`), so whole blocks
  of images already of the store's shape are stored without a per-row step.
* **map-style**: anything with ``__len__`` and ``__getitem__`` (a torch / torchvision ``Dataset``, a Hugging Face
  ``datasets.Dataset``, a list), item ``i`` being ``source[i]``.
* **iterable**: anything else that can be iterated (a generator, a ``tf.data`` / tfds iterator of numpy items, an
  ``IterableDataset``): items in the order it gives them; it has no length, so it cannot be stored shuffled.

An item is ``(image, label)`` (a tuple or list of two), a dict with ``"image"`` and ``"label"`` keys (Hugging
Face style; ``"img"`` is taken for ``"image"``), or a bare image (no label).  Sources with a length are stored
in the order :func:`~h5stream.ingest.pack.storage_permutation` gives (shuffled by a seed, or sorted: index
order); position ``k`` is the ``k``-th item of that order, so a continued write starts at the position the store
recorded (:mod:`h5stream.ingest.pywrite`) without touching the items before it -- an iterable is advanced past
them instead (its items before that position are produced again, and dropped undecoded).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import numpy as np

from h5stream.errors import ConfigError


def split_item(item) -> tuple[object, object]:
    """``(image, label)`` of one item as the module docstring lists them (pure)."""
    if isinstance(item, tuple | list) and len(item) == 2:
        return item[0], item[1]
    if isinstance(item, tuple | list) and len(item) == 1:
        return item[0], None
    if isinstance(item, dict):
        image = item.get("image", item.get("img"))
        return image, item.get("label")
    return item, None


class ArraySource:
    """``(images, labels)`` arrays (or images alone), read by index in the storage order ``order``."""

    def __init__(self, images, labels=None):
        if not hasattr(images, "shape") or len(images.shape) not in (3, 4):
            raise ConfigError(f"images must be an array of N x H x W or N x H x W x C pixels, got "
                              f"{getattr(images, 'shape', type(images).__name__)}")
        if np.dtype(images.dtype) != np.uint8:
            raise ConfigError(f"images must be uint8 pixels (0-255), got dtype {images.dtype}; convert them with "
                              "np.clip(x, 0, 255).astype(np.uint8) (floats in [0, 1]: multiply by 255 first)")
        if labels is not None:
            labels = np.asarray(labels)
            if len(labels) != len(images):
                raise ConfigError(f"{len(images)} images but {len(labels)} labels; give one label per image")
            if labels.ndim == 2 and labels.shape[1] == 1 and labels.dtype.kind in "iu":
                labels = labels[:, 0]  # CIFAR's (N, 1) class indices
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.images)

    def item(self, index: int):
        label = None if self.labels is None else self.labels[index]
        if isinstance(label, np.ndarray) and label.ndim == 0:
            label = label[()]
        return self.images[index], label

    def block(self, indices: np.ndarray):
        """The images (one array, copied once by fancy indexing, or a view for a run of indices) and labels of
        ``indices``."""
        start = int(indices[0])
        if len(indices) > 1 and np.array_equal(indices, np.arange(start, start + len(indices))):
            sel = slice(start, start + len(indices))
        else:
            sel = indices
        images = np.asarray(self.images[sel])
        labels = None if self.labels is None else np.asarray(self.labels[sel])
        return images, labels


class MapSource:
    """A map-style dataset: ``len(ds)`` items, item ``i`` is ``ds[i]``."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def item(self, index: int):
        return split_item(self.dataset[int(index)])


def classify(source) -> ArraySource | MapSource | Iterable:
    """Which kind of source ``source`` is (see the module docstring); ConfigError for something that is none."""
    if isinstance(source, tuple) and len(source) == 2 and len(getattr(source[0], "shape", ())) >= 3:
        return ArraySource(*source)  # (x_train, y_train)
    if isinstance(source, np.ndarray):
        return ArraySource(source)
    if isinstance(source, str | bytes):
        raise ConfigError(f"source {source!r:.60} is a string; give arrays, a dataset or an iterable of "
                          "(image, label) items (a folder of files: `h5stream ingest`)")
    if hasattr(source, "__len__") and hasattr(source, "__getitem__"):
        return MapSource(source)
    if isinstance(source, Iterable):
        return source
    raise ConfigError(f"source of type {type(source).__name__} is neither arrays, a dataset (__len__ and "
                      "__getitem__) nor an iterable of (image, label) items")


def items_from(source, order: np.ndarray | None, start: int) -> Iterator[tuple[int, object, object]]:
    """``(source index, image, label)`` of the items at storage positions ``start``, ``start + 1``, ... of a
    sized source (``order``: the storage permutation) or of an iterable (``order`` None: its own order, the
    first ``start`` items skipped undecoded)."""
    if order is None:
        for index, item in enumerate(itertools.islice(iter(source), start, None), start):
            image, label = split_item(item)
            yield index, image, label
        return
    for pos in range(start, len(order)):
        index = int(order[pos])
        image, label = source.item(index)
        yield index, image, label
