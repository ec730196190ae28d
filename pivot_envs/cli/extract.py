"""`pivotrl extract`: trajectories (any supported format) -> pivot candidates (JSONL)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pivot_envs.formats import ReadReport

NAME = "extract"
HELP = "Extract pivot candidates (one per assistant turn) from trajectory files of any supported format."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pivot_envs.config import add_options
    from pivot_envs.extract import ExtractConfig

    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="trajectory or pivot files (format detected by content)")
    parser.add_argument("--out", required=True, metavar="PIVOTS.jsonl", help="where to write the pivot candidates")
    parser.add_argument("--id-prefix", default=None, help="trajectory id prefix (default: the file stem; tau-<folder> for tau-bench)")
    add_options(parser, ExtractConfig)


def main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from pivot_envs.config import from_args
    from pivot_envs.extract import ExtractConfig, write_pivot_file
    from pivot_envs.formats import ReadReport, read_as_pivots

    config = from_args(ExtractConfig, args)
    report = ReadReport()
    pivots, seen = [], set()
    for path in tqdm(args.inputs, desc="reading", unit=" files", file=sys.stderr, disable=None):
        for pivot in read_as_pivots(path, report=report, config=config, id_prefix=args.id_prefix):
            if pivot.id in seen:  # two inputs yielding one id: keep the first, say so
                report.skip(path, "duplicate pivot id", pivot.id)
                continue
            seen.add(pivot.id)
            pivots.append(pivot)
    written = write_pivot_file(pivots, args.out)
    print_report(report, written, args.out)
    return 1 if report.skipped_total and not written else 0


def print_report(report: ReadReport, written: int, out: str) -> None:
    """Problems (file:line: reason) on stderr, then the counts."""
    for problem in report.problems:
        print(problem, file=sys.stderr)
    print(report.summary())
    print(f"pivots written: {written} -> {out}")
