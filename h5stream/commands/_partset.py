"""What ``info``, ``verify`` and ``preview`` make of several stores, a glob or a manifest: a set of parts.

:func:`store_or_set` turns the command line's paths into what :func:`h5stream.open` takes (one path, or the
list); :func:`set_parts` reads and checks a set as a stream would (:func:`h5stream.store.partset.read_any`: every
part present, all agreeing; one line naming the part otherwise) and returns it, None for one store.
"""

from __future__ import annotations

from h5stream.errors import hide_passwords
from h5stream.store.partset import is_part_set, part_paths, read_any


def store_or_set(paths: list[str]):
    """One path as given, several as a list (what ``h5stream.open`` takes)."""
    return paths[0] if len(paths) == 1 else list(paths)


def set_parts(paths: list[str]):
    """The :class:`~h5stream.store.partset.PartSetMeta` the command line's ``paths`` name, None for one store."""
    spec = store_or_set(paths)
    if part_paths(spec) is None:
        return None
    meta = read_any(spec, None, 60.0)
    return meta if is_part_set(meta) else None


def describe_set(meta, describe) -> dict:
    """``info``'s description of a set: the set's rows, shapes, labels and class counts, and ``parts``: each
    part's own description (``describe(path)``), in row order."""
    parts = [describe(p.path) for p in meta.parts]
    classes = None
    if parts[0]["classes"] is not None:
        classes = {name: sum(p["classes"][name] for p in parts) for name in parts[0]["classes"]}
    return {"path": hide_passwords(meta.path), "parts": parts, "rows": meta.rows, "image_shape": list(meta.image_shape),
            "dtype": "uint8", "label_kind": meta.label_kind, "label_shape": list(meta.label_shape),
            "label_dtype": str(meta.label_dtype), "classes": classes,
            "label_columns": list(meta.label_columns) if meta.label_columns is not None else None,
            "file_bytes": meta.file_bytes, "skipped_files": meta.skipped_files,
            "part_of": [None if p.part is None else p.part.label for p in meta.parts]}


def format_set(info: dict, format_text) -> str:
    """The text of ``info`` for a set: its summary, then each part as ``info`` shows one store."""
    h, w, c = info["image_shape"]
    lines = [f"{info['path']}: a set of {len(info['parts'])} parts read as one",
             f"  rows            {info['rows']}",
             f"  images          {h}x{w}x{c} {info['dtype']}",
             f"  labels          {info['label_kind']}" + (f" {info['label_dtype']}" if info['label_kind'] != "none"
                                                          else "")]
    if info["classes"] is not None:
        lines.append(f"  classes         {len(info['classes'])}")
        width = max((len(n) for n in info["classes"]), default=0)
        lines += [f"    {i:>4}  {name:<{width}}  {n}" for i, (name, n) in enumerate(info["classes"].items())]
    for k, (part, label) in enumerate(zip(info["parts"], info["part_of"])):
        lines.append(f"  part {k}" + (f" (ingest --part {label})" if label else "") + f": {part['path']}, "
                     f"{part['rows']} rows")
    lines.append("")
    lines += [format_text(part) for part in info["parts"]]
    return "\n".join(lines)
