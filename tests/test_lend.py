"""Lent memory: a part is in use while anything refers to the array it was lent as, or to any view of it, whatever
the caller made of it; and a stream's batches obey that rule end to end (README: "a batch is yours")."""

from __future__ import annotations

import gc
import os
import mmap

import numpy as np
import pytest

import h5stream
from h5stream.memory.rawio import private_memory
from h5stream.memory.lend import ArrayArena, Lender
from h5stream.store.writer import write_arrays

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(1)
    path = tmp_path_factory.mktemp("lend") / "s.h5"
    write_arrays(path, rng.integers(0, 255, (200, 24, 24, 3), dtype=np.uint8), np.arange(200) % 5, block_rows=16)
    return path


def _lender(parts: int = 3, shape=(4, 5)) -> Lender:
    return Lender(private_memory(parts * int(np.prod(shape))), (parts, *shape), np.uint8)


DERIVED = {
    "slice": lambda a: a[1:3],
    "slice of a slice": lambda a: a[1:][0, 2:4],
    "element view": lambda a: a[2, 3, ...],
    "reshape": lambda a: a.reshape(-1),
    "transpose": lambda a: a.T,
    "dtype view": lambda a: a.view(np.int8),
    "asarray": lambda a: np.asarray(a),
    "memoryview": lambda a: memoryview(a),
    "memoryview of a slice": lambda a: memoryview(a[1:]),
    "broadcast": lambda a: np.broadcast_to(a[0], (7, 5)),
    "strided": lambda a: np.lib.stride_tricks.as_strided(a[0], (2, 2), (5, 1)),
}


@pytest.mark.parametrize("make", DERIVED.values(), ids=DERIVED.keys())
def test_anything_made_from_a_lent_array_keeps_its_part_in_use(make):
    lender = _lender()
    derived = make(lender.lend(1))  # the lent array itself is dropped at once
    assert lender.in_use(1) and not lender.in_use(0) and not lender.in_use(2)
    del derived
    assert not lender.in_use(1)


def test_a_torch_tensor_made_from_a_lent_array_keeps_its_part_in_use():
    torch = pytest.importorskip("torch")
    lender = _lender()
    tensor = torch.from_numpy(lender.lend(2)[1:])
    assert lender.in_use(2)
    tensor = tensor[0] * 1  # a new tensor of its own: the part is free
    assert not lender.in_use(2)
    del tensor


def test_the_owners_own_arrays_and_copies_do_not_keep_a_part():
    lender = _lender()
    own = lender.part(0)
    own[...] = 7
    copy = lender.lend(0).copy()
    assert not lender.in_use(0) and copy.sum() == 7 * 20
    assert np.shares_memory(own, lender.lend(0))  # the same memory, lent again


def test_a_part_in_a_reference_cycle_is_in_use_until_the_collector_breaks_it():
    lender = _lender()
    cycle: list = [lender.lend(0)]
    cycle.append(cycle)
    del cycle
    assert lender.in_use(0) or not gc.isenabled()
    gc.collect()
    assert not lender.in_use(0)


def test_a_lender_refuses_memory_too_small_for_its_parts():
    with pytest.raises(ValueError, match="needs 60 bytes, the buffer has 59"):
        Lender(mmap.mmap(-1, 59), (3, 4, 5), np.uint8)


def test_every_batch_lent_on_a_part_has_the_same_long_lived_outermost_array():
    """Page-locking registers the outermost array of a batch's memory once, and unregisters it when that array
    is freed: for a lent part it is the part's anchor, the same for every lend (not the fresh array of each),
    and it lives as long as the lender."""
    pytest.importorskip("torch")
    from h5stream.adapters._host_pins import owner_array

    lender = _lender()
    owner = owner_array(lender.lend(1)[2:])
    assert owner_array(lender.lend(1)[:1]) is owner and owner_array(lender.part(1)) is owner
    assert owner_array(lender.lend(2)) is not owner
    assert owner.ctypes.data == lender.part(1).ctypes.data and owner.nbytes == 20
    memory = np.zeros(60, np.uint8)
    on_array = Lender(memory, (3, 4, 5), np.uint8)  # parts of an array: that array is the outermost
    assert owner_array(on_array.lend(1)[1:]) is memory and owner_array(on_array.lend(2)) is memory


