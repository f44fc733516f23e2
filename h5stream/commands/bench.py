"""`h5stream bench FILE`: the stream against its baselines, in one run on one file.

The passes are :mod:`h5stream.measure.passes`'; this command runs them in this
order (the stream first, so no earlier pass has grown the heap that its memory
figure is measured against): the stream for ``--epochs`` epochs, sampled (peak
memory is the peak sample minus the sample taken just before ``open()``); h5py
sequential reads, the ceiling; the single-chunk shuffle; random rows, stopped
after ``--random-seconds`` and extrapolated.  It adds the shuffle's quality
(batch label TVD, Kendall tau between epochs), prints the table or ``--json``,
and draws ``--plot``.

The stream's rate comes three ways: start-up (``open()`` to the first batch),
epoch 1 with its start-up, and epochs 2+ (the steady state; ``--epochs 2`` or
more).  The "stream is" column compares like with like: the steady rate (with
one epoch, epoch 1 after its first batch) against each baseline, which times
one pass over a file it has already opened.  The bench's consumer does no work
per batch, so it always waits for the next one; the plot says so.

``--cold`` evicts the file from the page cache before each pass and, during it,
every 0.25 s drops the pages cached for a whole tick (an LRU's view of a file
larger than RAM; see :class:`~h5stream.measure.PeriodicEvictor`).
:func:`run_bench` returns the ``--json`` dict and the stream's
:class:`~h5stream.measure.Timeline`; :func:`plot_bench` draws it.
"""

from __future__ import annotations

import json

import numpy as np

from h5stream.commands._common import augment_from_arg, check_class_labels, label_bins, read_labels
from h5stream.commands.arguments import BENCH_BUDGET, RANDOM_SECONDS
from h5stream.errors import hide_passwords
from h5stream.measure.passes import (
    CHUNK_SHUFFLE_BATCHES,
    SAMPLE_INTERVAL_S,
    measure_random_rows,
    measure_sequential,
    measure_single_chunk,
    measure_stream,
)

def run(args) -> int:
    from h5stream.errors import ConfigError

    if args.epochs < 1:
        raise ConfigError(f"--epochs must be >= 1, got {args.epochs}")
    if not args.random_seconds > 0:  # NaN too
        raise ConfigError(f"--random-seconds must be > 0, got {args.random_seconds}")
    if args.plot:
        check_plot_target(args.plot)  # before measuring, so a missing library never costs the run
    result, timeline = run_bench(
        args.path, batch_size=args.batch_size, memory_budget=args.memory_budget, epochs=args.epochs,
        seed=args.seed, cold=args.cold, augment=augment_from_arg(args.augment), augment_spec=args.augment,
        workers=args.workers, random_seconds=args.random_seconds, baselines=not args.no_baselines,
        progress=not args.json,
    )
    if args.plot:
        plot_bench(result, timeline, args.plot)
        result["plot"] = args.plot
    print(json.dumps(result) if args.json else format_table(result))
    if args.plot and not args.json:
        print(f"plot written to {args.plot}")
    return 0


