"""Imports: `import h5stream`, `h5stream ingest` and `h5stream info` never import a deep-learning framework, the CLI
imports a subcommand only to run it, and imports point one way over the whole package (parsed with `ast`)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

FRAMEWORKS = ("tensorflow", "keras", "torch", "jax")

SCRIPT = r"""
import json, sys
import h5stream
from h5stream import cli
after_import = sorted(m for m in sys.modules if m.split(".")[0] in {fw})
from h5stream.samples import make_class_folder
make_class_folder(sys.argv[1] + "/src", classes=2, per_class=3, size=(8, 8))
rc_ingest = cli.main(["ingest", sys.argv[1] + "/src", sys.argv[1] + "/o.h5", "--size", "8", "--workers", "1"])
rc_info = cli.main(["info", sys.argv[1] + "/o.h5", "--json"])
after_cli = sorted(m for m in sys.modules if m.split(".")[0] in {fw})
print(json.dumps({{"rc": [rc_ingest, rc_info], "after_import": after_import, "after_cli": after_cli}}))
""".format(fw=set(FRAMEWORKS))


def test_no_framework_is_imported(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rc"] == [0, 0]
    assert result["after_import"] == [] and result["after_cli"] == []


PIN_SCRIPT = r"""
import json, os, sys
import h5stream.cli as cli
numpy_before = "numpy" in sys.modules  # the pin only works while numpy (and OpenBLAS) is not loaded yet
seen = {}
def fake_main():
    import numpy  # noqa: F401 - what a command does first
    seen["env"] = os.environ.get("OPENBLAS_NUM_THREADS")
    return 0
cli.main = fake_main
rc = cli.run()
print(json.dumps({"rc": rc, "numpy_before": numpy_before, "env": seen["env"]}))
"""


def _run_pin(env_value):
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if env_value is not None:
        env["OPENBLAS_NUM_THREADS"] = env_value
    proc = subprocess.run([sys.executable, "-c", PIN_SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_command_pins_openblas_to_one_thread_before_numpy_loads_unless_the_user_chose():
    pinned = _run_pin(None)
    assert pinned == {"rc": 0, "numpy_before": False, "env": "1"}
    assert _run_pin("3")["env"] == "3"  # the user's choice stands


def test_main_in_a_callers_process_leaves_the_environment_alone(tmp_path, monkeypatch):
    from h5stream import cli

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    assert cli.main(["info", str(tmp_path / "missing.h5")]) != 0
    assert "OPENBLAS_NUM_THREADS" not in os.environ


KERAS_ATTRIBUTE_SCRIPT = r"""
import json, sys
import h5stream
before = sorted(m for m in sys.modules if m.split(".")[0] == "keras")
weights = h5stream.keras.balanced_class_weight([0, 0, 0, 1])
print(json.dumps({"before": before, "weights": {str(k): float(v) for k, v in weights.items()},
                  "same": h5stream.keras is sys.modules["h5stream.keras"]}))
"""


def test_h5stream_keras_is_an_attribute_after_import_h5stream_and_imports_keras_only_when_used():
    pytest.importorskip("keras")
    proc = subprocess.run([sys.executable, "-c", KERAS_ATTRIBUTE_SCRIPT], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["before"] == []
    assert result["same"] is True
    assert result["weights"]["0"] < result["weights"]["1"]


# A package made unimportable the way Python documents it (None in sys.modules), in a process of its own.
MISSING_SCRIPT = r"""
import json, sys
blocked = sys.argv[1].split(",")
for name in blocked:
    sys.modules[name] = None
import h5stream
from h5stream import cli
what = sys.argv[2]
if what == "cli":
    sys.exit(cli.main(sys.argv[3:]))
with h5stream.open(sys.argv[3], batch_size=2, augment=h5stream.Augment(rotation_range=10)) as stream:
    try:
        if what == "augment":
            next(iter(stream))
        else:
            getattr(stream, what)()
    except h5stream.MissingDependencyError as exc:
        print(json.dumps({"error": str(exc), "is_import_error": isinstance(exc, ImportError)}))
