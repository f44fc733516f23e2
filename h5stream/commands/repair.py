"""`h5stream repair FILE.h5`: rebuild a torn store, drop a torn commit, or say which rows are damaged.

A writer killed half-way through a flush (SIGKILL, the OOM killer) can leave
the file's HDF5 structure torn; the marker beside it (``FILE.h5.flushing``)
says so, and readers refuse the file until it is rebuilt.  This copies the
committed rows, checked against their block checksums, into a fresh file that
takes the store's name (:func:`h5stream.store.rebuild.rebuild`); `h5stream
ingest SRC FILE.h5 --append` does the same before it adds to the store.

Without a marker it reads every committed row once and checks it against its
checksum (:func:`h5stream.store.checksum.verify_store`).  Rows a writer wrote
but never committed are dropped (the next ``--append`` would drop them too).
Rows whose bytes differ from their checksum cannot be restored from the file
itself: the error names them, and stdout lists the source files they were
ingested from (one a line, as stored: relative to the ingest's source folder),
so that exactly those can be ingested again; or restore the file from a copy.

With ``--source SRC`` (the folder the store was ingested from), damaged image
blocks are decoded (and, in an encoded store, JPEG-encoded) again from their
files and written back where the result has the block's recorded checksum
(:mod:`h5stream.ingest.restore`); what cannot be restored so is reported as
above.

A store whose ``/row_digests`` falls short of its committed rows (which ``verify``, ``--append`` and a verifying
stream refuse alike) is rebuilt, its rows checked against their block checksums, with the digest of every row.

Damaged row digests of rows that match their block checksums are written again
from the rows (:mod:`h5stream.store.rowdigest_mend`), with or without
``--source``: the rows are known good, only their digests were not.

A set of parts (a ``.json`` manifest, a glob) is refused in one line naming a part: repair rewrites one store.

Exit codes: 0 rebuilt, damaged blocks restored, damaged row digests written
again, commit leftovers dropped, or nothing to do; 1 the store cannot be rebuilt or written, has damaged rows that
were not restored (listed as above), or committed rows without a checksum (the
message says which; the file is left as it was, but for blocks restored).
"""

from __future__ import annotations

import errno
import sys

EXIT_DAMAGED = 1


def run(args) -> int:
    from h5stream.errors import ConfigError, H5StreamError, StoreWriteError
    from h5stream.remote.config import is_url
    from h5stream.store.access import open_readable

    path = args.path
    if is_url(path):
        raise ConfigError(f"{path}: repair rewrites a local store in place, not a URL: copy the object here, repair "
                          "the copy (h5stream repair FILE.h5) and put it back")
    _refuse_a_set(path)
    open_readable(path).close()  # missing, a folder, no permission (the file's or a folder's): one line saying so
    try:
        return _repair(path, args)
    except OSError as exc:  # an in-place write refused: a read-only file or file system, a full disk
        if isinstance(exc, H5StreamError) or exc.errno not in _WRITE_ERRNOS:
            raise
        fix = (f"give this user write access to it (e.g. chmod u+w {path}), or repair a copy"
               if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else "free space, then run repair again")
        raise StoreWriteError(f"{path}: repair cannot write to the store ({exc.strerror}); it writes the mended "
                              f"bytes in place: {fix}", errno=exc.errno) from None


#: Errors of a write the operating system refused, as opposed to HDF5's own (also OSError).
_WRITE_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _repair(path: str, args) -> int:
    """:func:`run`'s work on the local store ``path``, under its lock."""
    from h5stream.store.checksum import verify_store
    from h5stream.store.lock import StoreLock
    from h5stream.store.rebuild import needs_rebuild, rebuild
    from h5stream.store.rowdigest_mend import block_digest_only, digest_only, mend, mend_block_digests

    with StoreLock.acquire(path) as lock:  # a writer at work holds it: refused, one line
        if needs_rebuild(path):
            rows = rebuild(path, lock)
            print(f"{path}: rebuilt from its {rows} committed rows")
            return 0
        from h5stream.store.meta import read_meta

        lacking = read_meta(path).row_digest_problem
        if lacking is not None:  # what verify, --append and the stream refuse: the rows give their digests again
            rows = rebuild(path, lock, row_digests=False)
            print(f"{path}: rebuilt from its {rows} committed rows, which match their block checksums, with the "
                  f"digest of every row (some had none: {lacking[len(path) + 2:].split(';')[0]})")
            return 0
        result = verify_store(path)  # StoreFormatError (one line) for committed rows without a checksum
        done: list[str] = []
        if result.bad and getattr(args, "source", None):
            result = _restore(path, args.source, result, done)
        if digest_only(result.bad):
            rows = mend(path, digest_only(result.bad))
            done.append(f"wrote again the digests of {rows} rows whose images match their block checksums")
            result = verify_store(path)
        if block_digest_only(result.bad):
            blocks = mend_block_digests(path, block_digest_only(result.bad), result.block_rows)
            if blocks:
                done.append(f"wrote again the images checksums of {blocks} blocks whose rows match their own digests")
                result = verify_store(path)
        if result.bad:
            return _report_damage(path, result, "".join(f"; {what}" for what in done))
        if done:
            print(f"{path}: {'; '.join(done)}; its {result.rows} committed rows match their checksums")
            return 0
        if result.uncommitted:
            from h5stream.store.writer import StoreWriter

            with StoreWriter.open_append(path, lock=lock):  # drops them and their checksums
                pass
            a, b = result.uncommitted
            print(f"{path}: dropped rows {a}-{b - 1}, written but never committed (a writer stopped mid-commit); "
                  f"its {result.rows} committed rows match their checksums")
            return 0
    if not result.has_checksums:
        print(f"{path}: nothing to repair (no writer was stopped while it rewrote the file; the store has no "
              "checksums, so its rows cannot be checked)")
    else:
        print(f"{path}: nothing to repair (no writer was stopped while it rewrote the file, and its {result.rows} "
              "committed rows match their checksums)")
    return 0


