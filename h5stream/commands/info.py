"""`h5stream info STORE [--json]`: describe a store without reading pixels.

:func:`describe` builds a plain dict (the ``--json`` object); :func:`format_text`
renders it for people.  Flags that add sections (a later ``--shuffle-report``)
extend that dict in :func:`run` between the two, under their own key.
"""

from __future__ import annotations

import json
import os

import numpy as np

from h5stream.commands.arguments import BENCH_BUDGET
from h5stream.errors import ConfigError, hide_passwords

LABEL_READ_ROWS = 1 << 20


def class_counts(path: str, rows: int, n_classes: int) -> list[int]:
    """Rows per class index over the committed rows, read in slices of ``LABEL_READ_ROWS``."""
    from h5stream.store import schema
    from h5stream.store.access import read_consistent

    def count(f) -> list[int]:
        counts = np.zeros(n_classes, dtype=np.int64)
        labels = f[schema.LABELS]
        for start in range(0, rows, LABEL_READ_ROWS):
            chunk = labels[start:min(rows, start + LABEL_READ_ROWS)].astype(np.int64)
            chunk = chunk[(chunk >= 0) & (chunk < n_classes)]
            counts += np.bincount(chunk, minlength=n_classes)[:n_classes]
        return counts.tolist()

    return read_consistent(path, count)


def _filter_names(dataset) -> list[str]:
    """HDF5 filter names on ``dataset`` as stored (h5py's ``.compression`` is None for plugin filters like blosc)."""
    dcpl = dataset.id.get_create_plist()
    names = []
    for i in range(dcpl.get_nfilters()):
        code, _flags, _values, name = dcpl.get_filter(i)
        name = name.decode("ascii", "replace") if isinstance(name, bytes) else str(name)
        if code not in (2, 3):  # shuffle and fletcher32 are helpers, not the compressor
            names.append({1: "gzip"}.get(code, name or f"filter {code}"))
    return names


def space_used(f, rows: int, row_bytes: int, file_bytes: int) -> dict:
    """Where a store's bytes go (open h5py file ``f``): ``pixel_bytes`` (the committed rows' pixels),
    ``chunk_bytes`` (the file space of every dataset's allocated chunks: HDF5 allocates a chunk whole, so a
    store of fewer rows than a block holds a whole block of pixels, and labels and paths a whole chunk each)
    and ``metadata_bytes`` (the rest: HDF5's headers and chunk-index nodes, allocated whole at 2,048 entries,
    see :mod:`h5stream.store.layout`, and free space)."""
    chunk_bytes = 0

    def add(_name, node):
        nonlocal chunk_bytes
        if hasattr(node, "id") and hasattr(node.id, "get_storage_size"):
            chunk_bytes += int(node.id.get_storage_size())

    f.visititems(add)
    return {"pixel_bytes": int(rows) * int(row_bytes), "chunk_bytes": chunk_bytes,
            "metadata_bytes": max(0, int(file_bytes) - chunk_bytes)}


def hdf5_nodes(f) -> dict:
    """``{"/name": {"shape": [...], "dtype": "uint8"}}`` of the datasets at the root of open h5py file ``f``,
    h5stream's own first (``/images``, ``/labels``, ``/path_bytes`` and ``/path_ends`` or a format-1 store's
    ``/paths``, ``/checksums``): the names plain h5py or PyTables code opens.  A fixed-size byte string's dtype
    reads ``S<bytes>``."""
    from h5stream.store import schema

    own = [schema.IMAGES, schema.LABELS, schema.PATH_BYTES_NODE, schema.PATH_ENDS, schema.PATHS, schema.CHECKSUMS]
    names = [n for n in own if n in f] + sorted(n for n in f if n not in own)
    nodes = {}
    for name in names:
        node = f.get(name)
        if hasattr(node, "shape") and hasattr(node, "dtype"):
            dtype = node.dtype
            nodes[f"/{name}"] = {"shape": list(node.shape),
                                 "dtype": f"S{dtype.itemsize}" if dtype.kind == "S" else str(dtype)}
    return nodes


