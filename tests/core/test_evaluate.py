"""Evaluation: turn accuracy per domain under the functional and the strict verifier, with Wilson intervals."""

from __future__ import annotations

import dataclasses
import json

import pytest
from echo_domain import EchoEnv, real_pivots

from pivot_envs.chat import calls_of
from pivot_envs.env import InfrastructureError, Outcome
from pivot_envs.evaluate import (
    Accuracy,
    EvalConfig,
    effective_size,
    evaluate,
    generate_all,
    prompt_size,
    wilson_interval,
)
from pivot_envs.policy import Completion, SamplingParams
from pivot_envs.profile import pivot_seed
from pivot_envs.scoring import EnvPool
from pivot_envs.verifiers import Verdict


class ScriptedPolicy:
    """A policy that answers each pivot with a fixed list of actions (cycled over the n samples)."""

    name = "scripted"

    def __init__(self, answers):
        self.answers = answers
        self.calls = []

    def generate(self, chats, n, sampling):
        self.calls.append((len(chats), n, sampling.temperature))
        out = []
        for chat in chats:
            actions = self.answers[_key(chat)]
            out.append([Completion(text="", message=actions[i % len(actions)]) for i in range(n)])
        return out


def _key(chat):
    return json.dumps(chat["messages"], sort_keys=True)


WRONG = {"role": "assistant", "content": "I cannot help with that."}


def expert_on(pivots, correct):
    return ScriptedPolicy({_key(p.observation): [p.expert if p.id in correct else WRONG] for p in pivots})


class SameToolsVerifier:
    """A lenient functional verifier: the same tool names as the expert, whatever the arguments."""

    name = "same-tools"

    def verify(self, pivot, action, outcome=None):
        same = sorted(n for n, _ in calls_of(action)) == sorted(n for n, _ in calls_of(pivot.expert))
        return Verdict(1.0 if same and calls_of(action) else 0.0, "same_tools" if same else "other_tools")


class FlakyBackendEnv(EchoEnv):
    def execute(self, pivot, action):
        if pivot.id.endswith("/1"):
            raise InfrastructureError("mock backend unreachable")
        return Outcome()


def test_wilson_interval_matches_the_closed_form():
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_samples_that_agree_within_each_pivot_count_as_one_per_pivot():
    # 10 pivots x 8 samples, each pivot all right or all wrong: 80 scores worth about 10.
    rewards = [float(pivot < 4) for pivot in range(10) for _ in range(8)]
    clusters = [f"p{pivot}" for pivot in range(10) for _ in range(8)]
    assert effective_size(rewards, clusters) == pytest.approx(9.0)  # C - 1, with the small-sample correction
    clustered = Accuracy.of(rewards, clusters)
    assert clustered.n == 80 and clustered.mean == pytest.approx(0.4)
    assert clustered.high - clustered.low > 2.5 * (Accuracy.of(rewards).high - Accuracy.of(rewards).low) / 2


def test_samples_that_vary_within_each_pivot_keep_about_their_count():
    # The same rate at every pivot, with the successes spread over the samples: near-independent.
    rewards = [float((pivot + sample) % 5 < 2) for pivot in range(10) for sample in range(10)]
    clusters = [f"p{pivot}" for pivot in range(10) for _ in range(10)]
    assert effective_size(rewards, clusters) == pytest.approx(100.0)
    assert effective_size([1.0, 1.0, 1.0], ["a", "a", "b"]) == 3.0  # no variance: the plain count


def test_the_expert_policy_is_fully_accurate():
    pivots = real_pivots()
    report = evaluate(expert_on(pivots, {p.id for p in pivots}), pivots, env=lambda: EchoEnv(pivots))
    row = report.row("echo", "greedy")
    assert (row.functional.mean, row.strict.mean, row.functional.n, row.invalid) == (1.0, 1.0, len(pivots), 0)


def test_accuracy_is_the_fraction_of_turns_answered_acceptably_with_its_interval():
    pivots = real_pivots()
    correct = {pivots[0].id, pivots[3].id}
    row = evaluate(expert_on(pivots, correct), pivots, env=lambda: EchoEnv(pivots)).row("echo")
    assert row.functional.mean == pytest.approx(2 / 5)
    assert (row.functional.low, row.functional.high) == pytest.approx(wilson_interval(2, 5))


