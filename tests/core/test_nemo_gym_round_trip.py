"""NeMo-Gym pivot rows (NVIDIA's public pivot sets' format) read into pivots and written back exactly."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pivot_envs.cli import main
from pivot_envs.formats import detect_format, nemo_gym_row_to_pivot, pivot_to_nemo_gym_row, read_as_pivots
from pivot_envs.formats.nemo_gym_pivots import ROW_KEY
from pivot_envs.pivot import Profile, read_pivots, write_pivots


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _pivot_files(shared_data: Path) -> list[Path]:
    """Every NeMo-Gym file in the shared data whose rows are pivots (each row one pivot)."""
    return [
        path
        for path in sorted((shared_data / "nemo_gym").glob("*.jsonl"))
        if detect_format(path) == "nemo-gym-pivots"
    ]


# A row with what NVIDIA's sets and NeMo-Gym's own rows carry besides the basics: both id fields,
# unknown top-level fields, null request parameters, items with ids, status and content parts, a
# reasoning item, a tool reply, a tool schema with an extra key, an expected action with a call id.
RICH_ROW = {
    "uuid": "rich-1",
    "id": 17,
    "agent_ref": {"type": "responses_api_agents", "name": "pivot_agent"},
    "metadata": {"category": "lookup", "nested": [1, None, {"a": "b"}]},
    "pivot_tags": ["P1"],
    "reward": 1.0,
    "responses_create_params": {
        "background": None,
        "include": None,
        "temperature": 0.0,
        "input": [
            {"role": "system", "content": "Answer with a tool call."},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Weather in Oslo?"}],
            },
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "look it up"}]},
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "c1",
                "name": "get_weather",
                "arguments": '{"city": "Oslo"}',
                "status": "completed",
            },
            {"type": "function_call_output", "call_id": "c1", "output": "rain"},
            {"type": "message", "role": "user", "content": "And in Rome?"},
        ],
        "tools": [
            {
                "type": "function",
                "name": "get_weather",
                "parameters": {"type": "object"},
                "strict": True,
                "x-owner": "ops",
            }
        ],
    },
    "expected_action": {
        "type": "function_call",
        "name": "get_weather",
        "arguments": '{"city": "Rome"}',
        "call_id": "c2",
    },
}


def test_every_pivot_row_of_the_shared_nemo_gym_files_is_written_back_exactly(shared_data: Path) -> None:
    files = _pivot_files(shared_data)
    names = {path.name for path in files}
    assert {
        "single_step_tool_use_pivots.jsonl",
        "single_step_tool_use_parallel_pivots.jsonl",
        "swe_pivots.jsonl",
    } <= names
    checked = 0
    for path in files:
        rows = _rows(path)
        pivots = read_as_pivots(path, domain="tool-use")
        assert len(pivots) == len(rows), path.name
        for row, pivot in zip(rows, pivots):
            assert pivot_to_nemo_gym_row(pivot) == row, f"{path.name}: {pivot.id}"
            checked += 1
    assert checked == 15


def test_the_exact_round_trip_survives_a_pivot_file_in_between(shared_data: Path, tmp_path: Path) -> None:
    for path in _pivot_files(shared_data):
        stored = tmp_path / f"{path.stem}.pivots.jsonl"
        write_pivots(read_as_pivots(path, domain="swe"), stored)
        assert [pivot_to_nemo_gym_row(pivot) for pivot in read_pivots(stored)] == _rows(path), path.name


def test_pivotrl_export_writes_nvidia_rows_back_as_they_were(shared_data: Path, tmp_path: Path) -> None:
    source, out = shared_data / "nemo_gym" / "swe_pivots.jsonl", tmp_path / "rows.jsonl"
    assert main(["export", str(source), "--format", "nemo-gym", "--out", str(out)]) == 0
    assert _rows(out) == _rows(source)


def test_a_row_with_ids_extras_nulls_and_item_details_round_trips_exactly() -> None:
    pivot = nemo_gym_row_to_pivot(RICH_ROW)
    assert pivot.id == "rich-1"
    assert pivot.context["id"] == 17 and pivot.context["pivot_tags"] == ["P1"]
    assert pivot.context["responses_create_params"] == {
        "background": None,
        "include": None,
        "temperature": 0.0,
    }
    assert pivot.expert["tool_calls"][0]["function"]["arguments"] == '{"city": "Rome"}'
    assert [m["role"] for m in pivot.messages] == ["system", "user", "assistant", "tool", "user"]
    assert pivot_to_nemo_gym_row(pivot) == RICH_ROW
    assert json.loads(json.dumps(pivot.to_dict())) == pivot.to_dict()  # what is kept is plain JSON


def test_a_row_field_named_like_the_kept_part_survives_the_round_trip() -> None:
    row = {**RICH_ROW, ROW_KEY: {"owner": "nvidia"}}
    pivot = nemo_gym_row_to_pivot(row)
    assert pivot.context[ROW_KEY]["field"] == {"owner": "nvidia"}
    assert pivot_to_nemo_gym_row(pivot) == row


def test_an_edited_pivot_is_written_from_its_fields_not_from_the_row_it_was_read_from() -> None:
    pivot = nemo_gym_row_to_pivot(RICH_ROW)
    messages = [*pivot.messages[:-1], {"role": "user", "content": "And in Madrid?"}]
    expert = {
        **pivot.expert,
        "tool_calls": [
            {
                **pivot.expert["tool_calls"][0],
                "function": {"name": "get_weather", "arguments": '{"city": "Madrid"}'},
            }
        ],
    }
    edited = dataclasses.replace(
        pivot, messages=messages, expert=expert, profile=Profile.from_samples([1.0, 0.0])
    )
    row = pivot_to_nemo_gym_row(edited)
    assert row["responses_create_params"]["input"][-1] == {
        "type": "message",
        "role": "user",
        "content": "And in Madrid?",
    }
    assert row["expected_action"] == {
        "type": "function_call",
        "name": "get_weather",
        "arguments": '{"city": "Madrid"}',
    }
    # The tools were not edited: they are still written as the row gave them.
    assert row["responses_create_params"]["tools"] == RICH_ROW["responses_create_params"]["tools"]
    back = nemo_gym_row_to_pivot(row)
    assert (back.messages, back.expert, back.profile) == (edited.messages, edited.expert, edited.profile)


def test_a_pivot_of_this_library_gains_nothing_to_carry_when_its_row_is_read_back() -> None:
    ours = dataclasses.replace(nemo_gym_row_to_pivot(RICH_ROW), context={"task": "t1"}, domain="tool-use")
    row = pivot_to_nemo_gym_row(ours)
    assert row["uuid"] == "rich-1" and row["pivot_envs"]["domain"] == "tool-use"
    back = nemo_gym_row_to_pivot(row)
    assert ROW_KEY not in back.context
    assert back.to_dict() == ours.to_dict()
