"""A transform for worker tests that imports nothing itself (the worker imports this module to unpickle it)."""

import json
import sys


class ReportModules:
    """Augments like ``inner``; with ``epoch=-1`` it also writes the worker's ``sys.modules`` to ``path``."""

    def __init__(self, inner, path):
        self.inner, self.path = inner, path

    def __call__(self, images, *, seed, epoch, row_ids, out=None):
        if epoch == -1:
            with open(self.path, "w") as fh:
                json.dump(sorted(sys.modules), fh)
        return self.inner(images, seed=seed, epoch=max(epoch, 0), row_ids=row_ids, out=out)
