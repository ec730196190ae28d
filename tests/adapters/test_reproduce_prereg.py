"""Pre-registered experiments in `pivotrl reproduce` (docs/preregistration.md): seed lists, budget-matched SFT
arms, the base on every compared item, the crossed-bootstrap analysis with Holm and the equivalence reading,
and one look: no analysis before every registered seed has finished, and each later one counted."""

from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("torch", reason="pivotrl reproduce trains: needs the train extra")

from pivot_envs.adapters.reproduce.experiments import arm_sizes, sft_config  # noqa: E402
from pivot_envs.adapters.reproduce.prereg import E1, tool_call_share  # noqa: E402
from pivot_envs.adapters.reproduce.runner import check_only, parse_seeds, reproduce  # noqa: E402
from pivot_envs.adapters.reproduce.scales import get_scale  # noqa: E402
from pivot_envs.adapters.reproduce.stats import crossed_bootstrap, holm, reading  # noqa: E402
from pivot_envs.config import ConfigError  # noqa: E402


@pytest.mark.parametrize(
    ("text", "seeds"),
    [
        ("3", 3),
        ("0-17", list(range(18))),
        ("100-102", [100, 101, 102]),
        ("3,5,8-9", [3, 5, 8, 9]),
        ("2,2", [2]),
    ],
)
def test_seeds_are_a_count_or_a_list_of_seeds_and_ranges(text, seeds):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["", "a", "5-3", "1,,2", "-1"])
def test_a_malformed_seed_list_is_a_config_error_naming_the_flag(text):
    with pytest.raises(ConfigError, match="--seeds"):
        parse_seeds(text)


def test_a_pre_registered_experiment_runs_alone_and_not_by_default():
    assert "sft-matched" not in check_only(None)
    assert check_only(["sft-matched"]) == ["sft-matched"]
    with pytest.raises(ConfigError, match="pre-registered"):
        check_only(["sft-matched", "sft"])


def test_the_matched_sft_arm_takes_the_rl_arms_steps_and_learning_rate():
    scale = get_scale("cpu")
    matched = sft_config(scale, "sft-matched", 32)
    # 4 optimizer steps at 2e-5: one pass over the 32 turns in batches of 8 (docs/preregistration.md, E1)
    assert (matched.epochs, matched.batch_size, matched.learning_rate) == (1, 8, scale.train.learning_rate)
    one_epoch = sft_config(scale, "sft-1epoch", 32)
    assert (one_epoch.epochs, one_epoch.batch_size, one_epoch.learning_rate) == (1, 4, 5e-5)
    assert one_epoch.detach_prefix and matched.detach_prefix  # as the committed sft arm
    # the committed arms' stage settings gain nothing, so their stages stay valid
    assert arm_sizes(scale, "sft", 32) == {} and arm_sizes(scale, "pivotrl", 32) == {}
    assert arm_sizes(scale, "sft-matched", 32) == {
        "sft": {"epochs": 1, "batch_size": 8, "learning_rate": 2e-5}
    }


def test_the_crossed_bootstrap_widens_with_item_variation_that_a_seed_only_interval_ignores():
    draw = random.Random(0)
    effects = [draw.choice([-1.0, 0.0, 1.0]) for _ in range(60)]  # items disagree; seeds do not
    table = [list(effects) for _ in range(10)]
    figure = crossed_bootstrap(table, resamples=2000)
    assert figure["low"] < figure["estimate"] < figure["high"]
    assert figure["high"] - figure["low"] > 0.2  # the items' spread reaches the interval
    assert figure["item_fixed"]["low"] == pytest.approx(figure["estimate"])  # identical seeds: no seed spread
    assert figure["item_fixed"]["high"] == pytest.approx(figure["estimate"])
    assert figure["low90"] >= figure["low"] and figure["high90"] <= figure["high"]


def test_a_clear_effect_has_a_small_p_and_no_effect_a_large_one():
    draw = random.Random(1)
    clear = [[1.0 if draw.random() < 0.6 else 0.0 for _ in range(100)] for _ in range(8)]
    none = [[draw.choice([-1.0, 1.0]) for _ in range(100)] for _ in range(8)]
    assert crossed_bootstrap(clear, resamples=2000)["p"] < 0.01
    assert crossed_bootstrap(none, resamples=2000)["p"] > 0.05


