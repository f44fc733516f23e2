"""ImageDataGenerator's random transforms, fast: one affine warp per image, colour ops in uint8.

:class:`Augment` takes Keras ``ImageDataGenerator``'s parameters (same names,
units and meaning) and maps a uint8 batch ``(n, H, W, C)`` to an augmented
batch.  Per sample it draws its parameters from :mod:`h5stream.augment.rng`
keyed by ``(seed, epoch, row_id)`` only, composes rotation, shift, shear, zoom
and both flips into ONE inverse affine matrix, warps once with OpenCV
(``cv2.warpAffine``, one thread), applies channel shift and brightness in
uint8, then (only when asked) casts to float and applies
``preprocessing_function``, ``rescale``, samplewise and featurewise
normalisation -- Keras' order of operations.

Differences from Keras, all deliberate:

* ``width_shift_range`` shifts horizontally and ``height_shift_range``
  vertically, as Keras documents.  Keras' legacy code swaps them
  (keras-team/keras#17398); on square images the distributions are identical.
* Rotation, shear and zoom turn about the true image centre ``((W-1)/2, (H-1)/2)``;
  Keras uses ``(H-1)/2`` for the column centre, which differs only when H != W.
* Pixels are rounded to uint8 after the warp and colour ops (Keras keeps the
  float result of the interpolation): outputs differ by at most interpolation
  rounding, and the geometric stage can run in uint8 at SIMD speed.
* ``cval`` must lie in [0, 255] (the warp runs on uint8 pixels).
* Featurewise statistics come from the store (:func:`h5stream.augment.stats.compute_feature_stats`)
  and must be attached with :meth:`Augment.with_feature_stats`; using featurewise
  normalisation without them raises instead of Keras' warning.

The parameters are checked, and the shifts drawn, in Keras' forms by
:mod:`h5stream.augment.params`; the uint8 colour ops and the batched warp of
the common case live in :mod:`h5stream.augment.pixels`, the warp in
:mod:`h5stream.augment.warp`.

Everything here is pure and thread-safe except that :meth:`Augment.__call__`
sets OpenCV's global thread count to 1 for its duration (restored after), so
that one worker process uses one core.
"""

from __future__ import annotations

import copy
import math
import pickle
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from h5stream._kwargs import AUGMENT_HINTS, checked_kwargs
from h5stream.augment import crop as crops
from h5stream.augment import params, pixels, rng
from h5stream.augment.warp import _check_fill_mode, _cv2, _plan_scratch, _warp_into, affine_matrices
from h5stream.errors import ConfigError

PRESETS = MappingProxyType(
    {
        # The parameters of the multiprocess ImageDataGenerator article the benchmarks compare with.
        "standard": MappingProxyType(
            dict(
                rotation_range=45.0,
                width_shift_range=0.1,
                height_shift_range=0.1,
                zoom_range=(0.8, 1.0),
                channel_shift_range=20.0,
                horizontal_flip=True,
                fill_mode="nearest",
            )
        ),
    }
)

_EPS = 1e-6  # Keras' guard in std normalisation


# --------------------------------------------------------------------------- Augment


