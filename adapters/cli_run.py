"""`pivotrl run`: the whole method, end to end, on the embedded defaults.

An adapter's command (it trains with adapters.grpo and adapters.sft): the entry point `run` of
the group `pivot_envs.commands` names this module.

Extract candidates, split held-out pivots by trajectory, warm the policy up with SFT on expert
turns (adapters.sft; without it SmolLM2-135M never succeeds), evaluate it, run Algorithm 1 on a
sample of the training candidates with one call of `grpo.pivotrl` (profile under the frozen
reference, Eq. 4; keep D_adv, Eq. 5; train with GRPO at the pivots), evaluate again, and write a
report. With no arguments it runs the bundled tool-use pivots with SmolLM2-135M on the CPU in
about ten minutes; options scale it up.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import random
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pivot_envs.adapters.grpo import GRPOConfig, PivotRLResult
from pivot_envs.cli.options import check_dtype, policy_field
from pivot_envs.config import add_config, at_least, between, option
from pivot_envs.errors import PivotEnvsError
from pivot_envs.evaluate import EvalConfig, change_in_words
from pivot_envs.extract import FilterConfig, SplitConfig
from pivot_envs.profile import ProfileConfig

log = logging.getLogger(__name__)


class SplitError(PivotEnvsError, ValueError):
    """The held-out split left the train or the held-out side without a pivot."""


NAME = "run"
HELP = "Run the whole method (extract, profile, filter, split, train, evaluate) and write a report."


@dataclass(frozen=True)
class Budget:
    """A domain's token budgets when the run's flags leave them unset."""

    max_new_tokens: int
    max_prompt_tokens: int


# Tool-use actions fit 48 tokens and its prompts are fitted to 1024 (see docs/main-job.md). The SWE
# domain's expert calls are 24-258 tokens (median 52; an edit carries old_str and new_str), and the
# system prompt, task and tool schemas alone are about 920 of its 900-8,200-token prompts (median
# 2,200): 128 new tokens hold four calls in five, 2048 prompt tokens the task and the latest turns.
BUDGETS = {"swe": Budget(max_new_tokens=128, max_prompt_tokens=2048)}
DEFAULT_BUDGET = Budget(max_new_tokens=48, max_prompt_tokens=1024)

# The embedded model under either local backend: it never succeeds without the warm-up.
EMBEDDED = ("hf:smollm2", "vllm:smollm2")


# The settings every stage has a copy of, and the stages that have one. In the presets below each
# copy is unset (None), and `RunConfig.composed` gives it the run's value; a copy given for the stage
# itself (`--train.seed 7`, `seed` in a --config file's [train] table) is never overwritten.
SHARED = {
    "seed": ("split", "profile", "train", "eval"),
    "max_new_tokens": ("profile", "train", "eval"),
    "policy": ("train",),
    "out": ("train",),
}


def _split_preset() -> SplitConfig:
    return SplitConfig(seed=None)


def _profile_preset() -> ProfileConfig:
    # K is profiling's own default, 8: at K=4 the warmed-up 135M model left 1 of the 16 candidates mixed
    # (seed 0), at K=8 4 of them (a candidate's first 4 samples are the same either way). Small and quick
    # on a CPU otherwise; restart: the run owns its output, profiles of another reference are set aside.
    return ProfileConfig(max_new_tokens=None, seed=None, batch_pivots=4, env_workers=2, restart=True)


def _filter_preset() -> FilterConfig:
    # 0.9 keeps the candidates solved 7 times of 8, which a 135M model after a short warm-up has few
    # enough of that dropping them often left D_adv empty; and when D_adv is empty all the same, the run
    # trains at the candidates the reference never solved (a group of G samples may find what K did not)
    # and says so in its report, instead of stopping before the evaluation.
    return FilterConfig(lambda_diff=0.9, mode="adv-or-unsolved")


def _train_preset() -> GRPOConfig:
    # 3 steps of B=2, G=8 fit the nine-minute budget; 2e-5 (not 1e-6) so that 3 steps of a 135M
    # model move it measurably; the run evaluates before and after itself (eval_every=0).
    return GRPOConfig(
        steps=3,
        batch_pivots=2,
        group_size=8,
        learning_rate=2e-5,
        checkpoint_every=0,
        eval_every=0,
        num_envs=2,
        policy=None,
        max_new_tokens=None,
        seed=None,
        out=None,
    )


def _eval_preset() -> EvalConfig:
    return EvalConfig(max_new_tokens=None, seed=None, batch_size=4, num_envs=2)


@dataclass
class RunConfig:
    """Settings of `pivotrl run`: its own, then one config per stage (`--profile.k 8`,
    `--train.beta 0.04`, a `[train]` table in a --config file). The defaults take about ten
    minutes on a quiet 2-core CPU; where a stage's preset differs from that config's own default, the
    preset below says why.

    A stage's copy of a run-wide setting (`SHARED`: seed, max_new_tokens, train's policy and out)
    is unset (None) in the presets and takes the run's value in `composed()`, which `run` calls: a
    value given for the stage (a flag, a --config table, a stage config passed in Python) wins, then
    the run's setting, then the preset. `--print-config` writes each unset copy as a comment with
    the value it takes and the run setting it follows."""

    domain: str = option("tool-use", "domain whose env scores actions (pivot/<domain>-v0)")
    input: str | None = option(
        None, "trajectories or pivots to extract from (default: the domain's bundled pivots)"
    )
    policy: str = policy_field("policy", "hf:smollm2")  # the reference and initial policy
    device: str = policy_field("device", "cpu")
    dtype: str | None = policy_field("dtype", None)
    max_prompt_tokens: int | None = policy_field(
        "max_prompt_tokens", None, means="the domain's, 2048 for swe, else 1024"
    )
    candidates: int = option(16, "candidates profiled (a seeded sample of the training side; 0: all)")
    sft_epochs: int | None = option(
        None,
        "epochs of the SFT warm-up on expert turns of the training side before profiling "
        "(default: 2 for the embedded hf:smollm2 or vllm:smollm2, which never succeeds without it; 0 for any "
        "other policy)",
    )
    sft_examples: int = option(
        32,
        "expert turns in the warm-up: the candidates to be profiled, then a seeded sample of the "
        "other training candidates (0: the whole training side)",
    )
    sft_learning_rate: float = option(5e-5, "AdamW learning rate of the warm-up")
    max_new_tokens: int | None = option(
        None,
        "longest action, in tokens, in every stage whose max_new_tokens is not given (default: the domain's, "
        "128 for swe, else 48)",
    )
    eval_pivots: int = option(8, "held-out pivots evaluated before and after training (greedy)")
    seed: int = option(
        0,
        "seed of the run's draws and of every stage whose seed is not given: sampling, splitting, training",
    )
    out: str = option(
        "runs/pivotrl",
        "output directory: pivots, profile, metrics, checkpoints, report (train.out, unless given: OUT/train)",
    )
    split: SplitConfig = field(
        default_factory=_split_preset, metadata={"help": "the held-out split by trajectory"}
    )
    profile: ProfileConfig = field(default_factory=_profile_preset, metadata={"help": "profiling (Eq. 4)"})
    filter: FilterConfig = field(
        default_factory=_filter_preset, metadata={"help": "keeping the pivots (Eq. 5)"}
    )
    train: GRPOConfig = field(
        default_factory=_train_preset, metadata={"help": "GRPO at the pivots (Algorithm 1)"}
    )
    eval: EvalConfig = field(default_factory=_eval_preset, metadata={"help": "evaluation on held-out pivots"})

    def __post_init__(self) -> None:
        at_least(self, 0, "max_prompt_tokens", "candidates", "sft_epochs", "sft_examples", "eval_pivots")
        at_least(self, 1, "max_new_tokens")
        between(self, "sft_learning_rate", 0, 1, open_low=True)
        check_dtype(self.dtype)

    def derived(self) -> dict[str, tuple[Any, str]]:
        """Each stage setting left unset, with the value the run gives it and the run setting that
        value comes from: `{"train.seed": (0, "the run's seed"), ...}`."""
        budget = self.budget()
        whose = "the run's" if self.max_new_tokens else f"the {self.domain} domain's"
        values = {
            "seed": (self.seed, "the run's seed"),
            "max_new_tokens": (budget.max_new_tokens, f"{whose} max_new_tokens"),
            "policy": (self.policy, "the run's policy"),
            "out": (str(Path(self.out) / "train"), "the run's out, /train"),
        }
        return {
            f"{stage}.{name}": values[name]
            for name, stages in SHARED.items()
            for stage in stages
            if getattr(getattr(self, stage), name) is None
        }

    def composed(self) -> RunConfig:
        """A copy whose stages hold every setting they run with: each unset one filled in from the
        run's (`derived`); the stage configs of this one are left as they are."""
        filled: dict[str, dict[str, Any]] = {}
        for path, (value, _) in self.derived().items():
            stage, name = path.split(".")
            filled.setdefault(stage, {})[name] = value
        return replace(
            self, **{stage: replace(getattr(self, stage), **values) for stage, values in filled.items()}
        )

    def budget(self) -> Budget:
        """The token budgets of the run: the flags', else the domain's (unset stays unset in the config,
        so a config file that changes the domain gets that domain's budgets)."""
        domain = BUDGETS.get(self.domain, DEFAULT_BUDGET)
        return Budget(
            max_new_tokens=self.max_new_tokens or domain.max_new_tokens,
            max_prompt_tokens=domain.max_prompt_tokens
            if self.max_prompt_tokens is None
            else self.max_prompt_tokens,
        )

    def warm_up_epochs(self) -> int:
        """The SFT warm-up's epochs: `sft_epochs`, or its default for the policy."""
        if self.sft_epochs is not None:
            return self.sft_epochs
        return 2 if self.policy in EMBEDDED else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config(parser, RunConfig, "run")


