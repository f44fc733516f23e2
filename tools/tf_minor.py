"""Print the installed TensorFlow's major.minor version (e.g. ``2.21``), without importing TensorFlow.

Used by the Makefile to install the matching ``tf-keras``.
"""

from importlib.metadata import PackageNotFoundError, version

for name in ("tensorflow-cpu", "tensorflow"):
    try:
        print(".".join(version(name).split(".")[:2]))
        break
    except PackageNotFoundError:
        continue
else:
    raise SystemExit("tf_minor: neither tensorflow-cpu nor tensorflow is installed")
