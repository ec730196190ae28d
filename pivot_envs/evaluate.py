"""Turn accuracy at held-out pivots, under the functional and the strict verifier, with 95% intervals.

`evaluate(policy, pivots)` samples actions at each pivot (greedy, and optionally N sampled at a
temperature), scores them through the pivot's domain env (the env's reward is the functional
verifier, Eq. 6; `info["strict_reward"]` the exact-match one, Eq. 2) and reports the accuracy per
domain with a Wilson interval. Scoring goes through `pivot_envs.scoring.EnvPool`.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pivot_envs.config import ConfigError, at_least, option
from pivot_envs.errors import PivotSetError
from pivot_envs.pivot import Pivot
from pivot_envs.policy import Completion, Policy, SamplingParams
from pivot_envs.scoring import EnvFactory, EnvPool, resolve_env

# -- accuracy with a Wilson interval --------------------------------------------------------------------


def wilson_interval(successes: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a success rate (95% for z = 1.96); (0, 1) when n = 0."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1.0 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def effective_size(rewards: Sequence[float], clusters: Sequence[str]) -> float:
    """The number of independent samples `rewards` are worth when they come in clusters (pivots).

    Samples at one pivot are correlated, so their mean varies more than n independent samples'.
    The variance of the overall mean is estimated over clusters (the ratio estimator's variance
    with a C/(C-1) correction) and n_eff = p(1-p) / var: about n for independent samples, about
    the number of pivots when each pivot's samples all agree. Never more than n.
    """
    n = len(rewards)
    mean = sum(rewards) / n if n else 0.0
    groups: dict[str, list[float]] = defaultdict(list)
    for reward, cluster in zip(rewards, clusters):
        groups[cluster].append(reward)
    count = len(groups)
    if count < 2 or count == n or mean in (0.0, 1.0):  # one sample per pivot: independent as they are
        return float(n)
    variance = sum((sum(g) - len(g) * mean) ** 2 for g in groups.values()) / (n * n) * count / (count - 1)
    return float(n) if variance <= 0 else min(float(n), mean * (1.0 - mean) / variance)


@dataclass
class Accuracy:
    """Mean reward over n scored actions, with its 95% Wilson interval.

    With several samples per pivot the interval uses the effective sample size (`effective_size`),
    since samples at one pivot are not independent.
    """

    mean: float
    n: int
    low: float
    high: float

    @classmethod
    def of(cls, rewards: Sequence[float], clusters: Sequence[str] | None = None) -> Accuracy:
        n = len(rewards)
        total = float(sum(rewards))
        mean = total / n if n else 0.0
        size = effective_size(rewards, clusters) if clusters is not None else float(n)
        low, high = wilson_interval(mean * size, size)
        return cls(mean, n, low, high)

    def __str__(self) -> str:
        return f"{100 * self.mean:5.1f}% [{100 * self.low:5.1f}, {100 * self.high:5.1f}]"


@dataclass
class EvalRow:
    """Turn accuracy of one domain in one mode (greedy, or `samples` sampled actions per pivot)."""

    domain: str
    mode: str
    pivots: int
    samples: int
    functional: Accuracy
    strict: Accuracy
    invalid: int


def change_in_words(before: Accuracy, after: Accuracy) -> tuple[str, dict[str, float]]:
    """Whether `after` differs from `before` beyond chance, in words, and the figures: the difference with
    Newcombe's 95% interval from the two Wilson intervals (unpaired, so conservative for the same pivots
    measured twice). Distinguishable from no change only when the interval excludes 0."""
    import math

    difference = after.mean - before.mean
    low = difference - math.hypot(after.mean - after.low, before.high - before.mean)
    high = difference + math.hypot(after.high - after.mean, before.mean - before.low)
    figures = {"difference": difference, "low": low, "high": high, "n": after.n}
    points = (
        f"{100 * difference:+.1f} points [{100 * low:+.1f}, {100 * high:+.1f}] on {after.n} held-out actions"
    )
    if low > 0 or high < 0:
        verdict = f"Held-out turn accuracy changed by {points}: distinguishable from no change at this size."
    else:
        verdict = (
            f"Held-out turn accuracy changed by {points}: not distinguishable from no change; differences "
            "this small need more held-out pivots (--eval-pivots) and seeds."
        )
    return (
        verdict
        + " One run's change says nothing about the method by itself: the evidence for PivotRL here is "
        "the seeded, paired comparisons of `pivotrl reproduce` (docs/reproduce.md).",
        figures,
    )


@dataclass
class EvalReport:
    """Rows per domain and mode; `format()` renders a table, `to_dict()` the JSON form."""

    policy: str
    rows: list[EvalRow] = field(default_factory=list)

    def row(self, domain: str, mode: str = "greedy") -> EvalRow:
        """The row of `domain` ("all" for the pooled row) in `mode`."""
        for row in self.rows:
            if row.domain == domain and row.mode == mode:
                return row
        raise KeyError(f"no evaluation row for domain {domain!r}, mode {mode!r}")

    def overall(self, mode: str = "greedy") -> EvalRow:
        """The pooled row in `mode` ("all"), or the one domain's when a single domain was evaluated."""
        rows = [row for row in self.rows if row.mode == mode]
        if not rows:
            raise KeyError(f"no evaluation row in mode {mode!r}")
        return next((row for row in rows if row.domain == "all"), rows[0])

    def format(self) -> str:
        header = f"{'domain':<14} {'mode':<8} {'pivots':>6} {'n':>5} {'functional (95% CI)':>24} {'strict (95% CI)':>24} {'invalid':>7}"
        lines = [f"turn accuracy of {self.policy}", header, "-" * len(header)]
        for row in self.rows:
            lines.append(
                f"{row.domain:<14} {row.mode:<8} {row.pivots:>6} {row.functional.n:>5} "
                f"{str(row.functional):>24} {str(row.strict):>24} {row.invalid:>7}"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class EvalConfig:
    """How to evaluate a policy at held-out pivots."""

    greedy: bool = option(True, "score one greedy action per pivot (temperature 0)")
    samples: int = option(0, "also score N sampled actions per pivot at --temperature (0: greedy only)")
    temperature: float = option(1.0, "temperature of the sampled actions")
    max_new_tokens: int = option(256, "longest action, in tokens")
    batch_size: int = option(8, "pivots per generate call")
    num_envs: int = option(4, "envs scoring actions concurrently (threads)")
    verifier: str = option("", "the functional verifier by name (empty: the domain's default)")
    seed: int = option(
        0, "sampling seed: each pivot's samples are drawn from a seed made from this and its id"
    )

    def __post_init__(self) -> None:
        at_least(self, 0, "samples", "temperature")
        at_least(self, 1, "max_new_tokens", "batch_size", "num_envs")
        if not self.greedy and self.samples == 0:
            raise ConfigError(
                "EvalConfig: nothing to evaluate: greedy is off and samples is 0 (set --samples N)"
            )


def _modes(config: EvalConfig) -> list[tuple[str, int, SamplingParams]]:
    modes = []
    if config.greedy:
        modes.append(
            (
                "greedy",
                1,
                SamplingParams(temperature=0.0, max_new_tokens=config.max_new_tokens, seed=config.seed),
            )
        )
    if config.samples > 0:
        sampling = SamplingParams(
            temperature=config.temperature, max_new_tokens=config.max_new_tokens, seed=config.seed
        )
        modes.append(("sampled", config.samples, sampling))
    return modes


def prompt_size(pivot: Pivot) -> int:
    """A cheap measure of a pivot's prompt length (characters of its observation's JSON), for batching
    prompts of similar length together; the policy's tokenizer is not needed."""
    return len(json.dumps(pivot.observation, ensure_ascii=False, default=str))


def length_batches(pivots: Sequence[Pivot], batch_size: int) -> list[list[int]]:
    """The pivots' indices in batches of `batch_size`, longest prompt first (`prompt_size`)."""
    order = sorted(range(len(pivots)), key=lambda row: -prompt_size(pivots[row]))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def generate_all(
    policy: Policy,
    pivots: Sequence[Pivot],
    n: int,
    sampling: SamplingParams,
    batch_size: int,
    progress: str | None = None,
) -> list[list[Completion]]:
    """n completions at each pivot, in the pivots' order, `batch_size` pivots per generate call; with
    `progress`, a progress bar of that title on stderr.

    The calls take the pivots longest prompt first (`length_batches`), so each batch holds prompts of
    similar length: a batch is padded to its longest prompt, and similar prompts (often turns of one
    trajectory) share longer heads. On the 155 held-out search pivots the prefill computed 30%
    fewer token rows than in the given order, and the evaluation ran 1.35x faster with the same
    greedy actions (benchmarks/eval_batching.py). Per-chat `sampling.seeds` follow their chats into
    their batches. A seeded sampling call without them draws each pivot's samples from a seed of
    its own (`profile.pivot_seed`: the seed and the pivot's id, as the profiler does), so they do
    not depend on the batch the pivot lands in: one seed for every call would give each batch's
    first pivot the same random draws as every other batch's first pivot.
    """
    from pivot_envs.config import progress_bar

    seeds = sampling.chat_seeds(len(pivots)) if sampling.seeds is not None else None
    if seeds is None and sampling.seed is not None and sampling.temperature > 0:
        from pivot_envs.profile import pivot_seed

        seeds = [pivot_seed(sampling.seed, pivot.id) for pivot in pivots]
    out: list[list[Completion] | None] = [None] * len(pivots)
    with progress_bar(total=len(pivots), unit="pivot", desc=progress or "", enabled=bool(progress)) as bar:
        for rows in length_batches(pivots, batch_size):
            chunk = sampling
            if seeds is not None:  # `seed` too, for backends that seed a whole call only
                chunk = replace(sampling, seed=seeds[rows[0]], seeds=[seeds[row] for row in rows])
            groups = policy.generate([pivots[row].observation for row in rows], n, chunk)
            for row, group in zip(rows, groups, strict=True):
                out[row] = group
            bar.update(len(rows))
    return out  # type: ignore[return-value]  # every row was filled


def evaluate(
    policy: Policy,
    pivots: Sequence[Pivot],
    config: EvalConfig | None = None,
    env: str | EnvFactory | None = None,
    **env_kwargs: Any,
) -> EvalReport:
    """Turn accuracy of `policy` at `pivots`, per domain (and pooled over domains when there are several).

    `env` is an env id or a factory used for every pivot; by default each domain's registered env
    `pivot/<domain>-v0` scores its pivots. Invalid samples (infrastructure failures) are counted
    apart and left out of the accuracies.
    """
    config = config or EvalConfig()
    if not pivots:
        raise PivotSetError("no pivots to evaluate")
    if config.verifier:
        env_kwargs.setdefault("verifier", config.verifier)
    by_domain: dict[str, list[Pivot]] = defaultdict(list)
    for pivot in pivots:
        by_domain[pivot.domain].append(pivot)
    report = EvalReport(policy=str(getattr(policy, "name", policy)))
    for mode, n, sampling in _modes(config):
        pooled: dict[str, list] = {"functional": [], "strict": [], "clusters": []}
        pooled_invalid = 0
        for domain, members in sorted(by_domain.items()):
            completions = generate_all(policy, members, n, sampling, config.batch_size)
            jobs = [(pivot.id, c.action) for pivot, group in zip(members, completions) for c in group]
            with EnvPool(resolve_env(env, members, **env_kwargs), config.num_envs) as pool:
                scores = pool.score(jobs)
            kept = [(score, pivot_id) for score, (pivot_id, _) in zip(scores, jobs) if score.valid]
            functional = [score.reward for score, _ in kept]
            strict = [score.strict_reward for score, _ in kept]
            clusters = [pivot_id for _, pivot_id in kept]
            invalid = len(scores) - len(kept)
            report.rows.append(
                EvalRow(
                    domain,
                    mode,
                    len(members),
                    n,
                    Accuracy.of(functional, clusters),
                    Accuracy.of(strict, clusters),
                    invalid,
                )
            )
            pooled["functional"] += functional
            pooled["strict"] += strict
            pooled["clusters"] += clusters
            pooled_invalid += invalid
        if len(by_domain) > 1:
            report.rows.append(
                EvalRow(
                    "all",
                    mode,
                    len(pivots),
                    n,
                    Accuracy.of(pooled["functional"], pooled["clusters"]),
                    Accuracy.of(pooled["strict"], pooled["clusters"]),
                    pooled_invalid,
                )
            )
    return report
