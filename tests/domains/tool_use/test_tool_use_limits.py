"""Hostile actions on pivot/tool-use-v0: every step stays bounded in time, memory and fan-out.

Each case is an action a policy (or a user) could send: the same call fifty times, a megabyte
string, nesting deeper than the decoder allows, a turn whose results are huge. The limits are
`ToolUseLimits` (domains/tool_use/limits.py); the HTTP backend's own cases are in
test_tool_use_http.py.
"""

from __future__ import annotations

import json
import time

import gymnasium as gym
import pytest
from tool_use_helpers import appended_tool_bytes, expert_call, first, hermes, hermes_turn, measured, step

import pivot_envs  # noqa: F401
from pivot_envs.config import ConfigError, UnknownOptionError
from pivot_envs.domains.tool_use.airline import State, bundled_database, call_tool
from pivot_envs.domains.tool_use.backends import AirlineBackend
from pivot_envs.domains.tool_use.limits import ToolUseLimits, bounded_outputs
from pivot_envs.env import InfrastructureError

MB = 1 << 20
MARKER = 64  # a cut marker ("\n[... N bytes of output cut ...]\n") is shorter than this
# The largest airline result there is: a one-stop search, 25,028 bytes.
ONESTOP = ("search_onestop_flight", {"origin": "ATL", "destination": "PHX", "date": "2024-05-20"})


def limited_env(**limits):
    return gym.make("pivot/tool-use-v0", backend="tau-airline", limits=limits).unwrapped


def assert_refused_unrun(result: tuple, pivot, category: str) -> dict:
    """`step`'s result is a valid step scored 0 as `category` whose calls never ran (no output, no tool
    result); its info."""
    reward, info, observation = result
    assert (reward, info["category"], info["valid"], info["output"]) == (0.0, category, True, None)
    assert observation["messages"][len(pivot.messages) + 1 :] == []
    return info


def test_fifty_identical_cancels_are_refused_as_too_many_tool_calls_and_never_run(airline_env, pivots):
    pivot = first(pivots, "cancel_reservation")
    action = hermes_turn([expert_call(pivot)] * 50)
    airline_env.reset(options={"pivot": pivot.id})  # loads the database and the pivot's state, once
    result, seconds, peak = measured(step, airline_env, pivot, action)
    info = assert_refused_unrun(result, pivot, "too_many_tool_calls")
    assert "50 tool calls" in info["detail"] and "at most 16" in info["detail"]
    assert seconds < 2 and peak < 16 * MB


def test_fifty_cancels_under_a_raised_call_limit_stay_small_since_a_cancel_refunds_once(pivots):
    # tau-bench refunds every history entry, refunds included, on each call: the history doubled
    # per call and this step grew to 24 GB. Here the second cancel changes nothing.
    pivot = first(pivots, "cancel_reservation")
    env = limited_env(max_calls=50)
    env.reset(options={"pivot": pivot.id})
    (reward, info, observation), seconds, peak = measured(
        step, env, pivot, hermes_turn([expert_call(pivot)] * 50)
    )
    assert (reward, info["category"], info["valid"]) == (0.0, "wrong_call_count", True)
    assert len(info["output"]) == 50 and len(set(info["output"])) == 1  # every cancel answers the same
    assert max(appended_tool_bytes(observation, pivot)) < 4096
    assert seconds < 5 and peak < 32 * MB


def test_a_turn_may_make_as_many_calls_as_its_expert_even_past_max_calls(shared_data):
    path = shared_data / "nemo_gym" / "single_step_tool_use_parallel_pivots.jsonl"
    env = gym.make("pivot/tool-use-v0", pivots=str(path), limits={"max_calls": 1}).unwrapped
    pivot = max(env.pivots, key=lambda p: len(p.expert.get("tool_calls") or []))
    expert_calls = len(pivot.expert["tool_calls"])
    assert expert_calls > 1
    reward, info, _ = step(env, pivot, pivot.expert)
    assert (reward, info["category"]) == (1.0, "correct")
    one_more = {**pivot.expert, "tool_calls": pivot.expert["tool_calls"] + pivot.expert["tool_calls"][:1]}
    reward, info, _ = step(env, pivot, one_more)
    assert (reward, info["category"], info["valid"]) == (0.0, "too_many_tool_calls", True)


