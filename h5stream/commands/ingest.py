"""`h5stream ingest` (being built; see the open issues)."""

from h5stream.errors import ConfigError


def add_arguments(parser):
    pass


def run(args):
    raise ConfigError("'ingest' is not built yet")
