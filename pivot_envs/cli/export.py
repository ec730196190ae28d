"""`pivotrl export`: pivots -> NeMo-Gym pivot rows, so they feed NeMo-Gym / NeMo-RL unchanged."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from pivot_envs.config import one_of, option

NAME = "export"
HELP = "Export pivots to another framework's format (NeMo-Gym pivot rows)."
FORMATS = ("nemo-gym", "hf")


@dataclass
class ExportConfig:
    """What to export to."""

    format: str = option(
        "nemo-gym",
        "target format: nemo-gym (responses_create_params + expected_action rows) or hf (a Hugging Face "
        "dataset folder: parquet + README card; --out is the folder)",
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

    report = ReadReport()
    if args.export.format == "hf":
        from pivot_envs.hf_dataset import write_hf_dataset

        pivots = read_input(args.pivots, report=report)
        written = write_hf_dataset(pivots, args.out, source=str(args.pivots))
        print(
            f"read {report.records} records ({report.skipped_total} skipped); wrote {written} rows -> {args.out}"
        )
        return 0
    check_output(args.out)
    pivots = read_input(args.pivots, report=report)
    with file_errors(args.out, "--out"):
        written = write_nemo_gym_rows(pivots, args.out)
    print(
        f"read {report.records} records ({report.skipped_total} skipped); wrote {written} NeMo-Gym rows -> {args.out}"
    )
    return 0
