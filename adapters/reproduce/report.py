"""The report of `pivotrl reproduce`: report.md and report.json, and the plots when matplotlib is installed."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pivot_envs.adapters.reproduce.scales import Scale
from pivot_envs.adapters.reproduce.stats import minimum_detectable_difference

log = logging.getLogger(__name__)


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning(
            "the reproduce report has no plots: matplotlib is not installed (pip install 'pivot-envs[plot]')"
        )
        return None
    return plt


def _bars(
    plt: Any,
    path: Path,
    title: str,
    labels: Sequence[str],
    figures: Sequence[dict[str, float]],
    paper: Sequence[float | None] = (),
    ylabel: str = "rate",
) -> str:
    """A bar per figure with its 95% interval, and the paper's value as a marker where given."""
    figure, axes = plt.subplots(figsize=(max(4.0, 0.9 * len(labels) + 2), 3.2))
    xs = range(len(labels))
    estimates = [f["estimate"] for f in figures]
    # max(0, ...): rounding can put an estimate a hair outside its own interval
    errors = [
        [max(0.0, e - f["low"]) for e, f in zip(estimates, figures)],
        [max(0.0, f["high"] - e) for e, f in zip(estimates, figures)],
    ]
    axes.bar(xs, estimates, yerr=errors, capsize=4, color="#4c72b0", label="ours (95% interval)")
    marked = [(x, value) for x, value in zip(xs, paper) if value is not None]
    if marked:
        axes.scatter(
            [x for x, _ in marked],
            [v for _, v in marked],
            color="#c44e52",
            marker="D",
            zorder=3,
            label="paper",
        )
    axes.set_xticks(list(xs), labels, rotation=20, ha="right", fontsize=8)
    axes.set_ylabel(ylabel)
    axes.set_title(title, fontsize=9)
    axes.axhline(0, color="black", linewidth=0.5)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path.name


def plots(
    out: Path,
    profiles: dict[str, dict],
    arms: dict,
    base: dict | None,
    scale: Scale,
    summaries: dict[str, Any],
) -> dict[str, str]:
    """The report's figures, by the claim (or group of claims) each belongs to; {} without matplotlib."""
    plt = _pyplot()
    if plt is None:
        return {}
    made: dict[str, str] = {}
    if "signal" in summaries:
        labels, figures, paper = [], [], []
        for domain, per_k in summaries["signal"].items():
            for k, figure in per_k.items():
                labels.append(f"{domain} K={k}")
                figures.append(figure)
                paper.append(0.71)
        made["signal"] = _bars(
            plt,
            out / "signal.png",
            "zero-variance share of random candidates (paper: 71%)",
            labels,
            figures,
            paper,
            "share",
        )
    train_domains = [
        d for d in scale.train_domains if (d, "pivotrl") in arms and (d, "cand-functional") in arms
    ]
    if train_domains:
        figure, axes = plt.subplots(figsize=(5, 3.2))
        for arm, label in (("pivotrl", "D_adv"), ("cand-functional", "D_cand")):
            for domain in train_domains:
                runs = [run["history"] for run in arms[(domain, arm)] if run["history"]]
                if not runs:
                    continue
                steps = min(len(h) for h in runs)
                mean = [sum(h[i]["reward_std"] for h in runs) / len(runs) for i in range(steps)]
                axes.plot(range(1, steps + 1), mean, marker="o", label=f"{label} ({domain})")
        axes.set_xlabel("GRPO step")
        axes.set_ylabel("batch reward std (mean over seeds)")
        axes.set_title("reward std over training: D_adv vs D_cand", fontsize=9)
        axes.legend(fontsize=7)
        figure.tight_layout()
        figure.savefig(out / "signal_training.png", dpi=100)
        plt.close(figure)
        made["signal-training"] = "signal_training.png"
    # (summary, the claim its figure belongs to, file, title, the paper's values by label, y axis)
    bar_charts = (
        ("strict", "strict-functional", "strict_functional.png", "miss rate of exact match", {}, "miss rate"),
        (
            "arms",
            "arms",
            "arms.png",
            "held-out turn accuracy by arm (paper: tau2-bench, Table 4)",
            {
                "base": 0.4435,
                "pivotrl": 0.6381,
                "cand-functional": 0.5968,
                "cand-strict": 0.5734,
                "sft": 0.5844,
            },
            "turn accuracy",
        ),
        (
            "drift",
            "sft",
            "ood_drift.png",
            "change out of domain vs base (paper: Table 2)",
            {"pivotrl": 0.0021, "sft": -0.0983},
            "change",
        ),
    )
    for summary, claim, file, title, paper_values, ylabel in bar_charts:
        if summary in summaries:
            labels = list(summaries[summary])
            made[claim] = _bars(
                plt,
                out / file,
                title,
                labels,
                [summaries[summary][label] for label in labels],
                [paper_values.get(label) for label in labels],
                ylabel,
            )
    return made


