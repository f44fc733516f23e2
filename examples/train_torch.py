"""PyTorch training fed by h5stream, batches already on the device: class folders -> store -> small CNN.

    .venv/bin/python examples/train_torch.py                         # generated images, device cuda if there is one
    .venv/bin/python examples/train_torch.py --device cpu --quick    # what CI runs
    .venv/bin/python examples/train_torch.py --data photos/ --compile --epochs 10

``stream.torch(device=...)`` uploads every batch ahead of the training loop
from h5stream's own thread (on its own CUDA stream, from page-locked memory)
and converts it there: uint8 crosses the bus, then ``dtype``, ``layout`` and
``mean`` / ``std`` run on the device.  ``drop_remainder=True`` makes every
batch the same shape, which CUDA graphs need: ``--compile`` wraps the model in
``torch.compile(mode="reduce-overhead")`` (CUDA graphs on a GPU).
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile
import time

import h5stream
from h5stream import cli
from h5stream.samples import make_class_folder


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", help="folder of class subfolders (default: generate sample images)")
    p.add_argument("--work", help="where to put the store and generated images (default: a temporary folder)")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--size", type=int, default=32, help="image side after ingest (pixels)")
    p.add_argument("--compile", action="store_true", help='torch.compile(model, mode="reduce-overhead")')
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny data, one epoch (CI)")
    args = p.parse_args(argv)
    if args.quick:
        args.epochs, args.batch_size, args.size = 1, 16, 24

    import torch

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    work = args.work
    if work is None:  # a folder of our own: removed when the script exits (--work keeps yours)
        work = tempfile.mkdtemp(prefix="h5stream-torch-")
        atexit.register(shutil.rmtree, work, ignore_errors=True)
    src = args.data
    if src is None:
        src = os.path.join(work, "images")
        make_class_folder(src, classes=["cat", "dog", "fox"], per_class=16 if args.quick else 200, seed=args.seed)
    store = os.path.join(work, "train.h5")
    if cli.main(["ingest", src, store, "--size", str(args.size), "--overwrite"]
                + (["--workers", "0"] if args.quick else [])) != 0:
        raise SystemExit(f"ingest of {src} failed")

    torch.manual_seed(args.seed)
    # drop_remainder: every batch has batch_size rows, so the model sees one static shape.
    with h5stream.open(store, batch_size=args.batch_size, seed=args.seed, drop_remainder=True) as stream:
        classes = len(stream.class_names)
        channels = stream.meta.image_shape[-1]
        batches = stream.torch(
            device=device,
            dtype="float16" if device.type == "cuda" else "float32",
            layout="channels_last",  # NCHW shape, NHWC memory: what convolutions run fastest on
            mean=127.5, std=64.0,  # pixel units, applied on the device
        )
        model = torch.nn.Sequential(
            torch.nn.Conv2d(channels, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(), torch.nn.Linear(32, classes),
        ).to(device, memory_format=torch.channels_last)
        if device.type == "cuda":
            model = model.half()
        step_model = torch.compile(model, mode="reduce-overhead") if args.compile else model
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        print(f"{stream.meta.rows} images {stream.meta.image_shape}, {classes} classes, device {device}, "
              f"{len(batches)} batches of {args.batch_size} per epoch")
        for epoch in range(args.epochs):
            t0, seen, correct = time.perf_counter(), 0, 0
            for x, y in batches:  # already on the device, converted
                logits = step_model(x)
                loss = torch.nn.functional.cross_entropy(logits.float(), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                seen += len(y)
                correct += int((logits.argmax(1) == y).sum())
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dt = time.perf_counter() - t0
            print(f"epoch {epoch + 1}: loss {loss.item():.3f}, {seen / dt:.0f} images/s, "
                  f"upload waited {batches.stats()['wait_s']:.2f} s in total")
        print(f"train accuracy: {correct / max(seen, 1):.2f}")
        batches.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
