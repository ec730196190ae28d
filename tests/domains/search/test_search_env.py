"""SearchEnv: reset replays the prefix (executed, stale, recorded), step runs the sampled calls from
the prefix state, the bundled sample and NeMo-Gym task rows are served."""

from __future__ import annotations

import copy
import dataclasses
import json

import gymnasium as gym
import pytest

from pivot_envs.config import ConfigError, UnknownOptionError
from pivot_envs.domains.search import DOMAIN, SearchEnv
from pivot_envs.domains.search.env import bundled_pivots, replay_prefix
from pivot_envs.domains.search.verifier import turn_kind

SEARCH = '<tool_call>{"name": "search", "arguments": {"query": "Giuseppe Verdi"}}</tool_call>'


def call(name: str, **arguments) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"function": {"name": name, "arguments": json.dumps(arguments)}}],
    }


@pytest.fixture
def env(search_pivots):
    made = gym.make("pivot/search-v0", pivots=search_pivots)
    yield made.unwrapped
    made.close()


def test_the_domain_spec_names_the_env_and_its_verifier_levels():
    assert DOMAIN.name == "search" and DOMAIN.env_class is SearchEnv
    assert set(DOMAIN.verifiers) == {"retrieval", "args", "name", "strict"}


def test_reset_replays_the_prefix_into_the_browse_state(env):
    _, info = env.reset(options={"pivot": "verdi/t3"})
    assert info["replay"] == "executed" and "stale" not in info
    state = env.replay.state
    assert state.opened == ["La_traviata"] and state.current == "La_traviata"
    assert "Giuseppe_Verdi" in state.seen and "La_boh\u00e8me" in state.seen
    assert env.replay.evidence == {"La_traviata", "Giuseppe_Verdi"}


def test_the_replay_runs_once_per_pivot_and_is_reused_by_later_resets(env):
    env.reset(options={"pivot": "verdi/t2"})
    first = env.replay
    env.reset(options={"pivot": "verdi/t0"})
    env.reset(options={"pivot": "verdi/t2"})
    assert env.replay is first


def test_a_replay_continued_from_the_previous_turn_equals_a_fresh_replay(env, engine, search_pivots):
    for pivot in search_pivots:  # in order: each turn continues from the one before
        env.reset(options={"pivot": pivot.id})
        fresh = replay_prefix(pivot, engine)
        assert (env.replay.state, env.replay.expert, env.replay.stale) == (
            fresh.state,
            fresh.expert,
            fresh.stale,
        )


def test_a_turn_after_a_stale_one_is_stale_too(by_id):
    pivots = [copy.deepcopy(by_id["verdi/t2"]), copy.deepcopy(by_id["verdi/t3"])]
    for pivot in pivots:
        tool = next(m for m in pivot.messages if m["role"] == "tool")
        tool["content"] += " (edited)"
    env = gym.make("pivot/search-v0", pivots=pivots).unwrapped
    assert [row["replay"] for row in env.replay_report()] == ["stale", "stale"]


def test_step_returns_the_prefix_the_action_and_one_tool_message_per_call(env, by_id):
    observation, _ = env.reset(options={"pivot": "verdi/t2"})
    after, reward, terminated, truncated, info = env.step(SEARCH)
    assert after["messages"][: len(observation["messages"])] == observation["messages"]
    action, result = after["messages"][-2:]
    assert action["tool_calls"][0]["function"]["name"] == "search"
    assert result["role"] == "tool" and result["tool_call_id"] == action["tool_calls"][0]["id"]
    assert (
        result["content"] == info["output"]
        and "[1] Giuseppe Verdi (docid: Giuseppe_Verdi" in result["content"]
    )
    assert (reward, terminated, truncated, info["replay"], info["valid"]) == (
        1.0,
        True,
        False,
        "executed",
        True,
    )


def test_a_step_does_not_change_the_prefix_state_the_next_sample_starts_from(env):
    env.reset(options={"pivot": "verdi/t1"})
    before = copy.deepcopy(env.replay.state)
    env.step(call("get_document", docid="Opera"))
    env.reset(options={"pivot": "verdi/t1"})
    assert env.replay.state == before


