"""`pivotrl reproduce`: the quick scale end to end (once per module), its report, resuming, and the verdict rule."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("torch")

# The quick scale trains 15 tiny arms and runs the E2E comparison: about 250 CPU-seconds of its own
# plus E2E's: 280 s wall on the VM at load 4-10, past the suite's 900 s timeout at load 15-20.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

from pivot_envs.adapters.reproduce.stats import (  # noqa: E402
    VERDICTS,
    bootstrap_mean,
    minimum_detectable_difference,
    observed_mdd,
    paired_differences,
    seeds_for_mdd,
    verdict,
)
from pivot_envs.errors import UnknownNameError  # noqa: E402

CLAIMS = {
    "signal",
    "signal-training",
    "strict-functional",
    "ablation-filtering",
    "ablation-reward",
    "sft-in-domain",
    "sft-ood",
    "objective",
    "online",
    "theorems",
    "e2e",
    # one signal claim per profiled domain beside the pooled one, and each trained arm's gain over the base
    "signal-tool-use",
    "signal-search",
    *(
        f"gain-{arm}"
        for arm in ("pivotrl", "cand-functional", "cand-strict", "sft", "pivotrl-action", "pivotrl-online")
    ),
}
COMPARED = 12
FIELDS = {"claim", "title", "paper_section", "paper", "ours", "verdict", "interval", "detail", "figures"}


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """The quick scale run once through the command, in this process (it trains: about 250 CPU-seconds). The arms
    are compared on more held-out pivots (12) than the base's evaluation sample (8)."""
    from pivot_envs.cli import main

    out = tmp_path_factory.mktemp("reproduce")
    command = ["reproduce", "--scale", "quick", "--out", str(out), "--compared-pivots", str(COMPARED)]
    assert main(command) == 0
    return out


@pytest.fixture(scope="module")
def report(quick):
    return json.loads((quick / "report.json").read_text())


# -- the verdict rule ---------------------------------------------------------------------------------


def test_an_interval_wholly_on_the_papers_side_reproduces_the_claim():
    assert verdict(0.01, 0.2) == "reproduced"
    assert verdict(-0.3, -0.1, direction=-1) == "reproduced"
    assert verdict(0.55, 0.8, threshold=0.5) == "reproduced"


def test_an_interval_wholly_on_the_other_side_does_not_reproduce_the_claim():
    assert verdict(-0.2, -0.01) == "not reproduced"
    assert verdict(0.1, 0.3, direction=-1) == "not reproduced"
    assert verdict(0.2, 0.45, threshold=0.5) == "not reproduced"


def test_an_interval_holding_the_threshold_is_inconclusive():
    assert verdict(-0.1, 0.1) == "inconclusive"
    assert verdict(0.0, 0.3) == "inconclusive"  # touching 0 does not exclude it
    assert verdict(0.4, 0.6, threshold=0.5) == "inconclusive"


def test_an_inverted_interval_is_refused():
    with pytest.raises(ValueError, match="low is above high"):
        verdict(0.3, 0.1)


def test_a_paired_bootstrap_of_a_constant_gain_excludes_zero_and_noise_does_not():
    better = [[1.0, 1.0, 0.0, 1.0] * 10] * 3
    worse = [[0.0, 1.0, 0.0, 0.0] * 10] * 3
    gain = bootstrap_mean(paired_differences(better, worse))
    assert gain["estimate"] == pytest.approx(0.5)
    assert 0.0 < gain["low"] < 0.5 < gain["high"] <= 1.0
    noise = bootstrap_mean(paired_differences([[1.0, 0.0] * 20] * 3, [[0.0, 1.0] * 20] * 3))
    assert noise["low"] < 0.0 < noise["high"]


def test_the_minimum_detectable_difference_shrinks_with_the_held_out_size():
    # 392 items per arm detect 10 points at 50% accuracy (two-sided 5%, 80% power)
    assert minimum_detectable_difference(392) == pytest.approx(0.100, abs=0.001)
    assert minimum_detectable_difference(100) > minimum_detectable_difference(400)


def test_the_observed_mdd_is_the_power_of_the_design_that_gave_the_interval():
    # an interval of +-1.96 standard errors detects (1.96 + 0.84) standard errors
    assert observed_mdd(-0.0196, 0.0196) == pytest.approx(0.028, abs=1e-4)
    assert observed_mdd(0.1, 0.1) == 0.0
    # a paired design that removes the items' shared difficulty detects less than two unpaired sets of the same n
    same = [[1.0, 0.0, 1.0, 1.0] * 40] * 3
    shifted = [[row[i] if i % 10 else 1.0 - row[i] for i in range(len(row))] for row in same]
    figure = bootstrap_mean(paired_differences(same, shifted))
    assert observed_mdd(figure["low"], figure["high"]) < minimum_detectable_difference(figure["n"])
    with pytest.raises(ValueError, match="low is above high"):
        observed_mdd(0.2, 0.1)


