"""Reading a file in any supported format: its trajectories, or its pivots.

Each record's format is detected from its content (`records.record_kind`) and the record goes to
that format's reader. A malformed record is counted in the `ReadReport` as ``file:line: reason``
and skipped; reading never raises on bad content. `read_as_pivots` also runs the extraction
(`pivot_envs.extract`) on trajectory files: reading sits above extraction, never below it. A file
of NVIDIA's Pivot-v1 rows (parquet, or JSONL whose first record is one) goes to that format's
streamed reader (`nemotron_pivot_v1.iter_pivot_v1`), as `pivotrl extract --format pivot-v1` reads it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from pivot_envs.extract import ExtractConfig, extract_pivots, reward_rejection, turn_rejection
from pivot_envs.formats.nemo_gym_pivots import nemo_gym_row_to_pivot
from pivot_envs.formats.nemo_gym_rollouts import read_rollout
from pivot_envs.formats.nemotron_pivot_v1 import iter_pivot_v1, looks_like_pivot_v1, pivot_v1_row_to_pivot
from pivot_envs.formats.openai_chat import read_openai_chat
from pivot_envs.formats.pivots import read_pivot_record
from pivot_envs.formats.records import PIVOT_V1, converted, record_kind, records
from pivot_envs.formats.sharegpt import read_sharegpt
from pivot_envs.pivot import Pivot, domain_mismatch
from pivot_envs.trajectory import ReadReport, Trajectory


def _default_prefix(path: Path) -> str:
    """tau-bench trajectory ids: `tau-<env>/task<id>/trial<n>`, the env from the folder name."""
    return f"tau-{path.parent.name}" if path.parent.name else path.stem


def _read_record(kind: str, record: dict, default_id: str, prefix: str) -> Trajectory | Pivot:
    """One record through its format's reader; raises what that reader raises."""
    if kind == "pivots":
        return read_pivot_record(record)
    if kind == "nemo-gym-pivots":
        return nemo_gym_row_to_pivot(record, default_id)
    if kind == PIVOT_V1:
        return pivot_v1_row_to_pivot(record, default_id=default_id)
    if kind == "nemo-gym-rollouts":
        return read_rollout(record, default_id)
    if kind == "sharegpt":
        return read_sharegpt(record, default_id)
    return read_openai_chat(record, default_id, prefix)


def _read(
    path: Path, report: ReadReport, id_prefix: str | None
) -> Iterator[tuple[str, str, Trajectory | Pivot]]:
    """(where, format, Trajectory or Pivot) per good record; malformed ones go to the report."""
    stem = path.name.split(".")[0]
    prefix = id_prefix or _default_prefix(path)
    seen_ids: set[str] = set()
    for where, record in records(path, report):
        kind = record_kind(record)
        if kind is None:
            keys = ", ".join(sorted(record)[:8]) if isinstance(record, dict) else type(record).__name__
            report.skip(
                where, "unrecognized record", f"not a trajectory or pivot in any known format ({keys})"
            )
            continue
        report.formats.setdefault(str(path), kind)
        default_id = f"{id_prefix or stem}/{where.rsplit(':', 1)[1].strip('[]')}"
        item = converted(report, where, _read_record, kind, record, default_id, prefix)
        if item is None:
            continue
        if item.id in seen_ids:  # keep ids unique within a file: a repeated id gets its position
            item.id = f"{item.id}@{where.rsplit(':', 1)[1].strip('[]')}"
        seen_ids.add(item.id)
        yield where, kind, item


def read_trajectories(
    path: str | os.PathLike[str], report: ReadReport | None = None, *, id_prefix: str | None = None
) -> Iterator[Trajectory]:
    """Stream the trajectories of a file in any supported format (detected per record, by content).

    Pivot files (NeMo-Gym pivot rows, our pivot JSONL) yield prefix + expert as a trajectory.
    Malformed records are counted in `report` with "file:line: reason" and skipped; bad content
    never raises. `id_prefix` replaces the default id prefix (the file's stem; `tau-<folder>` for
    tau-bench episodes).
    """
    report = report if report is not None else ReadReport()
    path = Path(path)
    for _, _, item in _read(path, report, id_prefix):
        if isinstance(item, Pivot):
            item = Trajectory(
                item.trajectory_id,
                [*item.messages, item.expert],
                item.tools,
                item.source.get("reward"),
                item.context,
                report.formats[str(path)],
            )
        report.trajectories += 1
        if item.assistant_turns == 0:
            report.no_assistant += 1
        yield item


def read_as_pivots(
    path: str | os.PathLike[str],
    domain: str = "",
    report: ReadReport | None = None,
    *,
    config: ExtractConfig | None = None,
    id_prefix: str | None = None,
) -> list[Pivot]:
    """Pivots from a file: our pivot JSONL (.gz) as is, NeMo-Gym pivot rows one pivot per row, and
    any trajectory format through `extract_pivots` (by default every assistant turn a candidate).

    `domain` (or `config.domain`) fills in pivots that have none; pivots that name another domain
    keep it, with a warning (an env of `domain` would score them with its own parser and verifier).
    The `config`'s turn and reward rules apply to ready-made pivots too. Without a `report`, skipped
    records are announced with a warning naming the first problem.
    """
    config = config or ExtractConfig(domain=domain)
    domain = config.domain or domain
    own = report if report is not None else ReadReport()
    path = Path(path)
    pivots: list[Pivot] = []
    trajectories: list[Trajectory] = []
    streamed = looks_like_pivot_v1(path)
    if streamed:  # a row at a time, as `pivotrl extract --format pivot-v1` reads it
        own.formats.setdefault(str(path), PIVOT_V1)
        items: Iterator[Trajectory | Pivot] = iter_pivot_v1(path, own, id_prefix=id_prefix)
    else:
        items = (item for _, _, item in _read(path, own, id_prefix))
    for item in items:
        if isinstance(item, Pivot):
            rejected = reward_rejection(item.source.get("reward"), config) or turn_rejection(
                item.expert, config
            )
            if rejected:
                own.filtered[rejected] += 1
                own.pivots -= streamed  # iter_pivot_v1 counted it when it yielded it
                continue
            item.domain = item.domain or domain
            pivots.append(item)
            own.pivots += not streamed  # iter_pivot_v1 counts the pivots it yields
        else:
            own.trajectories += 1
            if item.assistant_turns == 0:
                own.no_assistant += 1
            trajectories.append(item)
    if trajectories:
        pivots.extend(extract_pivots(trajectories, replace(config, domain=domain), report=own))
    mismatch = domain_mismatch(pivots, domain)
    if mismatch:
        warnings.warn(f"{path}: {mismatch}", stacklevel=2)
    if report is None and own.skipped_total:
        warnings.warn(
            f"{path}: skipped {own.skipped_total} malformed record(s); first: {own.problems[0]}", stacklevel=2
        )
    return pivots
