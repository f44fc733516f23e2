"""Imports of native and optional packages, failing with one line that names the package to install.

Each is called where its package is first needed (the decoder, the warp, an
adapter), so ``import h5stream`` stays free of them.  A failure raises
:class:`~h5stream.errors.MissingDependencyError`, an ``ImportError`` whose
message the CLI prints as its one error line.
"""

from __future__ import annotations

import importlib
import os

from h5stream.errors import MissingDependencyError

CV2_FIX = (
    "pip install opencv-python-headless (if cv2 vanished after uninstalling opencv-python next to "
    "opencv-python-headless, the uninstall deleted the cv2 folder both share: "
    "pip install --force-reinstall --no-deps opencv-python-headless)"
)
KERAS_FIX = "pip install keras (Keras 3), plus a backend: tensorflow, jax or torch"
TENSORFLOW_FIX = "pip install tensorflow (or tensorflow-cpu on a machine without a GPU)"
TORCH_FIX = "pip install torch"
OBSTORE_FIX = "pip install obstore (or, in h5stream's clone, pip install -e '.[remote]')"


def require(module: str, fix: str, *, needed_for: str):
    """Import ``module`` and return it; if it cannot be imported, raise MissingDependencyError naming ``fix``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(f"{needed_for} needs {module}, which cannot be imported ({exc}): {fix}") from exc


def present(module: str, fix: str, *, needed_for: str) -> None:
    """Make sure ``module`` can be found, without importing it (in a process that only starts the processes that
    import it); raise MissingDependencyError naming ``fix`` where it cannot."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise MissingDependencyError(f"{needed_for} needs {module}, which cannot be imported (it is not installed "
                                     f"here): {fix}")


def cv2():
    """OpenCV, used by ingest's decoder and by augmentation."""
    return require("cv2", CV2_FIX, needed_for="h5stream's image decoding and augmentation")


def cv2_present() -> None:
    """That OpenCV is there for the decode workers, without loading it here (see :mod:`h5stream.ingest.spec`)."""
    present("cv2", CV2_FIX, needed_for="h5stream's image decoding and augmentation")


def keras():
    """Keras 3 with a working backend, for ``stream.keras()`` and :mod:`h5stream.keras`."""
    try:
        return importlib.import_module("keras")
    except ImportError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing in ("", "keras"):
            raise MissingDependencyError(f"stream.keras() and h5stream.keras need Keras, which cannot be imported "
                                         f"({exc}): {KERAS_FIX}") from exc
        backend = os.environ.get("KERAS_BACKEND", "tensorflow")
        install = TENSORFLOW_FIX if missing == "tensorflow" else f"pip install {missing}"
        raise MissingDependencyError(
            f"Keras is installed but its backend {backend!r} cannot be imported (no module {missing!r}): "
            f"{install}, or set KERAS_BACKEND to a backend that is installed (tensorflow, jax or torch)"
        ) from exc


def tensorflow():
    """TensorFlow, for ``stream.tf_dataset()`` and the distributed input."""
    return require("tensorflow", TENSORFLOW_FIX, needed_for="stream.tf_dataset() (and distributed_dataset())")


def torch():
    """PyTorch, for ``stream.torch()``."""
    return require("torch", TORCH_FIX, needed_for="stream.torch()")


def obstore():
    """obstore, the object-store client behind ``s3://`` and ``http(s)://`` stores."""
    return require("obstore", OBSTORE_FIX, needed_for="reading a store from a URL")
