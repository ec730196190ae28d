"""PivotEnv's contract beyond check_env: fresh observations, every vector step scored, step never raises."""

from __future__ import annotations

import copy
import json
import logging
import timeit
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import pytest
from echo_domain import EchoEnv
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import AutoresetMode

from pivot_envs import Pivot, PivotEnv
from pivot_envs.checker import vandalise
from pivot_envs.env import Outcome, ParsedAction, json_safe
from pivot_envs.verifiers import Verdict

TOOL_USE = "pivot/tool-use-v0"
ECHO_ID = "pivot/echo-contract-test-v0"
if ECHO_ID not in gym.registry:
    gym.register(ECHO_ID, entry_point=EchoEnv)


def tool_use_env() -> PivotEnv:
    return gym.make(TOOL_USE).unwrapped


ENVS: dict[str, Callable[[], PivotEnv]] = {"echo": EchoEnv, "tool-use": tool_use_env}


def nested(depth: int, leaf: object = "x") -> dict:
    value: object = leaf
    for _ in range(depth):
        value = {"a": value}
    return value  # type: ignore[return-value]


# -- fresh observations ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ENVS)
def test_editing_a_reset_observation_changes_nothing_the_env_keeps(name: str) -> None:
    env = ENVS[name]()
    pivot = max(env.pivots, key=lambda p: len(p.messages) + len(p.tools))
    record = copy.deepcopy(pivot.to_dict())
    observation, info = env.reset(options={"pivot": pivot.id})
    vandalise(observation)
    vandalise(info)
    again, info = env.reset(options={"pivot": pivot.id})
    assert again == {"messages": record["messages"], "tools": record["tools"]}
    assert info["pivot_id"] == pivot.id and pivot.to_dict() == record


@pytest.mark.parametrize("name", ENVS)
def test_editing_a_step_observation_and_info_changes_nothing_the_env_keeps(name: str) -> None:
    env = ENVS[name]()
    pivot = next(p for p in env.pivots if p.expert.get("tool_calls"))
    record = copy.deepcopy(pivot.to_dict())
    env.reset(options={"pivot": pivot.id})
    first = env.step(pivot.expert)
    kept = copy.deepcopy(first)
    vandalise(first[0])
    vandalise(first[4])
    env.reset(options={"pivot": pivot.id})
    assert env.step(pivot.expert) == kept
    assert pivot.to_dict() == record


def test_editing_one_envs_observation_changes_nothing_another_env_sees() -> None:
    first, second = tool_use_env(), tool_use_env()
    assert first.pivots[0] is second.pivots[0]  # the bundled pivots are read once per process
    observation, _ = first.reset(options={"index": 0})
    vandalise(observation)
    assert second.reset(options={"index": 0})[0] == first.pivots[0].observation
    assert "injected" not in json.dumps(first.pivots[0].to_dict())


def test_the_observation_copy_costs_less_than_a_deepcopy() -> None:
    env = tool_use_env()
    pivot = max(env.pivots, key=lambda p: len(json.dumps(p.observation)))
    observation = pivot.observation
    ours = min(timeit.repeat(lambda: env._fresh_observation(pivot), number=20, repeat=5))
    deep = min(timeit.repeat(lambda: copy.deepcopy(observation), number=20, repeat=5))
    assert env._fresh_observation(pivot) == observation and env._fresh_observation(pivot) is not observation
    assert ours < deep, f"the env's copy {ours / 20 * 1e3:.3f} ms, deepcopy {deep / 20 * 1e3:.3f} ms"


def test_json_safe_copies_a_tool_result_faster_than_a_json_round_trip() -> None:
    # The walk shares the (immutable) strings; a round trip encodes and decodes every byte of them.
    messages = [
        {"role": "tool", "tool_call_id": "call_0", "name": "search", "content": "flight HAT001 " * 300}
    ]
    walk = min(timeit.repeat(lambda: json_safe(messages), number=200, repeat=5))
    trip = min(timeit.repeat(lambda: json.loads(json.dumps(messages)), number=200, repeat=5))
    assert json_safe(messages) == messages and json_safe(messages) is not messages
    assert walk < trip / 2, f"json_safe {walk / 200 * 1e6:.1f} us, a round trip {trip / 200 * 1e6:.1f} us"


# -- vector envs: every step is scored -------------------------------------------------------------


