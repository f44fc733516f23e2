"""`h5stream preview` (being built; see the open issues)."""

from h5stream.errors import ConfigError


def add_arguments(parser):
    pass


def run(args):
    raise ConfigError("'preview' is not built yet")
