"""Property-based tests of the tool-use domain: parse, verify and step keep their contract on any action.

Actions are arbitrary text, arbitrary JSON-like values (nested, huge strings, lone surrogates,
odd types), tool-call-shaped dicts with the airline tools' names or random ones and arguments
near the expert's or random, and Hermes `<tool_call>` blocks with random JSON. Deterministic
(derandomized, fixed example budgets): about 20 s here.

The parser calls every malformed shape a category (it once raised on content parts whose text
was not a string, and on a lone surrogate in a call); env_error, which step reports for an
exception of the domain's own code, must never appear.
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
    odd_text,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import pivot_envs  # noqa: F401  (registers pivot/tool-use-v0)
from pivot_envs.chat import calls_of
from pivot_envs.domains.tool_use.env import bundled_pivots
from pivot_envs.domains.tool_use.parser import parse_action
from pivot_envs.domains.tool_use.verifier import CachedStrictVerifier, FunctionalVerifier

FUZZ = settings(max_examples=250, deadline=None, derandomize=True, report_multiple_bugs=False)
PIVOTS = list(bundled_pivots())
CALL_PIVOTS = [p for p in PIVOTS if p.expert.get("tool_calls")]
TOOL_NAMES = sorted({tool["function"]["name"] for pivot in PIVOTS for tool in pivot.tools})

plain_json = json_strategy(st.text(max_size=20), key_size=10, size=4, leaves=15)
odd_values = st.recursive(
    st.one_of(
        plain_json,
        odd_text,
        st.binary(max_size=10),
        st.sampled_from([object(), np.int64(3), float("nan"), float("inf"), ..., {1, 2}]),
        st.text(max_size=1).map(lambda c: c * 200_000),  # a huge string
    ),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(odd_text | st.integers(), inner, max_size=3),
    max_leaves=15,
)


@st.composite
def arguments_near_the_experts(draw: st.DrawFn) -> tuple[str, object]:
    """An expert call's name and arguments, with one value changed, one key dropped or one added."""
    pivot = draw(st.sampled_from(CALL_PIVOTS))
    name, arguments = draw(st.sampled_from(calls_of(pivot.expert)))
    if isinstance(arguments, dict) and arguments:
        arguments = dict(arguments)
        key = draw(st.sampled_from(sorted(arguments)))
        change = draw(st.sampled_from(["value", "drop", "add"]))
        if change == "value":
            arguments[key] = draw(plain_json)
        elif change == "drop":
            del arguments[key]
        else:
            arguments[draw(st.text(max_size=8))] = draw(plain_json)
    return name, arguments


names = st.sampled_from(TOOL_NAMES) | st.text(max_size=20)
random_calls = st.tuples(names, st.dictionaries(st.text(max_size=10), plain_json, max_size=4))
calls = arguments_near_the_experts() | random_calls


def as_message(pairs: list[tuple[str, object]], as_text: bool, content: str | None) -> dict:
    tool_calls = [
        {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments) if as_text else arguments},
        }
        for i, (name, arguments) in enumerate(pairs)
    ]
    return {"role": "assistant", "content": content, "tool_calls": tool_calls}


def as_hermes(pairs: list[tuple[str, object]], prose: str, close_last: bool) -> str:
    blocks = [f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>" for n, a in pairs]
    if blocks and not close_last:
        blocks[-1] = blocks[-1][: -len("</tool_call>")]
    return prose + "\n".join(blocks)


call_lists = st.lists(calls, min_size=1, max_size=3)
messages = st.builds(as_message, call_lists, st.booleans(), st.none() | odd_text)
hermes = st.builds(
    as_hermes, call_lists, st.sampled_from(["", "Let me check. ", "<think>hm</think>"]), st.booleans()
)
surrogate_calls = st.lists(
    st.tuples(names, st.dictionaries(st.text(max_size=10), odd_text, min_size=1, max_size=2)),
    min_size=1,
    max_size=2,
)
surrogate_actions = st.builds(as_message, surrogate_calls, st.booleans(), st.none()) | st.builds(
    as_hermes, surrogate_calls, st.just(""), st.just(True)
)
hermes_random_json = hermes_blocks(plain_json, odd_text)
odd_tool_calls = malformed_messages(odd_text, odd_values)
actions = odd_text | odd_values | messages | hermes | hermes_random_json | odd_tool_calls | surrogate_actions


@FUZZ
@given(actions)
def test_parsing_any_action_gives_a_chat_message_or_a_category(action: object) -> None:
    parsed = parse_action(action)
    assert isinstance(parsed.category, str) and parsed.category
    if parsed.message is not None:
        assert parsed.message["role"] == "assistant"
        json.dumps(parsed.message)


FUNCTIONAL, STRICT = FunctionalVerifier(), CachedStrictVerifier()


@FUZZ
@given(messages | hermes | odd_text, st.sampled_from(PIVOTS))
def test_verifying_any_parsed_action_gives_a_reward_and_a_category(action: object, pivot) -> None:
    parsed = parse_action(action)
    if parsed.message is None:
        return
    for verifier in (FUNCTIONAL, STRICT):
        verdict = verifier.verify(pivot, parsed.message)
        assert_verdict(verdict.reward, verdict.category)


@pytest.fixture(scope="module")
def env():
    made = gym.make("pivot/tool-use-v0").unwrapped
    yield made
    made.close()


@FUZZ
@given(action=actions, pivot=st.sampled_from(PIVOTS))
def test_stepping_any_action_keeps_the_contract(env, action: object, pivot) -> None:
    env.reset(options={"pivot": pivot.id})
    assert_step_contract(env.step(action))


@pytest.mark.parametrize(
    "action",
    [
        {"content": [{"type": "text", "text": {"not": "text"}}]},
        {"content": [{"type": "text", "text": None}]},
        as_message([("get_user_details", {"user_id": "a\ud800"})], False, None),
        as_hermes([("get_user_details", {"user_id": "a\ud800"})], "", True),
    ],
    ids=["dict text part", "None text part", "surrogate in arguments", "surrogate in a hermes block"],
)
def test_the_parser_calls_a_malformed_action_unparseable_instead_of_raising(action: object) -> None:
    parsed = parse_action(action)
    assert parsed.message is None and parsed.category
