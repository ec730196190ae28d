"""`pivotrl filter`: profiled candidates -> training pivots (D_adv, paper Eq. 5), optionally deduplicated."""

from __future__ import annotations

import argparse

NAME = "filter"
HELP = "Keep the pivots: profiled candidates with reward variance > 0 and mean < lambda_diff (D_adv), or all (D_cand)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pivot_envs.config import add_config
    from pivot_envs.extract import FilterConfig

    parser.add_argument(
        "profiled", metavar="PROFILED", help="profiled pivot JSONL (pivotrl profile's output)"
    )
    parser.add_argument("--out", required=True, metavar="PIVOTS", help="where to write the kept pivots")
    add_config(parser, FilterConfig, "filter")


def main(args: argparse.Namespace) -> int:
    from pivot_envs.cli._checks import check_output, check_profiled, file_errors, read_input
    from pivot_envs.extract import FilterConfig, dedup_pivots, filter_pivots, write_pivot_file
    from pivot_envs.formats import ReadReport

    config: FilterConfig = args.filter
    check_output(args.out)
    report = ReadReport()
    pivots = read_input(args.profiled, report=report)
    if config.mode != "cand":
        check_profiled(pivots)
    kept = filter_pivots(pivots, lambda_diff=config.lambda_diff, mode=config.mode)
    lines = [f"candidates: {len(pivots)} ({report.skipped_total} malformed records skipped)"]
    if config.mode != "cand":
        zero = sum(1 for p in pivots if p.profile.var == 0)
        easy = sum(1 for p in pivots if p.profile.var > 0 and p.profile.mean >= config.lambda_diff)
        lines.append(f"dropped: zero variance {zero}, mean >= lambda_diff={config.lambda_diff:g} {easy}")
    if config.dedup:
        before = len(kept)
        kept = dedup_pivots(kept, by=config.dedup_by)
        lines.append(f"dropped: near-duplicate expert actions ({config.dedup_by}) {before - len(kept)}")
    with file_errors(args.out, "--out"):
        written = write_pivot_file(kept, args.out)
    lines.append(f"pivots written: {written} -> {args.out}")
    print("\n".join(lines))
    return 0
