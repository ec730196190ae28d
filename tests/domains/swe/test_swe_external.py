"""External coding traces as SWE pivots: NeMo-Gym swe_pivot rows and mini-swe-agent rollouts,
OpenHands-style chats; without their repository image they are scored unexecuted, and say so."""

from __future__ import annotations

import json

import pytest
from swe_helpers import call_message

from pivot_envs.chat import assistant_message, tool_call
from pivot_envs.domains.swe import SweEnv
from pivot_envs.domains.swe.external import read_external
from pivot_envs.errors import UnknownNameError

OPENHANDS_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "execute_bash",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "str_replace_editor",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "path": {"type": "string"}},
            },
        },
    },
    {"type": "function", "function": {"name": "finish", "parameters": {"type": "object", "properties": {}}}},
]


@pytest.fixture(scope="module")
def nemo_rows(shared_data):
    return read_external(shared_data / "nemo_gym" / "swe_pivots.jsonl")


@pytest.fixture(scope="module")
def rollouts(shared_data):
    return read_external(shared_data / "nemo_gym" / "swe_bash_rollouts.jsonl")


def openhands_chat(tmp_path) -> str:
    """An OpenHands-style trajectory: execute_bash, then the editor, then finish."""
    messages = [
        {"role": "system", "content": "You are OpenHands."},
        {"role": "user", "content": "Fix total() in /testbed/calc.py"},
        assistant_message(
            None,
            [
                tool_call(
                    "execute_bash", {"command": "git init -q && git commit -q --allow-empty -m base"}, "c0"
                )
            ],
        ),
        {"role": "tool", "tool_call_id": "c0", "content": "[The command completed with exit code 0.]"},
        assistant_message(None, [tool_call("execute_bash", {"command": "ls /testbed"}, "c1")]),
        {"role": "tool", "tool_call_id": "c1", "content": ""},
        assistant_message(None, [tool_call("finish", {}, "c2")]),
    ]
    path = tmp_path / "openhands.jsonl"
    path.write_text(json.dumps({"id": "oh-1", "messages": messages, "tools": OPENHANDS_TOOLS}) + "\n")
    return str(path)


def test_nemo_gym_rows_without_tool_schemas_get_the_persistent_harness_and_its_tools(nemo_rows):
    assert len(nemo_rows) == 5
    pivot = nemo_rows[0]
    assert pivot.context["harness"] == "persistent" and pivot.context["executable"] is False
    assert [t["function"]["name"] for t in pivot.tools] == ["bash", "str_replace_editor", "submit"]
    assert "image is not available" in pivot.context["not_executable_reason"]


def test_mini_swe_agent_rollouts_are_fresh_harness_pivots_with_one_call_each(rollouts):
    assert len(rollouts) > 50
    assert {p.context["harness"] for p in rollouts} == {"fresh"}
    assert {t["function"]["name"] for p in rollouts for t in p.tools} == {"bash"}
    assert all(len(p.expert["tool_calls"]) == 1 for p in rollouts)
    assert any(p.context.get("expert_calls_dropped") for p in rollouts)


def test_unexecuted_pivots_score_at_the_name_kind_and_nemo_levels_and_say_so(nemo_rows):
    for verifier in ("name", "kind", "nemo"):
        env = SweEnv(nemo_rows, verifier=verifier)
        for pivot in nemo_rows:
            env.reset(options={"pivot": pivot.id})
            _, reward, _, _, info = env.step(pivot.expert)
            assert (reward, info["valid"], info["executed"]) == (1.0, True, False), (verifier, pivot.id, info)
            assert "image is not available" in info["output"]["reason"]
        assert env.backend is None  # nothing was started
        env.close()


def test_effect_on_an_unexecuted_pivot_falls_back_to_the_nemo_level(nemo_rows):
    env = SweEnv(nemo_rows)
    env.reset(options={"pivot": "example_2"})  # grep -rn 'def calculate_total' /workspace/proj
    _, reward, _, _, info = env.step(
        call_message("execute_bash", {"command": "grep -rn 'def calculate_total' /workspace/proj"})
    )
    assert (reward, info["category"], info["executed"]) == (1.0, "nemo_match", False)
    assert "scored at the nemo level" in info["detail"]
    _, info = env.reset(options={"pivot": "example_2"})
    _, reward, _, _, info = env.step(
        call_message("str_replace_editor", {"command": "view", "path": "/workspace/proj"})
    )
    assert (reward, info["category"]) == (0.0, "tool_name_mismatch")
    env.close()


def test_an_openhands_chat_reads_as_persistent_pivots_with_its_own_tools(tmp_path):
    pivots = read_external(openhands_chat(tmp_path))
    assert [p.context["harness"] for p in pivots] == ["persistent"] * 3
    assert [t["function"]["name"] for t in pivots[0].tools] == [
        "execute_bash",
        "str_replace_editor",
        "finish",
    ]
    assert pivots[2].expert["tool_calls"][0]["function"]["name"] == "submit"  # finish, in this harness's name


def test_forcing_an_unknown_harness_is_an_unknown_name_error_naming_the_choices(tmp_path):
    with pytest.raises(UnknownNameError, match="unknown harness 'fres'; did you mean 'fresh'") as raised:
        read_external(openhands_chat(tmp_path), harness="fres")
    assert isinstance(raised.value, ValueError)  # what callers caught before the error had a type


def test_with_its_image_an_external_trace_runs_on_docker_at_the_effect_level(tmp_path, has_docker):
    pivots = read_external(openhands_chat(tmp_path), images={"oh-1": has_docker})
    env = SweEnv(pivots, sandbox="docker", limits={"timeout": 10.0})
    env.reset(options={"index": 1})  # after `git init` in /testbed, the expert lists it
    _, reward, _, _, info = env.step(call_message("bash", {"command": "ls -A /testbed"}))
    assert (info["executed"], info["valid"]) == (True, True), info
    assert ".git" in info["output"]["text"] and info["category"] != "nemo_match"
    env.close()
