"""The usage line of a peer's child script (:mod:`benchmarks.ffcv_crop`, :mod:`benchmarks.ffcv_loader`,
:mod:`benchmarks.dali_crop`): those run by a peer's own venv as plain scripts, their folder on the path, and import
this module alone of the repository's (standard library only)."""

from __future__ import annotations

import sys


def usage(doc: str, argv) -> int:
    """Print the usage line of a script whose docstring is ``doc`` (its second paragraph): on stdout for ``-h`` /
    ``--help`` (exit 0), else on stderr (exit 2)."""
    line = doc.split("\n\n")[1].strip()
    asked = list(argv[:1]) in (["-h"], ["--help"])
    print(f"usage: {line}", file=sys.stdout if asked else sys.stderr)
    return 0 if asked else 2