# -- the run --------------------------------------------------------------------------
def run_bench(path, *, batch_size=32, memory_budget=BENCH_BUDGET, epochs=1, seed=0, cold=False, augment=None,
              augment_spec=None, workers=0, random_seconds=RANDOM_SECONDS, baselines=True, progress=True,
              interval_s=SAMPLE_INTERVAL_S):
    """Measure every pass on ``path``; returns ``(result dict, stream Timeline)``.  See the module doc."""
    from h5stream.order import quality
    from h5stream.read.plan import parse_bytes
    from h5stream.store.meta import read_meta

    meta = read_meta(path)
    if meta.remote is not None:  # a URL: the page cache and the plain-h5py baselines are this machine's
        if cold:
            from h5stream.errors import ConfigError

            raise ConfigError(f"{path}: --cold evicts a local file from the page cache; a remote store's cache is "
                              "the server's: drop --cold")
        baselines = False
    budget = parse_bytes(memory_budget)
    labels = read_labels(meta)
    check_class_labels(meta, labels)
    qlabels, n_classes = quality.quality_labels(labels, meta.label_kind, meta.class_names)
    result = {
        "file": hide_passwords(meta.path), "rows": meta.rows, "image_shape": list(meta.image_shape),
        "row_bytes": meta.row_bytes,
        "file_bytes": meta.file_bytes, "block_rows": meta.block_rows, "storage_order": meta.storage_order,
        "batch_size": batch_size, "epochs": epochs, "seed": seed, "cold": bool(cold), "workers": workers,
        "augment": augment_spec, "memory_budget_bytes": budget,
    }
    stream, timeline = measure_stream(meta, batch_size=batch_size, budget=budget, epochs=epochs, seed=seed, cold=cold,
                                      augment=augment, workers=workers, progress=progress, interval_s=interval_s)
    orders, yielded = stream.pop("orders"), stream.pop("yielded_labels")
    order0 = orders[0]
    result.update(stream)
    result["order_matches_yield"] = bool(
        yielded.shape[0] == order0.size and np.array_equal(yielded, labels[order0][: yielded.shape[0]])
    ) if meta.label_kind != "none" else None  # a store without labels yields none to compare
    result["baselines"] = {}
    if baselines and not meta.encoded:  # the baselines read pixel rows with plain h5py: an encoded store has none
        result["baselines"].update(measure_sequential(meta, cold=cold, progress=progress))
        result["baselines"].update(measure_single_chunk(meta, batch_size, seed=seed, cold=cold, progress=progress))
        result["baselines"].update(measure_random_rows(meta, seed=seed, seconds=random_seconds, cold=cold,
                                                       progress=progress))
        b = result["baselines"]
        rate = result["compare_samples_per_s"]  # like for like: each baseline times one pass, without start-up
        result["ratios"] = {  # of compare_samples_per_s, whose basis compare_basis names
            "vs_sequential": rate / b["sequential_samples_per_s"],
            "vs_random_row": rate / b["random_row_samples_per_s"],
            "vs_single_chunk_shuffle": rate / b["single_chunk_shuffle_samples_per_s"],
        }
    chunk_rows = CHUNK_SHUFFLE_BATCHES * batch_size
    n = order0.size
    in_order = qlabels[order0]
    p_all = np.bincount(in_order, minlength=n_classes) / max(1, n)
    result["shuffle"] = {
        "n_classes": n_classes,
        "label_bins": label_bins(meta),
        "batch_label_tvd": quality.batch_label_tvd(in_order, batch_size, n_classes, reference=p_all),
        "batch_label_tvd_full_random": quality.batch_label_tvd(
            in_order[quality.full_random_order(n, seed)], batch_size, n_classes, reference=p_all),
        "batch_label_tvd_expected_random": quality.expected_batch_label_tvd(
            np.bincount(in_order, minlength=n_classes), batch_size),
        "batch_label_tvd_single_chunk": quality.batch_label_tvd(
            qlabels[quality.single_chunk_shuffle_order(meta.rows, chunk_rows, seed)], batch_size, n_classes),
        "batch_label_tvd_file_order": quality.batch_label_tvd(qlabels, batch_size, n_classes),
        "epoch_order_tau": quality.kendall_tau(orders[0], orders[1]) if n >= 2 else 0.0,
        # One pair's tau varies by about 0.67 / sqrt(blocks) (blocks move together): show several.
        "epoch_order_tau_pairs": [quality.kendall_tau(a, b) if n >= 2 else 0.0 for a, b in zip(orders, orders[1:])],
        "epoch_order_tau_single_chunk": quality.kendall_tau(
            quality.single_chunk_shuffle_order(meta.rows, chunk_rows, seed, 0),
            quality.single_chunk_shuffle_order(meta.rows, chunk_rows, seed, 1)) if meta.rows >= 2 else 0.0,
        "single_chunk_rows": chunk_rows,
    }
    s = result["shuffle"]
    s["tvd_ratio_to_random"] = s["batch_label_tvd"] / max(s["batch_label_tvd_full_random"], 1e-12)
    return result, timeline


