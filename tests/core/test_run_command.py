"""`pivotrl run`, the main job, end to end on the bundled tool-use pivots with the embedded model."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pivot_envs.adapters.cli_run import (
    Budget,
    RunConfig,
    Signal,
    evaluation_env_kwargs,
    settings_digest,
    warm_up_settings,
)
from pivot_envs.adapters.grpo import PivotRLResult, Selection, TrainResult
from pivot_envs.cli import main
from pivot_envs.pivot import Pivot, Profile, read_pivots, write_pivots
from pivot_envs.profile import ProfileRun


def profiled_pivot(index: int, rewards: list[float]) -> Pivot:
    return Pivot(
        f"t{index}/t0",
        "tool-use",
        [{"role": "user", "content": "hi"}],
        {"role": "assistant", "content": "hello"},
        profile=Profile.from_samples(rewards),
    )


def method_result(profiled: list[Pivot], pivots: list[Pivot], history: list[dict]) -> PivotRLResult:
    """What grpo.pivotrl returns, for the figures the run reads from it."""
    training = TrainResult(
        out=Path("train"),
        steps=len(history),
        final=Path("train/final"),
        metrics_path=Path("train/metrics.jsonl"),
        history=history,
    )
    return PivotRLResult(Selection(profiled, profiled, pivots, ProfileRun()), training)


def test_signal_counts_successes_mixed_candidates_and_groups_with_variance() -> None:
    profiled = [
        profiled_pivot(0, [1.0, 0.0, 0.0, 1.0]),
        profiled_pivot(1, [0.0] * 4),
        profiled_pivot(2, [1.0] * 4),
    ]
    history = [{"step": 1, "groups_trained": 1}, {"step": 2, "groups_trained": 0}]
    signal = Signal.of(method_result(profiled, profiled[:2], history), batch_pivots=2)
    assert (signal.samples, signal.successes, signal.mixed, signal.profiled) == (12, 6, 1, 3)
    assert (signal.groups, signal.varied_groups) == (4, 1)
    assert signal.verdict() == "learning signal: 1 of 4 GRPO groups had mixed rewards"


def test_signal_counts_one_group_per_pivot_when_d_pivot_is_smaller_than_the_batch() -> None:
    # Line 6 samples B pivots without replacement: one pivot gives one group a step, whatever B.
    profiled = [profiled_pivot(0, [1.0, 0.0, 0.0, 0.0]), profiled_pivot(1, [0.0] * 4)]
    history = [{"step": step, "groups_trained": 0} for step in (1, 2, 3)]
    signal = Signal.of(method_result(profiled, profiled[:1], history), batch_pivots=2)
    assert signal.groups == 3
    assert signal.verdict() == "no learning signal: none of the 3 GRPO groups had mixed rewards"


def test_signal_says_why_there_is_nothing_to_learn_when_no_sample_succeeds() -> None:
    profiled = [profiled_pivot(0, [0.0] * 4)]
    signal = Signal.of(method_result(profiled, profiled, [{"step": 1, "groups_trained": 0}]), batch_pivots=1)
    assert signal.verdict().startswith("no learning signal: none of the 4 profiling samples scored 1")
    assert "| profiling samples with reward 1 | 0 of 4 (0.0%) |" in signal.table()


def test_run_extracts_profiles_filters_trains_evaluates_and_reports(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    argv = [
        "run",
        "--out",
        str(out),
        "--candidates",
        "2",
        "--profile.k",
        "2",
        "--eval-pivots",
        "2",
        "--train.steps",
        "1",
        "--train.batch-pivots",
        "1",
        "--train.group-size",
        "2",
        "--max-new-tokens",
        "8",
        "--max-prompt-tokens",
        "384",
        "--sft-examples",
        "2",
        "--sft-epochs",
        "1",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    for stage in range(1, 7):
        assert f"[{stage}/6]" in printed
    assert "[5/6] Algorithm 1 (grpo.pivotrl)" in printed
    assert printed.strip().endswith(f"report: {out / 'report.md'}")

    extracted = read_pivots(out / "extracted.jsonl")
    heldout = {p.trajectory_id for p in read_pivots(out / "heldout.jsonl")}
    candidates, profiled = read_pivots(out / "candidates.jsonl"), read_pivots(out / "profiled.jsonl")
    assert (
        len(extracted) == 411
        and [p.id for p in profiled] == [p.id for p in candidates]
        and len(profiled) == 2
    )
    assert not heldout & {p.trajectory_id for p in profiled}  # split by trajectory: nothing leaks
    for pivot in profiled:
        assert pivot.profile.k == 2 and len(pivot.profile.rewards) == 2
        assert pivot.profile.mean == sum(pivot.profile.rewards) / 2
    # Line 4 in the run's filter mode: D_adv, or the never-solved candidates when it is empty (the report says so).
    pivots, lambda_diff = read_pivots(out / "pivots.jsonl"), RunConfig().filter.lambda_diff
    adv = [p.id for p in profiled if p.profile.var > 0 and p.profile.mean < lambda_diff]
    assert [p.id for p in pivots] == (adv or [p.id for p in profiled if p.profile.mean < lambda_diff])
    assert ("Note: D_adv was empty at K=2" in (out / "report.md").read_text()) == (not adv)

    report = (out / "report.md").read_text()
    assert "## Profile diagnostics" in report and "## Turn accuracy on held-out pivots" in report
    # the before/after change in words, with its interval recomputed from the two evaluations
    change = json.loads((out / "report.json").read_text())["change"]
    after = json.loads((out / "report.json").read_text())["after"]["rows"][0]["functional"]
    before = json.loads((out / "report.json").read_text())["before"]["rows"][0]["functional"]
    assert change["difference"] == pytest.approx(after["mean"] - before["mean"])
    distinguishable = change["low"] > 0 or change["high"] < 0
    assert ("distinguishable from no change at this size" in report) == distinguishable
    assert ("not distinguishable from no change" in report) == (not distinguishable)
    assert "docs/reproduce.md" in report
    assert (out / "rewards.png").stat().st_size > 0
    figures = json.loads((out / "report.json").read_text())
    assert (figures["extracted"], figures["candidates"], figures["profiled"]) == (411, 2, 2)
    assert figures["pivots"] == len(pivots) and len(figures["history"]) == 1
    assert {"before", "after", "timings"} <= set(figures)

    # The report says whether anything could be learned, with figures recomputed here from the outputs.
    rewards = [r for pivot in profiled for r in pivot.profile.rewards]
    signal = figures["signal"]
    assert signal["samples"] == len(rewards) == 4
    assert signal["successes"] == sum(r >= 1.0 for r in rewards)
    assert signal["mixed"] == sum(pivot.profile.var > 0 for pivot in profiled)
    assert signal["varied_groups"] == sum(record["groups_trained"] for record in figures["history"])
    verdict = Signal(**signal).verdict()
    assert f"{verdict[0].upper()}{verdict[1:]}." in report.split("## Learning signal")[1]
    assert verdict in printed

    # The warm-up trained on 2 expert turns for 1 epoch (one optimizer step of 2) and kept its weights.
    sft = figures["sft"]
    assert (sft["examples"], sft["epochs"], sft["reused"]) == (2, 1, False)
    steps = [json.loads(line) for line in (out / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 1 and steps[0]["loss"] == sft["first_loss"] == sft["last_loss"] > 0
    assert "| SFT warm-up | 2 expert turns x 1 epochs" in report

    # Rerun into the same directory: the warm-up's weights are reused and the profile resumes
    # (nothing profiled twice).
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "reused the warmed-up weights" in printed and "2 candidates reused from an earlier run" in printed
    assert json.loads((out / "report.json").read_text())["sft"]["reused"] is True
    # The first run's training is kept beside this one's, not mixed with it.
    assert len((out / "train.previous" / "metrics.jsonl").read_text().splitlines()) == 1
    assert len((out / "train" / "metrics.jsonl").read_text().splitlines()) == 1
    warmed = read_pivots(out / "profiled.jsonl")
    assert warmed == profiled and len({p.profile.settings["reference"] for p in warmed}) == 1
    assert warmed[0].profile.settings["reference"].startswith("hf:smollm2 after SFT warm-up ")

    # Without the warm-up the reference policy is another one: its profiles are not mixed with the
    # warmed-up policy's; those are moved aside and the candidates profiled again.
    assert main([*argv[:-1], "0"]) == 0
    printed = capsys.readouterr().out
    assert f"moved to {out / 'profiled.jsonl.stale'}" in printed
    assert read_pivots(out / "profiled.jsonl.stale") == warmed
    plain = read_pivots(out / "profiled.jsonl")
    assert [p.id for p in plain] == [p.id for p in warmed]
    assert {p.profile.settings["reference"] for p in plain} == {"hf:smollm2"}


def test_the_swe_domain_runs_with_longer_actions_and_prompts_unless_flags_set_them() -> None:
    swe = RunConfig(domain="swe")
    assert swe.budget() == Budget(max_new_tokens=128, max_prompt_tokens=2048)
    stages = swe.composed()
    assert stages.profile.max_new_tokens == stages.train.max_new_tokens == stages.eval.max_new_tokens == 128
    assert RunConfig().budget() == Budget(max_new_tokens=48, max_prompt_tokens=1024)
    flagged = RunConfig(domain="swe", max_new_tokens=16, max_prompt_tokens=0)
    assert (
        flagged.budget() == Budget(max_new_tokens=16, max_prompt_tokens=0)
        and flagged.composed().train.max_new_tokens == 16
    )


def test_composing_leaves_the_run_config_as_it_was_so_a_changed_copy_follows_its_new_seed() -> None:
    config = RunConfig(seed=7)
    assert config.composed().train.seed == 7 and config.train.seed is None
    assert replace(config, seed=3).composed().train.seed == 3


def test_a_train_seed_given_on_the_command_line_reaches_the_trainer(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """`--train.seed 7` is the seed of Algorithm 1's GRPO run, whatever `--seed` says (the run once
    overwrote it with its own); the stages given nothing still take the run's seed."""
    import pivot_envs.adapters.grpo

    class Stop(Exception):
        pass

    seen = []

    def recording(candidates, policy, config, **kwargs):
        seen.append(config)
        raise Stop

    monkeypatch.setattr(pivot_envs.adapters.grpo, "pivotrl", recording)
    argv = ["run", "--out", str(tmp_path / "run"), "--candidates", "1", "--eval-pivots", "1"]
    argv += ["--max-new-tokens", "2", "--max-prompt-tokens", "256", "--sft-epochs", "0"]
    with pytest.raises(Stop):
        main([*argv, "--seed", "3", "--train.seed", "7"])
    capsys.readouterr()
    [method] = seen
    assert (method.train.seed, method.profile.seed) == (7, 3)
    assert method.train.max_new_tokens == method.profile.max_new_tokens == 2