STAGES = 6


class Stage:
    """Prints a stage's name and, when it ends, how long it took."""

    def __init__(self, number: int, title: str) -> None:
        self.title = f"[{number}/{STAGES}] {title}"

    def __enter__(self) -> Stage:
        print(self.title, flush=True)
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.started
        if exc[0] is None:
            print(f"      done in {self.seconds:.0f} s", flush=True)


def indented(text: str) -> str:
    """A block of text under a stage's title."""
    return "      " + text.replace("\n", "\n      ")


@dataclass
class Signal:
    """Whether the run had anything to learn from: GRPO's advantage (Eq. 1) is zero in a group
    whose rewards are all equal, so only mixed outcomes move the policy."""

    samples: int  # profiling samples (profiled candidates x K)
    successes: int  # ... with functional reward 1
    mixed: int  # profiled candidates with var > 0 (some samples succeed, some fail)
    profiled: int
    groups: int  # GRPO groups sampled (steps x min(B, |D_pivot|))
    varied_groups: int  # ... with non-zero reward variance (the only ones trained on)

    @classmethod
    def of(cls, result: PivotRLResult, batch_pivots: int) -> Signal:
        """The figures of a run of Algorithm 1: its profiles (`result.selection`) and the trainer's per-step records."""
        profiles = [p.profile for p in result.selection.profiled if p.profile is not None]
        history = result.training.history
        return cls(
            samples=sum(len(p.rewards) for p in profiles),
            successes=sum(1 for p in profiles for r in p.rewards if r >= 1.0),
            mixed=sum(1 for p in profiles if p.n_valid > 0 and p.var > 0),
            profiled=len(profiles),
            # A step samples B pivots without replacement (Algorithm 1, line 6): fewer when D_pivot is smaller.
            groups=len(history) * min(batch_pivots, len(result.selection.pivots)),
            varied_groups=sum(int(record.get("groups_trained", 0)) for record in history),
        )

    def verdict(self) -> str:
        """One sentence: was there a learning signal, and if not, why."""
        if self.varied_groups:
            return f"learning signal: {self.varied_groups} of {self.groups} GRPO groups had mixed rewards"
        if not self.successes:
            return (
                f"no learning signal: none of the {self.samples} profiling samples scored 1, so every group "
                "had zero reward variance and GRPO made no update (a stronger reference policy is needed, "
                "or the SFT warm-up: --sft-epochs)"
            )
        return f"no learning signal: none of the {self.groups} GRPO groups had mixed rewards"

    def table(self) -> list[str]:
        """Markdown rows of the figures."""
        rate = self.successes / self.samples if self.samples else 0.0
        return [
            "| figure | value |",
            "|---|---|",
            f"| profiling samples with reward 1 | {self.successes} of {self.samples} ({100 * rate:.1f}%) |",
            f"| candidates with mixed outcomes (var > 0) | {self.mixed} of {self.profiled} |",
            f"| GRPO groups with non-zero reward variance | {self.varied_groups} of {self.groups} |",
        ]


