"""The end-to-end RL claim: PivotRL against E2E RL per rollout turn (the paper's Sec. 4.3, Figure 3).

Both arms start from the same policy and train in the terminal domain on the same tasks; the
bundled terminal tasks are split by trajectory (`split_by_trajectory`, the split the rest of
`pivotrl reproduce` uses for the terminal pivots), so no held-out task's trajectory trains either
arm. E2E RL (`adapters.grpo.episodes`) plays whole episodes of the training tasks in
`pivot/terminal-episode-v0`; PivotRL (the bundled `pivotrl`) profiles the training tasks' pivots
under the start policy and trains at the selected ones in `pivot/terminal-v0`. Rollout turns are
counted as the paper counts them: for E2E RL the assistant turns of every training episode, for
PivotRL one per training sample (the profiling samples are reported beside them, not added, as the
paper leaves them out). PivotRL trains for the steps that spend as many turns as E2E RL spent.
Both arms are measured the same way: greedy task success in the episode env on the held-out tasks,
at each checkpoint, plotted against the rollout turns spent.

The verdict: the paper reports competitive accuracy at about 4x fewer turns, so at an equal
budget PivotRL should be no worse. "reproduced" when the paired 95% interval of (PivotRL - E2E RL)
held-out success at the final, matched budget lies above -MARGIN, "not reproduced" when it lies
below, "inconclusive" otherwise, and always when neither arm solved a held-out task.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pivot_envs.adapters.grpo.config import GRPOConfig
from pivot_envs.adapters.grpo.episodes import EpisodeConfig
from pivot_envs.adapters.reproduce.scales import FILTER as MAIN_FILTER
from pivot_envs.adapters.reproduce.scales import SCALES as MAIN_SCALES
from pivot_envs.config import ConfigError
from pivot_envs.errors import UnknownNameError
from pivot_envs.extract import FilterConfig
from pivot_envs.profile import ProfileConfig

MARGIN = 0.10  # how much worse than E2E RL still counts as "competitive" (10 points of task success)
PAPER = (
    "SWE-Bench: PivotRL reaches E2E RL's 32.67% with ~133K cumulative rollout turns against E2E RL's ~542K "
    "(~4x fewer turns, ~5.5x less wall-clock time; Figure 3)"
)


# Both arms run in bubblewrap: the episodes and the profiled pivots alike.
SANDBOX = "bwrap"
PROFILE = ProfileConfig(env="pivot/terminal-v0", env_kwargs={"sandbox": SANDBOX}, progress=False)


@dataclass(frozen=True)
class E2EScale:
    """The sizes of the comparison at one scale: E2E RL's run (its budget; PivotRL gets the same number of
    turns) and PivotRL's profiling and filter. PivotRL trains with E2E RL's GRPO settings but for its own B and
    G (one rollout turn per action) and the steps that spend E2E RL's turns."""

    name: str
    policy: str  # the start policy of both arms: "tiny" (the quick scale's random model) or a policy spec
    device: str
    heldout: float  # fraction of the tasks' trajectories held out
    train_tasks: int  # training tasks used (0: all of the training side)
    heldout_tasks: int  # held-out tasks evaluated (0: all)
    e2e_rl: EpisodeConfig  # E2E RL: train.steps, train.batch_pivots (B tasks), train.group_size (G episodes)
    pivot_batch: int  # PivotRL's B: pivots per step
    pivot_group: int  # PivotRL's G: actions per pivot (one rollout turn each)
    profile: ProfileConfig  # PivotRL's profiling of the training tasks' pivots (K samples each)
    filter: FilterConfig  # PivotRL's pivots from the profile
    evaluations: int  # checkpoints evaluated per arm besides the start (the curve's points)
    max_prompt_tokens: int = 2048

    def __post_init__(self) -> None:
        if self.profile.max_new_tokens != self.e2e_rl.train.max_new_tokens:
            raise ConfigError(
                f"e2e scale {self.name}: profile.max_new_tokens={self.profile.max_new_tokens} must be "
                f"e2e_rl.train.max_new_tokens={self.e2e_rl.train.max_new_tokens}: both arms act alike"
            )

    def to_dict(self) -> dict[str, Any]:
        """The sizes as a seed's result records them (a rerun with others runs the seed again)."""
        train = self.e2e_rl.train
        return {
            "name": self.name,
            "policy": self.policy,
            "device": self.device,
            "heldout": self.heldout,
            "train_tasks": self.train_tasks,
            "heldout_tasks": self.heldout_tasks,
            "steps": train.steps,
            "batch_tasks": train.batch_pivots,
            "episodes": train.group_size,
            "max_turns": self.e2e_rl.max_turns,
            "pivot_batch": self.pivot_batch,
            "pivot_group": self.pivot_group,
            "k": self.profile.k,
            "lambda_diff": self.filter.lambda_diff,
            "learning_rate": train.learning_rate,
            "max_new_tokens": train.max_new_tokens,
            "evaluations": self.evaluations,
            "max_prompt_tokens": self.max_prompt_tokens,
        }