def check_plot_target(path: str) -> None:
    """Raise :class:`ConfigError` if ``--plot PATH`` could not be written: no matplotlib, or no such folder."""
    import os

    from h5stream.errors import ConfigError

    try:
        import matplotlib  # noqa: F401 - only whether it imports
    except ImportError:
        raise ConfigError(f"--plot {path}: needs matplotlib (pip install matplotlib), or drop --plot") from None
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError(f"--plot {path}: folder {folder} does not exist; create it first")
    if os.path.isdir(path):
        raise ConfigError(f"--plot {path}: is a folder; name the image file to write, e.g. {path}/bench.png")
    from matplotlib.backend_bases import FigureCanvasBase

    # matplotlib picks the format by the extension, adds ".png" to a name without one (so the figure would not be
    # where the command said it went) and refuses an unknown one only after the whole run.
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext not in FigureCanvasBase.get_supported_filetypes():
        what = "." + ext if ext else "a name without an extension"
        raise ConfigError(f"--plot {path}: cannot tell which image format to write from {what!r}; name the file "
                          ".png (or .svg, .pdf)")


# -- output ---------------------------------------------------------------------------
def _mib(n) -> str:
    return "n/a" if n is None else f"{n / (1 << 20):.1f} MiB"


def _cache_words(r: dict) -> str:
    from h5stream.remote.config import is_url

    if is_url(r["file"]):
        return "remote store"
    return f"{'cold' if r['cold'] else 'warm'} page cache"


