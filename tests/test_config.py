"""h5stream.streaming.config.resolve: one pure step from (store metadata, options, facts) to everything a stream runs
by.

Pure means no I/O: these tests resolve configurations of stores that do not exist on disk (any file access would
raise), and check that the same inputs give the same configuration, that what a resumed state names wins, and
that every refusal is one line."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

import h5stream
from h5stream.streaming.planning import plan_stream
from h5stream.streaming.config import Facts, StreamConfig, layout_function, resolve
from h5stream.errors import BudgetError, ConfigError
from h5stream.streaming.options import StreamOptions
from h5stream.store.meta import StoreMeta

NOWHERE = "/nonexistent/h5stream-config-test/store.h5"  # never opened: resolve does no I/O


def meta(rows=1000, side=16, order="shuffled", remote=None) -> StoreMeta:
    return StoreMeta(path=NOWHERE, rows=rows, image_shape=(side, side, 3), label_kind="class", label_shape=(),
                     label_dtype=np.dtype(np.int64), class_names=("a", "b", "c"), label_columns=None,
                     block_rows=64, compression=None, storage_order=order, order_seed=0, resize_mode="squash",
                     skipped_files=0, format_version=3, file_bytes=rows * side * side * 3, checksum="xxh3_64",
                     remote=remote)


FACTS = Facts(drawn_seed=1234, direct_io=False, chunk_cache_bytes=0, available_bytes=None)


def test_the_same_inputs_give_the_same_configuration_and_it_pickles_whole():
    options = StreamOptions(batch_size=32, memory_budget="256MiB", seed=7, validation_split=0.25, subset="training",
                            augment=h5stream.Augment(horizontal_flip=True), workers=2, label_mode="categorical")
    a, b = resolve(meta(), options, FACTS), resolve(meta(), options, FACTS)
    assert isinstance(a, StreamConfig) and a == b
    assert a.rows == (0, 750) and a.epoch_rows == 750 and a.shard == (0, 1) and a.seed == 7
    assert a.labels.mode == "categorical" and a.labels.shape == (3,)
    # The plan is the budget module's, for exactly these inputs; the layout follows it.
    assert a.plan == plan_stream(meta(), 256 << 20, 32, augment=options.augment, workers=2, epoch_rows=750,
                                 out_label_row_bytes=a.labels.extra_row_bytes, available_bytes=None,
                                 verify_reads="once")
    assert a.layout == layout_function(750, a.plan, 7, (0, 1), True, False, start_row=0)
    again = pickle.loads(pickle.dumps(a))  # what the feeder process receives
    assert again.plan == a.plan and again.layout == a.layout and again.seed == a.seed
    assert np.array_equal(again.layout(3).order(), a.layout(3).order())


def test_the_seed_is_the_given_one_else_the_drawn_fact_and_a_resumed_state_wins():
    assert resolve(meta(), StreamOptions(seed=None), FACTS).seed == 1234
    assert resolve(meta(), StreamOptions(seed=5), FACTS).seed == 5
    state = {"seed": 99, "rows_per_fill": 128, "unit_rows": 64}
    resumed = resolve(meta(), StreamOptions(seed=5, memory_budget="64MiB", resume=state), FACTS)
    assert resumed.seed == 99 and resumed.plan.rows_per_fill == 128 and resumed.plan.unit_rows == 64
    assert resumed.resume == state


def test_the_validation_subset_is_unshuffled_and_takes_the_last_rows():
    config = resolve(meta(), StreamOptions(validation_split=0.2, subset="validation"), FACTS)
    assert config.rows == (800, 1000) and config.shuffle is False
    assert sorted(config.layout(0).order()) == list(range(800, 1000))


def test_direct_io_is_the_fact_for_a_local_store_and_refused_when_asked_for_a_url():
    assert resolve(meta(), StreamOptions(), dataclasses.replace(FACTS, direct_io=True)).direct_io is True
    url = meta(remote=h5stream.RemoteOptions())
    assert resolve(url, StreamOptions(), dataclasses.replace(FACTS, direct_io=True)).direct_io is False
    with pytest.raises(ConfigError, match="direct_io=True is for a local store"):
        resolve(url, StreamOptions(direct_io=True), FACTS)


@pytest.mark.parametrize(("store", "options", "match"), [
    (meta(rows=0), StreamOptions(), "no committed rows"),
    (meta(), StreamOptions(augment="flip"), "augment must be an h5stream.Augment"),
    (meta(rows=10), StreamOptions(batch_size=32, drop_remainder=True), "give no full batch of 32"),
    (meta(order="by_class"), StreamOptions(validation_split=0.2, subset="training"), "shuffled order"),
])
def test_options_that_do_not_fit_the_store_are_one_line(store, options, match):
    with pytest.raises(ConfigError, match=match) as caught:
        resolve(store, options, FACTS)
    assert "\n" not in str(caught.value)


def test_workers_without_an_augment_copy_the_rows_as_stored_and_load_no_transform():
    """workers > 0 with no augmentation is a plain stream read in the workers: they run the identity copy, the
    batches stay uint8, and the plan counts the workers but not a transform's library."""
    from h5stream.augment.worker import copy_rows
    from h5stream.streaming.budget import TRANSFORM_LIBRARY_BYTES

    plain = resolve(meta(), StreamOptions(workers=2), FACTS)
    augmented = resolve(meta(), StreamOptions(workers=2, augment=h5stream.Augment(horizontal_flip=True)), FACTS)
    assert plain.transform is copy_rows and plain.output_dtype == np.uint8 and plain.augment is None
    assert augmented.transform is augmented.augment
    assert plain.plan.workers == 2 and plain.plan.out_slots == augmented.plan.out_slots
    assert plain.plan.pool_bytes == augmented.plan.pool_bytes - TRANSFORM_LIBRARY_BYTES
    assert pickle.loads(pickle.dumps(plain)) == plain
    assert resolve(meta(), StreamOptions(workers=2, feeder=True), FACTS).plan.feeder


def test_the_machine_memory_fact_bounds_the_plan():
    with pytest.raises(BudgetError, match="memory available"):
        resolve(meta(rows=10**6, side=64), StreamOptions(memory_budget="1GiB"),
                dataclasses.replace(FACTS, available_bytes=64 << 20))
    assert resolve(meta(rows=10**6, side=64), StreamOptions(memory_budget="1GiB"), FACTS).plan.total_bytes > 64 << 20


def test_featurewise_statistics_are_not_fitted_by_resolve():
    """The one pass over the data comes after every option was accepted
    (h5stream.streaming.config.fit_feature_stats)."""
    config = resolve(meta(), StreamOptions(augment=h5stream.Augment(featurewise_center=True)), FACTS)
    assert config.needs_feature_stats


def test_a_store_with_committed_rows_without_checksums_is_refused_unless_reads_are_not_verified():
    damaged = dataclasses.replace(meta(), checksum_problem=f"{NOWHERE}: rows 0-99 have no checksum")
    with pytest.raises(h5stream.StoreFormatError, match="rows 0-99 have no checksum.*verify_reads=False"):
        resolve(damaged, StreamOptions(), FACTS)
    assert resolve(damaged, StreamOptions(verify_reads=False), FACTS).verify_reads is False