"""


def _run_missing(blocked, what, *args):
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run([sys.executable, "-c", MISSING_SCRIPT, ",".join(blocked), what, *map(str, args)],
                          capture_output=True, text=True, timeout=300, env=env)


def _missing_error(blocked, what, store):
    proc = _run_missing(blocked, what, store)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["is_import_error"] and "\n" not in result["error"]
    return result["error"]


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    from h5stream import cli
    from h5stream.samples import make_class_folder

    root = tmp_path_factory.mktemp("missing")
    make_class_folder(root / "src", classes=2, per_class=3, size=(8, 8))
    assert cli.main(["ingest", str(root / "src"), str(root / "s.h5"), "--size", "8", "--workers", "0"]) == 0
    return root


def test_ingest_without_opencv_is_one_line_naming_the_package(small_store):
    out = small_store / "new.h5"
    proc = _run_missing(["cv2"], "cli", "ingest", small_store / "src", out, "--size", "8")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("h5stream: error: "), proc.stderr
    assert "pip install opencv-python-headless" in lines[0]
    assert "pip install --force-reinstall --no-deps opencv-python-headless" in lines[0]  # the shared-folder case
    assert not out.exists()


def test_augmentation_without_opencv_names_the_package(small_store):
    assert "pip install opencv-python-headless" in _missing_error(["cv2"], "augment", small_store / "s.h5")


def test_adapters_without_their_framework_name_what_to_install(small_store):
    store = small_store / "s.h5"
    assert "pip install keras" in _missing_error(["keras"], "keras", store)
    assert "pip install tensorflow" in _missing_error(["tensorflow"], "tf_dataset", store)
    assert "pip install torch" in _missing_error(["torch"], "torch", store)


def test_keras_without_its_backend_names_the_backend_and_the_alternatives(small_store):
    if importlib.util.find_spec("keras") is None:
        pytest.skip("keras is not installed")
    no_backend = _missing_error(["tensorflow"], "keras", small_store / "s.h5")  # keras is there, TensorFlow is not
    assert "backend 'tensorflow'" in no_backend and "pip install tensorflow" in no_backend
    assert "KERAS_BACKEND" in no_backend


# -- the direction of imports over the whole package -----------------------------------------------------------------

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "h5stream")

LAYERS = (
    ("python -m h5stream", ("h5stream.__main__",)),
    ("cli", ("h5stream.cli",)),
    ("commands", ("h5stream.commands",)),
    ("measurement", ("h5stream.measure",)),
    ("adapters", ("h5stream.adapters", "h5stream.keras")),
    ("public API", ("h5stream",)),
    ("open", ("h5stream.streaming.api",)),
    ("stream", ("h5stream.streaming.stream",)),
    ("feeder", ("h5stream.streaming.process_feed", "h5stream.streaming.feeder_protocol")),
    ("feed", ("h5stream.streaming.feeds", "h5stream.streaming.options")),
    ("config", ("h5stream.streaming.config",)),
    ("planning", ("h5stream.streaming.planning",)),
    ("budget", ("h5stream.streaming.budget",)),
    ("read / augment / ingest", ("h5stream.read", "h5stream.augment", "h5stream.ingest", "h5stream.labels")),
    ("order / store", ("h5stream.order", "h5stream.store")),
    ("remote transport", ("h5stream.remote",)),
    ("process pool, waits", ("h5stream.concurrency.procpool", "h5stream.concurrency.wait")),
    ("low level", ("h5stream.concurrency.spawn", "h5stream.memory.shm", "h5stream.concurrency.interrupt",
                   "h5stream._deps", "h5stream.samples", "h5stream._kwargs", "h5stream.concurrency.cores",
                   "h5stream.concurrency.gcpause", "h5stream.concurrency.guard")),
    ("fork safety", ("h5stream.concurrency.fork",)),
    ("lent memory", ("h5stream.memory.lend",)),
    ("raw I/O", ("h5stream.memory.rawio",)),
    ("errors", ("h5stream.errors", "h5stream._optnames")),
)
"""Top to bottom: a module imports only modules of the layers below its own, or of its own package (the first
two parts of the name: ``h5stream.store.meta`` may import ``h5stream.store.schema``)."""

ADAPTERS_MAY_IMPORT = ("h5stream", "h5stream.errors", "h5stream._deps", "h5stream.concurrency.wait",
                       "h5stream.concurrency.fork")
"""Besides each other, adapters use only the public API (and the one-line import errors, and the one stoppable
wait that every thread of the package waits with, and the fork check every owner of a resource makes)."""

ALLOWED_UPWARD = {
    # Stream.keras() / tf_dataset() / torch() hand the stream to its adapter, imported only when called.
    ("h5stream.streaming.stream", "h5stream.adapters.keras"),
    ("h5stream.streaming.stream", "h5stream.adapters.tf"),
    ("h5stream.streaming.stream", "h5stream.adapters.torch"),
}


def _modules() -> dict[str, str]:
    """Every module of the package: dotted name -> file."""
    found = {}
    for folder, _dirs, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), os.path.dirname(PACKAGE))[:-3].split(os.sep)
                found[".".join(rel[:-1] if rel[-1] == "__init__" else rel)] = os.path.join(folder, name)
    return found


def _imports(module: str, path: str, modules) -> set[str]:
    """The package modules ``module`` imports, anywhere in it (top level or inside functions), except under
    ``if TYPE_CHECKING:``; ``from h5stream import X`` counts as importing ``h5stream.X`` when that is a module."""
    import ast

    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    skipped = {id(n) for node in ast.walk(tree)
               if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
               for child in node.body for n in ast.walk(child)}
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "h5stream")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            if base.split(".")[0] != "h5stream":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    found.discard(module)
    return found


def _layer(module: str) -> int:
    best = None
    for rank, (_name, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (rank, len(prefix))
    assert best is not None, f"{module} is in no layer of tests/test_imports.py: add it"
    return best[0]


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_imports_point_down_the_layers_over_the_whole_package():
    modules = _modules()
    wrong = []
    for module, path in sorted(modules.items()):
        for target in sorted(_imports(module, path, modules)):
            if (module, target) in ALLOWED_UPWARD:
                continue
            if _package(module) == "h5stream.adapters" or module == "h5stream.keras":
                if target not in ADAPTERS_MAY_IMPORT and not target.startswith("h5stream.adapters."):
                    wrong.append(f"{module} -> {target} (adapters use the public API only)")
                continue
            mine, theirs = _layer(module), _layer(target)
            if theirs < mine or (theirs == mine and _package(module) != _package(target)):
                wrong.append(f"{module} ({LAYERS[mine][0]}) -> {target} ({LAYERS[theirs][0]})")
    assert wrong == []


KNOWN_CIRCLES: list[set[str]] = []
"""Import circles that exist and are due to go; any other circle fails the test below."""


def import_circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module of ``graph`` (module -> modules it imports):
    each is a set of modules that import one another round a circle.  Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        circles.append(component)
    return circles


def test_import_circles_are_found_in_a_graph():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}, "f": {"g"}, "g": {"f"}}
    assert sorted(map(sorted, import_circles(graph))) == [["a", "b", "c"], ["f", "g"]]
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circle_among_the_package_modules():
    """Over every import of the package, top level or inside a function (a function-level import still makes the
    two modules depend on each other), no module reaches itself again, but the known circles being removed."""
    modules = _modules()
    graph = {module: _imports(module, path, modules) & set(modules) for module, path in modules.items()}
    circles = import_circles(graph)
    assert [sorted(c) for c in circles if c not in KNOWN_CIRCLES] == []
    assert [sorted(c) for c in KNOWN_CIRCLES if c not in circles] == [], "a known circle is gone: remove its entry"


def test_subcommands_share_helpers_through_one_module_and_never_import_each_other():
    modules = _modules()
    shared = {"h5stream.commands._common", "h5stream.commands._partset", "h5stream.commands.arguments"}
    for module, path in modules.items():
        if module.startswith("h5stream.commands."):
            others = {t for t in _imports(module, path, modules) if t.startswith("h5stream.commands.")}
            assert others <= shared, f"{module} imports {sorted(others - shared)}"
    assert _imports("h5stream.commands.arguments", modules["h5stream.commands.arguments"], modules) == set()


LAZY_CLI_SCRIPT = r"""
import json, sys
from h5stream import cli
cli.build_parser().parse_args(["bench", "x.h5"])
print(json.dumps({"numpy": "numpy" in sys.modules,
                  "commands": sorted(m for m in sys.modules if m.startswith("h5stream.commands."))}))
"""


def test_the_cli_parses_without_importing_any_subcommand():
    proc = subprocess.run([sys.executable, "-c", LAZY_CLI_SCRIPT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"numpy": False, "commands": ["h5stream.commands.arguments"]}


OPENCV_SCRIPT = r"""
import json, sys
from h5stream.samples import make_class_folder
from h5stream.ingest import IngestOptions, ingest
make_class_folder(sys.argv[1] + "/src", classes=2, per_class=3, size=(8, 8))
seen = {}
for workers in (1, 0):
    ingest(IngestOptions(src=sys.argv[1] + "/src", out=sys.argv[1] + f"/o{workers}.h5", size=(8, 8), workers=workers,
                         progress=False))
    seen[workers] = "cv2" in sys.modules
print(json.dumps(seen))
"""


def test_an_ingest_with_decode_workers_keeps_opencv_out_of_the_writing_process(tmp_path):
    """OpenCV's wheels bring their own OpenBLAS, one spinning thread per core: in the process that writes the store
    they would take the decode workers' cores.  It loads only where files are decoded (workers=0: right there)."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    proc = subprocess.run([sys.executable, "-c", OPENCV_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"1": False, "0": True}