def load_candidates(config: RunConfig) -> list[Any]:
    """D_cand: the input's pivots, or the domain's bundled ones."""
    import gymnasium as gym

    from pivot_envs.cli._checks import read_input
    from pivot_envs.registry import env_id

    if config.input:
        return read_input(config.input, domain=config.domain)
    env = gym.make(env_id(config.domain))
    try:
        return list(env.unwrapped.pivots)
    finally:
        env.close()


@dataclass
class WarmUp:
    """What the SFT warm-up did: examples, epochs, the mean loss of its first and last epoch."""

    examples: int = 0
    epochs: int = 0
    first_loss: float | None = None
    last_loss: float | None = None
    reused: bool = False
    digest: str = ""  # of the settings that made the weights: the reference policy's identity in profiles

    def summary(self) -> str:
        if not self.epochs:
            return "off"
        how = (
            "reused from an earlier run"
            if self.reused
            else f"loss {self.first_loss:.3f} -> {self.last_loss:.3f}"
        )
        return f"{self.examples} expert turns x {self.epochs} epochs, {how}"


def warm_up_settings(config: RunConfig, epochs: int, examples: list[str]) -> dict[str, Any]:
    """The settings that make the warm-up's weights (of the examples with these ids): an earlier
    run's weights are reused when its settings are equal."""
    from pivot_envs.profile import reference_of

    settings = {
        "policy": reference_of(config.policy),
        "epochs": epochs,
        "examples": sorted(examples),
        "learning_rate": config.sft_learning_rate,
        "seed": config.seed,
        "max_prompt_tokens": config.budget().max_prompt_tokens,
    }
    # Recorded only when given, so a run without --dtype keeps the digest it had before the option.
    return settings | ({"dtype": config.dtype} if config.dtype else {})


