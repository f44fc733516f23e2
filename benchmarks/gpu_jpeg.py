"""Feeding a GPU from JPEGs: h5stream's JPEG store against torchvision's ``ImageFolder`` on the same JPEGs.

    python -m benchmarks.gpu_jpeg                  # cuda if torch sees one: ResNet-50, 224-px crops of 256-px rows
    python -m benchmarks.gpu_jpeg --device cpu --model small --photos 512 --size 72 --crop 64 --steps 20 --json

The data: ``--photos`` photo-like ~500x375 JPEGs (:func:`benchmarks.data.ensure_photos`, 4 classes) ingested at
``--size`` x ``--size`` px as a JPEG q90 store and as a raw store (:func:`benchmarks.encoded.ensure_kind`, cached
in ``--data``).  The JPEG store's rows are written out as files, one per row in a folder per class
(:func:`export_jpegs`): torchvision decodes the very bytes h5stream decodes.

Loaders, each for ``--steps`` training steps of the same model after ``--warmup`` steps not timed:

* ``limit`` -- one batch of ``--crop`` px images already on the device, reused: the model alone (``--model none``:
  no model, so the other rows are the loaders alone, each batch still converted and normalised on the device);
* ``h5stream jpeg`` -- ``stream.torch(device=...)`` of the JPEG store with ``Augment(output_size=(crop, crop),
  horizontal_flip=True)`` (torchvision's ``RandomResizedCrop`` scale and ratio; each row decoded at the reduced
  scale its crop allows) in ``--workers`` worker processes, normalised on the device;
* ``h5stream raw`` -- the same stream over the raw store of the same rows;
* ``torchvision`` -- ``ImageFolder`` over the exported JPEGs, ``RandomResizedCrop(crop)`` +
  ``RandomHorizontalFlip()`` + ``PILToTensor()``, ``DataLoader(num_workers=--workers, shuffle=True,
  pin_memory=<on CUDA>, persistent_workers=True)``, normalised on the device alike.

Per loader: images/s, its ratio to the limit, cores busy (this process and its children), mean GPU use (NVML, on
CUDA) and, for h5stream, its peak memory against its budget.  ``--rounds`` repeats the loaders (the order
rotating); the table gives each loader's median and the median of the same-round ratios to torchvision.
"""

from __future__ import annotations

import os
import sys

from benchmarks.harness import log, median, new_parser, run_cli

LOADERS = ("h5stream jpeg", "h5stream raw", "torchvision")


def export_jpegs(store: str, folder: str) -> str:
    """The JPEG store's rows as files ``folder/<class>/<row>.jpg`` (byte for byte, read with plain h5py); made once
    (a marker file says the folder is whole)."""
    import h5py

    from h5stream.store import schema
    from h5stream.store.meta import read_meta

    marker = os.path.join(folder, ".complete")
    if os.path.exists(marker):
        return folder
    meta = read_meta(store)
    with h5py.File(store, "r") as f:
        ends = f[schema.IMAGE_ENDS][:meta.rows]
        data = f[schema.IMAGE_BYTES][:int(ends[-1]) if len(ends) else 0]
        labels = f[schema.LABELS][:meta.rows]
    names = meta.class_names or [str(i) for i in range(int(labels.max()) + 1 if len(labels) else 0)]
    for name in names:
        os.makedirs(os.path.join(folder, name), exist_ok=True)
    start = 0
    for i, (end, label) in enumerate(zip(ends, labels)):
        with open(os.path.join(folder, names[int(label)], f"{i:07d}.jpg"), "wb") as out:
            out.write(data[start:int(end)].tobytes())
        start = int(end)
    open(marker, "w").close()
    return folder


def prepare(data: str, photos: int, size: int) -> dict:
    """The photos, both stores and the exported JPEGs (each cached in ``data``): ``{"h5stream jpeg": path,
    "h5stream raw": path, "folder": path}``."""
    from benchmarks.data import ensure_photos
    from benchmarks.encoded import ensure_kind

    os.makedirs(data, exist_ok=True)
    src = ensure_photos(data, photos)
    jpeg = ensure_kind(data, src, size, "jpeg q90")
    return {"h5stream jpeg": jpeg, "h5stream raw": ensure_kind(data, src, size, "raw"),
            "folder": export_jpegs(jpeg, os.path.join(data, f"exported-{os.path.basename(src)}-{size}-q90"))}


