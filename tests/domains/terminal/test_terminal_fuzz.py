"""Property-based tests of the terminal domain: parse, verify and step keep their contract on any action.

Actions are arbitrary text, arbitrary JSON-like values (nested, huge strings, lone surrogates,
odd types), tool-call-shaped dicts (the shell tools' names or random ones, commands near the
expert's or random), Hermes `<tool_call>` blocks with random JSON, bash fences and Terminus
keystrokes. Steps run in one real bubblewrap sandbox env reused across examples (about 20 ms a
step); deterministic (derandomized, fixed example budgets): about 40 s here.

The parser calls every malformed shape a category (it once raised on tool_calls that were not a
list, a function that was not an object, and text parts that were not strings); env_error, which
step reports for an exception of the domain's own code, must never appear.
"""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from fuzz_common import (
    assert_step_contract,
    assert_verdict,
    hermes_blocks,
    json_strategy,
    malformed_messages,
    odd_text_with,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import pivot_envs  # noqa: F401  (registers pivot/terminal-v0)
from pivot_envs.domains.terminal import TerminalVerifier, bundled_pivots, parse_action
from pivot_envs.domains.terminal.parse import COMMAND_TOOLS, command_of_message

PARSE = settings(max_examples=200, deadline=None, derandomize=True, report_multiple_bugs=False)
STEP = settings(max_examples=120, deadline=None, derandomize=True)
PIVOTS = bundled_pivots()[:6]  # each pivot's prefix is built once; a few keep the budget on the actions
EXPERT_COMMANDS = [command_of_message(pivot.expert) for pivot in bundled_pivots()]

odd_text = odd_text_with("\x00\n\t{}[]\"'<>/`$|;&")
plain_json = json_strategy(odd_text, key_size=10, size=4, leaves=15)
odd_values = st.recursive(
    st.one_of(
        plain_json,
        st.binary(max_size=10),
        st.sampled_from([object(), np.int64(3), float("nan"), ..., {1, 2}]),
        st.text(max_size=1).map(lambda c: c * 200_000),  # a huge string
    ),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(odd_text | st.integers(), inner, max_size=3),
    max_leaves=15,
)

# Commands: the experts' own, one of their words changed, short pipelines of harmless programs, any text.
words = st.sampled_from(
    [
        "ls",
        "cat app.log",
        "echo hi",
        "wc -l",
        "sort",
        "head -n 2",
        "true",
        "false",
        "pwd",
        "cd /tmp",
        "grep -c x",
    ]
)
pipelines = st.lists(words, min_size=1, max_size=3).flatmap(
    lambda parts: st.sampled_from([" | ", " ; ", " && "]).map(lambda glue: glue.join(parts))
)
near_experts = st.builds(
    lambda command, index, word: " ".join(
        word if i == index % max(len(command.split()), 1) else part for i, part in enumerate(command.split())
    ),
    st.sampled_from(EXPERT_COMMANDS),
    st.integers(min_value=0, max_value=20),
    st.text(max_size=10),
)
commands = st.sampled_from(EXPERT_COMMANDS) | near_experts | pipelines | odd_text
tool_names = st.sampled_from([*COMMAND_TOOLS, "read_file", "write_file", "execute_code"]) | st.text(
    max_size=12
)
arguments = st.fixed_dictionaries({"command": commands}) | st.dictionaries(
    st.sampled_from(["command", "cmd", "path", "content", "code", "keys"]), plain_json, max_size=3
)

messages = st.builds(
    lambda name, args, as_text, content: {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {
                "id": "c0",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args) if as_text else args},
            }
        ],
    },
    tool_names,
    arguments,
    st.booleans(),
    st.none() | odd_text,
)
hermes = st.builds(
    lambda name, args: f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>",
    tool_names,
    arguments,
)
hermes_random_json = hermes_blocks(plain_json, odd_text)
fences = st.builds(
    lambda lang, command: f"```{lang}\n{command}\n```",
    st.sampled_from(["bash", "sh", "", "python"]),
    commands,
)
terminus = st.builds(
    lambda keys: json.dumps({"commands": [{"keystrokes": k} for k in keys]}),
    st.lists(
        commands.map(lambda c: c + "\n") | st.sampled_from(["C-c", "Enter", "q"]), min_size=1, max_size=2
    ),
)
odd_messages = malformed_messages(odd_text, odd_values)
actions = odd_text | odd_values | messages | hermes | hermes_random_json | fences | terminus | odd_messages


@PARSE
@given(actions)
def test_parsing_any_action_gives_one_command_or_a_category(action: object) -> None:
    parsed = parse_action(action)
    assert isinstance(parsed.category, str) and parsed.category
    if parsed.message is not None:
        assert isinstance(command_of_message(parsed.message), str)
        json.dumps(parsed.message, ensure_ascii=False).encode("utf-8")


VERIFIER = TerminalVerifier()


@PARSE
@given(messages | hermes | fences, st.sampled_from(bundled_pivots()))
def test_verifying_any_parsed_action_gives_a_reward_and_a_category(action: object, pivot) -> None:
    parsed = parse_action(action, check_syntax=False)
    if parsed.message is not None:
        verdict = VERIFIER.verify(pivot, parsed.message)
        assert_verdict(verdict.reward, verdict.category)


@pytest.fixture(scope="module")
def env(has_bwrap):
    made = gym.make("pivot/terminal-v0", pivots=PIVOTS, sandbox="bwrap", limits={"timeout": 3.0}).unwrapped
    yield made
    made.close()


@STEP
@given(action=actions, pivot=st.sampled_from(PIVOTS))
def test_stepping_any_action_keeps_the_contract(env, action: object, pivot) -> None:
    env.reset(options={"pivot": pivot.id})
    assert_step_contract(env.step(action))


def nested(depth: int) -> dict:
    value: object = "x"
    for _ in range(depth):
        value = {"a": value}
    return value  # type: ignore[return-value]


@pytest.mark.parametrize(
    "action",
    [
        nested(10_000),
        {"tool_calls": [{"type": "function", "function": {"name": "bash", "arguments": nested(10_000)}}]},
        {"content": nested(10_000)},
    ],
    ids=["a dict", "tool-call arguments", "content"],
)
def test_an_action_nested_ten_thousand_deep_scores_zero_and_valid(env, action: dict) -> None:
    env.reset(options={"pivot": PIVOTS[0].id})
    observation, reward, _, _, info = env.step(action)
    assert (reward, info["valid"]) == (0.0, True) and info["category"] not in ("", "env_error"), info[
        "detail"
    ]
    json.dumps(info)
    json.dumps(observation)


@pytest.mark.parametrize(
    "action",
    [
        {"tool_calls": {"bash": {"command": "ls"}}},
        {"tool_calls": 5},
        {"tool_calls": [{"function": "bash"}]},
        {"content": [{"type": "text", "text": ["ls"]}]},
    ],
    ids=["tool_calls a dict", "tool_calls a number", "function a string", "list text part"],
)
def test_the_parser_calls_a_malformed_action_unparseable_instead_of_raising(action: object) -> None:
    parsed = parse_action(action, check_syntax=False)
    assert parsed.message is None and parsed.category
