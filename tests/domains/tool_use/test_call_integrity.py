"""Call-side reward integrity (audit 2, H1-H3): an empty search result is no evidence, a number too large
for a float is another value (not an env error), and free text may not state a fact the expert's does not."""

from __future__ import annotations

import gymnasium as gym
import pytest
from tool_use_helpers import expert_call, hermes, step

from pivot_envs.domains.tool_use.backends import Effect
from pivot_envs.domains.tool_use.verifier import FunctionalVerifier

EMPTY_SEARCH = "tau-airline/task13/trial1/t6"  # search_direct_flight ATL -> LAS on 2024-05-13: "[]"
BAGGAGES = "tau-airline/task5/trial1/t10"  # update_reservation_baggages(total_baggages=3, ...)
SUMMARY = "tau-airline/task18/trial1/t7"  # transfer_to_human_agents, a summary naming reservation SI5UKW
THOUGHT = "tau-airline/task11/trial0/t10"  # think: "... the total price is $375, ... the calculated $299 ..."


@pytest.fixture(scope="module")
def by_id(call_pivots):
    return {p.id: p for p in call_pivots}


# -- H1: an empty result with no state change is uninformative, like a refusal --------------------------


def test_an_empty_result_that_changes_nothing_is_uninformative_and_thinks_empty_output_is_not():
    for output in ("[]", " [ ]\n", "{}", "null", "Error: user not found"):
        assert Effect(output, {}).uninformative, output
    assert not Effect("[]", {"reservations": {"X": {}}}).uninformative  # it changed something
    for output in ("", '[{"flight_number": "HAT001"}]', "0", "false"):
        assert not Effect(output, {}).uninformative, output


def test_where_the_experts_search_finds_nothing_another_search_finding_nothing_scores_zero(
    airline_env, by_id
):
    """The reversed route (LAS -> ATL) finds no flight either: an equal output ("[]") once scored 1 by
    execution equivalence. Now the argument rules decide there, as where the expert's call is refused."""
    pivot = by_id[EMPTY_SEARCH]
    name, arguments = expert_call(pivot)
    assert airline_env.backend_for(pivot).expert_effects(pivot)[0].output.strip() == "[]"
    reversed_route = {**arguments, "origin": arguments["destination"], "destination": arguments["origin"]}
    reward, info, _ = step(airline_env, pivot, hermes(name, reversed_route))
    assert (reward, info["category"], info["valid"]) == (0.0, "argument_value_different", True)
    assert "the expert's call fails here" in info["detail"]
    # the expert's call, and what the argument rules accept, still score
    assert step(airline_env, pivot, pivot.expert)[0] == 1.0
    assert step(airline_env, pivot, hermes(name, dict(reversed(list(arguments.items())))))[0] == 1.0


# -- H2: integers compare exactly; one too large for a float is another value ----------------------------


@pytest.mark.parametrize("backend", ["tau-airline", "recorded"])
def test_an_integer_too_large_for_a_float_scores_zero_and_the_step_stays_valid(backend, by_id):
    env = gym.make("pivot/tool-use-v0", backend=backend).unwrapped
    pivot = by_id[BAGGAGES]
    name, arguments = expert_call(pivot)
    for value in (10**400, -(10**400)):
        reward, info, _ = step(env, pivot, hermes(name, {**arguments, "total_baggages": value}))
        assert (reward, info["category"], info["valid"]) == (0.0, "argument_value_different", True), info


def test_two_integers_compare_exactly_and_an_integer_and_a_float_within_the_tolerance():
    verifier = FunctionalVerifier()
    assert verifier.compare(1_000_000_000, 1_000_000_001, None, "amount")[0] == "argument_value_different"
    assert verifier.compare(3, 10**400, None, "n")[0] == "argument_value_different"
    assert verifier.compare(3.0, 10**400, None, "n")[0] == "argument_value_different"  # OverflowError
    assert verifier.compare(10**400, 3.5, None, "n")[0] == "argument_value_different"
    assert verifier.compare(10**400, 10**400, None, "n") is None
    assert verifier.compare(5, 5.0, None, "n") is None
    assert verifier.compare(0.1 + 0.2, 0.3, None, "n") is None
    assert verifier.compare(1, True, None, "n")[0] == "argument_type_mismatch"  # a boolean is never a number


# -- H3: free text states no fact the expert's value does not -------------------------------------------


def test_a_summary_naming_another_reservation_scores_zero_where_the_free_text_rule_decides(
    recorded_env, by_id
):
    pivot = by_id[SUMMARY]
    name, arguments = expert_call(pivot)
    assert "SI5UKW" in arguments["summary"]
    wrong = {**arguments, "summary": arguments["summary"].replace("SI5UKW", "ZP2BRD")}
    reward, info, _ = step(recorded_env, pivot, hermes(name, wrong))
    assert (reward, info["category"]) == (0.0, "argument_value_different")
    assert "zp2brd" in info["detail"] and "which the expert's does not" in info["detail"]
    # a shorter summary that leaves a fact out, or the same facts in another case, still passes
    shorter = {**arguments, "summary": arguments["summary"].replace(" (ID: SI5UKW)", "")}
    assert shorter != arguments and step(recorded_env, pivot, hermes(name, shorter))[0] == 1.0
    same = {**arguments, "summary": arguments["summary"].replace("SI5UKW", "si5ukw")}
    assert step(recorded_env, pivot, hermes(name, same))[0] == 1.0


def test_a_thought_with_its_amounts_changed_scores_zero(recorded_env, by_id):
    pivot = by_id[THOUGHT]
    name, arguments = expert_call(pivot)
    changed = arguments["thought"].replace("$375", "$608").replace("$299", "$522")
    assert changed != arguments["thought"]
    reward, info, _ = step(recorded_env, pivot, hermes(name, {**arguments, "thought": changed}))
    assert (reward, info["category"]) == (0.0, "argument_value_different"), info["detail"]
    assert step(recorded_env, pivot, pivot.expert)[0] == 1.0
