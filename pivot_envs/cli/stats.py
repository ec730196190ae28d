"""`pivotrl stats`: counts and lengths of a pivot set, and the paper's profile diagnostics."""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)

NAME = "stats"
HELP = "Show counts per domain/action kind/tool, prefix and action lengths, and profile diagnostics (zero-variance fraction, reward means, miss rate)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pivot_envs.config import add_config
    from pivot_envs.diagnostics import DiagnosticsConfig

    parser.add_argument("file", metavar="FILE", help="pivots (profiled or not), or any trajectory file")
    parser.add_argument(
        "--plot", metavar="DIR", default=None, help="also write PNG figures into DIR (needs matplotlib)"
    )
    add_config(parser, DiagnosticsConfig, "stats")


def main(args: argparse.Namespace) -> int:
    from pivot_envs.cli._checks import check_output, check_plotting, read_input
    from pivot_envs.diagnostics import DiagnosticsConfig, diagnose, format_report, plot
    from pivot_envs.formats import ReadReport

    config: DiagnosticsConfig = args.stats
    if args.plot:
        check_plotting("stats --plot")
        check_output(args.plot, "--plot", directory=True)
    report = ReadReport()
    pivots = read_input(args.file, report=report)
    if report.skipped_total:
        log.warning("skipped %d malformed record(s)", report.skipped_total)
    diagnostics = diagnose(pivots, lambda_diff=config.lambda_diff, bins=config.bins)
    print(format_report(diagnostics))
    if args.plot:
        for path in plot(diagnostics, args.plot):
            print(f"wrote {path}")
    return 0
