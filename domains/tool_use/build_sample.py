"""Build the tool-use domain's package data from the tau-bench airline files.

    python -m pivot_envs.domains.tool_use.build_sample [--source DIR]

Writes, under `domains/tool_use/data/`:
- `airline/{flights,users,reservations}.json.gz`: the airline database (MIT, tau-bench). One
  change: user addresses name their region `province`, as in the database revision the
  trajectories were recorded against (the current files call it `state`), so replayed outputs
  match the conversation prefixes;
- `airline_pivots.jsonl.gz`: one pivot per assistant turn of every successful (reward 1.0)
  trajectory, with the airline tool schemas, `context={"backend": "tau-airline",
  "expert_tool_outputs": [...]}`.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from typing import Any

from pivot_envs.pivot import Pivot, write_pivots

DATA = Path(__file__).resolve().parent / "data"
DEFAULT_SOURCE = Path(__file__).resolve().parents[3] / "shared" / "data" / "tau_bench" / "airline"
PIVOTS_FILE = "airline_pivots.jsonl.gz"


def _rename_state_to_province(users: dict[str, Any]) -> dict[str, Any]:
    for user in users.values():
        address = user.get("address")
        if isinstance(address, dict) and "state" in address:
            user["address"] = {("province" if k == "state" else k): v for k, v in address.items()}
    return users


def copy_database(source: Path, target: Path) -> None:
    """Copy the three database tables, gzipped (with the `province` rename in users)."""
    target.mkdir(parents=True, exist_ok=True)
    for table in ("flights", "users", "reservations"):
        data = json.loads((source / f"{table}.json").read_text(encoding="utf-8"))
        if table == "users":
            data = _rename_state_to_province(data)
        # mtime=0 keeps the gzip bytes reproducible between builds.
        with gzip.GzipFile(target / f"{table}.json.gz", "wb", compresslevel=9, mtime=0) as handle:
            handle.write(json.dumps(data, separators=(",", ":")).encode("utf-8"))


def expert_tool_outputs(messages: list[dict[str, Any]], turn_index: int) -> list[str | None]:
    """The recorded outputs of the tool calls of messages[turn_index], aligned with its calls."""
    calls = messages[turn_index].get("tool_calls") or []
    replies = {}
    for message in messages[turn_index + 1 :]:
        if message.get("role") != "tool":
            break
        replies[message.get("tool_call_id")] = message.get("content")
    return [replies.get(call.get("id")) for call in calls]


def build_pivots(source: Path) -> list[Pivot]:
    """Pivots of the successful trajectories, with our airline tool schemas and recorded outputs."""
    from pivot_envs.domains.tool_use.airline import tool_schemas
    from pivot_envs.extract import ExtractConfig, extract_pivots
    from pivot_envs.formats import read_trajectories

    trajectories = [t for t in read_trajectories(source / "gpt4o_trajectories.json") if t.reward == 1.0]
    pivots = []
    for trajectory in trajectories:
        trajectory.tools = tool_schemas()
        trajectory.context = {"backend": "tau-airline"}
        for pivot in extract_pivots([trajectory], ExtractConfig(domain="tool-use")):
            full = trajectory.messages
            turn = len(pivot.messages)
            if pivot.expert.get("tool_calls"):
                pivot.context["expert_tool_outputs"] = expert_tool_outputs(full, turn)
            pivots.append(pivot)
    return pivots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Build the tool-use package data from tau-bench airline files."
    )
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="tau-bench airline data folder")
    parser.add_argument("--database-only", action="store_true", help="copy the database, build no pivots")
    args = parser.parse_args(argv)
    copy_database(args.source, DATA / "airline")
    print(f"database -> {DATA / 'airline'}")
    if not args.database_only:
        pivots = build_pivots(args.source)
        count = write_pivots(pivots, DATA / "airline_pivots.jsonl")
        raw = (DATA / "airline_pivots.jsonl").read_bytes()
        with gzip.GzipFile(DATA / PIVOTS_FILE, "wb", compresslevel=9, mtime=0) as handle:
            handle.write(raw)
        (DATA / "airline_pivots.jsonl").unlink()
        print(f"{count} pivots -> {DATA / PIVOTS_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
