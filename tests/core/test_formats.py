"""Trajectory formats: every real sample file reads cleanly, round trips keep what matters, bad input is reported."""

from __future__ import annotations

import gzip
import json
import shutil
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pivot_envs.formats
from pivot_envs.errors import PivotEnvsError
from pivot_envs.formats import (
    FormatError,
    MalformedRecord,
    ReadReport,
    detect_format,
    nemo_gym_row_to_pivot,
    normalize_messages,
    pivot_to_nemo_gym_row,
    read_as_pivots,
    read_trajectories,
    responses_to_messages,
    write_nemo_gym_rows,
)
from pivot_envs.pivot import Pivot, write_pivots

NEMO_FILES = {
    "single_step_tool_use_pivots.jsonl": "nemo-gym-pivots",
    "single_step_tool_use_parallel_pivots.jsonl": "nemo-gym-pivots",
    "swe_pivots.jsonl": "nemo-gym-pivots",
    "terminal_bench_rollouts.jsonl": "nemo-gym-rollouts",
    "swe_bash_rollouts.jsonl": "nemo-gym-rollouts",
    "browsecomp_tasks.jsonl": "nemo-gym-rollouts",
}
TAU = "tau_bench/airline/gpt4o_trajectories.json"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_shared_nemo_gym_folder_holds_only_files_this_test_knows(shared_data: Path) -> None:
    # A new sample file must be added to NEMO_FILES, so that it is read below too.
    assert {p.name for p in (shared_data / "nemo_gym").glob("*.jsonl")} == set(NEMO_FILES)


@pytest.mark.parametrize("name", sorted(NEMO_FILES))
def test_every_nemo_gym_file_reads_with_zero_skips(shared_data: Path, name: str) -> None:
    path = shared_data / "nemo_gym" / name
    assert detect_format(path) == NEMO_FILES[name]
    report = ReadReport()
    trajectories = list(read_trajectories(path, report))
    assert report.skipped_total == 0 and report.problems == []
    assert len(trajectories) == report.records == len(_rows(path)) > 0
    pivot_report = ReadReport()
    pivots = read_as_pivots(path, domain="d", report=pivot_report)
    assert pivot_report.skipped_total == 0 and not pivot_report.filtered
    if name == "browsecomp_tasks.jsonl":
        # Task prompts: a question and tool schemas, no expert turn -> read, counted, no candidates.
        assert pivots == [] and pivot_report.no_assistant == pivot_report.trajectories == 5
        assert all(t.tools and t.context["ground_truth"] for t in trajectories)
    else:
        assert len(pivots) == pivot_report.pivots > 0 and pivot_report.no_assistant == 0
        assert all(p.domain == "d" for p in pivots)
    assert len({p.id for p in pivots}) == len(pivots)


def test_tau_bench_file_reads_with_zero_skips_and_stable_ids(shared_data: Path) -> None:
    path = shared_data / TAU
    assert detect_format(path) == "openai-chat"
    report = ReadReport()
    trajectories = list(read_trajectories(path, report))
    raw = json.loads(path.read_text())
    assert report.skipped_total == 0 and len(trajectories) == len(raw) == 100
    assert trajectories[0].id == f"tau-airline/task{raw[0]['task_id']}/trial{raw[0]['trial']}"
    assert len({t.id for t in trajectories}) == 100
    assert [t.reward for t in trajectories] == [float(e["reward"]) for e in raw]
    assert trajectories[0].context["info"] == raw[0]["info"]


def test_format_is_detected_by_content_not_by_file_name(shared_data: Path, tmp_path: Path) -> None:
    disguised = tmp_path / "rollouts.json"
    shutil.copy(shared_data / "nemo_gym" / "swe_pivots.jsonl", disguised)
    assert detect_format(disguised) == "nemo-gym-pivots"
    zipped = tmp_path / "episodes.txt"  # gzip recognised by its magic bytes
    zipped.write_bytes(gzip.compress((shared_data / TAU).read_bytes()))
    assert detect_format(zipped) == "openai-chat"
    assert len(list(read_trajectories(zipped))) == 100


