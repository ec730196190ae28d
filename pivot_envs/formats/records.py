"""Raw records of a trajectory file, and its format detected from their content.

A file is a JSON list of records (tau-bench results), one JSON object, or JSONL, possibly
gzip-compressed (recognised by its magic bytes, whatever its name) and possibly starting with a
UTF-8 BOM (ignored). What does not parse, and a record holding a lone surrogate (valid JSON, not
text), is reported in a `ReadReport` as ``file:line: reason`` (``file:[i]: reason`` for the i-th
element of a JSON list) and skipped; a gzip stream cut off is reported, and the records before
the cut are read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pivot_envs.errors import PivotEnvsError
from pivot_envs.jsonl import may_hold_surrogate, read_text_bytes, surrogate_problem
from pivot_envs.pivot import PivotFormatError
from pivot_envs.trajectory import ReadReport

FORMATS = ("openai-chat", "nemo-gym-pivots", "nemo-gym-rollouts", "sharegpt", "pivots")
PIVOT_V1 = "pivot-v1"  # a row of NVIDIA's Pivot-v1 sets (NeMo-Gym pivot rows with fields of their own)
CUT_OFF = "cut-off file"  # the reported reason of a gzip stream that ends early (not a record)
# How many leading records detect_format looks at before giving up.
_DETECT_RECORDS = 50


class FormatError(PivotEnvsError, ValueError):
    """Content that is not a trajectory or pivot in any known format; the message names the file."""


class MalformedRecord(FormatError):
    """A record that cannot be read: `reason` is the counted category, the message the detail."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _load_bytes(path: Path, report: ReadReport) -> bytes:
    """The file's bytes (gunzipped, without a UTF-8 BOM); a gzip stream cut off or corrupt is
    reported, and what came before the cut is kept."""
    data, problem = read_text_bytes(path)
    if problem:
        report.skip(str(path), CUT_OFF, f"{problem}; the lines before it were read")
    return data


def records(path: str | os.PathLike[str], report: ReadReport) -> Iterator[tuple[str, Any]]:
    """Yield (where, parsed JSON record) for a JSON list, a single JSON object or a JSONL file.

    `where` is "file:line" ("file:[i]" in a JSON list). What does not parse is reported
    ("file:line: reason") and skipped.
    """
    path = Path(path)
    data = _load_bytes(path, report)
    if data.lstrip()[:1] == b"[":  # a JSON list of records (tau-bench results)
        report.records += 1
        try:
            whole = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError as error:
            report.skip(f"{path}:1", "invalid JSON", f"not UTF-8 at byte {error.start}")
            return
        except json.JSONDecodeError as error:
            report.skip(
                f"{path}:{error.lineno}", "invalid JSON", f"the JSON list does not parse ({error.msg})"
            )
            return
        check = may_hold_surrogate(data)
        if isinstance(whole, list):
            report.records += len(whole) - 1
            for index, record in enumerate(whole):
                if not (check and _holds_surrogate(f"{path}:[{index}]", record, report)):
                    yield f"{path}:[{index}]", record
            return
        if not (check and _holds_surrogate(f"{path}:1", whole, report)):
            yield f"{path}:1", whole
        return
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        report.records += 1
        where = f"{path}:{number}"
        try:
            record = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as error:
            report.skip(where, "invalid JSON", f"not UTF-8 at byte {error.start}")
            continue
        except json.JSONDecodeError as error:
            if number == 1 and _single_document(data, report):
                # One pretty-printed JSON object, not JSONL.
                whole = json.loads(data.decode("utf-8"))
                if not (may_hold_surrogate(data) and _holds_surrogate(f"{path}:1", whole, report)):
                    yield f"{path}:1", whole
                return
            report.skip(where, "invalid JSON", f"{error.msg} at column {error.colno}")
            continue
        if not (may_hold_surrogate(raw) and _holds_surrogate(where, record, report)):
            yield where, record


def _holds_surrogate(where: str, record: Any, report: ReadReport) -> bool:
    """Whether a record holds a lone surrogate; if so it is reported as invalid text (to be skipped:
    no UTF-8 writer, tokenizer or sandbox could take it)."""
    problem = surrogate_problem(record)
    if problem:
        report.skip(where, "invalid text", problem)
    return problem is not None