def _differences(seeds, items, seed_sd, item_sd, noise_sd, draw):
    """A seeds x items table of paired differences: a seed effect, an item effect, and noise."""
    item_effect = [draw.gauss(0, item_sd) for _ in range(items)]
    table = []
    for _ in range(seeds):
        shift = draw.gauss(0, seed_sd)
        table.append([shift + effect + draw.gauss(0, noise_sd) for effect in item_effect])
    return table


def test_the_seeds_a_10_point_paired_mdd_needs_are_projected_from_the_seeds_run():
    z = 1.959963984540054 + 0.8416212335729143
    # only seeds vary (every item of a seed moves together): the MDD falls as 1/sqrt(seeds), exactly
    seed_shifts = [0.1, -0.1, 0.2, -0.2]
    table = [[shift] * 50 for shift in seed_shifts]
    seed_var = sum(s * s for s in seed_shifts) / 3  # their variance (mean 0)
    expected = next(n for n in range(4, 1000) if z * (seed_var / n) ** 0.5 <= 0.10)
    assert seeds_for_mdd(table, 0.10) == expected
    # anchored to a wider observed MDD at the table's own seeds, it takes proportionally more
    at_four = z * (seed_var / 4) ** 0.5
    wider = next(n for n in range(4, 1000) if 1.5 * z * (seed_var / n) ** 0.5 <= 0.10)
    assert seeds_for_mdd(table, 0.10, observed=1.5 * at_four) == wider > expected
    # already under the target: the seeds it has
    assert seeds_for_mdd(table, 0.5) == 4
    # the arms differ by item, the same way in every seed: more seeds never help, more items would
    by_item = [[0.9 if i % 2 else -0.9 for i in range(20)]] * 5
    assert seeds_for_mdd(by_item, 0.10) is None
    # one seed, or nothing: no projection
    assert seeds_for_mdd([[0.1, 0.2, 0.0]], 0.10) is None
    assert seeds_for_mdd([[None, None], [None, None]], 0.10) is None


def test_the_projection_holds_when_the_seeds_are_run():
    """Project from pilots of 6 seeds of a design with seed, item and noise variation (each projection is noisy:
    6 seeds estimate the seeds' spread roughly), then run the pilots' median projection of the same design: the
    bootstrap interval's paired MDD comes out near the target."""
    import random
    import statistics

    draw = random.Random(0)
    design = {"items": 60, "seed_sd": 0.1, "item_sd": 0.1, "noise_sd": 0.3}
    projections = []
    for _ in range(15):
        pilot = _differences(6, draw=draw, **design)
        figure = bootstrap_mean(pilot, resamples=300)
        projections.append(seeds_for_mdd(pilot, 0.08, observed_mdd(figure["low"], figure["high"])))
    need = int(statistics.median(projections))
    assert need > 6
    reached = []
    for _ in range(3):  # three independent runs of the projected size
        figure = bootstrap_mean(_differences(need, draw=draw, **design), resamples=300)
        reached.append(observed_mdd(figure["low"], figure["high"]))
    assert 0.06 < statistics.mean(reached) < 0.105, (need, projections, reached)


def test_the_report_shows_the_projected_seeds_beside_the_paired_mdd():
    from pivot_envs.adapters.reproduce.report import _interval

    base = {"low": -0.15, "high": 0.02, "threshold": 0, "n": 155, "mdd": 0.16, "paired_mdd": 0.13}
    projected = {**base, "seeds": 9, "target_mdd": 0.10}
    assert _interval({**projected, "seeds_for_target": 19}).endswith("(paired: 13; 10 pts needs ~19 seeds)")
    assert _interval({**projected, "seeds_for_target": 9}).endswith("(paired: 13; under 10 pts with 9 seeds)")
    assert _interval({**projected, "seeds_for_target": None}).endswith(
        "(paired: 13; 10 pts needs more held-out items)"
    )
    assert _interval({**projected, "seeds": 1, "seeds_for_target": None}).endswith("(paired: 13)")
    assert _interval(base).endswith("(paired: 13)")


def test_compared_pivots_must_not_be_negative():
    from pivot_envs.adapters.reproduce.scales import get_scale

    assert get_scale("cpu").compared_pivots is None
    assert get_scale("cpu", compared_pivots=0).compared_pivots == 0
    with pytest.raises(ValueError, match="--compared-pivots must be 0"):
        get_scale("cpu", compared_pivots=-1)