def test_unknown_content_is_a_clear_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "odd.jsonl"
    path.write_text('{"question": "q", "answer": "a"}\n')
    with pytest.raises(ValueError, match="odd.jsonl: cannot detect"):
        detect_format(path)
    report = ReadReport()
    assert list(read_trajectories(path, report)) == []
    assert report.skipped["unrecognized record"] == 1 and report.problems[0].startswith(f"{path}:1: ")


def test_format_errors_are_value_errors_of_the_library_family(tmp_path: Path) -> None:
    path = tmp_path / "odd.jsonl"
    path.write_text('{"question": "q"}\n')
    with pytest.raises(FormatError, match="odd.jsonl") as caught:
        detect_format(path)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, PivotEnvsError)
    with pytest.raises(MalformedRecord, match="message 1: role 'wizard'") as bad:
        normalize_messages([{"role": "user", "content": "q"}, {"role": "wizard", "content": "x"}])
    assert bad.value.reason == "unknown role" and isinstance(bad.value, ValueError)


# Every public name `pivot_envs.formats` offered as one module, before it became a package.
FORMATS_NAMES_BEFORE_THE_PACKAGE = (
    "FORMATS",
    "ROLES",
    "ReadReport",
    "Trajectory",
    "detect_format",
    "messages_to_responses",
    "nemo_gym_row_to_pivot",
    "normalize_messages",
    "pivot_to_nemo_gym_row",
    "read_as_pivots",
    "read_trajectories",
    "responses_to_messages",
    "write_nemo_gym_rows",
)


def test_every_name_the_formats_module_offered_is_still_importable_from_it() -> None:
    missing = [name for name in FORMATS_NAMES_BEFORE_THE_PACKAGE if not hasattr(pivot_envs.formats, name)]
    assert missing == []
    assert set(FORMATS_NAMES_BEFORE_THE_PACKAGE) <= set(pivot_envs.formats.__all__)
    assert pivot_envs.formats.FORMATS == (
        "openai-chat",
        "nemo-gym-pivots",
        "nemo-gym-rollouts",
        "sharegpt",
        "pivots",
    )


@pytest.mark.parametrize(
    "name", ["single_step_tool_use_pivots.jsonl", "single_step_tool_use_parallel_pivots.jsonl"]
)
def test_nemo_gym_pivot_rows_round_trip_keeps_prefix_tools_and_expected_action(
    shared_data: Path, name: str
) -> None:
    path = shared_data / "nemo_gym" / name
    rows = _rows(path)
    pivots = read_as_pivots(path)
    assert len(pivots) == len(rows)
    for row, pivot in zip(rows, pivots):
        again = pivot_to_nemo_gym_row(pivot)
        json.dumps(again)  # a row is plain JSON
        assert again["expected_action"] == row["expected_action"]
        assert again["responses_create_params"]["tools"] == row["responses_create_params"]["tools"]
        assert _essential(again["responses_create_params"]["input"]) == _essential(
            row["responses_create_params"]["input"]
        )
        for key in ("tool_choice", "parallel_tool_calls"):
            assert again["responses_create_params"][key] == row["responses_create_params"][key]
        back = nemo_gym_row_to_pivot(again, default_id=pivot.id)
        assert back.to_dict() == pivot.to_dict()


def test_nemo_gym_rows_written_to_a_file_are_the_rows_read_and_read_back_as_the_same_pivots(
    shared_data: Path, tmp_path: Path
) -> None:
    source = shared_data / "nemo_gym" / "single_step_tool_use_parallel_pivots.jsonl"
    pivots = read_as_pivots(source, domain="tool-use")
    path = tmp_path / "out" / "rows.jsonl"
    assert write_nemo_gym_rows(iter(pivots), path) == len(pivots) > 0
    assert _rows(path) == _rows(source)
    assert detect_format(path) == "nemo-gym-pivots"
    # The rows carry no ids or domain (NeMo-Gym's own carry none): the reader supplies the same ones.
    again = read_as_pivots(path, domain="tool-use", id_prefix=source.stem)
    assert [p.to_dict() for p in again] == [p.to_dict() for p in pivots]


