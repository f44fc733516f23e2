import sys

from h5stream.cli import run

sys.exit(run())
