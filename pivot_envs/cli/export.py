"""`pivotrl export`: pivots -> NeMo-Gym pivot rows, so they feed NeMo-Gym / NeMo-RL unchanged."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from pivot_envs.config import option

NAME = "export"
HELP = "Export pivots to another framework's format (NeMo-Gym pivot rows)."


@dataclass
class ExportConfig:
    """What to export to."""

    format: str = option("nemo-gym", "target format: nemo-gym (responses_create_params + expected_action rows)", choices=("nemo-gym",))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pivot_envs.config import add_options

    parser.add_argument("pivots", metavar="PIVOTS", help="pivot file (or any trajectory file: every assistant turn is exported)")
    parser.add_argument("--out", required=True, metavar="ROWS.jsonl", help="where to write the rows")
    add_options(parser, ExportConfig)


def main(args: argparse.Namespace) -> int:
    from pivot_envs.cli._checks import check_output, read_input
    from pivot_envs.config import from_args
    from pivot_envs.formats import ReadReport, write_nemo_gym_rows

    from_args(ExportConfig, args)  # validates the format (only nemo-gym today)
    check_output(args.out)
    report = ReadReport()
    pivots = read_input(args.pivots, report=report)
    written = write_nemo_gym_rows(pivots, args.out)
    print(f"read {report.records} records ({report.skipped_total} skipped); wrote {written} NeMo-Gym rows -> {args.out}")
    return 0
