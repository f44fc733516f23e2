"""Elastic resume: a state saved by N shards continues its epoch on M shards, every row exactly once.

Pure properties of the order functions over many (rows, blocks, buffer, seed, N, M, batches served), then
real streams on a real store: 4 shards save, 3 shards finish the epoch, and the next epoch is a fresh
3-shard stream's.
"""

import contextlib
import itertools

import numpy as np
import pytest

import h5stream
from h5stream.streaming.config import resume_point
from h5stream.errors import ConfigError
from h5stream.order import epoch_layout, shard_layout
from h5stream.order.pieces import resumed_stages, rows_served

CASES = [
    # rows, block_rows, rows_per_fill, batch_size: rows a multiple of nothing
    (101, 8, 24, 4),
    (1037, 16, 160, 32),
    (997, 32, 64, 7),
    (3001, 64, 512, 25),
]
MOVES = [(4, 3), (2, 5), (4, 1), (1, 4), (3, 3), (5, 2)]


def _served(layouts, first_batch=0, last_batch=None):
    """Row ids the shards of ``layouts`` serve from ``first_batch`` up to (not including) ``last_batch``."""
    out = []
    for lay in layouts:
        bounds = np.concatenate([[0], np.cumsum(lay.batch_sizes)])
        stop = bounds[-1] if last_batch is None else bounds[last_batch]
        out.append(lay.order()[bounds[first_batch]:stop])
    return np.concatenate(out)


@pytest.mark.parametrize("rows,block,fill,bs", CASES)
@pytest.mark.parametrize("shuffle", [True, False])
def test_global_order_does_not_depend_on_the_shard_count(rows, block, fill, bs, shuffle):
    for seed, epoch in itertools.product([0, 11], [0, 2]):
        whole = epoch_layout(rows, block, fill, bs, seed, epoch, shuffle=shuffle).order()
        for count in (2, 3, 5, 8):
            pieces = [epoch_layout(rows, block, fill, bs, seed, epoch, shard=(i, count), shuffle=shuffle).order()
                      for i in range(count)]
            assert np.array_equal(np.concatenate(pieces), whole), (seed, epoch, count)
            assert max(map(len, pieces)) - min(map(len, pieces)) <= 1