def format_table(r: dict) -> str:
    """The human-readable report of :func:`run_bench`'s result."""
    h, w, c = r["image_shape"]
    head = (f"h5stream bench {r['file']}: {r['rows']} rows of {h}x{w}x{c} ({r['file_bytes'] / 1e9:.2f} GB, "
            f"{r['storage_order']}), batch {r['batch_size']}, budget {_mib(r['memory_budget_bytes'])}, "
            f"{_cache_words(r)}, workers {r['workers']}"
            + (f", augment {r['augment']}" if r["augment"] else ""))
    compare = r["compare_samples_per_s"]
    mb = r["row_bytes"] / 1e6
    rows = []
    if r.get("steady_samples_per_s"):
        rows.append(("h5stream stream, epochs 2+", r["steady_samples_per_s"], r["steady_samples_per_s"] * mb,
                     "steady state, what training sees once running"))
    else:
        rows.append(("h5stream stream, epoch 1 after open()", compare, compare * mb,
                     "without start-up, with every block's first read and check; --epochs 3 for the steady state"))
    rows.append(("h5stream stream, epoch 1", r["first_epoch_samples_per_s"], r["first_epoch_samples_per_s"] * mb,
                 f"start-up included: open() {r['startup_s']:.2f} s, first batch after {r['first_batch_s']:.2f} s, "
                 f"epoch in {r['first_epoch_s']:.2f} s"))
    b = r.get("baselines") or {}
    if b:
        rows += [
            ("h5py sequential read_direct", b["sequential_samples_per_s"], b["sequential_mb_per_s"],
             "ceiling, no shuffle"),
            ("single contiguous chunk shuffle", b["single_chunk_shuffle_samples_per_s"],
             b["single_chunk_shuffle_mb_per_s"], f"{b['single_chunk_rows']} rows per chunk"),
            ("h5py one row per call, random", b["random_row_samples_per_s"], b["random_row_mb_per_s"],
             (f"extrapolated from {b['random_row_rows_measured']} rows in {b['random_row_seconds_measured']:.1f} s; "
              f"epoch ~{b['random_row_epoch_s_estimated']:.0f} s") if b["random_row_extrapolated"] else "whole file"),
        ]
    lines = [head, "", f"  {'pass':<36}{'samples/s':>11}{'MB/s':>9}{'stream is':>11}  note"]
    for name, rate, mbs, note in rows:
        ratio = "" if name.startswith("h5stream stream") else f"{compare / rate:.2f}x"
        lines.append(f"  {name:<36}{rate:>11,.0f}{mbs:>9,.0f}{ratio:>11}  {note}")
    if b:
        lines.append(f"  stream is = the stream's rate over {r['compare_basis']} / the pass's rate "
                     "(like for like: each baseline times one pass over a file it has opened)")
        if not r.get("steady_samples_per_s"):
            lines.append("  epoch 1 is the stream's slowest: each block is read for the first time and, in a store "
                         "with checksums, checked against them (verify_reads='once'; later epochs skip the check), "
                         "while the baselines check nothing; `--epochs 3` compares the steady state")
    s = r["shuffle"]
    budget_ok = "within budget" if r["within_budget"] else "OVER BUDGET"
    lines += [
        "",
        f"  memory   peak - baseline {_mib(r['peak_mem_bytes'])} of {_mib(r['memory_budget_bytes'])} ({budget_ok}); "
        f"sum of PSS over the process tree, {r['mem_samples']} samples; "
        f"RSS high-water delta {_mib(r['peak_rss_delta_bytes'])}",
        f"  shuffle  batch label TVD: stream {s['batch_label_tvd']:.3f}, "
        f"full random {s['batch_label_tvd_full_random']:.3f} "
        f"(expected {s['batch_label_tvd_expected_random']:.3f}), single chunk {s['batch_label_tvd_single_chunk']:.3f}, "
        f"file order {s['batch_label_tvd_file_order']:.3f}; stream/random {s['tvd_ratio_to_random']:.2f}x",
        f"           epoch-to-epoch Kendall tau: stream {s['epoch_order_tau']:+.4f} "
        f"(epochs 0-{len(s['epoch_order_tau_pairs'])}: max |tau| {max(map(abs, s['epoch_order_tau_pairs'])):.4f}), "
        f"single chunk {s['epoch_order_tau_single_chunk']:+.4f}  (0 = independent orders)",
        "  cpu      " + ", ".join(f"{k} {v:.0f}%" for k, v in r["mean_cpu_pct"].items() if not _helper_thread(k))
        + " (mean % of one core)",
    ]
    plan = r.get("plan") or {}
    if plan:
        lines.append(f"  plan     {plan.get('n_buffers')} x {plan.get('rows_per_fill')} rows shuffle buffer "
                     f"({plan.get('blocks_per_fill')} blocks of {plan.get('block_rows')}), "
                     f"queue {plan.get('queue_depth')} batches")
    return "\n".join(lines)


def _helper_thread(label: str) -> bool:
    """Threads of the measurement itself (sampler, evictor, progress bar), left out of tables and plots."""
    return label.startswith(("h5stream-sampler", "h5stream-evictor", "tqdm", "mp-"))


def queue_fill_label(workers: int) -> str:
    """The plot's legend for the reader's queue fill, which holds different batches with and without workers.

    Without workers the queue holds batches ready for the consumer, so a full
    queue and a waiting consumer exclude each other.  With workers it holds
    batches handed to the workers and not done yet (the workers augment them,
    and for a cached uncompressed file read their pixels too): a full queue
    while the consumer waits says the workers, not the reader, set the pace.
    """
    if workers:
        return ("queue fill (batches handed to the workers, not done yet:\n"
                "full while the consumer waits = the workers set the pace)")
    return "queue fill (batches ready for the consumer)"