def _essential(items: list[dict]) -> list[tuple]:
    """What an input item means, without ids, status or encrypted reasoning."""
    out = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            content = item["content"]
            text = content if isinstance(content, str) else "".join(p["text"] for p in content)
            out.append((kind, item["role"], text))
        elif kind == "reasoning":
            out.append((kind, "".join(p["text"] for p in item["summary"])))
        elif kind == "function_call":
            out.append((kind, item["name"], item["arguments"], item["call_id"]))
        else:
            out.append((kind, item["call_id"], item["output"]))
    return out


def test_reasoning_goes_to_the_following_assistant_message_and_calls_keep_their_ids(
    shared_data: Path,
) -> None:
    row = _rows(shared_data / "nemo_gym" / "single_step_tool_use_pivots.jsonl")[2]
    items = row["responses_create_params"]["input"]
    messages = responses_to_messages(items)
    first_reasoning = next(i for i in items if i["type"] == "reasoning")
    first_call = next(i for i in items if i["type"] == "function_call")
    assistant = next(m for m in messages if m["role"] == "assistant")
    assert assistant["reasoning_content"] == first_reasoning["summary"][0]["text"]
    assert assistant["tool_calls"][0]["id"] == first_call["call_id"]
    assert assistant["tool_calls"][0]["function"] == {
        "name": first_call["name"],
        "arguments": first_call["arguments"],
    }
    reply = messages[messages.index(assistant) + 1]
    assert reply == {"role": "tool", "content": '{"returns": true}', "tool_call_id": first_call["call_id"]}


def test_parallel_expected_action_becomes_one_assistant_message_with_all_calls(shared_data: Path) -> None:
    pivot = read_as_pivots(shared_data / "nemo_gym" / "single_step_tool_use_parallel_pivots.jsonl")[0]
    cities = [json.loads(c["function"]["arguments"])["city"] for c in pivot.expert["tool_calls"]]
    assert cities == ["Paris", "Tokyo", "Cairo"] and pivot.expert["content"] is None
    assert pivot.tools[0]["function"]["name"] == "get_weather"


def test_terminal_rollouts_keep_commands_as_tool_calls_reward_and_task_metadata(shared_data: Path) -> None:
    path = shared_data / "nemo_gym" / "terminal_bench_rollouts.jsonl"
    rows = _rows(path)
    for row, trajectory in zip(rows, read_trajectories(path)):
        output = row["response"]["output"]
        calls = [i for i in output if i["type"] == "function_call"]
        assert trajectory.reward == row["reward"]
        assert trajectory.context["task_name"] == row["responses_create_params"]["metadata"]["task_name"]
        assert trajectory.context["docker_image"].startswith("alexgshaw/")
        # The agent's commands are function calls (terminal, read_file, ...), kept call by call.
        made = [c for m in trajectory.messages for c in m.get("tool_calls") or []]
        assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in made] == [
            (c["call_id"], c["name"], c["arguments"]) for c in calls
        ]
        assert trajectory.assistant_turns == sum(1 for i in output if i["type"] == "message")
        call_ids = {c["id"] for c in made}
        assert all(m["tool_call_id"] in call_ids for m in trajectory.messages if m["role"] == "tool")
    first = next(read_trajectories(path))
    assert first.id == "terminal_bench::modernize-scientific-stack/rollout0"
    assert json.loads(first.messages[-2]["content"])  # the last tool reply, verbatim JSON


