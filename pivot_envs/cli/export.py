"""`pivotrl export`: pivots -> NeMo-Gym pivot rows, so they feed NeMo-Gym / NeMo-RL unchanged."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from pivot_envs.config import one_of, option

NAME = "export"
HELP = "Export pivots to another framework's format (NeMo-Gym pivot rows)."
FORMATS = ("nemo-gym",)


@dataclass
class ExportConfig:
    """What to export to."""

    format: str = option(
        "nemo-gym",
        "target format: nemo-gym (responses_create_params + expected_action rows)",
        choices=FORMATS,
    )

    def __post_init__(self) -> None:
        one_of(self, "format", FORMATS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pivot_envs.config import add_config

    parser.add_argument(
        "pivots",
        metavar="PIVOTS",
        help="pivot file (or any trajectory file: every assistant turn is exported)",
    )
    parser.add_argument("--out", required=True, metavar="ROWS.jsonl", help="where to write the rows")
    add_config(parser, ExportConfig, "export")


def main(args: argparse.Namespace) -> int:
    from pivot_envs.cli._checks import check_output, file_errors, read_input
    from pivot_envs.formats import ReadReport, write_nemo_gym_rows

    check_output(args.out)
    report = ReadReport()
    pivots = read_input(args.pivots, report=report)
    with file_errors(args.out, "--out"):
        written = write_nemo_gym_rows(pivots, args.out)
    print(
        f"read {report.records} records ({report.skipped_total} skipped); wrote {written} NeMo-Gym rows -> {args.out}"
    )
    return 0
