"""The pre-registered experiments of docs/preregistration.md: their seeds, families of claims and analysis.

A pre-registered experiment is decided once. Its stages run like any other `pivotrl reproduce` arm
(seed by seed, resumable, committed without weights), but nothing held-out is summarised until every
registered seed of every arm has finished: before that the runner prints how many have, and no
report. The report it then writes counts its looks (OUT/looks.json): a second analysis of the same
run says that it is the second.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pivot_envs.adapters.reproduce.claims import out_of_domain
from pivot_envs.adapters.reproduce.stats import crossed_bootstrap, holm, paired_differences, reading
from pivot_envs.config import ConfigError

# A reply that is tool-call syntax: it parses as a call, or holds the chat template's tag.
TOOL_CALL = re.compile(r"<tool_call>|^\s*\{\s*\"name\"\s*:", re.MULTILINE)


@dataclass(frozen=True)
class Comparison:
    """One claim of a family: `a` minus `b` ("base" for the base) on the in-domain or the drift items."""

    name: str
    items: str  # "in-domain" or "drift"
    a: str
    b: str
    primary: bool = False


@dataclass(frozen=True)
class Plan:
    """A registered experiment: the `--only` name that runs it, its arms, its seeds at the cpu scale (other
    scales, which check the machinery, use their own seed count) and its family of claims."""

    name: str
    experiment: str
    arms: tuple[str, ...]
    seeds: tuple[int, ...]
    family: tuple[Comparison, ...]
    decide: Callable[
        [list[dict[str, Any]]], str
    ]  # the registered decision, in words, from the family's readings

    def seeds_at(self, scale: Any) -> list[int]:
        return list(self.seeds) if scale.name == "cpu" else list(range(scale.seeds))


def e1_decision(family: list[dict[str, Any]]) -> str:
    """E1's rule: the drift claim keeps "reproduced" only if E1-1 reads better and E1-2 not worse."""
    readings = {item["claim"]: item["reading"] for item in family}
    if readings["E1-1"] == "better" and readings["E1-2"] != "worse":
        return "the drift claim keeps **reproduced** (E1-1 better, E1-2 not worse)."
    return "the drift claim reads **not decided at matched budget**; the accuracy-versus-drift frontier is the table below."


def e2_decision(family: list[dict[str, Any]]) -> str:
    """E2's primaries, in words: PivotRL against SFT in domain (E2-1) and on drift (E2-2)."""
    readings = {item["claim"]: item["reading"] for item in family}
    return (
        f"in domain, PivotRL against standard SFT reads **{readings['E2-1']}** (E2-1); on drift items "
        f"**{readings['E2-2']}** (E2-2). The paper's claims read reproduced only where they read better."
    )


def e3_decision(family: list[dict[str, Any]]) -> str:
    """E3's rule: confirmed when the 95% interval's lower bound is above 0 (one-sided at 2.5%)."""
    item = family[0]
    if item["low"] > 0:
        return "the functional reward's advantage over exact match is **confirmed** on fresh seeds (E3-1)."
    return "the functional reward's advantage reads **nominal at 15 seeds, not confirmed** (E3-1)."


E1 = Plan(
    name="E1",
    experiment="sft-matched",
    arms=("pivotrl", "sft", "sft-matched", "sft-1epoch"),
    seeds=tuple(range(18)),
    family=(
        Comparison("E1-1", "drift", "pivotrl", "sft-matched", primary=True),
        Comparison("E1-2", "in-domain", "pivotrl", "sft-matched"),
        Comparison("E1-3", "drift", "pivotrl", "sft-1epoch"),
        Comparison("E1-4", "drift", "pivotrl", "base"),
    ),
    decide=e1_decision,
)
E2 = Plan(
    name="E2",
    experiment="paper-regime",
    arms=("pivotrl", "pivotrl-kl", "pivotrl-action-kl", "sft", "sft-matched"),
    seeds=tuple(range(10)),
    family=(
        Comparison("E2-1", "in-domain", "pivotrl", "sft", primary=True),
        Comparison("E2-2", "drift", "pivotrl", "sft", primary=True),
        Comparison("E2-3", "in-domain", "pivotrl", "base"),
        Comparison("E2-4", "in-domain", "pivotrl", "sft-matched"),
        Comparison("E2-5", "drift", "pivotrl", "sft-matched"),
        Comparison("E2-6", "drift", "pivotrl-kl", "pivotrl"),
        Comparison("E2-7", "in-domain", "pivotrl-action-kl", "pivotrl-kl"),
    ),
    decide=e2_decision,
)
E3 = Plan(
    name="E3",
    experiment="reward-confirmation",
    arms=("cand-functional", "cand-strict"),
    seeds=tuple(range(100, 115)),
    family=(Comparison("E3-1", "in-domain", "cand-functional", "cand-strict", primary=True),),
    decide=e3_decision,
)
PLANS = {plan.experiment: plan for plan in (E1, E2, E3)}


