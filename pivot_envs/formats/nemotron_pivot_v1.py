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

import hashlib
import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pivot_envs.formats.nemo_gym_pivots import nemo_gym_row_to_pivot
from pivot_envs.formats.records import MalformedRecord
from pivot_envs.jsonl import GzipCut, read_lines
from pivot_envs.pivot import Pivot, PivotFormatError, PivotWriter, Profile
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
        try:
            pivot = pivot_v1_row_to_pivot(row, set_name, f"{prefix}/{number}")
        except MalformedRecord as error:
            report.skip(where, error.reason, error.detail)
            continue
        except PivotFormatError as error:
            report.skip(where, "malformed pivot", str(error))
            continue
        except (TypeError, ValueError, AttributeError, KeyError) as error:  # shapes we did not foresee
            report.skip(where, "malformed record", f"{type(error).__name__}: {error}")
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


# -- replaying terminal rows in the base image ---------------------------------------------------------

REPLAY_ROW_TIMEOUT = 30.0  # seconds one row's replay may take, all its commands together
MISSING_PROGRAM = (126, 127)  # bash's exit status for a program that is not there or cannot run


def replay_terminal_prefix(pivot: Pivot, backend: Any, row_timeout: float = REPLAY_ROW_TIMEOUT) -> str:
    """Replay a terminal pivot's prefix in a fresh sandbox of the base image: "" when every prefix
    command (as the terminal domain extracts them) exits as recorded (`context["prefix_exit_codes"]`,
    else 0) within `row_timeout` seconds in all, and the expert's own command then finds its program
    (no exit 126/127) and ends in time; otherwise why not.

    `backend` is a sandbox backend (bubblewrap or Docker) on the terminal domain's base image; each
    command gets at most the backend's own per-command timeout, the one the env replays with.
    """
    return _replay(pivot, backend, row_timeout)[0]


def _replay(pivot: Pivot, backend: Any, row_timeout: float) -> tuple[str, int | None]:
    """`replay_terminal_prefix`'s reason, and the index of the prefix command that failed (None: none did)."""
    from pivot_envs.domains.terminal.parse import parse_command
    from pivot_envs.domains.terminal.prefix import BASE_IMAGE, pivot_image, prefix_commands, setup_commands
    from pivot_envs.sandboxes import SandboxError

    commands, reason = prefix_commands(pivot)
    if reason:
        return reason, None
    if pivot_image(pivot).split(":")[0] != BASE_IMAGE or setup_commands(pivot.context):
        return "the row names its own image or setup, which the replay does not have", None
    expert = parse_command(pivot.expert)
    workdir = str(pivot.context.get("workdir", "/app"))
    expected = pivot.context.get("prefix_exit_codes")
    deadline = time.monotonic() + row_timeout
    per_command = float(getattr(getattr(backend, "limits", None), "timeout", None) or row_timeout)
    sandbox = None
    try:
        sandbox = backend.create(BASE_IMAGE, workdir) if backend.name == "docker" else backend.create(workdir)
        steps = [(f"prefix command {i}", c) for i, c in enumerate(commands)]
        if expert.command is not None and not expert.keys:
            steps.append(("the expert's command", expert.command))
        for index, (what, command) in enumerate(steps):
            left = deadline - time.monotonic()
            if left <= 0:
                return f"the replay ran past its {row_timeout:g}s bound before {what}", None
            result = sandbox.run(command, timeout=min(left, per_command))
            shown = f"{what} {command.strip()[:120]!r}"
            if result.timed_out:
                return f"{shown} timed out on replay in the base image", None
            if index == len(commands):  # the expert's: it may exit otherwise, not miss its program
                if result.exit_code in MISSING_PROGRAM:
                    return (
                        f"{shown} needs a program the base image lacks: {result.output[-160:].strip()}",
                        None,
                    )
                continue
            want = expected[index] if isinstance(expected, list) and index < len(expected) else 0
            if result.exit_code != want:
                return (
                    f"{shown} exited {result.exit_code} on replay in the base image, recorded {want}: "
                    f"{result.output[-160:].strip()}",
                    index,
                )
    except SandboxError as error:
        return f"the replay's sandbox failed: {error}", None
    finally:
        if sandbox is not None:
            sandbox.close()
    return "", None


