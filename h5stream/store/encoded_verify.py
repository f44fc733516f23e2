"""``h5stream verify`` of an encoded store: every committed block's encoded bytes, labels and paths checked
against its digests (see :mod:`h5stream.store.encoded` for what the image digest covers).

Reads block by block with plain h5py (a URL too), on a handle of its own, in the calling thread; a block HDF5
cannot read is reported as unreadable and the next one is read.
"""

from __future__ import annotations

import time

from h5stream.store import schema
from h5stream.store.encoded import EncodedArray


def verify_encoded(meta, t0: float, expected_of, progress=None):
    """The :class:`~h5stream.store.checksum.VerifyResult` of the encoded store ``meta`` (:func:`read_meta`'s);
    ``expected_of``: :func:`h5stream.store.checksum._expected`; ``progress(done_bytes, total_bytes)`` after each
    block."""
    from h5stream.store.access import open_h5_readonly
    from h5stream.store.checksum import ALGORITHM, PARTS, BadBlock, VerifyResult, block_digests, tail_from_json

    block_rows = meta.block_rows
    bad: list[BadBlock] = []
    with open_h5_readonly(meta.path, native_driver=True, remote=meta.remote, rdcc_nbytes=0) as f:
        rows = int(f.attrs.get(schema.ATTR_ENCODED_COMMITTED, meta.rows))
        n_blocks = -(-rows // block_rows)
        expected = expected_of(f, rows, block_rows, meta.path)
        if expected is None:
            return VerifyResult(meta.path, None, rows, block_rows, n_blocks, (), ((0, rows),) if rows else (), 0,
                                time.perf_counter() - t0)
        tail = tail_from_json(f.attrs.get(schema.ATTR_CHECKSUM_TAIL))
        images = EncodedArray.of(f)
        labels, paths = f[schema.LABELS], f[schema.PATHS]
        total = images.byte_range(0, rows)[1]
        done = 0
        for b0 in range(0, rows, block_rows):
            b1 = min(b0 + block_rows, rows)
            want, covered = expected[b0 // block_rows]
            try:
                got = block_digests(images.read(b0, covered), labels[b0:covered], paths[b0:covered])
            except (OSError, ValueError, IndexError) as exc:
                bad.append(BadBlock(b0, b1, ("unreadable",), str(exc).splitlines()[0] if str(exc) else ""))
                continue
            parts = tuple(p for p, g, w in zip(PARTS, got, want) if g != w)
            if parts:
                bad.append(BadBlock(b0, b1, parts))
            done = images.byte_range(0, b1)[1]
            if progress is not None:
                progress(done, total)
    uncommitted = (rows, tail[0]) if tail is not None and tail[0] > rows else None
    return VerifyResult(meta.path, ALGORITHM, rows, block_rows, n_blocks, tuple(bad), (), total,
                        time.perf_counter() - t0, uncommitted)