def _restore(path: str, source: str, result, done: list[str]):
    """``--source``: restore what :mod:`h5stream.ingest.restore` can, add what it did (or why not) to ``done``,
    and return the store checked again (or ``result`` where nothing could be tried)."""
    import os

    from h5stream.errors import SourceError
    from h5stream.ingest.restore import restore_blocks
    from h5stream.store.checksum import verify_store

    if not os.path.isdir(source):
        raise SourceError(f"--source {source}: no such folder; give the folder {path} was ingested from")
    pixels = [b for b in result.bad if b.parts != ("row digests",)]
    if not pixels:
        return result
    outcomes = restore_blocks(path, source, pixels, result.rows, result.block_rows)
    restored = [o for o in outcomes if o.restored]
    rows = sum(o.stop - o.start for o in restored)
    left = next((o for o in outcomes if not o.restored), None)
    if left is None:
        done.append(f"restored {rows} damaged rows in {len(restored)} blocks from their source files in {source}")
    else:
        done.append(f"--source restored {len(restored)} of {len(outcomes)} damaged blocks, not the others (rows "
                    f"{left.start}-{left.stop - 1}: {left.reason})")
    return verify_store(path)


def _refuse_a_set(path: str) -> None:
    """A one-line ConfigError when ``path`` names a set of parts (a manifest, or a glob that matches): repair
    rewrites one store, so it names the parts to repair one by one.  A glob that matches nothing, or a manifest
    that is not one, is the one-line error of :func:`~h5stream.store.partset.part_paths`."""
    import os

    from h5stream.errors import ConfigError
    from h5stream.store.partset import part_paths

    if os.path.exists(path) and not path.endswith(".json"):
        return
    parts = part_paths(path)
    if parts is not None:
        raise ConfigError(f"{path}: names a set of {len(parts)} parts, and repair rewrites one store; repair each "
                          f"part that `h5stream verify {path}` names (h5stream repair {parts[0]})")


def _report_damage(path: str, result, note: str = "") -> int:
    """Name the damaged rows (stderr, one line) and list the source files they came from (stdout)."""
    named, unnamed = _damaged_paths(path, result.bad)
    out = sys.stdout.buffer
    try:
        for stored in named:
            out.write(stored + b"\n")
        out.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:  # stdout's, not the store's: repair's own handler would blame the store
        from h5stream.errors import OutputWriteError

        raise OutputWriteError.of_stdout(exc) from None
    first = result.bad[0]
    from h5stream.store.rowdigest import damage_text

    what = "cannot be read" if first.parts == ("unreadable",) else damage_text(first)
    rows = sum(b.stop - b.start for b in result.bad)
    listed = (f"or ingest again the {len(named)} source files listed on stdout (paths relative to the ingest's "
              "source folder)") if named else "or ingest the source again"
    if unnamed:
        listed += f"; {unnamed} of the damaged rows have damaged or unreadable paths, so the files are not known"
    print(f"h5stream: error: {path}: rows {first.start}-{first.stop - 1} {what}; {len(result.bad)} of "
          f"{result.blocks} blocks damaged ({rows} rows); repair cannot restore their bytes: restore the file "
          f"from a copy, {listed}{note}", file=sys.stderr)
    return EXIT_DAMAGED


def _damaged_paths(path: str, bad) -> tuple[list[bytes], int]:
    """``(stored paths of the damaged rows whose paths matched their checksum, count of the other damaged rows)``:
    a block whose paths differ, or that could not be read, names no file."""
    import h5py
    import numpy as np

    from h5stream.store import pathrows, schema
    from h5stream.store.checksum import readable_by_h5py, row_reader

    named_blocks = [b for b in bad if "paths" not in b.parts and b.parts != ("unreadable",)]
    unnamed = sum(b.stop - b.start for b in bad) - sum(b.stop - b.start for b in named_blocks)
    if not named_blocks:
        return [], unnamed
    with h5py.File(path, "r", locking=False) as f:
        node = f[pathrows.row_node(f)]
        dtype, via_h5py = node.dtype, readable_by_h5py(node)
    source = row_reader(path, via_h5py)
    named: list[bytes] = []
    try:
        for b in named_blocks:
            got = source.read(schema.PATHS, b.start, b.stop, np.empty(b.stop - b.start, dtype))
            named.extend(got.to_bytes() if isinstance(got, pathrows.PathRows) else (bytes(p) for p in got))
    finally:
        source.close()
    return named, unnamed
