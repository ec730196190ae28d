"""The `pivotrl` command line.

Each subcommand is a module in `pivot_envs/cli/` with `NAME`, `HELP`, `add_arguments(parser)` and
`main(args) -> int`; they are found by listing this package, so a feature adds its command in its
own file. Heavy imports stay inside `main`.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence


def _commands() -> dict[str, object]:
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        try:
            module = importlib.import_module(f"{__name__}.{info.name}")
        except Exception as error:  # one broken command must not take the others down
            print(f"pivotrl: command module {info.name!r} failed to import: {error!r}", file=sys.stderr)
            continue
        if hasattr(module, "main") and hasattr(module, "add_arguments"):
            found[getattr(module, "NAME", info.name)] = module
    return dict(sorted(found.items()))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pivotrl",
        description="PivotRL: extract, profile, filter, train and evaluate at the pivots of expert trajectories.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in _commands().items():
        sub = subparsers.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        sub.set_defaults(_main=module.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_main", None):
        parser.print_help()
        return 2
    try:
        return int(args._main(args) or 0)
    except KeyboardInterrupt:
        print("pivotrl: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, KeyError, RuntimeError) as error:
        # Errors meant for users name the bad input; print them, not a traceback.
        print(f"pivotrl {args.command}: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
