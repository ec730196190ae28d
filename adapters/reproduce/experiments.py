"""The stages of `pivotrl reproduce`, each a function of a scale that returns JSON-able results.

The order: split every domain's bundled pivots by trajectory into held-out, part A and part B;
warm the model up with SFT on part A (the base every arm starts from: the raw 135M model never
succeeds at a pivot); measure the base; profile part B's candidates under the base (the signal
and miss-rate figures, and D_adv); train each arm from the base on part B (PivotRL, its
ablations, the per-action objective, SFT) and measure it; run the theorem checks; run the
end-to-end RL comparison when its module is there.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pivot_envs.adapters.reproduce import measure
from pivot_envs.adapters.reproduce.scales import Scale
from pivot_envs.adapters.reproduce.stages import Stages, digest
from pivot_envs.extract import split_by_trajectory
from pivot_envs.pivot import Pivot

# The training arms: (pivots, training verifier, loss level). "pivotrl" is the full method.
ARMS = {
    "pivotrl": ("adv", None, "token"),
    "cand-functional": ("cand", None, "token"),
    "sft": ("cand", None, None),
    "cand-strict": ("cand", "strict", "token"),
    "pivotrl-action": ("adv", None, "action"),
    # beyond the paper: the full method with D_adv re-profiled under the current policy during training
    "pivotrl-online": ("adv", None, "token"),
    # budget-matched SFT controls (docs/preregistration.md, E1): SFT with PivotRL's optimizer steps and learning
    # rate, and SFT for one epoch at the SFT arm's learning rate
    "sft-matched": ("cand", None, None),
    "sft-1epoch": ("cand", None, None),
}
ONLINE_ARMS = ("pivotrl-online",)
# The arms each experiment needs (the claims of `--only`).
EXPERIMENT_ARMS = {
    "signal": ("pivotrl", "cand-functional"),
    "strict-functional": (),
    "ablation": ("pivotrl", "cand-functional", "cand-strict"),
    "sft": ("pivotrl", "sft"),
    "objective": ("pivotrl", "pivotrl-action"),
    "online": ("pivotrl", "pivotrl-online"),
    # E1 of docs/preregistration.md: the drift claim against SFT arms of PivotRL's budget
    "sft-matched": ("pivotrl", "sft", "sft-matched", "sft-1epoch"),
    # E2 of docs/preregistration.md (adapters/reproduce/e2.py: its own arms and stages): the pilot, then the arms
    # E3: the reward ablation's arms on fresh seeds
    "reward-confirmation": ("cand-functional", "cand-strict"),
    "paper-regime-pilot": (),
    "paper-regime": (),
    "theorems": (),
    "e2e": (),
}
EXPERIMENTS = tuple(EXPERIMENT_ARMS)
# The arms whose drift out of domain is measured (the SFT comparison); the others only in domain.
DRIFT_ARMS = ("pivotrl", "sft", "sft-matched", "sft-1epoch")
# The scale's fields each early stage depends on (a later stage depends on every field): resizing the
# training arms of a scale keeps its finished base, base measurements and profiles.
BASE_FIELDS = (
    "policy",
    "device",
    "domains",
    "heldout",
    "base_examples",
    "base_epochs",
    "base_learning_rate",
    "max_prompt_tokens",
)
MEASURE_FIELDS = (
    *BASE_FIELDS,
    "eval_pivots",
    "ood_pivots",
    "max_new_tokens",
    "wiki_texts",
    "wiki_tokens",
    "questions",
)
PROFILE_FIELDS = (*BASE_FIELDS, "candidates", "k", "lambda_diff", "max_new_tokens")
REPO = Path(__file__).resolve().parents[2]
THEOREM_TESTS = REPO / "tests" / "adapters" / "test_theorems.py"


def sft_config(scale: Scale, arm: str, examples: int) -> Any:
    """The SFT config of an SFT arm on `examples` part-B turns: the scale's `sft`, or a budget-matched one.
    `sft-matched` takes the RL arms' optimizer steps and learning rate (one pass over the turns in
    `train.steps` batches); `sft-1epoch` one epoch at the SFT arm's learning rate and batch."""
    if arm == "sft-matched":
        steps = max(1, scale.train.steps)
        return replace(
            scale.sft, epochs=1, batch_size=-(-examples // steps), learning_rate=scale.train.learning_rate
        )
    if arm == "sft-1epoch":
        return replace(scale.sft, epochs=1)
    return scale.sft


def arm_sizes(scale: Scale, arm: str, examples: int) -> dict[str, Any]:
    """What a budget-matched arm adds to its stage's settings (its own sizes); {} for the others, so that their
    committed stages stay valid."""
    if arm not in ("sft-matched", "sft-1epoch"):
        return {}
    config = sft_config(scale, arm, examples)
    return {
        "sft": {
            "epochs": config.epochs,
            "batch_size": config.batch_size,
            "learning_rate": config.learning_rate,
        }
    }


def bundled_pivots(domain: str) -> list[Pivot]:
    """The domain's bundled pivots, as its registered env holds them."""
    import gymnasium as gym

    from pivot_envs.registry import env_id

    env = gym.make(env_id(domain), disable_env_checker=True)
    try:
        return list(env.unwrapped.pivots)
    finally:
        env.close()


def _sample(pivots: list[Pivot], count: int, tag: str) -> list[Pivot]:
    if count <= 0 or count >= len(pivots):
        return list(pivots)
    return random.Random(tag).sample(pivots, count)


@dataclass
class Data:
    """Each domain's pivots by role: held-out evaluation set, part A (the base's SFT), part B (the arms' data)."""

    evaluation: dict[str, list[Pivot]] = field(default_factory=dict)
    # the training domains' held-out pivots the arms are compared on (Scale.compared_pivots)
    compared: dict[str, list[Pivot]] = field(default_factory=dict)
    part_a: dict[str, list[Pivot]] = field(default_factory=dict)
    candidates: dict[str, list[Pivot]] = field(default_factory=dict)
    record: dict[str, Any] = field(default_factory=dict)


def split(scale: Scale) -> Data:
    """Split every domain by source trajectory (never by turn): held-out, then the rest halved into part A and
    part B, each by a seeded hash of the trajectory id. The record lists each side's trajectories."""
    data = Data()
    for domain in scale.domains:
        pivots = bundled_pivots(domain)
        train_side, heldout = split_by_trajectory(pivots, scale.heldout, seed=0)
        part_a, part_b = split_by_trajectory(train_side, 0.5, seed=1)
        data.evaluation[domain] = _sample(heldout, scale.eval_pivots, f"{domain}/eval")
        data.compared[domain] = (
            data.evaluation[domain]
            if scale.compared_pivots is None
            else _sample(heldout, scale.compared_pivots, f"{domain}/compared")
        )
        data.part_a[domain] = _sample(part_a, scale.base_examples, f"{domain}/part-a")
        data.candidates[domain] = _sample(part_b, scale.candidates, f"{domain}/part-b")
        sides = {"heldout": heldout, "part_a": part_a, "part_b": part_b}
        data.record[domain] = {
            "pivots": len(pivots),
            **{f"{side}_pivots": len(members) for side, members in sides.items()},
            **{
                f"{side}_trajectories": sorted({p.trajectory_id for p in members})
                for side, members in sides.items()
            },
            "evaluated": [p.id for p in data.evaluation[domain]],
        }
        if domain in scale.train_domains:
            data.record[domain]["compared"] = [p.id for p in data.compared[domain]]
    return data


class Experiments:
    """The stages of one run: a scale, its output folder, the split, and one policy object that each stage
    resets to the weights it starts from."""

    def __init__(self, scale: Scale, out: Path, stages: Stages) -> None:
        self.scale, self.out, self.stages = scale, out, stages
        self.data = split(scale)
        self._policy: Any = None

    @property
    def policy(self) -> Any:
        if self._policy is None:
            self._policy = measure.load_policy(
                self.scale.policy, self.scale.device, self.scale.max_prompt_tokens
            )
        return self._policy

    def settings(self, fields: tuple[str, ...] | None = None, **extra: Any) -> dict[str, Any]:
        """What a stage's result depends on: the scale's `fields` (default: all but seeds, as each seed is its
        own stage) and `extra`."""
        scale = self.scale.to_dict()
        skipped = ("seeds", "name", "notes", "progress", "profile_domains")
        # compared_pivots came later: left out at its default, it leaves earlier runs' stages valid
        if scale["compared_pivots"] is None:
            skipped += ("compared_pivots",)
        kept = fields if fields is not None else tuple(k for k in scale if k not in skipped)
        return {"scale": {k: scale[k] for k in kept}, **extra}

    # -- the base: SFT on part A -------------------------------------------------------------------

    def base(self) -> dict[str, Any]:
        return self.stages.run("base", self.settings(BASE_FIELDS), self._base)

    def _base(self, folder: Path) -> dict[str, Any]:
        import torch

        from pivot_envs.adapters.sft import warm_up

        # The policy as loaded: a stage run after another in this process must not start from trained weights.
        self._policy = None
        examples = [p for domain in self.scale.domains for p in self.data.part_a[domain]]
        torch.manual_seed(0)
        records = warm_up(self.policy, examples, replace(self.scale.warm_up, progress=self.scale.progress))
        torch.save(self.policy.model.state_dict(), folder / "weights.pt")
        losses = [r["loss"] for r in records]
        return {
            "examples": len(examples),
            "epochs": self.scale.warm_up.epochs,
            "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None,
        }

    def reset_to_base(self) -> Any:
        """The policy with the base's weights (the base stage must have finished). A base whose folder lacks them
        (stages/ copied without weights.pt) is rebuilt first, and must give its recorded result."""
        import torch

        weights = self.stages.folder("base") / "weights.pt"
        if not weights.is_file():
            self.stages.rebuild("base", self.settings(BASE_FIELDS), self._base)
        state = torch.load(weights, map_location=self.policy.device)
        self.policy.model.load_state_dict(state)
        return self.policy

    # -- measuring a policy ------------------------------------------------------------------------

    def ood_pivots(self, domain: str) -> list[Pivot]:
        """The drift set of `domain`: the first `ood_pivots` of its evaluation set (all with 0)."""
        pivots = self.data.evaluation[domain]
        return pivots[: self.scale.ood_pivots] if self.scale.ood_pivots > 0 else pivots

    def measure(
        self, policy: Any, domains: list[str], ood: list[str] | None, compared: bool = False
    ) -> dict[str, Any]:
        """Per-item results of `policy`: turn rewards on the evaluation sets of `domains` (with `compared`, on the
        sets the arms are compared on); unless `ood` is None, also on the drift sets of the `ood` domains, the
        Wikipedia losses and the general questions' scores."""
        scale = self.scale
        sets = self.data.compared if compared else self.data.evaluation
        turns = {
            d: measure.turn_rewards(
                policy, sets[d], scale.train.max_new_tokens, progress=self._bar(f"held-out {d}")
            )
            for d in domains
        }
        if ood is None:
            return {"turns": turns}
        texts = measure.wikipedia_texts(scale.wiki_texts)
        return {
            "turns": turns,
            "ood_turns": {
                d: measure.turn_rewards(
                    policy, self.ood_pivots(d), scale.train.max_new_tokens, progress=self._bar(f"drift {d}")
                )
                for d in ood
            },
            "wiki_loss": measure.text_losses(policy, texts, scale.wiki_tokens),
            "questions": measure.question_scores(policy, measure.read_questions(scale.questions)),
        }

    def _bar(self, title: str) -> str | None:
        return title if self.scale.progress else None

    def base_measures(self) -> dict[str, Any]:
        return self.stages.run("measure-base", self.settings(MEASURE_FIELDS), self._base_measures)

    def _base_measures(self, folder: Path) -> dict[str, Any]:
        domains = list(self.scale.domains)
        return self.measure(self.reset_to_base(), domains, domains)

    def _base_compared_settings(self) -> dict[str, Any]:
        return self.settings((*MEASURE_FIELDS, "train_domains"), compared=self.scale.compared_pivots or 0)

    def base_compared(self) -> dict[str, Any]:
        """The base on every item the arms are compared on (the training domains' compared sets), and its replies
        to the general questions: each arm's gain over the base is then measured on the arm's own items."""
        return self.stages.run("measure-base-compared", self._base_compared_settings(), self._base_compared)

    def base_compared_finished(self) -> bool:
        """Whether the base's stage on the compared items finished earlier (`base_compared` would read it)."""
        return self.stages.finished("measure-base-compared", self._base_compared_settings())

    def _base_compared(self, folder: Path) -> dict[str, Any]:
        policy = self.reset_to_base()
        measured = self.measure(policy, list(self.scale.train_domains), None, compared=True)
        questions = measure.read_questions(self.scale.questions)
        return {**measured, "question_replies": measure.question_replies(policy, questions)}

    # -- profiling part B under the base (the signal and miss-rate figures, D_adv) ---------------------

    def profile(self, domain: str) -> dict[str, Any]:
        return self.stages.run(
            f"profile-{domain}",
            self.settings(PROFILE_FIELDS, domain=domain),
            lambda f: self._profile(f, domain),
        )

    def _profile(self, folder: Path, domain: str) -> dict[str, Any]:
        from pivot_envs.extract import filter_pivots
        from pivot_envs.pivot import read_pivots
        from pivot_envs.profile import profile

        scale = self.scale
        path = folder / "profiled.jsonl"
        profile(
            self.data.candidates[domain],
            self.reset_to_base(),
            path,
            replace(scale.profile, progress=scale.progress),
            reference=f"reproduce base {digest(self.settings(BASE_FIELDS))}",
        )
        profiled = list(read_pivots(path))
        adv = filter_pivots(profiled, lambda_diff=scale.filter.lambda_diff, mode="adv")
        kept = adv or filter_pivots(profiled, lambda_diff=scale.filter.lambda_diff, mode="adv-or-unsolved")
        return {
            "candidates": [
                {
                    "id": p.id,
                    "rewards": p.profile.rewards,
                    "strict": p.profile.strict_rewards,
                    "valid": p.profile.valid or [True] * len(p.profile.rewards),
                }
                for p in profiled
            ],
            "adv": [p.id for p in adv],
            "pivots": [p.id for p in kept],
            "fallback": not adv,
        }

    # -- training arms -------------------------------------------------------------------------------

    def arm_settings(self, domain: str, arm: str, seed: int) -> dict[str, Any]:
        """What an arm's seed depends on: the whole scale, and a budget-matched arm's own sizes."""
        examples = len(self.data.candidates[domain])
        return self.settings(domain=domain, arm=arm, seed=seed, **arm_sizes(self.scale, arm, examples))

    def arm(self, domain: str, arm: str, seed: int) -> dict[str, Any]:
        settings = self.arm_settings(domain, arm, seed)
        return self.stages.run(
            f"train-{domain}-{arm}-s{seed}", settings, lambda f: self._arm(f, domain, arm, seed)
        )

    def arm_finished(self, domain: str, arm: str, seed: int) -> bool:
        """Whether this arm's seed finished earlier at this scale (`arm` would read it, not train)."""
        return self.stages.finished(f"train-{domain}-{arm}-s{seed}", self.arm_settings(domain, arm, seed))

    def _arm(self, folder: Path, domain: str, arm: str, seed: int) -> dict[str, Any]:
        import torch

        from pivot_envs.adapters.grpo import train
        from pivot_envs.adapters.sft import warm_up

        scale = self.scale
        selection, verifier, level = ARMS[arm]
        profiled = self.profile(domain)
        wanted = set(profiled["pivots"]) if selection == "adv" else {c["id"] for c in profiled["candidates"]}
        pivots = [p for p in self.data.candidates[domain] if p.id in wanted]
        policy = self.reset_to_base()
        history: list[dict[str, Any]] = []
        if level is None:  # SFT on the same part-B candidates' expert turns
            torch.manual_seed(seed)
            config = sft_config(scale, arm, len(pivots))
            warm_up(policy, pivots, replace(config, seed=seed, progress=scale.progress))
        else:
            config = replace(
                scale.train, policy=scale.policy, loss_level=level, seed=seed, out=str(folder / "train")
            )
            extra: dict[str, Any] = {"verifier": verifier} if verifier else {}
            if arm in ONLINE_ARMS:  # re-profile the whole part-B pool about halfway through (once at 6 steps)
                config = replace(
                    config,
                    reprofile_every=max(1, config.steps // 2),
                    reprofile_k=min(scale.ks),
                    reprofile_lambda_diff=scale.filter.lambda_diff,
                )
                extra["candidates"] = self.data.candidates[domain]
            result = train(config, pivots, policy=policy, **extra)
            keys = (
                "step",
                "reward_mean",
                "reward_std",
                "strict_reward_mean",
                "frac_zero_variance",
                "groups_trained",
                "pivots_in_play",
                "retired",
                "revived",
            )
            history = [{key: record.get(key) for key in keys} for record in result.history]
            shutil.rmtree(result.final, ignore_errors=True)  # the weights: not needed once measured
        others = [d for d in scale.domains if d != domain] if arm in DRIFT_ARMS else None
        result = {
            "pivots": len(pivots),
            "history": history,
            **self.measure(policy, [domain], others, compared=True),
        }
        if arm_sizes(
            scale, arm, len(pivots)
        ):  # the new arms log their replies (format capture or forgetting)
            result["question_replies"] = measure.question_replies(
                policy, measure.read_questions(scale.questions)
            )
        return result

    # -- the theorems and end-to-end RL ------------------------------------------------------------------

    def theorems(self) -> dict[str, Any]:
        source = THEOREM_TESTS.read_text() if THEOREM_TESTS.exists() else ""
        return self.stages.run("theorems", {"tests": digest(source)}, self._theorems)

    def _theorems(self, folder: Path) -> dict[str, Any]:
        if not THEOREM_TESTS.exists():
            return {"available": False, "tests": [], "path": str(THEOREM_TESTS)}
        report = folder / "junit.xml"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                str(THEOREM_TESTS),
                "-q",
                "-p",
                "no:cacheprovider",
                f"--junitxml={report}",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        tests = []
        if report.exists():
            for case in ElementTree.parse(report).getroot().iter("testcase"):
                outcome = next(
                    (child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed"
                )
                tests.append({"name": case.get("name"), "outcome": outcome})
        return {
            "available": True,
            "tests": tests,
            "returncode": done.returncode,
            "path": str(THEOREM_TESTS.relative_to(REPO)),
            "output": done.stdout[-2000:],
        }

    def e2e(self, seeds: list[int]) -> dict[str, Any] | None:
        """The end-to-end RL claim from adapters/reproduce/e2e.py's run(), or None when that module is absent."""
        try:
            from pivot_envs.adapters.reproduce import e2e
        except ImportError:
            return None
        work = self.out / "e2e"  # e2e.run keeps its own files (and its own resuming) here
        return self.stages.run(
            "e2e",
            self._e2e_settings(e2e, seeds),
            lambda _: json.loads(
                json.dumps(
                    e2e.run(self.scale.name, work, seeds, policy=self.scale.policy, device=self.scale.device),
                    default=str,
                )
            ),
        )

    def e2e_finished(self, seeds: list[int]) -> bool:
        """Whether the end-to-end comparison finished earlier with these seeds (`e2e` would read it)."""
        try:
            from pivot_envs.adapters.reproduce import e2e
        except ImportError:
            return False
        return self.stages.finished("e2e", self._e2e_settings(e2e, seeds))

    def _e2e_settings(self, module: Any, seeds: list[int]) -> dict[str, Any]:
        settings = {
            "scale": self.scale.name,
            "seeds": seeds,
            "module": digest(Path(module.__file__).read_text()),
        }
        # --policy and --device reach the comparison too; at the E2E scale's own they are left out of its
        # settings, so stages finished before they were passed on stay valid
        sizes = module.SCALES.get(self.scale.name)
        for key in ("policy", "device"):
            if sizes is None or getattr(sizes, key) != getattr(self.scale, key):
                settings[key] = getattr(self.scale, key)
        return settings