def _e2e_rl(scale: str, max_turns: int, **sizes: Any) -> EpisodeConfig:
    """E2E RL's run at `scale`: the learning rate of that scale's arms, `sizes` of GRPO, no evaluation inside."""
    train = GRPOConfig(learning_rate=MAIN_SCALES[scale].train.learning_rate, eval_every=0, **sizes)
    return EpisodeConfig(train=train, max_turns=max_turns, sandbox=SANDBOX)


# PivotRL's pivots: D_adv at the main scales' lambda_diff, or the unsolved candidates when D_adv is empty
FILTER = replace(MAIN_FILTER, mode="adv-or-unsolved")

SCALES = {
    "quick": E2EScale(
        "quick",
        "tiny",
        "cpu",
        heldout=0.3,
        train_tasks=2,
        heldout_tasks=2,
        e2e_rl=_e2e_rl("quick", max_turns=2, steps=1, batch_pivots=2, group_size=2, max_new_tokens=8),
        pivot_batch=2,
        pivot_group=2,
        profile=replace(PROFILE, k=2, max_new_tokens=8),
        filter=FILTER,
        evaluations=1,
        max_prompt_tokens=768,
    ),
    "cpu": E2EScale(
        "cpu",
        "hf:smollm2",
        "cpu",
        heldout=0.3,
        # sized for about 20 minutes of the cpu run on 2 shared cores (3 seeds): a few training tasks,
        # short episodes; the held-out success it measures decides only large differences
        train_tasks=4,
        heldout_tasks=6,
        e2e_rl=_e2e_rl("cpu", max_turns=3, steps=2, batch_pivots=2, group_size=4, max_new_tokens=48),
        pivot_batch=2,
        pivot_group=4,
        profile=replace(PROFILE, k=4, max_new_tokens=48),
        filter=FILTER,
        evaluations=1,
        max_prompt_tokens=1024,
    ),
    "gpu": E2EScale(
        "gpu",
        "hf:smollm2",
        "cuda",
        heldout=0.3,
        # sized with the main gpu scale (a few minutes per seed, estimated, not run): every task, short episodes
        train_tasks=0,
        heldout_tasks=0,
        e2e_rl=_e2e_rl("gpu", max_turns=6, steps=8, batch_pivots=4, group_size=8, max_new_tokens=96),
        pivot_batch=8,
        pivot_group=8,
        profile=replace(PROFILE, max_new_tokens=96),
        filter=FILTER,
        evaluations=4,
        max_prompt_tokens=2048,
    ),
}


def split_tasks(scale: E2EScale) -> tuple[list[str], list[str]]:
    """(training task ids, held-out task ids): the bundled terminal tasks split by trajectory, as the terminal pivots."""
    from pivot_envs.domains.terminal import bundled_pivots
    from pivot_envs.extract import split_by_trajectory

    train, heldout = split_by_trajectory(bundled_pivots(), scale.heldout, seed=0)
    train_ids = sorted({p.context["task"] for p in train})
    heldout_ids = sorted({p.context["task"] for p in heldout})
    return train_ids[: scale.train_tasks or None], heldout_ids[: scale.heldout_tasks or None]