def test_several_calls_in_one_turn_each_get_a_result_in_order(env):
    env.reset(options={"pivot": "verdi/t0"})
    action = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"function": {"name": "search", "arguments": {"query": "Busseto"}}},
            {"function": {"name": "get_document", "arguments": {"docid": "Giuseppe_Verdi"}}},
        ],
    }
    observation, reward, *_, info = env.step(action)
    assert [m["role"] for m in observation["messages"][-3:]] == ["assistant", "tool", "tool"]
    assert len(info["output"]) == 2 and info["output"][1].startswith("Giuseppe Verdi (docid: Giuseppe_Verdi")
    assert info["category"] == "wrong_kind"  # the expert searched; this turn also opened a document


def test_more_calls_than_the_limit_score_zero_and_run_nothing(search_pivots):
    env = gym.make("pivot/search-v0", pivots=search_pivots, limits={"max_calls": 2})
    env.reset(options={"pivot": "verdi/t0"})
    calls = [{"function": {"name": "search", "arguments": {"query": f"opera {i}"}}} for i in range(3)]
    observation, reward, *_, info = env.step({"role": "assistant", "content": None, "tool_calls": calls})
    assert (reward, info["category"], info["valid"], info["output"]) == (
        0.0,
        "too_many_tool_calls",
        True,
        None,
    )
    assert observation["messages"][-1]["role"] == "assistant"
    env.close()


def test_an_unknown_limit_is_refused_by_name(search_pivots):
    with pytest.raises(UnknownOptionError, match="max_call"):
        gym.make("pivot/search-v0", pivots=search_pivots, limits={"max_call": 2})


def test_k_sets_the_results_per_search_of_a_step(search_pivots):
    env = gym.make("pivot/search-v0", pivots=search_pivots, k=2)
    env.reset(options={"pivot": "verdi/t0"})
    output = env.step(call("search", query="opera"))[4]["output"]
    assert "[2] " in output and "[3] " not in output
    env.close()


def test_a_document_is_cut_at_the_document_chars_limit_with_a_marker(search_pivots):
    env = gym.make("pivot/search-v0", pivots=search_pivots, limits={"document_chars": 100})
    env.reset(options={"pivot": "verdi/t3"})
    output = env.step(call("get_document", docid="Giuseppe_Verdi"))[4]["output"]
    assert "more characters]" in output and len(output) < 300
    env.close()


def test_a_prefix_whose_recorded_output_differs_is_stale_reported_and_every_step_invalid(by_id):
    pivot = copy.deepcopy(by_id["verdi/t2"])
    tool = next(m for m in pivot.messages if m["role"] == "tool")
    tool["content"] = tool["content"].replace("La traviata", "La Traviata", 1)
    env = gym.make("pivot/search-v0", pivots=[pivot])
    _, info = env.reset(options={"pivot": pivot.id})
    assert info["replay"] == "stale"
    assert info["stale"]["message"] == 2 and info["stale"]["tool"] == "search"
    assert "La Traviata" in info["stale"]["recorded"] and "La traviata" in info["stale"]["replayed"]
    _, reward, *_, step_info = env.step(pivot.expert)
    assert (reward, step_info["valid"], step_info["category"]) == (0.0, False, "stale_pivot")
    assert "stale" in step_info["detail"]
    assert env.unwrapped.replay_report() == [{"pivot": pivot.id, "replay": "stale", "stale": info["stale"]}]
    env.close()


def test_a_pivot_recorded_on_another_corpus_runs_with_its_recorded_outputs(by_id):
    pivots = [
        dataclasses.replace(by_id[i], context={**by_id[i].context, "corpus_id": "another"})
        for i in ("verdi/t0", "verdi/t4")
    ]
    env = gym.make("pivot/search-v0", pivots=pivots)
    _, info = env.reset(options={"pivot": "verdi/t0"})
    assert info["replay"] == "recorded" and env.unwrapped.engine is None
    observation, reward, *_, info = env.step(call("search", query="La traviata  OPERA composer"))
    # Nothing runs: no tool message, and the call is judged by its arguments.
    assert observation["messages"][-1]["role"] == "assistant" and info["output"] is None
    assert (reward, info["category"], info["replay"]) == (1.0, "same_arguments", "recorded")
    env.reset(options={"pivot": "verdi/t4"})
    assert env.step("Answer: Busseto")[1] == 1.0
    env.close()


