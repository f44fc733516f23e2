"""``h5stream ingest --part i/N``: parts that together hold every file once, recorded as parts of one listing."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest

from h5stream.ingest.parts import parse_part, part_of
from h5stream.store import pathrows
from h5stream.store.meta import read_meta


def _paths(path) -> set[str]:
    with h5py.File(path, "r") as f:
        n = int(f.attrs["committed_rows"])
        return {p.decode() for p in pathrows.stored_bytes(f, 0, n)}


def _classes(path):
    with h5py.File(path, "r") as f:
        n = int(f.attrs["committed_rows"])
        return dict(zip((p.decode() for p in pathrows.stored_bytes(f, 0, n)), f["labels"][:n].tolist()))


def test_parts_hold_every_file_once_and_record_the_set(class_src, h5cli, tmp_path):
    root, written = class_src
    whole = tmp_path / "whole.h5"
    assert h5cli("ingest", root, whole, "--size", "8", "--workers", "0")[0] == 0
    seen: dict[str, int] = {}
    listings = set()
    for i in range(3):
        out = tmp_path / f"p{i}.h5"
        code, stdout, err = h5cli("ingest", root, out, "--size", "8", "--workers", "0", "--part", f"{i}/3")
        assert code == 0, err
        meta = read_meta(str(out))
        assert (meta.part.index, meta.part.count) == (i, 3)
        assert meta.class_names == ("bird", "cat", "dog")  # the whole source's classes, in every part
        listings.add(meta.part.listing)
        for rel, label in _classes(out).items():
            assert rel not in seen
            assert part_of(rel, 3) == i
            seen[rel] = label
    assert len(listings) == 1
    assert seen == _classes(whole)  # every file once, with the label a whole ingest gives it
    assert read_meta(str(whole)).part is None


def test_listing_identity_changes_with_the_source(class_src_copy, h5cli, tmp_path):
    root, _ = class_src_copy
    assert h5cli("ingest", root, tmp_path / "a.h5", "--size", "8", "--workers", "0", "--part", "0/2")[0] == 0
    os.remove(os.path.join(root, sorted(os.listdir(root))[0], sorted(os.listdir(os.path.join(
        root, sorted(os.listdir(root))[0])))[0]))
    assert h5cli("ingest", root, tmp_path / "b.h5", "--size", "8", "--workers", "0", "--part", "1/2")[0] == 0
    assert read_meta(str(tmp_path / "a.h5")).part.listing != read_meta(str(tmp_path / "b.h5")).part.listing


@pytest.mark.parametrize("bad, says", [("3/3", "must be 0..2"), ("1", "INDEX/COUNT"), ("0/0", "COUNT must be"),
                                       ("-1/2", "INDEX/COUNT"), ("a/b", "INDEX/COUNT")])
def test_bad_part_is_one_line(class_src, h5cli, tmp_path, bad, says):
    code, out, err = h5cli("ingest", class_src[0], tmp_path / "o.h5", f"--part={bad}")
    assert code != 0 and says in err and err.startswith("h5stream: error:") and err.count("\n") == 1
    assert not (tmp_path / "o.h5").exists()
    with pytest.raises(ValueError):
        parse_part(bad)


def test_append_resumes_a_part_and_refuses_another(class_src, h5cli, tmp_path):
    root, _ = class_src
    out = tmp_path / "p1.h5"
    ref = tmp_path / "ref.h5"
    assert h5cli("ingest", root, ref, "--size", "8", "--workers", "0", "--part", "1/2")[0] == 0
    # a part stopped after its first commit: what a killed run leaves (rows committed, ingest unfinished)
    assert h5cli("ingest", root, out, "--size", "8", "--workers", "0", "--part", "1/2", "--block-rows", "2",
                 "--commit-rows", "2")[0] == 0
    with h5py.File(out, "r+") as f:
        f.attrs["committed_rows"] = 2
    meta = read_meta(str(out))
    assert not meta.ingest.finished and "--part 1/2" in " ".join(meta.ingest.options)
    code, _, err = h5cli("ingest", root, out, "--append", "--part", "0/2", "--workers", "0")
    assert code != 0 and "part 1/2" in err and "--part 1/2" in err
    code, _, err = h5cli("ingest", root, out, "--append", "--workers", "0")
    assert code != 0 and "part 1/2" in err
    code, stdout, err = h5cli("ingest", root, out, "--append", "--part", "1/2", "--workers", "0")
    assert code == 0, err
    assert _paths(out) == _paths(ref)
    assert read_meta(str(out)).ingest.finished
    assert read_meta(str(out)).part == read_meta(str(ref)).part


def test_ingested_parts_stream_info_verify_and_preview_as_one_set(class_src, h5cli, tmp_path):
    import json as _json

    import numpy as np

    import h5stream

    root, written = class_src
    for i in range(3):
        assert h5cli("ingest", root, tmp_path / f"part-{i}.h5", "--size", "8", "--workers", "0",
                     "--part", f"{i}/3")[0] == 0
    parts = [str(tmp_path / f"part-{i}.h5") for i in range(3)]
    with h5stream.open(str(tmp_path / "part-*.h5"), batch_size=5, seed=0) as s:
        assert s.rows == len(written) and s.class_names == ["bird", "cat", "dog"]
        assert sorted(s.file_paths) == sorted(rel for rel, _ in written)
        labels = np.concatenate([y for _, y in s])
    assert sorted(labels.tolist()) == sorted(label for _, label in written)

    code, out, err = h5cli("info", *parts, "--json")
    info = _json.loads(out)
    assert code == 0 and info["rows"] == len(written) and info["part_of"] == ["0/3", "1/3", "2/3"]
    assert info["classes"] == {"bird": 5, "cat": 7, "dog": 6}
    code, out, _ = h5cli("info", str(tmp_path / "part-*.h5"))
    assert code == 0 and "a set of 3 parts" in out and "part 2 (ingest --part 2/3)" in out
    code, out, _ = h5cli("info", parts[1])
    assert code == 0 and f"part            1/3 of the source listing {info['parts'][1]['part']['listing']}" in out
    code, out, err = h5cli("verify", *parts)
    assert code == 0 and "all 3 parts" in out, err
    code, out, err = h5cli("preview", *parts, "--out", tmp_path / "grid.png", "--rows", "2", "--cols", "3")
    assert code == 0 and (tmp_path / "grid.png").exists(), err

    code, out, err = h5cli("verify", parts[0], parts[2])  # a part missing: one line naming it
    assert code != 0 and "missing part 1/3" in err and err.count("\n") == 1
    code, out, err = h5cli("info", parts[0], parts[2])
    assert code != 0 and "missing part 1/3" in err


def test_a_part_killed_mid_run_is_unfinished_and_append_finishes_it_as_an_uninterrupted_run(tmp_path, h5cli):
    import signal
    import subprocess
    import sys
    import time

    from conftest import committed_rows
    from h5stream.samples import make_class_folder

    root = tmp_path / "src"
    make_class_folder(root, classes=2, per_class=300, size=(48, 64), fmt="jpg", seed=4)
    ref, out = tmp_path / "ref.h5", tmp_path / "part.h5"
    flags = ["--size", "32", "--workers", "0", "--part", "1/2", "--block-rows", "8", "--commit-rows", "8"]
    assert h5cli("ingest", root, ref, *flags)[0] == 0
    cmd = [sys.executable, "-m", "h5stream", "ingest", str(root), str(out), *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline and committed_rows(out) == 0:
            time.sleep(0.005)  # polling interval, bounded by the deadline; not a synchronisation sleep
        assert proc.poll() is None, f"the part ended before it could be killed: {proc.stderr.read().decode()}"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    meta = read_meta(str(out))
    assert 0 < meta.rows < read_meta(str(ref)).rows and not meta.ingest.finished
    assert "--part 1/2" in " ".join(meta.ingest.options)
    code, stdout, err = h5cli("ingest", root, out, *flags, "--append")
    assert code == 0 and f"already stored {meta.rows}" in stdout, err
    with h5py.File(out, "r") as a, h5py.File(ref, "r") as b:
        n = int(b.attrs["committed_rows"])
        assert int(a.attrs["committed_rows"]) == n
        assert pathrows.stored_bytes(a, 0, n) == pathrows.stored_bytes(b, 0, n)  # the same rows in the same order
        assert np.array_equal(a["images"][:n], b["images"][:n]) and np.array_equal(a["labels"][:n], b["labels"][:n])
    assert read_meta(str(out)).part == read_meta(str(ref)).part and read_meta(str(out)).ingest.finished


def test_an_unfinished_part_warns_by_name_when_the_set_is_opened(class_src, h5cli, tmp_path):
    import warnings

    import h5stream

    root, _ = class_src
    parts = [tmp_path / f"p{i}.h5" for i in range(2)]
    for i, out in enumerate(parts):
        assert h5cli("ingest", root, out, "--size", "8", "--workers", "0", "--part", f"{i}/2", "--block-rows", "2",
                     "--commit-rows", "2")[0] == 0
    with h5py.File(parts[1], "r+") as f:  # what a killed run leaves: rows committed, ingest unfinished
        f.attrs["committed_rows"] = 2
    with pytest.warns(UserWarning, match=r"p1\.h5: .*--part 1/2"):
        h5stream.open([str(p) for p in parts], batch_size=4).close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        h5stream.open([str(p) for p in parts], batch_size=4, allow_unfinished=True).close()
    assert [str(w.message) for w in caught if "--part" in str(w.message)] == []  # only the uncommitted rows' one
    assert any("never committed" in str(w.message) for w in caught)


def test_repair_keeps_a_part_that_part(class_src, h5cli, tmp_path):
    from h5stream.store.handle import mark_flushing

    out = tmp_path / "p.h5"
    assert h5cli("ingest", class_src[0], out, "--size", "8", "--workers", "0", "--part", "2/3")[0] == 0
    before = read_meta(str(out)).part
    mark_flushing(str(out))  # a writer stopped while HDF5 rewrote the file: repair rebuilds it from its rows
    code, stdout, err = h5cli("repair", out)
    assert code == 0 and "rebuilt" in stdout, err
    assert read_meta(str(out)).part == before


def test_repair_of_a_set_is_one_line_naming_a_part_to_repair(h5cli, tmp_path):
    import json

    from h5stream.store.writer import write_arrays

    parts = []
    for k in range(2):
        parts.append(tmp_path / f"part-{k}.h5")
        write_arrays(parts[-1], np.full((5, 4, 4, 3), k, np.uint8), np.arange(5) % 2, block_rows=4)
    manifest = tmp_path / "set.json"
    manifest.write_text(json.dumps({"h5stream_parts": 1, "parts": ["part-0.h5", "part-1.h5"]}))
    before = sorted(os.listdir(tmp_path))
    for spec in (manifest, tmp_path / "part-*.h5"):
        code, stdout, err = h5cli("repair", spec)
        assert code != 0 and stdout == ""
        assert err.startswith(f"h5stream: error: {spec}: names a set of 2 parts, and repair rewrites one store; ")
        assert err.endswith(f"(h5stream repair {parts[0]})\n") and err.count("\n") == 1
    assert sorted(os.listdir(tmp_path)) == before  # no lock file, nothing written


def test_a_part_with_encoding_auto_is_refused_in_one_line_before_anything_is_written(class_src, h5cli, tmp_path):
    out = tmp_path / "p.h5"
    code, stdout, err = h5cli("ingest", class_src[0], out, "--size", "8", "--workers", "0", "--part", "0/2",
                              "--encoding", "auto")
    assert code != 0 and err.startswith("h5stream: error: --encoding auto with --part: ") and err.count("\n") == 1
    assert "give every part --encoding jpeg, or --encoding raw" in err
    assert os.listdir(tmp_path) == []
    code, stdout, err = h5cli("ingest", class_src[0], out, "--size", "8", "--workers", "0", "--part", "0/2",
                              "--encoding", "jpeg")
    assert code == 0, err
