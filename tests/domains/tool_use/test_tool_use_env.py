"""pivot/tool-use-v0 as a gymnasium env: the contract, the bundled sample, pivot files, user backends."""

from __future__ import annotations

import dataclasses
import gc
import json

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from tool_use_helpers import hermes, step

import pivot_envs  # noqa: F401
from pivot_envs.domains.tool_use import DOMAIN, ToolUseEnv
from pivot_envs.domains.tool_use.airline import AirlineDatabase, AirlineDatabaseError
from pivot_envs.domains.tool_use.backends import UNAVAILABLE
from pivot_envs.errors import PivotSetError, UnknownNameError


def test_the_env_passes_gymnasiums_checker():
    check_env(gym.make("pivot/tool-use-v0").unwrapped, skip_render_check=True)


def test_the_domain_spec_names_the_env_and_its_verifiers():
    assert DOMAIN.name == "tool-use" and DOMAIN.env_class is ToolUseEnv
    assert set(DOMAIN.verifiers) == set(ToolUseEnv.verifiers) == {"functional", "strict"}


def test_the_bundled_sample_is_tau_bench_airline_with_recorded_outputs(pivots):
    assert len(pivots) > 300
    assert all(p.context["backend"] == "tau-airline" and p.domain == "tool-use" for p in pivots)
    assert all(p.source["reward"] == 1.0 for p in pivots)
    calls = [p for p in pivots if p.expert.get("tool_calls")]
    assert calls and all(len(p.context["expert_tool_outputs"]) == len(p.expert["tool_calls"]) for p in calls)
    assert {t["function"]["name"] for t in pivots[0].tools} >= {"book_reservation", "think"}


@pytest.mark.parametrize("verifier", ["functional", "strict"])
def test_the_expert_action_scores_one_on_every_bundled_pivot(pivots, verifier):
    env = gym.make("pivot/tool-use-v0", verifier=verifier)
    for index in range(len(pivots)):
        env.reset(options={"index": index})
        _, reward, terminated, _, info = env.step(pivots[index].expert)
        assert (reward, terminated, info["valid"]) == (1.0, True, True), (pivots[index].id, info)


def test_raw_completion_text_and_server_message_dicts_both_work(recorded_env, call_pivots):
    pivot = call_pivots[0]
    function = pivot.expert["tool_calls"][0]["function"]
    text = f"<think>let me see</think>{hermes(function['name'], json.loads(function['arguments']))}"
    served = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "x", "type": "function", "function": dict(function)}],
    }
    for action in (text, served):
        reward, info, observation = step(recorded_env, pivot, action)
        assert reward == 1.0 and info["output"] == pivot.context["expert_tool_outputs"][0]
        assert observation["messages"][: len(pivot.messages)] == pivot.messages
        assert observation["messages"][-1]["role"] == "tool"


def test_unparseable_output_scores_zero_and_does_not_raise(recorded_env, pivots):
    reward, info, observation = step(recorded_env, pivots[0], '<tool_call>{"name": </tool_call>')
    assert (reward, info["category"], info["valid"], info["parsed"]) == (0.0, "unparseable", True, None)
    assert observation["messages"][-1] == {"role": "assistant", "content": '<tool_call>{"name": </tool_call>'}


def test_the_recorded_backend_reports_unavailable_for_a_call_it_has_no_recording_of(
    recorded_env, call_pivots
):
    reward, info, observation = step(recorded_env, call_pivots[0], hermes("list_all_airports", {}))
    assert (reward, info["valid"], info["output"]) == (0.0, True, UNAVAILABLE)


def test_nemo_gym_pivot_rows_load_and_run_on_the_recorded_backend(shared_data):
    path = shared_data / "nemo_gym" / "single_step_tool_use_pivots.jsonl"
    env = gym.make("pivot/tool-use-v0", pivots=str(path)).unwrapped
    assert len(env.pivots) == 5
    for index, pivot in enumerate(env.pivots):
        env.reset(options={"index": index})
        _, reward, _, _, info = env.step(pivot.expert)
        assert reward == 1.0 and info["valid"]
        if pivot.expert.get("tool_calls"):
            assert info["output"] == UNAVAILABLE


def test_an_unknown_backend_is_refused_by_name():
    with pytest.raises(
        UnknownNameError, match="unknown tool backend 'sql' \\(choose from http, recorded, tau-airline\\)"
    ):
        gym.make("pivot/tool-use-v0", backend="sql")


def test_a_pivot_naming_an_unknown_backend_is_a_pivot_set_error_naming_the_pivot(pivots):
    pivot = dataclasses.replace(pivots[0], context={**pivots[0].context, "backend": "recordd"})
    env = ToolUseEnv([pivot])
    with pytest.raises(
        PivotSetError, match=f"pivot {pivot.id}: unknown tool backend 'recordd'; did you mean 'recorded'"
    ):
        env.reset(options={"pivot": pivot.id})


def test_an_airline_database_directory_missing_a_table_is_a_typed_file_not_found_error(tmp_path):
    with pytest.raises(
        AirlineDatabaseError, match=f"airline database: no flights.json\\(.gz\\) in {tmp_path}"
    ) as raised:
        AirlineDatabase.from_directory(tmp_path)
    assert isinstance(raised.value, FileNotFoundError)