def test_a_config_file_naming_the_swe_domain_gets_the_swe_budgets(tmp_path: Path, capsys) -> None:
    config = tmp_path / "run.toml"
    config.write_text('domain = "swe"\n')
    assert main(["run", "--config", str(config), "--print-config"]) == 0
    train = capsys.readouterr().out.split("[train]")[1].split("\n[")[0]
    assert "max_new_tokens = 128" in train


def test_a_run_without_dtype_keeps_its_warm_up_digest_and_a_run_with_one_gets_another() -> None:
    # Digests computed before --dtype existed: the profiles after a warm-up name the policy by it.
    examples = ["p2", "p1"]
    assert settings_digest(warm_up_settings(RunConfig(), 2, examples)) == "48accf1a29a4"
    swe = RunConfig(domain="swe", seed=3, sft_learning_rate=1e-4)
    assert settings_digest(warm_up_settings(swe, 2, examples)) == "2bcff60928c2"
    assert "dtype" not in warm_up_settings(RunConfig(), 2, examples)
    bfloat16 = warm_up_settings(RunConfig(dtype="bfloat16"), 2, examples)
    assert bfloat16["dtype"] == "bfloat16" and settings_digest(bfloat16) != "48accf1a29a4"


def test_a_negative_prompt_budget_stops_eval_before_any_model_loads(tmp_path: Path, capsys) -> None:
    pivots = tmp_path / "pivots.jsonl"
    write_pivots([profiled_pivot(0, [1.0])], pivots)
    argv = ["eval", "--pivots", str(pivots), "--policy", "hf:/nonexistent", "--max-prompt-tokens", "-1"]
    assert main(argv) == 2
    assert "--max-prompt-tokens -1: must be >= 0" in capsys.readouterr().err


