"""Find the images to ingest and their labels: folder-per-class or folder + CSV.

Pure functions over the file system (no decoding).  Each returns a
:class:`Source`: the items in a deterministic walk order (sorted relative
paths), the label kind, the files that can be rejected without opening them
(unknown extension, path too long), and what is left out with a reason
(:attr:`Source.left_out`: hidden entries, image files the labels CSV or the
class layout does not cover, folders that cannot be read), so every file
under the source gets an answer.  Every unusable *source* raises a one-line
:class:`SourceError` naming the folder/file/row and the fix.

File names that are not valid UTF-8 are kept as Python reads them (surrogate
escapes), so they open, and :func:`h5stream.store.schema.encode_path` stores
their original bytes.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, field

import numpy as np

from h5stream.errors import SourceError
from h5stream.store import schema

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".jpe", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm", ".pnm"}
)
PATH_COLUMNS = ("path", "filename")

# Kinds of Source.left_out entries (the ingest summary counts each).
HIDDEN = "hidden"
NOT_LISTED = "not in the labels CSV"
LOOSE = "not in a class folder"
UNREADABLE = "unreadable folder"


@dataclass(frozen=True)
class Item:
    """One file to ingest.  ``label`` is a class name (folder mode) or a tuple of floats (CSV mode)."""

    relpath: str
    label: str | tuple[float, ...]


@dataclass(frozen=True)
class Source:
    root: str
    label_kind: str  # schema.LABEL_CLASS | schema.LABEL_REGRESSION
    items: tuple[Item, ...]
    class_names: tuple[str, ...] | None = None  # sorted; folder mode
    label_columns: tuple[str, ...] | None = None  # CSV mode
    rejected: tuple[tuple[str, str], ...] = field(default=())  # (relpath, reason), never decoded
    left_out: tuple[tuple[str, str, str], ...] = field(default=())  # (relpath, kind, reason); folders end in "/"


def _is_hidden(name: str) -> bool:
    return name.startswith(".")


def _reject_reason(relpath: str) -> str | None:
    ext = os.path.splitext(relpath)[1].lower()
    if ext not in IMAGE_EXTENSIONS:
        return f"not an image file extension ({ext or 'none'})"
    if len(schema.encode_path(relpath)) > schema.PATH_BYTES:
        return f"relative path longer than {schema.PATH_BYTES} bytes"
    return None


def _check_root(root: str) -> None:
    if not os.path.exists(root):
        raise SourceError(f"{root}: no such folder; give the folder that holds your images")
    if not os.path.isdir(root):
        raise SourceError(f"{root}: not a folder; give a folder with one subfolder per class, "
                          "or a folder plus --labels CSV")


class _Walk:
    """Relative (POSIX) paths of the non-hidden files under some folders, and what the walk left out.

    Symlinked folders are not followed; hidden entries (name starting with '.') are neither listed nor
    entered, except folders in ``enter_hidden`` (the labels CSV names files inside them).
    """

    def __init__(self, root: str, enter_hidden: frozenset[str] = frozenset()):
        self.root = root
        self.enter_hidden = enter_hidden
        self.left_out: list[tuple[str, str, str]] = []

    def _rel(self, path: str) -> str:
        rel = os.path.relpath(path, self.root).replace(os.sep, "/")
        return "" if rel == "." else rel + "/"

    def hidden(self, rel: str) -> None:
        what = "folder, not searched" if rel.endswith("/") else "file"
        self.left_out.append((rel, HIDDEN, f"hidden {what} (name starts with '.')"))

    def files(self, folder: str) -> list[str]:
        found = []

        def unreadable(exc: OSError) -> None:
            rel = self._rel(exc.filename) if exc.filename else self._rel(folder)
            self.left_out.append((rel, UNREADABLE, f"folder not readable ({exc.strerror}); its files were not seen"))

        for dirpath, dirnames, filenames in os.walk(folder, onerror=unreadable):
            prefix = self._rel(dirpath)  # once per folder, not per file
            keep = []
            for d in sorted(dirnames):
                if _is_hidden(d) and prefix + d not in self.enter_hidden:
                    self.hidden(prefix + d + "/")
                else:
                    keep.append(d)
            dirnames[:] = keep
            for name in filenames:
                if _is_hidden(name):
                    self.hidden(prefix + name)
                else:
                    found.append(prefix + name)
        return sorted(found)


def _is_image_name(relpath: str) -> bool:
    return os.path.splitext(relpath)[1].lower() in IMAGE_EXTENSIONS


def discover_class_folders(root: str | os.PathLike) -> Source:
    """Folder mode: each non-hidden subfolder of ``root`` is a class; label index = sorted-name order.

    Files directly in ``root`` are ignored (as in Keras).  Files under a class
    folder (recursively) with an image extension become items; any other
    non-hidden file is rejected with a reason (it shows up in the skip report).
    """
    root = os.fspath(root)
    _check_root(root)
    walk = _Walk(root)
    classes = []
    for entry in sorted(_list_root(root), key=lambda e: e.name):
        if _is_hidden(entry.name):
            walk.hidden(entry.name + ("/" if entry.is_dir() else ""))
        elif entry.is_dir():
            classes.append(entry.name)
        elif _is_image_name(entry.name):
            walk.left_out.append((entry.name, LOOSE, "image file directly in the source folder; "
                                  "only files in class subfolders are ingested"))
    if not classes:
        raise SourceError(
            f"{root}: no class subfolders; put images in one subfolder per class, or pass --labels FILE.csv"
        )
    items: list[Item] = []
    rejected: list[tuple[str, str]] = []
    for name in classes:
        for rel in walk.files(os.path.join(root, name)):
            reason = _reject_reason(rel)
            if reason is None:
                items.append(Item(rel, name))
            else:
                rejected.append((rel, reason))
    if not items:
        raise SourceError(
            f"{root}: no image files in its {len(classes)} class folder(s) "
            f"(looked for {', '.join(sorted(IMAGE_EXTENSIONS))})"
        )
    return Source(root, schema.LABEL_CLASS, tuple(items), class_names=tuple(classes), rejected=tuple(rejected),
                  left_out=tuple(walk.left_out))


def _list_root(root: str) -> list[os.DirEntry]:
    try:
        with os.scandir(root) as it:
            return list(it)
    except OSError as exc:
        raise SourceError(f"{root}: cannot read this folder ({exc.strerror}); check its permissions") from None


def _parse_float(text: str, where: str, column: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SourceError(f"{where}: column {column!r} holds {text!r}, not a number; "
                          "label columns must be numeric") from None
    if not math.isfinite(value):
        raise SourceError(f"{where}: column {column!r} holds {text!r}; labels must be finite numbers")
    with np.errstate(over="ignore"):
        if np.isinf(np.float32(value)):
            raise SourceError(
                f"{where}: column {column!r} holds {text!r}, beyond the float32 range labels are stored in "
                f"(largest {float(np.finfo(np.float32).max):.6g}); rescale that column"
            )
    return value


def discover_csv(root: str | os.PathLike, csv_path: str | os.PathLike,
                 label_columns: list[str] | None = None) -> Source:
    """CSV mode: a ``path`` or ``filename`` column relative to ``root`` plus numeric label columns.

    ``label_columns`` picks the columns (default: every other column).  One
    column gives (N,) float32 targets, K columns (N, K).  Missing files,
    duplicate paths, paths leaving ``root``, unknown or non-numeric columns are
    :class:`SourceError` — the whole CSV is checked before anything is written.
    """
    root, csv_path = os.fspath(root), os.fspath(csv_path)
    _check_root(root)
    if not os.path.isfile(csv_path):
        raise SourceError(f"{csv_path}: no such labels file; --labels takes a CSV with a path or filename column")
    try:
        with open(csv_path, newline="", encoding="utf-8-sig") as fh:
            rows = list(csv.reader(fh))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise SourceError(f"{csv_path}: cannot read as CSV ({exc})") from None
    if not rows:
        raise SourceError(f"{csv_path}: empty; the first row must name the columns (path or filename, then labels)")
    header = [h.strip() for h in rows[0]]
    path_col = next((c for c in PATH_COLUMNS if c in header), None)
    if path_col is None:
        raise SourceError(f"{csv_path}: no 'path' or 'filename' column in header {header}; "
                          f"add one naming each image relative to {root}")
    if label_columns is None:
        label_columns = [c for c in header if c not in PATH_COLUMNS and c]
        if not label_columns:
            raise SourceError(f"{csv_path}: no label columns besides {path_col!r}; add one numeric column per target")
    for c in label_columns:
        if c not in header:
            raise SourceError(f"{csv_path}: unknown label column {c!r}; the header has {header}")
    path_idx = header.index(path_col)
    label_idx = [header.index(c) for c in label_columns]
    items: list[Item] = []
    rejected: list[tuple[str, str]] = []
    seen: set[str] = set()
    root_real = os.path.realpath(root)
    for line_no, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        where = f"{csv_path} line {line_no}"
        if len(row) < len(header):
            raise SourceError(f"{where}: {len(row)} fields, the header has {len(header)}")
        rel = row[path_idx].strip().replace("\\", "/")
        if not rel:
            raise SourceError(f"{where}: empty {path_col!r}")
        rel = os.path.normpath(rel).replace(os.sep, "/")
        full = os.path.join(root, rel)
        if os.path.isabs(rel) or not os.path.realpath(full).startswith(root_real + os.sep):
            raise SourceError(f"{where}: {rel!r} is outside {root}; paths must be relative to the source folder")
        if rel in seen:
            raise SourceError(f"{where}: {rel!r} is listed twice; each image must appear once")
        seen.add(rel)
        if not os.path.lexists(full):
            raise SourceError(f"{where}: {full} does not exist; fix the path or remove the row")
        label = tuple(_parse_float(row[i].strip(), where, c) for i, c in zip(label_idx, label_columns))
        reason = _reject_reason(rel)
        if reason is None:
            items.append(Item(rel, label))
        else:
            rejected.append((rel, reason))
    if not items:
        raise SourceError(f"{csv_path}: no image rows; list one image per row under {path_col!r}")
    items.sort(key=lambda it: it.relpath)
    return Source(
        root, schema.LABEL_REGRESSION, tuple(items), label_columns=tuple(label_columns), rejected=tuple(rejected),
        left_out=_not_listed(root, seen, os.path.basename(csv_path)),
    )


def _not_listed(root: str, listed: set[str], csv_name: str) -> tuple[tuple[str, str, str], ...]:
    """What a walk of ``root`` finds that the CSV does not list: image files, hidden entries, unreadable
    folders (hidden folders holding listed files are searched)."""
    enter = frozenset(
        "/".join(parts[:i]) for rel in listed for parts in [rel.split("/")] for i in range(1, len(parts))
        if any(_is_hidden(p) for p in parts[:i])
    )
    walk = _Walk(root, enter_hidden=enter)
    unlisted = [
        (rel, NOT_LISTED, f"image file not listed in {csv_name}")
        for rel in walk.files(root) if rel not in listed and _is_image_name(rel)
    ]
    hidden_listed = {rel for rel, kind, _ in walk.left_out if kind == HIDDEN and rel in listed}
    return tuple(e for e in walk.left_out if e[0] not in hidden_listed) + tuple(unlisted)


def discover(root: str | os.PathLike, labels_csv: str | os.PathLike | None = None,
             label_columns: list[str] | None = None) -> Source:
    """Folder mode when ``labels_csv`` is None, CSV mode otherwise."""
    if labels_csv is None:
        if label_columns:
            raise SourceError("--label-columns needs --labels FILE.csv")
        return discover_class_folders(root)
    return discover_csv(root, labels_csv, label_columns)