def plot_bench(result: dict, timeline, out_path: str) -> None:
    """Draw samples/s, CPU % per stage, queue fill (and the share of time the consumer waited for
    data, from the stream's ``stats()["wait_s"]``) and memory vs budget over time into a PNG."""
    import os

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(7, 7.5), sharex=True, dpi=100)
    t_rate, rate = timeline.rate("samples", window_s=max(0.25, 4 * SAMPLE_INTERVAL_S))
    axes[0].plot(t_rate, rate, color="tab:blue")
    axes[0].set_ylabel("samples/s")
    ends = timeline.marks.get("epoch_end")
    if ends is not None:
        for i, t in enumerate(timeline.mark_t_s[np.isfinite(ends)]):
            for ax in axes:
                ax.axvline(t, color="grey", linestyle=":", linewidth=0.8,
                           label="end of an epoch" if i == 0 and ax is axes[0] else None)
    if result.get("steady_samples_per_s"):
        axes[0].axhline(result["steady_samples_per_s"], color="tab:blue", linestyle="--", linewidth=0.8,
                        label=f"epochs 2+: {result['steady_samples_per_s']:,.0f}/s")
    axes[0].axhline(result["first_epoch_samples_per_s"], color="tab:cyan", linestyle="--", linewidth=0.8,
                    label=f"epoch 1 incl. start-up: {result['first_epoch_samples_per_s']:,.0f}/s")
    axes[0].legend(fontsize=7, loc="lower right")
    title = (f"{result['rows']} rows {'x'.join(map(str, result['image_shape']))}, batch {result['batch_size']}, "
             f"{'cold' if result['cold'] else 'warm'}, workers {result['workers']}\n"
             "the consumer only counts rows (no training step), so it always waits for the stream")
    axes[0].set_title(title, fontsize=9)
    for label, pct in timeline.cpu_pct.items():
        if _helper_thread(label) or (label == "other" and np.nanmax(np.nan_to_num(pct)) < 5):
            continue
        axes[1].plot(timeline.t_s, pct, label=label, linewidth=1)
    axes[1].set_ylabel("CPU %")
    axes[1].legend(fontsize=7, loc="upper right", ncol=3)
    depth, cap = timeline.marks.get("queue_depth"), timeline.marks.get("queue_capacity")
    if depth is not None and cap is not None and np.isfinite(depth).any():
        axes[2].plot(timeline.mark_t_s, 100 * depth / np.where(cap > 0, cap, np.nan), color="tab:green",
                     label=queue_fill_label(result["workers"]))
    t_wait, waiting = timeline.rate("consumer_wait_s", window_s=max(0.25, 4 * SAMPLE_INTERVAL_S))
    if waiting.size:
        # Seconds waited per second: the share of the consumer's time spent waiting for data.  This consumer
        # does no work per batch, so it waits whenever no batch is ready: near 100% means the stream sets the
        # pace, not that a training loop would starve.
        axes[2].plot(t_wait, 100 * np.clip(waiting, 0, 1), color="tab:orange",
                     label="consumer waiting (it does no work: ~100% = the stream sets the pace)")
    if depth is None and not waiting.size:
        axes[2].text(0.5, 0.5, "queue fill not reported by this stream", ha="center", va="center",
                     transform=axes[2].transAxes, fontsize=8)
    else:
        axes[2].legend(fontsize=7, loc="center right")
    axes[2].set_ylabel("%")
    axes[2].set_ylim(-5, 105)
    baseline = result.get("baseline_mem_bytes", 0)
    axes[3].plot(timeline.t_s, (timeline.mem_bytes - baseline) / (1 << 20), color="tab:purple", label="stream memory")
    axes[3].axhline(result["memory_budget_bytes"] / (1 << 20), color="tab:red", linestyle="--", label="budget")
    axes[3].set_ylabel("MiB over baseline")
    axes[3].set_xlabel("seconds since open()")
    axes[3].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    from h5stream.commands._common import write_output

    fmt = os.path.splitext(out_path)[1].lstrip(".").lower()  # the name's, not the temporary file's
    try:
        write_output(out_path, lambda tmp: fig.savefig(tmp, format=fmt), option="--plot")
    finally:
        plt.close(fig)
