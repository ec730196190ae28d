"""Online re-profiling: D_adv recomputed under the current policy during training (the paper's future work).

The paper profiles the candidates once, under the frozen pi_0, and trains at that D_adv throughout
(Algorithm 1, lines 3-4). As pi_theta improves, some pivots become uniformly solved (no signal left:
their groups have zero variance) and some candidates it never solved become mixed. With
`GRPOConfig.reprofile_every = N`, the trainer re-profiles the candidate pool every N steps with the
current policy (`reprofile_k` samples each, seeded by step and candidate) and trains at the new D_adv
(var > 0 and mean < `reprofile_lambda_diff`, Eq. 5): pivots that left it are retired, candidates
that entered it are brought back. When the new D_adv is empty the pivots in play stay as they were
(the step's record says so), so training never stops for want of pivots.

Each re-profile is appended to OUT/reprofiled.jsonl (the step, the pivots in play, what was retired
and brought back), from which a resumed run restores the pivots in play. `Online` is what the
trainer's loop holds: the candidate pool, the pivots in play, and each step's figures.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pivot_envs.pivot import Pivot
from pivot_envs.policy import SamplingParams

LOG = "reprofiled.jsonl"


@dataclass
class Reprofiled:
    """One re-profile: the pivots in play after it, and how they changed."""

    step: int
    pivots: list[Pivot]
    retired: list[str] = field(default_factory=list)  # in play before, not in the new D_adv
    revived: list[str] = field(default_factory=list)  # in the new D_adv, not in play before
    mixed: int = 0  # candidates with mixed rewards under the current policy
    kept: bool = False  # the new D_adv was empty: the pivots in play were kept
    samples: int = 0  # actions generated and scored (the re-profile's rollout turns)

    def record(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "pivots": [p.id for p in self.pivots],
            "retired": self.retired,
            "revived": self.revived,
            "mixed": self.mixed,
            "kept": self.kept,
            "samples": self.samples,
        }


def due(step: int, every: int) -> bool:
    """Whether step `step` re-profiles before sampling: every `every` steps after the first (never at step 1,
    where the pivots are the offline profile's); a resumed run re-profiles at the same steps."""
    return every > 0 and step > 1 and (step - 1) % every == 0


def reprofile(
    policy: Any, pool: Any, candidates: Sequence[Pivot], in_play: Sequence[Pivot], step: int, config: Any
) -> Reprofiled:
    """Profile `candidates` with `policy` now (`config.reprofile_k` samples each, at the training's sampling
    settings, scored through `pool`) and return the new pivots in play: D_adv under the current policy
    (`config.reprofile_lambda_diff`), or `in_play` unchanged when D_adv is empty. `config` is the GRPOConfig."""
    import numpy as np

    k, lambda_diff, batch = config.reprofile_k, config.reprofile_lambda_diff, max(1, config.batch_pivots)
    rewards: list[list[float]] = []
    for first in range(0, len(candidates), batch):
        chunk = candidates[first : first + batch]
        seeds = [
            int(np.random.SeedSequence([config.seed, step, first + i, 1]).generate_state(1)[0])
            for i in range(len(chunk))
        ]
        sampling = SamplingParams(config.temperature, config.top_p, config.max_new_tokens, seeds=seeds)
        completions = policy.generate([pivot.observation for pivot in chunk], k, sampling)
        scores = pool.score([(pivot.id, c.action) for pivot, group in zip(chunk, completions) for c in group])
        for index in range(len(chunk)):
            mine = scores[index * k : (index + 1) * k]
            rewards.append([s.reward for s in mine if s.valid])
    adv, mixed = [], 0
    for pivot, values in zip(candidates, rewards):
        if len(values) < 2:
            continue  # too few valid samples to say anything: left out, as profiling leaves failures out
        mean = float(np.mean(values))
        if float(np.var(values)) > 0:
            mixed += 1
            if mean < lambda_diff:
                adv.append(pivot)
    before = {p.id for p in in_play}
    after = {p.id for p in adv}
    return Reprofiled(
        step=step,
        pivots=adv or list(in_play),
        retired=sorted(before - after) if adv else [],
        revived=sorted(after - before),
        mixed=mixed,
        kept=not adv,
        samples=len(candidates) * k,
    )


def append(out: Path, result: Reprofiled) -> None:
    with (Path(out) / LOG).open("a") as handle:
        handle.write(json.dumps(result.record()) + "\n")


def restore(out: Path, start: int, candidates: Sequence[Pivot], pivots: list[Pivot]) -> list[Pivot]:
    """The pivots in play at step `start` of a resumed run: the last re-profile at or before it (later lines,
    written after the checkpoint the run resumes from, are dropped from the log), else `pivots`."""
    path = Path(out) / LOG
    if not path.exists():
        return pivots
    by_id = {p.id: p for p in [*pivots, *candidates]}
    kept_lines, latest = [], None
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if record["step"] <= start:
            kept_lines.append(line)
            latest = record
    path.write_text("".join(f"{line}\n" for line in kept_lines))
    if latest is None:
        return pivots
    return [by_id[pivot_id] for pivot_id in latest["pivots"] if pivot_id in by_id] or pivots


class Online:
    """Online re-profiling in a run of `train` (`config`: its GRPOConfig): the candidate pool (`candidates`,
    else the pivots given) and the pivots in play, restored from OUT/reprofiled.jsonl when the run resumes
    after step `start`. With `config.reprofile_every` 0 it keeps the pivots given and records nothing."""

    def __init__(
        self, config: Any, pivots: list[Pivot], candidates: Sequence[Pivot] | None, start: int
    ) -> None:
        self.config, self.out, self.on = config, Path(config.out), config.reprofile_every > 0
        self.pool = list(candidates) if self.on and candidates is not None else list(pivots)
        self.pivots = restore(self.out, start, self.pool, pivots) if self.on and start else pivots
        self.changed: Reprofiled | None = None

    def pivots_at(self, step: int, policy: Any, envs: Any) -> list[Pivot]:
        """The pivots in play at `step`: D_adv of the pool re-profiled with `policy` now (scored through
        `envs`, an EnvPool) when the step is due, else as they were."""
        self.changed = None
        if due(step, self.config.reprofile_every):
            self.changed = reprofile(policy, envs, self.pool, self.pivots, step, self.config)
            self.pivots = self.changed.pivots
            append(self.out, self.changed)
        return self.pivots

    def metrics(self) -> dict[str, Any]:
        """The step's figures: the pivots in play and, at a re-profile, what it retired and brought back, how many
        candidates it found mixed and the samples it cost (nothing when re-profiling is off)."""
        if not self.on:
            return {}
        record: dict[str, Any] = {"pivots_in_play": len(self.pivots)}
        if self.changed is not None:
            record.update(
                retired=len(self.changed.retired),
                revived=len(self.changed.revived),
                reprofile_mixed=self.changed.mixed,
                reprofile_samples=self.changed.samples,
            )
        return record