def _device_note(scale: Scale) -> list[str]:
    """On a GPU a seed is a seeded draw, not a repeatable one (measured on an H200: docs/reproduce.md)."""
    if not scale.device.startswith("cuda"):
        return []
    return [
        "Note: on a GPU, training with the same seed does not repeat bit for bit (CUDA adds in no fixed order): "
        "a rerun seed gives other samples after a few steps, so its figures move within the seed spread."
    ]


def _compared_note(scale: Scale) -> list[str]:
    """The line saying the arms are compared on another held-out sample than the scale's (--compared-pivots)."""
    if scale.compared_pivots is None:
        return []
    count = (
        "every held-out pivot" if scale.compared_pivots == 0 else f"{scale.compared_pivots} held-out pivots"
    )
    return [
        f"Note: the training arms are evaluated and compared on {count} of each training domain "
        f"(`--compared-pivots {scale.compared_pivots}`); the base's measurements and the drift sets keep the "
        "scale's sample (the data table gives both sizes)."
    ]


def _finished_note(arm_seeds: dict[str, int] | None) -> list[str]:
    """The line saying the arms are those of an earlier run, with each arm's seeds (--finished-only)."""
    if arm_seeds is None:
        return []
    counts = ", ".join(f"{arm} {count}" for arm, count in arm_seeds.items()) or "none"
    return [
        f"Note: --finished-only: no arm was trained for this report; the seeds each arm had finished: {counts}. "
        "Each comparison pairs the seeds both its arms have, and says how many."
    ]


LOOKS = "looks.json"  # OUT/looks.json: {"report": N, PLAN: N}, shared with the pre-registered reports


def count_look(out: Path, key: str = "report") -> int:
    """Record one more look written into `out` (OUT/looks.json: key "report" for the general report, a plan's
    name for a pre-registered one; other keys are kept); returns how many there have been, this one included."""
    path = out / LOOKS
    looks = json.loads(path.read_text()) if path.exists() else {}
    looks[key] = looks.get(key, 0) + 1
    path.write_text(json.dumps(looks, indent=1))
    return looks[key]


def _looks_line(looks: int) -> str:
    """The header's line on how many reports these stages have had: a verdict read at a later look is not
    corrected for the earlier ones."""
    if looks == 1:
        return "This report is look 1 of these stages (the first report written into this folder)."
    return (
        f"This report is look {looks} of these stages: {looks - 1} earlier report"
        f"{'s were' if looks > 2 else ' was'} written into this folder ({LOOKS}). The intervals are not widened "
        "for repeated looks: a verdict that changed between looks is weaker evidence than its interval says."
    )


def write(
    out: Path,
    scale: Scale,
    seeds: list[int],
    claims: list[dict[str, Any]],
    split: dict[str, Any],
    extra: dict[str, Any],
) -> Path:
    """report.md and report.json in `out`, counted as one more look at its stages (OUT/looks.json); returns the
    markdown's path."""
    looks = count_look(out)
    lines = [
        "# PivotRL: the paper's claims at small scale",
        "",
        f"Scale `{scale.name}`: policy `{scale.policy}` on `{scale.device}`, domains {', '.join(scale.domains)}, "
        f"training in {', '.join(scale.train_domains)}, seeds {', '.join(map(str, seeds))}.",
        *[f"Note: {note}." for note in scale.notes],
        *_compared_note(scale),
        *_finished_note(extra.get("arm_seeds")),
        *_device_note(scale),
        "",
        _looks_line(looks),
        "",
        "A verdict is decided by the 95% interval beside it: **reproduced** when the interval lies wholly on the "
        "paper's side of the threshold (0 for a difference), **not reproduced** when wholly on the other side, "
        "**inconclusive** when it holds the threshold. MDD: the smallest difference the held-out size detects "
        "(two-sided 5%, 80% power, at 50% accuracy) between two unpaired sets of n items; (paired: M): the one of "
        "the claim's own design (arms paired by seed and item), from its interval's spread, with the seeds that "
        "would bring it to 10 points (projected from the seeds run: their spread, the items', and the rest; a guide, "
        "not a guarantee).",
        "",
        "| claim | paper | ours | 95% interval | verdict |",
        "|---|---|---|---|---|",
    ]
    for item in claims:
        cells = [
            f"{item['title']} ({item['paper_section']})",
            item["paper"],
            _ours(item["ours"]),
            _interval(item["interval"]),
            f"**{item['verdict']}**",
        ]
        lines.append("| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |")
    lines.append("")
    for item in claims:
        lines += [
            f"## {item['title']}",
            "",
            f"*{item['paper_section']}.* Paper: {item['paper']}.",
            "",
            f"Ours: {_ours(item['ours'])}.",
            "",
            f"Verdict: **{item['verdict']}** ({_interval(item['interval'])}).",
            "",
            str(item["detail"]),
            "",
        ]
        lines += [f"![{item['claim']}]({figure})" for figure in item.get("figures", [])]
        lines.append("")
    lines += _per_seed_lines(extra.get("per_seed") or {})
    lines += [
        "## Data and split",
        "",
        "Held-out pivots are whole source trajectories (a seeded hash of the trajectory id), never single turns; "
        "the rest is halved the same way into part A (the base's SFT warm-up) and part B (the data every arm "
        "trains on, PivotRL and SFT alike). The paper trains both arms from the untouched base model; here the "
        "135M model never succeeds at a pivot without a warm-up, so both start from the warmed-up base.",
        "",
        "| domain | pivots | held-out (trajectories) | part A | part B | evaluated (MDD) | trajectories on two sides |",
        "|---|---|---|---|---|---|---|",
    ]
    for domain, record in split.items():
        sides = [set(record[f"{side}_trajectories"]) for side in ("heldout", "part_a", "part_b")]
        shared = len((sides[0] & sides[1]) | (sides[0] & sides[2]) | (sides[1] & sides[2]))
        evaluated = _sized(len(record["evaluated"]))
        if "compared" in record and record["compared"] != record["evaluated"]:
            evaluated = f"base {evaluated}; arms {_sized(len(record['compared']))}"
        lines.append(
            f"| {domain} | {record['pivots']} | {record['heldout_pivots']} ({len(sides[0])}) | "
            f"{record['part_a_pivots']} | {record['part_b_pivots']} | {evaluated} | {shared} |"
        )
    lines += [
        "",
        "MDD: the power of one domain's evaluated held-out pivots alone; comparisons pool the training domains' "
        "pivots and pair arms by seed and pivot, so each claim states its own.",
        "",
        "Stage times (seconds): " + ", ".join(f"{k} {v:.0f}" for k, v in extra.get("seconds", {}).items()),
        "",
    ]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    (out / "report.json").write_text(
        json.dumps(
            {
                "scale": scale.to_dict(),
                "seeds": seeds,
                "looks": looks,
                "claims": claims,
                "split": split,
                **extra,
            },
            indent=1,
            default=str,
        )
    )
    return path