def test_a_missing_index_makes_steps_invalid_never_an_exception(search_pivots, tmp_path):
    env = gym.make("pivot/search-v0", pivots=search_pivots, engine=str(tmp_path / "gone.sqlite"))
    _, info = env.reset(options={"pivot": "verdi/t0"})
    assert info["replay"] == "failed" and "gone.sqlite" in info["engine_error"]
    _, reward, *_, info = env.step(SEARCH)
    assert (reward, info["valid"], info["category"]) == (0.0, False, "infrastructure_error")
    assert "no such file" in info["detail"]
    env.close()


def test_an_engine_spec_of_the_wrong_kind_is_a_clear_error_at_reset(search_pivots):
    env = gym.make("pivot/search-v0", pivots=search_pivots, engine="corpus.txt")
    with pytest.raises(ValueError, match="corpus.txt"):
        env.reset(options={"pivot": "verdi/t0"})
    env.close()


def test_gym_make_with_no_arguments_serves_the_bundled_sample():
    env = gym.make("pivot/search-v0")
    pivots = env.unwrapped.pivots
    assert len(pivots) >= 150 and {turn_kind(p.expert) for p in pivots} == {"search", "open", "answer"}
    _, info = env.reset(seed=3)
    assert info["replay"] == "executed"
    env.close()


def test_every_bundled_pivot_replays_exactly_and_its_expert_scores_one():
    env = gym.make("pivot/search-v0").unwrapped
    report = env.replay_report()
    assert {row["replay"] for row in report} == {"executed"}, [
        row for row in report if row["replay"] != "executed"
    ][:3]
    for pivot in bundled_pivots():
        env.reset(options={"pivot": pivot.id})
        _, reward, *_, info = env.step(pivot.expert)
        assert (reward, info["valid"], info["strict_reward"]) == (1.0, True, 1.0), (
            pivot.id,
            info["category"],
            info["detail"],
        )
    env.close()


def test_nemo_gym_browsecomp_rows_are_answer_pivots_and_a_correct_answer_scores_one(shared_data):
    path = shared_data / "nemo_gym" / "browsecomp_tasks.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    env = gym.make("pivot/search-v0", pivots=str(path))
    pivots = env.unwrapped.pivots
    assert len(pivots) == len(rows) == 5 and all(p.domain == "search" for p in pivots)
    for pivot, row in zip(pivots, rows):
        assert [m["role"] for m in pivot.messages] == ["system", "user"]
        assert {tool["function"]["name"] for tool in pivot.tools} == {"search", "browse"}
        observation, info = env.reset(options={"pivot": pivot.id})
        assert info["replay"] == "recorded"
        answer = f"Explanation: I searched.\nExact Answer: {row['ground_truth'].upper()}\nConfidence: 70%"
        _, reward, *_, info = env.step(answer)
        assert (reward, info["category"], info["valid"]) == (1.0, "correct_answer", True)
        env.reset(options={"pivot": pivot.id})
        assert env.step("Exact Answer: I do not know")[1] == 0.0
        env.reset(options={"pivot": pivot.id})
        reward, info = env.step(call("search", queries=["Rollo Davidson Prize"]))[1::3]
        assert (reward, info["category"]) == (0.0, "wrong_kind")
    env.close()


def test_a_task_row_without_an_answer_makes_no_pivot_and_the_rest_of_the_file_is_served(
    shared_data, tmp_path
):
    rows = (shared_data / "nemo_gym" / "browsecomp_tasks.jsonl").read_text().splitlines()[:2]
    unanswered = json.loads(rows[1])
    del unanswered["ground_truth"]
    path = tmp_path / "tasks.jsonl"
    path.write_text(rows[0] + "\n" + json.dumps(unanswered) + "\n")
    pivots = gym.make("pivot/search-v0", pivots=str(path)).unwrapped.pivots
    assert [p.id for p in pivots] == ["tasks/1/t0"]
    assert pivots[0].source["expert"] == "ground_truth" and pivots[0].expert["content"].startswith(
        "Exact Answer: "
    )


@pytest.mark.parametrize("k", [0, -1, True, 2.5])
def test_a_k_that_is_not_a_positive_integer_is_refused(search_pivots, k):
    with pytest.raises(ConfigError, match="k must be a positive integer"):
        gym.make("pivot/search-v0", pivots=search_pivots, k=k)