@pytest.mark.parametrize("workers", [0, 1])
def test_what_a_caller_keeps_of_a_batch_stays_intact_while_every_later_batch_reuses_the_memory(store, workers):
    """Each batch is dropped at once, but a slice of a slice of its images and a memoryview of its first row are
    kept: what they show is never overwritten by the batches after it (with workers: the pool's output slots;
    without: the reader's batch buffers)."""
    aug = h5stream.Augment(horizontal_flip=True, rotation_range=20)
    opts = dict(batch_size=32, memory_budget="300MiB", seed=3, augment=aug)
    with h5stream.open(store, workers=workers, **opts) as s:
        expected = [x.copy() for _ in range(2) for x, _ in s]
    with h5stream.open(store, workers=workers, **opts) as s:
        kept = []
        for _ in range(2):
            for x, _ in s:
                kept.append((x[1:][0, 2:5], memoryview(x[0])))
                del x
        stats = s.stats()
    for (part, row), want in zip(kept, expected, strict=True):
        assert np.array_equal(part, want[1:][0, 2:5]) and bytes(row) == want[0].tobytes()
    if workers:
        assert stats["copied_batches"] > 0  # the loop kept more than the lent slots: later batches were copies


def test_an_arena_takes_a_freed_buffer_without_asking_every_lent_one(monkeypatch):
    # A fill lends thousands of small batches at once: taking one must not ask each of them whether it is still
    # in use (that made the first batch of a 1M-row store of small rows wait 3 s in the allocator).
    arena = ArrayArena(4, (2,), np.uint8, max_sets=1000)
    held = [arena(4) for _ in range(1000)]
    for i, h in enumerate(held):
        h[:] = i % 251
    asked = []
    real = Lender.in_use
    monkeypatch.setattr(Lender, "in_use", lambda self, k: asked.append(k) or real(self, k))
    extra = arena(4)  # every buffer held: a fresh one, without asking the 1000
    assert asked == []
    address = held[500].__array_interface__["data"][0]
    del held[500]  # freed: the next batch reuses exactly that buffer, asking about it alone
    again = arena(4)
    assert again.__array_interface__["data"][0] == address
    assert len(asked) == 1
    again[:] = 255
    extra[:] = 255
    assert all((h == i % 251).all() for i, h in enumerate(held[:500] + [None] + held[500:]) if h is not None)


def _vm_flags(address: int) -> list[str]:
    """The ``VmFlags`` of the mapping of this process that holds ``address`` (``/proc/self/smaps``)."""
    inside = False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split(" ", 1)[0]
            if "-" in head and not head.endswith(":"):  # a mapping's first line: "start-end perms ..."
                start, end = (int(v, 16) for v in head.split("-"))
                inside = start <= address < end
            elif inside and line.startswith("VmFlags:"):
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"),
                    reason="no transparent huge pages on this platform")
def test_an_arena_buffer_is_advised_onto_huge_pages_once_written_and_taken_again():
    # Its first write faults ordinary pages in (huge ones would cost the first epoch more); once it is taken
    # again its pages exist, and the kernel may move them onto huge pages, where later copies cost less.
    arena = ArrayArena(64, (128, 128, 3), np.uint8, max_sets=2)  # 3 MiB a buffer, both in one mapping
    x = arena(64)
    x[...] = 7
    other = arena(64)  # the other buffer, taken once
    other[...] = 1
    address = x.__array_interface__["data"][0]
    assert "hg" not in _vm_flags(address)
    del x
    again = arena(64)
    assert again.__array_interface__["data"][0] == address  # the same buffer
    assert "hg" in _vm_flags(address)
    assert (again == 7).all()  # advice moves nothing a caller can see
    assert "hg" not in _vm_flags(other.__array_interface__["data"][0])


def _python_calls_while(action) -> list[str]:
    """The Python functions that run while ``action()`` runs (beyond ``action`` itself), by name."""
    import sys

    calls = []

    def profile(frame, event, arg):
        if event == "call":
            calls.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        action()
    finally:
        sys.setprofile(None)
    return calls[1:]  # the first is action itself


def test_dropping_a_batch_runs_no_python_code(store):
    """A batch the caller drops puts its buffer back on the arena's free list in C (``deque.append`` as the weak
    reference callback).  A Python callback (a lambda) was where a signal handler ran when the signal came as the
    caller dropped a batch, and an exception it raised was lost there, printed as "Exception ignored in:
    <function ArrayArena._freed.<locals>.<lambda>>": a Ctrl-C, or a SIGTERM handler's graceful shutdown, that did
    nothing (seen once in 150 SIGTERMs at random points of an epoch loop)."""
    with h5stream.open(store, batch_size=8, workers=0) as s:
        it = iter(s)
        held = {"x": next(it)[0]}
        next(it)

        def drop():
            del held["x"]

        assert _python_calls_while(drop) == []
        assert s.stats()["batches"] >= 2
