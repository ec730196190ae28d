"""`pivotrl extract`: trajectories (any supported format) -> pivot candidates (JSONL)."""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)

NAME = "extract"
HELP = "Extract pivot candidates (one per assistant turn) from trajectory files of any supported format."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pivot_envs.config import add_config
    from pivot_envs.extract import ExtractConfig

    parser.add_argument(
        "inputs", nargs="+", metavar="INPUT", help="trajectory or pivot files (format detected by content)"
    )
    parser.add_argument(
        "--out", required=True, metavar="PIVOTS.jsonl", help="where to write the pivot candidates"
    )
    parser.add_argument(
        "--id-prefix",
        default=None,
        help="trajectory id prefix (default: the file stem; tau-<folder> for tau-bench)",
    )
    parser.add_argument(
        "--format",
        choices=("auto", "pivot-v1"),
        default="auto",
        help="auto: detected by content; pivot-v1: NVIDIA's Nemotron-RL-Agentic Pivot-v1 files (parquet "
        "or JSONL), streamed, their recorded pass rates kept as profiles",
    )
    add_config(parser, ExtractConfig, "extract")


def main(args: argparse.Namespace) -> int:
    from pivot_envs.cli._checks import check_output, file_errors, no_pivot_error
    from pivot_envs.config import progress_bar
    from pivot_envs.extract import ExtractConfig, write_pivot_file
    from pivot_envs.formats import ReadReport, read_as_pivots

    config: ExtractConfig = args.extract
    check_output(args.out)
    if args.format == "pivot-v1":
        return _pivot_v1(args)
    report = ReadReport()
    pivots, seen, empty = [], set(), []
    for path in progress_bar(args.inputs, desc="reading", unit=" files", terminal_only=True):
        records, problems = report.records, len(report.problems)
        with file_errors(path):
            read = read_as_pivots(path, report=report, config=config, id_prefix=args.id_prefix)
        for pivot in read:
            if pivot.id in seen:  # two inputs yielding one id: keep the first, say so
                report.skip(path, "duplicate pivot id", pivot.id)
                continue
            seen.add(pivot.id)
            pivots.append(pivot)
        # Empty: no record and no problem (a .gz cut off before its first record is not empty).
        if report.records == records and len(report.problems) == problems:
            empty.append(path)
    for problem in report.problems:
        log.warning("%s", problem)
    if not pivots and (report.skipped_total or not report.records):  # nothing readable: no output to write
        raise no_pivot_error(", ".join(args.inputs), report)
    for path in empty:
        log.warning("%s: the input is empty (no records)", path)
    with file_errors(args.out, "--out"):
        written = write_pivot_file(pivots, args.out)
    print(report.summary())
    print(f"pivots written: {written} -> {args.out}")
    return 0


def _pivot_v1(args: argparse.Namespace) -> int:
    """NVIDIA's Pivot-v1 files -> pivot JSONL, streamed (see pivot_envs.formats.nemotron_pivot_v1)."""
    from pivot_envs.cli._checks import file_errors, no_pivot_error
    from pivot_envs.formats.nemotron_pivot_v1 import extract_pivot_v1

    with file_errors(args.out, "--out"):
        summary = extract_pivot_v1(args.inputs, args.out)
    for problem in summary.report.problems:
        log.warning("%s", problem)
    if not summary.written:
        raise no_pivot_error(", ".join(args.inputs), summary.report)
    print("\n".join(summary.lines()))
    print(f"pivots written: {summary.written} -> {args.out}")
    return 0
