"""torch adapter on a device: ``stream.torch(device=...)``, its uploads ahead, conversions, pinning, DDP.

Runs without TensorFlow.  ``device="cpu"`` runs the whole pipeline (uploads
ahead, ring, conversions on the device); the CUDA-only parts (streams,
events, page-locking) run where CUDA exists and are skipped elsewhere, but
the page-locking bookkeeping is checked everywhere with a recording
registrar.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import h5stream  # noqa: E402
from h5stream.adapters._host_pins import HostPins  # noqa: E402
from h5stream.adapters.torch_device import convert, device_options  # noqa: E402
from h5stream.errors import ChecksumError, ConfigError, StreamClosedError, StreamIterationError  # noqa: E402
from h5stream.store.writer import write_arrays  # noqa: E402
from conftest import collect  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_leaks")

ROWS, BATCH = 100, 16
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device: the stream/event/page-locked path needs one")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """100 rows of 4x5x3 whose pixels encode the row id per channel; label = row id; 8-row blocks."""
    path = str(tmp_path_factory.mktemp("torch") / "rows.h5")
    ids = np.arange(ROWS)
    images = np.empty((ROWS, 4, 5, 3), np.uint8)
    for c in range(3):
        images[..., c] = (ids[:, None, None] * (c + 1) + np.arange(20).reshape(4, 5)) % 251
    write_arrays(path, images, ids.astype(np.int64), block_rows=8, storage_order="sorted")
    return path


def h5stream_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("h5stream")]


def reference(x: np.ndarray, dtype=None, layout="NHWC", mean=None, std=None) -> torch.Tensor:
    """What ``convert`` must give, computed with numpy (float32 arithmetic, cast last)."""
    normalising = mean is not None or std is not None
    if normalising:
        x = x.astype(np.float32)
        if mean is not None:
            x = x - np.asarray(mean, np.float32)
        if std is not None:
            x = x / np.asarray(std, np.float32)
    if layout != "NHWC":
        x = x.transpose(0, 3, 1, 2)
    t = torch.from_numpy(np.ascontiguousarray(x))
    dtype = dtype if dtype is not None else (torch.float32 if normalising else None)
    return t.to(dtype) if dtype is not None else t


CONVERSIONS = [
    dict(),
    dict(dtype="float32"),
    dict(dtype="float16", layout="NCHW"),
    dict(dtype="bfloat16", layout="channels_last", mean=127.5, std=64.0),
    dict(layout="NCHW", mean=(120.0, 110.0, 100.0), std=(50.0, 60.0, 70.0)),
    dict(dtype="uint8", layout="channels_last"),
]


@pytest.mark.parametrize("opts", CONVERSIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "as-stored")
def test_convert_matches_a_numpy_reference(opts):
    x = np.random.default_rng(0).integers(0, 256, (5, 4, 6, 3), dtype=np.uint8)
    got = convert(torch.from_numpy(x), device_options("cpu", channels=3, **opts))
    want = reference(x, device_options("cpu", channels=3, **opts).dtype, opts.get("layout", "NHWC"),
                     opts.get("mean"), opts.get("std"))
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want)
    if opts.get("layout") == "channels_last":
        assert got.is_contiguous(memory_format=torch.channels_last) and got.shape == (5, 3, 4, 6)


@pytest.mark.parametrize("opts", CONVERSIONS[1:5], ids=["f32", "f16-nchw", "bf16-cl-norm", "norm-nchw"])
def test_device_cpu_gives_the_plain_adapters_batches_converted(store, opts):
    """Two epochs, with the uploads ahead: batch for batch what the plain adapter yields from a stream of the
    same seed, after the same conversion."""
    resolved = device_options("cpu", channels=3, **opts)
    with h5stream.open(store, batch_size=BATCH, seed=7) as plain, h5stream.open(store, batch_size=BATCH, seed=7) as s:
        ds = s.torch(device="cpu", **opts)
        assert len(ds) == len(plain.torch())
        for _ in range(2):
            want = [(reference(x.numpy(), resolved.dtype, resolved.layout, resolved.mean, resolved.std), y)
                    for x, y in plain.torch()]
            got = list(ds)
            assert len(got) == len(want) == len(plain)
            for (gx, gy), (wx, wy) in zip(got, want):
                assert gx.device.type == "cpu" and gx.dtype == wx.dtype
                assert torch.equal(gx, wx) and torch.equal(gy, wy)
        assert ds.stats()["batches"] == 2 * len(plain)


@pytest.mark.parametrize("batch_size", [2, BATCH])
def test_a_stream_without_labels_gives_its_images_alone_on_the_device(store, batch_size):
    """``label_mode=None`` (what ``predict`` takes): each batch is the images tensor alone, as the plain adapter
    yields it.  A 2-row batch once came out as one image plus another as its "labels"."""
    opened = [h5stream.open(store, batch_size=batch_size, seed=5, label_mode=None) for _ in range(2)]
    with opened[0] as plain, opened[1] as s:
        want = list(plain.torch())
        got = list(s.torch(device="cpu"))
        assert len(got) == len(want) == len(plain)
        for g, w in zip(got, want):
            assert isinstance(g, torch.Tensor) and g.shape == (len(w), 4, 5, 3) and torch.equal(g, w)


def test_an_abandoned_pass_is_replayed_whole_despite_the_read_ahead(store):
    """The uploads read ahead; a pass left after two batches loses none: the next pass serves the whole epoch the
    left one began, as the plain adapter does."""
    with h5stream.open(store, batch_size=BATCH, seed=3) as s:
        ds = s.torch(device="cpu", batches_ahead=3)
        it = iter(ds)
        first = [next(it)[1] for _ in range(2)]
        again = [y for _, y in ds]  # a new iter replaces the live one
        assert len(again) == len(s)
        np.testing.assert_array_equal(torch.cat(again).numpy(), s.epoch_order(0))
        np.testing.assert_array_equal(torch.cat(first).numpy(), s.epoch_order(0)[:2 * BATCH])


@pytest.mark.parametrize("device", [None, "cpu"], ids=["plain", "device"])
def test_an_iteration_replaced_by_a_newer_one_raises_instead_of_ending_short(store, device):
    """A loop still running over an iteration that a newer ``iter(ds)`` replaced: its next ``next()`` raises
    ``StreamIterationError`` saying how many batches it had, not a quiet ``StopIteration`` (a short epoch).  The
    newer iteration is whole, and the stream goes on."""
    with h5stream.open(store, batch_size=BATCH, seed=2) as s:
        ds = s.torch(device=device)
        old = iter(ds)
        next(old)
        newer = [y for _, y in ds]
        assert len(newer) == len(s)
        np.testing.assert_array_equal(torch.cat(newer).numpy(), s.epoch_order(0))
        with pytest.raises(StreamIterationError, match=rf"replaced after 1 of its {len(s)} batches by a newer pass"):
            next(old)
        assert len(list(ds)) == len(s)


@pytest.mark.parametrize("device", [None, "cpu"], ids=["plain", "device"])
def test_a_checkpoint_of_ds_state_mid_epoch_resumes_with_the_next_batch_despite_the_uploads_ahead(store, device):
    """A training loop checkpoints ``ds.state()`` after 3 batches: a stream opened with ``resume=`` it serves
    exactly the batches that were next, though the device adapter had read 3 more ahead (``stream.state()``
    is past them: a resume from it would skip them)."""
    with h5stream.open(store, batch_size=BATCH, seed=6) as s:
        ds = s.torch(device=device, **({"batches_ahead": 3} if device else {}))
        it = iter(ds)
        first = [next(it)[1] for _ in range(3)]
        saved = ds.state()
        assert s.state()["batch"] == (6 if device else 3)
    with h5stream.open(store, batch_size=BATCH, seed=6, resume=saved) as s:
        rest = [y for _, y in s.torch(device=device)]
    np.testing.assert_array_equal(torch.cat(first + rest[: len(s) - 3]).numpy(), s.epoch_order(0))


def test_a_pass_ends_at_close_at_stream_close_and_when_dropped(store):
    with h5stream.open(store, batch_size=BATCH, seed=1) as s:
        # close() of the dataset, mid-pass: it refuses from then on, and the stream stays usable
        ds = s.torch(device="cpu")
        it = iter(ds)
        next(it)
        ds.close()
        with pytest.raises(StreamClosedError):
            list(ds)
        assert len(list(s.torch(device="cpu"))) == len(s)
        # stream.close() mid-pass: the next next() raises
        it = iter(s.torch(device="cpu"))
        next(it)
        s.close()
        with pytest.raises(StreamClosedError):
            next(it)
    # the stream and the dataset dropped with a pass under way: all of it is collected
    s = h5stream.open(store, batch_size=BATCH, seed=1)
    ds = s.torch(device="cpu")
    it = iter(ds)
    next(it)
    alive = weakref.ref(s)
    del s, ds, it
    collect(lambda: alive() is None)
    assert alive() is None


def test_the_uploads_run_in_no_thread_and_give_the_in_process_pools_batches_from_a_feeder(store):
    """The training loop's ``next()`` issues the uploads ahead: with the feeder no h5stream thread is left in the
    process, and the batches are those of the same pool run in the process, for two epochs."""
    aug = h5stream.Augment(horizontal_flip=True)
    opts = dict(dtype="float32", layout="channels_last", mean=127.5, std=64.0)
    with h5stream.open(store, batch_size=BATCH, seed=4, workers=1, augment=aug) as a:
        in_process = a.torch(device="cpu", **opts)
        want = [list(in_process) for _ in range(2)]
        in_process.close()
    with h5stream.open(store, batch_size=BATCH, seed=4, workers=1, augment=aug, feeder=True) as b:
        fed = b.torch(device="cpu", **opts)
        for epoch in range(2):
            for (wx, wy), (gx, gy) in zip(want[epoch], fed, strict=True):
                assert torch.equal(wx, gx) and torch.equal(wy, gy)
                # the feeder process holds the reader and the pool, and nothing uploads in a thread
                assert h5stream_threads() == []
        assert fed.stats()["batches"] == 2 * len(b)


@pytest.mark.parametrize("feeder", [False, True], ids=["pool", "feeder"])
def test_plain_workers_give_the_tensors_of_workers_0_on_the_device(store, feeder):
    """``open(path, workers=N[, feeder=True])`` with no augment, then ``torch(device=...)``: the uint8 tensors
    (and float ones converted on the device) of the stream read in the training process, for two epochs; with
    the feeder no h5stream thread is left in the training process."""
    opts = [dict(), dict(dtype="float32", layout="NCHW", mean=127.5, std=64.0)]
    with h5stream.open(store, batch_size=BATCH, seed=4) as a:
        want = []
        for o in opts:
            ds = a.torch(device="cpu", **o)
            want.append([[(x.clone(), y.clone()) for x, y in ds] for _ in range(2)])
            ds.close()
    with h5stream.open(store, batch_size=BATCH, seed=4, workers=2, feeder=feeder) as b:
        for o, expected in zip(opts, want):
            ds = b.torch(device="cpu", **o)
            for epoch in range(2):
                for (wx, wy), (gx, gy) in zip(expected[epoch], ds, strict=True):
                    assert gx.dtype == wx.dtype == (torch.uint8 if not o else torch.float32)
                    assert torch.equal(wx, gx) and torch.equal(wy, gy)
                    if feeder:
                        assert h5stream_threads() == []
            ds.close()


def test_a_read_error_comes_after_exactly_the_batches_before_it_on_the_device(tmp_path):
    """A block that fails its checksum mid-epoch: the device adapter hands over exactly the batches the plain
    stream yields before the error, then raises the same ChecksumError."""
    import h5py

    path = str(tmp_path / "bad.h5")
    rng = np.random.default_rng(0)
    write_arrays(path, rng.integers(0, 256, (160, 6, 6, 3), dtype=np.uint8), np.arange(160), block_rows=8,
                 storage_order="sorted")
    kw = dict(batch_size=8, seed=2, rows_per_fill=32)
    with h5stream.open(path, **kw) as s:
        clean = [(x.copy(), y.copy()) for x, y in s]
    with h5py.File(path, "r") as f:
        info = f["images"].id.get_chunk_info(11)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset)
        fh.write(b"\xa5" * 16)
    plain = []
    with pytest.raises(ChecksumError) as plain_err, h5stream.open(path, **kw) as s:
        for _, y in s:
            plain.append(y.copy())
    assert 0 < len(plain) < len(clean)
    got = []
    with pytest.raises(ChecksumError) as err, h5stream.open(path, **kw) as s:
        for x, y in s.torch(device="cpu"):
            i = len(got)
            assert np.array_equal(x.numpy(), clean[i][0]) and np.array_equal(y.numpy(), clean[i][1])
            got.append(y)
    assert len(got) == len(plain) and str(err.value) == str(plain_err.value)


def test_page_locking_registers_the_streams_own_batch_memory_once(store):
    """No second host copy: every batch lies in memory registered once per allocation of the stream (its
    recycled batch arrays), not per batch, and all of it is unregistered at the end."""
    calls = {"register": [], "unregister": []}
    pins = HostPins(register=lambda p, n: calls["register"].append((p, n)),
                    unregister=lambda p: calls["unregister"].append(p))
    with h5stream.open(store, batch_size=BATCH, seed=2, memory_budget="32MiB") as s:
        n_batches = 0
        for _ in range(10):
            for x, _ in s:
                assert pins.pin(x)
                ptr = x.ctypes.data
                assert any(p <= ptr and ptr + x.nbytes <= p + n for p, n in pins.pinned.items())
                n_batches += 1
                del x
        assert len(calls["register"]) <= s.plan.reader_batches < n_batches
        assert sum(n for _, n in calls["register"]) <= s.plan.batches_bytes
    collect()
    pins.close()
    assert sorted(calls["unregister"]) == sorted(p for p, _ in calls["register"])
    assert pins.pinned == {}


@pytest.mark.parametrize("feeder", [False, True])
def test_page_locking_registers_each_output_slot_of_the_workers_once(store, feeder):
    """With workers, batches are lent from the pool's output slots, each batch a fresh array on its slot: what is
    registered is the slot (its long-lived outermost array), once, however many batches it carries."""
    calls = {"register": [], "unregister": []}
    pins = HostPins(register=lambda p, n: calls["register"].append((p, n)),
                    unregister=lambda p: calls["unregister"].append(p))
    aug = h5stream.Augment(horizontal_flip=True)
    with h5stream.open(store, batch_size=BATCH, seed=2, memory_budget="300MiB", augment=aug, workers=1,
                       feeder=feeder) as s:
        n_batches = 0
        for _ in range(6):
            for x, _ in s:
                assert pins.pin(x)
                n_batches += 1
                del x
        registered = [p for p, _ in calls["register"]]
        assert len(registered) == len(set(registered)) <= s.plan.out_slots + s.plan.consumer_sets < n_batches
        assert calls["unregister"] == []  # the slots live as long as the stream
    pins.close()
    assert sorted(calls["unregister"]) == sorted(registered) and pins.pinned == {}


def test_page_locking_falls_back_to_pageable_memory_when_registering_fails():
    def refuse(ptr, nbytes):
        raise RuntimeError("cudaErrorNotSupported")

    pins = HostPins(register=refuse, unregister=lambda p: None)
    a = np.zeros((4, 1024), np.uint8)
    assert not pins.pin(a[1:]) and not pins.pin(a)  # the same allocation: tried once
    assert pins.failures == 1 and pins.pinned == {}


@pytest.mark.parametrize("kwargs, match", [
    (dict(device="tpu9"), "not a torch device"),
    (dict(device="cpu", dtype="int7"), "dtype"),
    (dict(device="cpu", layout="CHW"), "layout"),
    (dict(device="cpu", dtype="uint8", mean=1.0), "cannot hold normalised"),
    (dict(device="cpu", mean=(1.0, 2.0)), "2 values for images of 3 channels"),
    (dict(device="cpu", std=0), "std must be > 0"),
    (dict(device="cpu", batches_ahead=0), "batches_ahead"),
    (dict(device="cpu", upload="thread"), r"^stream.torch\(upload='thread'\): the upload option was removed; the "
                                          r"default does the same .*: drop upload=$"),
    (dict(device="cpu", pin=True), "unknown option"),
    (dict(dtype="float32"), "give device="),
] + ([] if CUDA else [(dict(device="cuda"), "sees no CUDA device")])
  + ([] if torch.backends.mps.is_available() else [(dict(device="mps"), r"cannot use a mps device \(torch\.backends")])
  + ([] if torch.xpu.is_available() else [(dict(device="xpu"), "cannot use a xpu device")]))
def test_bad_device_options_are_refused_with_the_fix(store, kwargs, match):
    with h5stream.open(store, batch_size=BATCH, seed=0) as s:
        with pytest.raises(ConfigError, match=match) as info:
            s.torch(**kwargs)
    assert "\n" not in str(info.value)


def test_a_dataloader_that_would_batch_again_is_refused(store):
    with h5stream.open(store, batch_size=BATCH, seed=0) as s:
        with pytest.raises(ConfigError, match="batches the stream's batches again"):
            next(iter(torch.utils.data.DataLoader(s.torch(device="cpu"))))
        got = list(torch.utils.data.DataLoader(s.torch(device="cpu"), batch_size=None))
        assert len(got) == len(s)


def assert_cuda_batches_equal(cpu, gpu) -> None:
    """Two epochs of the CUDA dataset ``gpu`` equal the CPU dataset ``cpu``'s, from page-locked memory, all of it
    unregistered at ``close()``."""
    for _ in range(2):
        for (cx, cy), (gx, gy) in zip(cpu, gpu, strict=True):
            assert gx.is_cuda and gy.is_cuda
            assert torch.equal(gx.cpu(), cx) and torch.equal(gy.cpu(), cy)
    stats = gpu.stats()
    assert stats["pinned_bytes"] > 0 and stats["pin_failures"] == 0
    gpu.close()
    assert gpu.stats()["pinned_bytes"] == 0


@needs_cuda
def test_cuda_batches_equal_the_cpu_pipelines_and_come_from_page_locked_memory(store):
    opts = dict(dtype="float16", layout="channels_last", mean=(120.0, 110.0, 100.0), std=64.0)
    with h5stream.open(store, batch_size=BATCH, seed=5) as a, h5stream.open(store, batch_size=BATCH, seed=5) as b:
        cpu, gpu = a.torch(device="cpu", **opts), b.torch(device="cuda", **opts)
        assert_cuda_batches_equal(cpu, gpu)


@needs_cuda
@pytest.mark.parametrize("augmented", [True, False], ids=["augment", "plain"])
@pytest.mark.parametrize("feeder", [False, True], ids=["pool", "feeder"])
def test_cuda_batches_made_in_the_pools_shared_slots_equal_the_cpu_pipelines(store, feeder, augmented):
    """The worker pool's shared-memory output slots (mapped by the feeder's trainer side, with the feeder) are
    page-locked in place and uploaded: the same batches as the CPU pipeline of the same pool, two epochs; with no
    augment too (the workers copy the rows into the slots)."""
    opts = dict(dtype="float32", layout="channels_last", mean=127.5, std=64.0)
    pool = dict(batch_size=BATCH, seed=5, workers=2,
                augment=h5stream.Augment(horizontal_flip=True) if augmented else None)
    with h5stream.open(store, **pool) as a, h5stream.open(store, **pool, feeder=feeder) as b:
        cpu, gpu = a.torch(device="cpu", **opts), b.torch(device="cuda", **opts)
        assert_cuda_batches_equal(cpu, gpu)


# -- data-parallel with a real launcher -----------------------------------------------------------------------
DDP_WORKER = r'''
import json, os, sys
import torch, torch.distributed as dist
torch.set_num_threads(1)
import h5stream

path, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(60, 1)))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
seen = []
with h5stream.open(path, batch_size=16, seed=11, shard=(rank, world)) as s:
    ds = s.torch(device="cpu", dtype="float32", layout="NCHW", mean=127.5, std=64.0)
    for epoch in range(2):
        rows = []
        for x, y in ds:
            loss = ((model(x)[:, 0] - y.float() / 100) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rows.append(y.tolist())
        seen.append(rows)
with open(out, "w") as fh:
    json.dump({"rank": rank, "world": world, "epochs": seen, "loss": float(loss)}, fh)
dist.destroy_process_group()
'''


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow  # a multi-process training run (make test-all)
def test_torchrun_ddp_two_ranks_see_every_row_once_per_epoch(store, tmp_path):
    script = tmp_path / "ddp_worker.py"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.environ.get("PYTHONPATH", "")]))
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    # Each rank writes its own file: the launcher substitutes nothing, so the worker adds its rank.
    script.write_text(DDP_WORKER.replace("path, out = sys.argv[1], sys.argv[2]",
                                         "path, out = sys.argv[1], sys.argv[2] + f'{os.environ[\"RANK\"]}.json'"))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
         "--master_port", str(_free_port()), str(script), store, str(tmp_path / "rank")],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    results = [json.loads(o.read_text()) for o in outs]
    for epoch in range(2):
        rows = [r for res in results for batch in res["epochs"][epoch] for r in batch]
        assert sorted(rows) == list(range(ROWS)), f"epoch {epoch}: not every row exactly once across ranks"
    for res in results:  # the same batches as a single process streaming that shard
        assert np.isfinite(res["loss"])
        with h5stream.open(store, batch_size=16, seed=11, shard=(res["rank"], 2)) as s:
            for epoch in range(2):
                assert res["epochs"][epoch] == [y.tolist() for _, y in s]


def test_the_torch_example_trains_on_cpu_with_static_shapes(tmp_path):
    """examples/train_torch.py --device cpu --quick, as a user runs it (drop_remainder: one batch shape)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, os.path.join(root, "examples", "train_torch.py"), "--device", "cpu",
                           "--quick", "--work", str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "3 batches of 16 per epoch" in proc.stdout and "train accuracy:" in proc.stdout


