"""The functional verifier: equivalent variants pass, wrong ones fail with the right category."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
from fuzz_common import json_strategy
from hypothesis import given, settings
from hypothesis import strategies as st
from tool_use_helpers import expert_call, first, hermes, step

from pivot_envs import Pivot
from pivot_envs.chat import assistant_message, canonical_action, tool_call
from pivot_envs.config import ConfigError
from pivot_envs.domains.tool_use.parser import parse_action
from pivot_envs.domains.tool_use.verifier import CachedStrictVerifier, FunctionalConfig, FunctionalVerifier
from pivot_envs.formats import read_as_pivots


def both(env, pivot, action):
    """(functional reward, strict reward, category) of an action at a pivot."""
    reward, info, _ = step(env, pivot, action)
    return reward, info["strict_reward"], info["category"]


def test_reordered_keys_score_one_under_both_verifiers(recorded_env, call_pivots):
    # The core's strict canonical form already sorts keys (Eq. 2 compares parsed JSON).
    for pivot in call_pivots[:40]:
        name, arguments = expert_call(pivot)
        reordered = dict(reversed(list(arguments.items())))
        assert both(recorded_env, pivot, hermes(name, reordered))[:2] == (1.0, 1.0), pivot.id


def test_integer_written_as_float_scores_one_functionally_and_zero_strictly(recorded_env, call_pivots):
    checked = 0
    for pivot in call_pivots:
        name, arguments = expert_call(pivot)
        ints = [k for k, v in arguments.items() if type(v) is int]
        if not ints:
            continue
        variant = {**arguments, **{k: float(arguments[k]) for k in ints}}
        assert both(recorded_env, pivot, hermes(name, variant)) == (1.0, 0.0, "correct"), pivot.id
        checked += 1
    assert checked >= 3


def test_ids_in_another_case_or_padded_with_spaces_score_one_functionally_and_zero_strictly(
    recorded_env, call_pivots
):
    checked = 0
    for pivot in call_pivots:
        name, arguments = expert_call(pivot)
        for key in ("reservation_id", "user_id"):
            if isinstance(arguments.get(key), str):
                for value in (arguments[key].upper(), f"  {arguments[key]} "):
                    if value != arguments[key]:
                        variant = {**arguments, key: value}
                        assert both(recorded_env, pivot, hermes(name, variant)) == (1.0, 0.0, "correct"), (
                            pivot.id,
                            value,
                        )
                        checked += 1
    assert checked >= 50


def test_enum_value_in_another_case_scores_one_functionally(recorded_env, call_pivots):
    pivot = first(call_pivots, "update_reservation_flights")
    name, arguments = expert_call(pivot)
    variant = {**arguments, "cabin": arguments["cabin"].upper()}
    assert both(recorded_env, pivot, hermes(name, variant)) == (1.0, 0.0, "correct")


def test_whitespace_in_a_plain_string_does_not_count_but_case_does(recorded_env, call_pivots):
    pivot = first(call_pivots, "search_direct_flight")
    name, arguments = expert_call(pivot)
    assert both(recorded_env, pivot, hermes(name, {**arguments, "origin": f" {arguments['origin']}\n"}))[
        :2
    ] == (1.0, 0.0)
    assert (
        both(recorded_env, pivot, hermes(name, {**arguments, "origin": arguments["origin"].lower()}))[0]
        == 0.0
    )


def optional_pivot() -> Pivot:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "search",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "query": {"type": "string"},
                        "limit": {"type": "integer", "default": 10},
                        "exact": {"type": "boolean", "default": False},
                    },
                    "required": ["query"],
                },
            },
        }
    ]
    expert = assistant_message(None, [tool_call("search", {"query": "flights to Paris"}, "c1")])
    return Pivot(
        id="synthetic/optional",
        domain="tool-use",
        messages=[{"role": "user", "content": "find"}],
        expert=expert,
        tools=tools,
    )


def test_an_optional_argument_equal_to_its_default_counts_as_absent():
    pivot = optional_pivot()
    env = gym.make("pivot/tool-use-v0", pivots=[pivot]).unwrapped
    assert both(env, pivot, hermes("search", {"query": "flights to Paris", "limit": 10, "exact": False})) == (
        1.0,
        0.0,
        "correct",
    )
    assert both(env, pivot, hermes("search", {"query": "flights to Paris", "limit": 10.0})) == (
        1.0,
        0.0,
        "correct",
    )
    reward, _, category = both(env, pivot, hermes("search", {"query": "flights to Paris", "limit": 5}))
    assert (reward, category) == (0.0, "extra_argument")
    # A boolean is not the integer 0 or 1, even though Python says False == 0.
    assert both(env, pivot, hermes("search", {"query": "flights to Paris", "exact": 0}))[::2] == (
        0.0,
        "extra_argument",
    )


def test_wrong_tool_wrong_value_missing_extra_and_mistyped_arguments_score_zero_with_their_category(
    recorded_env, call_pivots
):
    pivot = first(call_pivots, "update_reservation_baggages")
    name, arguments = expert_call(pivot)
    cases = [
        (
            hermes("get_reservation_details", {"reservation_id": arguments["reservation_id"]}),
            "unexpected_tool",
        ),
        (
            hermes(name, {**arguments, "total_baggages": arguments["total_baggages"] + 1}),
            "argument_value_different",
        ),
        (hermes(name, {k: v for k, v in arguments.items() if k != "payment_id"}), "missing_argument"),
        (hermes(name, {**arguments, "insurance": "no"}), "extra_argument"),
        (
            hermes(name, {**arguments, "total_baggages": str(arguments["total_baggages"])}),
            "argument_type_mismatch",
        ),
        (hermes(name, {**arguments, "reservation_id": "ZZZZZZ"}), "argument_value_different"),
    ]
    for action, category in cases:
        assert both(recorded_env, pivot, action) == (0.0, 0.0, category), action


def test_nested_array_items_compare_in_order_with_their_schema(recorded_env, call_pivots):
    pivot = first(call_pivots, "update_reservation_flights")
    name, arguments = expert_call(pivot)
    flights = [{**leg, "flight_number": leg["flight_number"].lower()} for leg in arguments["flights"]]
    assert both(recorded_env, pivot, hermes(name, {**arguments, "flights": flights}))[:2] == (1.0, 0.0)
    if len(arguments["flights"]) > 1:
        swapped = {**arguments, "flights": list(reversed(arguments["flights"]))}
        assert both(recorded_env, pivot, hermes(name, swapped))[0] == 0.0
        as_set = gym.make(
            "pivot/tool-use-v0", backend="recorded", verifier_config={"unordered_arrays": ["flights"]}
        ).unwrapped
        assert both(as_set, pivot, hermes(name, swapped))[0] == 1.0


def test_free_text_arguments_match_by_token_similarity(recorded_env, call_pivots):
    pivot = first(call_pivots, "transfer_to_human_agents")
    name, arguments = expert_call(pivot)
    words = arguments["summary"].split()
    shortened = " ".join(words[: int(len(words) * 0.8)])
    assert both(recorded_env, pivot, hermes(name, {"summary": shortened}))[:2] == (1.0, 0.0)
    unrelated = {"summary": "Customer wants a refund for a broken toaster bought online last week."}
    assert both(recorded_env, pivot, hermes(name, unrelated))[::2] == (0.0, "argument_value_different")


def test_a_message_turn_with_an_unrelated_message_scores_zero(recorded_env, message_pivots):
    for pivot in message_pivots[:30]:
        reward, _, category = both(
            recorded_env, pivot, "I like turtles. Bananas are yellow and grow on tall plants."
        )
        assert (reward, category) == (0.0, "message_content_different"), pivot.id


def test_the_expert_message_reworded_lightly_still_scores_one(recorded_env, message_pivots):
    pivot = next(p for p in message_pivots if len(p.expert["content"].split()) > 20)
    text = pivot.expert["content"].replace("Could you", "Can you").replace("please", "").upper()
    assert both(recorded_env, pivot, text)[:2] == (1.0, 0.0)


def test_a_tool_call_where_a_message_was_expected_and_the_reverse_score_zero(
    recorded_env, message_pivots, call_pivots
):
    assert both(recorded_env, message_pivots[0], hermes("think", {"thought": "hm"}))[::2] == (
        0.0,
        "expected_message_got_tool_call",
    )
    pivot = call_pivots[0]
    assert both(recorded_env, pivot, "Let me check that for you.")[::2] == (
        0.0,
        "expected_tool_call_got_message",
    )


def test_message_check_any_reproduces_nemo_gym_and_accepts_every_message(message_pivots):
    env = gym.make("pivot/tool-use-v0", verifier_config={"message_check": "any"}).unwrapped
    assert both(env, message_pivots[0], "I like turtles.")[0] == 1.0


def test_a_pluggable_judge_decides_messages_and_its_failure_is_an_invalid_sample(message_pivots):
    seen = []

    def judge(pivot, expected, actual):
        seen.append((pivot.id, expected, actual))
        return "turtles" in actual

    env = gym.make(
        "pivot/tool-use-v0", verifier_config={"message_check": "judge", "message_judge": judge}
    ).unwrapped
    assert both(env, message_pivots[0], "I like turtles.")[0] == 1.0
    assert both(env, message_pivots[0], "I like cats.")[0] == 0.0
    assert seen[0] == (message_pivots[0].id, message_pivots[0].expert["content"].strip(), "I like turtles.")

    def broken(pivot, expected, actual):
        raise TimeoutError("judge endpoint down")

    env = gym.make(
        "pivot/tool-use-v0", verifier_config={"message_check": "judge", "message_judge": broken}
    ).unwrapped
    reward, info, _ = step(env, message_pivots[0], "I like turtles.")
    assert info["valid"] is False and info["category"] == "infrastructure_error"


def test_the_verifier_config_is_validated_as_config_errors_naming_the_setting():
    with pytest.raises(ConfigError, match=r"unknown functional verifier option\(s\) \['threshold'\]"):
        FunctionalVerifier(threshold=0.3)
    with pytest.raises(ConfigError, match="FunctionalConfig.mode must be one of .*, got 'sometimes'"):
        FunctionalConfig(mode="sometimes")
    with pytest.raises(ConfigError, match="message_check='judge' needs a message_judge") as raised:
        FunctionalConfig(message_check="judge")
    assert isinstance(raised.value, ValueError)  # what callers caught before the error had a type


@pytest.fixture(scope="module")
def parallel_pivots(shared_data):
    return read_as_pivots(
        shared_data / "nemo_gym" / "single_step_tool_use_parallel_pivots.jsonl", domain="tool-use"
    )


def calls_text(calls):
    return "".join(hermes(name, arguments) for name, arguments in calls)


def expert_calls(pivot):
    return [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in pivot.expert["tool_calls"]
    ]


def test_parallel_calls_in_any_order_match_as_a_multiset(parallel_pivots):
    env = gym.make("pivot/tool-use-v0", pivots=parallel_pivots).unwrapped
    multi = [p for p in parallel_pivots if len(p.expert.get("tool_calls") or []) > 1]
    assert multi
    for pivot in multi:
        calls = expert_calls(pivot)
        assert both(env, pivot, calls_text(list(reversed(calls)))) == (1.0, 0.0, "correct"), pivot.id
        lowered = [(n, {k: v.lower() if isinstance(v, str) else v for k, v in a.items()}) for n, a in calls]
        assert (
            both(env, pivot, calls_text(lowered))[0] == 0.0
        )  # city and ticker are plain strings: case counts


def test_a_missing_or_extra_parallel_call_is_a_wrong_call_count_scored_by_mode(parallel_pivots):
    pivot = next(p for p in parallel_pivots if len(p.expert.get("tool_calls") or []) == 3)
    calls = expert_calls(pivot)
    expected = {"binary": 0.0, "fractional": 2 / 3, "f1": 2 * 2 / 5}
    for mode, reward in expected.items():
        env = gym.make("pivot/tool-use-v0", pivots=parallel_pivots, verifier_config={"mode": mode}).unwrapped
        got, _, category = both(env, pivot, calls_text(calls[:2]))
        assert (got, category) == (pytest.approx(reward), "wrong_call_count"), mode
    env = gym.make("pivot/tool-use-v0", pivots=parallel_pivots, verifier_config={"mode": "f1"}).unwrapped
    got, _, category = both(env, pivot, calls_text([*calls, calls[0]]))
    assert (got, category) == (pytest.approx(2 * 3 / 7), "wrong_call_count")


def test_a_wrong_value_in_one_parallel_call_names_that_call(parallel_pivots):
    pivot = next(p for p in parallel_pivots if len(p.expert.get("tool_calls") or []) == 3)
    calls = expert_calls(pivot)
    name, arguments = calls[1]
    changed = [calls[0], (name, {k: "Lima" for k in arguments}), calls[2]]
    env = gym.make(
        "pivot/tool-use-v0", pivots=parallel_pivots, verifier_config={"mode": "fractional"}
    ).unwrapped
    reward, _, category = both(env, pivot, calls_text(changed))
    assert (reward, category) == (pytest.approx(2 / 3), "argument_value_different")


json_values = json_strategy(st.text(max_size=12), key_size=6, size=3, leaves=12)


@settings(max_examples=300, deadline=None)
@given(json_values, st.text(max_size=200))
def test_the_verifiers_never_raise_on_arbitrary_arguments_or_text(pivots, value, text):
    verifier, strict = FunctionalVerifier(), CachedStrictVerifier()
    for pivot in (pivots[0], next(p for p in pivots if p.expert.get("tool_calls"))):
        for action in (
            assistant_message(None, [tool_call("get_user_details", value, "c0")]),
            assistant_message(
                None, [tool_call("book_reservation", {"user_id": value, "flights": value}, "c0")]
            ),
            assistant_message(text),
        ):
            assert 0.0 <= verifier.verify(pivot, action).reward <= 1.0
            assert strict.verify(pivot, action).reward in (0.0, 1.0)
        parsed = parse_action(text)
        if parsed.message is not None:
            assert 0.0 <= verifier.verify(pivot, parsed.message).reward <= 1.0


@settings(max_examples=300, deadline=None)
@given(json_values, json_values, st.text(max_size=10))
def test_the_cached_strict_verifier_equals_canonical_action_equality(a, b, text):
    expert = assistant_message(text or None, [tool_call("f", {"x": a}, "c0")])
    pivot = Pivot(id="p", domain="tool-use", messages=[{"role": "user", "content": "u"}], expert=expert)
    strict = CachedStrictVerifier()
    for value in (a, b):
        action = assistant_message(text or None, [tool_call("f", {"x": value}, "c9")])
        expected = canonical_action(action) == canonical_action(expert)
        assert (strict.verify(pivot, action).reward == 1.0) is expected


def test_a_malformed_expert_turn_in_a_user_file_scores_actions_without_raising():
    expert = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"function": "oops"}, "junk", {"function": {"name": "f", "arguments": "{bad"}}],
    }
    pivot = Pivot(
        id="user/bad", domain="tool-use", messages=[{"role": "user", "content": "hi"}], expert=expert
    )
    env = gym.make("pivot/tool-use-v0", pivots=[pivot], backend="tau-airline").unwrapped
    for action in (hermes("f", {"a": 1}), "hello", expert):
        reward, info, _ = step(env, pivot, action)
        assert 0.0 <= reward <= 1.0 and info["valid"]


# -- the text beside a call turn's calls (call_text) --------------------------------------------------------


def _with_text(pivot, text):
    return {**pivot.expert, "content": ((pivot.expert.get("content") or "") + " " + text).strip()}


@pytest.mark.parametrize("backend", ["tau-airline", "recorded"])
def test_the_right_calls_with_an_invented_fact_or_a_stuffed_text_score_zero(backend, call_pivots):
    """The calls decide a call turn, but its text may not carry a fact nobody stated or more than
    message_surplus_ceiling of word weight: a right call with a false confirmation, or with 60 KB of text, once
    scored 1 at all 169 call pivots."""
    env = gym.make("pivot/tool-use-v0", backend=backend).unwrapped
    claim = "Done! Your refund of $5,000 has been issued (confirmation ZZ9PLURAL). "
    for pivot in call_pivots[::7]:
        assert step(env, pivot, _with_text(pivot, claim))[1]["category"] == "call_text_facts_invented", (
            pivot.id
        )
        assert step(env, pivot, _with_text(pivot, claim * 800))[1]["category"] == "call_text_too_long", (
            pivot.id
        )
        # the same turns are right without the text, and with a word of courtesy or the call's own facts
        assert step(env, pivot, pivot.expert)[0] == 1.0
        assert step(env, pivot, _with_text(pivot, "Let me look that up for you."))[0] == 1.0
        name, arguments = expert_call(pivot)
        said = " ".join(
            str(v) for v in arguments.values() if isinstance(v, int) or isinstance(v, str) and " " not in v
        )
        assert step(env, pivot, _with_text(pivot, f"Checking {said} now."))[0] == 1.0, (pivot.id, said)


def test_call_text_off_lets_the_calls_alone_decide(call_pivots):
    env = gym.make("pivot/tool-use-v0", backend="recorded", verifier_config={"call_text": False}).unwrapped
    pivot = call_pivots[0]
    assert step(env, pivot, _with_text(pivot, "Refund ZZ9PLURAL issued. " * 800))[0] == 1.0


def test_a_wrong_call_keeps_its_own_category_whatever_its_text(recorded_env, call_pivots):
    pivot = first(call_pivots, "get_reservation_details")
    reward, info, _ = step(recorded_env, pivot, "Refund ZZ9PLURAL issued. " + hermes("get_user_details", {}))
    assert (reward, info["category"]) == (0.0, "unexpected_tool")
