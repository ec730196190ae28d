"""The `pivotrl` command line.

Each subcommand is a module in `pivot_envs/cli/` with `NAME`, `HELP`, `add_arguments(parser)` and
`main(args) -> int`; they are found by listing this package, so a feature adds its command in its
own file. Heavy imports stay inside `main`.

Results go to stdout; log lines (the `pivot_envs` loggers) and progress bars to stderr. `-v`
adds debug lines and the traceback of an error, `-q` leaves warnings and errors only; both go
before or after the command name. An error the user caused (`PivotEnvsError`, and the ValueError,
OSError, KeyError and RuntimeError messages of older code) is one line,
`pivotrl COMMAND: error: ...`, with exit status 1; any other exception is a bug and shows its
traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import pkgutil
import sys
import traceback
from collections.abc import Iterator, Sequence
from importlib import metadata

from pivot_envs.errors import PivotEnvsError

PROG = "pivotrl"
# Errors whose message is meant for the user; PivotEnvsError is the library's own family, the
# built-in ones are what older code raises with a message naming the input.
USER_ERRORS = (PivotEnvsError, ValueError, OSError, KeyError, RuntimeError)


def _commands() -> dict[str, object]:
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        try:
            module = importlib.import_module(f"{__name__}.{info.name}")
        except Exception as error:  # one broken command must not take the others down
            print(f"{PROG}: command module {info.name!r} failed to import: {error!r}", file=sys.stderr)
            continue
        if hasattr(module, "main") and hasattr(module, "add_arguments"):
            found[getattr(module, "NAME", info.name)] = module
    return dict(sorted(found.items()))


def version() -> str:
    """The installed distribution's version (importlib.metadata)."""
    try:
        return metadata.version("pivot-envs")
    except metadata.PackageNotFoundError:
        return "unknown (pivot-envs is not installed)"


def _add_verbosity(parser: argparse.ArgumentParser, suffix: str) -> None:
    """-v/-q, counted into `verbose{suffix}` and `quiet{suffix}` (the command's own copy has a
    suffix, so flags given on both sides of the command name add up)."""
    group = parser.add_argument_group("output")
    group.add_argument("-v", "--verbose", action="count", default=0, dest=f"verbose{suffix}",
                       help="more output: debug log lines, and the traceback of an error")
    group.add_argument("-q", "--quiet", action="count", default=0, dest=f"quiet{suffix}",
                       help="less output: warnings and errors only, no progress bars")


def build_parser() -> argparse.ArgumentParser:
    """The `pivotrl` parser with every command found in this package."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="PivotRL: extract, profile, filter, train and evaluate at the pivots of expert trajectories.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {version()}")
    _add_verbosity(parser, "")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in _commands().items():
        # argparse %-formats help texts: a literal % (as in "95% CI") must be doubled.
        sub = subparsers.add_parser(name, help=module.HELP.replace("%", "%%"), description=module.HELP)
        module.add_arguments(sub)
        _add_verbosity(sub, "_after")
        sub.set_defaults(_main=module.main)
    return parser


class _Handler(logging.StreamHandler):
    """Writes each line through tqdm, which lifts a progress bar out of the way and draws it again."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:
            self.handleError(record)


class _Formatter(logging.Formatter):
    """Info lines as they are; warnings and errors prefixed `pivotrl: warning:`; debug lines name their logger."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.levelno >= logging.WARNING:
            message = f"{PROG}: {record.levelname.lower()}: {message}"
        elif record.levelno < logging.INFO:
            message = f"debug: {record.name}: {message}"
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        return message


def level_of(verbosity: int) -> int:
    """The log level of a verbosity (count of -v minus count of -q): 0 is INFO."""
    return {-1: logging.WARNING, 0: logging.INFO}.get(verbosity, logging.DEBUG if verbosity > 0 else logging.ERROR)


@contextlib.contextmanager
def logging_to_stderr(verbosity: int) -> Iterator[None]:
    """Send the `pivot_envs` loggers to stderr at the verbosity's level while the command runs;
    the logger's earlier state comes back afterwards (main may run many times in one process)."""
    logger = logging.getLogger("pivot_envs")
    handler = _Handler(sys.stderr)
    handler.setFormatter(_Formatter())
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(level_of(verbosity))
    logger.propagate = False  # one line per message, even when the host application logs too
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.level, logger.propagate = saved


def main(argv: Sequence[str] | None = None) -> int:
    """Run `pivotrl` with `argv` (default: the process's arguments); returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit:  # --help, --version (0) and usage errors (2)
        return exit.code if isinstance(exit.code, int) else 1
    if not getattr(args, "_main", None):
        parser.print_help()
        return 0
    verbosity = args.verbose + getattr(args, "verbose_after", 0) - args.quiet - getattr(args, "quiet_after", 0)
    with logging_to_stderr(verbosity):
        try:
            return int(args._main(args) or 0)
        except KeyboardInterrupt:
            print(f"{PROG}: interrupted", file=sys.stderr)
            return 130
        except USER_ERRORS as error:
            if verbosity > 0:
                traceback.print_exc()
            print(f"{PROG} {args.command}: error: {describe(error)}", file=sys.stderr)
            return 1


def describe(error: BaseException) -> str:
    """The message of a user error as the CLI prints it."""
    if isinstance(error, KeyError) and not isinstance(error, PivotEnvsError):
        return f"KeyError: {error}"  # str() of a KeyError is only the key's repr
    return str(error)


if __name__ == "__main__":
    sys.exit(main())