def describe(path: str) -> dict:
    """The store's description: the keys of ``info --json`` (see README FORMAT)."""
    from h5stream.store import schema
    from h5stream.store.access import read_consistent
    from h5stream.remote.config import is_url
    from h5stream.store.meta import read_meta

    meta = read_meta(path)
    chunks, filters, space, nodes, encoded_chunks = read_consistent(path, lambda f: (
        f[schema.IMAGES].chunks, _filter_names(f[schema.IMAGES]),
        space_used(f, meta.rows, meta.row_bytes, meta.file_bytes), hdf5_nodes(f),
        f[schema.IMAGE_BYTES].chunks if meta.encoded else None))
    if meta.encoded:  # what the committed rows hold is their encoded bytes, not pixels
        space["pixel_bytes"] = meta.encoded_bytes
    classes = None
    if meta.label_kind == schema.LABEL_CLASS and meta.class_names is not None:
        counts = class_counts(path, meta.rows, len(meta.class_names))
        classes = dict(zip(meta.class_names, counts))
    report = schema.skipped_report_path(path)
    return {
        "path": hide_passwords(path) if is_url(path) else os.path.abspath(path),
        "rows": meta.rows,
        "image_shape": list(meta.image_shape),
        "dtype": "uint8",
        "label_kind": meta.label_kind,
        "label_shape": list(meta.label_shape),
        "label_dtype": str(meta.label_dtype),
        "classes": classes,
        "label_columns": list(meta.label_columns) if meta.label_columns is not None else None,
        "block_rows": meta.block_rows,
        "chunk_shape": list(chunks) if chunks else None,
        "compression": meta.compression or (filters[0] if filters else None),
        "order": meta.storage_order,
        "order_seed": meta.order_seed,
        "resize": meta.resize_mode,
        "file_bytes": meta.file_bytes,
        "space": space,
        "skipped_files": meta.skipped_files,
        "skipped_report": report if os.path.exists(report) else None,
        "format_version": meta.format_version,
        "checksums": meta.checksum,
        "ingest": _ingest(meta),
        "nodes": nodes,
        "checksum_problem": meta.checksum_problem,
        "encoding": meta.encoding,
        "jpeg_quality": meta.jpeg_quality,
        "bytes_per_image": meta.encoded_bytes / meta.rows if meta.encoded and meta.rows else meta.row_bytes,
        "encoded_chunk_bytes": int(encoded_chunks[0]) if encoded_chunks else None,  # /image_bytes' chunk
        "part": None if meta.part is None else {"index": meta.part.index, "count": meta.part.count,
                                                 "listing": meta.part.listing},
    }


def _ingest(meta) -> dict | None:
    """How far the store's last ingest got (None for a store written before ingests recorded it): files to
    store, stored, skipped, whether it finished, and the command that finishes it."""
    from h5stream.store.progress import continue_command, unfinished_message

    p = meta.ingest
    if p is None:
        return None
    return {"files": p.files, "stored": p.stored, "skipped": p.skipped, "finished": p.finished,
            "unfinished": unfinished_message(meta), "command": continue_command(p, meta.path)}


def label_kind_text(info: dict) -> str:
    """What the labels are, in words: class indices into ``classes`` (from folders or a CSV column of names) or
    regression targets (numeric CSV columns)."""
    columns = info["label_columns"] or []
    if info["label_kind"] == "none":
        return "none (ingested with --labels none: streams yield the images alone)"
    if info["label_kind"] == "class":
        where = f"CSV column {columns[0]}" if columns else "class folders"
        return f"class (index into the class names, from the {where})"
    return f"regression (float targets from CSV column{'s' if len(columns) > 1 else ''} {', '.join(columns)})"

def _space_lines(info: dict) -> list[str]:
    """What the file size is made of, said when the pixels are less than half of it (a small store)."""
    space = info.get("space")
    if not space or space["pixel_bytes"] * 2 >= info["file_bytes"]:
        return []
    from h5stream.read.plan import format_bytes

    encoded = info.get("encoded_chunk_bytes")
    what, chunk = (("JPEG bytes", f"{format_bytes(encoded)} of JPEG bytes") if encoded
                   else ("pixels", f"{info['block_rows']} image rows"))
    return [f"    of which      {what} {format_bytes(space['pixel_bytes'])}, in {format_bytes(space['chunk_bytes'])} "
            f"of whole chunks (HDF5 allocates a chunk whole: {chunk}, the labels', the paths'; appended rows fill "
            "them)",
            f"                  HDF5 metadata {format_bytes(space['metadata_bytes'])} (headers, chunk-index nodes "
            "of 2,048 entries)"]