def tool_call_share(replies: Sequence[str]) -> float | None:
    """The share of replies that are tool-call syntax (format capture rather than forgetting)."""
    return sum(bool(TOOL_CALL.search(reply)) for reply in replies) / len(replies) if replies else None


def tables(
    arms: dict[tuple[str, str], list[dict]],
    base: dict,
    base_compared: dict,
    train_domains: Sequence[str],
    domains: Sequence[str],
    arm: str,
) -> dict[str, list[list[float | None]]]:
    """`arm`'s seeds x items tables ("base": one row) on the in-domain items (the compared held-out pivots of the
    training domains) and on the drift items (the other domains' held-out pivots, then the general questions)."""
    others = {d: [o for o in domains if o != d] for d in train_domains}
    if arm == "base":
        return {
            "in-domain": [[r for d in train_domains for r in base_compared["turns"][d]]],
            "drift": out_of_domain([base] * len(train_domains), train_domains, others),
        }
    seeds = len(arms[(train_domains[0], arm)])
    runs = [run for d in train_domains for run in arms[(d, arm)]]
    return {
        "in-domain": [
            [r for d in train_domains for r in arms[(d, arm)][s]["turns"][d]] for s in range(seeds)
        ],
        # arms measured in domain only (the reward ablation's) have no drift items
        "drift": out_of_domain(runs, train_domains, others) if all("ood_turns" in r for r in runs) else None,
    }


def analyse(
    plan: Plan,
    arms: dict[tuple[str, str], list[dict]],
    base: dict,
    base_compared: dict,
    train_domains: Sequence[str],
    domains: Sequence[str],
) -> dict[str, Any]:
    """The family's figures, Holm-adjusted p-values and readings, each arm's gain over the base, and the
    described measures (Wikipedia loss change, tool-call share of the general questions' replies)."""
    table = {
        arm: tables(arms, base, base_compared, train_domains, domains, arm) for arm in (*plan.arms, "base")
    }
    figures = []
    for comparison in plan.family:
        a, b = table[comparison.a][comparison.items], table[comparison.b][comparison.items]
        figures.append(crossed_bootstrap(paired_differences(a, b)))
    adjusted = holm([figure["p"] for figure in figures])
    family = [
        {
            "claim": c.name,
            "items": c.items,
            "a": c.a,
            "b": c.b,
            "primary": c.primary,
            **figure,
            "holm_p": p,
            "reading": reading(figure, p),
        }
        for c, figure, p in zip(plan.family, figures, adjusted)
    ]
    gains = {
        arm: {
            items: crossed_bootstrap(paired_differences(table[arm][items], table["base"][items]))
            if table[arm][items] is not None
            else None
            for items in ("in-domain", "drift")
        }
        for arm in plan.arms
    }
    described: dict[str, Any] = {}
    for arm in plan.arms:
        runs = [run for d in train_domains for run in arms[(d, arm)]]
        loss = [
            sum(x - y for x, y in zip(run["wiki_loss"], base["wiki_loss"])) / len(base["wiki_loss"])
            for run in runs
            if base["wiki_loss"] and "wiki_loss" in run
        ]
        shares = [tool_call_share(run["question_replies"]) for run in runs if "question_replies" in run]
        described[arm] = {
            "wiki_loss_change": sum(loss) / len(loss) if loss else None,
            "tool_call_share": sum(shares) / len(shares) if shares else None,
            "replies_logged": len(shares),
        }
    described["base"] = {"tool_call_share": tool_call_share(base_compared.get("question_replies", []))}
    return {"family": family, "gains": gains, "described": described, "decision": plan.decide(family)}


def missing_seeds(plan: Plan, finished: dict[str, list[int]], seeds: Sequence[int]) -> dict[str, list[int]]:
    """Each arm's registered seeds that have not finished (arms with none missing are left out)."""
    missing = {arm: [s for s in seeds if s not in finished.get(arm, [])] for arm in plan.arms}
    return {arm: left for arm, left in missing.items() if left}