def test_the_env_works_under_make_vec(pivots):
    envs = gym.make_vec("pivot/tool-use-v0", num_envs=2, vectorization_mode="sync")
    _, infos = envs.reset(options={"index": 0})
    assert list(infos["pivot_id"]) == [pivots[0].id] * 2
    _, rewards, terminated, _, infos = envs.step((pivots[0].expert, "I like turtles."))
    assert list(rewards) == [1.0, 0.0] and all(terminated)
    # Same-step autoreset: the scored step's infos are final_info, the new episode's are infos.
    assert list(infos["final_info"]["category"]) == ["correct", "message_content_different"]
    envs.close()


def test_the_verifier_http_and_limit_options_become_cli_flags():
    from pivot_envs.config import add_config, command_parser
    from pivot_envs.domains.tool_use.backends import HttpBackendConfig
    from pivot_envs.domains.tool_use.limits import ToolUseLimits
    from pivot_envs.domains.tool_use.verifier import FunctionalConfig

    parser = command_parser(prog="tool-use")
    add_config(parser, FunctionalConfig, "verifier")
    add_config(parser, HttpBackendConfig, "http")
    add_config(parser, ToolUseLimits, "limits")
    args = parser.parse_args(
        [
            "--mode",
            "f1",
            "--message-precision",
            "0.7",
            "--unordered-arrays",
            "flights",
            "--url",
            "http://h/x",
            "--max-response-bytes",
            "4096",
            "--max-calls",
            "4",
            "--step-timeout-s",
            "2.5",
        ]
    )
    assert (args.verifier.mode, args.verifier.message_precision, args.verifier.unordered_arrays) == (
        "f1",
        0.7,
        ("flights",),
    )
    assert (args.http.url, args.http.max_response_bytes) == ("http://h/x", 4096)
    assert (args.limits.max_calls, args.limits.step_timeout_s, args.limits.output_bytes) == (4, 2.5, 32768)


class _WeatherBackend:
    """A user's own backend: any object with name, prepare, run and equivalence."""

    name = "weather"

    def prepare(self, pivot):
        return None

    def run(self, pivot, calls):
        return [json.dumps({"city": arguments.get("city"), "celsius": 21}) for _, arguments in calls]

    def equivalence(self, pivot):
        # Two calls are equivalent when they ask about the same city, whatever its spelling.
        return lambda index, name, arguments: str(arguments.get("city", "")).strip().lower() == "paris"


def test_a_backend_object_executes_calls_and_can_decide_equivalence(shared_data):
    path = shared_data / "nemo_gym" / "single_step_tool_use_parallel_pivots.jsonl"
    env = gym.make("pivot/tool-use-v0", pivots=str(path), backend=_WeatherBackend()).unwrapped
    pivot = next(p for p in env.pivots if len(p.expert.get("tool_calls") or []) == 1)
    reward, info, observation = step(env, pivot, hermes("get_weather", {"city": "PARIS "}))
    assert reward == 1.0 and "execution equivalence" in info["detail"]
    assert json.loads(observation["messages"][-1]["content"]) == {"city": "PARIS ", "celsius": 21}


@pytest.mark.parametrize("copies", [True, False], ids=["copies", "no copies"])
def test_steady_stepping_leaves_nothing_for_the_garbage_collector(call_pivots, copies):
    # What outlives a step is promoted through the GC generations until the collector walks the
    # whole heap (the airline database included): a cost that grows with everything else loaded.
    env = gym.make("pivot/tool-use-v0", backend="recorded")
    env.unwrapped.copy_observations = copies
    experts = [(pivot.id, pivot.expert) for pivot in call_pivots[:50]]

    def steps(times: int) -> int:
        """Tracked objects made and not freed by `times` rounds over the experts."""
        before = gc.get_count()[0]
        for pivot_id, expert in experts * times:
            env.reset(options={"pivot": pivot_id})
            env.step(expert)
        return gc.get_count()[0] - before

    steps(6)  # warm: tool lists compiled, caches filled
    gc.collect()
    gc.disable()
    try:
        steps(1)
        left = steps(20)
    finally:
        gc.enable()
    assert left < 50, f"{left} objects outlived 1000 steps"


def test_short_bundled_pivots_keep_the_experts_tools_and_a_one_line_policy_prompt() -> None:
    from pivot_envs.chat import tool_name
    from pivot_envs.domains.tool_use.env import bundled_pivots, short_bundled_pivots

    short = short_bundled_pivots(3)
    by_id = {pivot.id: pivot for pivot in bundled_pivots()}
    assert len(short) == 3
    for pivot in short:
        called = {call["function"]["name"] for call in pivot.expert["tool_calls"]}
        assert {tool_name(tool) for tool in pivot.tools} == called
        assert "\n" not in pivot.messages[0]["content"] and len(pivot.messages) <= 8
        assert pivot.messages[1:] == by_id[pivot.id].messages[1:]
        assert len(by_id[pivot.id].messages[0]["content"]) > len(pivot.messages[0]["content"])
