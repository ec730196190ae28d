"""`reproduce`: run the stages a selection of experiments needs, then decide each claim and write the report."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pivot_envs.adapters.reproduce import claims as claims_of
from pivot_envs.adapters.reproduce import report
from pivot_envs.adapters.reproduce.experiments import (
    ARMS,
    EXPERIMENT_ARMS,
    EXPERIMENTS,
    Experiments,
)
from pivot_envs.adapters.reproduce.prereg import PLANS, analyse, check_seeds, report_missing, write_report
from pivot_envs.adapters.reproduce.report import count_look
from pivot_envs.adapters.reproduce.scales import Scale
from pivot_envs.adapters.reproduce.stages import Stages
from pivot_envs.adapters.reproduce.stats import bootstrap_mean
from pivot_envs.config import ConfigError
from pivot_envs.errors import UnknownNameError

# Which plot each claim shows.
FIGURES = {
    "signal": "signal",
    "signal-training": "signal-training",
    "strict-functional": "strict-functional",
    "ablation-filtering": "arms",
    "ablation-reward": "arms",
    "sft-in-domain": "arms",
    "objective": "arms",
    "online": "arms",
    "sft-ood": "sft",
    "gain": "arms",  # gain-ARM
}


# Pre-registered experiments (docs/preregistration.md): each runs alone, and none by default.
REGISTERED = (*PLANS, "paper-regime-pilot")


def check_only(only: Sequence[str] | None) -> list[str]:
    """The experiments to run: all but the pre-registered ones, or those named (each checked against
    EXPERIMENTS). A pre-registered experiment runs alone: its one look must not share a report."""
    if not only:
        return [name for name in EXPERIMENTS if name not in REGISTERED]
    for name in only:
        if name not in EXPERIMENTS:
            raise UnknownNameError("experiment", name, EXPERIMENTS)
    registered = [name for name in only if name in REGISTERED]
    if registered and len(set(only)) > 1:
        raise ConfigError(
            f"--only {','.join(only)}: {registered[0]} is pre-registered (docs/preregistration.md) and runs alone"
        )
    return [name for name in EXPERIMENTS if name in only]


def parse_seeds(text: str) -> int | list[int]:
    """`--seeds`: a count N (seeds 0 .. N-1) or a list of seeds and ranges, "0-17" or "100-114" or "3,5,8-9"."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    seeds: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not match or (match.group(2) and int(match.group(2)) < int(match.group(1))):
            raise ConfigError(f"--seeds {text!r}: give a count (3) or seeds and ranges (0-17, or 3,5,8-9)")
        first = int(match.group(1))
        seeds += range(first, int(match.group(2) or first) + 1)
    return list(dict.fromkeys(seeds))


def with_local_figures(item: dict[str, Any], out: Path) -> dict[str, Any]:
    """The e2e claim with its figures' paths relative to the report (e2e.run writes under OUT/e2e)."""
    local = []
    for figure in item.get("figures", []):
        path = Path(figure)
        found = next(
            (c for c in ([path] if path.is_absolute() else [out / path, out / "e2e" / path]) if c.exists()),
            None,
        )
        local.append(os.path.relpath(found, out) if found else figure)
    return {**item, "figures": local}


