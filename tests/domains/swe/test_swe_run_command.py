"""`pivotrl run --domain swe` and `pivotrl eval` on the bundled SWE pivots, end to end on the CPU:
the embedded SmolLM2-135M, real sandboxes scoring its tool calls, a tiny configuration (2
candidates, K=2, one GRPO step of one group of 2, 16 new tokens, 512-token prompts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pivot_envs.cli import main
from pivot_envs.domains.swe import bundled_pivots
from pivot_envs.pivot import read_pivots, write_pivots

pytestmark = pytest.mark.slow

TINY = (
    "--candidates 2 --profile.k 2 --eval-pivots 2 --train.steps 1 --train.batch-pivots 1 --train.group-size 2 "
    "--max-new-tokens 16 --max-prompt-tokens 512 --sft-examples 2 --sft-epochs 1"
).split()


@pytest.fixture(scope="module")
def swe_run(tmp_path_factory, has_bwrap) -> Path:
    """The output directory of one tiny run on the bundled SWE pivots."""
    out = tmp_path_factory.mktemp("swe") / "run"
    assert main(["run", "--domain", "swe", "--out", str(out), *TINY]) == 0
    return out


def test_run_on_swe_profiles_trains_and_reports_with_every_reward_zero_or_one(swe_run: Path) -> None:
    extracted = read_pivots(swe_run / "extracted.jsonl")
    assert len(extracted) == len(bundled_pivots()) and {p.domain for p in extracted} == {"swe"}
    profiled = read_pivots(swe_run / "profiled.jsonl")
    assert len(profiled) == 2
    for pivot in profiled:
        # Scored in a sandbox: a valid reward per sample, each 0 or 1, the mean theirs.
        assert pivot.profile.k == 2 and pivot.profile.n_valid == 2
        assert set(pivot.profile.rewards) <= {0.0, 1.0}
        assert pivot.profile.mean == sum(pivot.profile.rewards) / 2

    figures = json.loads((swe_run / "report.json").read_text())
    assert (figures["extracted"], figures["candidates"], figures["profiled"]) == (len(extracted), 2, 2)
    assert figures["budget"] == {"max_new_tokens": 16, "max_prompt_tokens": 512}
    assert figures["signal"]["samples"] == 4 and len(figures["history"]) == 1
    history = [json.loads(line) for line in (swe_run / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in history] == [1] and 0.0 <= history[0]["reward_mean"] <= 1.0
    for when in ("before", "after"):
        rows = figures[when]["rows"]
        assert [(row["domain"], row["pivots"], row["invalid"]) for row in rows] == [("swe", 2, 0)]
        assert rows[0]["functional"]["mean"] in {0.0, 0.5, 1.0}
    report = (swe_run / "report.md").read_text()
    assert "domain `swe`" in report and "actions up to 16 tokens, prompts fitted to 512 tokens" in report
    assert "| profile (Algorithm 1, line 3) | 2 candidates x K=2 |" in report


def test_run_on_swe_holds_out_whole_trajectories(swe_run: Path) -> None:
    extracted = read_pivots(swe_run / "extracted.jsonl")
    heldout = read_pivots(swe_run / "heldout.jsonl")
    held = {p.trajectory_id for p in heldout}
    train_side = {p.trajectory_id for p in extracted} - held
    assert held and train_side
    # Every pivot of a held-out trajectory is held out, and nothing profiled or trained on comes from one.
    assert {p.id for p in extracted if p.trajectory_id in held} == {p.id for p in heldout}
    assert not held & {p.trajectory_id for p in read_pivots(swe_run / "profiled.jsonl")}
    assert not held & {p.trajectory_id for p in read_pivots(swe_run / "pivots.jsonl")}


def test_eval_scores_smollm2_at_held_out_swe_pivots(swe_run: Path, tmp_path: Path, capsys) -> None:
    pivots, report = tmp_path / "heldout.jsonl", tmp_path / "eval.json"
    write_pivots(read_pivots(swe_run / "heldout.jsonl")[:2], pivots)
    options = (
        "--policy hf:smollm2 --max-new-tokens 16 --max-prompt-tokens 512 --samples 2 --num-envs 1".split()
    )
    argv = ["eval", "--pivots", str(pivots), *options, "--json", str(report)]
    assert main(argv) == 0
    assert "swe" in capsys.readouterr().out
    rows = {row["mode"]: row for row in json.loads(report.read_text())["rows"]}
    assert set(rows) == {"greedy", "sampled"} and all(row["domain"] == "swe" for row in rows.values())
    assert (rows["greedy"]["functional"]["n"], rows["sampled"]["functional"]["n"]) == (2, 4)
    for row in rows.values():
        n = row["functional"]["n"]
        assert row["invalid"] == 0 and row["functional"]["mean"] in {k / n for k in range(n + 1)}
