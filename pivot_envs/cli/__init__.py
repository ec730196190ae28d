"""The `pivotrl` command line.

Commands are plugins, found through the entry-point group `pivot_envs.commands` as domains are
through `pivot_envs.domains`: `NAME = module` names a module with `HELP`, `add_arguments(parser)`
and `main(args) -> int`. The core's data commands live in this package; `train` and `run` come
from the adapters and `sandbox` from the terminal domain, so the core imports neither. Only the
command being run has its arguments built, and heavy imports stay inside `main`.

Every command takes `--config FILE` (TOML, YAML or JSON; flags override it) and
`--print-config` (the effective settings as TOML, then exit): see `pivot_envs.config`.

Results go to stdout; log lines (the `pivot_envs` loggers) and progress bars to stderr. `-v`
adds debug lines and the traceback of an error, `-q` leaves warnings and errors only; both go
before or after the command name. An error the user caused (`PivotEnvsError`) is one line,
`pivotrl COMMAND: error: ...`, with exit status 1 (2 for a bad setting, as for a usage error);
any other exception is a bug and shows its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import traceback
from collections.abc import Iterator, Sequence
from importlib import metadata
from types import ModuleType

from pivot_envs.config import (
    ConfigError,
    apply_config_file,
    check_choice,
    derived_settings,
    effective_settings,
    format_config,
    read_config_file,
)
from pivot_envs.errors import PivotEnvsError

PROG = "pivotrl"
GROUP = "pivot_envs.commands"


def command_entry_points() -> dict[str, metadata.EntryPoint]:
    """The installed commands by name (entry-point group `pivot_envs.commands`)."""
    found = {entry_point.name: entry_point for entry_point in metadata.entry_points(group=GROUP)}
    return dict(sorted(found.items()))


def _load(entry_points: dict[str, metadata.EntryPoint]) -> dict[str, ModuleType]:
    """Each command's module; a command that fails to load is named in a warning and left out."""
    found = {}
    for name, entry_point in entry_points.items():
        try:
            module = entry_point.load()
        except Exception as error:  # one broken plugin must not take the other commands down
            print(
                f"{PROG}: warning: command {name!r} ({entry_point.value}) failed to load: {error!r}",
                file=sys.stderr,
            )
            continue
        if not (hasattr(module, "main") and hasattr(module, "add_arguments")):
            print(
                f"{PROG}: warning: command {name!r} ({entry_point.value}) has no add_arguments and main",
                file=sys.stderr,
            )
            continue
        found[name] = module
    return found


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
    group.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        dest=f"verbose{suffix}",
        help="more output: debug log lines, and the traceback of an error",
    )
    group.add_argument(
        "-q",
        "--quiet",
        action="count",
        default=0,
        dest=f"quiet{suffix}",
        help="less output: warnings and errors only, no progress bars",
    )


class _TopParser(argparse.ArgumentParser):
    _check_value = check_choice  # an unknown command gets a 'did you mean'


def _add_config_file(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("settings")
    group.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="read settings from a TOML, YAML or JSON file (flags given here override it)",
    )
    group.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective settings as TOML (a file --config reads) and exit",
    )


def build_parser(only: str | None = "") -> argparse.ArgumentParser:
    """The `pivotrl` parser with every installed command; `only` names the one command that is
    loaded and has its arguments built (None: every command loaded for its help line, none built;
    "": every one built). The parser of each built command is in `.commands`."""
    from pivot_envs.config import command_parser

    parser = _TopParser(
        prog=PROG,
        description="PivotRL: extract, profile, filter, train and evaluate at the pivots of expert trajectories.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {version()}")
    _add_verbosity(parser, "")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=command_parser)
    parser.commands = {}
    entry_points = command_entry_points()
    modules = _load({only: entry_points[only]} if only else entry_points)
    for name in entry_points:
        module = modules.get(name)
        if module is None:  # another command than the one run (its name is still a valid choice), or broken
            subparsers.add_parser(name)
            continue
        # argparse %-formats help texts (not descriptions): a literal % (as in "95% CI") must be doubled.
        sub = subparsers.add_parser(name, help=module.HELP.replace("%", "%%"), description=module.HELP)
        sub.set_defaults(_main=module.main)
        if only == "" or only == name:
            module.add_arguments(sub)
            _add_config_file(sub)
            _add_verbosity(sub, "_after")
            parser.commands[name] = sub
    return parser


def _command_of(argv: Sequence[str], names: Sequence[str]) -> str | None:
    """The command named in `argv`: the first argument that is not an option."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in names else None
    return None


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
    return {-1: logging.WARNING, 0: logging.INFO}.get(
        verbosity, logging.DEBUG if verbosity > 0 else logging.ERROR
    )


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


def _verbosity(argv: Sequence[str]) -> int:
    """-v minus -q counted over the whole command line (before parsing, so that parsing's own
    warnings and errors follow it too)."""
    count = 0
    for arg in argv:
        if arg in ("--verbose", "--quiet"):
            count += 1 if arg == "--verbose" else -1
        elif arg.startswith("-") and not arg.startswith("--") and set(arg[1:]) <= {"v", "q"}:
            count += arg.count("v") - arg.count("q")
    return count


def main(argv: Sequence[str] | None = None) -> int:
    """Run `pivotrl` with `argv` (default: the process's arguments); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    names = list(command_entry_points())
    command = _command_of(argv, names)
    with logging_to_stderr(_verbosity(argv)):
        try:
            parser = build_parser(command)
            if command:
                path = _config_path(argv)
                if path:
                    apply_config_file(parser.commands[command], read_config_file(path), path)
            try:
                args = parser.parse_args(argv)
            except SystemExit as exit:  # --help, --version (0) and usage errors (2)
                return exit.code if isinstance(exit.code, int) else 1
        except PivotEnvsError as error:
            print(f"{PROG}{' ' + command if command else ''}: error: {error}", file=sys.stderr)
            return 2 if isinstance(error, ConfigError) else 1
        if not getattr(args, "_main", None):
            parser.print_help()
            return 0
        if args.print_config:
            sub = parser.commands[command]
            print(format_config(effective_settings(sub, args), derived=derived_settings(sub, args)))
            return 0
        verbosity = args.verbose + args.verbose_after - args.quiet - args.quiet_after
        logging.getLogger("pivot_envs").setLevel(level_of(verbosity))
        try:
            return int(args._main(args) or 0)
        except KeyboardInterrupt:
            print(f"{PROG}: interrupted", file=sys.stderr)
            return 130
        except PivotEnvsError as error:
            if verbosity > 0:
                traceback.print_exc()
            print(f"{PROG} {args.command}: error: {error}", file=sys.stderr)
            return 2 if isinstance(error, ConfigError) else 1


def _config_path(argv: Sequence[str]) -> str | None:
    """The FILE of `--config FILE` (or `--config=FILE`) in `argv`, the last one given."""
    found = None
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith("--config="):
            found = arg.split("=", 1)[1]
    return found


if __name__ == "__main__":
    sys.exit(main())