def finished_arms(
    arms: dict[tuple[str, str], list[dict[str, Any]]], train_domains: Sequence[str]
) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Each arm's finished seeds, the same in every training domain (the fewest any domain has); an arm with
    none is left out, so the claims that need it are not made."""
    names = dict.fromkeys(arm for _, arm in arms)
    kept = {}
    for arm in names:
        seeds = min(len(arms.get((domain, arm), [])) for domain in train_domains)
        if seeds:
            kept.update({(domain, arm): arms[(domain, arm)][:seeds] for domain in train_domains})
    return kept


def per_seed_accuracy(
    arms: dict[tuple[str, str], list[dict[str, Any]]], train_domains: Sequence[str]
) -> dict[str, dict[str, list[float | None]]]:
    """Each training domain's held-out turn accuracy per arm and seed (seeds 0, 1, ... in order): the share of
    its compared held-out pivots graded 1, over the items that were graded (None where none was)."""
    table: dict[str, dict[str, list[float | None]]] = {}
    for (domain, arm), results in arms.items():
        if domain in train_domains:
            row = table.setdefault(domain, {}).setdefault(arm, [])
            for result in results:
                graded = [r for r in result["turns"][domain] if r is not None]
                row.append(sum(graded) / len(graded) if graded else None)
    return table


def registered(
    scale: Scale, out: Path, name: str, seeds: Sequence[int] | None, finished_only: bool
) -> tuple[Path | None, Stages]:
    """Run pre-registered experiment `name`: its arms' `seeds` (default: all it registers; a subset lets several
    processes train disjoint seeds), then, once every registered seed of every arm has finished, its one
    analysis. Returns the report's path (None while seeds are missing: nothing held-out is summarised before)."""
    plan = PLANS[name]
    planned = plan.seeds_at(scale)
    run_seeds = check_seeds(plan, planned, seeds)
    out.mkdir(parents=True, exist_ok=True)
    stages = Stages(out)
    runs = Experiments(scale, out, stages)
    runs.base()
    base = runs.base_measures()
    base_compared = runs.base_compared()
    runs.profile(scale.train_domains[0])
    if not finished_only:
        for domain in scale.train_domains:
            for seed in run_seeds:
                for arm in plan.arms:
                    runs.arm(domain, arm, seed)
    finished = {
        arm: [s for s in planned if all(runs.arm_finished(d, arm, s) for d in scale.train_domains)]
        for arm in plan.arms
    }
    if report_missing(plan, finished, planned):
        return None, stages
    arms = {
        (d, arm): [runs.arm(d, arm, s) for s in planned] for d in scale.train_domains for arm in plan.arms
    }
    analysis = analyse(plan, arms, base, base_compared, scale.train_domains, scale.domains)
    return write_report(out, plan, analysis, planned, count_look(out, plan.name)), stages


