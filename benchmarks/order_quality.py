"""Shuffle quality of the one-level and the two-level order on class-sorted stores, computed (no I/O, no timing).

    python -m benchmarks.order_quality                       # 1.1 GB and 10 GB, 10 classes, batch 64
    python -m benchmarks.order_quality --gb 1.1 --seeds 20 --json
    python -m benchmarks.order_quality --gb 1.1 --unit-bytes 384KiB 192KiB 96KiB   # one-level, smaller units

For each store size the plan is the one ``h5stream.open`` makes under the default budget for a store of rows of
128x128x3 in chunks of 64 rows (what ``benchmarks.data.make_bench_file`` writes), with the default order and with
``piece_bytes``; the labels are class-sorted (the worst case for the class mix).  Per order: batch label TVD over a
random permutation's (:func:`h5stream.order.quality.batch_label_tvd`) in epochs 0 and 1, and Kendall's tau between
epochs 0 and 1 (:func:`~h5stream.order.quality.kendall_tau`) over ``--seeds`` seeds: its spread, largest value and
the share of seeds within 0.02; the largest |tau| between epochs 1 and 2 and between epochs 0 and 2 (two epochs
apart); and the *fill repeat*: of the pairs of rows that share a fill in epoch 0, the share that share one again in
epoch 1 (``--seeds``' mean), over the share of all pairs that share a fill in epoch 1 (1: as if independent; rows
of one unit always move together, so above 1 for every order; a lower figure is a better mix).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile

import numpy as np

from benchmarks.harness import log, new_parser, run_cli


def _meta(rows: int, workdir: str):
    """A store description of ``rows`` rows of 128x128x3 in chunks of 64 rows (a tiny real store, rows replaced)."""
    from h5stream.store.meta import read_meta
    from h5stream.store.writer import write_arrays

    path = os.path.join(workdir, "layout.h5")
    write_arrays(path, np.zeros((64, 128, 128, 3), np.uint8), np.zeros(64, np.int64), block_rows=64)
    return dataclasses.replace(read_meta(path), rows=rows)


def measure(meta, classes: int, batch_size: int, seeds: int, piece_bytes: int | None,
            unit_bytes: int | None = None) -> dict:
    from h5stream.order.quality import batch_label_tvd, full_random_order, kendall_tau
    from h5stream.streaming.config import layout_function
    from h5stream.streaming.planning import plan_stream

    rows = meta.rows
    labels = (np.arange(rows) * classes) // rows
    plan = plan_stream(meta, None, batch_size, piece_bytes=piece_bytes, available_bytes=None, unit_bytes=unit_bytes)
    ratios, ratios_1, taus, later, apart, repeat = [], [], [], [], [], []
    for seed in range(seeds):
        layout = layout_function(rows, plan, seed)
        layouts = [layout(e) for e in range(3)]
        first, second, third = (lay.order() for lay in layouts)
        if seed < 3:
            random = batch_label_tvd(labels[full_random_order(rows, seed)], batch_size, classes)
            ratios.append(batch_label_tvd(labels[first], batch_size, classes) / random)
            ratios_1.append(batch_label_tvd(labels[second], batch_size, classes) / random)
        taus.append(kendall_tau(first, second))
        later.append(kendall_tau(second, third))
        apart.append(kendall_tau(first, third))
        repeat.append(fill_repeat(layouts[0], layouts[1], rows))
    taus_abs = np.abs(taus)
    return {"rows_per_fill": plan.rows_per_fill, "unit_rows": plan.unit_rows, "piece_rows": plan.piece_rows,
            "tvd_over_random": ratios, "tvd_over_random_epoch_1": ratios_1,
            "tau_std": float(np.std(taus)), "tau_max_abs": float(taus_abs.max()),
            "tau_within_0_02": float(np.mean(taus_abs <= 0.02)), "tau_1_2_max_abs": float(np.abs(later).max()),
            "tau_0_2_max_abs": float(np.abs(apart).max()), "fill_repeat": float(np.mean(repeat))}


def _fill_of(layout, rows: int) -> np.ndarray:
    fill = np.empty(rows, np.int64)
    for f in range(len(layout.fills)):
        fill[layout.fill_row_ids(f)] = f
    return fill


def fill_repeat(a, b, rows: int) -> float:
    """Of the row pairs sharing a fill in layout ``a``, the share sharing one in ``b``, over the share of all
    pairs sharing a fill in ``b`` (see the module doc)."""
    fa, fb = _fill_of(a, rows), _fill_of(b, rows)
    both = np.bincount(fa * (fb.max() + 1) + fb).astype(np.float64)
    in_a, in_b = np.bincount(fa).astype(np.float64), np.bincount(fb).astype(np.float64)
    return (_pairs(both) / _pairs(in_a)) / (_pairs(in_b) / (rows * (rows - 1) / 2))


def _pairs(counts: np.ndarray) -> float:
    return float((counts * (counts - 1) / 2).sum())


def run(args) -> dict:
    from h5stream.read.plan import parse_bytes

    pieces = parse_bytes(args.piece_bytes, what="--piece-bytes")
    out = {"command": "python -m benchmarks.order_quality " + " ".join(sys.argv[1:]), "classes": args.classes,
           "batch_size": args.batch_size, "seeds": args.seeds, "piece_bytes": pieces, "stores": []}
    with tempfile.TemporaryDirectory() as workdir:
        meta = _meta(64, workdir)
        for gb in args.gb:
            m = dataclasses.replace(meta, rows=int(gb * 1e9 / meta.row_bytes))
            orders = [("one-level", None, None), ("two-level", pieces, None)]
            orders += [(f"unit {u}", None, parse_bytes(u, what="--unit-bytes")) for u in args.unit_bytes]
            for order, piece, unit in orders:
                log(f"{gb} GB, {order}")
                out["stores"].append({"gb": gb, "rows": m.rows, "order": order,
                                      **measure(m, args.classes, args.batch_size, args.seeds, piece, unit)})
    return out


def format_text(r: dict) -> str:
    lines = [r["command"], f"class-sorted, {r['classes']} classes, batch {r['batch_size']}, default budget; tau over "
             f"{r['seeds']} seeds (epochs 0-1; 1-2 and 0-2: largest |tau|)", "",
             f"{'store':>8} {'order':<12} {'fill':>6} {'unit':>5} {'piece':>6}  {'TVD / random (seeds 0-2)':<26}"
             f"{'epoch 1':<21}"
             f"{'tau sd':>8} {'max|tau|':>9} {'|tau|<=0.02':>12} {'1-2 max':>8} {'0-2 max':>8} {'repeat':>7}"]
    for s in r["stores"]:
        ratios = ", ".join(f"{v:.3f}" for v in s["tvd_over_random"])
        ratios_1 = ", ".join(f"{v:.3f}" for v in s["tvd_over_random_epoch_1"])
        lines.append(f"{s['gb']:>6g}GB {s['order']:<12} {s['rows_per_fill']:>6} {s['unit_rows']:>5} "
                     f"{s['piece_rows'] or '-':>6}  {ratios:<26}{ratios_1:<21}"
                     f"{s['tau_std']:>8.4f} {s['tau_max_abs']:>9.4f} "
                     f"{s['tau_within_0_02']:>11.0%} {s['tau_1_2_max_abs']:>8.4f} {s['tau_0_2_max_abs']:>8.4f} "
                     f"{s['fill_repeat']:>7.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = new_parser(__doc__.splitlines()[0], prog="python -m benchmarks.order_quality")
    parser.add_argument("--gb", type=float, nargs="+", default=[1.1, 10.0], help="store sizes, GB")
    parser.add_argument("--classes", type=int, default=10, help="labels of the class-sorted stores")
    parser.add_argument("--batch-size", type=int, default=64, help="rows per batch")
    parser.add_argument("--seeds", type=int, default=20, help="seeds for tau (TVD: the first 3)")
    parser.add_argument("--piece-bytes", default="8MiB", help="the two-level order's pieces")
    parser.add_argument("--unit-bytes", nargs="*", default=[],
                        help="also the one-level order with these units (e.g. 384KiB 96KiB: smaller units)")
    return run_cli(parser, argv, run, format_text)


if __name__ == "__main__":
    sys.exit(main())