def test_set_changes_any_size_of_a_scale_and_the_notes_say_which():
    from dataclasses import replace

    from pivot_envs.adapters.reproduce.scales import get_scale

    scale = get_scale(
        "gpu",
        sets=[
            "steps=2",
            "ks=4,8",
            "train-domains=search",
            "compared_pivots=0",
            "progress=no",
            "learning_rate=3e-5",
        ],
    )
    assert (scale.train.steps, scale.ks, scale.train_domains, scale.compared_pivots) == (
        2,
        (4, 8),
        ("search",),
        0,
    )
    assert (scale.progress, scale.train.learning_rate, scale.name) == (False, 3e-5, "gpu")
    # a size of a config is set in that config; the others keep the scale's
    assert scale.train == replace(get_scale("gpu").train, steps=2, learning_rate=3e-5)
    assert scale.notes[-1] == (
        "sizes set on the command line: steps=2, ks=4,8, train_domains=search, compared_pivots=0, "
        "progress=False, learning_rate=3e-05"
    )
    assert get_scale("gpu", sets=["compared_pivots=none"]).compared_pivots is None
    # the named options win over --set, and no --set leaves the named scale as it is
    assert get_scale("cpu", seeds=4, sets=["seeds=9", "device=cuda"]).seeds == 4
    assert get_scale("cpu", sets=[]) == get_scale("cpu")


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("stepz=3", "unknown scale field 'stepz'; did you mean 'steps'"),
        ("name=mine", "unknown scale field 'name'"),
        ("steps", "--set expects FIELD=VALUE, got 'steps'"),
        ("steps=two", "--set steps=two: expected int, got 'two'"),
        ("ks=4,x", "--set ks=4,x: expected tuple"),
        ("progress=maybe", "--set progress=maybe: expected one of 1, true"),
        ("steps=0", "--set steps must be at least 1, got 0"),
        ("candidates=-1", "--set candidates must not be negative, got -1"),
        ("heldout=1.5", "--set heldout must be between 0 and 1"),
        ("k=2", "--set: ks 2,4 must lie within 1..k (k=2)"),
        (
            "train_domains=terminal",
            "the training domains terminal must be among the measured domains tool-use",
        ),
    ],
)
def test_set_refuses_what_is_not_a_size_of_the_scale_and_names_it(item, message):
    from pivot_envs.adapters.reproduce.scales import get_scale
    from pivot_envs.config import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        get_scale("quick", sets=[item])


def test_the_command_reports_a_bad_set_as_a_usage_error_before_running_anything(tmp_path, capsys):
    from pivot_envs.cli import main

    out = tmp_path / "never"
    assert main(["reproduce", "--set", "domains=tool-use,serch", "--out", str(out)]) != 0
    assert "unknown domain 'serch'; did you mean 'search'" in capsys.readouterr().err
    assert main(["reproduce", "--set", "stepz=1", "--out", str(out)]) == 2
    assert "did you mean 'steps'" in capsys.readouterr().err
    assert not out.exists()


def test_a_run_with_set_writes_the_changed_sizes_into_its_report(tmp_path):
    from pivot_envs.cli import main

    command = ["reproduce", "--scale", "quick", "--only", "theorems", "--out", str(tmp_path)]
    assert main([*command, "--set", "steps=1", "--set", "ks=2"]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["scale"]["steps"], report["scale"]["ks"]) == (1, [2])
    assert "Note: sizes set on the command line: steps=1, ks=2." in (tmp_path / "report.md").read_text()


def test_a_report_made_on_a_gpu_says_its_seeds_do_not_repeat_bit_for_bit():
    from pivot_envs.adapters.reproduce.report import _device_note
    from pivot_envs.adapters.reproduce.scales import get_scale

    assert _device_note(get_scale("cpu")) == [] and _device_note(get_scale("quick")) == []
    for scale in (get_scale("gpu"), get_scale("cpu", device="cuda:1")):
        (note,) = _device_note(scale)
        assert note.startswith("Note: on a GPU, training with the same seed does not repeat bit for bit")


def test_comparing_on_more_pivots_keeps_the_base_its_measurements_and_the_profiles(tmp_path):
    from pivot_envs.adapters.reproduce.experiments import (
        BASE_FIELDS,
        MEASURE_FIELDS,
        PROFILE_FIELDS,
        Experiments,
    )
    from pivot_envs.adapters.reproduce.scales import get_scale
    from pivot_envs.adapters.reproduce.stages import Stages, digest

    default, every = (
        Experiments(get_scale("quick", compared_pivots=size), tmp_path, Stages(tmp_path))
        for size in (None, 0)
    )
    for fields in (BASE_FIELDS, MEASURE_FIELDS, PROFILE_FIELDS):
        assert digest(default.settings(fields)) == digest(every.settings(fields))
    # at its default the field is left out of the arms' settings, so runs made before it existed stay valid
    assert "compared_pivots" not in default.settings()["scale"]
    assert every.settings()["scale"]["compared_pivots"] == 0
    domain = "tool-use"
    record = every.data.record[domain]
    assert default.data.compared[domain] == default.data.evaluation[domain]
    assert every.data.evaluation[domain] == default.data.evaluation[domain]
    assert len(every.data.compared[domain]) == record["heldout_pivots"] > len(every.data.evaluation[domain])
    assert {p.trajectory_id for p in every.data.compared[domain]} <= set(record["heldout_trajectories"])
    assert record["compared"] == [p.id for p in every.data.compared[domain]]
    assert "compared" not in every.data.record["search"]  # measured only, not trained in


