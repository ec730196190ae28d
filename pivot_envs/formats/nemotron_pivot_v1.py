"""NVIDIA's Nemotron-RL-Agentic Pivot-v1 sets as pivots, streamed from their files as downloaded.

Four sets, one schema family (NeMo-Gym pivot rows, read by `nemo_gym_pivots`, plus fields of
their own; see docs/pivot-v1.md for the schemas and the sources they rest on):

- ``conversational-tool-use`` (~97k rows): `trajectory_id`, `meta_info` {turn, step,
  assistant_depth}, recorded pass rates (`pass_rate`, `pass_rate_total`, `pass_rate_passed`,
  `qwen_235b_info.rewards`) -> tool-use pivots with a profile.
- ``function-calling`` (~8.5k): `trajectory_id`, `info` {turn, step, depth} -> tool-use pivots, unprofiled.
- ``swe`` (~50k): `trajectory_id`, `expected_action`, pass rates over K = 8 -> SWE pivots with a
  profile; no repository or tests ship, so `context["executable"]` is False (the env scores
  without running: `info["executed"]` False).
- ``terminal`` (~31k): `expected_answer` (a Terminus-2 JSON text), `metadata`
  {source_trajectory_uid, task_name, ...} -> terminal pivots, unprofiled; the tasks' files are
  not shipped, so they are not executable here either, unless `mark_replayable` (opt-in) replays a
  row's prefix commands in a sandbox of our base image and every one exits as recorded.

Files are read in bounded memory: parquet a record batch at a time (pyarrow `iter_batches`),
JSONL (gzip too) a line at a time. A malformed row is reported in the `ReadReport` as
``file:row N: reason`` (parquet) or ``file:N: reason`` (JSONL) and skipped, never raised.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pivot_envs.formats.nemo_gym_pivots import nemo_gym_row_to_pivot
from pivot_envs.formats.records import MalformedRecord, converted, detect_set, is_pivot_v1_row
from pivot_envs.jsonl import GzipCut, read_lines
from pivot_envs.pivot import Pivot, PivotWriter, Profile
from pivot_envs.trajectory import ReadReport

PARQUET_MAGIC = b"PAR1"
BATCH_ROWS = 512  # rows per parquet record batch: a few MB of rows in memory at a time


@dataclass(frozen=True)
class PivotV1Set:
    """One of NVIDIA's Pivot-v1 sets: its Hub name, our domain, and whether its rows run here."""

    name: str
    repo: str
    domain: str
    executable: bool
    not_executable_reason: str = ""


SETS: dict[str, PivotV1Set] = {
    s.name: s
    for s in (
        PivotV1Set(
            "conversational-tool-use",
            "nvidia/Nemotron-RL-Agentic-Conversational-Tool-Use-Pivot-v1",
            "tool-use",
            True,
        ),
        PivotV1Set(
            "function-calling", "nvidia/Nemotron-RL-Agentic-Function-Calling-Pivot-v1", "tool-use", True
        ),
        PivotV1Set(
            "swe",
            "nvidia/Nemotron-RL-Agentic-SWE-Pivot-v1",
            "swe",
            False,
            "Pivot-v1 SWE rows ship no repository, commit or tests",
        ),
        PivotV1Set(
            "terminal",
            "nvidia/Nemotron-RL-Agentic-Terminal-Pivot-v1",
            "terminal",
            False,
            "Pivot-v1 terminal rows ship no task image or files (the originals ran on Modal)",
        ),
    )
}


def _count(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 0:
        raise MalformedRecord("malformed pass rate", f"{what} must be a count, got {value!r}")
    return int(value)


def recorded_profile(row: dict, set_name: str) -> Profile | None:
    """The row's recorded pass rate as a Profile (K binary rewards), None when it records none.

    `qwen_235b_info.rewards` (the K rewards themselves) when given, else `pass_rate_passed` of
    `pass_rate_total`, else `pass_rate` with K from `pass_rate_total` (8 for SWE, as its card says).
    """
    info = row.get("qwen_235b_info")
    rewards = info.get("rewards") if isinstance(info, dict) else None
    policy = f"recorded:{SETS[set_name].repo}"
    if isinstance(rewards, list) and rewards:
        if not all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in rewards):
            raise MalformedRecord("malformed pass rate", "qwen_235b_info.rewards must be numbers")
        return Profile.from_samples([float(r) for r in rewards], policy=policy, settings={"recorded": True})
    total = _count(row.get("pass_rate_total"), "pass_rate_total")
    passed = _count(row.get("pass_rate_passed"), "pass_rate_passed")
    rate = row.get("pass_rate")
    if passed is None and rate is not None:
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
            raise MalformedRecord("malformed pass rate", f"pass_rate must be in [0, 1], got {rate!r}")
        total = total or (8 if set_name == "swe" else None)
        if total is None:
            raise MalformedRecord("malformed pass rate", "pass_rate without pass_rate_total")
        passed = round(rate * total)
    if passed is None:
        return None
    if not total or passed > total:
        raise MalformedRecord("malformed pass rate", f"pass_rate_passed {passed} of total {total}")
    rewards = [1.0] * passed + [0.0] * (total - passed)
    return Profile.from_samples(rewards, policy=policy, settings={"recorded": True})


