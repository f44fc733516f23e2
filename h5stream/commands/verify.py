"""`h5stream verify FILE.h5`: read every committed row once and check it against the stored block checksums.

Exit codes: 0 every committed row matched; 1 damage found (a block's bytes
differ from its checksum, or HDF5 cannot read it; committed rows without a
checksum, which commits write before they publish rows; a checksum table HDF5
cannot read; a chunk-index entry plain h5py cannot read by, see
:mod:`h5stream.store.chunkindex`), or the file cannot be opened as a store; 3 the store has no
checksums (written before they existed), so nothing was checked, or rows past
``committed_rows`` have checksums (an ingest is committing them, or a writer
stopped mid-commit): the committed rows matched, the others are not the store's
yet; 4 the store is unfinished: its last ingest stopped before every file it found
was stored or skipped (see :mod:`h5stream.store.progress`), whatever the rows it
holds checked (damage, 1, is said first).  The work is
:func:`h5stream.store.checksum.verify_store`.
"""

from __future__ import annotations

import sys

from h5stream.errors import hide_passwords

EXIT_DAMAGED = 1
EXIT_UNCHECKED = 3
EXIT_UNFINISHED = 4


def _rows(a: int, b: int) -> str:
    """Rows ``[a, b)`` as people read them."""
    return f"row {a}" if b - a == 1 else f"rows {a}-{b - 1}"





def _unfinished(path: str) -> str | None:
    """"unfinished: ... finish with `...`" for a store whose last ingest did not finish, else None."""
    from h5stream.store.meta import read_meta
    from h5stream.store.progress import unfinished_message

    return unfinished_message(read_meta(path))


def _chunk_index_problem(path: str) -> str | None:
    """What :func:`h5stream.store.chunkindex.chunk_index_problem` finds in ``path`` (None when nothing)."""
    from h5stream.store.access import read_consistent
    from h5stream.store.chunkindex import chunk_index_problem

    return read_consistent(path, lambda f: chunk_index_problem(f, path))


def _checked(result) -> str:
    """What verify could say of the rows an unfinished store holds."""
    if not result.has_checksums:
        return f"its {result.rows} rows have no checksums to check"
    unchecked = sum(z - y for y, z in result.unchecked)
    return f"{result.checked_rows} rows match their checksums" + (
        f", {unchecked} have none to check yet" if unchecked else "")


def run(args) -> int:
    """Verify one store, or (several paths, a glob, a manifest) a set of parts: the set checked whole first (every
    part present, all agreeing), then each part; the exit code is the worst part's (damage first)."""
    from h5stream.commands._partset import set_parts

    parts = set_parts(args.path)
    if parts is None:
        return _verify_one(args.path[0])
    codes = [_verify_one(part.path) for part in parts.parts]
    worst = next((c for c in (EXIT_DAMAGED, EXIT_UNFINISHED, EXIT_UNCHECKED) if c in codes), 0)
    if not worst:
        print(f"{hide_passwords(parts.path)}: OK, all {len(parts.parts)} parts ({parts.rows} rows) match their "
              "checksums")
    return worst


def _verify_one(path: str) -> int:
    from tqdm import tqdm

    from h5stream.store.checksum import verify_store

    bars = []

    def progress(done: int, total: int) -> None:
        if not bars:  # disable=None: a bar only when stderr is a terminal, as ingest's
            bars.append(tqdm(total=total, unit="B", unit_scale=True, desc="verify",
                             file=sys.stderr, dynamic_ncols=True, disable=None))
        bars[0].update(done - bars[0].n)

    try:
        result = verify_store(path, progress=progress)
    finally:
        for bar in bars:
            bar.close()
    unfinished = None if result.bad else _unfinished(path)
    shown = hide_passwords(path)  # a URL's password and query string (a presigned link's signature) never printed
    if unfinished is not None:
        print(f"h5stream: error: {shown}: {unfinished}; {_checked(result)}", file=sys.stderr)
        return EXIT_UNFINISHED
    if not result.has_checksums:
        print(f"h5stream: error: {shown}: no checksums stored, nothing verified; re-ingest it "
              f"(`h5stream ingest SRC NEW.h5`) to get a store that `h5stream verify` can check", file=sys.stderr)
        return EXIT_UNCHECKED
    if result.bad:
        first = result.bad[0]
        from h5stream.store.rowdigest import damage_text

        what = ("cannot be read" + (f" ({first.detail})" if first.detail else "") if first.parts == ("unreadable",)
                else damage_text(first))
        print(f"h5stream: error: {shown}: {_rows(first.start, first.stop)} {what}; {len(result.bad)} of "
              f"{result.blocks} blocks damaged; restore the file from a copy or re-ingest it", file=sys.stderr)
        return EXIT_DAMAGED
    problem = None if result.bad else _chunk_index_problem(path)
    if problem is not None:
        print(f"h5stream: error: {hide_passwords(problem)}", file=sys.stderr)
        return EXIT_DAMAGED
    if result.uncommitted:
        a, b = result.uncommitted
        print(f"h5stream: error: {shown}: the {result.rows} committed rows match their checksums, but {_rows(a, b)} "
              f"were written and not committed (an ingest is committing them, or a writer stopped mid-commit: "
              f"`h5stream ingest SRC {shown} --append` drops them and goes on)", file=sys.stderr)
        return EXIT_UNCHECKED
    rate = result.bytes_read / result.seconds / 1e6 if result.seconds > 0 else float("inf")
    print(f"{shown}: OK, {result.rows} rows in {result.blocks} blocks match their checksums "
          f"({result.bytes_read / 1e6:.1f} MB in {result.seconds:.2f} s, {rate:.0f} MB/s)")
    return 0