def test_an_unknown_experiment_is_named_with_a_suggestion():
    from pivot_envs.adapters.reproduce.runner import check_only

    with pytest.raises(UnknownNameError, match="ablaton.*ablation"):
        check_only(["ablaton"])


# -- the quick scale, end to end -------------------------------------------------------------------------


def test_the_quick_report_decides_every_claim(quick, report):
    out = quick
    assert {c["claim"] for c in report["claims"]} == CLAIMS
    for item in report["claims"]:
        assert set(item) >= FIELDS, item["claim"]
        assert item["verdict"] in VERDICTS, item
    text = (out / "report.md").read_text()
    for item in report["claims"]:
        assert item["title"] in text
        assert f"**{item['verdict']}**" in text


def test_the_arms_are_compared_on_their_own_held_out_set_and_the_base_on_its_sample(quick, report):
    record = report["split"]["tool-use"]
    assert len(record["compared"]) == COMPARED and len(record["evaluated"]) == 8
    for arm in ("pivotrl", "sft", "cand-strict"):
        result = json.loads((quick / "stages" / f"train-tool-use-{arm}-s0" / "result.json").read_text())
        assert len(result["result"]["turns"]["tool-use"]) == COMPARED, arm
    base = json.loads((quick / "stages" / "measure-base" / "result.json").read_text())["result"]
    assert len(base["turns"]["tool-use"]) == 8
    compared = [c for c in report["claims"] if c["interval"] and "mdd" in c["interval"]]
    assert {c["claim"] for c in compared} >= {"ablation-filtering", "sft-in-domain", "objective"}
    for item in compared:
        assert item["interval"]["paired_mdd"] == pytest.approx(
            observed_mdd(item["interval"]["low"], item["interval"]["high"])
        )
        assert item["interval"]["target_mdd"] == 0.10 and "seeds_for_target" in item["interval"]
    text = (quick / "report.md").read_text()
    assert "| base 8 (" in text and f"; arms {COMPARED} (" in text and "(paired: " in text
    assert (
        f"compared on {COMPARED} held-out pivots of each training domain (`--compared-pivots {COMPARED}`)"
        in text
    )


def test_each_trained_arm_gains_over_the_base_measured_on_the_same_compared_items(quick, report):
    stage = json.loads((quick / "stages" / "measure-base-compared" / "result.json").read_text())["result"]
    base = stage["turns"]["tool-use"]
    assert (
        len(base) == COMPARED and "search" not in stage["turns"]
    )  # the training domain's compared items only
    made = {c["claim"]: c for c in report["claims"]}
    for arm in report["per_seed"]["tool-use"]:
        item = made[f"gain-{arm}"]
        assert item["title"] == f"{arm} improves on the base in domain" and "Table 1" in item["paper_section"]
        seeds = sorted((quick / "stages").glob(f"train-tool-use-{arm}-s*/result.json"))
        differences = [
            a - b
            for path in seeds
            for a, b in zip(json.loads(path.read_text())["result"]["turns"]["tool-use"], base)
            if a is not None and b is not None
        ]
        assert item["interval"]["estimate"] == pytest.approx(sum(differences) / len(differences)), arm
        assert item["interval"]["seeds"] == len(seeds) == 3 and "paired_mdd" in item["interval"]
        assert item["verdict"] == verdict(item["interval"]["low"], item["interval"]["high"]), arm
    assert "+19.46" in made["gain-pivotrl"]["paper"] and "+14.09" in made["gain-sft"]["paper"]
    assert (
        "| pivotrl improves on the base in domain (Sec. 4.2, Table 1 (gain over base)) |"
        in (quick / "report.md").read_text()
    )


def test_a_constant_gain_over_the_base_is_reproduced_and_an_unmeasured_base_decides_nothing():
    from pivot_envs.adapters.reproduce.claims import gain_claims

    def seed(*turns):
        return {"turns": {"search": list(turns)}}

    arms = {
        ("search", "pivotrl"): [seed(1.0, 1.0, 1.0, None)] * 3,
        ("search", "sft"): [seed(0.0, 0.0, 1.0, 1.0)],
    }
    base = {"turns": {"search": [0.0, 0.0, 0.0, 1.0]}}
    gained, level = gain_claims(arms, base, ["search"], ["pivotrl", "sft"])
    assert gained["verdict"] == "reproduced" and gained["interval"]["estimate"] == pytest.approx(1.0)
    assert level["verdict"] == "inconclusive" and level["interval"]["estimate"] == pytest.approx(0.25)
    assert "1 seed of the arm against the base's one greedy reply" in level["detail"]
    (unmeasured,) = gain_claims(arms, None, ["search"], ["pivotrl"])
    assert unmeasured["interval"] is None and unmeasured["verdict"] == "inconclusive"
    assert unmeasured["ours"].startswith("not measured")


