"""E2 of docs/preregistration.md in `pivotrl reproduce` (quick scale: the machinery, not the method): its split
(train-B and validation by trajectory), the pilot's registered choice, the main arms refused before the pilot,
checkpoint selection on validation, and one analysis on the final and on the selected checkpoint."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch", reason="pivotrl reproduce trains: needs the train extra")

from pivot_envs.adapters.reproduce import e2  # noqa: E402
from pivot_envs.adapters.reproduce.runner import reproduce  # noqa: E402
from pivot_envs.adapters.reproduce.scales import get_scale  # noqa: E402
from pivot_envs.config import ConfigError  # noqa: E402


@pytest.mark.parametrize(
    ("norms", "clip"),
    [([1.34, 1.2, 2.0], 3), ([0.04, 0.05], 0.09), ([0.04, 0.06], 0.1), ([3.6, 4.3], 8), ([0.0], 1.0)],
)
def test_the_clip_is_twice_the_median_gradient_norm_rounded_up_to_one_digit(norms, clip):
    assert e2.clip_for(norms) == pytest.approx(clip)


def test_the_pilot_chooses_the_best_final_validation_accuracy_and_a_tie_goes_to_the_lower_rate():
    def run(*accuracies):
        return {
            "validation": [{"step": 6 * (i + 1), "accuracy": a} for i, a in enumerate(accuracies)],
            "grad_norms": [1.0, 2.0],
        }

    assert e2.pilot_choice({5e-6: run(0.9, 0.5), 1e-5: run(0.2, 0.6), 2e-5: run(0.6, 0.6)}) == {
        "learning_rate": 1e-5,
        "max_grad_norm": 3,
    }


def test_the_split_keeps_trajectories_whole_and_validation_apart_from_train_b():
    data = e2.data(get_scale("cpu"))
    train, validation = {p.trajectory_id for p in data.train_b}, {p.trajectory_id for p in data.validation}
    assert train and validation and not train & validation
    assert 0.1 < len(data.validation) / (len(data.validation) + len(data.train_b)) < 0.3
    assert {p.trajectory_id for p in data.heldout}.isdisjoint(train | validation)
    assert {d: len(p) for d, p in data.drift.items()} == {"tool-use": 32, "terminal": 16, "swe": 16}
    assert len(data.heldout) == 155


def test_e2_runs_its_pilot_then_its_arms_and_decides_once_on_both_checkpoints(tmp_path, capsys):
    scale = get_scale("quick", seeds=1)
    with pytest.raises(ConfigError, match="paper-regime-pilot"):
        reproduce(scale, tmp_path, ["paper-regime"])
    path, _ = reproduce(scale, tmp_path, ["paper-regime-pilot"])
    pilot = json.loads((tmp_path / "e2-pilot.json").read_text())
    assert set(pilot["choice"]) == {"learning_rate", "max_grad_norm"}
    assert "Chosen: learning rate" in path.read_text()
    path, stages = reproduce(scale, tmp_path, ["paper-regime"])
    assert {f"e2-{arm}-s0" for arm in e2.ARMS} <= set(stages.computed)
    report = json.loads((tmp_path / "e2.json").read_text())
    assert [item["claim"] for item in report["family"]] == [f"E2-{i}" for i in range(1, 8)]
    assert report["looks"] == 1 and "E2-1" in report["decision"]
    assert (tmp_path / "e2-selected.md").exists()
    arm = json.loads((tmp_path / "stages" / "e2-pivotrl-kl-s0" / "result.json").read_text())
    assert arm["settings"]["choice"] == pilot["choice"]
    result = arm["result"]
    assert [v["step"] for v in result["validation"]] == [1, 2]  # a validation at every checkpoint
    assert len(result["final"]["question_replies"]) == e2.SIZES["quick"].questions
    assert "step" in result["selected"]
    assert not (tmp_path / "stages" / "e2-pivotrl-kl-s0" / "train").exists()  # no weights kept
