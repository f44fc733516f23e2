"""Parity with Keras' legacy ImageDataGenerator code (skipped when keras is not installed).

Tolerance, stated honestly: our warp rounds to uint8 once, Keras keeps the
float result, so on uint8 inputs the mean absolute difference is about 0.25
(uniform rounding error) and the 99.9th percentile at most 1 level.  The
maximum is allowed up to 8 levels because OpenCV before 5.0 quantises sample
positions to 1/32 pixel (on noise images that moves a value by a few levels);
OpenCV 5.0 measured max 0.5 here, and 0.001 on float32 inputs.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
keras_image = pytest.importorskip("keras.src.legacy.preprocessing.image")
cv2 = pytest.importorskip("cv2")

from h5stream.augment import FILL_MODES, Augment, apply_affine_transform  # noqa: E402


def smooth_image(rs, size, channels):
    small = rs.integers(0, 256, (size // 8 + 2, size // 8 + 2, channels)).astype(np.float32)
    big = cv2.resize(small, (size, size), interpolation=cv2.INTER_CUBIC).reshape(size, size, channels)
    return np.clip(big, 0, 255).round().astype(np.uint8)


def random_params(rs):
    return dict(
        theta=rs.uniform(-45, 45), tx=rs.uniform(-12, 12), ty=rs.uniform(-12, 12),
        shear=rs.uniform(-20, 20), zx=rs.uniform(0.7, 1.3), zy=rs.uniform(0.7, 1.3),
    )


def keras_affine(x, **kw):
    return keras_image.apply_affine_transform(x.astype(np.float32), row_axis=0, col_axis=1, channel_axis=2, **kw)


def assert_close(ours, theirs, label):
    diff = np.abs(np.asarray(ours, np.float64) - np.asarray(theirs, np.float64))
    assert diff.mean() < 0.3, f"{label}: mean abs diff {diff.mean():.3f}"
    assert np.percentile(diff, 99.9) <= 1.0, f"{label}: p99.9 abs diff {np.percentile(diff, 99.9):.2f}"
    assert diff.max() <= 8.0, f"{label}: max abs diff {diff.max():.2f}"


@pytest.mark.parametrize("fill_mode", FILL_MODES)
def test_apply_affine_transform_matches_keras(fill_mode):
    rs = np.random.default_rng(FILL_MODES.index(fill_mode))
    for trial in range(8):
        size = int(rs.choice([32, 48, 96]))  # 96: the padded RGBA fast path
        channels = int(rs.choice([1, 3, 4]))
        x = smooth_image(rs, size, channels) if trial % 2 else rs.integers(0, 256, (size, size, channels), np.uint8)
        params = random_params(rs)
        ours = apply_affine_transform(x, **params, fill_mode=fill_mode, cval=77.0)
        theirs = keras_affine(x, **params, fill_mode=fill_mode, cval=77.0)
        assert ours.dtype == np.uint8
        assert_close(ours, theirs, f"{fill_mode} trial {trial} {x.shape} {params}")


@pytest.mark.parametrize("fill_mode", FILL_MODES)
def test_float_input_is_exact_up_to_sampling_precision(fill_mode):
    rs = np.random.default_rng(10)
    x = rs.uniform(0, 255, (40, 40, 3)).astype(np.float32)
    params = random_params(rs)
    ours = apply_affine_transform(x, **params, fill_mode=fill_mode, cval=5.0)
    diff = np.abs(ours - keras_affine(x, **params, fill_mode=fill_mode, cval=5.0))
    assert diff.mean() < 0.1 and np.percentile(diff, 99) < 2.0


def test_non_square_translation_matches_keras():
    # Keras centres rotations at (H-1)/2 on the column axis (a bug for H != W);
    # translations do not depend on the centre, so they must agree.
    x = np.random.default_rng(3).integers(0, 256, (40, 56, 3), np.uint8)
    for mode in FILL_MODES:
        assert_close(apply_affine_transform(x, tx=5.5, ty=-3.25, fill_mode=mode),
                     keras_affine(x, tx=5.5, ty=-3.25, fill_mode=mode), mode)


def test_order_zero_matches_keras_nearest_neighbour():
    x = np.random.default_rng(4).integers(0, 256, (32, 32, 3), np.uint8)
    ours = apply_affine_transform(x, theta=17, tx=1.3, zx=0.9, order=0)
    theirs = keras_affine(x, theta=17, tx=1.3, zx=0.9, order=0)
    assert (ours != theirs).mean() < 0.01  # ties at exactly .5 may round differently


@pytest.mark.parametrize("brightness_range", [None, (0.6, 1.4)])
@pytest.mark.parametrize("fill_mode", FILL_MODES)
def test_augment_matches_image_data_generator_given_the_same_draws(fill_mode, brightness_range):
    """The whole pipeline (warp, channel shift, flips, brightness) against IDG.apply_transform + standardize."""
    kwargs = dict(rotation_range=40, width_shift_range=0.1, height_shift_range=0.1, shear_range=10,
                  zoom_range=0.2, channel_shift_range=30.0, horizontal_flip=True, vertical_flip=True,
                  brightness_range=brightness_range, fill_mode=fill_mode, cval=10.0)
    ours = Augment(**kwargs)
    idg = keras_image.ImageDataGenerator(**kwargs)
    rs = np.random.default_rng(5)
    images = np.stack([smooth_image(rs, 64, 3) for _ in range(8)])
    rows = np.arange(50, 58)
    out = ours(images, seed=11, epoch=2, row_ids=rows)
    p = ours.draw(11, 2, rows, 64, 64)
    for i in range(len(rows)):
        params = {k: (None if v is None else v[i]) for k, v in p.items()}
        ref = idg.apply_transform(images[i].astype(np.float32), params)
        ref = idg.standardize(ref)
        diff = np.abs(out[i].astype(np.float64) - ref)
        if brightness_range is None:
            # Keras keeps float pixels and a float shift; we round the warped pixel and the shift.
            assert diff.mean() < 0.5 and diff.max() <= 1.0, (fill_mode, i, diff.mean(), diff.max())
        else:
            # Brightness goes through PIL, which truncates Keras' float pixel and the product;
            # we multiply our rounded pixel: about one level apart on average, never more than 3.
            assert diff.mean() < 1.5 and diff.max() <= 3.0, (fill_mode, i, diff.mean(), diff.max())


def test_standardize_chain_matches_keras():
    images = np.random.default_rng(6).integers(0, 256, (4, 16, 16, 3), np.uint8)
    rows = np.arange(4)
    for kwargs in (dict(rescale=1 / 255, samplewise_center=True, samplewise_std_normalization=True),
                   dict(rescale=1 / 127.5, featurewise_center=True, featurewise_std_normalization=True)):
        idg = keras_image.ImageDataGenerator(**kwargs)
        ours = Augment(**kwargs)
        if ours.needs_feature_stats:
            idg.fit(images.astype(np.float32))
            flat = images.reshape(-1, 3).astype(np.float64)
            ours = ours.with_feature_stats(flat.mean(axis=0), flat.std(axis=0))
        out = ours(images, seed=0, epoch=0, row_ids=rows)
        for i in range(4):
            ref = idg.standardize(images[i].astype(np.float32))
            np.testing.assert_allclose(out[i], ref, rtol=1e-4, atol=1e-4)
