"""Keyword arguments that name no option: one line saying what h5stream calls it (pure, no h5stream imports but
errors).

Users come from Keras (``image_dataset_from_directory``, ``flow_from_directory``, ``ImageDataGenerator``,
``PyDataset``) and torch's ``DataLoader``, and pass those names first.  Python's own ``TypeError: __init__() got an
unexpected keyword argument`` says neither where the setting lives in h5stream nor that some (the image size, the
colour mode) are decided once, at ingest.  :func:`checked_kwargs` wraps an ``__init__`` so that an unknown name
raises :class:`~h5stream.errors.OptionNameError` (a ``ConfigError`` and a ``TypeError``) with that line; a name with
no known counterpart gets ``difflib``'s close matches, or the list of valid names.
"""

from __future__ import annotations

import difflib
import functools
import inspect

from h5stream.errors import OptionNameError

_AT_INGEST = "`h5stream ingest SRC OUT.h5"
_RESIZE = (f"h5stream resizes once, at ingest ({_AT_INGEST} --size 64` or `--size 64x96`); the stream yields the "
           "stored size (stream.meta.image_shape), or the size Augment(output_size=(h, w), crop='random_resized' or "
           "'center') crops and resizes it to")
_QUEUE = ("set memory_budget (the shuffle window and the batches read ahead follow from it; rows_per_fill pins "
          "the window)")
_ZCA = ("ImageDataGenerator's ZCA whitening is not supported (it needs a (H*W*C)^2 covariance matrix of the whole "
        "training set); featurewise_center and featurewise_std_normalization are supported")

#: Another library's name -> what h5stream calls it, for h5stream.open().
OPEN_HINTS = {
    "image_size": _RESIZE,
    "target_size": _RESIZE,
    "interpolation": _RESIZE,
    "color_mode": f"the channels are chosen at ingest ({_AT_INGEST} --channels 1` for grayscale, `3` for RGB)",
    "crop_to_aspect_ratio": f"ingest crops to the aspect ratio with {_AT_INGEST} --resize crop`",
    "keep_aspect_ratio": f"ingest crops to the aspect ratio with {_AT_INGEST} --resize crop`",
    "pad_to_aspect_ratio": f"ingest pads to the aspect ratio with {_AT_INGEST} --resize pad`",
    "follow_links": f"ingest follows symlinked folders with {_AT_INGEST} --follow-links`",
    "class_names": f"the classes are chosen at ingest ({_AT_INGEST} --classes A,B`); stream.class_names lists them",
    "classes": f"the classes are chosen at ingest ({_AT_INGEST} --classes A,B`); stream.class_names lists them",
    "labels": f"the labels are stored at ingest (the class folders, {_AT_INGEST} --labels FILE.csv`, or none "
              "with `--labels none`; label_mode=None yields the images alone from any store)",
    "directory": f"the stream reads a store: ingest the folder first ({_AT_INGEST}`) and open OUT.h5",
    "class_mode": "it is label_mode ('int', 'categorical', 'binary' or None)",
    "max_cache_size": "it is cache_limit (bytes or '100GB'), the most a URL's disk cache keeps",
    "cache": "a URL's disk cache is cache_dir: a folder, 'auto' (the default) or None to turn it off",
    "batchsize": "it is batch_size",
    "batch": "it is batch_size",
    "num_workers": "it is workers (augmenting processes, started once)",
    "use_multiprocessing": "workers=N augments in N processes",
    "max_queue_size": _QUEUE,
    "prefetch_factor": _QUEUE,
    "buffer_size": _QUEUE,
    "shuffle_buffer_size": _QUEUE,
    "drop_last": "it is drop_remainder",
    "timeout": "it is timeout_s (seconds)",
    "pin_memory": "stream.torch(device='cuda') copies each batch from page-locked memory by itself",
    "data_format": "batches are channels last (N, H, W, C), as stored; stream.torch(layout='NCHW') is channels "
                   "first",
    "save_to_dir": "`h5stream preview STORE --out grid.png` writes images as the stream yields them",
    "steps_per_epoch": "each `for` over the stream is one epoch of len(stream) batches; model.fit needs no steps",
    "epochs": "each `for` over the stream is one epoch; the number of epochs is model.fit's (or your loop's)",
    "zca_whitening": _ZCA,
    "zca_epsilon": _ZCA,
}

#: ImageDataGenerator's parameters that Augment takes: passed to open(), they belong in augment=.
AUGMENT_NAMES = (
    "rotation_range", "width_shift_range", "height_shift_range", "shear_range", "zoom_range", "channel_shift_range",
    "brightness_range", "horizontal_flip", "vertical_flip", "fill_mode", "cval", "rescale", "preprocessing_function",
    "featurewise_center", "featurewise_std_normalization", "samplewise_center", "samplewise_std_normalization",
    "output_size", "crop",
)

#: ImageDataGenerator's parameters that Augment does not take, and why.
AUGMENT_HINTS = {
    "zca_whitening": _ZCA,
    "zca_epsilon": _ZCA,
    "validation_split": "pass validation_split= (with subset=) to h5stream.open",
    "data_format": OPEN_HINTS["data_format"],
    "interpolation_order": "the warp is always bilinear, ImageDataGenerator's default (interpolation_order=1): drop it",
}


def unknown_option(name: str, valid, *, where: str, hints: dict[str, str], elsewhere=()) -> str:
    """The one-line message for keyword ``name`` given to ``where``, which takes ``valid``.

    ``hints`` maps other libraries' names to what to do instead; ``elsewhere`` lists names that belong to
    ``h5stream.Augment`` (passed to ``where`` by mistake).
    """
    head = f"{where} has no option {name!r}"
    if name in hints:
        return f"{head}: {hints[name]}"
    if name in elsewhere:
        return f"{head}: it is an augmentation: pass augment=h5stream.Augment({name}=...)"
    close = difflib.get_close_matches(name, list(valid), n=3, cutoff=0.6)
    if close:
        return f"{head}; did you mean {' or '.join(close)}?"  # close: at most 3, best first
    return f"{head}; it takes {', '.join(valid)}"


def checked_kwargs(init, *, where: str, hints: dict[str, str], elsewhere=()):
    """``init`` (an ``__init__``) that raises :class:`OptionNameError` with :func:`unknown_option`'s line for a
    keyword it does not take; its signature (``inspect.signature``) stays ``init``'s."""
    valid = [n for n, p in inspect.signature(init).parameters.items()
             if n != "self" and not n.startswith("_") and p.kind is not p.VAR_POSITIONAL]

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        for name in kwargs:
            if name not in valid:
                raise OptionNameError(unknown_option(name, valid, where=where, hints=hints, elsewhere=elsewhere))
        init(self, *args, **kwargs)

    return __init__