def test_greedy_and_sampled_modes_ask_the_policy_for_what_they_score():
    pivots = real_pivots()
    policy = ScriptedPolicy({_key(p.observation): [p.expert, WRONG, WRONG] for p in pivots})
    report = evaluate(
        policy, pivots, EvalConfig(samples=3, temperature=0.7, batch_size=2), env=lambda: EchoEnv(pivots)
    )
    greedy, sampled = report.row("echo", "greedy"), report.row("echo", "sampled")
    assert greedy.functional.mean == 1.0 and greedy.functional.n == 5
    assert sampled.functional.mean == pytest.approx(1 / 3) and sampled.functional.n == 15
    # Every pivot has the same 1-in-3 rate: the interval is that of 15 near-independent samples.
    assert (sampled.functional.low, sampled.functional.high) == pytest.approx(wilson_interval(5, 15))
    assert {(n, t) for _, n, t in policy.calls} == {(1, 0.0), (3, 0.7)}
    assert max(size for size, _, _ in policy.calls) == 2


def test_generate_all_keeps_the_pivots_order_in_batches_and_shows_a_bar_when_asked(capsys):
    pivots = real_pivots()
    policy = expert_on(pivots, {p.id for p in pivots})
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    quiet = generate_all(policy, pivots, 2, greedy, batch_size=2)
    assert capsys.readouterr().err == ""
    shown = generate_all(policy, pivots, 2, greedy, batch_size=2, progress="held-out echo")
    assert shown == quiet
    assert [group[0].message for group in shown] == [p.expert for p in pivots]
    assert [size for size, _, _ in policy.calls] == [2, 2, 1] * 2
    err = capsys.readouterr().err
    assert "held-out echo" in err and f"{len(pivots)}/{len(pivots)}" in err


class RecordingPolicy:
    """Answers each chat with its own seed as text, and records the chats of each call."""

    name = "recording"

    def __init__(self):
        self.calls = []

    def generate(self, chats, n, sampling):
        self.calls.append(list(chats))
        return [[Completion(text=str(seed))] * n for seed in sampling.chat_seeds(len(chats))]


def test_generate_all_batches_prompts_of_similar_length_and_keeps_each_chats_seed():
    base = real_pivots()[0]
    padding = [10, 900, 30, 700, 20, 800]  # characters added to the last message: three short, three long
    pivots = []
    for index, extra in enumerate(padding):
        messages = [dict(m) for m in base.observation["messages"]]
        messages[-1]["content"] = f"{messages[-1].get('content') or ''}{'x' * extra}"
        pivots.append(dataclasses.replace(base, id=f"p{index}", messages=messages))
    policy = RecordingPolicy()
    seeds = [100 + index for index in range(len(pivots))]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seeds=seeds)
    out = generate_all(policy, pivots, 2, sampling, batch_size=3)
    # the pivots' order, each with its own seed
    assert [group[0].text for group in out] == [str(seed) for seed in seeds]
    assert [len(group) for group in out] == [2] * len(pivots)
    sizes = [[prompt_size(p) for p in pivots if p.observation in call] for call in policy.calls]
    # the longest prompts first, together; the short ones after
    assert min(sizes[0]) > max(sizes[1])
    assert {pivots.index(p) for p in pivots if p.observation in policy.calls[0]} == {1, 3, 5}


def test_seeded_sampling_draws_each_pivots_samples_from_its_own_seed_whatever_its_batch():
    pivots = real_pivots()
    sampled = SamplingParams(temperature=0.7, max_new_tokens=8, seed=7)
    expected = [str(pivot_seed(7, p.id)) for p in pivots]
    for batch_size in (1, 2, len(pivots)):
        out = generate_all(RecordingPolicy(), pivots, 1, sampled, batch_size=batch_size)
        assert [group[0].text for group in out] == expected
    # greedy draws nothing: the call's seed is passed as it is
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8, seed=7)
    assert {g[0].text for g in generate_all(RecordingPolicy(), pivots, 1, greedy, batch_size=2)} == {"7"}