@pytest.mark.parametrize("rows,block,fill,bs", CASES)
@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("n,m", MOVES)
def test_n_shards_save_m_shards_finish_every_row_once(rows, block, fill, bs, drop, n, m):
    for seed, epoch in itertools.product([0, 5, 987654321], [0, 3]):
        def lay(shard, stages=(), seed=seed, epoch=epoch):
            return epoch_layout(rows, block, fill, bs, seed, epoch, shard=shard, drop_remainder=drop, stages=stages)

        before_layouts = [lay((i, n)) for i in range(n)]
        n_batches = before_layouts[0].n_batches
        for b in sorted({0, 1, n_batches // 2, max(n_batches - 1, 0)}):
            before = _served(before_layouts, 0, b)
            stages, first = resumed_stages((), n, b, m)
            left = rows - len(before)
            if not drop and left // m < -(-left // (m * bs)):  # fewer rows left than m shards can share
                with pytest.raises(ConfigError, match=f"{left} rows cannot give {m} shards"):
                    lay((0, m), stages)
                continue
            after_layouts = [lay((j, m), stages) for j in range(m)]
            assert len({a.n_batches for a in after_layouts}) == 1, "ranks out of step"
            for a in after_layouts:
                assert (a.batch_sizes >= 1).all() and (a.batch_sizes <= bs).all()
            after = _served(after_layouts, first)
            union = np.concatenate([before, after])
            assert len(np.unique(union)) == len(union), f"a row twice: seed={seed} b={b}"
            assert len(before) == rows_served(rows, bs, drop, ((n, b),) if b else ())
            if drop:
                assert all((a.batch_sizes == bs).all() for a in after_layouts)
                assert rows - len(union) < max(m, n) * bs  # fewer than one global batch left out
            else:
                assert np.array_equal(np.sort(union), np.arange(rows)), f"a row lost: seed={seed} b={b}"
            if m == n:  # the same count continues the same pieces: exactly the batches of not stopping
                assert stages == () and first == b
                assert np.array_equal(after, _served(before_layouts, b))


@pytest.mark.parametrize("drop", [False, True])
def test_two_resumes_in_one_epoch(drop):
    rows, block, fill, bs = 2003, 16, 96, 8
    for seed in (1, 2, 3):
        def lay(shard, stages=(), seed=seed):
            return epoch_layout(rows, block, fill, bs, seed, 1, shard=shard, drop_remainder=drop, stages=stages)

        first = [lay((i, 4)) for i in range(4)]
        served = [_served(first, 0, 10)]
        stages, _ = resumed_stages((), 4, 10, 3)
        second = [lay((j, 3), stages) for j in range(3)]
        served.append(_served(second, 0, 7))
        stages, start = resumed_stages(stages, 3, 7, 5)
        assert stages == ((4, 10), (3, 7)) and start == 0
        third = [lay((k, 5), stages) for k in range(5)]
        served.append(_served(third))
        union = np.concatenate(served)
        assert len(np.unique(union)) == len(union)
        if not drop:
            assert np.array_equal(np.sort(union), np.arange(rows))


def test_version_1_states_resume_their_own_shard_in_the_old_order():
    v1 = {"version": 1, "epoch": 2, "batch": 3, "shard_index": 1, "shard_count": 4}
    assert resume_point(v1, (1, 4)) == (2, 3, (), True)
    with pytest.raises(ConfigError, match=r"shard=\(1, 4\)"):
        resume_point(v1, (0, 3))
    # one shard's order, and an epoch's start, are the same in both versions: any count continues them
    assert resume_point({**v1, "shard_index": 0, "shard_count": 1}, (2, 3)) == (2, 0, ((1, 3),), False)
    assert resume_point({**v1, "batch": 0}, (2, 3)) == (2, 0, (), False)
    # the old order is still the one it was: each shard a piece of its own permuted blocks
    old = [shard_layout(1037, 16, 160, 32, 4, 2, shard=(i, 4)).order() for i in range(4)]
    assert np.array_equal(np.sort(np.concatenate(old)), np.arange(1037))
    assert not np.array_equal(np.concatenate(old), epoch_layout(1037, 16, 160, 32, 4, 2).order())


def test_a_stage_claiming_more_batches_than_it_had_is_refused():
    with pytest.raises(ConfigError, match="served 99 batches"):
        epoch_layout(1037, 16, 160, 32, 0, 0, shard=(0, 3), stages=((4, 99),))


# -- real streams -------------------------------------------------------------------------------------------------

ROWS = 1999


def _ids(x):
    return x[:, 0, 0, 0].astype(np.int64) + 256 * x[:, 0, 0, 1].astype(np.int64)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from h5stream.store.writer import write_arrays

    images = np.random.default_rng(0).integers(0, 255, (ROWS, 8, 8, 3), dtype=np.uint8)
    images[:, 0, 0, 0] = np.arange(ROWS) % 256
    images[:, 0, 0, 1] = np.arange(ROWS) // 256
    path = tmp_path_factory.mktemp("elastic") / "s.h5"
    write_arrays(path, images, np.arange(ROWS) * 10 // ROWS, block_rows=32)
    return path


KW = dict(batch_size=40, memory_budget="6.5MiB", seed=17)


@pytest.mark.parametrize("drop", [False, True])
def test_four_streams_save_three_finish_the_epoch_and_the_next_is_a_fresh_three_shard_one(store, drop):
    kw = dict(KW, drop_remainder=drop)
    served, b = [], 5
    states = []
    for i in range(4):
        with h5stream.open(store, shard=(i, 4), **kw) as s:
            assert s.plan.rows_per_fill < ROWS  # several fills: pieces cut through fills
            it = iter(s)
            served += [_ids(next(it)[0]) for _ in range(b)]
            states.append(s.state())
    assert states[0]["rows_consumed"] == 4 * b * 40
    assert all({k: v for k, v in st.items() if k != "shard_index"}
               == {k: v for k, v in states[0].items() if k != "shard_index"} for st in states)
    resumed = [h5stream.open(store, shard=(j, 3), resume=states[2], **kw) for j in range(3)]
    fresh = [h5stream.open(store, shard=(j, 3), **kw) for j in range(3)]
    try:
        rest = [[_ids(x) for x, _ in r] for r in resumed]
        assert len({len(r) for r in rest}) == 1  # the ranks stay in step
        union = np.concatenate(served + [x for r in rest for x in r])
        assert len(np.unique(union)) == len(union)
        if drop:
            assert ROWS - len(union) < 3 * 40
        else:
            assert np.array_equal(np.sort(union), np.arange(ROWS))
        for r, f in zip(resumed, fresh):
            assert r.epoch == 1 and r.state()["stages"] == []
            assert sum(1 for _ in f) == len(f)  # the fresh stream's epoch 0; its next iter is epoch 1
            got, want = [_ids(x) for x, _ in r], [_ids(x) for x, _ in f]
            assert len(got) == len(want) == len(r)
            assert all(np.array_equal(a, c) for a, c in zip(got, want))
    finally:
        for s in resumed + fresh:
            s.close()


def test_a_resumed_shard_saves_again_and_a_third_count_finishes(store):
    with h5stream.open(store, shard=(1, 2), **KW) as s:
        it = iter(s)
        served = [_ids(next(it)[0]) for _ in range(3)]
        state2 = s.state()
    fill, unit = state2["rows_per_fill"], state2["unit_rows"]

    def lay(shard, stages=()):
        return epoch_layout(ROWS, 32, fill, 40, 17, 0, shard=shard, unit_rows=unit, stages=stages)

    served.append(lay((0, 2)).order()[:120])  # what shard 0 served in step with shard 1
    with h5stream.open(store, shard=(2, 3), resume=state2, **KW) as s:
        it = iter(s)
        mine = [_ids(next(it)[0]) for _ in range(4)]
        state3 = s.state()
        assert state3["stages"] == [[2, 3]] and state3["shard_count"] == 3 and state3["batch"] == 4
        assert state3["rows_consumed"] == 2 * 120 + 3 * 4 * 40
        next(it)
        s.restore(state3)  # the epoch this stream was opened to finish: restores in place
        assert np.array_equal(_ids(next(iter(s))[0]), lay((2, 3), ((2, 3),)).order()[160:200])
    assert np.array_equal(np.concatenate(mine), lay((2, 3), ((2, 3),)).order()[:160])
    served += [lay((j, 3), ((2, 3),)).order()[:160] for j in range(3)]
    for k in range(5):
        with h5stream.open(store, shard=(k, 5), resume=state3, **KW) as s:
            served += [_ids(x) for x, _ in s]
    union = np.concatenate(served)
    assert len(union) == len(np.unique(union)) == ROWS


def test_restore_of_another_shard_count_into_an_open_stream_is_refused(store):
    with h5stream.open(store, shard=(0, 4), **KW) as s:
        it = iter(s)
        next(it)
        state = s.state()
    with h5stream.open(store, shard=(0, 3), **KW) as other:
        with pytest.raises(ConfigError, match="resume=state"):
            other.restore(state)
    with pytest.raises(ConfigError, match="rows_consumed"):
        h5stream.open(store, shard=(0, 3), resume={**state, "rows_consumed": 7}, **KW)


def test_a_damaged_or_cut_state_is_one_line_naming_its_key_and_a_state_through_json_or_numpy_resumes(store):
    import json

    with h5stream.open(store, shard=(1, 4), **KW) as s:
        it = iter(s)
        next(it), next(it)
        state = s.state()
        rest = [_ids(x) for x, _ in it]
    damaged = [("epoch", "1"), ("batch", None), ("seed", 17.5), ("rows_per_fill", "x"), ("shuffle", "yes"),
               ("rows_consumed", [3]), ("shard_count", 0), ("shard_index", 4)]
    for key, value in damaged:
        for how in ("open", "restore"):
            with pytest.raises(ConfigError, match=rf"cannot resume: the state's '?{key}'? .*Stream\.state\(\)"):
                if how == "open":
                    h5stream.open(store, shard=(1, 4), resume={**state, key: value}, **KW).close()
                else:
                    with h5stream.open(store, shard=(1, 4), **KW) as s:
                        s.restore({**state, key: value})
    for key in ("batch_size", "rows", "rows_consumed", "stages", "shuffle", "seed"):
        cut = {k: v for k, v in state.items() if k != key}
        with pytest.raises(ConfigError, match=rf"the state \(version 3\) has no '{key}'; it was cut or edited"):
            h5stream.open(store, shard=(1, 4), resume=cut, **KW).close()
    as_json = json.loads(json.dumps(state))
    as_numpy = {k: np.int64(v) if isinstance(v, int) else v for k, v in state.items()}
    for again in (as_json, as_numpy):
        with h5stream.open(store, shard=(1, 4), resume=again, **KW) as r:
            got = [_ids(x) for x, _ in r]
        assert len(got) == len(rest) and all(np.array_equal(a, b) for a, b in zip(got, rest))


def test_a_version_1_state_finishes_its_epoch_in_its_old_order_then_the_global_order_follows(store):
    with h5stream.open(store, shard=(1, 4), **KW) as s:
        it = iter(s)
        next(it), next(it)
        v2 = s.state()
    v1 = {k: v for k, v in v2.items() if k not in ("stages", "rows_consumed")} | {"version": 1}
    fill, unit = v2["rows_per_fill"], v2["unit_rows"]
    old = shard_layout(ROWS, 32, fill, 40, 17, 0, shard=(1, 4), unit_rows=unit).order()
    with h5stream.open(store, shard=(1, 4), resume=v1, **KW) as r:
        it = iter(r)
        first = _ids(next(it)[0])
        assert r.state()["version"] == 1  # still the old order: only this shard continues it
        rest = np.concatenate([first] + [_ids(x) for x, _ in it])
        assert np.array_equal(rest, old[80:])
        assert r.state()["version"] == 3 and r.state()["stages"] == []
        nxt = np.concatenate([_ids(x) for x, _ in r])
        assert np.array_equal(nxt, r.epoch_order(1)) and np.array_equal(nxt, epoch_layout(
            ROWS, 32, fill, 40, 17, 1, shard=(1, 4), unit_rows=unit).order())
    with pytest.raises(ConfigError, match=r"shard=\(1, 4\)"):
        h5stream.open(store, shard=(1, 3), resume=v1, **KW)


@pytest.mark.usefixtures("no_leaks")
def test_adapters_and_a_feeder_process_continue_a_state_of_another_count(store):
    from h5stream.adapters._passes import passes_for

    kw = dict(KW, memory_budget="300MiB", rows_per_fill=256, augment=h5stream.Augment(rescale=1.0), workers=1)
    with h5stream.open(store, shard=(0, 2), **kw) as s:
        it = iter(s)
        for _ in range(4):
            next(it)
        state = s.state()
    with h5stream.open(store, shard=(1, 3), resume=state, **kw) as inline:
        expected = [_ids(x) for x, _ in inline]
    with h5stream.open(store, shard=(1, 3), resume=state, feeder=True, **kw) as fed:
        passes_for(fed).restore(state)  # what ResumeCallback does with the state it saved: accepted in place
        got = [_ids(x) for x, _ in fed]
    assert len(got) == len(expected) and all(np.array_equal(a, b) for a, b in zip(got, expected))


def test_a_rest_that_gives_no_batch_to_the_new_shards_starts_the_next_epoch(store):
    kw = dict(KW, drop_remainder=True)
    with h5stream.open(store, shard=(3, 4), **kw) as s:
        assert len(s) == ROWS // (4 * 40)
        it = iter(s)
        for _ in range(len(s) - 1):
            next(it)
        state = s.state()
    left = ROWS - 4 * (len(s) - 1) * 40
    assert 0 < left < 7 * 40  # 7 shards get no full batch of what is left
    with h5stream.open(store, shard=(6, 7), resume=state, **kw) as r, \
            h5stream.open(store, shard=(6, 7), **kw) as fresh:
        assert r.epoch == 1 and r.state()["batch"] == 0
        assert sum(1 for _ in fresh) == len(fresh)
        got, want = [_ids(x) for x, _ in r], [_ids(x) for x, _ in fresh]
        assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))


def test_a_version_2_state_inside_a_later_epoch_finishes_it_in_its_drawn_fills_then_chained_fills_follow(store):
    """States of version 2 were saved when every epoch's fills were drawn anew: inside epoch 1 such a state must
    finish epoch 1 in that order (on its shard count or another, every row once), and epoch 2 is today's."""
    with h5stream.open(store, shard=(1, 2), **KW) as s:
        it = iter(s)
        next(it), next(it)
        v2 = {**s.state(), "epoch": 1, "version": 2}  # the same position, one epoch on, as version 2 saved it
    fill, unit = v2["rows_per_fill"], v2["unit_rows"]

    def lay(epoch, shard, stages=(), chained=True):
        return epoch_layout(ROWS, 32, fill, 40, 17, epoch, shard=shard, unit_rows=unit, stages=stages,
                            chained=chained).order()

    assert not np.array_equal(lay(1, None, chained=False), lay(1, None))  # the two orders differ in epoch 1
    with h5stream.open(store, shard=(1, 2), **KW) as s:
        with pytest.raises(ConfigError, match=r"version 2 saved inside epoch 1 .* resume=state"):
            s.restore(v2)  # an open stream lays out today's fills: only open(resume=) finishes the drawn ones
    with h5stream.open(store, shard=(1, 2), resume=v2, **KW) as r:
        it = iter(r)
        first = _ids(next(it)[0])
        assert r.state()["version"] == 2  # still the drawn fills: a later resume finishes them too
        rest = np.concatenate([first] + [_ids(x) for x, _ in it])
        assert np.array_equal(rest, lay(1, (1, 2), chained=False)[80:])
        assert r.state()["version"] == 3 and r.state()["epoch"] == 2
        assert np.array_equal(np.concatenate([_ids(x) for x, _ in r]), lay(2, (1, 2)))
    served = [lay(1, (i, 2), chained=False)[:80] for i in range(2)]
    for k in range(3):
        with h5stream.open(store, shard=(k, 3), resume=v2, **KW) as r:
            served += [_ids(x) for x, _ in r]
    union = np.concatenate(served)
    assert len(union) == len(np.unique(union)) == ROWS


def test_a_state_of_another_store_with_as_many_rows_or_of_parts_in_another_order_is_refused(store, tmp_path):
    """The state names its store (``store``: rows, row shape, encoding and sampled block checksums): a state of
    another store of as many rows, or of a set whose parts are listed in another order, used to resume the other
    store's epoch at the saved position without a word; the same rows written again resume as before."""
    import json

    from h5stream.store.writer import write_arrays

    with h5py_file(store) as (images, labels):
        twin, other = tmp_path / "twin.h5", tmp_path / "other.h5"
        write_arrays(twin, images, labels, block_rows=32)  # the same rows, written again
        write_arrays(other, images[::-1], labels[::-1], block_rows=32)  # as many rows, other ones
        half = len(images) // 2
        names = [str(c) for c in range(int(labels.max()) + 1)]
        write_arrays(tmp_path / "a.h5", images[:half], labels[:half], block_rows=32, class_names=names)
        write_arrays(tmp_path / "b.h5", images[half:], labels[half:], block_rows=32, class_names=names)
    with h5stream.open(store, **KW) as s:
        it = iter(s)
        next(it), next(it)
        state = json.loads(json.dumps(s.state()))
        rest = [_ids(x) for x, _ in it]
    assert isinstance(state["store"], str)
    with h5stream.open(twin, resume=state, **KW) as r:
        assert all(np.array_equal(a, _ids(x)) for a, (x, _) in zip(rest, r, strict=True))
    for how in ("open", "restore"):
        with pytest.raises(ConfigError, match="cannot resume: the state was taken from another store than"):
            if how == "open":
                h5stream.open(other, resume=state, **KW).close()
            else:
                with h5stream.open(other, **KW) as s:
                    s.restore(state)
    parts = [str(tmp_path / "a.h5"), str(tmp_path / "b.h5")]
    with h5stream.open(parts, **KW) as s:
        next(iter(s))
        set_state = s.state()
    with h5stream.open(parts, resume=set_state, **KW):
        pass
    with pytest.raises(ConfigError, match="its parts in another order"):
        h5stream.open(parts[::-1], resume=set_state, **KW).close()
    legacy = {k: v for k, v in state.items() if k != "store"}  # a state saved before states named their store
    with h5stream.open(store, resume=legacy, **KW) as r:
        assert all(np.array_equal(a, _ids(x)) for a, (x, _) in zip(rest, r, strict=True))


@contextlib.contextmanager
def h5py_file(path):
    import h5py

    with h5py.File(path, "r") as f:
        yield f["images"][:], f["labels"][:]
