"""Diagnostics of a pivot set: the paper's profile statistics and plain descriptive counts.

From profiled pivots (Profile: functional `rewards`, `strict_rewards`, `categories`, `valid`):
the fraction of zero-variance candidates (the paper found 71% of turns give no learning signal),
the histogram of reward means (paper Eq. 4), the miss rate Pr[strict = 0 | functional = 1] over
samples, the D_adv size at a lambda_diff (Eq. 5), and verdict counts per category. From any
pivots: counts per domain, per expert action kind and per tool, prefix and action lengths.
"""

from __future__ import annotations

import os
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pivot_envs.chat import text_of
from pivot_envs.config import option
from pivot_envs.extract import FilterConfig
from pivot_envs.pivot import Pivot

# Rewards are binary in the paper (Eq. 2, Eq. 6); a sample counts as a success at >= 0.5 so that
# verifiers giving partial credit still fall on one side.
SUCCESS = 0.5


@dataclass
class Summary:
    """min / mean / median / max of a list of numbers (all 0 for an empty list)."""

    count: int = 0
    min: float = 0.0
    mean: float = 0.0
    median: float = 0.0
    max: float = 0.0

    @classmethod
    def of(cls, values: list[float]) -> Summary:
        if not values:
            return cls()
        return cls(len(values), min(values), statistics.fmean(values), statistics.median(values), max(values))


@dataclass
class Diagnostics:
    """What `diagnose` found; profile fields are None/empty when no pivot carries a profile."""

    pivots: int
    per_domain: dict[str, int]
    per_action_kind: dict[str, int]  # tool_call / parallel_calls / message
    per_tool: dict[str, int]  # expert tool calls by tool name
    prefix_messages: Summary
    prefix_chars: Summary
    action_chars: Summary
    profiled: int = 0
    scored: int = 0  # profiled pivots with at least one valid sample
    zero_variance_fraction: float | None = None
    all_solved_fraction: float | None = None  # zero variance because every sample succeeded
    all_failed_fraction: float | None = None  # zero variance because every sample failed
    lambda_diff: float = FilterConfig.lambda_diff
    adv_count: int | None = None  # |D_adv| at lambda_diff
    mean_bins: list[float] = field(default_factory=list)  # bin edges over [0, 1]
    mean_histogram: list[int] = field(default_factory=list)
    samples: int = 0
    invalid_samples: int = 0
    functional_successes: int = 0  # valid samples with functional reward 1 (and a strict reward recorded)
    strict_misses: int = 0  # ... of which strict reward 0
    miss_rate: float | None = None  # Pr[strict = 0 | functional = 1]
    per_category: dict[str, int] = field(default_factory=dict)
    # Raw values, for plots.
    prefix_lengths: list[int] = field(default_factory=list, repr=False)
    action_lengths: list[int] = field(default_factory=list, repr=False)
    means: list[float] = field(default_factory=list, repr=False)


def action_kind(message: dict) -> str:
    """tool_call (one call), parallel_calls (several) or message (none)."""
    calls = message.get("tool_calls") or []
    return "message" if not calls else "tool_call" if len(calls) == 1 else "parallel_calls"


def message_chars(message: dict) -> int:
    """Characters of a message: its text, reasoning, and tool-call names and arguments."""
    total = len(text_of(message)) + len(message.get("reasoning_content") or "")
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        total += len(str(function.get("name", ""))) + len(str(function.get("arguments", "")))
    return total


