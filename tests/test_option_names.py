"""A keyword that names no option is one line that says what h5stream calls it (Keras' and torch's names first),
and every message that suggests a worker count suggests the same one."""

from __future__ import annotations

import inspect
import os
import warnings

import pytest

import h5stream
from h5stream.concurrency.cores import suggested_workers
from h5stream._kwargs import OPEN_HINTS
from h5stream.errors import BudgetError, ConfigError, OptionNameError


def _refusal(call) -> str:
    with pytest.raises(TypeError) as info:
        call()
    error = info.value
    assert isinstance(error, OptionNameError) and isinstance(error, ConfigError)  # except ValueError works too
    assert "\n" not in str(error)
    return str(error)


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"image_size": (64, 64)}, "--size 64x96"),
    ({"target_size": (64, 64)}, "resizes once, at ingest"),
    ({"color_mode": "grayscale"}, "--channels 1"),
    ({"batchsize": 16}, "it is batch_size"),
    ({"class_mode": "categorical"}, "it is label_mode"),
    ({"num_workers": 4}, "it is workers"),
    ({"drop_last": True}, "it is drop_remainder"),
    ({"crop_to_aspect_ratio": True}, "--resize crop"),
    ({"horizontal_flip": True}, "augment=h5stream.Augment(horizontal_flip=...)"),
    ({"zca_whitening": True}, "ZCA whitening is not supported"),
])
def test_another_librarys_name_for_an_option_says_what_h5stream_calls_it(tmp_path, kwargs, says):
    (name,) = kwargs
    message = _refusal(lambda: h5stream.open(tmp_path / "none.h5", **kwargs))  # refused before the file is opened
    assert message.startswith(f"h5stream.open() has no option {name!r}") and says in message


def test_a_misspelt_option_gets_the_close_names_and_an_unknown_one_the_list(tmp_path):
    assert "did you mean validation_split?" in _refusal(lambda: h5stream.open(tmp_path / "x.h5", validation_splt=.1))
    assert "did you mean batch_size?" in _refusal(lambda: h5stream.open(tmp_path / "x.h5", batch_szie=8))
    listed = _refusal(lambda: h5stream.open(tmp_path / "x.h5", colour=1))
    assert "it takes batch_size, memory_budget, shuffle" in listed and "verify_reads" in listed


def test_every_hint_names_no_real_option_and_the_signature_is_the_options():
    options = inspect.signature(h5stream.open).parameters
    assert not set(OPEN_HINTS) & set(options)  # a hint never hides an option
    assert {"batch_size", "memory_budget", "validation_split", "feeder"} <= set(options)


def test_augment_refuses_imagedatagenerators_names_it_does_not_take_by_name():
    zca = _refusal(lambda: h5stream.Augment(rotation_range=10, zca_whitening=True))
    assert zca.startswith("h5stream.Augment() has no option 'zca_whitening'")
    assert "not supported" in zca and "featurewise_std_normalization" in zca
    assert "not supported" in _refusal(lambda: h5stream.Augment(zca_epsilon=1e-6))
    assert "h5stream.open" in _refusal(lambda: h5stream.Augment(validation_split=0.2))
    assert "did you mean rotation_range" in _refusal(lambda: h5stream.Augment(rotaton_range=10))
    assert "rotation_range" in inspect.signature(h5stream.Augment).parameters
    assert h5stream.Augment.preset("standard", rescale=1 / 255).rescale == pytest.approx(1 / 255)


@pytest.fixture
def store(small_class_store):
    return small_class_store


def test_the_budget_error_and_the_warning_suggest_the_same_worker_count(store, monkeypatch):
    """64 workers on 2 cores under a budget that holds about 35: both messages say what the cores take."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(BudgetError) as info:
            h5stream.open(store, workers=64, memory_budget="1GB", augment=h5stream.Augment(horizontal_flip=True))
    (warning,) = [w for w in caught if "usable CPU core" in str(w.message)]
    assert suggested_workers(2) == 1
    assert "workers=1 leaves a core" in str(warning.message)
    assert "use workers=1" in str(info.value) and "use workers=3" not in str(info.value)