def test_pivot_envs_declare_same_step_autoreset_and_make_vec_uses_it() -> None:
    assert PivotEnv.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    envs = gym.make_vec(TOOL_USE, num_envs=2)
    try:
        assert envs.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    finally:
        envs.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_every_vector_step_scores_every_sub_env(mode: str) -> None:
    experts = {pivot.id: pivot.expert for pivot in tool_use_env().pivots}
    envs = gym.make_vec(TOOL_USE, num_envs=3, vectorization_mode=mode)
    scored, total = 0, 0.0
    try:
        _, infos = envs.reset(seed=1)
        for _ in range(4):
            actions = [experts[pivot_id] for pivot_id in infos["pivot_id"]]
            _, rewards, terminated, _, infos = envs.step(actions)
            assert all(terminated) and all(infos["_final_info"])
            scored += sum(1 for category in infos["final_info"]["category"] if category)
            total += float(np.sum(rewards))
    finally:
        envs.close()
    # Under gymnasium's own default (next-step autoreset) every second step is a reset: 6 and 6.0.
    assert (scored, total) == (12, 12.0)


def test_a_callers_own_vector_kwargs_win_over_the_default_autoreset() -> None:
    envs = gym.make_vec(
        TOOL_USE, num_envs=2, vectorization_mode="sync", vector_kwargs={"autoreset_mode": "NextStep"}
    )
    try:
        assert envs.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
    finally:
        envs.close()
    envs = gym.make_vec(
        TOOL_USE, num_envs=2, vectorization_mode="async", vector_kwargs={"shared_memory": False}
    )
    try:
        assert envs.shared_memory is False and envs.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    finally:
        envs.close()


def test_a_vector_env_spec_round_trips_through_json_with_its_autoreset_mode() -> None:
    envs = gym.make_vec(TOOL_USE, num_envs=2, vectorization_mode="sync")
    text = envs.spec.to_json()
    envs.close()
    rebuilt = gym.make_vec(EnvSpec.from_json(text))
    try:
        assert rebuilt.num_envs == 2 and rebuilt.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    finally:
        rebuilt.close()


def test_the_async_vector_env_carries_a_prefix_holding_a_lone_surrogate() -> None:
    pivot = Pivot(
        id="odd/1",
        domain="echo",
        messages=[{"role": "user", "content": "a \ud800 b"}],
        expert={"role": "assistant", "content": "ok"},
    )
    envs = gym.make_vec(ECHO_ID, num_envs=2, vectorization_mode="async", pivots=[pivot])
    try:
        observations, _ = envs.reset(seed=0)
        assert observations[0]["messages"] == pivot.messages
        _, rewards, _, _, _ = envs.step(["ok", "\udfff"])
        assert list(rewards) == [1.0, 0.0]
    finally:
        envs.close()


# -- step never raises ------------------------------------------------------------------------------

DEEP_ACTIONS = {
    "a dict": nested(10_000),
    "content": {"content": nested(10_000)},
    "tool-call arguments": {
        "tool_calls": [{"type": "function", "function": {"name": "x", "arguments": nested(10_000)}}]
    },
    "a list": [nested(10_000)],
}


@pytest.mark.parametrize("action", DEEP_ACTIONS, ids=str)
@pytest.mark.parametrize("name", ENVS)
def test_an_action_nested_ten_thousand_deep_scores_zero_and_valid(name: str, action: str) -> None:
    env = ENVS[name]()
    env.reset(options={"index": 0})
    observation, reward, terminated, _, info = env.step(DEEP_ACTIONS[action])
    assert (reward, terminated, info["valid"]) == (0.0, True, True)
    assert info["category"] and info["category"] != "env_error", info["detail"]
    json.dumps(info)
    json.dumps(observation)


class FaultyEnv(EchoEnv):
    """An env whose domain code fails at one stage (`fault`), as a bug would."""

    fault = ""

    def parse(self, action: object) -> ParsedAction:
        if self.fault == "parse":
            raise KeyError("boom in parse")
        return super().parse(action)

    def execute(self, pivot: Pivot, action: dict) -> Outcome:
        if self.fault == "execute":
            raise KeyError("boom in execute")
        return super().execute(pivot, action)


class FaultyVerifier:
    name = "faulty"

    def __init__(self, fault: str) -> None:
        self.fault = fault

    def verify(self, pivot: Pivot, action: dict, outcome: object = None) -> Verdict:
        if self.fault == "verify":
            raise KeyError("boom in verify")
        return Verdict(None, "no_reward")  # type: ignore[arg-type]