def test_sharegpt_conversations_map_to_chat_with_linked_tool_replies(tmp_path: Path) -> None:
    tools = [
        {
            "name": "get_order",
            "description": "Look up an order by id.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        }
    ]
    record = {
        "id": "shop-17",
        "system": "You are a shop assistant.",
        "tools": json.dumps(tools),
        "conversations": [
            {"from": "human", "value": "Where is order A12 and order B7?"},
            {
                "from": "function_call",
                "value": json.dumps(
                    [
                        {"name": "get_order", "arguments": {"order_id": "A12"}},
                        {"name": "get_order", "arguments": {"order_id": "B7"}},
                    ]
                ),
            },
            {"from": "observation", "value": '{"status": "shipped"}'},
            {"from": "observation", "value": '{"status": "packing"}'},
            {"from": "gpt", "value": "A12 has shipped; B7 is being packed."},
            {"from": "human", "value": "And order C3?"},
            {
                "from": "function_call",
                "value": '{"name": "get_order", "arguments": "{\\"order_id\\": \\"C3\\"}"}',
            },
            {"from": "observation", "value": '{"status": "delivered"}'},
            {"from": "gpt", "value": "C3 was delivered."},
        ],
    }
    path = tmp_path / "chats.data"
    path.write_text(json.dumps(record) + "\n")
    assert detect_format(path) == "sharegpt"
    (trajectory,) = read_trajectories(path)
    roles = [m["role"] for m in trajectory.messages]
    assert roles == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    parallel = trajectory.messages[2]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in parallel] == [
        {"order_id": "A12"},
        {"order_id": "B7"},
    ]
    assert [m["tool_call_id"] for m in trajectory.messages[3:5]] == [parallel[0]["id"], parallel[1]["id"]]
    assert trajectory.messages[8]["tool_call_id"] == trajectory.messages[7]["tool_calls"][0]["id"]
    assert trajectory.tools == [{"type": "function", "function": tools[0]}]
    assert trajectory.id == "shop-17"
    pivots = read_as_pivots(path)
    assert [p.id for p in pivots] == [f"shop-17/t{k}" for k in range(4)]


def test_malformed_lines_are_reported_with_line_numbers_and_skipped(tmp_path: Path) -> None:
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    nameless = {
        "messages": [
            {"role": "user", "content": "book it"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"arguments": "{}"}}],
            },
        ]
    }
    lines = [
        json.dumps(good),
        '{"messages": [{"role": "user", "content": "cut',
        "",
        json.dumps(nameless),
        json.dumps([1, 2]),
        json.dumps({"messages": "not a list"}),
        json.dumps({"messages": [{"role": "wizard", "content": "x"}]}),
        json.dumps({**good, "id": "last"}),
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(lines) + "\n")
    report = ReadReport()
    trajectories = list(read_trajectories(path, report))
    assert [t.id for t in trajectories] == ["chat/1", "last"]
    assert report.records == 7 and report.skipped_total == 5
    by_line = {p.split(": ")[0]: p for p in report.problems}
    assert set(by_line) == {f"{path}:{n}" for n in (2, 4, 5, 6, 7)}
    assert "invalid JSON" in by_line[f"{path}:2"]
    assert "tool call 0" in by_line[f"{path}:4"] and "has no name" in by_line[f"{path}:4"]
    assert "unrecognized record" in by_line[f"{path}:5"]
    assert "must be a list" in by_line[f"{path}:6"]
    assert "'wizard'" in by_line[f"{path}:7"]


def test_a_bad_element_of_a_json_list_is_reported_by_its_index(tmp_path: Path) -> None:
    episodes = [
        {
            "task_id": 0,
            "trial": 0,
            "reward": 1.0,
            "traj": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
        },
        {"task_id": 1, "trial": 0, "reward": "high", "traj": []},
    ]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(episodes, indent=1))
    report = ReadReport()
    assert [t.id for t in read_trajectories(path, report, id_prefix="tau-x")] == ["tau-x/task0/trial0"]
    assert report.problems == [f"{path}:[1]: wrong type: reward: reward must be a number, got str"]