def check_seeds(plan: Plan, planned: Sequence[int], seeds: Sequence[int] | None) -> list[int]:
    """The seeds to run (`seeds`, default every registered one); a seed the plan does not register is refused."""
    run_seeds = list(seeds) if seeds is not None else list(planned)
    strays = [s for s in run_seeds if s not in planned]
    if strays:
        raise ConfigError(
            f"--seeds: {plan.name} registers seeds {planned[0]}-{planned[-1]}; {strays} are not among them "
            "(docs/preregistration.md)"
        )
    return run_seeds


def report_missing(plan: Plan, finished: dict[str, list[int]], planned: Sequence[int]) -> bool:
    """Whether registered seeds are still missing in some arm; if so, says which (no analysis before the last)."""
    missing = missing_seeds(plan, finished, planned)
    if missing:
        done = min(len(seeds) for seeds in finished.values())
        print(
            f"[reproduce] {plan.name}: {done} of {len(planned)} registered seeds finished in every arm; no analysis "
            f"before the last (docs/preregistration.md). Missing: "
            + "; ".join(f"{arm} {left}" for arm, left in missing.items()),
            flush=True,
        )
    return bool(missing)


def _points(value: float) -> str:
    return f"{100 * value:+.1f}"


def _interval(figure: dict[str, Any]) -> str:
    return f"{_points(figure['estimate'])} [{_points(figure['low'])}, {_points(figure['high'])}]"


def write_report(
    out: Path,
    plan: Plan,
    analysis: dict[str, Any],
    seeds: Sequence[int],
    looks: int,
    stem: str | None = None,
    note: str | None = None,
) -> Path:
    """OUT/STEM.md and OUT/STEM.json (STEM: the plan's name lower-cased); returns the markdown's path. `note` says
    what the figures are of (a secondary analysis)."""
    lines = [
        f"# {plan.name}: the pre-registered analysis" + (f" ({note})" if note else ""),
        "",
        f"Plan: docs/preregistration.md ({plan.name}). Seeds {seeds[0]}-{seeds[-1]} ({len(seeds)}), arms "
        f"{', '.join(plan.arms)}. Looks at these results: **{looks}**"
        + (" (the registered one)." if looks == 1 else f" (registered: 1; this is look {looks})."),
        "",
        "Differences in accuracy points, a minus b; 95% item-random crossed bootstrap (10,000 draws) with its "
        "two-sided p, Holm-adjusted over the family; the item-fixed seed-level interval beside it. Readings: "
        "better / worse (Holm p < 0.05, interval on that side), no effect of 5 points or more (90% interval within "
        "+-5), inconclusive.",
        "",
        "| claim | items | a - b | difference [95%] | 90% | item-fixed 95% | p | Holm p | reading |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for item in analysis["family"]:
        lines.append(
            f"| {item['claim']}{' (primary)' if item['primary'] else ''} | {item['items']} | {item['a']} - {item['b']} "
            f"| {_interval(item)} | [{_points(item['low90'])}, {_points(item['high90'])}] "
            f"| [{_points(item['item_fixed']['low'])}, {_points(item['item_fixed']['high'])}] "
            f"| {item['p']:.4f} | {item['holm_p']:.4f} | **{item['reading']}** |"
        )
    lines += [
        "",
        f"Decision: {analysis['decision']}",
        "",
        "## Each arm against the base (gain in domain, change on drift items)",
        "",
        "| arm | in-domain gain [95%] | drift change [95%] | Wikipedia loss change (nats/token) | tool-call replies |",
        "|---|---|---|---|---|",
    ]
    for arm in plan.arms:
        gain, shown = analysis["gains"][arm], analysis["described"][arm]
        loss = shown["wiki_loss_change"]
        share = shown["tool_call_share"]
        lines.append(
            f"| {arm} | {_interval(gain['in-domain'])} | {_interval(gain['drift']) if gain['drift'] else 'not measured'} "
            f"| {'n/a' if loss is None else f'{loss:+.4f}'} "
            f"| {'not logged' if share is None else f'{100 * share:.0f}%'} |"
        )
    base_share = analysis["described"]["base"]["tool_call_share"]
    lines += [
        "",
        f"Base: tool-call replies {'not logged' if base_share is None else f'{100 * base_share:.0f}%'}.",
    ]
    stem_path = out / (stem or plan.name.lower())
    stem_path.with_suffix(".json").write_text(
        json.dumps({"plan": plan.name, "seeds": list(seeds), "looks": looks, **analysis}, indent=1)
    )
    path = stem_path.with_suffix(".md")
    path.write_text("\n".join(lines) + "\n")
    return path
