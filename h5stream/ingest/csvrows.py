"""A labels CSV's path cells and header, read as Keras' ``flow_from_dataframe`` users write them (pure).

A path cell may be relative to SRC or absolute inside it (a DataFrame built with ``os.path.join(root, name)``);
the path column may have any name (Keras' ``x_col``); a header that names no path column because the file is
separated by ``;`` or tabs (a spreadsheet's export in many locales) gets a hint saying so.  The file is read
line by line with a bound on a line's length (:func:`bounded_lines`), so a file that is not a labels CSV costs
no more memory than that before its one-line error.
"""

from __future__ import annotations

import os

from h5stream.errors import SourceError

PATH_COLUMNS = ("path", "filename")
MAX_LINE_CHARS = 1 << 20
"""Longest line of a labels CSV, in characters: a path and its labels take far less."""
OTHER_DELIMITERS = {";": "semicolons", "\t": "tabs", "|": "'|'"}


def path_column(header: list[str], csv_path: str, root: str, chosen: str | None = None) -> str:
    """The header's path column: ``chosen`` (``--path-column``), else the first of :data:`PATH_COLUMNS`.

    Raises SourceError naming the header, with a delimiter hint where a cell holds ``;``, a tab or ``|``."""
    if chosen is not None and chosen in header:
        return chosen
    if chosen is None:
        found = next((c for c in PATH_COLUMNS if c in header), None)
        if found is not None:
            return found
    hint = next((f"; the header holds {name}: save the file comma-separated (h5stream reads CSV with commas)"
                 for sep, name in OTHER_DELIMITERS.items() if any(sep in cell for cell in header)), "")
    if chosen is not None:
        raise SourceError(f"{csv_path}: no column {chosen!r} (--path-column) in header {header}{hint}")
    raise SourceError(f"{csv_path}: no 'path' or 'filename' column in header {header}{hint}; add one naming "
                      f"each image relative to {root}, or name yours with --path-column")


def check_header(header: list[str], csv_path: str) -> list[str]:
    """``header``, refused when it names a column twice (pure): each label column is found by its name, so the
    second of two ``y`` columns was never read and the first stood in for both."""
    repeated = sorted({name for name in header if name and header.count(name) > 1})
    if repeated:
        raise SourceError(f"{csv_path}: the header names column {repeated[0]!r} {header.count(repeated[0])} times "
                          f"({header}); give each column its own name")
    return header


def check_label_columns(label_columns: list[str], header: list[str], path_col: str, csv_path: str) -> None:
    """Refuse (pure) a label column the header lacks, one named twice (``--label-columns y,y`` stored the same
    target twice) or the path column (every file would be its own class)."""
    for c in label_columns:
        if c not in header:
            raise SourceError(f"{csv_path}: unknown label column {c!r}; the header has {header}")
        if label_columns.count(c) > 1:
            raise SourceError(f"--label-columns names {c!r} twice; name each label column once")
        if c == path_col:
            raise SourceError(f"--label-columns names {c!r}, the column of file paths; name the label columns")


def check_fields(row: list[str], columns: int, where: str) -> None:
    """Refuse a row with fewer fields than the header's ``columns``, or more that are not empty (pure): an unquoted
    comma in a path or a label (``cat,1,5`` for 1.5) would otherwise shift or drop a cell without a word.  Empty
    cells past the header (a spreadsheet's trailing commas) are allowed."""
    if len(row) < columns:
        raise SourceError(f"{where}: {len(row)} fields, the header has {columns}")
    if any(cell.strip() for cell in row[columns:]):
        raise SourceError(f"{where}: {len(row)} fields, the header has {columns}; a path or label holding a comma "
                          'must be quoted ("a,b.jpg"), and a decimal comma written as a point')


def relative_path(cell: str, root: str, root_real: str, where: str) -> str:
    """The POSIX path relative to ``root`` that ``cell`` names: as given when relative; when absolute, relative to
    ``root`` (as written, or with the folders above it resolved).  Raises SourceError for a path that leads
    outside ``root`` (``root_real``: ``os.path.realpath(root)``)."""
    cell = cell.strip().replace("\\", "/")
    if os.path.isabs(cell):
        full = os.path.normpath(cell)
        for base, candidate in ((os.path.abspath(root), full),
                                (root_real, os.path.join(os.path.realpath(os.path.dirname(full)),
                                                         os.path.basename(full)))):
            if candidate.startswith(base.rstrip(os.sep) + os.sep):
                cell = os.path.relpath(candidate, base)
                break
        else:
            raise SourceError(f"{where}: {cell!r} is outside the source folder {root}; give paths inside it, "
                              "relative to it or absolute")
    rel = os.path.normpath(cell).replace(os.sep, "/")
    if rel.startswith("../") or rel == ".." or not os.path.realpath(os.path.join(root, rel)).startswith(
            root_real + os.sep):
        raise SourceError(f"{where}: {rel!r} is outside the source folder {root}; paths must be relative to it "
                          "(or absolute inside it)")
    return rel


def bounded_lines(fh, csv_path: str, limit: int = MAX_LINE_CHARS):
    """The lines of the text file ``fh``, each read with at most ``limit`` characters before its newline: a longer
    one raises :class:`SourceError` naming it once that much is read, not once it is all in memory (a 1 GB line
    took 2 GB)."""
    line_no = 0
    while True:
        line = fh.readline(limit + 1)
        if not line:
            return
        line_no += 1
        if len(line) > limit and not line.endswith("\n"):
            raise SourceError(f"{csv_path} line {line_no}: longer than {limit:,} characters; a labels CSV has one "
                              "image per line, its path and its labels (is this the labels file?)")
        yield line


def spelled_on_disk(root: str, rel: str, listed: set[str]) -> str | None:
    """``rel`` as the file system spells it where the CSV spelt it in another Unicode normal form (pure but for
    ``lexists``): a CSV written on macOS names ``café`` composed (NFC) where the files keep it decomposed (NFD), or
    the other way round; the same name to the user, other bytes to the file system.  None where neither form is
    there, or the other form is listed too (then both are the CSV's own rows)."""
    import unicodedata

    for form in ("NFC", "NFD"):
        other = unicodedata.normalize(form, rel)
        if other != rel and other not in listed and os.path.lexists(os.path.join(root, other)):
            return other
    return None