def _per_seed_lines(per_seed: dict[str, dict[str, list[float | None]]]) -> list[str]:
    """The section of each arm's held-out accuracy per seed, one table per training domain."""
    lines: list[str] = []
    for domain, rows in per_seed.items():
        seeds = max((len(row) for row in rows.values()), default=0)
        if not seeds:
            continue
        if not lines:
            lines += [
                "## Held-out accuracy per seed",
                "",
                "Each arm's greedy turn accuracy (%) on the held-out pivots it is compared on, per seed; the "
                "comparisons above pair these by seed and pivot. A blank: the arm has not finished that seed.",
                "",
            ]
        lines += [
            f"{domain}:",
            "",
            "| arm | " + " | ".join(f"s{seed}" for seed in range(seeds)) + " |",
            "|---|" + "---|" * seeds,
        ]
        for arm, row in rows.items():
            cells = [f"{100 * value:.1f}" if value is not None else "n/a" for value in row]
            cells += [""] * (seeds - len(row))
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _sized(n: int) -> str:
    """n evaluated items with their unpaired MDD."""
    return f"{n} ({100 * minimum_detectable_difference(n):.0f} pts)"


def _interval(interval: dict[str, Any] | Sequence[float] | None) -> str:
    """An interval as the report shows it: [low, high] vs its threshold, with n and the MDD where known."""
    if not interval:
        return "n/a"
    if not isinstance(interval, dict):  # [low, high], as a claim module may give it
        low, high = interval
        return f"[{low:.3f}, {high:.3f}]"
    text = f"[{interval['low']:.3f}, {interval['high']:.3f}] vs {interval.get('threshold', 0):g}"
    if "mdd" in interval:
        text += f"; n {interval.get('n')}, MDD {100 * interval['mdd']:.0f} pts"
        if "paired_mdd" in interval:
            text += f" (paired: {100 * interval['paired_mdd']:.0f}{_projection(interval)})"
    return text


def _projection(interval: dict[str, Any]) -> str:
    """The seeds a paired MDD of the target would take, as the interval's MDD shows it ("" where not projected)."""
    if "seeds_for_target" not in interval:
        return ""
    target, need = f"{100 * interval['target_mdd']:.0f} pts", interval["seeds_for_target"]
    if need is None:
        return f"; {target} needs more held-out items" if interval.get("seeds", 0) >= 2 else ""
    if need <= interval["seeds"]:
        return f"; under {target} with {interval['seeds']} seeds"
    return f"; {target} needs ~{need} seeds"


def _ours(ours: Any) -> str:
    """A claim's own figures in one line: text as it is; a dict of figures as key: value (rates with intervals)."""
    if not isinstance(ours, dict):
        return str(ours)
    parts = []
    for key, value in ours.items():
        if isinstance(value, dict) and {"estimate", "low", "high"} <= set(value):
            value = f"{value['estimate']:.3f} [{value['low']:.3f}, {value['high']:.3f}]"
        parts.append(f"{key.replace('_', ' ')}: {value}")
    return "; ".join(parts)
