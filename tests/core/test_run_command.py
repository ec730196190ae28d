"""`pivotrl run`, the main job, end to end on the bundled tool-use pivots with the embedded model."""

from __future__ import annotations

import json
from pathlib import Path

from pivot_envs.cli import main
from pivot_envs.pivot import read_pivots


def test_run_extracts_profiles_filters_trains_evaluates_and_reports(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    argv = ["run", "--out", str(out), "--candidates", "2", "--k", "2", "--eval-pivots", "2", "--steps", "1",
            "--batch-pivots", "1", "--group-size", "2", "--max-new-tokens", "8", "--max-prompt-tokens", "384"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    for stage in range(1, 8):
        assert f"[{stage}/7]" in printed
    assert printed.strip().endswith(f"report: {out / 'report.md'}")

    candidates = read_pivots(out / "candidates.jsonl")
    heldout = {p.trajectory_id for p in read_pivots(out / "heldout.jsonl")}
    profiled = read_pivots(out / "profiled.jsonl")
    assert len(candidates) == 411 and len(profiled) == 2
    assert not heldout & {p.trajectory_id for p in profiled}  # split by trajectory: nothing leaks
    for pivot in profiled:
        assert pivot.profile.k == 2 and len(pivot.profile.rewards) == 2
        assert pivot.profile.mean == sum(pivot.profile.rewards) / 2

    report = (out / "report.md").read_text()
    assert "## Profile diagnostics" in report and "## Turn accuracy on held-out pivots" in report
    assert (out / "rewards.png").stat().st_size > 0
    figures = json.loads((out / "report.json").read_text())
    assert figures["profiled"] == 2 and len(figures["history"]) == 1
    assert {"before", "after", "timings"} <= set(figures)

    # Rerun into the same directory: the profile resumes (nothing profiled twice).
    assert main(argv) == 0
    assert len(read_pivots(out / "profiled.jsonl")) == 2