def _trajectory(row: dict) -> str | None:
    metadata = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
    value = row.get("trajectory_id", metadata.get("source_trajectory_uid"))
    return None if value is None or value == "" else str(value)


def pivot_v1_row_to_pivot(row: dict, set_name: str | None = None, default_id: str = "") -> Pivot:
    """A Pivot-v1 row -> Pivot of the set's domain; raises MalformedRecord naming the bad field.

    The prefix, tools and expert come from the NeMo-Gym reader (a terminal row's `expected_answer`
    becomes the expert's message text); other fields go to `context`. The id is
    `<set>/<trajectory>/t<assistant turns before>` (`uuid` when the row has one), the source
    trajectory `<set>/<trajectory_id>` so a split keeps a trajectory's turns together; recorded
    pass rates become `profile`; rows that cannot run here say so in `context["executable"]`.
    """
    if not isinstance(row, dict):
        raise MalformedRecord("wrong type", f"a row must be an object, got {type(row).__name__}")
    set_name = set_name or detect_set(row)
    if set_name not in SETS:
        keys = ", ".join(sorted(row)[:8])
        raise MalformedRecord("unrecognized record", f"not a row of any Pivot-v1 set ({keys})")
    spec = SETS[set_name]
    if set_name == "terminal" and row.get("expected_action") is None:
        answer = row.get("expected_answer")
        if not isinstance(answer, str) or not answer.strip():
            raise MalformedRecord("malformed expected answer", "expected_answer must be non-empty text")
        row = {k: v for k, v in row.items() if k != "expected_answer"}
        row["expected_action"] = {"type": "message", "content": answer}
    pivot = nemo_gym_row_to_pivot(row, default_id or "-", spec.domain)
    trajectory = _trajectory(row)
    turn = sum(1 for m in pivot.messages if m["role"] == "assistant")
    if "uuid" not in row and "id" not in row:
        pivot.id = f"{set_name}/{trajectory or default_id}/t{turn}"
    pivot.source = {
        "trajectory": f"{set_name}/{trajectory}" if trajectory else pivot.id,
        "turn": turn,
        "reward": pivot.source.get("reward"),
        "format": f"pivot-v1:{set_name}",
    }
    pivot.profile = recorded_profile(row, set_name)
    pivot.context["pivot_v1_set"] = set_name
    if not spec.executable:
        pivot.context["executable"] = False
        pivot.context["not_executable_reason"] = spec.not_executable_reason
    return pivot


def _is_parquet(path: Path) -> bool:
    with open(path, "rb") as handle:
        return handle.read(4) == PARQUET_MAGIC


def _drop_nulls(value: Any) -> Any:
    """Parquet stores a list of unlike objects as one struct type: keys an item lacked come back null."""
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _from_parquet(row: dict) -> dict:
    """A parquet row in the JSONL row's shape: nulls the struct union added dropped where they can
    only be that (input items, tools, the expected action), JSON text columns left as text."""
    params = row.get("responses_create_params")
    if isinstance(params, dict):
        params = dict(params)
        for key in ("input", "tools"):
            if isinstance(params.get(key), list):
                params[key] = _drop_nulls(params[key])
        row["responses_create_params"] = params
    action = row.get("expected_action")
    if isinstance(action, str):  # some conversions keep the union-typed action as JSON text
        try:
            action = json.loads(action)
        except json.JSONDecodeError:
            pass
    if isinstance(action, dict):
        row["expected_action"] = _drop_nulls(action)
    return row


def iter_rows(path: str | os.PathLike[str], report: ReadReport) -> Iterator[tuple[str, Any]]:
    """(where, row) for each row of a parquet or JSONL (.gz) file, streamed in bounded memory.

    What cannot be read (a line that is not JSON, a parquet file that does not open) is reported
    in `report` and skipped.
    """
    path = Path(path)
    if _is_parquet(path):
        yield from _parquet_rows(path, report)
        return
    try:
        for number, raw in enumerate(read_lines(path), start=1):
            if not raw.strip():
                continue
            report.records += 1
            try:
                yield f"{path}:{number}", json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                report.skip(f"{path}:{number}", "invalid JSON", str(error).split(":")[0])
    except GzipCut as cut:
        report.skip(str(path), "cut-off file", f"{cut.reason}; the lines before it were read")