def test_the_functional_verifier_credits_actions_the_strict_one_misses():
    pivots = real_pivots()
    same_tools = {}
    for pivot in pivots:
        calls = pivot.expert.get("tool_calls") or []
        # same tools, other arguments: functionally accepted by the lenient verifier, not an exact match
        changed = [{**c, "function": {**c["function"], "arguments": "{}"}} for c in calls]
        same_tools[_key(pivot.observation)] = [
            {"role": "assistant", "content": None, "tool_calls": changed} if calls else WRONG
        ]
    row = evaluate(
        ScriptedPolicy(same_tools), pivots, env=lambda: EchoEnv(pivots, verifier=SameToolsVerifier())
    ).row("echo")
    assert row.functional.mean == pytest.approx(4 / 5)
    assert row.strict.mean == 0.0


def test_infrastructure_failures_are_counted_apart_not_as_wrong_answers():
    pivots = real_pivots()
    row = evaluate(
        expert_on(pivots, {p.id for p in pivots}), pivots, env=lambda: FlakyBackendEnv(pivots)
    ).row("echo")
    assert row.invalid == 1
    assert row.functional.mean == 1.0 and row.functional.n == 4


def test_several_domains_get_a_row_each_and_a_pooled_row():
    pivots = real_pivots()
    for pivot in pivots[:2]:
        pivot.domain = "other"
    report = evaluate(expert_on(pivots, {pivots[0].id}), pivots, env=lambda: EchoEnv(pivots))
    assert report.row("other").functional.mean == pytest.approx(1 / 2)
    assert report.row("echo").functional.mean == 0.0
    assert report.row("all").functional.n == 5 and report.row("all").functional.mean == pytest.approx(1 / 5)
    table = report.format()
    assert "other" in table and "all" in table and "20.0%" in table
    with pytest.raises(KeyError, match="'nope'"):
        report.row("nope")


def test_env_pool_scores_in_order_with_concurrent_envs():
    pivots = real_pivots()
    jobs = [(p.id, p.expert if i % 2 == 0 else WRONG) for i, p in enumerate(pivots * 4)]
    with EnvPool(lambda: EchoEnv(pivots), size=3) as pool:
        scores = pool.score(jobs)
        assert len(pool._envs) <= 3
    assert [s.reward for s in scores] == [1.0 if i % 2 == 0 else 0.0 for i in range(len(jobs))]


def test_env_errors_name_the_pivot():
    pivots = real_pivots()
    with EnvPool(lambda: EchoEnv(pivots), size=1) as pool, pytest.raises(RuntimeError, match="pivot no/such"):
        pool.score([("no/such", "x")])


def test_pivotrl_eval_reports_the_tool_use_domain_with_a_local_model(tmp_path, capsys):
    pytest.importorskip("torch")
    import gymnasium as gym
    from tiny_model import tiny_checkpoint

    import pivot_envs
    from pivot_envs import write_pivots
    from pivot_envs.cli import main

    tiny_checkpoint(
        tmp_path / "model",
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    gym.register_envs(pivot_envs)
    write_pivots(gym.make("pivot/tool-use-v0").unwrapped.pivots[:3], tmp_path / "heldout.jsonl")

    code = main(
        [
            "eval",
            "--pivots",
            str(tmp_path / "heldout.jsonl"),
            "--policy",
            f"hf:{tmp_path / 'model'}",
            "--samples",
            "2",
            "--temperature",
            "1.0",
            "--max-new-tokens",
            "4",
            "--json",
            str(tmp_path / "report.json"),
        ]
    )
    assert code == 0
    report = json.loads((tmp_path / "report.json").read_text())
    rows = {(row["domain"], row["mode"]): row for row in report["rows"]}
    assert rows[("tool-use", "greedy")]["functional"]["n"] == 3
    assert rows[("tool-use", "sampled")]["functional"]["n"] == 6
    assert "tool-use" in capsys.readouterr().out


def test_a_change_in_accuracy_is_called_distinguishable_only_when_its_interval_excludes_zero():
    from pivot_envs.evaluate import Accuracy, change_in_words

    small, figures = change_in_words(
        Accuracy.of([1.0] * 21 + [0.0] * 11), Accuracy.of([1.0] * 26 + [0.0] * 6)
    )
    assert "not distinguishable from no change" in small and figures["low"] < 0 < figures["high"]
    assert figures["difference"] == pytest.approx(5 / 32)
    large, figures = change_in_words(Accuracy.of([0.0] * 200), Accuracy.of([1.0] * 100 + [0.0] * 100))
    assert "distinguishable from no change at this size" in large and figures["low"] > 0
    assert "docs/reproduce.md" in large
