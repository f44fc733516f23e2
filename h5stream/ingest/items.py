"""One item of a Python source as a store row: its pixels (:func:`to_pixels`) and its label (:class:`LabelCoder`).

What :func:`h5stream.write` accepts per item, and how it becomes a row exactly as ``h5stream ingest`` would make
it from a file:

* **image**: a numpy array (``H x W``, ``H x W x 1``, ``H x W x 3`` or ``H x W x 4``, uint8), a Pillow image (any
  mode), or the encoded bytes of an image file (JPEG, PNG, ...: decoded by
  :func:`~h5stream.ingest.decode.decode_bytes`, the ingest's own decoder).  Arrays and Pillow images go through
  the ingest's mode conversion (alpha composited on the background, ``channels=1`` as ITU-R 601 luma) and
  resize (:func:`~h5stream.ingest.decode.resize`); an array already of the store's shape is stored as it is.
* **label**: an int (a class index), a str (a class name), a float or a vector of floats (regression targets), or
  None (no label: a store without labels, ``/labels`` all :data:`~h5stream.store.schema.NO_LABEL`).

An item that cannot become a row raises :class:`~h5stream.ingest.decode.SkipFile` with a one-line reason: the
writer skips it and lists it in the skip report, as ingest does a bad file.  Pure but for the decoding; used by
the writer's one thread.
"""

from __future__ import annotations

import json
import numbers

import numpy as np

from h5stream.errors import ConfigError
from h5stream.ingest.decode import SkipFile, decode_bytes, resize, to_rgb_or_l
from h5stream.ingest.spec import DecodeSpec
from h5stream.store import schema

_ENCODED = (bytes, bytearray, memoryview)


def _is_pil(image) -> bool:
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow is a core dependency
        return False
    return isinstance(image, Image.Image)


def natural_shape(image) -> tuple[int, int, int]:
    """``(height, width, channels)`` a store made from this first image would have when the caller names no size
    or channels (pure but for reading an encoded image's header): its own size, 1 channel for grayscale, else 3.
    SkipFile when it is not an image."""
    if isinstance(image, _ENCODED):
        import io

        from PIL import Image

        try:
            with Image.open(io.BytesIO(bytes(image))) as im:
                w, h = im.size
                mode = im.mode
        except Exception as exc:
            raise SkipFile(f"not an image Pillow can read ({type(exc).__name__})") from None
        return h, w, 1 if mode in ("1", "L", "I", "F") or mode.startswith("I;16") else 3
    if _is_pil(image):
        w, h = image.size
        return h, w, 1 if image.mode in ("1", "L", "I", "F") or image.mode.startswith("I;16") else 3
    arr = _as_array(image)
    return arr.shape[0], arr.shape[1], 1 if arr.ndim == 2 or arr.shape[2] == 1 else 3


def _as_array(image) -> np.ndarray:
    """``image`` as a uint8 ``H x W`` or ``H x W x C`` (C in 1, 3, 4) array, or SkipFile saying what it is."""
    if image is None:
        raise SkipFile("no image (None)")
    try:
        arr = np.asarray(image)
    except Exception as exc:
        raise SkipFile(f"not an image: {type(image).__name__} ({exc})") from None
    if arr.dtype == object or arr.dtype.kind not in "uifb":
        raise SkipFile(f"not an image: {type(image).__name__}; give a uint8 array, a PIL image or encoded bytes")
    if arr.ndim == 3 and arr.shape[0] in (1, 3) and arr.shape[2] not in (1, 3, 4):
        raise SkipFile(f"image array of shape {arr.shape} looks channels-first (C x H x W, a torch tensor?); give "
                       "H x W x C: drop the ToTensor transform, or .permute(1, 2, 0)")
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] not in (1, 3, 4)):
        raise SkipFile(f"image array of shape {arr.shape}; give H x W or H x W x C with C = 1, 3 or 4")
    if arr.dtype != np.uint8:
        raise SkipFile(f"image array of dtype {arr.dtype}; give uint8 pixels (0-255; floats in [0, 1]: multiply "
                       "by 255 and convert)")
    if min(arr.shape[:2]) < 1:
        raise SkipFile(f"empty image ({arr.shape[1]}x{arr.shape[0]})")
    return arr