def torchvision_loader(torch, folder: str, crop: int, batch_size: int, workers: int, pin: bool):
    """torchvision's standard training input over ``folder``: or a row saying it is not installed."""
    try:
        import torchvision
    except ImportError:
        return None
    t = torchvision.transforms
    ds = torchvision.datasets.ImageFolder(folder, transform=t.Compose([
        t.RandomResizedCrop(crop), t.RandomHorizontalFlip(), t.PILToTensor()]))
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True, drop_last=True, num_workers=workers,
                                       pin_memory=pin, persistent_workers=workers > 0)


def run(args) -> dict:
    import torch

    import h5stream
    from benchmarks.gpu import (MEAN, STD, attempt, device_row, endless, make_model, timed, train_step)
    from benchmarks.harness import same_round_ratios

    if not 1 <= args.crop <= args.size:
        raise SystemExit(f"--crop {args.crop}: give a crop between 1 and --size ({args.size})")
    torch.set_num_threads(args.torch_threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    stores = prepare(args.data, args.photos, args.size)
    folder = stores["folder"]
    crop, bs, steps, warmup = args.crop, args.batch_size, args.steps, args.warmup
    amp = args.amp or ("bf16" if device.type == "cuda" else "none")
    if args.model == "none":  # the loaders alone: each batch converted and normalised where the model would be
        def train(x, y):
            pass
    else:
        model = make_model(torch, 3, 10, device, args.model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        train = train_step(torch, model, opt, device, amp)

    x0 = torch.randn(bs, 3, crop, crop, device=device).contiguous(memory_format=torch.channels_last)
    y0 = torch.randint(0, 4, (bs,), device=device)
    for _ in range(3):  # the first steps allocate and pick kernels: out of every loader's timing
        train(x0, y0)
    log("limit: one batch on the device")
    limit = timed(torch, device, endless(lambda: [(x0, y0)]), steps, train, warmup)

    augment = h5stream.Augment(output_size=(crop, crop), horizontal_flip=True)
    opts = dict(batch_size=bs, seed=0, drop_remainder=True, workers=args.workers, augment=augment)
    loader = torchvision_loader(torch, folder, crop, bs, args.workers, device.type == "cuda")

    def tv_step(x, y):
        x = x.to(device, non_blocking=True)
        x = ((x.float() - MEAN) / STD).contiguous(memory_format=torch.channels_last)
        train(x, y.to(device, non_blocking=True))

    def measure(name: str) -> dict:
        if name == "torchvision":
            if loader is None:
                return {"skipped": "torchvision is not installed (pip install torchvision)"}
            return timed(torch, device, endless(lambda: loader), steps, tv_step, warmup)
        return device_row(torch, h5stream, device, stores[name], opts, False, steps, warmup, train)

    rounds = []
    for r in range(args.rounds):
        order = LOADERS[r % len(LOADERS):] + LOADERS[:r % len(LOADERS)]
        row = {}
        for name in order:
            log(f"round {r + 1}/{args.rounds}: {name}")
            row[name] = attempt(lambda n=name: measure(n))
        rounds.append(row)
    loaders = {"limit": {**limit, "ratio_to_limit": 1.0}}
    for name in LOADERS:
        runs = [rnd[name] for rnd in rounds]
        done = [x for x in runs if "images_per_s" in x]
        if not done:
            loaders[name] = runs[-1]
            continue
        rate = median(x["images_per_s"] for x in done)
        loaders[name] = {"images_per_s": rate, "ratio_to_limit": rate / limit["images_per_s"],
                         "cores_busy": median(x["cores_busy"] for x in done),
                         "gpu_util": median(x.get("gpu_util") for x in done),
                         "peak_mem_bytes": max((x["peak_mem_bytes"] for x in done if "peak_mem_bytes" in x),
                                               default=None),
                         "budget_bytes": done[0].get("budget_bytes"), "rounds": [x["images_per_s"] for x in done]}
    rates = [{n: rnd[n]["images_per_s"] for n in LOADERS if "images_per_s" in rnd[n]} for rnd in rounds]
    ratios = {n: same_round_ratios(rates, n, "torchvision") for n in ("h5stream jpeg", "h5stream raw")}
    return {"device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "model": args.model, "amp": amp, "photos": args.photos, "size": args.size, "crop": crop,
            "batch_size": bs, "steps": steps, "warmup": warmup, "workers": args.workers, "rounds": args.rounds,
            "torch": torch.__version__, "cpu_count": os.cpu_count(), "loaders": loaders,
            "vs_torchvision": ratios}


def format_text(r: dict) -> str:
    gpu = f" ({r['gpu']})" if r.get("gpu") else ""
    lines = [f"device {r['device']}{gpu}, {r['cpu_count']} CPUs, model {r['model']} (autocast {r['amp']}), "
             f"{r['photos']} photos stored at {r['size']} px, random resized crops of {r['crop']} px + flip, "
             f"batch {r['batch_size']}, {r['workers']} workers, {r['steps']} steps after {r['warmup']}, "
             f"{r['rounds']} rounds, torch {r['torch']}",
             f"{'loader':<15} {'images/s':>10} {'x limit':>8} {'x torchvision':>14} {'cores':>6} {'GPU %':>6}  note"]
    for name, row in r["loaders"].items():
        if name == "limit" and r["model"] == "none":
            continue  # no model: nothing to be the limit of
        if "skipped" in row:
            lines.append(f"{name:<15} {'-':>10} {'-':>8} {'-':>14} {'-':>6} {'-':>6}  {row['skipped']}")
            continue
        ratio = (r["vs_torchvision"].get(name) or {}).get("median")
        vs = f"{ratio:.2f}" if ratio is not None else "-"
        gpu = f"{row['gpu_util']:.0f}" if row.get("gpu_util") is not None else "-"
        note = ""
        if row.get("peak_mem_bytes") is not None:
            note = f"peak memory {row['peak_mem_bytes'] / 2**20:.0f} of {row['budget_bytes'] / 2**20:.0f} MiB budget"
            if r["device"] == "cpu" and r["model"] != "none":
                note += " (the model's training memory included: it is on the CPU too)"
        limit = f"{row['ratio_to_limit']:.2f}" if r["model"] != "none" else "-"
        lines.append(f"{name:<15} {row['images_per_s']:>10.0f} {limit:>8} {vs:>14} "
                     f"{row['cores_busy']:>6.2f} {gpu:>6}  {note}")
    return "\n".join(lines)


def main(argv=None) -> int:
    from benchmarks.gpu import MODELS

    p = new_parser(__doc__.splitlines()[0])
    p.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--photos", type=int, default=20000, help="photos in the stores and the exported folder")
    p.add_argument("--size", type=int, default=256, help="stored rows' side in px")
    p.add_argument("--crop", type=int, default=224, help="the random resized crops' side in px")
    p.add_argument("--batch-size", type=int, default=256, help="rows per training step")
    p.add_argument("--steps", type=int, default=200, help="timed training steps per loader and round")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps of each loader first (workers, first fill)")
    p.add_argument("--rounds", type=int, default=1, help="every loader once a round, the order rotating")
    p.add_argument("--model", choices=(*MODELS, "none"), default="resnet50",
                   help="small: a 2-layer CNN; resnet18/resnet50: torchvision's, untrained; none: no model, the "
                        "loaders alone (each batch still converted and normalised on the device)")
    p.add_argument("--amp", choices=("bf16", "none"), help="autocast (default: bf16 on CUDA, none elsewhere)")
    p.add_argument("--torch-threads", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                   help="torch's intra-op threads: half the cores")
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2),
                   help="h5stream's augmenting workers and the DataLoader's workers: all cores but two")
    return run_cli(p, argv, run, format_text)


if __name__ == "__main__":
    sys.exit(main())