@pytest.mark.parametrize("fault", ["parse", "execute", "verify", "reward"])
def test_an_exception_in_the_domains_code_is_an_invalid_env_error_naming_it(
    fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    env = FaultyEnv(verifier=FaultyVerifier(fault))
    env.fault = fault
    env.reset(options={"index": 0})
    with caplog.at_level(logging.WARNING, logger="pivot_envs.env"):
        _, reward, terminated, _, info = env.step(env.pivots[0].expert)
    assert (reward, terminated, info["valid"], info["category"]) == (0.0, True, False, "env_error")
    stage = "verify" if fault == "reward" else fault
    error = "TypeError" if fault == "reward" else "KeyError"
    assert f"FaultyEnv.{stage} raised {error}" in info["detail"] and env.pivots[0].id in info["detail"]
    assert info["detail"] in caplog.text
    json.dumps(info)


def test_a_lone_surrogate_in_an_action_leaves_info_and_observation_utf8_encodable() -> None:
    env = EchoEnv()
    env.reset(options={"index": 0})
    call = {"id": "\udc00", "type": "function", "function": {"name": "f\udfff", "arguments": "{}"}}
    observation, reward, _, _, info = env.step({"content": "a \ud800 b", "tool_calls": [call]})
    assert reward == 0.0 and info["valid"] and info["category"] == "not_exact_match"
    assert info["parsed"]["content"] == "a \ufffd b"
    assert (
        info["parsed"]["tool_calls"][0]["id"] == "\ufffd"
        and info["parsed"]["tool_calls"][0]["function"]["name"] == "f\ufffd"
    )
    json.dumps(info, ensure_ascii=False).encode("utf-8")
    json.dumps(observation, ensure_ascii=False).encode("utf-8")


def test_values_json_cannot_hold_are_converted_in_info() -> None:
    class OddOutputEnv(EchoEnv):
        def execute(self, pivot: Pivot, action: dict) -> Outcome:
            return Outcome(
                output={
                    "tuple": (1, 2),
                    "numpy": np.int64(7),
                    "array": np.arange(3),
                    "bytes": b"caf\xc3\xa9 \xff",
                    "set": {"only"},
                    ("a", 1): "a key JSON cannot hold",
                    2: "an int key",
                    "object": object(),
                    "deep": nested(200),
                }
            )

    env = OddOutputEnv()
    env.reset(options={"index": 0})
    output = env.step("anything")[4]["output"]
    assert json.loads(json.dumps(output)) == json.loads(json.dumps(output))  # encodable, plain data
    assert (output["tuple"], output["numpy"], output["array"], output["set"]) == (
        [1, 2],
        7,
        [0, 1, 2],
        ["only"],
    )
    assert output["bytes"] == "café \ufffd" and output[2] == "an int key" and output["('a', 1)"]
    assert output["object"].startswith("<object object at")
    assert len(json.dumps(output["deep"])) < 2_000  # cut at 64 levels, shown as bounded text


def test_a_malformed_action_scores_zero_as_valid_not_as_an_env_error() -> None:
    env = tool_use_env()
    for action in (
        None,
        3.5,
        b"bytes",
        ["a", "list"],
        {"tool_calls": "nope"},
        {"tool_calls": [None]},
        object(),
    ):
        env.reset(options={"index": 0})
        _, reward, _, _, info = env.step(action)
        assert (reward, info["valid"]) == (0.0, True) and info["category"] == "unparseable", (action, info)
        json.dumps(info)


@pytest.mark.parametrize(
    "action",
    [
        {"content": b"bytes"},
        {"content": [{"text": 3}]},
        {"tool_calls": 5},
        {"tool_calls": [{"function": {"name": 1, "arguments": "{}"}}]},
        {"tool_calls": [{"function": {"name": "f", "arguments": {"a": b"not JSON"}}}]},
        {"tool_calls": [{"function": {"name": "f", "arguments": [1, 2]}}]},
    ],
    ids=[
        "bytes content",
        "non-text part",
        "tool_calls not a list",
        "nameless call",
        "non-JSON arguments",
        "list arguments",
    ],
)
def test_a_message_dict_not_in_chat_form_is_unparseable_in_the_base_env(action: dict) -> None:
    env = EchoEnv()
    env.reset(options={"index": 0})
    _, reward, _, _, info = env.step(action)
    assert (reward, info["valid"], info["category"]) == (0.0, True, "unparseable") and info["parsed"] is None
    assert info["detail"]


def test_a_caller_that_opts_out_of_copies_gets_the_pivots_own_messages_and_the_same_verdicts():
    copying = gym.make("pivot/tool-use-v0").unwrapped
    sharing = gym.make("pivot/tool-use-v0").unwrapped
    sharing.copy_observations = False
    for index in (0, 5, 17):
        first, _ = copying.reset(options={"index": index})
        second, _ = sharing.reset(options={"index": index})
        assert first == second and first["tools"] is not copying.pivot.tools
        assert second["tools"] is sharing.pivot.tools and second["messages"][0] is sharing.pivot.messages[0]
        expert = copying.pivot.expert
        outcome_copying, outcome_sharing = copying.step(expert), sharing.step(expert)
        assert outcome_copying[0] == outcome_sharing[0] and outcome_copying[1:4] == outcome_sharing[1:4] == (
            1.0,
            True,
            False,
        )
