"""`pivotrl domains`: the installed domain plugins and their env ids."""

from __future__ import annotations

import argparse

NAME = "domains"
HELP = "List the installed domains (entry-point group pivot_envs.domains) and their env ids."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--load", action="store_true", help="import each domain to show its description")


def main(args: argparse.Namespace) -> int:
    from pivot_envs.registry import PluginError, discover, env_id, load_domain

    for name, entry_point in discover().items():
        line = f"{env_id(name):28s} {entry_point.value}"
        if args.load:
            try:
                spec = load_domain(entry_point)
                line += f"  {spec.description}"
            except PluginError as error:
                line += f"  BROKEN: {error}"
        print(line)
    return 0