def settings_digest(settings: dict[str, Any]) -> str:
    """The warm-up's digest: the reference policy's identity in the profiles made after it."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


def warm_up_stage(
    config: RunConfig,
    policy: Any,
    model: Any,
    train_side: list[Any],
    profiled: list[Any],
    epochs: int,
    out: Path,
) -> WarmUp:
    """Fine-tune `model`, the policy's trainable module, on expert turns of the training side
    (adapters.sft): the candidates that will be profiled, then a seeded sample of the others up to
    `sft_examples`. Or load the weights an earlier run into `out` made with the same settings.
    Either way the policy then generates with the warmed-up weights (an engine gets them through
    `update_weights`)."""
    import torch

    from pivot_envs.adapters.grpo.policy import sync_weights
    from pivot_envs.adapters.sft import SFTConfig, warm_up

    if not epochs:
        return WarmUp()
    # SFT then RL on the same data, as usual: pivots where the warm-up did not make the policy
    # always right are the mixed ones profiling looks for.
    chosen = {pivot.id for pivot in profiled}
    others = [pivot for pivot in train_side if pivot.id not in chosen]
    wanted = len(train_side) if config.sft_examples <= 0 else config.sft_examples
    examples = list(profiled)[:wanted]
    examples += random.Random(f"{config.seed}/sft").sample(
        others, min(max(wanted - len(examples), 0), len(others))
    )
    settings = warm_up_settings(config, epochs, [p.id for p in examples])
    digest = settings_digest(settings)
    saved, record = out / "sft" / "weights.pt", out / "sft" / "warm_up.json"
    saved.parent.mkdir(parents=True, exist_ok=True)
    figures = json.loads(record.read_text()) if saved.exists() and record.exists() else {}
    if figures.get("settings") == settings:
        model.load_state_dict(torch.load(saved, map_location=next(model.parameters()).device))
        sync_weights(policy, model)
        print(f"      reused the warmed-up weights in {saved.parent}")
        return WarmUp(
            len(examples), epochs, figures["first_loss"], figures["last_loss"], reused=True, digest=digest
        )
    torch.manual_seed(config.seed)
    (out / "sft" / "metrics.jsonl").unlink(missing_ok=True)  # an earlier warm-up's steps, with other settings
    records = warm_up(
        policy,
        examples,
        SFTConfig(
            epochs=epochs,
            learning_rate=config.sft_learning_rate,
            seed=config.seed,
            metrics=str(out / "sft" / "metrics.jsonl"),
        ),
        model=model,
    )
    sync_weights(policy, model)
    losses = [[r["loss"] for r in records if r["epoch"] == e] for e in range(epochs)]
    first, last = (sum(losses[0]) / len(losses[0]), sum(losses[-1]) / len(losses[-1]))
    torch.save(model.state_dict(), saved)
    record.write_text(json.dumps({"settings": settings, "first_loss": first, "last_loss": last}, indent=2))
    print(
        f"      {len(examples)} expert turns, mean loss {first:.3f} (epoch 1) -> {last:.3f} (epoch {epochs})"
    )
    return WarmUp(len(examples), epochs, first, last, digest=digest)


def main(args: argparse.Namespace) -> int:
    config: RunConfig = args.run
    report = run(config)
    print(f"\nreport: {report}")
    return 0


def evaluation_env_kwargs(env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The env keyword arguments the evaluations score with: profiling's and training's (sandbox,
    backend, limits: the env they ran in) without the training verifier they may name, and its
    `verifier_config`. The evaluation's own verifier (`--eval.verifier`, by default the domain's
    functional one) grades, so a run that trains with `"verifier": "strict"` is still measured
    functionally."""
    if "verifier" not in env_kwargs:
        return dict(env_kwargs)
    return {key: value for key, value in env_kwargs.items() if key not in ("verifier", "verifier_config")}


