"""``open(resume=state)`` with options: each order-shaping option given must agree with the state, one left out is
the state's; never a silent override either way."""

from __future__ import annotations

import numpy as np
import pytest

import h5stream
from conftest import stamped_rows, write_stamped_store
from h5stream.errors import ConfigError

pytestmark = pytest.mark.usefixtures("no_leaks")


ROWS = 301  # odd, no multiple of the block or of a batch


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return write_stamped_store(tmp_path_factory.mktemp("resume_options") / "s.h5", ROWS, 3, seed=0)


SAVED = dict(seed=7, batch_size=10, rows_per_fill=64, drop_remainder=True, shuffle=True)


@pytest.fixture(scope="module")
def saved(store):
    """(state after 3 batches, the ids of the batches that follow it in that epoch)."""
    with h5stream.open(store, **SAVED) as s:
        it = iter(s)
        for _ in range(3):
            next(it)
        state = s.state()
        rest = [stamped_rows(x) for x, _ in it]
    return state, rest


@pytest.mark.parametrize("option", [dict(seed=5), dict(seed=0), dict(batch_size=12), dict(shuffle=False),
                                    dict(drop_remainder=False), dict(rows_per_fill=48), dict(read_unit=48 * 8)])
def test_a_given_option_that_contradicts_the_state_is_refused_naming_it(store, saved, option):
    state, _ = saved
    (name, value), = option.items()
    with pytest.raises(ConfigError, match=rf"^cannot resume: {name}={value!r}.* was given, but the state was saved "
                                          rf"with \w+=\d+; drop {name}="):
        h5stream.open(store, resume=state, **option)


@pytest.mark.parametrize("options", [{}, SAVED, dict(seed=None), dict(seed=7, batch_size=10),
                                     dict(read_unit=48 * 16, shuffle=None)])
def test_options_left_out_or_agreeing_continue_the_state_exactly(store, saved, options):
    state, rest = saved
    with h5stream.open(store, resume=state, **options) as s:
        assert (s.seed, s.batch_size, s.shuffle, s.drop_remainder, s.plan.rows_per_fill) == (7, 10, True, True, 64)
        got = [stamped_rows(x) for x, _ in s]
    assert len(got) == len(rest) and all(np.array_equal(a, b) for a, b in zip(got, rest))


def test_a_state_of_a_drawn_seed_resumes_with_seed_none(store):
    with h5stream.open(store, seed=None, batch_size=10) as s:
        it = iter(s)
        next(it)
        state = s.state()
        rest = [stamped_rows(x) for x, _ in it]
    with h5stream.open(store, seed=None, batch_size=10, resume=state) as again:
        assert again.seed == state["seed"]
        assert all(np.array_equal(a, stamped_rows(x)) for a, (x, _) in zip(rest, again, strict=True))


def test_the_rows_per_fill_the_state_was_saved_with_resumes_as_given_before_its_rounding_to_blocks(store):
    """A stream opened with rows_per_fill=70 plans 64 (whole 16-row blocks) and its state records 64: resuming with
    the same rows_per_fill=70 was refused as a contradiction."""
    kw = dict(SAVED, rows_per_fill=70)
    with h5stream.open(store, **kw) as s:
        it = iter(s)
        next(it)
        state = s.state()
        rest = [stamped_rows(x) for x, _ in it]
    assert state["rows_per_fill"] == 64
    with h5stream.open(store, resume=state, **kw) as again:
        assert all(np.array_equal(a, stamped_rows(x)) for a, (x, _) in zip(rest, again, strict=True))
    with pytest.raises(ConfigError, match=r"^cannot resume: rows_per_fill=90 \(which gives rows_per_fill=80\)"):
        h5stream.open(store, resume=state, **dict(SAVED, rows_per_fill=90))


def test_a_contradicting_rows_per_fill_is_named_as_such_before_any_budget_is_planned(store, saved):
    state, _ = saved
    with pytest.raises(ConfigError, match=r"^cannot resume: rows_per_fill=100000 was given, but the state was saved "
                                          r"with rows_per_fill=64"):
        h5stream.open(store, resume=state, rows_per_fill=100_000, memory_budget="2MiB")


def test_restore_into_a_stream_of_another_seed_says_how_to_resume(store, saved):
    state, rest = saved
    with h5stream.open(store, **dict(SAVED, seed=8)) as other:
        with pytest.raises(ConfigError, match=r"^cannot resume: the state has seed=7 but this stream has seed=8; "
                                              r"open the stream with h5stream.open\(\.\.\., resume=state\)"):
            other.restore(state)


def test_a_changed_copy_of_the_options_names_the_options_the_caller_gave_not_every_field():
    from h5stream.streaming.options import StreamOptions

    options = StreamOptions(64, seed=5)
    assert options.given == {"batch_size", "seed"}
    assert options.changed(shuffle=False).given == {"batch_size", "seed"}