def format_text(info: dict) -> str:
    h, w, c = info["image_shape"]
    lines = [
        f"{info['path']}",
        f"  rows            {info['rows']}",
        *([f"  part            {info['part']['index']}/{info['part']['count']} of the source listing "
           f"{info['part']['listing']} (h5stream ingest --part)"] if info.get("part") else []),
        *([f"  {info['ingest']['unfinished']}"] if (info.get("ingest") or {}).get("unfinished") else []),
        f"  images          {h}x{w}x{c} {info['dtype']} (resize: {info['resize']})",
        (f"  labels          {info['label_kind']} {info['label_dtype']} shape {tuple(info['label_shape'])}"
         + (f" columns {', '.join(info['label_columns'])}" if info["label_columns"] else ""))
        if info["label_kind"] != "none" else "  labels          none",
        f"  label kind      {label_kind_text(info)}",
    ]
    if info["classes"] is not None:
        lines.append(f"  classes         {len(info['classes'])}")
        width = max((len(n) for n in info["classes"]), default=0)
        for index, (name, count) in enumerate(info["classes"].items()):
            lines.append(f"    {index:>4}  {name:<{width}}  {count}")
    order = info["order"] + (f" (seed {info['order_seed']})" if info["order"] == "shuffled" else "")
    chunk = f"chunk {tuple(info['chunk_shape']) if info['chunk_shape'] else 'none'}"
    if info.get("encoded_chunk_bytes"):  # /images holds no rows: the rows' bytes lie in /image_bytes
        from h5stream.read.plan import format_bytes

        chunk = f"JPEG bytes in chunks of {format_bytes(info['encoded_chunk_bytes'])}"
    report = info["skipped_report"]
    lines += [
        f"  block rows      {info['block_rows']} ({chunk})",
        *([f"  encoding        {info['encoding']} quality {info['jpeg_quality']}, "
           f"{info['bytes_per_image']:,.0f} bytes per image (raw: {h * w * c:,})"]
          if info.get("encoding", "raw") != "raw" else []),
        f"  compression     {info['compression'] or 'none'}"
        + (" (plain h5py needs `pip install hdf5plugin` to read pixels)" if info["compression"] == "blosc" else ""),
        f"  storage order   {order}",
        f"  file size       {info['file_bytes']} bytes ({info['file_bytes'] / (1 << 20):.1f} MiB)",
        *_space_lines(info),
        f"  skipped files   {info['skipped_files']}" + (f" (see {report})" if report else ""),
        "  checksums       " + (f"DAMAGED: {info['checksum_problem'].split(': ', 1)[-1]}" if info["checksum_problem"]
                                 else f"{info['checksums']} per block (check with `h5stream verify`)"
                                 if info["checksums"] else "none (re-ingest to add them)"),
    ]
    for index, (name, node) in enumerate(info.get("nodes", {}).items()):
        shape = "(" + ", ".join(map(str, node["shape"])) + ("," if len(node["shape"]) == 1 else "") + ")"
        lines.append(f"  {'HDF5 nodes' if index == 0 else '':<16}{name:<11} {shape} {node['dtype']}")
    for key, section in info.get("sections", {}).items():
        lines.append(f"  {key}")
        lines.extend(f"    {line}" for line in section)
    return "\n".join(lines)





#: The flags of ``--shuffle-report`` -> (their attribute, their default): given without it, they would do nothing.
_REPORT_FLAGS = {"--memory-budget": ("memory_budget", BENCH_BUDGET), "--batch-size": ("batch_size", 32),
                 "--seed": ("seed", 0), "--workers": ("workers", 0), "--rows-per-fill": ("rows_per_fill", None),
                 "--read-unit": ("read_unit", None), "--piece-bytes": ("piece_bytes", None)}


def run(args) -> int:
    from h5stream.commands._partset import describe_set, format_set, set_parts

    if not args.shuffle_report:
        given = [flag for flag, value in _REPORT_FLAGS.items() if getattr(args, value[0]) != value[1]]
        if given:
            raise ConfigError(f"{', '.join(given)} only shape{'s' if len(given) == 1 else ''} the shuffle report; "
                              "add --shuffle-report (or leave them out)")
    parts = set_parts(args.path)
    if parts is not None:  # a set of parts: the set, then each part
        if args.shuffle_report:
            raise ConfigError("--shuffle-report describes one store; run it on each part")
        info = describe_set(parts, describe)
        print(json.dumps(info) if args.json else format_set(info, format_text))
        return 0
    args.path = args.path[0]
    info = describe(args.path)
    # Later flags add their results here: info[<key>] = {...} for --json, and
    # info.setdefault("sections", {})[<title>] = [lines] for the text view.
    if args.shuffle_report:
        from h5stream.commands._common import file_shuffle_report, format_shuffle_report

        if args.workers < 0:
            raise ConfigError(f"--workers must be >= 0, got {args.workers}")
        report = file_shuffle_report(args.path, memory_budget=args.memory_budget, batch_size=args.batch_size,
                                     seed=args.seed, workers=args.workers, rows_per_fill=args.rows_per_fill,
                                     read_unit=args.read_unit, piece_bytes=args.piece_bytes)
        info["shuffle_report"] = report
        info.setdefault("sections", {})["shuffle report"] = format_shuffle_report(report)
    if args.json:
        print(json.dumps({k: v for k, v in info.items() if k != "sections"}, sort_keys=False))
    else:
        print(format_text(info))
    return 0