def replay_backend(command_timeout: float | None = None) -> Any:
    """A bubblewrap backend on the terminal domain's base image for `mark_replayable` (close it after);
    raises SandboxError saying what to install or build when bubblewrap or the image is missing."""
    from pivot_envs.domains.terminal.image import base_rootfs
    from pivot_envs.sandboxes import SandboxLimits
    from pivot_envs.sandboxes.backends import resolve_sandbox
    from pivot_envs.sandboxes.bwrap_backend import BwrapBackend

    resolve_sandbox("bwrap")
    limits = SandboxLimits() if command_timeout is None else SandboxLimits(timeout=command_timeout)
    return BwrapBackend(base_rootfs(build=False), limits, warm_pool=0)


def _prefix_digests(pivot: Pivot) -> list[str]:
    """A digest of each leading run of the pivot's prefix commands (the workdir first): rows of one
    trajectory share them, so a failed replay settles every row that starts with its commands."""
    from pivot_envs.domains.terminal.prefix import prefix_commands

    commands, _ = prefix_commands(pivot)
    digest = hashlib.sha256(json.dumps([pivot.context.get("workdir", "/app")]).encode())
    out = []
    for command in commands:
        digest.update(json.dumps(command).encode())
        out.append(digest.copy().hexdigest()[:24])
    return out


def replayable_candidate(pivot: Pivot) -> bool:
    """A Pivot-v1 terminal pivot still marked unexecuted: what `mark_replayable` replays."""
    return pivot.context.get("pivot_v1_set") == "terminal" and pivot.context.get("executable") is False


def mark_replayable(
    pivots: Iterable[Pivot],
    backend: Any,
    *,
    row_timeout: float = REPLAY_ROW_TIMEOUT,
    max_rows: int | None = None,
    progress: bool = True,
) -> Iterator[Pivot]:
    """Yield `pivots`, each Pivot-v1 terminal pivot (the first `max_rows` of them) replayed by
    `replay_terminal_prefix` on `backend`: `context["executable"] = True` where it replays, else it
    keeps its reason with what failed in the replay added. Other pivots pass unchanged.

    A prefix whose commands failed on replay settles, without a sandbox, every later row that
    starts with the same commands up to the failing one (the rows of one trajectory do).
    """
    from pivot_envs.config import progress_bar

    failed: dict[str, str] = {}
    bar = progress_bar(desc="replaying terminal rows", unit=" rows", total=max_rows, enabled=progress)
    replayed = 0
    try:
        for pivot in pivots:
            if not replayable_candidate(pivot) or (max_rows is not None and replayed >= max_rows):
                yield pivot
                continue
            replayed += 1
            digests = _prefix_digests(pivot)
            reason = next((failed[d] for d in digests if d in failed), None)
            if reason is None:
                reason, index = _replay(pivot, backend, row_timeout)
                if index is not None and index < len(digests):  # exits differ: not a timing matter
                    failed[digests[index]] = reason
            if reason:
                base = pivot.context.get("not_executable_reason") or SETS["terminal"].not_executable_reason
                pivot.context["not_executable_reason"] = f"{base}; replayed in the base image: {reason}"
                pivot.context["replay_failed"] = reason
            else:
                pivot.context["executable"] = True
                pivot.context.pop("not_executable_reason", None)
                pivot.context["replayed"] = "base image"
            bar.update(1)
            yield pivot
    finally:
        bar.close()


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
    replay_backend: Any = None,
    row_timeout: float = REPLAY_ROW_TIMEOUT,
    max_replay_rows: int | None = None,
) -> PivotV1Summary:
    """Stream Pivot-v1 files into one pivot JSONL at `out` (bounded memory); returns the summary.

    With `replay_backend` (a sandbox backend on the terminal base image), terminal rows go through
    `mark_replayable` (at most `max_replay_rows`, `row_timeout` seconds each) and those that
    replay are written executable; the summary counts them.
    """
    summary = PivotV1Summary(replayed=None if replay_backend is None else 0)
    with PivotWriter(out, append=False, fsync=False) as writer:
        for path in inputs:
            pivots: Iterable[Pivot] = iter_pivot_v1(path, summary.report, set_name=set_name)
            if replay_backend is not None:
                left = None if max_replay_rows is None else max(max_replay_rows - summary.replayed, 0)
                pivots = mark_replayable(pivots, replay_backend, row_timeout=row_timeout, max_rows=left)
            for pivot in pivots:
                if replay_backend is not None and (
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