def diagnose(
    pivots: Iterable[Pivot], lambda_diff: float = FilterConfig.lambda_diff, bins: int = 10
) -> Diagnostics:
    """Diagnostics of a pivot set (see the module docstring); `bins` equal bins over [0, 1] for the means."""
    pivots = list(pivots)
    per_tool: Counter = Counter()
    for pivot in pivots:
        per_tool.update(
            call.get("function", {}).get("name", "") for call in pivot.expert.get("tool_calls") or []
        )
    prefix_lengths = [len(p.messages) for p in pivots]
    action_lengths = [message_chars(p.expert) for p in pivots]
    result = Diagnostics(
        pivots=len(pivots),
        per_domain=dict(Counter(p.domain or "(none)" for p in pivots).most_common()),
        per_action_kind=dict(Counter(action_kind(p.expert) for p in pivots).most_common()),
        per_tool=dict(per_tool.most_common()),
        prefix_messages=Summary.of(prefix_lengths),
        prefix_chars=Summary.of([sum(message_chars(m) for m in p.messages) for p in pivots]),
        action_chars=Summary.of(action_lengths),
        lambda_diff=lambda_diff,
        prefix_lengths=prefix_lengths,
        action_lengths=action_lengths,
    )
    profiles = [p.profile for p in pivots if p.profile is not None]
    result.profiled = len(profiles)
    if not profiles:
        return result
    categories: Counter = Counter()
    solved = failed = 0
    for profile in profiles:
        valid = profile.valid or [True] * len(profile.rewards)
        kept = [r for r, ok in zip(profile.rewards, valid) if ok]
        result.samples += len(profile.rewards)
        result.invalid_samples += len(profile.rewards) - len(kept)
        categories.update(profile.categories)
        if kept:
            result.scored += 1
            result.means.append(profile.mean)
            if profile.var == 0:
                solved += all(r >= SUCCESS for r in kept)
                failed += all(r < SUCCESS for r in kept)
        if len(profile.strict_rewards) == len(profile.rewards):
            for reward, strict, ok in zip(profile.rewards, profile.strict_rewards, valid):
                if ok and reward >= SUCCESS:
                    result.functional_successes += 1
                    result.strict_misses += strict < SUCCESS
    if result.scored:
        zero = sum(1 for p in profiles if p.var == 0 and p.n_valid > 0)
        result.zero_variance_fraction = zero / result.scored
        result.all_solved_fraction = solved / result.scored
        result.all_failed_fraction = failed / result.scored
    result.adv_count = sum(1 for p in profiles if p.n_valid > 0 and p.var > 0 and p.mean < lambda_diff)
    result.mean_bins = [i / bins for i in range(bins + 1)]
    result.mean_histogram = [0] * bins
    for mean in result.means:
        result.mean_histogram[min(int(mean * bins), bins - 1)] += 1  # the last bin includes 1.0
    if result.functional_successes:
        result.miss_rate = result.strict_misses / result.functional_successes
    result.per_category = dict(categories.most_common())
    return result


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def format_report(diagnostics: Diagnostics) -> str:
    """A plain-text table of the diagnostics."""
    d = diagnostics
    rows: list[tuple[str, str]] = [("pivots", str(d.pivots))]
    rows += [(f"  domain {name}", str(n)) for name, n in d.per_domain.items()]
    rows += [(f"  action {name}", str(n)) for name, n in d.per_action_kind.items()]
    rows += [(f"  tool {name}", str(n)) for name, n in list(d.per_tool.items())[:15]]
    for label, s in (
        ("prefix messages", d.prefix_messages),
        ("prefix chars", d.prefix_chars),
        ("action chars", d.action_chars),
    ):
        rows.append((label, f"min {s.min:g}  mean {s.mean:.1f}  median {s.median:g}  max {s.max:g}"))
    if d.profiled:
        rows += [
            ("profiled", f"{d.profiled} ({d.scored} with valid samples)"),
            (
                "zero-variance candidates",
                f"{_percent(d.zero_variance_fraction)} (all solved {_percent(d.all_solved_fraction)}, "
                f"all failed {_percent(d.all_failed_fraction)})",
            ),
            (f"D_adv at lambda_diff={d.lambda_diff:g}", f"{d.adv_count} of {d.profiled}"),
            ("samples", f"{d.samples} ({d.invalid_samples} invalid)"),
            (
                "miss rate P[strict=0|func=1]",
                f"{_percent(d.miss_rate)} ({d.strict_misses}/{d.functional_successes})",
            ),
        ]
        last = len(d.mean_histogram) - 1
        for i, count in enumerate(d.mean_histogram):
            bracket = "]" if i == last else ")"  # the last bin includes 1.0
            bar = "#" * round(40 * count / max(1, d.scored))
            rows.append(
                (f"  mean in [{d.mean_bins[i]:.2f}, {d.mean_bins[i + 1]:.2f}{bracket}", f"{count:5d} {bar}")
            )
        rows += [(f"  category {name}", str(n)) for name, n in d.per_category.items()]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.ljust(width)}  {value}" for label, value in rows)


def plot(diagnostics: Diagnostics, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write PNG figures (prefix lengths, action kinds, and with profiles the reward-mean histogram and
    verdict categories) into `out_dir`; returns their paths. Needs matplotlib (`pip install pivot-envs[plot]`)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    d = diagnostics
    written = []

    def save(fig, name: str) -> None:
        path = out / name
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(d.prefix_lengths, bins=min(30, max(1, len(set(d.prefix_lengths)))))
    ax.set(xlabel="prefix length (messages)", ylabel="pivots", title=f"Prefix lengths ({d.pivots} pivots)")
    save(fig, "prefix_lengths.png")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(list(d.per_action_kind), list(d.per_action_kind.values()))
    ax.set(ylabel="pivots", title="Expert action kinds")
    save(fig, "action_kinds.png")
    if d.profiled:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        width = 1 / max(1, len(d.mean_histogram))
        ax.bar([b + width / 2 for b in d.mean_bins[:-1]], d.mean_histogram, width=width * 0.9)
        ax.axvline(d.lambda_diff, color="red", linestyle="--", label=f"lambda_diff={d.lambda_diff:g}")
        ax.set(
            xlabel="reward mean under the reference policy",
            ylabel="candidates",
            title=f"Reward means (zero variance: {_percent(d.zero_variance_fraction)})",
        )
        ax.legend()
        save(fig, "reward_means.png")
        if d.per_category:
            fig, ax = plt.subplots(figsize=(7, 3.5))
            ax.barh(list(d.per_category)[::-1], list(d.per_category.values())[::-1])
            ax.set(xlabel="samples", title=f"Verdict categories (miss rate {_percent(d.miss_rate)})")
            save(fig, "categories.png")
    return written


@dataclass
class DiagnosticsConfig:
    """Options of `pivotrl stats`."""

    lambda_diff: float = option(
        FilterConfig.lambda_diff,
        "lambda_diff (paper Eq. 5) at which to count the D_adv size (pivotrl filter's default)",
    )
    bins: int = option(10, "number of equal bins over [0, 1] in the reward-mean histogram")

    def __post_init__(self) -> None:
        from pivot_envs.config import at_least, between

        between(self, "lambda_diff", 0, 1)
        at_least(self, 1, "bins")