def test_read_as_pivots_warns_about_skipped_records_when_no_report_is_given(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    good = Pivot("a/t0", "d", [{"role": "user", "content": "q"}], {"role": "assistant", "content": "r"})
    path.write_text(json.dumps(good.to_dict()) + "\n{oops\n")
    with pytest.warns(UserWarning, match=r"p.jsonl:2"):
        pivots = read_as_pivots(path)
    assert [p.to_dict() for p in pivots] == [good.to_dict()]


def test_our_pivot_files_read_back_as_is(shared_data: Path, tmp_path: Path) -> None:
    pivots = read_as_pivots(shared_data / "nemo_gym" / "swe_pivots.jsonl", domain="swe")
    path = tmp_path / "pivots.jsonl"
    write_pivots(pivots, path)
    assert detect_format(path) == "pivots"
    report = ReadReport()
    assert [p.to_dict() for p in read_as_pivots(path, report=report)] == [p.to_dict() for p in pivots]
    assert report.pivots == 5 and report.trajectories == 0


# -- fuzzing: the readers report, they never crash -------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "role",
                    "content",
                    "tool_calls",
                    "function",
                    "name",
                    "arguments",
                    "type",
                    "input",
                    "output",
                    "call_id",
                    "summary",
                    "text",
                    "from",
                    "value",
                    "calls",
                    "tools",
                    "id",
                ]
            ),
            children,
            max_size=5,
        )
    ),
    max_leaves=20,
)
_record = st.fixed_dictionaries(
    {},
    optional={
        "messages": _json,
        "traj": _json,
        "conversations": _json,
        "tools": _json,
        "reward": _json,
        "responses_create_params": st.fixed_dictionaries({}, optional={"input": _json, "tools": _json})
        | _json,
        "expected_action": _json,
        "response": st.fixed_dictionaries({}, optional={"output": _json}) | _json,
        "expert": _json,
        "id": _json,
        "task_id": _json,
    },
)
_FUZZ = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _read_everything(path: Path) -> ReadReport:
    report = ReadReport()
    list(read_trajectories(path, report))
    pivot_report = ReadReport()
    read_as_pivots(path, report=pivot_report)
    assert all(p.count(": ") >= 1 and p.startswith(str(path)) for p in report.problems)
    assert report.skipped_total == len(report.problems)
    return report


@_FUZZ
@given(records=st.lists(_record, min_size=1, max_size=4))
def test_readers_report_random_records_without_crashing(tmp_path: Path, records: list[dict]) -> None:
    path = tmp_path / "fuzz.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    report = _read_everything(path)
    assert report.records == len(records)
    assert report.trajectories + report.skipped_total == len(records)


@_FUZZ
@given(cut=st.integers(min_value=0, max_value=4000), junk=st.text(alphabet=string.printable, max_size=20))
def test_readers_report_truncated_files_without_crashing(
    shared_data: Path, tmp_path: Path, cut: int, junk: str
) -> None:
    source = (shared_data / "nemo_gym" / "single_step_tool_use_pivots.jsonl").read_text()
    for name, text in (
        ("rows.jsonl", source[:cut] + junk),
        ("list.json", json.dumps(json.loads("[" + ",".join(source.splitlines()[:2]) + "]"))[:cut] + junk),
    ):
        path = tmp_path / name
        path.write_text(text)
        _read_everything(path)


@_FUZZ
@given(data=st.binary(max_size=200))
def test_readers_report_random_bytes_without_crashing(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "bytes.bin"
    path.write_bytes(data)
    _read_everything(path)
    path.write_bytes(b"\x1f\x8b" + data)  # claims to be gzip
    _read_everything(path)


def _mutate(value: object, data: st.DataObject, root: bool = False) -> object:
    """A copy of `value` with one randomly chosen nested field replaced by random JSON."""
    if isinstance(value, dict) and value and (root or data.draw(st.booleans())):
        key = data.draw(st.sampled_from(sorted(value)))
        return {**value, key: _mutate(value[key], data)}
    if isinstance(value, list) and value and data.draw(st.booleans()):
        index = data.draw(st.integers(0, len(value) - 1))
        return [*value[:index], _mutate(value[index], data), *value[index + 1 :]]
    return data.draw(_json)


@_FUZZ
@given(data=st.data())
def test_readers_report_real_records_with_a_random_field_broken(
    shared_data: Path, tmp_path: Path, data: st.DataObject
) -> None:
    sources = [
        json.loads((shared_data / TAU).read_text())[0],
        *_rows(shared_data / "nemo_gym" / "single_step_tool_use_pivots.jsonl")[2:3],
        *_rows(shared_data / "nemo_gym" / "swe_bash_rollouts.jsonl")[:1],
        Pivot(
            "p/t0", "d", [{"role": "user", "content": "q"}], {"role": "assistant", "content": "r"}
        ).to_dict(),
    ]
    record = _mutate(data.draw(st.sampled_from(sources)), data, root=True)
    path = tmp_path / "mutated.jsonl"
    path.write_text(json.dumps(record) + "\n")
    report = _read_everything(path)
    assert report.trajectories + report.skipped_total == 1
    for pivot in read_as_pivots(path, report=ReadReport()):
        json.dumps(pivot.to_dict())