def _parquet_rows(path: Path, report: ReadReport) -> Iterator[tuple[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as error:
        report.skip(str(path), "unreadable parquet", str(error))
        return
    number = 0
    try:
        for batch in parquet.iter_batches(batch_size=BATCH_ROWS):
            for row in batch.to_pylist():
                number += 1
                report.records += 1
                yield f"{path}:row {number}", _from_parquet(row)
    except (OSError, pa.ArrowException) as error:
        report.skip(
            f"{path}:row {number + 1}", "unreadable parquet", f"{error}; the rows before it were read"
        )


def iter_pivot_v1(
    path: str | os.PathLike[str],
    report: ReadReport | None = None,
    *,
    set_name: str | None = None,
    id_prefix: str | None = None,
) -> Iterator[Pivot]:
    """Stream the pivots of a Pivot-v1 file (parquet or JSONL); each row's set is detected unless
    `set_name` is given. Malformed rows go to `report` with their row number and are skipped.
    A row without a trajectory or id is named `<id_prefix>/<row>` (default: the file's stem).
    A repeated id gets `@<row>` appended, as the other readers do."""
    report = report if report is not None else ReadReport()
    seen: set[str] = set()
    prefix = id_prefix or Path(path).name.split(".")[0]
    for where, row in iter_rows(path, report):
        number = where.rsplit(":", 1)[1].removeprefix("row ")
        pivot = converted(report, where, pivot_v1_row_to_pivot, row, set_name, f"{prefix}/{number}")
        if pivot is None:
            continue
        if pivot.id in seen:
            pivot.id = f"{pivot.id}@{number}"
        seen.add(pivot.id)
        report.pivots += 1
        yield pivot


def looks_like_pivot_v1(path: str | os.PathLike[str]) -> bool:
    """Whether a file is a Pivot-v1 file: parquet, or JSONL (.gz) whose first record is a Pivot-v1 row.

    Reads one line at most; a JSON list or a file that does not parse is not one (the generic reader
    reports it).
    """
    path = Path(path)
    try:
        if _is_parquet(path):
            return True
        for raw in read_lines(path):
            if not raw.strip():
                continue
            if raw.lstrip()[:1] != b"{":
                return False
            return is_pivot_v1_row(json.loads(raw))
    except (OSError, GzipCut, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return False


@dataclass
class PivotV1Summary:
    """What `extract_pivot_v1` read and wrote: counts per set, profiled and executable pivots."""

    written: int = 0
    per_set: dict[str, int] = field(default_factory=dict)
    profiled: int = 0
    executable: int = 0
    report: ReadReport = field(default_factory=ReadReport)
    replayed: int | None = None  # terminal rows replayed in the base image (None: no replay asked)
    replayed_executable: int = 0

    @property
    def executed_share(self) -> float:
        """The share of pivots whose action the env runs (the rest are scored unexecuted)."""
        return self.executable / self.written if self.written else 0.0

    def lines(self) -> list[str]:
        sets = ", ".join(f"{name} {count}" for name, count in sorted(self.per_set.items())) or "none"
        return [
            f"rows read: {self.report.records} ({self.report.skipped_total} malformed, skipped)",
            f"pivots: {self.written} ({sets})",
            f"with a recorded profile: {self.profiled} (pivotrl filter selects D_adv from them directly)",
            f"executed: {self.executable} of {self.written} ({100 * self.executed_share:.1f}%); "
            "the rest are scored without running (info['executed'] False)",
        ] + (
            []
            if self.replayed is None
            else [
                f"terminal rows replayed in the base image: {self.replayed}, executed "
                f"{self.replayed_executable} ({100 * self.replayed_executable / max(self.replayed, 1):.1f}%)"
            ]
        )


def extract_pivot_v1(
    inputs: Iterable[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    set_name: str | None = None,
    replay: Callable[[Iterable[Pivot]], Iterable[Pivot]] | None = None,
) -> PivotV1Summary:
    """Stream Pivot-v1 files into one pivot JSONL at `out` (bounded memory); returns the summary.

    `replay` (the terminal domain's `mark_replayable` with its backend and bounds, see
    pivot_envs.domains.terminal.pivot_v1) passes the pivots through, marking terminal rows that
    replay executable; the summary counts those it replayed (context "replayed" or "replay_failed").
    """
    summary = PivotV1Summary(replayed=None if replay is None else 0)
    with PivotWriter(out, append=False, fsync=False) as writer:
        for path in inputs:
            pivots: Iterable[Pivot] = iter_pivot_v1(path, summary.report, set_name=set_name)
            if replay is not None:
                pivots = replay(pivots)
            for pivot in pivots:
                if summary.replayed is not None and (
                    "replayed" in pivot.context or "replay_failed" in pivot.context
                ):
                    summary.replayed += 1
                    summary.replayed_executable += "replayed" in pivot.context
                writer.write(pivot)
                summary.written += 1
                name = pivot.context["pivot_v1_set"]
                summary.per_set[name] = summary.per_set.get(name, 0) + 1
                summary.profiled += pivot.profile is not None
                summary.executable += pivot.context.get("executable", True) is not False
        writer.sync()
    return summary