def test_holm_multiplies_the_smallest_p_by_the_family_size_and_keeps_the_order():
    assert holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert holm([0.9, 0.4]) == pytest.approx([0.9, 0.8])
    assert holm([0.9, 0.8]) == [1.0, 1.0]  # never above 1


@pytest.mark.parametrize(
    ("low", "high", "low90", "high90", "p", "expected"),
    [
        (0.02, 0.10, 0.03, 0.09, 0.01, "better"),
        (-0.10, -0.02, -0.09, -0.03, 0.01, "worse"),
        (0.02, 0.10, 0.03, 0.09, 0.06, "inconclusive"),  # Holm-adjusted p not below 5%
        (-0.04, 0.04, -0.03, 0.03, 0.6, "no effect of 5 points or more"),
        (-0.06, 0.04, -0.055, 0.03, 0.6, "inconclusive"),  # a 5-point loss is not excluded
    ],
)
def test_each_difference_gets_one_of_the_four_registered_readings(low, high, low90, high90, p, expected):
    figure = {"low": low, "high": high, "low90": low90, "high90": high90}
    assert reading(figure, p) == expected


def test_replies_in_tool_call_syntax_are_told_apart_from_answers():
    replies = [
        '<tool_call>{"name": "add"}</tool_call>',
        '{"name": "search", "arguments": {}}',
        "42",
        "Paris.",
    ]
    assert tool_call_share(replies) == 0.5
    assert tool_call_share([]) is None


def test_e1_reports_once_every_registered_seed_finished_and_counts_each_look(tmp_path, capsys):
    scale = get_scale("quick", seeds=2)
    assert E1.seeds_at(scale) == [0, 1]
    path, _ = reproduce(scale, tmp_path, ["sft-matched"], seeds=[0])
    assert (
        path is None and not (tmp_path / "e1.md").exists()
    )  # a seed is missing: nothing held-out summarised
    assert "1 of 2 registered seeds" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="not among them"):
        reproduce(scale, tmp_path, ["sft-matched"], seeds=[5])
    path, stages = reproduce(scale, tmp_path, ["sft-matched"], seeds=[1])
    assert "train-tool-use-sft-matched-s0" in stages.reused  # seed 0 is not trained again
    assert "train-tool-use-sft-1epoch-s1" in stages.computed
    report = json.loads((tmp_path / "e1.json").read_text())
    assert report["looks"] == 1 and "Looks at these results: **1** (the registered one)" in path.read_text()
    assert [item["claim"] for item in report["family"]] == ["E1-1", "E1-2", "E1-3", "E1-4"]
    assert {item["reading"] for item in report["family"]} <= {
        "better",
        "worse",
        "no effect of 5 points or more",
        "inconclusive",
    }
    # the base was measured on every compared item; the new arms logged their replies
    base = json.loads((tmp_path / "stages" / "measure-base-compared" / "result.json").read_text())["result"]
    compared = json.loads((tmp_path / "stages" / "train-tool-use-sft-matched-s0" / "result.json").read_text())
    assert len(base["turns"]["tool-use"]) == len(compared["result"]["turns"]["tool-use"])
    assert len(compared["result"]["question_replies"]) == scale.questions
    path, _ = reproduce(scale, tmp_path, ["sft-matched"], finished_only=True)
    assert json.loads((tmp_path / "e1.json").read_text())["looks"] == 2
    assert "this is look 2" in path.read_text()


def test_e3_confirms_only_when_the_interval_is_wholly_above_zero():
    from pivot_envs.adapters.reproduce.prereg import e3_decision

    assert "**confirmed**" in e3_decision([{"low": 0.01, "high": 0.2}])
    assert "not confirmed" in e3_decision([{"low": -0.01, "high": 0.2}])


def test_e3_runs_the_reward_ablation_arms_alone_and_decides_once(tmp_path):
    from pivot_envs.adapters.reproduce.prereg import E3

    scale = get_scale("quick", seeds=1)
    assert E3.seeds == tuple(range(100, 115)) and E3.seeds_at(get_scale("cpu")) == list(range(100, 115))
    path, stages = reproduce(scale, tmp_path, ["reward-confirmation"])
    report = json.loads((tmp_path / "e3.json").read_text())
    assert [item["claim"] for item in report["family"]] == ["E3-1"] and report["looks"] == 1
    assert "E3-1" in report["decision"]
    assert {"train-tool-use-cand-functional-s0", "train-tool-use-cand-strict-s0"} <= set(stages.computed)
    assert "not measured" in path.read_text()  # these arms have no drift items
