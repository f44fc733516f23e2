"""Command line: ``h5stream ingest | info | verify | repair | bench | preview``.

:func:`main` takes ``argv`` and returns an exit code, so tests call it
in-process.  Every expected failure (an :class:`H5StreamError`, bad usage)
prints one line ``h5stream: error: ...`` on stderr and returns a non-zero
code; no traceback reaches the user.  The parser is built from the light
:mod:`h5stream.commands.arguments`; a subcommand's module
(``h5stream.commands.<name>``) is imported only when it runs, so ``h5stream
info`` never pays for what ``bench`` imports.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings

from h5stream import __version__
from h5stream._optnames import cli_flags
from h5stream.commands.arguments import COMMANDS, add_arguments
from h5stream.errors import H5StreamError, OutputWriteError

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

class UsageError(Exception):
    """Raised by the parser instead of printing usage and exiting."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print usage and sys.exit(2)
        raise UsageError(f"{message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="h5stream", description="Stream image sets far larger than RAM from HDF5.")
    parser.add_argument("--version", action="store_true", help="print h5stream's version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, help_text in COMMANDS.items():
        add_arguments(name, sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # argparse's own line would send to `h5stream --help`, not the command's help that lists them
            where = f"h5stream {args.command}" if getattr(args, "command", None) else "h5stream"
            raise UsageError(f"unrecognized arguments: {' '.join(unknown)} (see {where} --help)")
        if args.version:
            print(f"h5stream {__version__}")
            return EXIT_OK
        if args.command is None:
            raise UsageError(f"choose a command: {', '.join(COMMANDS)} (see h5stream --help)")
        command = importlib.import_module(f"h5stream.commands.{args.command}")
        _sweep_shared_memory()
        with warnings.catch_warnings(), cli_flags(command_flags(parser, args.command)):
            warnings.showwarning = _show_warning  # and every message names an option by the flag typed for it
            return int(command.run(args) or EXIT_OK)
    except UsageError as exc:
        print(f"h5stream: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except H5StreamError as exc:
        print(f"h5stream: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("h5stream: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def command_flags(parser: argparse.ArgumentParser, command: str) -> dict[str, str]:
    """{keyword of the Python API: its flag} of ``command``'s options (pure): ``--memory-budget`` sets
    ``memory_budget``, so a message about ``memory_budget`` names ``--memory-budget`` there."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return {a.dest: max(a.option_strings, key=len) for a in sub._actions
            if a.option_strings and a.dest not in ("help",) and a.option_strings[0].startswith("-")}


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning raised while a command runs (an unfinished store's, say), as the command's one line on stderr:
    ``h5stream: warning: ...``, not Python's file-and-source-line form."""
    print(f"h5stream: warning: {message}", file=sys.stderr if file is None else file)


def _sweep_shared_memory() -> None:
    """Unlink the /dev/shm segments of h5stream processes killed with their whole process group (SIGKILL of a
    job), before any command runs: every command clears them, not only those that open a stream or ingest."""
    from h5stream.memory.shm import sweep_stale_segments

    sweep_stale_segments()


#: Set for the ``h5stream`` command's own process unless the user set it: nothing the command runs does linear
#: algebra, and OpenBLAS otherwise starts a thread per core when numpy is imported, threads that spin for a while
#: and compete with the decode workers booting.  OpenMP is left alone (TensorFlow's baselines in ``h5stream
#: bench`` size their thread pools by it).
COMMAND_ENV = {"OPENBLAS_NUM_THREADS": "1"}


#: Exit status of a command whose reader went away (``h5stream info x.h5 | head -1``): what a shell reports
#: for a unix tool killed by SIGPIPE (128 + 13).
EXIT_BROKEN_PIPE = 141


def run() -> int:
    """Entry point of the ``h5stream`` command and ``python -m h5stream``: :func:`main` in a process of its
    own, with :data:`COMMAND_ENV` set first (numpy is not imported yet).  Callers running the CLI inside
    their own process use :func:`main`, which leaves the environment alone.

    When whatever reads the output stops reading (``| head -1``), the command ends quietly with
    :data:`EXIT_BROKEN_PIPE`, as other unix tools do, instead of printing a traceback."""
    for key, value in COMMAND_ENV.items():
        os.environ.setdefault(key, value)
    guard = sys.stdout = _StdoutGuard(sys.stdout)
    try:
        code = main()
        sys.stdout.flush()  # here, not at interpreter exit, where a closed pipe could only print a warning
        return code
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise
        _stdout_to_devnull(guard)
        return EXIT_BROKEN_PIPE
    except OutputWriteError as exc:  # stdout's final flush: a full disk under `> out.json`
        print(f"h5stream: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if guard.failed:
            _stdout_to_devnull(guard)


class _StdoutGuard:
    """``sys.stdout`` of the ``h5stream`` command: a write or flush the operating system refuses (a full disk or a
    file size limit under ``> out.json``) is one :class:`OutputWriteError` (one line, exit 1), not a traceback;
    a reader gone (``BrokenPipeError``) is left to :func:`run`.  Main thread."""

    def __init__(self, stream):
        self._stream = stream
        self.failed = False

    def _guarded(self, call, *args):
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            self.failed = True
            raise OutputWriteError.of_stdout(exc) from None

    def write(self, text):
        return self._guarded(self._stream.write, text)

    def flush(self):
        return self._guarded(self._stream.flush)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _stdout_to_devnull(guard: _StdoutGuard) -> None:
    """Point stdout at /dev/null, so that the interpreter's own flush at exit finds nothing to complain about."""
    sys.stdout = guard._stream
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe or socket nobody reads any more (poll reports an error on it)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _fd, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


if __name__ == "__main__":
    sys.exit(run())