def run(config: RunConfig) -> Path:
    """Run the method and return the path of the markdown report.

    The run's own stages (extract, split, warm-up, the evaluations, the report) surround one call
    of `grpo.pivotrl`, Algorithm 1 itself: the sampled training candidates are its D_cand, the
    warmed-up policy its pi_0. When D_adv is empty the run's filter mode ("adv-or-unsolved")
    trains at the candidates pi_0 never solved, and the report says so; with filter mode "adv"
    an empty D_adv stops the run with NoPivotsError before training. The stages run with
    `config.composed()`, every unset stage setting filled in from the run's.
    """
    from pivot_envs.adapters.grpo import PivotRLConfig, pivotrl
    from pivot_envs.adapters.grpo.policy import trainable_module
    from pivot_envs.cli._checks import (
        check_domain,
        check_env_id,
        check_output,
        load_named_policy,
        policy_options,
    )
    from pivot_envs.diagnostics import diagnose, format_report
    from pivot_envs.evaluate import evaluate
    from pivot_envs.extract import split_by_trajectory, write_pivot_file
    from pivot_envs.registry import env_id

    config = config.composed()
    # The domain, the policy's options and --out are checked before any work (the settings were, when
    # the config was made).
    check_env_id(env_id(check_domain(config.domain)))
    options = policy_options(config.device, config.budget().max_prompt_tokens, config.dtype)
    out = check_output(config.out, "--out", directory=True)
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}

    with Stage(1, "extract candidates") as stage:
        extracted = load_candidates(config)
        trajectories = {pivot.trajectory_id for pivot in extracted}
        write_pivot_file(extracted, out / "extracted.jsonl")
        print(f"      {len(extracted)} candidates from {len(trajectories)} trajectories")
    timings["extract"] = stage.seconds

    with Stage(2, "split held-out pivots by source trajectory") as stage:
        train_side, heldout = split_by_trajectory(extracted, config.split.heldout, seed=config.split.seed)
        if not heldout or not train_side:
            raise SplitError(
                f"the split left a side empty ({len(train_side)} train, {len(heldout)} held out of "
                f"{len(extracted)} candidates from {len(trajectories)} trajectories; --split.heldout {config.split.heldout})"
            )
        # Separate seeded draws, so changing one size does not change the other set.
        eval_set = random.Random(f"{config.seed}/eval").sample(heldout, min(config.eval_pivots, len(heldout)))
        write_pivot_file(heldout, out / "heldout.jsonl")
        print(
            f"      {len(train_side)} train candidates, {len(heldout)} held out ({len(eval_set)} evaluated)"
        )
    timings["split"] = stage.seconds

    policy = load_named_policy(config.policy, **options)
    # The module the warm-up and GRPO train: the hf policy's own, or an engine's checkpoint in transformers (vllm).
    model = trainable_module(policy)
    epochs = config.warm_up_epochs()

    # D_cand of Algorithm 1: a seeded sample of the training side (all of it with --candidates 0).
    draw = random.Random(f"{config.seed}/candidates")
    sample = (
        train_side
        if config.candidates <= 0
        else draw.sample(train_side, min(config.candidates, len(train_side)))
    )

    with Stage(
        3, f"SFT warm-up on expert turns ({epochs} epochs)" if epochs else "SFT warm-up: off"
    ) as stage:
        warm = warm_up_stage(config, policy, model, train_side, sample, epochs, out)
    timings["sft"] = stage.seconds

    eval_config = config.eval
    eval_kwargs = evaluation_env_kwargs(config.profile.env_kwargs)
    with Stage(4, f"evaluate before training ({len(eval_set)} held-out pivots, greedy)") as stage:
        before = evaluate(policy, eval_set, eval_config, **eval_kwargs)
        print(indented(before.format()))
    timings["eval_before"] = stage.seconds

    if (out / "train").exists():  # an earlier run's training: kept beside, never mixed with this one's
        shutil.rmtree(out / "train.previous", ignore_errors=True)
        (out / "train").replace(out / "train.previous")
    grpo, lambda_diff = config.train, config.filter.lambda_diff
    reference = f"{config.policy} after the warm-up" if epochs else config.policy
    title = (
        f"Algorithm 1 (grpo.pivotrl): profile {len(sample)} candidates under {reference} (K={config.profile.k}), "
        f"keep D_adv (lambda_diff {lambda_diff}), train with GRPO ({grpo.steps} steps, B={grpo.batch_pivots}, "
        f"G={grpo.group_size})"
    )
    with Stage(5, title) as stage:
        method = PivotRLConfig(out=config.out, profile=config.profile, filter=config.filter, train=grpo)
        # The warmed-up weights are pi_0: an earlier run's profiles are reused only when they come
        # from the same policy and warm-up settings. The trainer logs a line per step as it goes.
        result = pivotrl(
            sample,
            policy,
            method,
            env_id=env_id(config.domain),
            # the profiles' reference: a warm-up's digest holds the dtype; without one it is named here
            reference_name=(
                f"{config.policy} after SFT warm-up {warm.digest}"
                if epochs
                else config.policy + (f" in {config.dtype}" if config.dtype else "")
            ),
            model=model,
        )
        selection = result.selection
        if selection.profile_run.moved_aside:
            print(
                f"      profiles of an earlier run with other settings moved to {selection.profile_run.moved_aside}"
            )
        if selection.profile_run.skipped:
            print(
                f"      {selection.profile_run.skipped} candidates reused from an earlier run with the same settings"
            )
        diagnostics = format_report(diagnose(selection.profiled, lambda_diff=lambda_diff))
        print(indented(diagnostics))
        note = ""
        if config.filter.mode == "adv-or-unsolved" and not any(p.profile.var > 0 for p in selection.pivots):
            # D_adv's pivots are all mixed: none is, so these are the fallback's.
            note = (
                f"D_adv was empty at K={config.profile.k}; trained at the {len(selection.pivots)} candidates "
                "the reference never solved instead"
            )
            print(f"      {note}")
        print(
            f"      {len(selection.pivots)} of {len(selection.profiled)} profiled candidates kept as pivots"
        )
    timings["profile"] = selection.profile_run.seconds
    timings["train"] = result.training.seconds
    timings["filter"] = max(stage.seconds - timings["profile"] - timings["train"], 0.0)

    with Stage(6, "evaluate after training") as stage:
        after = evaluate(policy, eval_set, eval_config, **eval_kwargs)
        print(indented(after.format()))
    timings["eval_after"] = stage.seconds

    signal = Signal.of(result, grpo.batch_pivots)
    print(f"\n{signal.verdict()}")
    return write_report(
        out=out,
        config=config,
        extracted=extracted,
        trajectories=trajectories,
        train_side=train_side,
        heldout=heldout,
        result=result,
        note=note,
        diagnostics=diagnostics,
        before=before,
        after=after,
        timings=timings,
        signal=signal,
        warm=warm,
    )


