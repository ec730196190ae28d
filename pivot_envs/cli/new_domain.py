"""`pivotrl new-domain NAME`: write an installable domain package to start from."""

from __future__ import annotations

import argparse

NAME = "new-domain"
HELP = "Write an installable domain package (entry point, env, parser, verifier, sample pivots, a test) to start from."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pivot_envs.scaffold import NAME_RULE

    parser.add_argument("name", metavar="NAME", help=f"the domain name, for pivot/NAME-v0: {NAME_RULE}")
    parser.add_argument(
        "--dir",
        metavar="PATH",
        default=None,
        help="the package directory to create, new or empty (default: ./pivot-envs-NAME)",
    )


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pivot_envs.scaffold import new_domain

    root = Path(args.dir if args.dir is not None else f"pivot-envs-{args.name}")
    written = new_domain(args.name, root)
    print(f"wrote the {args.name} domain package into {root} ({len(written)} files):")
    for path in written:
        print(f"  {path.relative_to(root)}")
    print(f"next: pip install -e {root} && pytest {root}   (then gym.make('pivot/{args.name}-v0') works)")
    return 0
