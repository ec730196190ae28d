"""Pivot candidates (D_cand): one per assistant turn, with the right prefix, expert, ids and source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pivot_envs.extract
from pivot_envs.extract import ExtractConfig, extract_pivots, infer_tool_schemas
from pivot_envs.formats import read_trajectories
from pivot_envs.pivot import write_pivots
from pivot_envs.trajectory import ReadReport, Trajectory

TAU = "tau_bench/airline/gpt4o_trajectories.json"


@pytest.fixture(scope="module")
def tau(shared_data: Path) -> tuple[list[dict], list[Trajectory]]:
    path = shared_data / TAU
    return json.loads(path.read_text()), list(read_trajectories(path))


def test_tau_bench_candidates_equal_the_assistant_turns_counted_in_the_raw_file(tau) -> None:
    raw, trajectories = tau
    assistant_turns = sum(
        1 for episode in raw for message in episode["traj"] if message["role"] == "assistant"
    )
    report = ReadReport()
    pivots = list(extract_pivots(trajectories, ExtractConfig(domain="tool-use"), report))
    assert len(pivots) == assistant_turns == report.pivots == 1229
    assert not report.filtered
    assert len({p.id for p in pivots}) == len(pivots)
    assert all(p.domain == "tool-use" for p in pivots)


def test_each_candidate_is_the_prefix_before_an_assistant_turn_and_that_turn(tau) -> None:
    raw, trajectories = tau
    pivots = list(extract_pivots(trajectories[:1]))
    episode = raw[0]["traj"]
    positions = [i for i, m in enumerate(episode) if m["role"] == "assistant"]
    assert [p.id for p in pivots] == [
        f"tau-airline/task{raw[0]['task_id']}/trial0/t{k}" for k in range(len(positions))
    ]
    for turn, (pivot, position) in enumerate(zip(pivots, positions)):
        assert len(pivot.messages) == position
        assert [m["role"] for m in pivot.messages] == [m["role"] for m in episode[:position]]
        expected = episode[position]
        assert pivot.expert["content"] == expected.get("content")
        assert pivot.expert.get("tool_calls", []) == expected.get("tool_calls", [])
        assert pivot.source == {
            "trajectory": trajectories[0].id,
            "turn": turn,
            "reward": raw[0]["reward"],
            "format": "openai-chat",
        }
        assert pivot.context["task_id"] == raw[0]["task_id"]


def test_message_turns_off_keeps_only_tool_call_turns_with_unchanged_ids(tau) -> None:
    raw, trajectories = tau
    raw, trajectories = raw[:20], trajectories[:20]
    all_ids = {p.id for p in extract_pivots(trajectories)}
    report = ReadReport()
    pivots = list(extract_pivots(trajectories, ExtractConfig(message_turns=False), report))
    turns = [m for e in raw for m in e["traj"] if m["role"] == "assistant"]
    with_calls = sum(1 for m in turns if m.get("tool_calls"))
    assert 0 < len(pivots) == with_calls < len(turns)
    assert all(p.expert["tool_calls"] for p in pivots)
    assert {p.id for p in pivots} < all_ids  # ids count every assistant turn, whatever is kept
    assert report.filtered == {"message turn (message_turns is off)": len(turns) - with_calls}


def test_min_source_reward_keeps_only_successful_episodes(tau) -> None:
    raw, trajectories = tau
    pivots = list(extract_pivots(trajectories, ExtractConfig(min_source_reward=1.0)))
    expected = sum(1 for e in raw if e["reward"] >= 1.0 for m in e["traj"] if m["role"] == "assistant")
    assert 0 < len(pivots) == expected < 1229
    assert all(p.source["reward"] == 1.0 for p in pivots)


def _trajectory(reward: float | None, calls: int = 1, tools: list | None = None) -> Trajectory:
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"c{i}",
                "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"key": i})},
            }
            for i in range(calls)
        ],
    }
    return Trajectory(
        id=f"t-{reward}-{calls}",
        messages=[
            {"role": "user", "content": "look up"},
            assistant,
            *[{"role": "tool", "tool_call_id": f"c{i}", "content": "ok"} for i in range(calls)],
            {"role": "assistant", "content": "done"},
        ],
        tools=tools or [],
        reward=reward,
    )


def test_unrewarded_trajectories_are_kept_by_default_and_dropped_on_request() -> None:
    trajectories = [_trajectory(None), _trajectory(0.0), _trajectory(1.0)]
    kept = list(extract_pivots(trajectories, ExtractConfig(min_source_reward=0.5)))
    assert sorted({p.trajectory_id for p in kept}) == ["t-1.0-1", "t-None-1"]
    report = ReadReport()
    strict = list(
        extract_pivots(trajectories, ExtractConfig(min_source_reward=0.5, keep_unrewarded=False), report)
    )
    assert {p.trajectory_id for p in strict} == {"t-1.0-1"}
    assert report.filtered == {
        "trajectory without a source reward": 2,
        "source reward below min_source_reward": 2,
    }


def test_multi_call_turns_off_drops_parallel_call_turns() -> None:
    trajectories = [_trajectory(1.0, calls=3)]
    assert [len(p.expert.get("tool_calls") or []) for p in extract_pivots(trajectories)] == [3, 0]
    kept = list(extract_pivots(trajectories, ExtractConfig(multi_call_turns=False)))
    assert [p.id for p in kept] == ["t-1.0-3/t1"]


def test_empty_assistant_turns_are_counted_not_extracted() -> None:
    trajectory = Trajectory(
        "e",
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "  "},
            {"role": "user", "content": "?"},
            {"role": "assistant", "content": "yes"},
        ],
        [],
    )
    report = ReadReport()
    assert [p.id for p in extract_pivots([trajectory], report=report)] == ["e/t1"]
    assert report.filtered == {"empty assistant turn (no text, no tool call)": 1}


def test_tool_schemas_are_inferred_from_calls_when_the_source_has_none(tau) -> None:
    raw, trajectories = tau
    names = {
        c["function"]["name"]
        for e in raw
        for m in e["traj"]
        if m["role"] == "assistant"
        for c in m.get("tool_calls") or []
    }
    pivot = next(extract_pivots(trajectories[:1] + trajectories[1:]))
    assert {t["function"]["name"] for t in pivot.tools} == names and pivot.context["tools_inferred"] is True
    schema = next(
        t["function"]["parameters"] for t in pivot.tools if t["function"]["name"] == "get_user_details"
    )
    assert schema == {
        "type": "object",
        "properties": {"user_id": {"type": "string"}},
        "required": ["user_id"],
    }
    assert next(extract_pivots(trajectories, ExtractConfig(infer_tools=False))).tools == []


def test_inferred_schemas_mark_arguments_missing_from_some_calls_optional() -> None:
    def call(args):
        return {"id": "c", "type": "function", "function": {"name": "f", "arguments": json.dumps(args)}}

    trajectory = Trajectory(
        "x",
        [{"role": "assistant", "content": None, "tool_calls": [call({"a": 1, "b": "s"}), call({"a": 2.5})]}],
        [],
    )
    (tool,) = infer_tool_schemas([trajectory])
    assert tool["function"]["parameters"] == {
        "type": "object",
        "properties": {"a": {"type": ["integer", "number"]}, "b": {"type": "string"}},
        "required": ["a"],
    }


def test_trajectories_with_their_own_tools_keep_them() -> None:
    tools = [
        {
            "type": "function",
            "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    pivots = list(extract_pivots([_trajectory(1.0, tools=tools)]))
    assert all(p.tools == tools and "tools_inferred" not in p.context for p in pivots)


# Every public name `pivot_envs.extract` offered before reading, extraction and writing were pulled
# apart (the CLI and users import these from it).
EXTRACT_NAMES_BEFORE_THE_SPLIT = (
    "DEDUP_RULES",
    "FILTER_MODES",
    "ExtractConfig",
    "FilterConfig",
    "ReadReport",
    "SplitConfig",
    "Trajectory",
    "dedup_pivots",
    "extract_pivots",
    "filter_pivots",
    "heldout_side",
    "infer_tool_schemas",
    "normalized_action",
    "reward_rejection",
    "split_by_trajectory",
    "turn_rejection",
    "write_pivot_file",
)


def test_every_name_the_extract_module_offered_is_still_importable_from_it() -> None:
    assert [name for name in EXTRACT_NAMES_BEFORE_THE_SPLIT if not hasattr(pivot_envs.extract, name)] == []
    # one pivot writer: the CLI's name for it is the same function, not a second writer
    assert pivot_envs.extract.write_pivot_file is write_pivots
    assert pivot_envs.extract.Trajectory is Trajectory and pivot_envs.extract.ReadReport is ReadReport