def test_signal_has_a_verdict_per_profiled_domain_so_a_base_that_always_fails_decides_only_its_own():
    from pivot_envs.adapters.reproduce.claims import signal_claims

    def profile(*groups):
        rows = [rewards for count, rewards in groups for _ in range(count)]
        return {
            "candidates": [
                {"id": str(i), "rewards": r, "valid": [True] * len(r), "strict": None}
                for i, r in enumerate(rows)
            ]
        }

    # tool use: the base fails every sample; search: four fifths of its candidates have mixed rewards
    profiles = {
        "tool-use": profile((80, [0.0] * 4)),
        "search": profile((40, [0.0, 1.0, 0.0, 1.0]), (10, [1.0] * 4)),
    }
    made = {c["claim"]: c for c in signal_claims(profiles, [2, 4], 4, {}, ["search"])}
    assert set(made) == {"signal", "signal-tool-use", "signal-search"}
    assert made["signal"]["verdict"] == "reproduced" and "pooled" in made["signal"]["title"]
    assert "The base scored alike at every sample in tool-use." in made["signal"]["detail"]
    assert made["signal-tool-use"]["verdict"] == "reproduced"
    assert "every sample of the base scored 0" in made["signal-tool-use"]["ours"]
    assert made["signal-search"]["verdict"] == "not reproduced"
    assert made["signal-search"]["interval"]["estimate"] == pytest.approx(0.2)
    assert "base scored" not in made["signal-search"]["ours"]


def test_every_report_written_into_a_folder_states_which_look_at_its_stages_it_is(quick, tmp_path):
    import shutil

    from pivot_envs.adapters.reproduce.runner import reproduce
    from pivot_envs.adapters.reproduce.scales import get_scale

    out = tmp_path / "run"
    shutil.copytree(quick, out)
    (out / "looks.json").write_text(json.dumps({"E1": 1}))  # a pre-registered analysis's count is its own
    scale = get_scale("quick", compared_pivots=COMPARED)
    for look in (1, 2):
        path, stages = reproduce(scale, out, ["sft"], finished_only=True)
        assert stages.computed == []
        assert json.loads((out / "report.json").read_text())["looks"] == look
        assert f"This report is look {look} of these stages" in path.read_text()
    assert "1 earlier report was written into this folder" in path.read_text()
    assert json.loads((out / "looks.json").read_text()) == {"E1": 1, "report": 2}


def test_finished_only_without_the_base_on_the_compared_items_measures_nothing_and_says_so(quick, tmp_path):
    import shutil

    from pivot_envs.adapters.reproduce.runner import reproduce
    from pivot_envs.adapters.reproduce.scales import get_scale

    shutil.copytree(quick / "stages", tmp_path / "stages", ignore=shutil.ignore_patterns("weights.pt"))
    shutil.rmtree(tmp_path / "stages" / "measure-base-compared")
    _, stages = reproduce(get_scale("quick", compared_pivots=COMPARED), tmp_path, ["sft"], finished_only=True)
    assert stages.computed == []
    made = {c["claim"]: c for c in json.loads((tmp_path / "report.json").read_text())["claims"]}
    assert made["gain-pivotrl"]["ours"].startswith("not measured") and made["gain-sft"]["interval"] is None
    assert made["sft-in-domain"]["interval"] is not None


def test_every_verdict_follows_from_its_interval(report):
    decided = [
        c for c in report["claims"] if isinstance(c["interval"], dict) and "direction" in c["interval"]
    ]
    assert len(decided) >= 7
    for item in decided:
        interval = item["interval"]
        assert item["verdict"] == verdict(
            interval["low"], interval["high"], interval["direction"], interval["threshold"]
        ), item["claim"]


def test_the_online_arm_reprofiled_its_pool_halfway_and_the_offline_arm_did_not(quick, report):
    def history(arm: str) -> list[dict]:
        result = json.loads((quick / "stages" / f"train-tool-use-{arm}-s0" / "result.json").read_text())
        return result["result"]["history"]

    online, offline = history("pivotrl-online"), history("pivotrl")
    assert [h["step"] for h in online] == [1, 2]
    assert online[0]["retired"] is None and online[1]["retired"] is not None  # re-profiled before step 2
    assert all(h["pivots_in_play"] is not None for h in online)
    assert all(h["pivots_in_play"] is None for h in offline)
    item = next(c for c in report["claims"] if c["claim"] == "online")
    assert "retired" in item["detail"] and item["paper_section"].startswith("beyond the paper")


def test_the_theorem_checks_ran_and_passed(report):
    theorems = next(c for c in report["claims"] if c["claim"] == "theorems")
    assert theorems["verdict"] == "reproduced", theorems["ours"]
    assert "test_theorems.py" in theorems["detail"]


def test_no_trajectory_is_on_two_sides_of_the_split(report):
    for domain, record in report["split"].items():
        heldout, part_a, part_b = (
            set(record[f"{side}_trajectories"]) for side in ("heldout", "part_a", "part_b")
        )
        assert heldout and part_a and part_b, domain
        assert not heldout & part_a and not heldout & part_b and not part_a & part_b, domain


