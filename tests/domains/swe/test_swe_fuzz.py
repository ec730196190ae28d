"""Bad input at SWE pivots: scored 0 with a category, never an exception, contained by the sandbox's
limits and timeouts; the next reset is unaffected. Property tests (derandomized, fixed budgets) over
any action text and any tool call, plus the explicit cases: edits outside the repository, binary
and 10 MB contents, invalid JSON, unknown commands, a test that loops forever, `rm -rf /repo`,
background processes and a fork bomb.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sandbox_fixtures import FAST_LIMITS
from swe_helpers import call_message

from pivot_envs.domains.swe import SweEnv, parse_action

PARSE = settings(max_examples=300, deadline=None, derandomize=True, report_multiple_bugs=False)
STEP = settings(max_examples=40, deadline=None, derandomize=True, report_multiple_bugs=False)
LIMITS = dataclasses.asdict(FAST_LIMITS) | {"timeout": 3.0}

odd_text = (
    st.text(max_size=60)
    | st.builds(lambda a, s: a + s, st.text(max_size=10), st.characters(categories=["Cs"]))
    | st.text(st.sampled_from("\x00\n\t{}[]\"'<>/$`;&|*"), max_size=30)
)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | odd_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
tool_names = (
    st.sampled_from(["bash", "execute_bash", "str_replace_editor", "submit", "finish", "python", ""])
    | odd_text
)
editor_arguments = st.fixed_dictionaries(
    {
        "command": st.sampled_from(["view", "create", "str_replace", "insert", "undo_edit", "delete"])
        | odd_text
    },
    optional={
        "path": st.sampled_from(["/repo/calc/ops.py", "/repo", "/repo/../etc/passwd", "/tmp/x", "rel.py"])
        | odd_text,
        "old_str": odd_text,
        "new_str": odd_text,
        "file_text": odd_text,
        "insert_line": values,
        "view_range": values,
    },
)
calls = st.one_of(
    st.tuples(st.just("str_replace_editor"), editor_arguments),
    st.tuples(st.just("bash"), st.fixed_dictionaries({"command": odd_text})),
    st.tuples(tool_names, st.dictionaries(st.text(max_size=8), values, max_size=3) | odd_text),
)
actions = st.one_of(
    odd_text,
    calls.map(lambda call: call_message(*call)),
    st.builds(lambda body: f"<tool_call>{body}</tool_call>", odd_text),
    st.dictionaries(st.text(max_size=8), values, max_size=3),
    values,
)


@pytest.fixture(scope="module")
def env(calc_pivots, has_bwrap):
    made = SweEnv(calc_pivots, sandbox="bwrap", limits=LIMITS)
    yield made
    made.close()


@PARSE
@given(actions)
def test_parsing_any_action_never_raises(action):
    parsed = parse_action(action)
    assert (parsed.message is None) == (parsed.category != "ok")


@STEP
@given(calls, st.sampled_from(["calc-mean/t1", "calc-mean/t2"]))
def test_any_tool_call_scores_zero_or_one_and_is_never_an_env_error(env, call, pivot_id):
    env.reset(options={"pivot": pivot_id})
    _, reward, terminated, _, info = env.step(call_message(*call))
    assert reward in (0.0, 1.0) and terminated
    assert info["category"] != "env_error" and info["valid"], info


def step(env: SweEnv, pivot_id: str, name: str, arguments) -> dict:
    env.reset(options={"pivot": pivot_id})
    _, reward, _, _, info = env.step(call_message(name, arguments))
    assert info["valid"], info
    return {"reward": reward, "category": info["category"], "text": info["output"].get("text", "")}


def expert_still_scores_one(env: SweEnv, pivot_id: str) -> bool:
    env.reset(options={"pivot": pivot_id})
    return env.step(env.pivot.expert)[1] == 1.0


@pytest.mark.parametrize(
    ("name", "arguments", "category"),
    [
        (
            "str_replace_editor",
            {"command": "create", "path": "/etc/evil.py", "file_text": "x"},
            "outside_repo",
        ),
        ("str_replace_editor", {"command": "view", "path": "/repo/../etc/passwd"}, "outside_repo"),
        (
            "str_replace_editor",
            {"command": "create", "path": "/repo/big.py", "file_text": "x" * (10 << 20)},
            "too_large",
        ),
        ("str_replace_editor", '{"command": "view", "path": ', "invalid_arguments"),
        ("str_replace_editor", {"command": "delete", "path": "/repo/calc/ops.py"}, "unknown_command"),
        ("rm", {"path": "/repo"}, "unknown_tool"),
        ("bash", {"command": ""}, "invalid_arguments"),
        ("bash", {"command": "echo a\x00b"}, "invalid_arguments"),
    ],
)
def test_a_bad_call_scores_zero_with_its_category(env, name, arguments, category):
    result = step(env, "calc-mean/t2", name, arguments)
    assert (result["reward"], result["category"]) == (0.0, category)


def test_binary_contents_are_written_but_not_shown_as_text(env):
    result = step(
        env, "calc-mean/t2", "bash", {"command": "head -c 2000 /dev/urandom > calc/blob.py; echo ok"}
    )
    assert result["reward"] == 0.0
    result = step(
        env,
        "calc-mean/t1",
        "str_replace_editor",
        {"command": "create", "path": "/repo/b.py", "file_text": "a\x00b"},
    )
    assert result["reward"] == 0.0 and result["category"] == "changed_files"


def test_a_test_that_loops_forever_is_killed_at_the_time_limit(env):
    loop = "python3 -c 'while True: pass'"
    assert step(env, "calc-mean/t3", "bash", {"command": loop})["category"] == "timeout"
    assert expert_still_scores_one(env, "calc-mean/t3")


def test_rm_rf_of_the_repository_costs_only_that_sample(env):
    assert (
        step(env, "calc-mean/t2", "bash", {"command": "rm -rf /repo/* /repo/.git; ls -A /repo | wc -l"})[
            "reward"
        ]
        == 0.0
    )
    assert expert_still_scores_one(env, "calc-mean/t2")


def test_background_processes_do_not_hold_the_call_or_outlive_the_sample(env):
    result = step(env, "calc-mean/t0", "bash", {"command": "(sleep 60; touch /repo/late) & echo started"})
    assert "started" in result["text"] and result["reward"] == 0.0
    assert step(env, "calc-mean/t0", "bash", {"command": "ls /repo/late"})["category"] == "different_output"


def test_a_fork_bomb_is_contained_and_the_next_reset_is_unaffected(env):
    result = step(env, "calc-mean/t1", "bash", {"command": ":(){ :|:& };:"})
    assert result["reward"] == 0.0
    assert expert_still_scores_one(env, "calc-mean/t1")