def start_policy(scale: E2EScale) -> Any:
    """A fresh copy of the start policy (the same weights every call)."""
    from pivot_envs.adapters.reproduce.measure import load_policy

    return load_policy(scale.policy, scale.device, scale.max_prompt_tokens)


def load_weights(policy: Any, checkpoint: Path) -> None:
    """Put a checkpoint's weights (`save_checkpoint`'s save_pretrained) into the policy's model."""
    from transformers import AutoModelForCausalLM

    dtype = next(policy.model.parameters()).dtype
    policy.model.load_state_dict(AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype).state_dict())


def checkpoint_steps(run: Path, steps: int) -> list[tuple[int, Path]]:
    """(step, folder) of a run's checkpoints in order of step, its final weights (step `steps`) last."""
    found = dict((int(p.name.split("-")[1]), p) for p in (run / "checkpoints").glob("step-*"))
    found[steps] = run / "final"
    return sorted(found.items())


def curve(
    policy: Any,
    run: Path,
    turns_at: dict[int, int],
    heldout: Sequence[str],
    envs: Sequence[Any],
    scale: E2EScale,
) -> list[dict[str, Any]]:
    """Held-out success at each checkpoint of `run`: [{"step", "turns", "rewards" by task}]."""
    from pivot_envs.adapters.grpo.episodes import success_rate

    points = []
    for step, folder in checkpoint_steps(run, max(turns_at)):
        load_weights(policy, folder)
        rewards = success_rate(policy, envs, heldout, scale.e2e_rl.train.max_new_tokens)["rewards"]
        points.append({"step": step, "turns": turns_at[step], "rewards": rewards})
    return points


def run_seed(
    scale: E2EScale, out: Path, seed: int, train_ids: list[str], heldout_ids: list[str]
) -> dict[str, Any]:
    """Both arms from the start policy at one seed: their curves of held-out success against rollout turns."""
    from pivot_envs.adapters.grpo.episodes import episode_envs, success_rate, train_episodes
    from pivot_envs.adapters.grpo.trainer import NoPivotsError, PivotRLConfig, pivotrl
    from pivot_envs.domains.terminal import bundled_pivots

    grpo = scale.e2e_rl.train
    steps = grpo.steps
    every = max(1, math.ceil(steps / scale.evaluations))
    grpo = replace(grpo, policy=scale.policy, seed=seed, checkpoint_every=every, out=str(out / "e2e"))
    episodes = replace(scale.e2e_rl, train=grpo)
    envs = episode_envs(episodes, max(1, min(len(heldout_ids), 8)))
    try:
        policy = start_policy(scale)
        start = success_rate(policy, envs, heldout_ids, grpo.max_new_tokens)
        e2e = train_episodes(episodes, train_ids, policy=policy)
        e2e_turns = {record["step"]: record["rollout_turns_total"] for record in e2e.history}
        e2e_curve = curve(policy, Path(grpo.out), e2e_turns, heldout_ids, envs, scale)

        # PivotRL: as many training turns as E2E RL spent, B x G per step
        per_step = scale.pivot_batch * scale.pivot_group
        pivot_steps = max(1, round(e2e.rollout_turns / per_step))
        candidates = [p for p in bundled_pivots() if p.context["task"] in set(train_ids)]
        config = PivotRLConfig(
            out=str(out / "pivotrl"),
            profile=replace(scale.profile, seed=seed),
            filter=scale.filter,
            train=replace(
                grpo,
                batch_pivots=scale.pivot_batch,
                group_size=scale.pivot_group,
                steps=pivot_steps,
                checkpoint_every=max(1, math.ceil(pivot_steps / scale.evaluations)),
                out="",
            ),
        )
        policy = start_policy(scale)
        pivot: dict[str, Any] = {"profile_turns": len(candidates) * scale.profile.k}
        try:
            result = pivotrl(candidates, policy, config)
            trained = min(scale.pivot_batch, len(result.selection.pivots)) * scale.pivot_group
            turns_at = {step: step * trained for step in range(1, pivot_steps + 1)}
            pivot.update(
                pivots=len(result.selection.pivots),
                rollout_turns=pivot_steps * trained,
                curve=curve(policy, Path(config.out) / "train", turns_at, heldout_ids, envs, scale),
            )
        except NoPivotsError as error:  # nothing to train at: the arm stays at the start policy
            pivot.update(pivots=0, rollout_turns=0, curve=[], note=str(error))
    finally:
        for env in envs:
            env.close()
    return {
        "seed": seed,
        "start": start["rewards"],
        "e2e": {"rollout_turns": e2e.rollout_turns, "steps": steps, "curve": e2e_curve},
        "pivotrl": {**pivot, "steps": pivot_steps},
    }


