"""Keras' ``validation_split`` / ``subset`` for a store: which rows each part streams.  Pure.

``subset="both"`` (as in ``image_dataset_from_directory``) is the pair: :func:`h5stream.open`
opens one stream per part (see :data:`BOTH`); one stream streams one part.

``validation_split=f`` holds out the last ``int(f * rows)`` committed rows as
the ``"validation"`` subset; ``"training"`` is every row before them.  That is
Keras' rule (``image_dataset_from_directory`` shuffles its file list with the
seed, then keeps the last ``int(f * n)`` files for validation), with the
shuffle already done: ingest writes rows in a seeded random order
(``storage_order == "shuffled"``).  So:

* the split is the same for every ``seed`` of the stream (the stream's seed
  shuffles within a part, never across the boundary), disjoint, and the two
  parts together cover every committed row;
* each part is one contiguous range of rows, read block by block like the
  whole file (the boundary block is shared);
* it depends only on the committed row count: appending rows to the store
  moves the boundary.

Rows added by ``ingest --append`` from files the first ingest did not list (a
new class folder, say) are shuffled among themselves and stored after the
others, so they are the last rows, and the validation subset would be mostly
them: such a store (its ``appended_from``, recorded by the ingest; a run killed
part-way and finished with ``--append`` has the same listing and stays one
storage order) is refused too; re-ingest the whole source into a new store.

A store in any other order (``"sorted"``: the rows of one class together;
``"unknown"``: written by another tool) is refused: its last rows would be
whole classes, which is no validation set.  Re-ingest it with ``--order
shuffled``, or ingest the validation images into a store of their own.

A set of parts (:mod:`h5stream.store.partset`) lays its parts' rows end to
end, so its last rows are its last part or parts, whole: a sample of the set
only when every part is one, as the parts of one ``ingest --part I/N`` set are
(each file goes to the part its path's hash names, and each part is stored
shuffled).  Any other set is refused, even when each of its parts is shuffled:
parts written one per class, one per source or one per day would give a
validation subset of the last class, source or day.  Such a set is split by
the caller, who knows what its parts hold: open the validation parts as a set
of their own and train on the others.
"""

from __future__ import annotations

import numbers

from h5stream.errors import ConfigError

SUBSETS = ("training", "validation")
BOTH = "both"
"""``subset=BOTH``: ``h5stream.open`` returns ``(training, validation)``, the two streams of :data:`SUBSETS`."""


def check_split(validation_split, subset) -> tuple[float | None, str | None]:
    """Validate the pair as ``h5stream.open`` takes it: both None, or a fraction in (0, 1) and a subset name."""
    if validation_split is None and subset is None:
        return None, None
    if validation_split is None:
        raise ConfigError(f"subset={subset!r} needs validation_split, e.g. validation_split=0.2")
    if isinstance(validation_split, bool) or not isinstance(validation_split, numbers.Real) \
            or not 0 < float(validation_split) < 1:
        raise ConfigError(f"validation_split must be a fraction between 0 and 1 (exclusive), got {validation_split!r}")
    if subset not in SUBSETS + (BOTH,):
        raise ConfigError("validation_split needs subset='training' or subset='validation' (or 'both': "
                          f"h5stream.open returns the two streams), got subset={subset!r}")
    return float(validation_split), subset


def subset_rows(rows: int, validation_split: float | None, subset: str | None, storage_order: str,
                path: str = "the store", parts: int = 0, one_ingest: bool = False,
                appended_from: int | None = None) -> tuple[int, int]:
    """``(start, stop)``: the committed rows ``subset`` streams (``(0, rows)`` without a split).  ``parts``: how
    many parts a set has (0: one store); ``one_ingest``: whether they are the parts of one ``ingest --part``
    set, whose last rows are a sample of the set; ``appended_from``: the first row an ``--append`` stored from a
    listing that grew (None: none), see the module docstring."""
    validation_split, subset = check_split(validation_split, subset)
    if validation_split is None:
        return 0, int(rows)
    if subset == BOTH:
        raise ConfigError(f"{path}: one stream streams one subset; subset='both' is for h5stream.open, which "
                          "returns (training, validation)")
    if storage_order != "shuffled":
        raise ConfigError(
            f"{path}: validation_split needs a store whose rows are in shuffled order, and this one is "
            f"{storage_order!r} (its last rows would be whole classes); re-ingest it with --order shuffled, "
            "or ingest the validation images into a store of their own"
        )
    if appended_from is not None:
        raise ConfigError(
            f"{path}: validation_split holds out the last rows, and rows {appended_from}.. were added by ingest "
            "--append from files the first ingest did not list, shuffled among themselves after the others, so "
            "they would be most of the validation subset; re-ingest the whole source into a new store "
            "(h5stream ingest SRC OUT.h5 --overwrite), or ingest the validation images into a store of their own"
        )
    if parts and not one_ingest:
        raise ConfigError(
            f"{path}: validation_split holds out the last rows, and the last rows of a set of {parts} parts are its "
            "last part or parts whole, which sample the set only when every part does (the parts of one ingest "
            "--part I/N set); open the validation parts as a set of their own (h5stream.open([...])) and train on "
            "the others, or ingest the source with --part I/N"
        )
    n_val = int(validation_split * rows)  # < rows, since the fraction is below 1
    if n_val == 0:
        raise ConfigError(
            f"{path}: validation_split={validation_split} of {rows} rows holds out int({validation_split} * {rows}) "
            f"= 0 rows; raise validation_split to at least 1/{rows}"
        )
    boundary = int(rows) - n_val
    return (0, boundary) if subset == "training" else (boundary, int(rows))
