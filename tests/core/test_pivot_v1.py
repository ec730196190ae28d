"""NVIDIA's Pivot-v1 rows (all four sets, parquet and JSONL) read into pivots, filtered by their
recorded pass rates, and exported as a Hugging Face dataset that reads back exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pivot_envs.cli import main
from pivot_envs.extract import filter_pivots
from pivot_envs.formats.nemotron_pivot_v1 import (
    detect_set,
    extract_pivot_v1,
    iter_pivot_v1,
    pivot_v1_row_to_pivot,
)
from pivot_envs.pivot import read_pivots
from pivot_envs.trajectory import ReadReport

TOOLS = [
    {
        "type": "function",
        "name": "get_order",
        "description": "Look an order up.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
        "strict": True,
    }
]


def conversational_row(trajectory: int, passed: int, total: int = 16) -> dict:
    return {
        "trajectory_id": trajectory,
        "responses_create_params": {
            "input": [
                {"role": "system", "content": "You are a support agent."},
                {"role": "user", "content": "Where is order A1?"},
            ],
            "tools": TOOLS,
            "parallel_tool_calls": False,
        },
        "expected_action": {"type": "function_call", "name": "get_order", "arguments": '{"order_id": "A1"}'},
        "scenario": None,
        "num_unique_actions": 3,
        "meta_info": {"turn": 1, "step": 0, "assistant_depth": 0},
        "agent_ref": {"type": "responses_api_agents", "name": "tool_use_simple_agent"},
        "pass_rate": passed / total,
        "pass_rate_total": total,
        "pass_rate_passed": passed,
    }


FUNCTION_CALLING_ROW = {
    "trajectory_id": 7,
    "info": {"turn": 2, "step": 1, "depth": 1},
    "responses_create_params": {
        "input": [
            {"role": "user", "content": "Order A1?"},
            {
                "type": "function_call",
                "name": "get_order",
                "arguments": '{"order_id": "A1"}',
                "call_id": "c1",
            },
            {"type": "function_call_output", "call_id": "c1", "output": '{"status": "shipped"}'},
        ],
        "tools": TOOLS,
    },
    "expected_action": {"type": "message", "content": "Order A1 has shipped."},
    "agent_ref": {"type": "responses_api_agents", "name": "function_calling_simple_agent"},
}

SWE_ROW = {
    "trajectory_id": 7329,
    "responses_create_params": {
        "input": [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Fix the bug in /workspace/pandas/core/frame.py"},
        ],
        "tools": [
            {"type": "function", "name": "execute_bash", "parameters": {"type": "object", "properties": {}}}
        ],
    },
    "expected_action": {"type": "function_call", "name": "execute_bash", "arguments": '{"command": "ls"}'},
    "ref_message": None,
    "metadata": {"harness": "codex", "instance_id": "pandas-dev__pandas-50238"},
    "agent_ref": {
        "type": "responses_api_agents",
        "name": "single_step_tool_use_with_argument_comparison_swe",
    },
    "pass_rate": 0.375,
}

TERMINUS = json.dumps(
    {
        "analysis": "Look around.",
        "plan": "List files.",
        "commands": [{"keystrokes": "ls -la\n", "duration": 0.5}],
    }
)
TERMINAL_ROW = {
    "responses_create_params": {
        "input": [
            {"role": "user", "content": "Solve the task. Current terminal: root@modal:/app#"},
            {"role": "assistant", "content": TERMINUS},
            {"role": "user", "content": "total 0"},
        ]
    },
    "expected_answer": TERMINUS,
    "metadata": {
        "source_trajectory_uid": "traj-9",
        "task_name": "telemetry-pipeline-audit-2",
        "harness": "terminus_2",
        "tool_name": "bash_command",
    },
    "agent_ref": {"type": "responses_api_agents", "name": "terminus_judge_string_only_simple_agent"},
}


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_each_set_is_recognised_from_its_fields():
    assert detect_set(conversational_row(1, 4)) == "conversational-tool-use"
    assert detect_set(FUNCTION_CALLING_ROW) == "function-calling"
    assert detect_set(SWE_ROW) == "swe"
    assert detect_set(TERMINAL_ROW) == "terminal"
    assert detect_set({"messages": []}) is None


def test_rows_become_pivots_of_their_domain_with_recorded_profiles_and_executability():
    tool = pivot_v1_row_to_pivot(conversational_row(12, 4))
    assert (tool.domain, tool.id, tool.trajectory_id) == (
        "tool-use",
        "conversational-tool-use/12/t0",
        "conversational-tool-use/12",
    )
    assert tool.expert["tool_calls"][0]["function"]["name"] == "get_order"
    assert tool.profile.k == 16 and tool.profile.mean == 0.25 and tool.profile.var == pytest.approx(0.1875)
    assert tool.context.get("executable", True) is True

    message = pivot_v1_row_to_pivot(FUNCTION_CALLING_ROW)
    assert message.domain == "tool-use" and message.profile is None
    assert message.expert == {"role": "assistant", "content": "Order A1 has shipped."}
    assert message.messages[-1]["role"] == "tool" and message.id == "function-calling/7/t1"

    swe = pivot_v1_row_to_pivot(SWE_ROW)
    assert swe.domain == "swe" and swe.profile.k == 8 and swe.profile.mean == 0.375  # K = 8 from the card
    assert swe.context["executable"] is False and "no repository" in swe.context["not_executable_reason"]

    terminal = pivot_v1_row_to_pivot(TERMINAL_ROW)
    assert terminal.domain == "terminal" and terminal.expert == {"role": "assistant", "content": TERMINUS}
    assert terminal.trajectory_id == "terminal/traj-9" and terminal.source["turn"] == 1
    assert terminal.context["executable"] is False and terminal.profile is None


def test_an_swe_row_is_scored_unexecuted_by_the_swe_env():
    import gymnasium as gym

    import pivot_envs

    gym.register_envs(pivot_envs)
    env = gym.make("pivot/swe-v0", pivots=[pivot_v1_row_to_pivot(SWE_ROW)], verifier="name")
    try:
        env.reset(seed=0)
        *_, info = env.step(env.unwrapped.pivot.expert)
        assert info["executed"] is False and info["valid"] is True
    finally:
        env.close()


def test_malformed_rows_are_reported_with_their_row_number_and_the_rest_read(tmp_path):
    bad_rate = {**conversational_row(2, 3), "pass_rate_passed": 40}
    path = tmp_path / "rows.jsonl"
    path.write_text(
        json.dumps(conversational_row(1, 3))
        + "\n{not json\n"
        + json.dumps({"hello": 1})
        + "\n"
        + json.dumps(bad_rate)
        + "\n"
        + json.dumps({**TERMINAL_ROW, "expected_answer": ""})
        + "\n"
        + json.dumps(SWE_ROW)
        + "\n"
    )
    report = ReadReport()
    pivots = list(iter_pivot_v1(path, report))
    assert [p.domain for p in pivots] == ["tool-use", "swe"]
    assert report.records == 6 and report.skipped_total == 4
    assert [problem.split(": ")[0].rsplit(":", 1)[1] for problem in report.problems] == ["2", "3", "4", "5"]
    assert "pass_rate_passed 40 of total 16" in report.problems[2]


def test_parquet_files_as_the_hub_stores_them_read_like_jsonl(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="parquet needs pyarrow (the train extra)")
    import pyarrow.parquet as pq

    rows = [conversational_row(i, i % 5) for i in range(6)] + [FUNCTION_CALLING_ROW]
    # One struct type for every row, as the Hub's parquet conversion writes them: absent keys become null.
    table = pa.Table.from_batches([pa.RecordBatch.from_struct_array(pa.array(rows))])  # the union of all rows
    pq.write_table(table, tmp_path / "train.parquet", row_group_size=2)
    from_parquet = [p.to_dict() for p in iter_pivot_v1(tmp_path / "train.parquet")]
    from_jsonl = [p.to_dict() for p in iter_pivot_v1(_write_jsonl(tmp_path / "train.jsonl", rows))]
    for record in from_parquet + from_jsonl:
        # What parquet cannot tell apart: a key absent from a row and a key set to null.
        record["context"] = {k: v for k, v in record["context"].items() if v is not None}
        for key in ("nemo_gym_row", "responses_create_params"):
            record["context"].pop(key, None)
    assert from_parquet == from_jsonl and len(from_parquet) == 7


def test_pivotrl_extract_then_filter_selects_d_adv_from_the_recorded_pass_rates(tmp_path, capsys):
    rows = [
        conversational_row(1, 0),
        conversational_row(2, 4),
        conversational_row(3, 12),
        conversational_row(4, 16),
    ]
    rows += [SWE_ROW, TERMINAL_ROW, FUNCTION_CALLING_ROW]
    source = _write_jsonl(tmp_path / "pivot_v1.jsonl", rows)
    assert main(["extract", str(source), "--format", "pivot-v1", "--out", str(tmp_path / "cands.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "pivots: 7" in out and "executed: 5 of 7 (71.4%)" in out
    assert (
        main(
            ["filter", str(tmp_path / "cands.jsonl"), "--mode", "cand", "--out", str(tmp_path / "all.jsonl")]
        )
        == 0
    )
    profiled = [p for p in read_pivots(tmp_path / "all.jsonl") if p.profile is not None]
    (tmp_path / "profiled.jsonl").write_text("".join(json.dumps(p.to_dict()) + "\n" for p in profiled))
    assert (
        main(
            [
                "filter",
                str(tmp_path / "profiled.jsonl"),
                "--lambda-diff",
                "0.6",
                "--out",
                str(tmp_path / "adv.jsonl"),
            ]
        )
        == 0
    )
    kept = read_pivots(tmp_path / "adv.jsonl")
    # Mixed and below 0.6: 4/16 and the SWE row's 3/8; 0/16 and 16/16 have no variance, 12/16 is too easy.
    assert sorted(p.id for p in kept) == ["conversational-tool-use/2/t0", "swe/7329/t0"]
    assert [p.id for p in filter_pivots(profiled, 0.6)] == [p.id for p in kept]


def test_extract_streams_a_file_into_one_pivot_file_with_a_summary(tmp_path):
    rows = [conversational_row(i, i % 17) for i in range(50)] + [SWE_ROW, TERMINAL_ROW]
    summary = extract_pivot_v1([_write_jsonl(tmp_path / "rows.jsonl", rows)], tmp_path / "out.jsonl")
    assert summary.written == 52 and summary.profiled == 51 and summary.executable == 50
    assert summary.per_set == {"conversational-tool-use": 50, "swe": 1, "terminal": 1}
    assert len(read_pivots(tmp_path / "out.jsonl")) == 52


def test_pivots_exported_as_a_hugging_face_dataset_load_back_losslessly(tmp_path):
    pytest.importorskip("pyarrow", reason="the dataset export writes parquet (the train extra)")
    datasets = pytest.importorskip("datasets", reason="reading back needs datasets (the train extra)")
    from pivot_envs.hf_dataset import pivots_from_rows, write_hf_dataset

    rows = [conversational_row(i, i % 17) for i in range(30)] + [FUNCTION_CALLING_ROW, SWE_ROW, TERMINAL_ROW]
    pivots = list(iter_pivot_v1(_write_jsonl(tmp_path / "rows.jsonl", rows)))
    assert write_hf_dataset(pivots, tmp_path / "ds", source="NVIDIA's Pivot-v1 sets (CC-BY-4.0)") == 33
    card = (tmp_path / "ds" / "README.md").read_text()
    assert card.startswith("---\nconfigs:") and "num_examples: 33" in card and "CC-BY-4.0" in card
    loaded = datasets.load_dataset(
        "parquet",
        data_files=str(tmp_path / "ds" / "data" / "*.parquet"),
        split="train",
        cache_dir=str(tmp_path / "cache"),
    )
    assert [p.to_dict() for p in pivots_from_rows(loaded)] == [p.to_dict() for p in pivots]
    assert loaded[0]["profile_mean"] == 0.0 and loaded[32]["domain"] == "terminal"
    by_card = datasets.load_dataset(str(tmp_path / "ds"), split="train", cache_dir=str(tmp_path / "cache2"))
    assert by_card.num_rows == 33


def test_pivotrl_export_writes_a_dataset_folder_and_refuses_a_full_one(tmp_path, capsys):
    pytest.importorskip("pyarrow", reason="the dataset export writes parquet (the train extra)")
    source = _write_jsonl(tmp_path / "rows.jsonl", [conversational_row(1, 3), SWE_ROW])
    assert main(["extract", str(source), "--format", "pivot-v1", "--out", str(tmp_path / "p.jsonl")]) == 0
    assert main(["export", str(tmp_path / "p.jsonl"), "--format", "hf", "--out", str(tmp_path / "ds")]) == 0
    assert (tmp_path / "ds" / "data" / "train-00000-of-00001.parquet").is_file()
    assert main(["export", str(tmp_path / "p.jsonl"), "--format", "hf", "--out", str(tmp_path / "ds")]) != 0
    assert "not empty" in capsys.readouterr().err


def test_pivotrl_extract_without_a_format_reads_pivot_v1_rows_as_the_pivot_v1_reader_does(tmp_path):
    rows = [conversational_row(i, i % 17) for i in range(5)] + [SWE_ROW, TERMINAL_ROW, FUNCTION_CALLING_ROW]
    source = _write_jsonl(tmp_path / "rows.jsonl", rows)
    assert main(["extract", str(source), "--out", str(tmp_path / "auto.jsonl")]) == 0
    assert main(["extract", str(source), "--format", "pivot-v1", "--out", str(tmp_path / "v1.jsonl")]) == 0
    auto, v1 = read_pivots(tmp_path / "auto.jsonl"), read_pivots(tmp_path / "v1.jsonl")
    assert [p.to_dict() for p in auto] == [p.to_dict() for p in v1] and len(auto) == 8
    terminal = next(p for p in auto if p.domain == "terminal")  # not misread as a rollout
    assert (
        terminal.expert == {"role": "assistant", "content": TERMINUS}
        and terminal.context["executable"] is False
    )


def test_the_generic_reader_streams_a_pivot_v1_parquet_file_and_tells_plain_nemo_gym_rows_apart(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="parquet needs pyarrow (the train extra)")
    import pyarrow.parquet as pq

    from pivot_envs.formats.read import read_as_pivots
    from pivot_envs.formats.records import record_kind

    rows = [conversational_row(i, i % 5) for i in range(4)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    report = ReadReport()
    pivots = read_as_pivots(tmp_path / "train.parquet", report=report)
    assert [p.profile.mean for p in pivots] == [0.0, 1 / 16, 2 / 16, 3 / 16] and report.pivots == 4
    assert report.formats[str(tmp_path / "train.parquet")] == "pivot-v1"
    assert record_kind(TERMINAL_ROW) == "pivot-v1" and record_kind(SWE_ROW) == "pivot-v1"
    plain = {k: SWE_ROW[k] for k in ("responses_create_params", "expected_action")}
    assert record_kind(plain) == "nemo-gym-pivots"
    assert record_kind({**plain, "info": {"note": 1}}) == "nemo-gym-pivots"  # not function-calling's info