def test_each_tool_result_is_cut_to_output_bytes_keeping_head_and_tail_around_a_marker(call_pivots):
    full = call_tool(State(bundled_database()), *ONESTOP)
    assert len(full.encode()) == 25028
    env = limited_env(output_bytes=1000)
    _, info, observation = step(env, call_pivots[0], hermes(*ONESTOP))
    kept = info["output"]
    assert kept == observation["messages"][-1]["content"]
    assert kept.startswith(full[:500]) and kept.endswith(full[-500:])
    assert "[... 24028 bytes of output cut ...]" in kept and len(kept.encode()) < 1000 + MARKER


def test_the_results_of_one_step_are_bounded_in_total_later_ones_cut_to_what_is_left(call_pivots):
    limits = ToolUseLimits()
    full = call_tool(State(bundled_database()), *ONESTOP)
    pivot = call_pivots[0]
    (_, info, observation), seconds, peak = measured(step, limited_env(), pivot, hermes_turn([ONESTOP] * 16))
    sizes = appended_tool_bytes(observation, pivot)
    assert len(sizes) == 16 and sum(sizes) <= limits.observation_bytes + 16 * MARKER
    whole = limits.observation_bytes // 25028  # 5 results fit whole in 128 KB
    assert info["output"][:whole] == [full] * whole
    left = limits.observation_bytes - whole * 25028
    assert f"[... {25028 - left} bytes of output cut ...]" in info["output"][whole]
    assert info["output"][-1] == "\n[... 25028 bytes of output cut ...]\n"  # no budget left: the marker alone
    assert seconds < 5 and peak < 16 * MB


def test_results_are_measured_in_utf8_bytes_not_characters():
    limits = ToolUseLimits(output_bytes=100)
    ascii_text, accented = "a" * 100, "é" * 60  # 100 bytes; 60 characters but 120 bytes
    kept_ascii, kept_accented = bounded_outputs([ascii_text, accented], limits)
    assert kept_ascii == ascii_text
    assert kept_accented == "é" * 25 + "\n[... 20 bytes of output cut ...]\n" + "é" * 25


