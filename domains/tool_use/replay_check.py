"""Check of the airline backend: replaying trajectories reproduces their recorded tool outputs.

Every successful (reward 1.0) tau-bench airline trajectory is replayed call by call from the
initial database, in one copy-on-write state per trajectory, and each output is compared with
the tool message recorded after the call (JSON-normalized: parsed when both sides are JSON, so
key order and spacing do not count). Mismatches are listed with a diagnosed cause.

    python -m pivot_envs.domains.tool_use.replay_check [TRAJECTORIES.json] [--all]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pivot_envs.domains.tool_use.airline import AirlineDatabase, State, bundled_database, call_tool

DEFAULT_TRAJECTORIES = (
    Path(__file__).resolve().parents[3]
    / "shared"
    / "data"
    / "tau_bench"
    / "airline"
    / "gpt4o_trajectories.json"
)


def normalized(text: Any) -> Any:
    """A tool output in comparable form: parsed JSON when it is JSON, else the trimmed text."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text.strip()


def _first_difference(expected: Any, actual: Any, path: str = "$") -> str:
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual)):
            if key not in actual:
                return f"{path}.{key} missing from the replay"
            if key not in expected:
                return f"{path}.{key} only in the replay"
            if expected[key] != actual[key]:
                return _first_difference(expected[key], actual[key], f"{path}.{key}")
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return f"{path}: {len(expected)} items recorded, {len(actual)} replayed"
        for i, (a, b) in enumerate(zip(expected, actual)):
            if a != b:
                return _first_difference(a, b, f"{path}[{i}]")
    return f"{path}: recorded {json.dumps(expected)[:120]}, replayed {json.dumps(actual)[:120]}"


@dataclass
class Mismatch:
    trajectory: str
    turn: int
    tool: str
    arguments: Any
    difference: str
    cause: str

    def __str__(self) -> str:
        return (
            f"{self.trajectory} message {self.turn} {self.tool}({json.dumps(self.arguments)}): "
            f"{self.difference} [cause: {self.cause}]"
        )


READ_ONLY_TOOLS = frozenset(
    {
        "get_user_details",
        "get_reservation_details",
        "search_direct_flight",
        "search_onestop_flight",
        "list_all_airports",
    }
)


def _cause(database: AirlineDatabase, name: str, arguments: Any, output: str) -> str:
    """Why a replayed output differs from the recording, as far as the replay can tell."""
    if name in READ_ONLY_TOOLS and call_tool(State(database), name, arguments) == output:
        return (
            "database revision: the record is read as stored in the initial database (no earlier "
            "call of the trajectory wrote it), and the recording saw a different value"
        )
    return "tool behaviour or an earlier call's write differs from the recording"


@dataclass
class ReplayReport:
    calls: int = 0
    matched: int = 0
    trajectories: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def match_rate(self) -> float:
        return self.matched / self.calls if self.calls else 0.0


def replay_messages(
    messages: list[dict[str, Any]], trajectory: str = "", database: AirlineDatabase | None = None
) -> ReplayReport:
    """Replay one chat's tool calls on a fresh state and compare each output with the recorded one."""
    report = ReplayReport(trajectories=1)
    database = database or bundled_database()
    state = State(database)
    for index, message in enumerate(messages):
        # The replies are the tool messages right after the turn (ids can repeat across turns).
        recorded = {}
        for reply in messages[index + 1 :]:
            if reply.get("role") != "tool":
                break
            recorded.setdefault(reply.get("tool_call_id"), reply.get("content"))
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            name = function.get("name", "")
            try:
                arguments = json.loads(function.get("arguments") or "{}")
            except ValueError:
                arguments = function.get("arguments")
            output = call_tool(state, name, arguments)
            if call.get("id") not in recorded:
                continue
            report.calls += 1
            expected, actual = normalized(recorded[call["id"]]), normalized(output)
            if expected == actual:
                report.matched += 1
            else:
                difference = _first_difference(expected, actual)
                report.mismatches.append(
                    Mismatch(
                        trajectory,
                        index,
                        name,
                        arguments,
                        difference,
                        _cause(database, name, arguments, output),
                    )
                )
    return report


def replay_trajectories(
    path: str | Path = DEFAULT_TRAJECTORIES, successful_only: bool = True
) -> ReplayReport:
    """Replay every (successful) trajectory of a tau-bench airline trajectory file."""
    total = ReplayReport()
    for episode in json.loads(Path(path).read_text(encoding="utf-8")):
        if successful_only and episode.get("reward") != 1.0:
            continue
        name = f"task{episode.get('task_id')}-trial{episode.get('trial')}"
        report = replay_messages(episode["traj"], name)
        total.calls += report.calls
        total.matched += report.matched
        total.trajectories += 1
        total.mismatches += report.mismatches
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trajectories", nargs="?", default=str(DEFAULT_TRAJECTORIES))
    parser.add_argument("--all", action="store_true", help="replay failed trajectories too")
    args = parser.parse_args(argv)
    report = replay_trajectories(args.trajectories, successful_only=not args.all)
    print(
        f"{report.trajectories} trajectories, {report.calls} tool calls, {report.matched} identical "
        f"after JSON normalization: match rate {report.match_rate:.1%}"
    )
    for mismatch in report.mismatches:
        print(f"  MISMATCH {mismatch}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