def plot_rewards(metrics: Path, png: Path) -> str | None:
    """Plot the training rewards to `png` and return its file name; or, when matplotlib is not
    installed (an optional extra: the report holds every figure without it), log a warning and
    return None."""
    from pivot_envs.adapters.grpo import plot_metrics
    from pivot_envs.errors import MissingExtraError

    try:
        return plot_metrics(metrics, png).name
    except MissingExtraError as error:
        log.warning("the report has no reward plot: %s", error)
        return None


def write_report(
    *,
    out: Path,
    config: RunConfig,
    extracted: list,
    trajectories: set,
    train_side: list,
    heldout: list,
    result: PivotRLResult,
    note: str,
    diagnostics: str,
    before: Any,
    after: Any,
    timings: dict[str, float],
    signal: Signal,
    warm: WarmUp,
) -> Path:
    """The markdown report of a run, with its reward plot when matplotlib is installed (and
    report.json with the same figures)."""
    selection, training = result.selection, result.training
    png = plot_rewards(training.metrics_path, out / "rewards.png")
    budget = config.budget()
    lines = [
        "# PivotRL run",
        "",
        f"Policy `{config.policy}` on `{config.device}`{f' in {config.dtype}' if config.dtype else ''}, domain `{config.domain}`, seed {config.seed}, "
        f"actions up to {budget.max_new_tokens} tokens, prompts fitted to {budget.max_prompt_tokens or 'any number of'} tokens.",
        "",
        "| stage | result | seconds |",
        "|---|---|---|",
        f"| extract | {len(extracted)} candidates from {len(trajectories)} trajectories | {timings['extract']:.0f} |",
        f"| split | {len(train_side)} train / {len(heldout)} held-out candidates (by trajectory) | {timings['split']:.0f} |",
        f"| SFT warm-up | {warm.summary()} | {timings['sft']:.0f} |",
        f"| eval before | see below | {timings['eval_before']:.0f} |",
        f"| profile (Algorithm 1, line 3) | {len(selection.profiled)} candidates x K={config.profile.k} | {timings['profile']:.0f} |",
        f"| filter (line 4) | {len(selection.pivots)} pivots kept (lambda_diff {config.filter.lambda_diff}, "
        f"mode {config.filter.mode}) | {timings['filter']:.0f} |",
        f"| train (lines 5-14) | {training.steps} GRPO steps | {timings['train']:.0f} |",
        f"| eval after | see below | {timings['eval_after']:.0f} |",
        "",
    ]
    if note:
        lines += [f"Note: {note}.", ""]
    lines += [
        "## Learning signal",
        "",
        f"{signal.verdict()[0].upper()}{signal.verdict()[1:]}.",
        "",
        *signal.table(),
        "",
    ]
    lines += ["## Profile diagnostics", "", "```", diagnostics, "```", ""]
    lines += [
        "## Turn accuracy on held-out pivots",
        "",
        "Before training:",
        "",
        "```",
        before.format(),
        "```",
        "",
    ]
    lines += ["After training:", "", "```", after.format(), "```", ""]
    change, change_figures = change_in_words(before.overall().functional, after.overall().functional)
    lines += [change, ""]
    lines += [
        "## Training",
        "",
        "| step | reward mean | reward std | zero-variance groups | loss |",
        "|---|---|---|---|---|",
    ]
    for record in training.history:
        lines.append(
            f"| {record['step']} | {record['reward_mean']:.3f} | {record['reward_std']:.3f} "
            f"| {record['frac_zero_variance']:.2f} | {record.get('loss', float('nan')):.4f} |"
        )
    if png:
        lines += ["", f"![reward mean and std over steps]({png})", ""]
    else:
        lines += [
            "",
            "The reward plot was skipped: matplotlib is not installed (`pip install 'pivot-envs[plot]'`).",
            "",
        ]
    lines += [
        f"Outputs: `{out}` (extracted, heldout, candidates, profiled, pivots JSONL; train/ metrics and weights).",
        "",
    ]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    (out / "report.json").write_text(
        json.dumps(
            {
                "config": asdict(config),
                "budget": asdict(budget),
                "timings": timings,
                "extracted": len(extracted),
                "candidates": len(selection.candidates),
                "profiled": len(selection.profiled),
                "pivots": len(selection.pivots),
                "before": before.to_dict(),
                "after": after.to_dict(),
                "change": change_figures,
                "history": training.history,
                "signal": asdict(signal),
                "sft": asdict(warm),
            },
            indent=2,
            default=str,
        )
    )
    return path