@pytest.mark.parametrize("backend", ["tau-airline", "recorded"])
@pytest.mark.parametrize(
    "name, arguments",
    [
        ("think", {"thought": "word " * (MB // 5)}),
        ("get_user_details", {"user_id": "x" * MB}),
        ("calculate", {"expression": "1+" * (MB // 2) + "1"}),
    ],
    ids=["free-text", "id", "expression"],
)
def test_a_megabyte_string_argument_is_answered_in_bounded_time_and_memory(pivots, backend, name, arguments):
    # The argument limit lifted, so the tools and the verifier see the megabyte.
    env = gym.make("pivot/tool-use-v0", backend=backend, limits={"argument_bytes": 2 * MB}).unwrapped
    pivot = first(pivots, name)
    (_, info, observation), seconds, peak = measured(step, env, pivot, hermes(name, arguments))
    assert info["valid"] and info["category"] in ("correct", "argument_value_different")
    assert appended_tool_bytes(observation, pivot)[0] <= ToolUseLimits().output_bytes
    # Linear in the input: about 1 s and 20 MB traced for the free text (tokenized for similarity).
    assert seconds < 10 and peak < 64 * MB


@pytest.mark.parametrize("backend", ["tau-airline", "recorded"])
def test_a_turn_with_more_argument_bytes_than_the_limit_scores_zero_and_runs_nothing(pivots, backend):
    # A `think` thought has no effect, so any thought had the expert call's effect: a megabyte one too.
    env = gym.make("pivot/tool-use-v0", backend=backend).unwrapped
    pivot = first(pivots, "think")
    result, seconds, peak = measured(step, env, pivot, hermes("think", {"thought": "word " * (MB // 5)}))
    info = assert_refused_unrun(result, pivot, "arguments_too_large")
    assert "at most 65536" in info["detail"] and "ToolUseLimits.argument_bytes" in info["detail"]
    assert seconds < 5 and peak < 64 * MB
    assert (
        step(env, pivot, hermes("think", {"thought": "word " * 10_000}))[1]["category"]
        != "arguments_too_large"
    )


def test_the_argument_limit_counts_utf8_bytes_and_lets_the_experts_own_turn_through(pivots):
    # {"thought": "..."} is 15 bytes of JSON around the text; an "é" is 2 bytes in UTF-8.
    env = gym.make("pivot/tool-use-v0", backend="recorded", limits={"argument_bytes": 31}).unwrapped
    pivot = first(pivots, "book_reservation")  # its arguments hold far more than 31 bytes
    assert step(env, pivot, pivot.expert)[0] == 1.0
    message = next(p for p in pivots if not p.expert.get("tool_calls"))  # no expert arguments to allow
    for thought, refused in (("é" * 8, False), ("é" * 9, True), ("e" * 16, False), ("e" * 17, True)):
        category = step(env, message, hermes("think", {"thought": thought}))[1]["category"]
        assert (category == "arguments_too_large") is refused, thought


@pytest.mark.parametrize("depth", [100, 800, 100_000])
@pytest.mark.parametrize("backend", ["tau-airline", "recorded"])
def test_arguments_nested_at_any_depth_score_without_raising(pivots, backend, depth):
    env = gym.make("pivot/tool-use-v0", backend=backend).unwrapped
    pivot = first(pivots, "book_reservation")
    name, arguments = expert_call(pivot)
    nested = json.dumps({"name": name, "arguments": {**arguments, "flights": "@"}}).replace(
        '"@"', "[" * depth + "]" * depth
    )
    (reward, info, _), seconds, peak = measured(step, env, pivot, nested)
    assert reward == 0.0 and info["valid"] and seconds < 5 and peak < 16 * MB
    if depth == 100_000:
        assert info["category"] == "unparseable"  # deeper than the JSON decoder goes
    elif backend == "tau-airline":
        assert info["output"].startswith("Error: book_reservation failed on its arguments")


class _SlowBackend:
    """A user's backend without a deadline keyword: the env can only check its time afterwards."""

    name = "slow"

    def prepare(self, pivot):
        return None

    def run(self, pivot, calls):
        time.sleep(0.3)
        return ["done"] * len(calls)

    def equivalence(self, pivot):
        return None


class _DeadlineBackend(_SlowBackend):
    """A user's backend that takes the step's deadline."""

    name = "deadline-aware"

    def run(self, pivot, calls, deadline):
        self.left = deadline - time.monotonic()
        return ["done"] * len(calls)


def test_a_backend_slower_than_the_step_deadline_makes_the_sample_invalid(call_pivots):
    env = gym.make("pivot/tool-use-v0", backend=_SlowBackend(), limits={"step_timeout_s": 0.1}).unwrapped
    reward, info, _ = step(env, call_pivots[0], call_pivots[0].expert)
    assert (reward, info["valid"], info["category"]) == (0.0, False, "infrastructure_error")
    assert "step_timeout_s" in info["detail"] and call_pivots[0].id in info["detail"]


def test_a_backend_that_takes_a_deadline_is_given_the_steps(call_pivots):
    backend = _DeadlineBackend()
    env = gym.make("pivot/tool-use-v0", backend=backend, limits={"step_timeout_s": 7}).unwrapped
    _, info, _ = step(env, call_pivots[0], call_pivots[0].expert)
    assert info["valid"] and 6 < backend.left <= 7


def test_the_airline_backend_runs_no_call_past_the_deadline(pivots):
    pivot = first(pivots, "cancel_reservation")
    with pytest.raises(InfrastructureError, match=f"pivot {pivot.id}: .*deadline passed after 0 of 2"):
        AirlineBackend().run(pivot, [expert_call(pivot)] * 2, deadline=time.monotonic() - 1)


def test_limits_must_be_positive_and_known_by_name():
    with pytest.raises(ConfigError, match=r"ToolUseLimits.max_calls = 0: must be >= 1"):
        ToolUseLimits(max_calls=0)
    with pytest.raises(ConfigError, match=r"ToolUseLimits.step_timeout_s = 0: must be in \(0"):
        ToolUseLimits(step_timeout_s=0)
    with pytest.raises(
        UnknownOptionError, match="unknown tool-use limit 'max_call'; did you mean 'max_calls'"
    ):
        gym.make("pivot/tool-use-v0", limits={"max_call": 3})
    assert gym.make("pivot/tool-use-v0", limits={"output_bytes": 10}).unwrapped.limits.output_bytes == 10
