"""DALI's CPU pipeline's decode + random resized crop + flip rate on given JPEG bytes, run by DALI's own venv's
python (a child of :mod:`benchmarks.encoded_crop`; this file imports nothing of h5stream).

    /path/to/dali-venv/bin/python benchmarks/dali_crop.py JPEGS.npz OUTPUT EPOCHS

``JPEGS.npz`` holds ``data`` (every JPEG's bytes concatenated) and ``ends`` (JPEG i ends at ``ends[i]``): the rows
of an h5stream JPEG store, byte for byte.  The pipeline (``batch_size=64``, ``num_threads=1``, ``device_id=None``:
no GPU) feeds them by ``fn.external_source`` in a random order each epoch, then
``fn.decoders.image_random_crop(device="cpu")`` (libjpeg-turbo, the crop decoded alone; scale (0.08, 1), ratio
(3/4, 4/3) as torchvision's) + ``fn.resize`` to ``OUTPUT`` x ``OUTPUT`` + ``fn.flip`` on a coin flip: one epoch not
timed, then ``EPOCHS`` timed.  Prints one JSON object: images/s and images per CPU-second (this process's CPU time,
all its threads) per timed epoch, and the output shape.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
try:
    from peer_usage import usage  # beside this file (run as a script by a peer's venv: its folder is on the path)
except ImportError:  # python -m benchmarks.<this>
    from benchmarks.peer_usage import usage

BATCH = 64


def main(argv) -> int:
    if len(argv) != 3:  # --help, or run by hand: the usage line, not a traceback
        return usage(__doc__, argv)
    jpegs_npz, output, epochs = argv
    import nvidia.dali.types as types
    from nvidia.dali import fn, pipeline_def

    with np.load(jpegs_npz) as z:
        data, ends = z["data"], z["ends"].astype(np.int64)
    starts = np.concatenate([[0], ends[:-1]])
    rows = [data[a:b] for a, b in zip(starts, ends)]
    n, size = len(rows), int(output)
    rng = np.random.default_rng(0)
    state = {"order": rng.permutation(n), "at": 0}

    def batches():  # one batch per call; StopIteration ends the epoch (a partial last batch is given whole)
        at = state["at"]
        if at >= n:
            state["order"], state["at"] = rng.permutation(n), 0
            raise StopIteration
        state["at"] = at + BATCH
        return [rows[i] for i in state["order"][at:at + BATCH]]

    @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, seed=0, prefetch_queue_depth=2)
    def pipe():
        jpegs = fn.external_source(source=batches, batch=True, dtype=types.UINT8, no_copy=False)
        x = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                          random_area=[0.08, 1.0], random_aspect_ratio=[0.75, 4 / 3])
        x = fn.resize(x, resize_x=size, resize_y=size)
        return fn.flip(x, horizontal=fn.random.coin_flip())

    p = pipe()
    p.build()

    def epoch() -> tuple[int, tuple]:
        count, shape = 0, None
        while True:
            try:
                (out,) = p.run()
            except StopIteration:
                p.reset()
                return count, shape
            batch = out.as_array()
            count, shape = count + len(batch), tuple(batch.shape[1:])

    _, shape = epoch()
    rounds = []
    for _ in range(int(epochs)):
        t0, c0 = time.perf_counter(), time.process_time()
        count, _ = epoch()
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        rounds.append({"images": count, "images_per_s": count / seconds, "images_per_cpu_s": count / max(cpu, 1e-9)})
    import nvidia.dali

    print(json.dumps({"rounds": rounds, "shape": shape, "version": nvidia.dali.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
