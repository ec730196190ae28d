"""E2 of docs/preregistration.md, the paper's regime: its data, pilot, arms and checkpoint selection.

Every stage lives in the same output folder as the scale's own (the base is shared): `e2-profile`
(all train-B candidates under the base at K), `e2-measure-base` (the base on every held-out, drift
and general item), `e2-pilot-lr<rate>-s<seed>` (the learning-rate pilot, validation only) and
`e2-<arm>-s<seed>` (an arm trained from the base, validation accuracy at each checkpoint, then the
final checkpoint and the one validation selects measured). The main arms run only once the pilot
has finished: their learning rate and clip are the pilot's choice (`pilot_choice`), so they cannot
be run before it is made. Nothing held-out is summarised before the last seed (prereg.py).
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pivot_envs.adapters.reproduce import measure
from pivot_envs.adapters.reproduce.experiments import BASE_FIELDS, Experiments, bundled_pivots
from pivot_envs.adapters.reproduce.scales import Scale
from pivot_envs.config import ConfigError
from pivot_envs.extract import heldout_side, split_by_trajectory
from pivot_envs.pivot import Pivot

VALIDATION_SEED = "prereg-validation"
DRIFT_SEED = "prereg-drift"
ARMS = ("pivotrl", "pivotrl-kl", "pivotrl-action-kl", "sft", "sft-matched")
KL_BETA = 0.05


@dataclass(frozen=True)
class Sizes:
    """E2's sizes at one scale: the cpu scale's are the registered ones; quick's check the machinery."""

    steps: int
    batch_pivots: int
    group_size: int
    check_every: int  # a checkpoint (and its validation accuracy) every this many optimizer steps
    pilot_rates: tuple[float, ...]
    pilot_seeds: tuple[int, ...]
    seeds: tuple[int, ...]
    drift_pivots: dict[str, int]  # held-out pivots of each other domain in the drift set
    questions: int
    wiki_texts: int
    sft_epochs: int = 2
    sft_batch: int = 4
    sft_learning_rate: float = 5e-5
    # the quick scale's cuts (0: all): held-out, train-B and validation pivots, each a seeded sample
    heldout_pivots: int = 0
    train_pivots: int = 0
    validation_pivots: int = 0


SIZES = {
    "cpu": Sizes(
        steps=24,
        batch_pivots=4,
        group_size=8,
        check_every=6,
        pilot_rates=(5e-6, 1e-5, 2e-5),
        pilot_seeds=(100, 101, 102),
        seeds=tuple(range(10)),
        drift_pivots={"tool-use": 32, "terminal": 16, "swe": 16},
        questions=60,
        wiki_texts=100,
    ),
    "quick": Sizes(
        steps=2,
        batch_pivots=2,
        group_size=4,
        check_every=1,
        pilot_rates=(1e-3, 2e-3),
        pilot_seeds=(100, 101),
        seeds=(0, 1),
        drift_pivots={"search": 2},
        questions=4,
        wiki_texts=2,
        sft_epochs=1,
        sft_learning_rate=1e-3,
        heldout_pivots=6,
        train_pivots=8,
        validation_pivots=3,
    ),
}


def sizes_of(scale: Scale) -> Sizes:
    if scale.name not in SIZES:
        raise ConfigError(
            f"E2 is registered at the cpu scale (and quick, for the tests), not at {scale.name!r}"
        )
    return SIZES[scale.name]


@dataclass
class Data:
    """E2's pivots: the training domain's held-out set (all of it), train-B and validation (part B split by
    trajectory), and the drift pivots of the other domains."""

    heldout: list[Pivot]
    train_b: list[Pivot]
    validation: list[Pivot]
    drift: dict[str, list[Pivot]]


def data(scale: Scale) -> Data:
    """The split the cpu scale makes (held-out by trajectory, the rest halved into parts A and B), then part B
    split 80/20 by a hash of its trajectories seeded "prereg-validation"; the drift pivots a sample of the other
    domains' held-out pivots seeded "prereg-drift"."""
    domain = scale.train_domains[0]
    sides: dict[str, tuple[list[Pivot], list[Pivot]]] = {}
    for name in scale.domains:
        train_side, heldout = split_by_trajectory(bundled_pivots(name), scale.heldout, seed=0)
        sides[name] = (train_side, heldout)
    _, part_b = split_by_trajectory(sides[domain][0], 0.5, seed=1)
    validation = [p for p in part_b if heldout_side(p.trajectory_id, 0.2, VALIDATION_SEED)]  # type: ignore[arg-type]
    train_b = [p for p in part_b if p not in validation]
    sizes = sizes_of(scale)

    def cut(pivots: list[Pivot], count: int, tag: str) -> list[Pivot]:
        return random.Random(f"e2/{tag}").sample(pivots, count) if 0 < count < len(pivots) else pivots

    drift = {}
    for name, count in sizes_of(scale).drift_pivots.items():
        if name in sides and name != domain:
            pool = sides[name][1]
            drift[name] = random.Random(f"{DRIFT_SEED}/{name}").sample(pool, min(count, len(pool)))
    return Data(
        cut(sides[domain][1], sizes.heldout_pivots, "heldout"),
        cut(train_b, sizes.train_pivots, "train"),
        cut(validation, sizes.validation_pivots, "validation"),
        drift,
    )