def to_pixels(image, spec: DecodeSpec) -> np.ndarray:
    """``image`` as a ``spec.shape`` uint8 row, or SkipFile with the reason (see the module docstring)."""
    if isinstance(image, _ENCODED):
        return decode_bytes(bytes(image), spec)
    if _is_pil(image):
        w, h = image.size
        if w * h > spec.max_pixels:
            raise SkipFile(f"too large: {w}x{h} = {w * h} pixels > limit {spec.max_pixels}")
        try:
            arr = np.asarray(to_rgb_or_l(image, spec.channels, spec.background), dtype=np.uint8)
        except Exception as exc:
            raise SkipFile(f"PIL image that cannot be converted: {type(exc).__name__}: {exc}") from None
    else:
        arr = _as_array(image)
        if arr.ndim == 2:
            arr = arr[:, :, None]
        if arr.shape == spec.shape:
            return arr
        if arr.shape[2] != spec.channels:  # grey to RGB, RGB to luma, alpha composited: as ingest converts
            from PIL import Image

            arr = np.asarray(to_rgb_or_l(Image.fromarray(arr if arr.shape[2] != 1 else arr[:, :, 0]),
                                         spec.channels, spec.background), dtype=np.uint8)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    out = resize(np.ascontiguousarray(arr), spec.size, spec.resize, spec.pad_fill)
    if out.shape != spec.shape:  # a bug, not a bad item; still never a wrong row
        raise SkipFile(f"converted to {out.shape}, expected {spec.shape}")
    return out


def label_kind_of(label) -> str:
    """The store's label kind a first label asks for (pure): class (int, str), regression (floats) or none."""
    if label is None:
        return schema.LABEL_NONE
    if isinstance(label, str):
        return schema.LABEL_CLASS
    arr = np.asarray(label)
    if arr.ndim == 0 and arr.dtype.kind in "iu":
        return schema.LABEL_CLASS
    if arr.dtype.kind == "U" and arr.ndim == 0:
        return schema.LABEL_CLASS
    if arr.dtype.kind in "fiu" and arr.ndim <= 1:
        return schema.LABEL_REGRESSION
    raise SkipFile(f"label {label!r} is neither an int, a class name, a float, a vector of floats nor None")


MAX_CLASSES = 1 << 20
"""Most classes a store gets from class indices alone (names "0", "1", ...): an index past it is an ID or a
number, not a class, and its names would take memory and file space for every index below it."""


