# Two entry points for a fresh machine with Python 3.11 and make:
#   make demo   set up .venv with h5stream's core dependencies, make sample images, ingest them, stream and
#               report throughput (no deep-learning framework: tools/demo.py needs none)
#   make test   add the test stack to .venv and run the test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CORE   := $(VENV)/.core
STAMP  := $(VENV)/.installed

.PHONY: demo test test-all clean

# h5stream and its core dependencies (numpy, h5py, PyTables, Pillow, OpenCV, ...): all that the demo imports.
$(CORE): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $(CORE)

# The test stack on top: Keras with CPU TensorFlow as its backend ([tf-cpu]) and the test tools ([dev], torch and JAX
# among them).  tf-keras (Keras 2, for the multi-worker fit test) requires the full `tensorflow` package, so it is
# installed without dependencies, at the minor version of the tensorflow-cpu just installed.
$(STAMP): $(CORE)
	$(BIN)/python -m pip install --quiet -e '.[tf-cpu,dev]'
	$(BIN)/python -m pip install --quiet --no-deps "tf-keras==$$($(BIN)/python tools/tf_minor.py).*"
	touch $(STAMP)

demo: $(CORE)
	$(BIN)/python tools/demo.py --out demo

# Two pytest processes share the cores (pytest-xdist; worksteal: the one that runs dry takes the other's queued tests,
# so a long test near the end does not leave a core idle).  No test needs the machine to itself: a test that needs
# stale shared-memory segments makes them in a namespace of its own, which no other h5stream process sweeps.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n 2 --dist worksteal -m "not slow"

test-all: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n 2 --dist worksteal

clean:
	rm -rf $(VENV) demo *.egg-info