def _single_document(data: bytes, report: ReadReport) -> bool:
    try:
        whole = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    if isinstance(whole, dict):
        report.records = 1
        return True
    return False


# -- NVIDIA's Pivot-v1 rows (read by pivot_envs.formats.nemotron_pivot_v1), told apart by their keys -----


def detect_set(row: dict) -> str | None:
    """The Pivot-v1 set a row belongs to, from its fields; None when it is in none."""
    if not isinstance(row, dict) or "responses_create_params" not in row:
        return None
    agent = row.get("agent_ref") if isinstance(row.get("agent_ref"), dict) else {}
    name = str(agent.get("name") or "")
    metadata = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
    # A key counts when set: a parquet file gives every row every column, null where a row lacked it.
    if (
        row.get("expected_answer") is not None
        or "terminus" in name
        or metadata.get("harness") == "terminus_2"
    ):
        return "terminal"
    if row.get("expected_action") is None:
        return None
    if "swe" in name:
        return "swe"
    if any(
        row.get(key) is not None for key in ("pass_rate", "qwen_235b_info", "meta_info", "num_unique_actions")
    ):
        return "conversational-tool-use"
    if row.get("info") is not None or row.get("trajectory_id") is not None:
        return "function-calling"
    return None


def is_pivot_v1_row(row: Any) -> bool:
    """Whether a record is a Pivot-v1 row, not a plain NeMo-Gym pivot row (which `detect_set` would
    also place): a function-calling row needs its `info` {turn, step, depth} as well, an SWE row its
    `trajectory_id` or a recorded pass rate (NeMo-Gym's own swe_pivot samples have neither)."""
    name = detect_set(row)
    if name == "function-calling":
        info = row.get("info")
        return isinstance(info, dict) and {"turn", "depth"} <= info.keys()
    if name == "swe":
        return any(row.get(key) is not None for key in ("trajectory_id", "pass_rate", "pass_rate_passed"))
    return name is not None


def record_kind(record: Any) -> str | None:
    """The format (one of FORMATS, or PIVOT_V1) a parsed record is in, from its keys; None when it is in none."""
    if not isinstance(record, dict):
        return None
    if isinstance(record.get("expert"), dict) and "messages" in record and "id" in record:
        return "pivots"
    if "responses_create_params" in record:
        if is_pivot_v1_row(record):
            return PIVOT_V1
        return "nemo-gym-pivots" if "expected_action" in record else "nemo-gym-rollouts"
    if "conversations" in record:
        return "sharegpt"
    if "traj" in record or "messages" in record:
        return "openai-chat"
    return None


def detect_format(path: str | os.PathLike[str]) -> str:
    """The format of a file, from its content (not its name); raises FormatError (a ValueError) naming the file if unknown."""
    seen: list[str] = []
    for count, (_, record) in enumerate(records(path, ReadReport())):
        kind = record_kind(record)
        if kind is not None:
            return kind
        seen.append(", ".join(sorted(record)[:6]) if isinstance(record, dict) else type(record).__name__)
        if count + 1 >= _DETECT_RECORDS:
            break
    shown = f"; first records look like: {seen[:3]}" if seen else " (no JSON records found)"
    raise FormatError(
        f"{path}: cannot detect the trajectory format{shown}; expected one of {', '.join(FORMATS)}"
    )


T = TypeVar("T")


def converted(report: ReadReport, where: str, convert: Callable[..., T], *args: Any) -> T | None:
    """`convert(*args)`, or None with the reason skipped in `report` at `where` when the record is malformed (a
    MalformedRecord's own reason, an invalid pivot, or a shape no reader foresaw): a bad record never raises."""
    try:
        return convert(*args)
    except MalformedRecord as error:
        report.skip(where, error.reason, error.detail)
    except PivotFormatError as error:
        report.skip(where, "malformed pivot", str(error))
    except (TypeError, ValueError, AttributeError, KeyError) as error:  # shapes we did not foresee
        report.skip(where, "malformed record", f"{type(error).__name__}: {error}")
    return None