def test_the_evaluations_score_in_the_training_env_with_the_evaluations_own_verifier() -> None:
    kwargs = {"limits": {"max_calls": 8}, "verifier": "strict", "verifier_config": {"x": 1}}
    assert evaluation_env_kwargs(kwargs) == {"limits": {"max_calls": 8}}
    assert evaluation_env_kwargs({"limits": {"max_calls": 8}, "verifier_config": {"x": 1}}) == {
        "limits": {"max_calls": 8},
        "verifier_config": {"x": 1},
    }


def test_run_evaluates_in_the_env_profiling_and_training_use(tmp_path: Path, capsys, monkeypatch) -> None:
    """`--profile.env-kwargs` reaches both evaluations too (it once reached only profiling and
    training), less the training verifier: the held-out turns are graded functionally."""
    import pivot_envs.evaluate

    real, seen = pivot_envs.evaluate.evaluate, []

    def recording(policy, pivots, config=None, env=None, **env_kwargs):
        seen.append(env_kwargs)
        return real(policy, pivots, config, env, **env_kwargs)

    monkeypatch.setattr(pivot_envs.evaluate, "evaluate", recording)
    out = tmp_path / "run"
    kwargs = {"limits": {"max_calls": 8}, "verifier": "strict"}
    argv = ["run", "--out", str(out), "--candidates", "1", "--profile.k", "2", "--eval-pivots", "1"]
    argv += "--train.steps 1 --train.batch-pivots 1 --train.group-size 2 --max-new-tokens 4".split()
    argv += ["--max-prompt-tokens", "384", "--sft-epochs", "0", "--profile.env-kwargs", json.dumps(kwargs)]
    assert main(argv) == 0
    capsys.readouterr()
    assert seen == [{"limits": {"max_calls": 8}}] * 2
    [profiled] = read_pivots(out / "profiled.jsonl")
    assert profiled.profile.settings["env_kwargs"] == kwargs  # profiling used the strict verifier
    figures = json.loads((out / "report.json").read_text())
    for when in ("before", "after"):  # one held-out pivot, scored (not an infrastructure failure)
        assert [(row["pivots"], row["invalid"]) for row in figures[when]["rows"]] == [(1, 0)]