@pytest.mark.slow
def test_the_gpu_benchmark_runs_small_and_prints_json(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu", "--device", "cpu", "--rows", "256", "--size", "16",
                           "--batch-size", "32", "--steps", "10", "--torch-threads", "1", "--python-work", "2000",
                           "--breakdown-workers", "0,1", "--breakdown-batches", "32,256", "--workers", "1",
                           "--tv-images", "64", "--data", str(tmp_path), "--json"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert set(result["loaders"]) == {"limit", "ram", "h5stream cpu", "h5stream device", "h5stream device feeder",
                                      "torchvision"}
    assert result["workers"] == 1 and result["augment"]["horizontal_flip"] is True
    assert result["loaders"]["h5stream device feeder"]["images_per_s"] > 0
    # the per-thread table: workers 0 once, workers 1 without and with the feeder, for each batch size
    assert [(r["workers"], r["feeder"], r["batch_size"]) for r in result["breakdown"]] == [
        (0, False, 32), (0, False, 256), (1, False, 32), (1, False, 256), (1, True, 32), (1, True, 256)]
    assert result["loaders"]["h5stream device"]["images_per_s"] > 0
    assert result["python_step"]["device cpu"]["steps_per_s"] > 0
    assert result["python_step"]["device cpu, feeder"]["steps_per_s"] > 0
    small, too_big = result["breakdown"][:2]  # per thread of the training process; 256 rows give one batch of 256
    assert {"consumer", "reader", "total"} <= set(small["cpu_ms_per_batch"]) and "skipped" in too_big
    fed = result["breakdown"][4]["cpu_ms_per_batch"]  # the feeder: no h5stream thread left in the training process
    assert {"consumer", "total"} <= set(fed) and not {"reader", "io"} & set(fed)