def test_a_rerun_reads_every_finished_stage_instead_of_running_it(quick):
    from pivot_envs.adapters.reproduce.runner import reproduce
    from pivot_envs.adapters.reproduce.scales import get_scale

    results = sorted((quick / "stages").glob("*/result.json"))
    assert len(results) >= 10
    before = {path: path.stat().st_mtime_ns for path in results}
    path, stages = reproduce(get_scale("quick", compared_pivots=COMPARED), quick)
    assert stages.computed == []
    assert sorted(stages.reused) == sorted(p.parent.name for p in results)
    assert {path: path.stat().st_mtime_ns for path in results} == before
    assert path.exists()


def test_an_interrupted_stage_is_run_again_from_scratch(tmp_path):
    from pivot_envs.adapters.reproduce.stages import Stages

    stages = Stages(tmp_path)
    (tmp_path / "stages" / "x.partial").mkdir(parents=True)
    (tmp_path / "stages" / "x.partial" / "left-over").write_text("half done")

    def work(folder):
        assert not (folder / "left-over").exists()
        (folder / "weights").write_text("w")
        return {"value": 1}

    assert stages.run("x", {"a": 1}, work) == {"value": 1}
    assert stages.computed == ["x"] and (tmp_path / "stages" / "x" / "weights").exists()
    assert Stages(tmp_path).run("x", {"a": 1}, lambda f: {"value": 2}) == {"value": 1}
    assert Stages(tmp_path).run("x", {"a": 2}, lambda f: {"value": 3}) == {
        "value": 3
    }  # other settings: run again


