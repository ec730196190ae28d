"""`pivotrl split`: pivots -> train and held-out files, by source trajectory (never by turn)."""

from __future__ import annotations

import argparse

NAME = "split"
HELP = "Split pivots into train and held-out sets by source trajectory (a seeded hash of the trajectory id)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pivot_envs.config import add_config
    from pivot_envs.extract import SplitConfig

    parser.add_argument("pivots", metavar="PIVOTS", help="pivot file")
    parser.add_argument("--train-out", required=True, metavar="A", help="where to write the train pivots")
    parser.add_argument(
        "--heldout-out", required=True, metavar="B", help="where to write the held-out pivots"
    )
    add_config(parser, SplitConfig, "split")


def main(args: argparse.Namespace) -> int:
    from pivot_envs.cli._checks import check_output, file_errors, read_input
    from pivot_envs.extract import SplitConfig, split_by_trajectory, write_pivot_file

    config: SplitConfig = args.split
    check_output(args.train_out, "--train-out")
    check_output(args.heldout_out, "--heldout-out")
    pivots = read_input(args.pivots)
    train, heldout = split_by_trajectory(pivots, config.heldout, config.seed)
    for name, part, out, flag in (
        ("train", train, args.train_out, "--train-out"),
        ("heldout", heldout, args.heldout_out, "--heldout-out"),
    ):
        with file_errors(out, flag):
            write_pivot_file(part, out, desc=f"writing {name}")
        trajectories = len({p.trajectory_id for p in part})
        print(f"{name}: {len(part)} pivots from {trajectories} trajectories -> {out}")
    return 0