@dataclass(frozen=True, init=False)
class Augment:
    """Random augmentation with ``ImageDataGenerator``'s parameters; immutable and picklable.

    Give it to ``h5stream.open(..., augment=Augment(...), workers=N)``, or call it on a uint8 batch
    ``(n, H, W, C)`` with ``seed``, ``epoch`` and the rows' global ids (:meth:`__call__`).  A row's output
    depends only on its pixels, ``(seed, epoch, row_id)`` and these parameters, never on the rest of the batch.
    Instances are cheap to copy and safe to share between threads.

    Args (Keras' names and meanings; each off by default):
        rotation_range: degrees, a rotation drawn from ``[-r, r]``.
        width_shift_range, height_shift_range: a float < 1 (a fraction of the width / height), a float >= 1 or
            an int (pixels; an int draws whole pixels), or a list of choices.
        shear_range: degrees, drawn from ``[-s, s]``.
        zoom_range: a float ``z`` (factors from ``[1 - z, 1 + z]``) or a pair ``[lower, upper]``, ``0 < lower``.
        channel_shift_range: a shift drawn from ``[-c, c]`` in pixel units, one per image, added to every channel.
        brightness_range: None or a pair ``[lower, upper]`` of brightness factors.
        horizontal_flip, vertical_flip: flip half of the rows.
        fill_mode: how points outside the image are filled, one of ``FILL_MODES`` (``"nearest"`` by default);
            ``cval``: the value for ``"constant"`` (0-255).
        preprocessing_function: ``image -> image`` of the same shape, per row, on float32 pixels after the
            random transforms (as Keras' ``standardize`` runs it, before ``rescale``); a module-level function to
            reach worker processes (which are spawned).
        rescale: a factor multiplied in after ``preprocessing_function`` (outputs become float); None or 0: none.
        featurewise_center, featurewise_std_normalization: per-channel mean / std of the store, computed by
            ``h5stream.open`` (or attached with :meth:`with_feature_stats`); std normalisation implies centring.
        samplewise_center, samplewise_std_normalization: each image's own mean / std.
        dtype: the output dtype, one of uint8, float16, float32, float64; None: uint8 when nothing produces
            floats, else float32 (:meth:`output_dtype`).
        output_size: None (the output is the stored size, Keras' semantics), or ``(height, width)`` (or one int):
            each image is first cropped and resized to it (torchvision's semantics, :mod:`h5stream.augment.crop`),
            then the options above run at that size.
        crop: with ``output_size``, ``"random_resized"`` (the default; torchvision's ``RandomResizedCrop`` with
            ``scale``, a pair of area fractions in (0, 1], default (0.08, 1.0), and ``ratio``, a pair of width /
            height ratios, default (3/4, 4/3)) or ``"center"`` (``Resize(resize)`` + ``CenterCrop(output_size)``;
            ``resize``, the short side before the crop, defaults to ``round(max(output_size) * 256 / 224)``).

    Raises:
        ConfigError: a value of the wrong type or out of range, an unknown ``fill_mode`` or ``dtype``, a
            ``preprocessing_function`` that is not callable, or ``dtype=uint8`` with an option that produces
            floats; the message names the parameter and what it takes.
    """

    rotation_range: float
    width_shift_range: object
    height_shift_range: object
    shear_range: float
    zoom_range: tuple
    channel_shift_range: float
    brightness_range: tuple | None
    horizontal_flip: bool
    vertical_flip: bool
    fill_mode: str
    cval: float
    rescale: float | None
    preprocessing_function: object
    featurewise_center: bool
    featurewise_std_normalization: bool
    samplewise_center: bool
    samplewise_std_normalization: bool
    dtype: np.dtype | None
    feature_mean: tuple | None
    feature_std: tuple | None
    output_size: tuple | None = None
    crop: str | None = None
    scale: tuple | None = None
    ratio: tuple | None = None
    resize: int | None = None

    def __init__(
        self,
        rotation_range=0.0,
        width_shift_range=0.0,
        height_shift_range=0.0,
        shear_range=0.0,
        zoom_range=0.0,
        channel_shift_range=0.0,
        brightness_range=None,
        horizontal_flip=False,
        vertical_flip=False,
        fill_mode="nearest",
        cval=0.0,
        rescale=None,
        preprocessing_function=None,
        featurewise_center=False,
        featurewise_std_normalization=False,
        samplewise_center=False,
        samplewise_std_normalization=False,
        dtype=None,
        output_size=None,
        crop=None,
        scale=None,
        ratio=None,
        resize=None,
    ):
        _check_fill_mode(fill_mode)
        output_size, crop, scale, ratio, resize = crops.check_crop_options(output_size, crop, scale, ratio, resize)
        if preprocessing_function is not None and not callable(preprocessing_function):
            raise ConfigError(f"Augment: preprocessing_function={preprocessing_function!r} is not callable")
        if rescale is not None:
            rescale = float(params.number("rescale", rescale, low=-math.inf)) or None  # Keras: a falsy rescale is off
        dtype = params.dtype_spec(dtype)
        featurewise_std_normalization = params.flag("featurewise_std_normalization", featurewise_std_normalization)
        samplewise_std_normalization = params.flag("samplewise_std_normalization", samplewise_std_normalization)
        values = dict(
            rotation_range=float(params.number("rotation_range", rotation_range)),
            width_shift_range=params.shift_spec("width_shift_range", width_shift_range),
            height_shift_range=params.shift_spec("height_shift_range", height_shift_range),
            shear_range=float(params.number("shear_range", shear_range)),
            zoom_range=params.zoom_spec(zoom_range),
            channel_shift_range=float(params.number("channel_shift_range", channel_shift_range)),
            brightness_range=params.brightness_spec(brightness_range),
            horizontal_flip=params.flag("horizontal_flip", horizontal_flip),
            vertical_flip=params.flag("vertical_flip", vertical_flip),
            fill_mode=fill_mode,
            cval=float(params.number("cval", cval, high=255.0)),
            rescale=rescale,
            preprocessing_function=preprocessing_function,
            # Keras: std normalisation implies centring.
            featurewise_center=params.flag("featurewise_center", featurewise_center) or featurewise_std_normalization,
            featurewise_std_normalization=featurewise_std_normalization,
            samplewise_center=params.flag("samplewise_center", samplewise_center) or samplewise_std_normalization,
            samplewise_std_normalization=samplewise_std_normalization,
            dtype=dtype,
            feature_mean=None,
            feature_std=None,
            output_size=output_size,
            crop=crop,
            scale=scale if crop == "random_resized" else None,
            ratio=ratio if crop == "random_resized" else None,
            resize=resize,
        )
        for name, value in values.items():
            object.__setattr__(self, name, value)
        if dtype is not None and dtype == np.uint8 and self._needs_float():
            raise ConfigError(
                "Augment: dtype=uint8 but rescale / preprocessing_function / samplewise_* / featurewise_* "
                "produce floats; drop dtype or ask for float32"
            )

    # -- construction helpers

    @classmethod
    def preset(cls, name: str, **overrides) -> Augment:
        """The preset ``name`` of :data:`PRESETS` (``"standard"``), ``overrides`` replacing some; else ConfigError."""
        if name not in PRESETS:
            raise ConfigError(f"Augment.preset: unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}")
        return cls(**{**PRESETS[name], **overrides})

    def with_feature_stats(self, mean, std) -> Augment:
        """A copy carrying per-channel featurewise ``mean`` and ``std`` in raw pixel units (0..255).

        Like Keras' ``fit``, they are scaled by ``rescale`` when applied.
        """
        mean = np.asarray(mean, dtype=np.float64).reshape(-1)
        std = np.asarray(std, dtype=np.float64).reshape(-1)
        if mean.shape != std.shape or mean.size == 0 or not (np.all(np.isfinite(mean)) and np.all(np.isfinite(std))):
            raise ConfigError(f"Augment.with_feature_stats: mean {mean} and std {std} must be finite, "
                              "one value per channel")
        if np.any(std < 0):
            raise ConfigError(f"Augment.with_feature_stats: std {std} must be >= 0")
        new = copy.copy(self)
        object.__setattr__(new, "feature_mean", tuple(float(v) for v in mean))
        object.__setattr__(new, "feature_std", tuple(float(v) for v in std))
        return new

    def evaluation(self) -> Augment:
        """The counterpart for evaluation of an Augment with a random resized crop (torchvision's training
        transform): ``Resize`` + ``CenterCrop`` to the same ``output_size``, no random transform, the same
        ``rescale``, ``preprocessing_function``, normalisations (feature statistics included) and ``dtype``.  Any
        other Augment is its own (Keras' ``ImageDataGenerator`` augments its validation subset too).  What
        ``open(subset="both")`` gives the validation stream."""
        if self.output_size is None or self.crop != "random_resized":
            return self
        out = Augment(rescale=self.rescale, preprocessing_function=self.preprocessing_function,
                      featurewise_center=self.featurewise_center,
                      featurewise_std_normalization=self.featurewise_std_normalization,
                      samplewise_center=self.samplewise_center,
                      samplewise_std_normalization=self.samplewise_std_normalization,
                      dtype=self.dtype, output_size=self.output_size, crop="center")
        return out if self.feature_mean is None else out.with_feature_stats(self.feature_mean, self.feature_std)

    def ensure_picklable(self) -> None:
        """Raise ConfigError unless this Augment can be sent to a spawn-started worker."""
        try:
            pickle.dumps(self)
        except Exception as exc:  # pickle raises several types (PicklingError, AttributeError, TypeError)
            raise ConfigError(
                f"Augment is not picklable ({exc}); workers need preprocessing_function to be a module-level "
                "function (not a lambda or closure), or use workers=0"
            ) from exc

    # -- introspection

    @property
    def needs_feature_stats(self) -> bool:
        """True when featurewise_* is set and no statistics are attached yet (see :meth:`with_feature_stats`)."""
        return (self.featurewise_center or self.featurewise_std_normalization) and self.feature_mean is None

    def _needs_float(self) -> bool:
        return bool(
            self.rescale is not None
            or self.preprocessing_function is not None
            or self.samplewise_center
            or self.featurewise_center
        )

    def _has_geometry(self) -> bool:
        return bool(
            self.rotation_range
            or self.width_shift_range
            or self.height_shift_range
            or self.shear_range
            or self.zoom_range != (1.0, 1.0)
        )

    def output_shape(self, image_shape) -> tuple[int, ...]:
        """The shape of one output image for stored images of ``image_shape`` ``(H, W, C)``: ``output_size`` with
        the stored channels, or the stored shape when ``output_size`` is None."""
        image_shape = tuple(int(d) for d in image_shape)
        if self.output_size is None:
            return image_shape
        if self.crop == "center":
            crops.center_geometry(image_shape[0], image_shape[1], self.output_size, self.resize)  # raises if too small
        return (*self.output_size, *image_shape[2:])

    def output_dtype(self) -> np.dtype:
        """uint8 when nothing produces floats, else float32 -- or the ``dtype`` asked for."""
        if self.dtype is not None:
            return self.dtype
        return np.dtype(np.float32) if self._needs_float() else np.dtype(np.uint8)

    # -- the transform

    def draw(self, seed: int, epoch: int, row_ids, height: int, width: int) -> dict:
        """Per-sample parameters as Keras names them (``theta``, ``tx``, ``ty``, ...), arrays of len(row_ids),
        for images of ``height`` x ``width``: a pure function of ``(seed, epoch, row_ids)``, as in :meth:`__call__`.

        ``tx`` is the horizontal shift in pixels, ``ty`` the vertical one;
        ``channel_shift_intensity`` / ``brightness`` are None when disabled.
        """
        keys = rng.sample_keys(seed, epoch, row_ids)
        n = keys.shape[0]
        draws = rng.Draws(keys, rng.ALL_STREAMS)  # one hash for every parameter: the same bits as one per stream
        zeros = np.zeros(n)
        p = {}
        r = self.rotation_range
        p["theta"] = draws.uniform(rng.STREAM_THETA, -r, r) if r else zeros
        p["tx"] = (
            params.draw_shift(self.width_shift_range, draws, rng.STREAM_SHIFT_X, rng.STREAM_SHIFT_X_SIGN, width)
            if self.width_shift_range
            else zeros
        )
        p["ty"] = (
            params.draw_shift(self.height_shift_range, draws, rng.STREAM_SHIFT_Y, rng.STREAM_SHIFT_Y_SIGN, height)
            if self.height_shift_range
            else zeros
        )
        s = self.shear_range
        p["shear"] = draws.uniform(rng.STREAM_SHEAR, -s, s) if s else zeros
        lo, hi = self.zoom_range
        if (lo, hi) == (1.0, 1.0):
            p["zx"] = p["zy"] = np.ones(n)
        else:
            p["zx"] = draws.uniform(rng.STREAM_ZOOM_X, lo, hi)
            p["zy"] = draws.uniform(rng.STREAM_ZOOM_Y, lo, hi)
        p["flip_horizontal"] = draws.coin(rng.STREAM_FLIP_H) & self.horizontal_flip
        p["flip_vertical"] = draws.coin(rng.STREAM_FLIP_V) & self.vertical_flip
        c = self.channel_shift_range
        p["channel_shift_intensity"] = draws.uniform(rng.STREAM_CHANNEL_SHIFT, -c, c) if c else None
        b = self.brightness_range
        p["brightness"] = draws.uniform(rng.STREAM_BRIGHTNESS, b[0], b[1]) if b is not None else None
        return p

    def __call__(self, images_uint8, *, seed: int, epoch: int, row_ids, out=None) -> np.ndarray:
        """Augment a batch.  Does not modify the input.

        Args:
            images_uint8: uint8 ``(n, H, W, C)``.
            seed, epoch, row_ids: ``row_ids`` (int64[n]) are the rows' global indices; with ``seed`` and
                ``epoch`` they alone decide each sample's random parameters.
            out: None, or where to write the result: C-contiguous, of the result's shape and dtype, not
                overlapping ``images_uint8`` (it may be a view into shared memory).

        Returns:
            ``(n, H, W, C)`` of :meth:`output_dtype`: ``out`` when given, else a new array.

        Raises:
            ConfigError: images that are not uint8 ``(n, H, W, C)``, ``row_ids`` / ``out`` that do not fit them,
                featurewise options without statistics (:meth:`with_feature_stats`), a ``preprocessing_function``
                that changes the shape.  Its other exceptions propagate unchanged.
        """
        images, rows, out = self.checked_call(images_uint8, row_ids, out)
        n = images.shape[0]
        if n == 0:
            return out
        if self.output_size is not None:
            # Crop and resize first (a few rows at a time); every other option then runs at output_size, as after
            # torchvision's crop.
            crops.crop_then(self._augment_into, images, out, self.crop, seed, epoch, rows, self.scale, self.ratio,
                            self.resize)
        else:
            self._augment_into(images, seed, epoch, rows, out)
        return out

    def checked_call(self, images_uint8, row_ids, out) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(images, row_ids, out)`` of a call checked (``images_uint8``, ``row_ids``, ``out`` as :meth:`__call__`
        takes them; see its Raises), ``out`` made when None."""
        images = np.asarray(images_uint8)
        if images.dtype != np.uint8 or images.ndim != 4:
            raise ConfigError(f"Augment: images must be uint8 of shape (n, H, W, C), got {images.dtype} {images.shape}")
        n, h, w, c = images.shape
        rows = np.asarray(row_ids, dtype=np.int64).reshape(-1)
        if rows.shape[0] != n:
            raise ConfigError(f"Augment: {rows.shape[0]} row_ids for a batch of {n} images; pass one id per image")
        if self.needs_feature_stats:
            raise ConfigError(
                "Augment: featurewise_center/std_normalization need dataset statistics; "
                "call .with_feature_stats(*compute_feature_stats(path)) (h5stream.open does this for you)"
            )
        if self.feature_mean is not None and len(self.feature_mean) != c:
            raise ConfigError(f"Augment: feature stats have {len(self.feature_mean)} channels but images have {c}")
        out_dtype = self.output_dtype()
        out_shape = (n, *self.output_shape(images.shape[1:]))
        if out is None:
            out = np.empty(out_shape, dtype=out_dtype)
        elif (out.shape != out_shape or out.dtype != out_dtype or not out.flags.c_contiguous
              or not out.flags.writeable):
            raise ConfigError(
                f"Augment: out must be a writeable C-contiguous {out_dtype} array of shape {out_shape}, "
                f"got {out.dtype} {out.shape}"
            )
        return images, rows, out

    def _augment_into(self, images, seed, epoch, rows, out) -> None:
        """Everything but the crop, from uint8 ``images`` into ``out`` (checked by :meth:`__call__`)."""
        n, h, w, c = images.shape
        p = self.draw(seed, epoch, rows, h, w)
        is_float = out.dtype != np.uint8
        work = out if out.dtype == np.float32 else (np.empty(images.shape, np.float32) if is_float else None)
        self._geometry_and_color(images, p, out if not is_float else None, work)
        if is_float:
            self._normalize(work)
            if work is not out:
                np.copyto(out, work, casting="unsafe")

    def _geometry_and_color(self, images, p, out_u8, work_f32):
        """Warp + colour each image; write into ``out_u8`` or, cast, into ``work_f32``."""
        cv2 = _cv2()
        n, h, w, c = images.shape
        matrices = None
        if self._has_geometry():
            matrices = affine_matrices(
                p["theta"], p["tx"], p["ty"], p["shear"], p["zx"], p["zy"], h, w,
                p["flip_horizontal"], p["flip_vertical"],
            )
        shifts = p["channel_shift_intensity"]
        shifts = np.rint(shifts).astype(np.int64) if shifts is not None else np.zeros(n, np.int64)
        bright = p["brightness"]
        scratch = None
        if matrices is not None:
            scratch = _plan_scratch(matrices, (h, w, c), np.uint8, self.fill_mode, group=pixels.group_size(h, w))
        staging = np.empty((h, w, c), np.uint8) if out_u8 is None else None
        threads = cv2.getNumThreads()
        cv2.setNumThreads(1)  # one worker process = one core
        try:
            if (matrices is not None and self.fill_mode == "nearest" and scratch.src4 is not None
                    and work_f32 is None and bright is None):
                # The common case (the "standard" preset, uint8 out), with the per-image Python glue hoisted:
                # the same OpenCV calls as _warp_into's RGBA + padding path, so the same pixels.
                pixels.warp_rgba_padded_shift(cv2, images, matrices, scratch, out_u8, shifts)
                return
            for i in range(n):
                dst = out_u8[i] if out_u8 is not None else staging
                if matrices is not None:
                    _warp_into(cv2, images[i], matrices[i], dst, self.fill_mode, self.cval, cv2.INTER_LINEAR, scratch,
                               scratch.pads[i])
                else:
                    pixels.flip_into(cv2, images[i], dst, p["flip_horizontal"][i], p["flip_vertical"][i])
                pixels.color_into(cv2, dst, int(shifts[i]), None if bright is None else float(bright[i]))
                if work_f32 is not None:
                    work_f32[i] = dst
        finally:
            cv2.setNumThreads(threads)

    def _normalize(self, x):
        """Keras' ``standardize`` in place on a float32 batch: preprocessing_function, rescale, samplewise,
        featurewise."""
        fn = self.preprocessing_function
        if fn is not None:
            for i in range(x.shape[0]):
                result = np.asarray(fn(x[i]))
                if result.shape != x.shape[1:]:
                    raise ConfigError(
                        f"Augment: preprocessing_function returned shape {result.shape} for an image of shape "
                        f"{x.shape[1:]}; it must keep the shape"
                    )
                x[i] = result
        scale = self.rescale if self.rescale is not None else 1.0
        if self.samplewise_center:
            if scale != 1.0:
                x *= scale
            x -= x.mean(axis=(1, 2, 3), keepdims=True)
            if self.samplewise_std_normalization:
                x /= x.std(axis=(1, 2, 3), keepdims=True) + _EPS
            scale = 1.0
        if self.featurewise_center:
            # Stats are in raw pixel units; Keras fits them on rescaled data.
            factor = self.rescale if self.rescale is not None else 1.0
            mean = np.asarray(self.feature_mean) * factor
            gain = np.full(len(mean), scale, dtype=np.float64)
            offset = -mean
            if self.featurewise_std_normalization:
                div = np.asarray(self.feature_std) * factor + _EPS
                gain, offset = gain / div, offset / div
            # One fused multiply-add per element instead of 2-3 passes.
            x *= gain.astype(np.float32)
            x += offset.astype(np.float32)
        elif scale != 1.0:
            x *= np.float32(scale)


# ImageDataGenerator's names Augment does not take (zca_whitening, ...) are one line each, refused by name.
Augment.__init__ = checked_kwargs(Augment.__init__, where="h5stream.Augment()", hints=AUGMENT_HINTS)