def test_a_stage_whose_files_were_left_behind_is_rebuilt_and_must_give_its_recorded_result(tmp_path):
    import torch  # a stage records the CPU kernels of the torch its process uses

    from pivot_envs.adapters.reproduce.stages import StageMismatchError, Stages

    def work(value):
        def write(folder):
            (folder / "weights").write_text(f"w{value}")
            return {"value": value, "loss": 0.1 + value}

        return write

    Stages(tmp_path).run("base", {"a": 1}, work(1))
    folder = tmp_path / "stages" / "base"
    (folder / "weights").unlink()  # the run's stages/ copied to another machine without its weights
    stages = Stages(tmp_path)
    assert stages.rebuild("base", {"a": 1}, work(1)) == {"value": 1, "loss": 1.1}
    assert (folder / "weights").read_text() == "w1" and stages.computed == ["base"]
    assert json.loads((folder / "result.json").read_text())["result"] == {"value": 1, "loss": 1.1}
    # a rebuild that gives another result is refused, and leaves the recorded stage as it was
    (folder / "weights").unlink()
    with pytest.raises(
        StageMismatchError, match=r"stage base rebuilt on this machine gives .*'value': 2.*not the"
    ) as refused:
        Stages(tmp_path).rebuild("base", {"a": 1}, work(2))
    # it names the CPU kernels (the committed stages repeat only with AVX2's) and how to choose them
    recorded = json.loads((folder / "result.json").read_text())["machine"]
    assert recorded["torch"] == torch.__version__
    assert recorded["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert f"recorded with the {recorded['cpu_capability']} CPU kernels" in str(refused.value)
    assert "ATEN_CPU_CAPABILITY" in str(refused.value)
    assert not (folder / "weights").exists() and not (tmp_path / "stages" / "base.partial").exists()
    assert Stages(tmp_path).run("base", {"a": 1}, work(3)) == {"value": 1, "loss": 1.1}
    # a stage that never finished is simply run
    assert Stages(tmp_path).rebuild("other", {"a": 1}, work(4)) == {"value": 4, "loss": 4.1}


def test_a_run_continued_from_stages_copied_without_the_base_weights_rebuilds_them_as_recorded(
    quick, tmp_path
):
    import shutil

    from pivot_envs.adapters.reproduce.runner import reproduce
    from pivot_envs.adapters.reproduce.scales import get_scale

    shutil.copytree(quick / "stages", tmp_path / "stages", ignore=shutil.ignore_patterns("weights.pt"))
    recorded = json.loads((quick / "stages" / "base" / "result.json").read_text())["result"]
    # reporting needs no weights: nothing is trained or rebuilt
    _, stages = reproduce(get_scale("quick", compared_pivots=COMPARED), tmp_path, ["sft"], finished_only=True)
    assert stages.computed == [] and not (tmp_path / "stages" / "base" / "weights.pt").exists()
    # a new seed needs them: the base is rebuilt, bit for bit as recorded on a CPU, and the seed trains on it
    _, stages = reproduce(get_scale("quick", compared_pivots=COMPARED, seeds=4), tmp_path, ["sft"])
    assert stages.computed == ["base", "train-tool-use-pivotrl-s3", "train-tool-use-sft-s3"]
    assert json.loads((tmp_path / "stages" / "base" / "result.json").read_text())["result"] == recorded
    assert (tmp_path / "stages" / "base" / "weights.pt").is_file()


def test_resizing_the_arms_keeps_the_base_and_the_profiles_but_reruns_the_arms(tmp_path):
    from dataclasses import replace

    from pivot_envs.adapters.reproduce.experiments import (
        BASE_FIELDS,
        MEASURE_FIELDS,
        PROFILE_FIELDS,
        Experiments,
    )
    from pivot_envs.adapters.reproduce.scales import get_scale
    from pivot_envs.adapters.reproduce.stages import Stages, digest

    scale = get_scale("quick")
    resized = replace(
        scale,
        train=replace(scale.train, steps=scale.train.steps + 3, group_size=2),
        sft=replace(scale.sft, epochs=3),
        seeds=5,
    )
    one, two = (Experiments(s, tmp_path, Stages(tmp_path)) for s in (scale, resized))
    for fields in (BASE_FIELDS, MEASURE_FIELDS, PROFILE_FIELDS):
        assert digest(one.settings(fields, domain="search")) == digest(two.settings(fields, domain="search"))
    assert digest(one.settings(domain="search", arm="sft", seed=0)) != digest(
        two.settings(domain="search", arm="sft", seed=0)
    )
    # what the base is trained on does change it
    wider = Experiments(replace(scale, base_examples=scale.base_examples + 1), tmp_path, Stages(tmp_path))
    assert digest(one.settings(BASE_FIELDS)) != digest(wider.settings(BASE_FIELDS))
    assert digest(one.settings(PROFILE_FIELDS)) != digest(
        Experiments(
            replace(scale, profile=replace(scale.profile, k=scale.profile.k * 2)), tmp_path, Stages(tmp_path)
        ).settings(PROFILE_FIELDS)
    )


def test_finished_only_reports_the_seeds_each_arm_finished_and_trains_nothing(quick, tmp_path):
    import shutil

    from pivot_envs.adapters.reproduce.runner import reproduce
    from pivot_envs.adapters.reproduce.scales import get_scale

    out = tmp_path / "run"
    shutil.copytree(quick, out)
    # the per-action arm finished seed 0 only (its seed 2 is not counted: seed 1 is missing)
    shutil.rmtree(out / "stages" / "train-tool-use-pivotrl-action-s1")
    path, stages = reproduce(get_scale("quick", compared_pivots=COMPARED, seeds=5), out, finished_only=True)
    assert stages.computed == []
    made = {item["claim"]: item for item in json.loads((out / "report.json").read_text())["claims"]}
    assert "paired by seed and pivot, 1 seed." in made["objective"]["detail"]
    assert "paired by seed and pivot, 3 seeds." in made["ablation-filtering"]["detail"]
    assert made["e2e"]["verdict"] == "inconclusive" and "--finished-only" in made["e2e"]["ours"]
    text = path.read_text()
    assert "no arm was trained for this report" in text and "pivotrl-action 1," in text
    assert "seeds 0, 1, 2." in text
    # each arm's accuracy per seed, as the command computes it from its stages, the blank where it stopped
    per_seed = json.loads((out / "report.json").read_text())["per_seed"]["tool-use"]
    assert len(per_seed["pivotrl"]) == 3 and len(per_seed["pivotrl-action"]) == 1
    turns = json.loads((out / "stages" / "train-tool-use-pivotrl-s1" / "result.json").read_text())
    graded = [r for r in turns["result"]["turns"]["tool-use"] if r is not None]
    assert per_seed["pivotrl"][1] == pytest.approx(sum(graded) / len(graded))
    assert "## Held-out accuracy per seed" in text
    assert f"| pivotrl-action | {100 * per_seed['pivotrl-action'][0]:.1f} |  |  |" in text
    # with no arm asked for, nothing is trained either, and the report is written
    path, stages = reproduce(
        get_scale("quick", compared_pivots=COMPARED), out, ["theorems"], finished_only=True
    )
    assert stages.computed == [] and "no arm was trained for this report" in path.read_text()


def test_per_seed_accuracy_counts_the_graded_items_of_each_training_domain():
    from pivot_envs.adapters.reproduce.runner import per_seed_accuracy

    def seed(*turns):
        return {"turns": {"search": list(turns), "tool-use": [0.0]}}

    arms = {
        ("search", "pivotrl"): [seed(1.0, 0.0, None, 1.0), seed(None, None)],
        ("search", "sft"): [seed(0.0, 0.0)],
        ("tool-use", "sft"): [{"turns": {"tool-use": [1.0]}}],
    }
    assert per_seed_accuracy(arms, ["search"]) == {"search": {"pivotrl": [2 / 3, None], "sft": [0.0]}}
    assert per_seed_accuracy(arms, ["search", "tool-use"])["tool-use"] == {"sft": [1.0]}


def test_the_online_summary_compares_the_seeds_both_arms_have():
    from pivot_envs.adapters.reproduce.claims import online_summary

    def run(mixed: float, retired: int | None = None) -> dict:
        return {"history": [{"step": 2, "frac_zero_variance": 1.0 - mixed, "retired": retired, "revived": 0}]}

    # seed 0 of each arm, and a seed 1 of the offline arm only (finished later): it is left out
    arms = {("search", "pivotrl-online"): [run(0.5, retired=3)], ("search", "pivotrl"): [run(0.25), run(1.0)]}
    summary = online_summary(arms, ["search"])
    assert "3 pivots were retired" in summary
    assert "50.0% of the online arm's groups had mixed rewards against 25.0% of the offline arm's" in summary


# -- the cpu run in progress, kept in the repository ------------------------------------------------------


def test_the_committed_stages_of_the_sft_run_are_this_codes_cpu_scale_and_report_without_training(tmp_path):
    """benchmarks/stages/reproduce-cpu-sft holds a run's stages without the base's weights (docs/reproduce.md): a
    change to the cpu scale would leave them stale, and a later run would train them again."""
    import shutil
    from pathlib import Path

    from pivot_envs.adapters.reproduce.experiments import (
        BASE_FIELDS,
        MEASURE_FIELDS,
        PROFILE_FIELDS,
        Experiments,
    )
    from pivot_envs.adapters.reproduce.runner import reproduce
    from pivot_envs.adapters.reproduce.scales import get_scale
    from pivot_envs.adapters.reproduce.stages import Stages

    committed = Path(__file__).resolve().parents[2] / "benchmarks" / "stages" / "reproduce-cpu-sft"
    shutil.copytree(committed, tmp_path / "stages")
    assert not list((tmp_path / "stages").rglob("weights.pt")) and not list(
        (tmp_path / "stages").glob("*.partial")
    )
    scale = get_scale("cpu", compared_pivots=0, seeds=20)
    runs = Experiments(scale, tmp_path, Stages(tmp_path))
    stale = "the cpu scale changed since these stages were run: rerun them or remove the folder"
    assert runs.stages.finished("base", runs.settings(BASE_FIELDS)), stale
    assert runs.stages.finished("measure-base", runs.settings(MEASURE_FIELDS)), stale
    assert runs.stages.finished("profile-search", runs.settings(PROFILE_FIELDS, domain="search")), stale
    seeds = sorted({int(p.name.rsplit("-s", 1)[1]) for p in (tmp_path / "stages").glob("train-search-*")})
    assert len(seeds) >= 3 and seeds == list(range(len(seeds)))
    assert all(runs.arm_finished("search", arm, seed) for arm in ("pivotrl", "sft") for seed in seeds), stale
    path, stages = reproduce(scale, tmp_path, ["sft"], finished_only=True)
    assert stages.computed == [] and "sft-in-domain" in {
        c["claim"] for c in json.loads((tmp_path / "report.json").read_text())["claims"]
    }


def test_the_cpu_scale_made_of_its_configs_records_the_sizes_its_committed_stages_were_digested_with():
    """The scales hold the stages' own configs; the stages record them flat (Scale.to_dict), so the committed
    stages' settings must be the cpu scale's, name for name (the digests follow, see the test above)."""
    from pathlib import Path

    from pivot_envs.adapters.reproduce.scales import CONFIG_SIZES, get_scale

    committed = Path(__file__).resolve().parents[2] / "benchmarks" / "stages" / "reproduce-cpu-sft"
    recorded = json.loads((committed / "train-search-pivotrl-s0" / "result.json").read_text())["settings"][
        "scale"
    ]
    ours = json.loads(json.dumps(get_scale("cpu", compared_pivots=0).to_dict()))
    assert set(CONFIG_SIZES) <= set(recorded)
    assert set(ours) - set(recorded) == {"name", "seeds", "progress", "profile_domains", "notes"}
    assert {key: ours[key] for key in recorded} == recorded


def test_one_action_length_serves_profiling_training_and_measuring():
    from dataclasses import replace

    from pivot_envs.adapters.reproduce.scales import SCALES, get_scale
    from pivot_envs.config import ConfigError

    short = get_scale("cpu", sets=["max_new_tokens=12"])
    assert short.train.max_new_tokens == short.profile.max_new_tokens == 12
    cpu = SCALES["cpu"]
    with pytest.raises(ConfigError, match=re.escape("profile.max_new_tokens=12 must be one value")):
        replace(cpu, profile=replace(cpu.profile, max_new_tokens=12))


def test_set_parses_sizes_after_a_commands_parser_resolved_the_configs_annotations():
    """Building `pivotrl train`'s parser (simple_parsing) turns GRPOConfig's annotations from text into types;
    `--set steps=...` must parse the same afterwards (it compared the text 'two' with 1 in the full suite)."""
    import io

    from pivot_envs.adapters.reproduce.scales import get_scale
    from pivot_envs.cli import build_parser
    from pivot_envs.config import ConfigError

    for name in ("train", "profile"):
        build_parser("").commands[name].print_help(io.StringIO())
    assert get_scale("quick", sets=["steps=3"]).train.steps == 3
    with pytest.raises(ConfigError, match="expected int, got 'two'"):
        get_scale("quick", sets=["steps=two"])
