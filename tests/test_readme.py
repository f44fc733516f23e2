"""The README's quick start runs exactly as written: its shell and Python blocks, in order, in an empty folder.

The blocks are read from README.md (every fenced block between the ``## Quick start`` heading and the next ``##``
heading) and run unchanged: shell blocks with ``bash -eu -o pipefail``, Python blocks as a script, all in one
temporary folder, with ``h5stream`` and ``python`` on PATH meaning this checkout and this interpreter.  The Python
blocks run once per Keras backend, with ``KERAS_BACKEND`` set as the quick start tells a user to; for JAX and torch
TensorFlow cannot be imported, as on a machine that has only that framework.
"""

from __future__ import annotations

import importlib.util
import os
import re
import stat
import subprocess
import sys

import pytest

pytestmark = pytest.mark.usefixtures("no_leaks")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
SECTION = "Quick start"
SHELL, PYTHON = ("sh", "bash", "shell"), ("python", "py")
FENCE = re.compile(r"^```[ \t]*([\w+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def section_blocks(markdown: str, heading: str = SECTION) -> list[tuple[str, str]]:
    """``[(language, code)]`` of the fenced blocks under the level-2 ``heading``, in order.

    Raises ValueError if the heading is missing or a block's language is not one the test can run.
    """
    start = re.search(rf"^##[ \t]+{re.escape(heading)}[ \t]*$", markdown, re.MULTILINE | re.IGNORECASE)
    if start is None:
        raise ValueError(f"README.md has no '## {heading}' heading")
    end = re.search(r"^##[ \t]", markdown[start.end():], re.MULTILINE)
    body = markdown[start.end(): start.end() + end.start() if end else len(markdown)]
    blocks = []
    for match in FENCE.finditer(body):
        language, code = match.group(1).lower(), match.group(2)
        if language not in SHELL + PYTHON:
            raise ValueError(f"the {heading} section has a ```{language} block this test cannot run; use sh or python")
        blocks.append(("sh" if language in SHELL else "python", code))
    return blocks


def _shims(bin_dir) -> None:
    """``h5stream`` and ``python`` commands that run this checkout with the interpreter running the tests."""
    os.makedirs(bin_dir)
    for name, command in (("python", f'exec "{sys.executable}" "$@"'),
                          ("h5stream", f'exec "{sys.executable}" -m h5stream "$@"')):
        path = os.path.join(bin_dir, name)
        with open(path, "w") as f:
            f.write(f"#!/bin/sh\n{command}\n")
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


BACKENDS = ("tensorflow", "jax", "torch")


def _without_tensorflow(folder) -> str:
    """A folder that, first on ``PYTHONPATH``, makes ``import tensorflow`` fail as where it is not installed."""
    package = folder / "tensorflow"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'tensorflow'\", name='tensorflow')\n", encoding="utf-8")
    return str(folder)