class LabelCoder:
    """Turns each item's label into what the store holds (class index, float targets or NO_LABEL) and keeps the
    class list, which grows with new names (or, without ``classes``, up to the largest index seen: names "0",
    "1", ...).  ``kind`` and ``shape`` are fixed by the first label (or the caller).  Used by the writer's thread."""

    def __init__(self, kind: str, classes=None, shape: tuple[int, ...] = (), fixed_classes: bool = False):
        if kind not in schema.LABEL_KINDS:
            raise ConfigError(f"label_kind must be one of {', '.join(schema.LABEL_KINDS)}, got {kind!r}")
        self.kind = kind
        self.class_names: list[str] = [str(c) for c in classes] if classes is not None else []
        self._index = {name: i for i, name in enumerate(self.class_names)}
        self.fixed = fixed_classes  # classes given by the caller: a name or index outside them is skipped
        self.shape = tuple(shape)
        self._names_bytes = len(json.dumps(self.class_names).encode("utf-8"))  # the class_names attribute's

    def _make_room(self, names: list[str], what: str) -> None:
        """Count ``names`` into the class_names attribute, or SkipFile (``what``: the label) where they would take
        more than the one attribute a store keeps them in holds (:data:`~h5stream.store.create.CLASS_NAMES_BYTES`)."""
        from h5stream.store.create import CLASS_NAMES_BYTES

        total = self._names_bytes
        for name in names:
            total += len(json.dumps(name).encode("utf-8")) + 2  # the name and its ", "
            if total > CLASS_NAMES_BYTES:
                raise SkipFile(f"{what} would make {len(self.class_names) + len(names):,} classes, whose names take "
                               f"more than the {CLASS_NAMES_BYTES:,} bytes a store keeps them in; use fewer classes "
                               "(or shorter names), or map IDs to 0..N-1")
        self._names_bytes = total

    @property
    def dtype(self):
        return {schema.LABEL_CLASS: np.int64, schema.LABEL_REGRESSION: np.float32}.get(self.kind, np.int8)

    def encode(self, label):
        """The stored value of ``label``, or SkipFile with why it does not fit this store."""
        if self.kind == schema.LABEL_NONE:
            if label is not None:
                raise SkipFile(f"label {label!r} in a store without labels (its first item had none)")
            return schema.NO_LABEL
        if label is None:
            raise SkipFile(f"no label, in a store of {self.kind} labels")
        if self.kind == schema.LABEL_CLASS:
            return self._class_index(label)
        try:
            with np.errstate(over="ignore"):  # past float32: said below, not warned about
                arr = np.asarray(label, dtype=np.float32)
        except (TypeError, ValueError):
            raise SkipFile(f"label {label!r} is not a number or a vector of numbers") from None
        if arr.shape != self.shape:
            raise SkipFile(f"label of shape {arr.shape}, the store's labels have shape {self.shape}")
        if not np.all(np.isfinite(arr)):
            shown = label.item() if isinstance(label, np.generic) else label  # 1e+39, not np.float64(1e+39)
            if np.all(np.isfinite(np.asarray(label, dtype=np.float64))):
                raise SkipFile(f"label {shown!r} is beyond the float32 range labels are stored in (largest "
                               f"{float(np.finfo(np.float32).max):.6g}); rescale it")
            raise SkipFile(f"label {shown!r} is not finite")
        return arr

    def _class_index(self, label) -> int:
        if isinstance(label, (str, np.str_)):
            name = str(label)
            if name not in self._index:
                if self.fixed:
                    raise SkipFile(f"class {name!r} is not one of the classes given ({', '.join(self.class_names)})")
                self._make_room([name], f"class {name!r}")
                self._index[name] = len(self.class_names)
                self.class_names.append(name)
            return self._index[name]
        if isinstance(label, bool) or not isinstance(label, (numbers.Integral, np.integer, np.ndarray)):
            raise SkipFile(f"label {label!r} is not a class index (int) or a class name (str)")
        arr = np.asarray(label)
        if arr.ndim != 0 or arr.dtype.kind not in "iu":
            raise SkipFile(f"label {label!r} is not a class index (int) or a class name (str)")
        index = int(arr)
        if index < 0:
            raise SkipFile(f"class index {index} is negative (an item without a label has label None)")
        if index >= len(self.class_names):
            if self.fixed:
                raise SkipFile(f"class index {index} is out of range for the {len(self.class_names)} classes given")
            if index >= MAX_CLASSES:
                raise SkipFile(f"class index {index} would make {index + 1:,} classes (more than {MAX_CLASSES:,}); "
                               "an ID or a number is no class index: give float labels for a numeric target, or "
                               "map the IDs to 0..N-1")
            self._make_room([str(k) for k in range(len(self.class_names), index + 1)], f"class index {index}")
            while len(self.class_names) <= index:  # names for the indices up to this one, as keras.datasets has
                name = str(len(self.class_names))
                self._index.setdefault(name, len(self.class_names))
                self.class_names.append(name)
        return index


def encode_all(coder: LabelCoder, labels, n: int):
    """``labels`` (an array of ``n``, or None) as the store holds them, vectorised; None where some label needs
    the per-item path (a skip, a new class name, a kind that does not fit)."""
    if coder.kind == schema.LABEL_NONE:
        return np.full(n, schema.NO_LABEL, np.int8) if labels is None else None
    if labels is None:
        return None
    labels = np.asarray(labels)
    if coder.kind == schema.LABEL_CLASS:
        if labels.dtype.kind not in "iu" or labels.shape != (n,) or not n:
            return None
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or (high >= len(coder.class_names) and (coder.fixed or high >= MAX_CLASSES)):
            return None  # a bad index, skipped (and listed) on the per-item path
        if high >= len(coder.class_names):
            try:
                coder.encode(np.int64(high))  # names "0" .. str(high), as the per-item path gives them item by item
            except SkipFile:  # more names than a store keeps: skipped (and listed) on the per-item path
                return None
        return labels.astype(np.int64)
    if labels.dtype.kind not in "fiu" or labels.shape[1:] != coder.shape:
        return None
    with np.errstate(over="ignore"):  # a label past float32 takes the per-item path, which says so
        out = labels.astype(np.float32)
    return out if np.all(np.isfinite(out)) else None
