"""Keras' ``label_mode``: how a stream hands out the labels it reads.  Pure.

* ``"int"`` (default): labels as stored -- int64 class indices ``(n,)`` for a
  class store, float32 targets ``(n,)`` / ``(n, K)`` for a regression store.
* ``"categorical"``: one-hot float32 ``(n, n_classes)``, ``n_classes`` being
  the store's ``class_names``; for ``categorical_crossentropy``.
* ``"binary"``: float32 ``(n, 1)`` of 0.0 / 1.0, for stores of exactly two
  classes; for ``binary_crossentropy`` with one sigmoid output.
* ``None``: no labels; the stream yields the images alone (``x``, not
  ``(x, y)``), as Keras does with ``label_mode=None``: for ``model.predict``,
  or autoencoders.  Any store.

The last two need a class store with ``class_names``; a regression store's
targets only come as stored.  A store without labels (``label_kind`` ``"none"``)
takes only ``None``, which is its default (:data:`DEFAULT_LABEL_MODE`: ``"int"``
for a store with labels).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from h5stream.errors import ConfigError, StoreFormatError
from h5stream.store import schema
from h5stream.store.meta import StoreMeta

LABEL_MODES = ("int", "categorical", "binary", None)


class _DefaultLabelMode:
    """The ``label_mode`` nobody chose: ``"int"`` for a store with labels, None for one without.  Kept apart
    from ``"int"`` so that ``label_mode="int"`` asked of a store without labels is refused, not ignored."""

    def __repr__(self) -> str:
        return "'int' (None for a store without labels)"

    def __reduce__(self) -> str:
        return "DEFAULT_LABEL_MODE"  # the one instance, also in a spawned process


DEFAULT_LABEL_MODE = _DefaultLabelMode()


@dataclass(frozen=True)
class LabelEncoding:
    """Turns a batch of stored labels into what the stream yields; ``shape``/``dtype`` describe one row of it
    (both None for ``mode=None``: no labels are yielded)."""

    mode: str | None
    n_classes: int | None
    shape: tuple[int, ...] | None
    dtype: np.dtype | None
    path: str = ""

    @property
    def yields_labels(self) -> bool:
        """Whether a batch is ``(x, y)`` (True) or ``x`` alone (``label_mode=None``)."""
        return self.mode is not None

    @property
    def extra_row_bytes(self) -> int:
        """Bytes a yielded label row takes besides the stored one (0 when labels go out as stored, or not at all)."""
        if self.mode in ("int", None):
            return 0
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def batch(self, images: np.ndarray, labels: np.ndarray):
        """What the stream yields for one batch: ``(images, encoded labels)``, or ``images`` alone."""
        return (images, self(labels)) if self.mode is not None else images

    def __call__(self, labels: np.ndarray) -> np.ndarray:
        if self.mode in ("int", None):
            return labels
        if len(labels) and (labels.min() < 0 or labels.max() >= self.n_classes):
            bad = labels[(labels < 0) | (labels >= self.n_classes)][0]
            raise StoreFormatError(f"{self.path}: label {bad} is not a class index 0..{self.n_classes - 1} of the "
                                   f"store's class_names; label_mode={self.mode!r} cannot encode it "
                                   "(use label_mode='int')")
        if self.mode == "binary":
            return labels.astype(np.float32).reshape(-1, 1)
        out = np.zeros((len(labels), self.n_classes), np.float32)
        out[np.arange(len(labels)), labels] = 1.0
        return out


def label_encoding(meta: StoreMeta, mode) -> LabelEncoding:
    """Check ``mode`` against the store and describe its output; :class:`ConfigError` says what fits instead."""
    if mode is DEFAULT_LABEL_MODE:
        mode = None if meta.label_kind == schema.LABEL_NONE else "int"
    if mode not in LABEL_MODES:
        raise ConfigError(f"label_mode must be one of {', '.join(map(repr, LABEL_MODES))}, got {mode!r}")
    if mode is not None and meta.label_kind == schema.LABEL_NONE:
        raise ConfigError(f"{meta.path}: label_mode={mode!r} needs labels, and this store has none (it was "
                          "ingested with --labels none); leave label_mode out (or pass None): batches are the "
                          "images alone")
    if mode is None:
        return LabelEncoding(None, len(meta.class_names) if meta.class_names else None, None, None, meta.path)
    if mode == "int":
        return LabelEncoding(mode, len(meta.class_names) if meta.class_names else None, tuple(meta.label_shape),
                             np.dtype(meta.label_dtype), meta.path)
    if meta.label_kind != "class" or not np.issubdtype(meta.label_dtype, np.integer) or meta.label_shape:
        raise ConfigError(
            f"{meta.path}: label_mode={mode!r} needs class labels, and this store holds {meta.label_kind} targets "
            f"({np.dtype(meta.label_dtype).name}, shape {tuple(meta.label_shape)} per row); "
            "use label_mode='int', which yields them as stored"
        )
    if not meta.class_names:
        raise ConfigError(f"{meta.path}: label_mode={mode!r} needs the number of classes, and this store has no "
                          "class_names attribute; use label_mode='int' and encode the labels yourself")
    n = len(meta.class_names)
    if mode == "binary":
        if n != 2:
            raise ConfigError(f"{meta.path}: label_mode='binary' needs exactly 2 classes, and this store has {n} "
                              f"({', '.join(meta.class_names[:5])}{', ...' if n > 5 else ''}); "
                              "use label_mode='categorical' or 'int'")
        return LabelEncoding(mode, 2, (1,), np.dtype(np.float32), meta.path)
    return LabelEncoding(mode, n, (n,), np.dtype(np.float32), meta.path)
