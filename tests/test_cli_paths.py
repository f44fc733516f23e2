"""Each store command on a path it cannot use says why in one line: a folder it may not enter, a URL where a
local file is needed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import unprivileged_argv

pytestmark = pytest.mark.usefixtures("no_leaks")


def _flipped_copy(store, tmp_path, dataset: str):
    """A copy of ``store`` with one bit of ``dataset``'s first chunk flipped."""
    import h5py

    copy = tmp_path / "s.h5"
    shutil.copyfile(store, copy)
    with h5py.File(copy, "r", locking=False) as f:
        at = f[dataset].id.get_chunk_info(0).byte_offset + 2
    with open(copy, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)[0]
        fh.seek(at)
        fh.write(bytes([byte ^ 1]))
    return copy


@pytest.mark.parametrize("command", ["info", "verify", "repair"])
def test_a_store_in_a_folder_without_search_permission_is_a_permission_error(small_class_store, tmp_path, command):
    """repair said 'no such file' (os.path.exists is False when a folder cannot be entered)."""
    prefix = unprivileged_argv()
    if prefix is None:
        pytest.skip("cannot run a command without the right to ignore file modes here")
    folder = tmp_path / "closed"
    folder.mkdir()
    store = folder / "s.h5"
    shutil.copyfile(small_class_store, store)
    folder.chmod(0o600)  # readable listing, no search (x): the file cannot be reached
    try:
        done = subprocess.run([*prefix, sys.executable, "-m", "h5stream", command, str(store)], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    finally:
        folder.chmod(0o755)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"h5stream: error: {store}: permission denied; ") and done.stderr.count("\n") == 1


def test_repair_of_a_url_says_it_rewrites_a_local_file_and_hides_the_password(h5cli):
    """It said '...: no such file' for any URL."""
    code, out, err = h5cli("repair", "https://user:secret@127.0.0.1:9/store.h5")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert err.startswith("h5stream: error: https://user:***@127.0.0.1:9/store.h5: repair rewrites a local store"), err


def test_repair_of_a_read_only_store_it_must_write_is_one_line_and_changes_nothing(small_class_store, tmp_path):
    """A damaged row digest is written again in place: into a file this user may not write, that was a
    PermissionError traceback from os.open."""
    import hashlib

    prefix = unprivileged_argv()
    if prefix is None:
        pytest.skip("cannot run a command without the right to ignore file modes here")
    store = _flipped_copy(small_class_store, tmp_path, "row_digests")
    store.chmod(0o444)
    before = hashlib.sha256(store.read_bytes()).hexdigest()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([*prefix, sys.executable, "-m", "h5stream", "repair", str(store)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 1, done.stderr
    assert done.stderr == (f"h5stream: error: {store}: repair cannot write to the store (Permission denied); it writes "
                           f"the mended bytes in place: give this user write access to it (e.g. chmod u+w {store}), "
                           "or repair a copy\n")
    assert hashlib.sha256(store.read_bytes()).hexdigest() == before
    store.chmod(0o644)
    done = subprocess.run([*prefix, sys.executable, "-m", "h5stream", "repair", str(store)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0 and "wrote again the digests of" in done.stdout, done.stderr


def test_repair_listing_damaged_files_into_a_full_disk_blames_stdout_not_the_store(small_class_store, tmp_path):
    """repair lists the damaged rows' files on stdout; on a full disk that write's ENOSPC was reported as 'repair
    cannot write to the store'."""

    store = _flipped_copy(small_class_store, tmp_path, "images")
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "h5stream", "repair", str(store)], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr == ("h5stream: error: cannot write the output to stdout (No space left on device); free space "
                           "where it goes, or send it elsewhere\n")


@pytest.mark.parametrize("path", [123, None, {"a": 1}, ["ok", None]])
def test_open_of_something_that_names_no_store_is_one_error_saying_what_names_one(small_class_store, path):
    """It was os.fspath's bare 'expected str, bytes or os.PathLike object, not int', naming no argument."""
    import h5stream
    from h5stream.errors import StorePathError

    spec = [small_class_store if p == "ok" else p for p in path] if isinstance(path, list) else path
    with pytest.raises(TypeError) as info:
        h5stream.open(spec, batch_size=4)
    assert isinstance(info.value, StorePathError) and "\n" not in str(info.value)
    assert str(info.value).endswith(f"or a list of them; got {type(None if isinstance(path, list) else path).__name__}")


@pytest.mark.parametrize("path, what", [("", "the path is empty"), ("s.h5\0x", "a path cannot hold a NUL byte")])
def test_an_empty_path_or_one_with_a_nul_byte_is_one_line(h5cli, path, what):
    """An empty path said ': no such file; make one with `h5stream ingest SRC `'; a NUL byte was a ValueError
    traceback from the operating-system call."""
    import h5stream
    from h5stream.errors import ConfigError

    with pytest.raises(ConfigError, match=what):
        h5stream.open(path, batch_size=4)
    if "\0" not in path:  # argv cannot carry a NUL byte
        code, _out, err = h5cli("info", path)
        assert code == 1 and err == f"h5stream: error: open(''): {what}; name the store's file\n"
