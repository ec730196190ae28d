"""`pivotrl stats`: counts and lengths of a pivot set, and the paper's profile diagnostics."""

from __future__ import annotations

import argparse
import sys

NAME = "stats"
HELP = "Show counts per domain/action kind/tool, prefix and action lengths, and profile diagnostics (zero-variance fraction, reward means, miss rate)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pivot_envs.config import add_options
    from pivot_envs.diagnostics import DiagnosticsConfig

    parser.add_argument("file", metavar="FILE", help="pivots (profiled or not), or any trajectory file")
    parser.add_argument("--plot", metavar="DIR", default=None, help="also write PNG figures into DIR (needs matplotlib)")
    add_options(parser, DiagnosticsConfig)


def main(args: argparse.Namespace) -> int:
    from pivot_envs.config import from_args
    from pivot_envs.diagnostics import DiagnosticsConfig, diagnose, format_report, plot
    from pivot_envs.formats import ReadReport, read_as_pivots

    config = from_args(DiagnosticsConfig, args)
    report = ReadReport()
    pivots = read_as_pivots(args.file, report=report)
    for problem in report.problems:
        print(problem, file=sys.stderr)
    if report.skipped_total:
        print(f"skipped {report.skipped_total} malformed record(s)", file=sys.stderr)
    diagnostics = diagnose(pivots, lambda_diff=config.lambda_diff, bins=config.bins)
    print(format_report(diagnostics))
    if args.plot:
        for path in plot(diagnostics, args.plot):
            print(f"wrote {path}")
    return 0