def final_rewards(arm: dict[str, Any], start: dict[str, float | None]) -> dict[str, float | None]:
    """An arm's held-out rewards at its last evaluated point (the start policy's when it never trained)."""
    return arm["curve"][-1]["rewards"] if arm["curve"] else start


def plot(seeds: list[dict[str, Any]], png: Path) -> Path:
    """Held-out task success against cumulative rollout turns, one line per arm and seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def rate(rewards: dict[str, float | None]) -> float:
        kept = [r for r in rewards.values() if r is not None]
        return sum(kept) / len(kept) if kept else 0.0

    figure, axis = plt.subplots(figsize=(7, 4))
    for arm, colour in (("pivotrl", "tab:blue"), ("e2e", "tab:orange")):
        for index, result in enumerate(seeds):
            points = [(0, rate(result["start"]))] + [
                (p["turns"], rate(p["rewards"])) for p in result[arm]["curve"]
            ]
            label = ("PivotRL" if arm == "pivotrl" else "E2E RL") if index == 0 else None
            axis.plot(
                [t for t, _ in points], [s for _, s in points], "o-", color=colour, alpha=0.7, label=label
            )
    axis.set_xlabel("cumulative rollout turns (training)")
    axis.set_ylabel("held-out task success")
    axis.set_ylim(-0.02, 1.02)
    axis.set_title("PivotRL vs E2E RL per rollout turn (terminal tasks)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(png)
    plt.close(figure)
    return png


def sizes_of(scale: str, policy: str | None = None, device: str | None = None) -> E2EScale:
    """The comparison's sizes at `scale`, starting from `policy` on `device` where given (`pivotrl reproduce`'s
    --policy and --device: both arms start from the policy the rest of the run uses)."""
    if scale not in SCALES:
        raise UnknownNameError("scale", scale, sorted(SCALES))
    sizes = SCALES[scale]
    return replace(sizes, policy=policy or sizes.policy, device=device or sizes.device)


def run(
    scale: str, out: Path, seeds: Sequence[int], policy: str | None = None, device: str | None = None
) -> dict[str, Any]:
    """Run the comparison at `scale` ("quick", "cpu", "gpu") for `seeds` into `out` (each seed's result is kept
    in seed-N.json and reused by a rerun made with the same sizes, policy and device; one made with others is
    run again) and return the claim: {"claim", "title", "paper_section", "paper", "ours", "verdict",
    "interval", "detail", "figures"}. `policy` and `device` replace the scale's start policy and device."""
    from pivot_envs.adapters.reproduce.stats import bootstrap_mean, paired_differences, wilson

    sizes, out = sizes_of(scale, policy, device), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    train_ids, heldout_ids = split_tasks(sizes)
    results = []
    for seed in seeds:
        path = out / f"seed-{seed}.json"
        stored = json.loads(path.read_text()) if path.is_file() else None
        if stored is None or stored.get("scale") != sizes.to_dict():
            shutil.rmtree(out / f"seed-{seed}", ignore_errors=True)
            result = run_seed(sizes, out / f"seed-{seed}", seed, train_ids, heldout_ids)
            path.write_text(json.dumps({"scale": sizes.to_dict(), **result}, indent=2))
            stored = json.loads(path.read_text())
        results.append(stored)

    def table(arm: str) -> list[list[float | None]]:
        rows = [final_rewards(r[arm], r["start"]) if arm != "start" else r["start"] for r in results]
        return [[row.get(task) for task in heldout_ids] for row in rows]

    def successes(rows: list[list[float | None]]) -> dict[str, float]:
        kept = [v for row in rows for v in row if v is not None]
        return wilson(int(sum(kept)), len(kept))

    pivot, e2e, start = table("pivotrl"), table("e2e"), table("start")
    difference = bootstrap_mean(paired_differences(pivot, e2e))
    solved_any = any(v for rows in (pivot, e2e, start) for row in rows for v in row if v)
    low, high = difference["low"], difference["high"]
    if not solved_any:
        verdict = "inconclusive"
    elif low > -MARGIN:
        verdict = "reproduced"
    elif high < -MARGIN:
        verdict = "not reproduced"
    else:
        verdict = "inconclusive"
    turns = {arm: [r[arm]["rollout_turns"] for r in results] for arm in ("pivotrl", "e2e")}
    ours = {
        "heldout_tasks": len(heldout_ids),
        "train_tasks": len(train_ids),
        "seeds": list(seeds),
        "start_success": successes(start),
        "e2e_success": successes(e2e),
        "pivotrl_success": successes(pivot),
        "difference_pivotrl_minus_e2e": difference,
        "rollout_turns": turns,
        "pivotrl_profile_turns": [r["pivotrl"]["profile_turns"] for r in results],
        "pivotrl_pivots": [r["pivotrl"]["pivots"] for r in results],
    }
    figure = plot(results, out / "e2e_success_vs_turns.png")
    e2e_rl = sizes.e2e_rl
    detail = (
        f"Terminal tasks ({len(train_ids)} training, {len(heldout_ids)} held out by trajectory), {len(results)} "
        f"seed(s), scale {scale}: E2E RL spent {turns['e2e']} rollout turns ({e2e_rl.train.steps} steps of "
        f"{e2e_rl.train.batch_pivots} tasks x {e2e_rl.train.group_size} episodes, up to {e2e_rl.max_turns} turns "
        f"each); PivotRL {turns['pivotrl']} (one per training sample) plus {ours['pivotrl_profile_turns']} profiling samples. "
        f"Held-out greedy success: start {as_text(ours['start_success'])}, E2E RL "
        f"{as_text(ours['e2e_success'])}, PivotRL {as_text(ours['pivotrl_success'])}; PivotRL - E2E RL "
        f"{difference['estimate']:+.3f} [{low:+.3f}, {high:+.3f}] (paired by seed and task; 'competitive' means "
        f"the interval lies above -{MARGIN:.2f})."
        + (
            ""
            if solved_any
            else " Neither arm nor the start policy solved any held-out task: no evidence either way."
        )
        + (" The quick scale's random model checks the machinery only." if sizes.policy == "tiny" else "")
    )
    return {
        "claim": "e2e",
        "title": "PivotRL vs end-to-end RL per rollout turn",
        "paper_section": "Sec. 4.3 (Comparison to End-to-End RL on SWE-Bench), Figure 3",
        "paper": PAPER,
        "ours": ours,
        "verdict": verdict,
        "interval": [low, high],
        "detail": detail,
        "figures": [str(figure)],
    }


def as_text(figure: dict[str, float]) -> str:
    """A rate with its interval, as the detail shows it."""
    return f"{figure['estimate']:.3f} [{figure['low']:.3f}, {figure['high']:.3f}] (n={figure['n']})"
