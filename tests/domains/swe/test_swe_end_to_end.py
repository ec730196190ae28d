"""pivot/swe-v0 as a domain like the others: make_vec (sync and async), a JSON spec, and `pivotrl
profile` / `pivotrl eval` against a real OpenAI-compatible server on 127.0.0.1.

The server's "model" is scripted (a language model would take minutes here): at each pivot it
answers the expert's step written differently (git grep for grep, cat -n for the editor's view,
sed for str_replace, a verbose test run), which only the effect verifier accepts, and for every odd
sample of a group "I do not know". Everything between the HTTP request and the verdict is the
library's real path, sandboxes included.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import gymnasium as gym
import pytest
from chat_completions_stub import ChatCompletionsStub
from gymnasium.envs.registration import EnvSpec
from sandbox_fixtures import FAST_LIMITS
from scripted_cli import eval_scripted, profile_scripted
from swe_helpers import FIX_NEW, FIX_OLD, call_message

from pivot_envs import check_pivot_env
from pivot_envs.domains.swe import action_kind, bundled_pivots
from pivot_envs.domains.swe.parse import call_of
from pivot_envs.pivot import write_pivots

LIMITS = dataclasses.asdict(FAST_LIMITS) | {"timeout": 10.0}
# The expert's step at each turn of the tiny repository's trajectory, written differently.
REWRITTEN = [
    call_message("bash", {"command": "git grep -n 'def mean'"}),
    call_message("bash", {"command": "cat -n calc/ops.py"}),
    call_message("bash", {"command": f"sed -i 's|{FIX_OLD.strip()}|{FIX_NEW.strip()}|' calc/ops.py"}),
    call_message("bash", {"command": "python3 -m unittest -v tests.test_ops.MeanTests"}),
    call_message("submit", {}),
]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_make_vec_scores_experts_one_and_junk_zero(calc_pivots, has_bwrap, mode):
    experts = {pivot.id: pivot.expert for pivot in calc_pivots}
    envs = gym.make_vec(
        "pivot/swe-v0",
        num_envs=2,
        vectorization_mode=mode,
        pivots=calc_pivots,
        sandbox="bwrap",
        limits=LIMITS,
    )
    try:
        _, infos = envs.reset(seed=3)
        _, rewards, terminated, _, infos = envs.step([experts[infos["pivot_id"][0]], "I do not know."])
        scored = infos["final_info"]
        assert list(rewards) == [1.0, 0.0] and all(terminated), scored["category"]
        assert all(scored["valid"]) and list(scored["category"])[1] == "no_tool_call"
    finally:
        envs.close()


def test_the_env_spec_round_trips_through_json(calc_pivots, tmp_path):
    path = tmp_path / "pivots.jsonl"
    write_pivots(calc_pivots, path)
    env = gym.make(
        "pivot/swe-v0", pivots=str(path), verifier="kind", sandbox="bwrap", harness="fresh", limits=LIMITS
    )
    rebuilt = gym.make(EnvSpec.from_json(env.spec.to_json()))
    try:
        base = rebuilt.unwrapped
        assert (base.verifier.name, base.config.sandbox, base.config.harness, base.limits.timeout) == (
            "kind",
            "bwrap",
            "fresh",
            10.0,
        )
        assert [p.id for p in base.pivots] == [p.id for p in calc_pivots]
    finally:
        env.close()
        rebuilt.close()


def scripted_reply(body: dict, index: int) -> dict:
    """Sample `index` at a pivot: the rewritten expert step (even) or "I do not know" (odd)."""
    turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
    return REWRITTEN[turn] if index % 2 == 0 else {"role": "assistant", "content": "I do not know."}


@pytest.fixture
def scripted():
    server = ChatCompletionsStub(scripted_reply)
    yield server
    server.close()


def test_pivotrl_profile_scores_every_sample_through_the_swe_env(
    scripted, calc_pivots, has_bwrap, tmp_path: Path
):
    kwargs = json.dumps({"sandbox": "bwrap", "limits": LIMITS})
    # Only the submit is the expert's own call: only there does the strict verifier agree.
    profile_scripted(
        scripted,
        calc_pivots,
        tmp_path,
        lambda pivot: pivot.id.endswith("/t4"),
        *["--env-workers", "1", "--env-kwargs", kwargs],
    )


def test_pivotrl_eval_reports_the_swe_domains_accuracy(
    scripted, calc_pivots, has_bwrap, tmp_path: Path, capsys
):
    # eval makes pivot/swe-v0 with its defaults: sandbox "auto" (Docker where a daemon answers).
    rows = eval_scripted(scripted, calc_pivots, tmp_path, "--num-envs", "1")
    assert "swe" in capsys.readouterr().out
    swe = rows[("swe", "greedy")]
    assert swe["pivots"] == len(calc_pivots) and swe["invalid"] == 0
    assert swe["functional"]["mean"] == 1.0 and swe["strict"]["mean"] == 1 / len(calc_pivots)


# -- the bundled tasks (more-itertools) -------------------------------------------------------------


def bundled_sample(pivots: list, kinds: tuple[str, ...]) -> list:
    """The first task's pivots whose expert call is of one of `kinds` (see tools.action_kind)."""
    task = pivots[0].context["task"]["id"]
    return [p for p in pivots if p.context["task"]["id"] == task and action_kind(*call_of(p.expert)) in kinds]


def test_gym_make_with_no_arguments_runs_the_bundled_tasks(has_bwrap):
    env = gym.make("pivot/swe-v0", sandbox="bwrap")
    base = env.unwrapped
    try:
        assert len(base.pivots) >= 120 and len({p.context["task"]["id"] for p in base.pivots}) >= 20
        for pivot in bundled_sample(base.pivots, ("edit", "test", "submit")):
            env.reset(options={"pivot": pivot.id})
            _, reward, _, _, info = env.step(pivot.expert)
            assert (reward, info["valid"], info["executed"]) == (1.0, True, True), (pivot.id, info)
    finally:
        env.close()


def break_fork(env) -> bool:
    """Close the env's fork: the next step's sandbox is gone (an infrastructure failure)."""
    env.unwrapped.sandbox.close()
    return True


def test_the_bundled_env_passes_the_pivot_checker_on_both_backends(kind):
    # Two bundled pivots (a search and an edit of the first task): check_env resets at random.
    chosen = bundled_sample(bundled_pivots(), ("search", "edit"))[:2]
    env = gym.make("pivot/swe-v0", pivots=chosen, sandbox=kind)
    try:
        report = check_pivot_env(env, break_infrastructure=break_fork)
    finally:
        env.close()
    assert report.ok and {
        "gymnasium_check_env",
        "expert_scores_one",
        "infrastructure_failure_invalid",
    } <= set(report.passed), report