def test_the_quick_start_says_how_to_pick_the_keras_backend():
    """A JAX or torch user must learn to set KERAS_BACKEND before ``import keras`` (Keras' default is tensorflow)."""
    with open(README, encoding="utf-8") as f:
        markdown = f.read()
    start = markdown.index("## Quick start")
    section = markdown[start:markdown.index("\n## ", start + 1)]
    for backend in BACKENDS[1:]:
        assert f"KERAS_BACKEND={backend}" in section, backend
    assert "No module named 'tensorflow'" in section


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_quick_start_runs_as_written(tmp_path, backend):
    with open(README, encoding="utf-8") as f:
        blocks = section_blocks(f.read())
    languages = [language for language, _code in blocks]
    assert "sh" in languages and "python" in languages, \
        f"the quick start should have shell and Python blocks: {languages}"

    work, bin_dir = tmp_path / "work", tmp_path / "bin"
    work.mkdir()
    _shims(bin_dir)
    paths = [ROOT, os.environ.get("PYTHONPATH")]
    if backend != "tensorflow":
        paths.insert(0, _without_tensorflow(tmp_path / "no_tf"))
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join(p for p in paths if p), KERAS_BACKEND=backend,
               TF_CPP_MIN_LOG_LEVEL="2", TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1")
    for number, (language, code) in enumerate(blocks, 1):
        if language == "sh":
            argv = ["bash", "-eu", "-o", "pipefail", "-c", code]
        else:
            needs_keras = re.search(r"^import keras|^from keras", code, re.MULTILINE)
            if needs_keras:
                for module in ("keras", backend):
                    if importlib.util.find_spec(module) is None:
                        pytest.skip(f"the quick start's Python block on {backend} needs {module}, not installed")
            script = tmp_path / f"block_{number}.py"
            script.write_text(code, encoding="utf-8")
            argv = [sys.executable, str(script)]
        proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True,
                              timeout=600)  # a safety net: the whole quick start takes well under a minute
        assert proc.returncode == 0, (f"quick-start block {number} ({language}, {backend}) failed:\n{code}\n"
                                      f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        if language == "python" and needs_keras:
            assert f"Keras backend: {backend}" in proc.stdout, proc.stdout[-3000:]


def test_blocks_are_taken_from_the_section_only_and_in_order():
    markdown = ("# t\n```python\nnot this\n```\n## Quick start\ntext\n```sh\necho 1\n```\nmore\n"
                "```python\nprint(2)\n```\n### sub\n```bash\necho 3\n```\n## Next\n```sh\nnot this either\n```\n")
    assert section_blocks(markdown) == [("sh", "echo 1\n"), ("python", "print(2)\n"), ("sh", "echo 3\n")]
    with pytest.raises(ValueError, match="cannot run"):
        section_blocks("## Quick start\n```console\n$ h5stream info x\n```\n")
    with pytest.raises(ValueError, match="no '## Quick start'"):
        section_blocks("# nothing here\n")


def _module_table(markdown: str) -> list[str]:
    """First-column paths of the table under ``## Modules``."""
    section = markdown.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, re.MULTILINE)


def test_the_module_table_of_the_design_doc_matches_the_package():
    with open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8") as f:
        listed = _module_table(f.read())
    package = os.path.join(ROOT, "h5stream")
    modules = set()
    for folder, _dirs, files in os.walk(package):
        for name in files:
            rel = os.path.relpath(os.path.join(folder, name), package).replace(os.sep, "/")
            if name.endswith(".py") and not (name == "__init__.py" and "/" in rel):  # subpackages' __init__ re-export
                modules.add(rel)
    assert len(listed) == len(set(listed)), "a module is listed twice"
    assert sorted(set(listed) - modules) == [], "docs/design.md lists modules that do not exist"
    assert sorted(modules - set(listed)) == [], "modules missing from the table in docs/design.md"


def test_every_test_the_reliability_doc_names_exists_where_it_says():
    """docs/reliability.md backs each guarantee with a test: a renamed or moved test must not leave it dangling."""
    with open(os.path.join(ROOT, "docs", "reliability.md")) as f:
        doc = f.read()
    cited = re.findall(r"`(?:(test_[a-z0-9_]+\.py)::)?(test_[a-z0-9_]+)`", doc)
    assert len(cited) > 20
    tests_dir = os.path.join(ROOT, "tests")
    sources = {}
    for name in os.listdir(tests_dir):
        if name.startswith("test_") and name.endswith(".py"):
            with open(os.path.join(tests_dir, name)) as f:
                sources[name] = f.read()
    for module, name in cited:
        where = [module] if module else list(sources)
        assert any(f"def {name}(" in sources[m] for m in where if m in sources), (module, name)


def test_the_readme_is_a_short_user_document():
    """What it is, install, quick start, features, one table per benchmark; the detail lives in docs/."""
    with open(README, encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= 250, len(lines)
    for doc in ("docs/design.md", "docs/performance.md", "docs/reliability.md"):
        assert any(doc in line for line in lines), doc
