"""Find the images to ingest and their labels: folder-per-class, folder + CSV, or no labels.

Pure functions over the file system (no decoding).  Each returns a
:class:`Source`: the items in a deterministic walk order (sorted relative
paths), the label kind, the files that can be rejected without opening them
(unknown extension, path too long), and what is left out with a reason
(:attr:`Source.left_out`: hidden entries, image files the labels CSV or the
class layout does not cover, classes not chosen with ``classes``, symlinked
folders not followed, folders that cannot be read), so every file under the
source gets an answer.

Symlinks follow Keras (``image_dataset_from_directory``): a symlinked class
folder directly under the source is a class (Keras lists classes with
``isdir``, which follows links), symlinked files are ingested, and symlinked
folders deeper down are entered only with ``follow_links`` (Keras'
``follow_links``, off by default); one not entered is listed, and with
``follow_links`` a link back to a folder it lies in (a loop) is listed
instead of entered.

Labels CSV: a label column holding any value that is not a number is a class
column (as Keras' ``flow_from_dataframe`` takes string ``y_col`` values as
classes); an all-numeric column stays a regression target (Keras needs
``class_mode="raw"`` for numbers, and refuses them as classes), unless
``label_kind="class"`` says otherwise.  Every unusable *source* raises a one-line
:class:`SourceError` naming the folder/file/row and the fix.

No labels (``label_kind="none"``, ``h5stream ingest --labels none``): every image
file under the source, in its subfolders too, sorted by relative path, as Keras'
``labels=None`` lists them; or the files a CSV's path column names (its other
columns are not read).

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
from h5stream.ingest.csvrows import (PATH_COLUMNS, bounded_lines, check_fields, check_header, check_label_columns,
                                     path_column, relative_path, spelled_on_disk)
from h5stream.store import schema

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".jpe", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm", ".pnm"}
)

# Kinds of Source.left_out entries (the ingest summary counts each).
HIDDEN = "hidden"
NOT_LISTED = "not in the labels CSV"
LOOSE = "not in a class folder"
UNREADABLE = "unreadable folder"
SYMLINK = "symlink not followed"
LOOP = "symlink loop"
NOT_CHOSEN = "class not chosen"
NOT_IMAGE = "not an image"


@dataclass(frozen=True)
class Item:
    """One file to ingest.  ``label`` is a class name (folder mode), a tuple of floats (CSV mode) or None (no
    labels)."""

    relpath: str
    label: str | tuple[float, ...] | None


@dataclass(frozen=True)
class Source:
    root: str
    label_kind: str  # schema.LABEL_CLASS | schema.LABEL_REGRESSION | schema.LABEL_NONE
    items: tuple[Item, ...]
    class_names: tuple[str, ...] | None = None  # index order: sorted, or as given by ``classes``
    label_columns: tuple[str, ...] | None = None  # CSV mode (the one class column, or the regression targets)
    rejected: tuple[tuple[str, str], ...] = field(default=())  # (relpath, reason), never decoded
    left_out: tuple[tuple[str, str, str], ...] = field(default=())  # (relpath, kind, reason); folders end in "/"


def _is_hidden(name: str) -> bool:
    return name.startswith(".")


def _extension(relpath: str) -> str:
    """``os.path.splitext(relpath)[1]`` of a POSIX relative path, without its general case for the usual name
    (one that does not start with a dot): it runs once per file found."""
    dot, sep = relpath.rfind("."), relpath.rfind("/")
    if dot > sep + 1 and relpath[sep + 1] != ".":
        return relpath[dot:]
    return os.path.splitext(relpath)[1]


def _reject_reason(relpath: str) -> str | None:
    ext = _extension(relpath).lower()
    if ext not in IMAGE_EXTENSIONS:
        return f"not an image file extension ({ext or 'none'})"
    return None  # a path of any length: an append to a store of fixed-width paths refuses longer ones later


def _check_root(root: str) -> None:
    if not os.path.exists(root):
        raise SourceError(f"{root}: no such folder; give the folder that holds your images")
    if not os.path.isdir(root):
        raise SourceError(f"{root}: not a folder; give a folder with one subfolder per class, "
                          "or a folder plus --labels CSV")


class _Walk:
    """Relative (POSIX) paths of the non-hidden files under some folders, and what the walk left out.

    Symlinked folders below the walked folder are entered only with ``follow_links`` or when in ``enter``,
    never one that leads back to a folder it lies in (a loop); one not entered is listed in :attr:`left_out`
    with ``link_hint``.  Hidden entries (name starting with '.') are neither listed nor entered, except
    folders in ``enter`` (relative paths: the labels CSV names files inside them).
    """

    def __init__(self, root: str, enter: frozenset[str] = frozenset(), follow_links: bool = False,
                 link_hint: str = "use --follow-links to ingest what it holds"):
        self.root = root
        self.enter = enter
        self.follow_links = follow_links
        self.link_hint = link_hint
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

        # Real paths of the folders each walked folder lies in (itself included): a followed link to one of
        # them would walk forever.
        inside = {folder: {os.path.realpath(self.root), os.path.realpath(folder)}}
        # followlinks=True: which links to enter is decided below, per folder.
        for dirpath, dirnames, filenames in os.walk(folder, onerror=unreadable, followlinks=True):
            prefix = self._rel(dirpath)  # once per folder, not per file
            above = inside.pop(dirpath, set())
            keep = []
            for d in sorted(dirnames):
                if _is_hidden(d) and prefix + d not in self.enter:
                    self.hidden(prefix + d + "/")
                    continue
                full = os.path.join(dirpath, d)
                if os.path.islink(full):
                    real = os.path.realpath(full)
                    if not self.follow_links and prefix + d not in self.enter:
                        self.left_out.append((prefix + d + "/", SYMLINK,
                                              f"symlinked folder, not entered; {self.link_hint}"))
                        continue
                    if real in above:
                        self.left_out.append((prefix + d + "/", LOOP, f"symlink to {real}, a folder it lies in; "
                                              "not entered, it would repeat forever"))
                        continue
                    inside[full] = above | {real}
                else:
                    inside[full] = above | {os.path.realpath(full)}
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


def check_classes(classes, flag: str = "--classes") -> tuple[str, ...] | None:
    """``classes`` as a tuple, refused when empty or repeating a name (pure)."""
    if classes is None:
        return None
    classes = tuple(str(c) for c in classes)
    if not classes or not all(classes):
        raise SourceError(f"{flag} is empty; name the classes to keep, in label order, e.g. {flag} cat,dog")
    repeated = sorted({c for c in classes if classes.count(c) > 1})
    if repeated:
        raise SourceError(f"{flag} names {', '.join(map(repr, repeated))} twice; name each class once")
    return classes


def discover_class_folders(root: str | os.PathLike, classes: list[str] | tuple[str, ...] | None = None,
                           follow_links: bool = False) -> Source:
    """Folder mode: each non-hidden subfolder of ``root`` is a class; label index = sorted-name order.

    ``classes`` chooses the classes and their label order (Keras' ``classes=`` /
    ``class_names=``): each must be a subfolder, the other subfolders are left
    out.  A symlinked subfolder of ``root`` is a class, as in Keras (see the
    module docstring); ``follow_links`` enters symlinked folders below it.
    Files directly in ``root`` are ignored (as in Keras).  Files under a class
    folder (recursively) with an image extension become items; any other
    file (``README.md``, ``Thumbs.db``) is left out by its extension, as Keras'
    allowlist leaves it, and listed, but is not a skipped file.
    """
    root = os.fspath(root)
    _check_root(root)
    chosen = check_classes(classes)
    walk = _Walk(root, follow_links=follow_links)
    found = []
    root_real = os.path.realpath(root)
    for entry in sorted(_list_root(root), key=lambda e: e.name):
        if _is_hidden(entry.name):
            walk.hidden(entry.name + ("/" if entry.is_dir() else ""))
        elif entry.is_dir():
            real = os.path.realpath(entry.path)
            if entry.is_symlink() and (real == root_real or root_real.startswith(real + os.sep)):
                walk.left_out.append((entry.name + "/", LOOP, f"symlink to {real}, a folder the source lies in; "
                                      "not a class folder"))
            else:
                found.append(entry.name)
        elif entry.is_symlink() and not os.path.exists(entry.path):
            walk.left_out.append((entry.name, SYMLINK, "broken symlink (its target does not exist)"))
        elif _is_image_name(entry.name):
            walk.left_out.append((entry.name, LOOSE, "image file directly in the source folder; "
                                  "only files in class subfolders are ingested"))
    if not found:
        raise SourceError(
            f"{root}: no class subfolders; put images in one subfolder per class, pass --labels FILE.csv, "
            "or --labels none for a store of the images alone (no labels)"
        )
    if chosen is None:
        classes = found
    else:
        unknown = [c for c in chosen if c not in found]
        if unknown:
            raise SourceError(f"--classes: {root} has no class folder {', '.join(map(repr, unknown))}; "
                              f"its class folders are {', '.join(found)}")
        classes = list(chosen)
        walk.left_out += [(name + "/", NOT_CHOSEN, "class folder not in --classes; not searched")
                          for name in found if name not in chosen]
    items: list[Item] = []
    rejected: list[tuple[str, str]] = []
    for name in (n for n in found if n in classes):  # walk order, whatever order --classes gives
        _take_files(walk, os.path.join(root, name), name, items, rejected)
    if not items:
        raise SourceError(
            f"{root}: no image files in its {len(classes)} class folder(s) "
            f"(looked for {', '.join(sorted(IMAGE_EXTENSIONS))})"
        )
    return Source(root, schema.LABEL_CLASS, tuple(items), class_names=tuple(classes), rejected=tuple(rejected),
                  left_out=tuple(walk.left_out))


def _take_files(walk: _Walk, folder: str, label, items: list[Item], rejected: list[tuple[str, str]]) -> None:
    """Every file ``walk`` finds under ``folder``: an image file to ingest (with ``label``) goes to ``items``, an
    image file that cannot be (its reason) to ``rejected``, any other file is left out by its extension."""
    for rel in walk.files(folder):
        reason = _reject_reason(rel)
        if reason is None:
            items.append(Item(rel, label))
        elif not _is_image_name(rel):
            walk.left_out.append((rel, NOT_IMAGE, f"{reason}; only image files are ingested"))
        else:
            rejected.append((rel, reason))


def discover_unlabeled(root: str | os.PathLike, follow_links: bool = False) -> Source:
    """No labels: every image file under ``root``, in its subfolders too, sorted by relative path (Keras'
    ``labels=None``); other files are left out by their extension, as in :func:`discover_class_folders`."""
    root = os.fspath(root)
    _check_root(root)
    walk = _Walk(root, follow_links=follow_links)
    items: list[Item] = []
    rejected: list[tuple[str, str]] = []
    _take_files(walk, root, None, items, rejected)
    if not items and not rejected:
        raise SourceError(f"{root}: no image files in it or below it ({', '.join(sorted(IMAGE_EXTENSIONS))})")
    return Source(root, schema.LABEL_NONE, tuple(items), rejected=tuple(rejected), left_out=tuple(walk.left_out))


def _list_root(root: str) -> list[os.DirEntry]:
    try:
        with os.scandir(root) as it:
            return list(it)
    except OSError as exc:
        raise SourceError(f"{root}: cannot read this folder ({exc.strerror}); check its permissions") from None


LABEL_KINDS = schema.LABEL_KINDS


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _parse_float(text: str, where: str, column: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SourceError(f"{where}: column {column!r} holds {text!r}, not a number; regression labels must be "
                          "numeric (--label-kind class reads the column as class names)") from None
    if not math.isfinite(value):
        raise SourceError(f"{where}: column {column!r} holds {text!r}; labels must be finite numbers")
    with np.errstate(over="ignore"):
        if np.isinf(np.float32(value)):
            raise SourceError(
                f"{where}: column {column!r} holds {text!r}, beyond the float32 range labels are stored in "
                f"(largest {float(np.finfo(np.float32).max):.6g}); rescale that column"
            )
    return value


def csv_label_kind(cells: dict[str, list[str]], label_kind: str | None, classes) -> str:
    """The kind of labels a CSV gives (pure): ``label_kind`` when given, class when ``classes`` is given or a
    label column holds a value that is not a number (Keras' flow_from_dataframe: strings are class names),
    regression otherwise (numbers, 0/1 included, as Keras' ``class_mode="raw"``)."""
    if label_kind is not None and label_kind not in LABEL_KINDS:
        raise SourceError(f"--label-kind must be one of {', '.join(LABEL_KINDS)}, got {label_kind!r}")
    if classes is not None and label_kind in (schema.LABEL_REGRESSION, schema.LABEL_NONE):
        asks = "numeric targets" if label_kind == schema.LABEL_REGRESSION else "no labels"
        raise SourceError(f"--classes names classes, but --label-kind {label_kind} asks for {asks}; "
                          "drop one of them")
    if label_kind is not None:
        return label_kind
    if classes is not None:
        return schema.LABEL_CLASS
    text = any(not _is_number(v) for values in cells.values() for v in values if v)
    return schema.LABEL_CLASS if text else schema.LABEL_REGRESSION


def class_order(values, classes: tuple[str, ...] | None) -> tuple[str, ...]:
    """Class names in label-index order (pure): ``classes`` as given, else the distinct ``values`` sorted:
    by number when every one is a number (so "2" comes before "10"), by name otherwise."""
    if classes is not None:
        return classes
    names = set(values)
    if all(_is_number(v) for v in names):
        return tuple(sorted(names, key=lambda v: (float(v), v)))
    return tuple(sorted(names))


def discover_csv(root: str | os.PathLike, csv_path: str | os.PathLike,
                 label_columns: list[str] | None = None, label_kind: str | None = None,
                 classes: list[str] | tuple[str, ...] | None = None, follow_links: bool = False,
                 path_col: str | None = None) -> Source:
    """CSV mode: a ``path`` or ``filename`` column (or ``path_col``, Keras' ``x_col``) naming files inside
    ``root`` (relative, or absolute inside it), plus label columns.

    ``label_columns`` picks the columns (default: every other column).  The
    kind of labels is :func:`csv_label_kind`'s.  Regression: one column gives
    (N,) float32 targets, K columns (N, K).  Class: one column of class names;
    ``class_names`` in :func:`class_order`, or ``classes`` (which chooses them:
    rows of other classes are left out; a chosen class the column lacks is
    refused, as a folder ingest refuses a class it has no folder for).  A row naming a file that is
    not there is rejected (skipped and listed, as an unreadable image is).
    Duplicate paths, paths leaving ``root``, unknown columns or non-numeric
    regression labels are :class:`SourceError` — the whole CSV is checked
    before anything is written.
    """
    root, csv_path = os.fspath(root), os.fspath(csv_path)
    _check_root(root)
    chosen = check_classes(classes)
    if not os.path.isfile(csv_path):
        raise SourceError(f"{csv_path}: no such labels file; --labels takes a CSV with a path or filename column")
    try:
        with open(csv_path, newline="", encoding="utf-8-sig") as fh:
            rows = list(csv.reader(bounded_lines(fh, csv_path)))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise SourceError(f"{csv_path}: cannot read as CSV ({exc})") from None
    if not rows:
        raise SourceError(f"{csv_path}: empty; the first row must name the columns (path or filename, then labels)")
    header = check_header([h.strip() for h in rows[0]], csv_path)
    path_col = path_column(header, csv_path, root, path_col)
    unlabeled = label_kind == schema.LABEL_NONE
    if label_columns is None:
        label_columns = [] if unlabeled else [c for c in header if c != path_col and c not in PATH_COLUMNS and c]
        if not label_columns and not unlabeled:
            raise SourceError(f"{csv_path}: no label columns besides {path_col!r}; add one label column, or "
                              "pass --label-kind none for a store of the images alone (no labels)")
    elif unlabeled:
        raise SourceError("--label-columns picks label columns, but --label-kind none asks for no labels; "
                          "drop one of them")
    check_label_columns(label_columns, header, path_col, csv_path)
    path_idx = header.index(path_col)
    label_idx = [header.index(c) for c in label_columns]
    lines: list[tuple[int, str, list[str]]] = []  # (line number, rel, label cells)
    seen: set[str] = set()
    root_real = os.path.realpath(root)
    for line_no, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        where = f"{csv_path} line {line_no}"
        check_fields(row, len(header), where)
        if not row[path_idx].strip():
            raise SourceError(f"{where}: empty {path_col!r}")
        rel = relative_path(row[path_idx], root, root_real, where)
        if rel in seen:
            raise SourceError(f"{where}: {rel!r} is listed twice; each image must appear once")
        seen.add(rel)
        lines.append((line_no, rel, [row[i].strip() for i in label_idx]))
    if not lines:
        raise SourceError(f"{csv_path}: no image rows; list one image per row under {path_col!r}")
    kind = csv_label_kind({c: [cells[j] for _, _, cells in lines] for j, c in enumerate(label_columns)},
                          label_kind, chosen)
    if kind == schema.LABEL_CLASS and len(label_columns) != 1:
        raise SourceError(f"{csv_path}: class labels come from one column, and {len(label_columns)} are label "
                          f"columns ({', '.join(label_columns)}); pick one with --label-columns, or pass "
                          "--label-kind regression for numeric targets")
    in_csv = class_order((c[0] for _, _, c in lines), None) if kind == schema.LABEL_CLASS else None
    missing = [c for c in chosen or () if in_csv is not None and c not in in_csv]
    if missing:
        raise SourceError(f"--classes: column {label_columns[0]!r} of {csv_path} has no class "
                          f"{', '.join(map(repr, missing))}; its classes are {', '.join(in_csv)}")
    items: list[Item] = []
    rejected: list[tuple[str, str]] = []
    left_out: list[tuple[str, str, str]] = []
    csv_name = os.path.basename(csv_path)
    for line_no, rel, cells in lines:
        where = f"{csv_path} line {line_no}"
        if kind == schema.LABEL_CLASS:
            if not cells[0]:
                raise SourceError(f"{where}: column {label_columns[0]!r} is empty; every row needs its class name")
            label = cells[0]
        elif unlabeled:
            label = None
        else:
            label = tuple(_parse_float(v, where, c) for v, c in zip(cells, label_columns))
        if not os.path.lexists(os.path.join(root, rel)):
            spelled = spelled_on_disk(root, rel, seen)
            if spelled is None:
                rejected.append((rel, f"listed in {csv_name} (line {line_no}) but does not exist"))
                continue
            seen.discard(rel)
            seen.add(spelled)
            rel = spelled
        if chosen is not None and label not in chosen:
            left_out.append((rel, NOT_CHOSEN, f"class {label!r} not in --classes"))
            continue
        reason = _reject_reason(rel)
        if reason is None:
            items.append(Item(rel, label))
        else:
            rejected.append((rel, reason))
    if not items and not rejected:
        raise SourceError(f"{csv_path}: no row has a class in --classes ({', '.join(chosen or ())}); "
                          f"column {label_columns[0]!r} holds {', '.join(in_csv or ())}")
    items.sort(key=lambda it: it.relpath)
    class_names = (chosen or in_csv) if kind == schema.LABEL_CLASS else None
    return Source(
        root, kind, tuple(items), class_names=class_names, label_columns=None if unlabeled else tuple(label_columns),
        rejected=tuple(rejected), left_out=tuple(left_out) + _not_listed(root, seen, csv_name, follow_links),
    )


def _not_listed(root: str, listed: set[str], csv_name: str,
                follow_links: bool = False) -> tuple[tuple[str, str, str], ...]:
    """What a walk of ``root`` finds that the CSV does not list: image files, hidden entries, symlinked folders
    not entered, unreadable folders (hidden or symlinked folders holding listed files are searched; every
    symlinked folder with ``follow_links``)."""
    enter = frozenset(
        "/".join(parts[:i]) for rel in listed for parts in [rel.split("/")] for i in range(1, len(parts))
    )
    walk = _Walk(root, enter=enter, follow_links=follow_links,
                 link_hint=f"{csv_name} lists no file in it (--follow-links lists the images it holds)")
    unlisted = [
        (rel, NOT_LISTED, f"image file not listed in {csv_name}")
        for rel in walk.files(root) if rel not in listed and _is_image_name(rel)
    ]
    hidden_listed = {rel for rel, kind, _ in walk.left_out if kind == HIDDEN and rel in listed}
    return tuple(e for e in walk.left_out if e[0] not in hidden_listed) + tuple(unlisted)


def discover(root: str | os.PathLike, labels_csv: str | os.PathLike | None = None,
             label_columns: list[str] | None = None, *, classes: list[str] | tuple[str, ...] | None = None,
             label_kind: str | None = None, follow_links: bool = False, path_col: str | None = None) -> Source:
    """Folder mode when ``labels_csv`` is None, CSV mode otherwise (where the CSV names the files, and
    ``follow_links`` only makes the walk for files it does not list enter every symlinked folder)."""
    if labels_csv is None:
        if label_columns or path_col:
            raise SourceError(f"{'--label-columns' if label_columns else '--path-column'} needs --labels FILE.csv")
        if label_kind == schema.LABEL_REGRESSION:
            raise SourceError("--label-kind regression needs --labels FILE.csv with numeric columns; "
                              "class folders give class labels")
        if label_kind == schema.LABEL_NONE:
            csv_label_kind({}, label_kind, classes)  # refuses --classes: there are no labels
            return discover_unlabeled(root, follow_links)
        return discover_class_folders(root, classes, follow_links)
    return discover_csv(root, labels_csv, label_columns, label_kind, classes, follow_links, path_col)