def reproduce(
    scale: Scale,
    out: Path,
    only: Sequence[str] | None = None,
    finished_only: bool = False,
    seeds: Sequence[int] | None = None,
) -> tuple[Path | None, Stages]:
    """Run the experiments in `only` (default: all but the pre-registered) at `scale` into `out`; returns
    report.md's path and the stages (which ran, which were read from an earlier run). `seeds` replaces the
    scale's 0 .. seeds-1 (new seeds run without retraining committed ones). With `finished_only` no arm is
    trained: each arm brings the seeds it finished in an earlier run into `out` (in order, up to the first
    missing one), and each comparison pairs the seeds both its arms have. A pre-registered experiment (alone in
    `only`) goes to `registered`."""
    chosen = check_only(only)
    if chosen in (["paper-regime-pilot"], ["paper-regime"]):
        from pivot_envs.adapters.reproduce import e2

        out.mkdir(parents=True, exist_ok=True)
        if chosen[0] == "paper-regime-pilot":
            return e2.run_pilot(scale, out)
        return e2.run_main(scale, out, list(seeds) if seeds is not None else None, finished_only)
    if chosen and chosen[0] in PLANS:
        return registered(scale, out, chosen[0], seeds, finished_only)
    out.mkdir(parents=True, exist_ok=True)
    stages = Stages(out)
    runs = Experiments(scale, out, stages)
    seeds = list(seeds) if seeds is not None else list(range(scale.seeds))
    # the arms in the order of ARMS (the full method, its ablations, SFT, then the options), seed by seed:
    # an interrupted run has the paper's main comparisons first, and every arm it trained has the same
    # seeds so far, so that adding seeds to a run adds pairs to every comparison as it goes
    wanted = {arm for name in chosen for arm in EXPERIMENT_ARMS[name]}
    arm_names = [arm for arm in ARMS if arm in wanted]
    needs_profiles = bool(arm_names) or {"signal", "strict-functional"} & set(chosen)

    profiles: dict[str, dict] = {}
    arms: dict[tuple[str, str], list[dict[str, Any]]] = {}
    base, warm_up, base_compared = None, None, None
    if needs_profiles:
        warm_up = runs.base()
        measured = [d for d in scale.domains if not scale.profile_domains or d in scale.profile_domains]
        profile_domains = (
            list(dict.fromkeys([*measured, *scale.train_domains]))
            if {"signal", "strict-functional"} & set(chosen)
            else scale.train_domains
        )
        profiles = {domain: runs.profile(domain) for domain in profile_domains}
    if arm_names:
        base = runs.base_measures()
        # the base on every compared item (each arm's gain over it); --finished-only reads it only if it ran
        if not finished_only or runs.base_compared_finished():
            base_compared = runs.base_compared()
        for domain in scale.train_domains:
            for index, seed in enumerate(seeds):
                for arm in arm_names:
                    done = arms.setdefault((domain, arm), [])
                    if finished_only and (len(done) < index or not runs.arm_finished(domain, arm, seed)):
                        continue
                    done.append(runs.arm(domain, arm, seed))
        arms = finished_arms(arms, scale.train_domains) if finished_only else arms
    trained = [arm for arm in arm_names if (scale.train_domains[0], arm) in arms]

    claims: list[dict[str, Any]] = []
    summaries: dict[str, Any] = {}
    if "signal" in chosen:
        claims += claims_of.signal_claims(profiles, scale.ks, scale.profile.k, arms, scale.train_domains)
        summaries["signal"] = claims_of.zero_variance(profiles, scale.ks)
    if "strict-functional" in chosen:
        claims.append(claims_of.strict_claim(profiles))
        summaries["strict"] = claims_of.miss_rates(profiles)[0]
    if arms:
        claims += claims_of.arm_claims(arms, base, scale.train_domains, scale.domains, set(chosen))
        claims += claims_of.gain_claims(arms, base_compared, scale.train_domains, trained)
        summaries["arms"] = {
            arm: bootstrap_mean(claims_of.in_domain(arms, arm, scale.train_domains)) for arm in trained
        }
        if base_compared is not None:
            row = [r for d in scale.train_domains for r in base_compared["turns"][d]]
            summaries["arms"] = {"base": bootstrap_mean([row]), **summaries["arms"]}
        if "sft" in chosen and {"pivotrl", "sft"} <= set(trained):
            summaries["drift"] = {
                arm: claims_of.drift(arms, base, scale.train_domains, scale.domains, arm)
                for arm in ("pivotrl", "sft")
            }
    if "theorems" in chosen:
        claims.append(claims_of.theorem_claim(runs.theorems()))
    if "e2e" in chosen:
        if finished_only and not runs.e2e_finished(seeds):
            claims.append(claims_of.e2e_missing("not run: --finished-only, and its stage has not finished"))
        else:
            e2e = runs.e2e(seeds)
            claims.append(with_local_figures(e2e, out) if e2e is not None else claims_of.e2e_missing())

    figures = report.plots(out, profiles, arms, base, scale, summaries)
    for item in claims:
        # a domain's signal claim shows the signal plot, an arm's gain the arms' plot
        shown = FIGURES.get(item["claim"]) or FIGURES.get(item["claim"].split("-")[0])
        if shown in figures:
            item["figures"] = [figures[shown], *item.get("figures", [])]
    extra = {"experiments": chosen, "seconds": stages.seconds(), "base": warm_up}
    if arms:
        extra["per_seed"] = per_seed_accuracy(arms, scale.train_domains)
    if finished_only:
        extra["arm_seeds"] = {arm: len(arms[(scale.train_domains[0], arm)]) for arm in trained}
        if trained:  # the header's seeds: those of the arm with the most
            seeds = seeds[: max(extra["arm_seeds"].values())]
    return report.write(out, scale, seeds, claims, runs.data.record, extra), stages
