"""`h5stream preview`: the PNG grid shows the stream's first images, at the documented size."""

import numpy as np
import pytest
from PIL import Image

from h5stream.cli import main
from h5stream.commands import preview
from h5stream.store.writer import write_arrays

ROWS, SIDE = 400, 24


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Row i is a flat image of grey level i % 256 (so a tile says which row it shows) with a bright corner."""
    path = tmp_path_factory.mktemp("preview") / "store.h5"
    images = np.repeat((np.arange(ROWS) % 256).astype(np.uint8), SIDE * SIDE * 3).reshape(ROWS, SIDE, SIDE, 3)
    images[:, :4, :4] = 255  # asymmetric, so a flip or rotation changes the tile
    labels = np.arange(ROWS) % 4
    write_arrays(path, images, labels, class_names=["cat", "dog", "owl", "eel"], block_rows=8)
    return str(path)


def run_preview(path, out, *extra):
    code = main(["preview", path, "--out", str(out), *extra])
    assert code == 0
    return Image.open(out)


def test_grid_has_the_documented_pixel_size(store, tmp_path):
    img = run_preview(store, tmp_path / "g.png", "--rows", "2", "--cols", "3")
    scale = -(-preview.MIN_TILE_PX // SIDE)
    pad, title = preview.PAD_PX, preview.TITLE_PX
    assert img.size == (3 * SIDE * scale + 4 * pad, 2 * (SIDE * scale + title) + 3 * pad)
    assert img.size == preview.grid_size(2, 3, (SIDE, SIDE))[:2]
    assert img.mode == "RGB"


def test_tiles_are_the_streams_first_images_in_order(store, tmp_path):
    import h5stream

    grid = run_preview(store, tmp_path / "g.png", "--rows", "2", "--cols", "2", "--seed", "5", "--scale", "1")
    img = np.asarray(grid)
    with h5stream.open(store, batch_size=4, memory_budget=None, seed=5) as s:
        x, _ = next(iter(s))
    for i in range(4):
        r, c = divmod(i, 2)
        top = preview.PAD_PX + r * (SIDE + preview.TITLE_PX + preview.PAD_PX) + preview.TITLE_PX
        left = preview.PAD_PX + c * (SIDE + preview.PAD_PX)
        assert np.array_equal(img[top:top + SIDE, left:left + SIDE], x[i])


def test_same_seed_same_png_other_seed_other_png(store, tmp_path):
    a = run_preview(store, tmp_path / "a.png", "--seed", "1")
    b = run_preview(store, tmp_path / "b.png", "--seed", "1")
    c = run_preview(store, tmp_path / "c.png", "--seed", "2")
    assert np.array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(a), np.asarray(c))


def test_augmentation_changes_the_png(store, tmp_path):
    pytest.importorskip("h5stream.augment", reason="augmentation not built")
    from h5stream import augment

    if not hasattr(augment, "Augment"):
        pytest.skip("h5stream.augment.Augment not built yet")
    plain = run_preview(store, tmp_path / "p.png", "--seed", "3")
    flipped = run_preview(store, tmp_path / "f.png", "--seed", "3", "--augment",
                          '{"horizontal_flip": true, "vertical_flip": true}')
    standard = run_preview(store, tmp_path / "s.png", "--seed", "3", "--augment", "standard")
    assert plain.size == flipped.size == standard.size
    assert not np.array_equal(np.asarray(plain), np.asarray(flipped))
    assert not np.array_equal(np.asarray(plain), np.asarray(standard))


def test_titles_name_the_class_or_the_values(store):
    from h5stream.store.meta import read_meta

    meta = read_meta(store)
    assert preview.label_title(np.int64(2), meta) == "owl"
    regression = type("M", (), {"label_kind": "regression"})()
    assert preview.label_title(np.array([0.12345, 7.0], dtype=np.float32), regression) == "0.123, 7"


def test_to_display_scales_floats():
    assert preview.to_display(np.full((2, 2, 3), 0.5, np.float32)).max() == 128
    assert preview.to_display(np.full((2, 2, 3), 200.0, np.float32)).max() == 200
    std = preview.to_display(np.array([[[-2.0], [2.0]]], np.float32))
    assert std.min() == 0 and std.max() == 255


def test_bad_preview_arguments(store, tmp_path, capsys):
    assert main(["preview", store, "--out", str(tmp_path / "x.png"), "--rows", "0"]) == 1
    assert "--rows" in capsys.readouterr().err
    assert main(["preview", store, "--out", str(tmp_path / "no" / "x.png")]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["preview", store]) == 2  # --out is required


@pytest.mark.parametrize("extra", [("--rows", "1000", "--cols", "1000"), ("--scale", "100000"),
                                   ("--rows", "100000000", "--cols", "100000000")])
def test_a_grid_too_large_is_one_line_before_anything_is_read(store, tmp_path, extra):
    """The canvas is allocated whole: --rows 1000 --cols 1000 of 24 px tiles asked for 30 GB (a MemoryError
    traceback, or the OOM killer); --rows/--cols of 10**8 for a batch of 10**16 rows.  Refused in one line naming
    a grid that fits, in a child whose address space is capped so that the old behaviour fails rather than
    exhausting the machine."""
    import resource
    import subprocess
    import sys

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    out = tmp_path / "grid.png"
    child = subprocess.run([sys.executable, "-m", "h5stream", "preview", store, "--out", str(out), *extra],
                           capture_output=True, text=True, preexec_fn=cap, timeout=300)
    assert child.returncode == 1, child.stderr
    assert child.stderr.count("\n") == 1 and child.stderr.startswith("h5stream: error: --rows"), child.stderr
    assert "pixels a preview may have" in child.stderr and not out.exists()
    if child.stderr.rstrip().endswith(" fit"):
        side = int(child.stderr.rsplit("--cols ", 1)[1].split()[0])
        width, height, _ = preview.grid_size(side, side, (SIDE, SIDE), int(extra[1]) if extra[0] == "--scale" else None)
        assert width * height <= preview.MAX_GRID_PIXELS
        assert (width + SIDE) * (height + SIDE) > preview.MAX_GRID_PIXELS * 0.95  # the largest square, near enough


def _fsize_capped(limit_bytes: int):
    import resource

    def cap():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return cap


def test_a_failed_write_leaves_the_old_file_and_no_partial_one(store, tmp_path):
    """RLIMIT_FSIZE (as a full disk) in the middle of the PNG: was a Pillow OSError traceback after truncating the
    file that was there; now one line, the old file as it was, no temporary file left."""
    import subprocess
    import sys

    out = tmp_path / "grid.png"
    out.write_bytes(b"the previous grid")
    child = subprocess.run([sys.executable, "-m", "h5stream", "preview", store, "--out", str(out)],
                           capture_output=True, text=True, preexec_fn=_fsize_capped(4096), timeout=300)
    assert child.returncode == 1, child.stderr
    assert child.stderr.count("\n") == 1 and child.stderr.startswith(f"h5stream: error: --out {out}: cannot write it ")
    assert out.read_bytes() == b"the previous grid" and sorted(p.name for p in tmp_path.iterdir()) == ["grid.png"]


def test_a_symlink_at_the_output_path_is_replaced_not_written_through(store, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"not a png")
    out = tmp_path / "grid.png"
    out.symlink_to(victim)
    image = run_preview(store, out)
    assert image.format == "PNG" and not out.is_symlink()
    assert victim.read_bytes() == b"not a png"
    assert oct(out.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    import os

    mask = os.umask(0o022)
    os.umask(mask)
    return mask