def clip_for(grad_norms: list[float]) -> float:
    """Twice the median gradient norm, rounded up to one significant digit (so that clipping is not active at
    every step): 2 x 1.34 = 2.68 gives 3."""
    value = 2 * statistics.median(grad_norms)
    if value <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(value))
    return math.ceil(round(value / magnitude, 9)) * magnitude  # 0.09 / 0.01 is 8.999...: already one digit


def pilot_choice(pilots: dict[float, dict[str, Any]]) -> dict[str, float]:
    """The registered choice from the pilot's results by rate: the rate with the highest validation accuracy at
    the last step (a tie goes to the lower rate), and the clip from that rate's gradient norms."""
    best = max(sorted(pilots), key=lambda rate: (pilots[rate]["validation"][-1]["accuracy"], -rate))
    return {"learning_rate": best, "max_grad_norm": clip_for(pilots[best]["grad_norms"])}


class E2:
    """E2's stages in a run folder, on the scale's base."""

    def __init__(self, runs: Experiments) -> None:
        self.runs, self.scale = runs, runs.scale
        self.sizes = sizes_of(self.scale)
        self.data = data(self.scale)
        self.domain = self.scale.train_domains[0]
        self._choice: dict[str, float] | None = None  # the pilot's, read once

    def settings(self, **extra: Any) -> dict[str, Any]:
        """What every E2 stage depends on: the base's fields, E2's sizes, the split's sizes."""
        return self.runs.settings(
            BASE_FIELDS,
            e2=repr(self.sizes),
            split={
                "heldout": len(self.data.heldout),
                "train_b": len(self.data.train_b),
                "validation": len(self.data.validation),
            },
            **extra,
        )

    # -- D_adv and the base ------------------------------------------------------------------------------

    def profile(self) -> dict[str, Any]:
        """Every train-B candidate profiled under the base at the scale's K; D_adv."""
        return self.runs.stages.run("e2-profile", self.settings(k=self.scale.profile.k), self._profile)

    def _profile(self, folder: Path) -> dict[str, Any]:
        from pivot_envs.extract import filter_pivots
        from pivot_envs.pivot import read_pivots
        from pivot_envs.profile import profile

        path = folder / "profiled.jsonl"
        config = replace(self.scale.profile, progress=self.scale.progress, temperature=1.0)
        profile(self.data.train_b, self.runs.reset_to_base(), path, config, reference="reproduce base (E2)")
        profiled = list(read_pivots(path))
        lambda_diff = self.scale.filter.lambda_diff
        adv = filter_pivots(profiled, lambda_diff=lambda_diff, mode="adv")
        # no mixed candidate (the quick scale's random model): the unsolved ones too, said in the result
        kept = adv or filter_pivots(profiled, lambda_diff=lambda_diff, mode="adv-or-unsolved")
        return {
            "candidates": [{"id": p.id, "rewards": p.profile.rewards} for p in profiled],
            "adv": [p.id for p in kept],
            "fallback": not adv,
        }

    def adv(self) -> list[Pivot]:
        wanted = set(self.profile()["adv"])
        return [p for p in self.data.train_b if p.id in wanted]

    def measure(self, policy: Any) -> dict[str, Any]:
        """A policy on every E2 item: held-out turns, drift turns, the general questions (scores and replies),
        the Wikipedia loss."""
        tokens = self.scale.train.max_new_tokens
        questions = measure.read_questions(self.sizes.questions)
        replies = measure.question_replies(policy, questions)
        return {
            "turns": {self.domain: measure.turn_rewards(policy, self.data.heldout, tokens)},
            "ood_turns": {
                d: measure.turn_rewards(policy, pivots, tokens) for d, pivots in self.data.drift.items()
            },
            "questions": [
                1.0 if measure.answer_found(r, q["answer"]) else 0.0 for q, r in zip(questions, replies)
            ],
            "question_replies": replies,
            "wiki_loss": measure.text_losses(
                policy, measure.wikipedia_texts(self.sizes.wiki_texts), self.scale.wiki_tokens
            ),
        }

    def base_measures(self) -> dict[str, Any]:
        return self.runs.stages.run(
            "e2-measure-base", self.settings(), lambda _: self.measure(self.runs.reset_to_base())
        )

    def validation_accuracy(self, policy: Any) -> float:
        rewards = measure.turn_rewards(policy, self.data.validation, self.scale.train.max_new_tokens)
        graded = [r for r in rewards if r is not None]
        return sum(graded) / len(graded) if graded else 0.0

    # -- training -------------------------------------------------------------------------------------

    def grpo_config(
        self, folder: Path, seed: int, learning_rate: float, max_grad_norm: float, arm: str
    ) -> Any:
        sizes = self.sizes
        return replace(
            self.scale.train,
            policy=self.scale.policy,
            steps=sizes.steps,
            batch_pivots=sizes.batch_pivots,
            group_size=sizes.group_size,
            learning_rate=learning_rate,
            max_grad_norm=max_grad_norm,
            beta=KL_BETA if arm in ("pivotrl-kl", "pivotrl-action-kl") else 0.0,
            loss_level="action" if arm == "pivotrl-action-kl" else "token",
            seed=seed,
            checkpoint_every=sizes.check_every,
            eval_every=sizes.check_every,
            eval_pivots=max(1, len(self.data.validation)),
            out=str(folder / "train"),
        )

    def _grpo(
        self, folder: Path, seed: int, rate: float, clip: float, arm: str
    ) -> tuple[Any, dict[str, Any]]:
        """Train a GRPO arm; returns the policy (final weights) and the run's record: per-step reward, its
        standard deviation, gradient norms, and validation accuracy at every checkpoint."""
        from pivot_envs.adapters.grpo import train

        policy = self.runs.reset_to_base()
        config = self.grpo_config(folder, seed, rate, clip, arm)
        result = train(config, self.adv(), policy=policy, heldout=self.data.validation)
        history = result.history
        record = {
            "history": [
                {
                    k: h.get(k)
                    for k in ("step", "reward_mean", "reward_std", "frac_zero_variance", "grad_norm")
                }
                for h in history
            ],
            "grad_norms": [h["grad_norm"] for h in history if h.get("grad_norm") is not None],
            "clipped": sum(1 for h in history if (h.get("grad_norm") or 0) > clip > 0),
            "validation": [
                {"step": h["step"], "accuracy": h["eval_turn_accuracy"]}
                for h in history
                if "eval_turn_accuracy" in h
            ],
        }
        return policy, {**record, "checkpoints": str(Path(config.out) / "checkpoints")}

    def _pilot_stage(self, rate: float, seed: int) -> tuple[str, dict[str, Any]]:
        """A pilot run's stage: its name and the settings it depends on."""
        return f"e2-pilot-lr{rate:g}-s{seed}", self.settings(arm="pivotrl", rate=rate, seed=seed)

    def _pilots(self) -> list[tuple[float, int]]:
        return list(zip(self.sizes.pilot_rates, self.sizes.pilot_seeds))

    def pilot(self, rate: float, seed: int) -> dict[str, Any]:
        return self.runs.stages.run(*self._pilot_stage(rate, seed), lambda f: self._pilot(f, rate, seed))

    def pilot_runs(self) -> dict[float, dict[str, Any]]:
        """Every pilot run's result by rate (each run first when it has not finished)."""
        return {rate: self.pilot(rate, seed) for rate, seed in self._pilots()}

    def pilot_finished(self) -> bool:
        return all(self.runs.stages.finished(*self._pilot_stage(rate, seed)) for rate, seed in self._pilots())

    def _pilot(self, folder: Path, rate: float, seed: int) -> dict[str, Any]:
        import shutil

        _, record = self._grpo(folder, seed, rate, 1.0, "pivotrl")
        shutil.rmtree(folder / "train", ignore_errors=True)  # the pilot keeps no weights
        return {key: value for key, value in record.items() if key != "checkpoints"}

    def choice(self) -> dict[str, float]:
        """The pilot's choice (every pilot run is run first when it has not finished); computed once."""
        if self._choice is None:
            self._choice = pilot_choice(self.pilot_runs())
        return self._choice

    def _arm_stage(self, arm: str, seed: int) -> tuple[str, dict[str, Any]]:
        """An arm's stage on a seed: its name and the settings it depends on (the pilot's choice among them)."""
        if arm not in ARMS:
            raise ConfigError(f"E2 has no arm {arm!r}; its arms: {', '.join(ARMS)}")
        return f"e2-{arm}-s{seed}", self.settings(arm=arm, seed=seed, choice=self.choice())

    def arm(self, arm: str, seed: int) -> dict[str, Any]:
        return self.runs.stages.run(
            *self._arm_stage(arm, seed), lambda f: self._arm(f, arm, seed, self.choice())
        )

    def arm_finished(self, arm: str, seed: int) -> bool:
        return self.runs.stages.finished(*self._arm_stage(arm, seed))

    def _arm(self, folder: Path, arm: str, seed: int, choice: dict[str, float]) -> dict[str, Any]:
        import shutil

        if arm.startswith("sft"):
            policy, record, selected = self._sft(arm, seed, choice)
        else:
            policy, record = self._grpo(folder, seed, choice["learning_rate"], choice["max_grad_norm"], arm)
            selected = None
        final = self.measure(policy)
        best = max(record["validation"], key=lambda v: (v["accuracy"], v["step"]), default=None)
        last_step = record["validation"][-1]["step"] if record["validation"] else None
        chosen: dict[str, Any] | None = None
        if best is not None and best["step"] != last_step:
            if selected is not None:  # SFT: the best weights were kept in memory
                policy.model.load_state_dict(selected)
            else:
                load_weights(policy, Path(record["checkpoints"]) / f"step-{best['step']}")
            chosen = {"step": best["step"], **self.measure(policy)}
        shutil.rmtree(folder / "train", ignore_errors=True)  # the weights: not needed once measured
        record.pop("checkpoints", None)
        return {**record, "final": final, "selected": chosen or {"step": last_step, "same_as_final": True}}

    def _sft(self, arm: str, seed: int, choice: dict[str, float]) -> tuple[Any, dict[str, Any], Any]:
        """Standard SFT (`sft`: 2 epochs of train-B's expert turns; `sft-matched`: the RL arms' optimizer steps and
        learning rate, cycling over the turns), validation accuracy every `check_every` steps (every quarter of its
        steps for `sft`), the best weights kept."""
        import torch

        from pivot_envs.adapters.sft import SFTConfig, warm_up

        sizes = self.sizes
        policy = self.runs.reset_to_base()
        turns = self.data.train_b
        if arm == "sft":
            config = SFTConfig(
                epochs=sizes.sft_epochs,
                batch_size=sizes.sft_batch,
                learning_rate=sizes.sft_learning_rate,
                detach_prefix=False,
                seed=seed,
                progress=self.scale.progress,
            )
            total = sizes.sft_epochs * math.ceil(len(turns) / sizes.sft_batch)
            every = max(1, total // 4)
        else:
            epochs = math.ceil(sizes.steps * sizes.sft_batch / max(1, len(turns)))
            config = SFTConfig(
                epochs=epochs,
                batch_size=sizes.sft_batch,
                learning_rate=choice["learning_rate"],
                detach_prefix=False,
                seed=seed,
                max_steps=sizes.steps,
                progress=self.scale.progress,
            )
            every = sizes.check_every
        validation: list[dict[str, Any]] = []
        best: dict[str, Any] = {}

        def on_step(step: int, last: bool) -> None:
            if step % every and not last:
                return
            accuracy = self.validation_accuracy(policy)
            validation.append({"step": step, "accuracy": accuracy})
            if not best or accuracy >= best["accuracy"]:
                best.update(
                    accuracy=accuracy,
                    state={k: v.detach().clone() for k, v in policy.model.state_dict().items()},
                )

        torch.manual_seed(seed)
        records = warm_up(policy, turns, config, on_step=on_step)
        record = {
            "history": [{"step": r["step"], "loss": r["loss"]} for r in records],
            "validation": validation,
        }
        return policy, record, best.get("state")


def load_weights(policy: Any, checkpoint: Path) -> None:
    """A trainer checkpoint's weights (save_pretrained) into `policy.model`."""
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(checkpoint, torch_dtype=policy.model.dtype)
    policy.model.load_state_dict(loaded.state_dict())


# -- running E2 (`pivotrl reproduce --only paper-regime-pilot`, then `--only paper-regime`) -------------------


def run_pilot(scale: Scale, out: Path) -> tuple[Path, Any]:
    """The pilot: D_adv, then `pivotrl` at each pilot rate on its seed, validation accuracy at every checkpoint;
    writes OUT/e2-pilot.md and .json with the registered choice (learning rate and clip). Its figures are for
    the pre-registration's Deviations section, not evidence."""
    import json

    from pivot_envs.adapters.reproduce.stages import Stages

    stages = Stages(out)
    e2 = E2(Experiments(scale, out, stages))
    e2.runs.base()
    profiled = e2.profile()
    adv = profiled["adv"]
    pilots = e2.pilot_runs()
    choice = pilot_choice(pilots)
    lines = [
        "# E2 pilot (docs/preregistration.md): learning rate and clip",
        "",
        f"D_adv: {len(adv)} of {len(e2.data.train_b)} train-B candidates{' (none mixed: the unsolved too)' if profiled['fallback'] else ''}; validation: {len(e2.data.validation)} "
        f"pivots; {e2.sizes.steps} steps x B {e2.sizes.batch_pivots} x G {e2.sizes.group_size}, max_grad_norm 1.0.",
        "",
        "| rate | seed | validation accuracy by step | median gradient norm | steps clipped |",
        "|---|---|---|---|---|",
    ]
    for (rate, result), seed in zip(pilots.items(), e2.sizes.pilot_seeds):
        shown = ", ".join(f"{v['step']}: {100 * v['accuracy']:.1f}%" for v in result["validation"])
        norms = result["grad_norms"]
        lines.append(
            f"| {rate:g} | {seed} | {shown} | {statistics.median(norms) if norms else float('nan'):.3f} "
            f"| {result['clipped']} of {len(result['history'])} |"
        )
    lines += [
        "",
        f"Chosen: learning rate **{choice['learning_rate']:g}** (the highest validation accuracy at the last "
        f"step; a tie goes to the lower rate), max_grad_norm **{choice['max_grad_norm']:g}** (twice the chosen "
        "rate's median gradient norm, rounded up to one significant digit). Append these to the "
        "pre-registration's Deviations before any main seed runs.",
    ]
    (out / "e2-pilot.json").write_text(
        json.dumps({"choice": choice, "pilots": {str(r): p for r, p in pilots.items()}}, indent=1)
    )
    path = out / "e2-pilot.md"
    path.write_text("\n".join(lines) + "\n")
    return path, stages


def run_main(
    scale: Scale, out: Path, seeds: list[int] | None, finished_only: bool
) -> tuple[Path | None, Any]:
    """E2's arms on `seeds` (default: all registered), then, once every registered seed of every arm has
    finished, its one analysis on the final checkpoint (primary, OUT/e2.md) and on the checkpoint validation
    selects (secondary, OUT/e2-selected.md)."""
    from pivot_envs.adapters.reproduce.prereg import E2 as PLAN
    from pivot_envs.adapters.reproduce.prereg import analyse, check_seeds, report_missing, write_report
    from pivot_envs.adapters.reproduce.report import count_look
    from pivot_envs.adapters.reproduce.stages import Stages

    stages = Stages(out)
    e2 = E2(Experiments(scale, out, stages))
    if not e2.pilot_finished():
        raise ConfigError(
            "E2's main arms take the pilot's learning rate and clip: run `pivotrl reproduce --only "
            "paper-regime-pilot` into this --out first, and append its choice to docs/preregistration.md"
        )
    planned = PLAN.seeds_at(scale)
    run_seeds = check_seeds(PLAN, planned, seeds)
    base = e2.base_measures()
    if not finished_only:
        for seed in run_seeds:
            for arm in ARMS:
                e2.arm(arm, seed)
    finished = {arm: [s for s in planned if e2.arm_finished(arm, s)] for arm in ARMS}
    if report_missing(PLAN, finished, planned):
        return None, stages
    results = {arm: [e2.arm(arm, s) for s in planned] for arm in ARMS}
    domains = [e2.domain, *e2.data.drift]
    base_compared = {"turns": base["turns"], "question_replies": base["question_replies"]}

    def checkpoint(which: str) -> dict[tuple[str, str], list[dict]]:
        return {
            (e2.domain, arm): [
                r["final"] if which == "final" or r["selected"].get("same_as_final") else r["selected"]
                for r in runs
            ]
            for arm, runs in results.items()
        }

    looks = count_look(out, PLAN.name)
    primary = analyse(PLAN, checkpoint("final"), base, base_compared, [e2.domain], domains)
    secondary = analyse(PLAN, checkpoint("selected"), base, base_compared, [e2.domain], domains)
    path = write_report(out, PLAN, primary, planned, looks)
    write_report(
        out,
        PLAN,
        secondary,
        planned,
        looks,
        stem="e2-selected",
        note="the checkpoint each seed's "
        "validation accuracy selects (secondary; the paper compares peak checkpoints)",
    )
    return path, stages
