"""PivotRL's Algorithm 1, top to bottom: the bundled GRPO trainer at pivots.

Read it in order: the configs (`GRPOConfig`, `PivotRLConfig`); lines 1-4, selecting the pivots
(`select_pivots`: extract D_cand, profile it under the frozen reference pi_0, keep D_adv); the
math the loop uses (the group advantage, Eq. 1; the clipped objective, Eq. 7, with its
importance weight, Eq. 8, and the k3 estimate of its KL to pi_0); the update; then lines 5-14,
the loop (`train`): per step sample B pivots, sample G actions at each, score them through the
envs (r_func, Eq. 6), normalise the rewards per group, update, log, evaluate, checkpoint.
`pivotrl` runs the whole of it.

Equations are the paper's (the LaTeX source under ../shared/docs), numbered as the LaTeX numbers
them and named by their label: Eq. 1 group_adv, Eq. 2 strict_reward, Eq. 3 cand, Eq. 4
profile_stats, Eq. 5 dadv, Eq. 6 func_reward, Eq. 7 pivotrl_obj, Eq. 8 importance_weight. (Other
modules of this project still number from Eq. 3 on one lower, leaving eq:cand unnumbered.)
Algorithm 1's lines are numbered as the paper prints them (line 1: Require).

Beside it, each with one job: `groups` (a pivot's group as trained on, and packing a batch's
groups into passes), `shared_prefix` (log pi(a_i | s) with a group's prefix run once),
`reference` (LoRA and the frozen pi_0 of the KL term), `checkpoints` (checkpoints, resume and
metrics.jsonl), `plot` (the reward curve) and `policy` (`TrainablePolicy`: what the loop needs
from a policy backend). The tokens trained on are the tokens sampled:
`Completion.prompt_token_ids + token_ids`.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pivot_envs.adapters.grpo import reprofile
from pivot_envs.adapters.grpo.checkpoints import (
    MetricsLog,
    latest_checkpoint,
    load_checkpoint,
    refuse_earlier_run,
    save_checkpoint,
)
from pivot_envs.adapters.grpo.distributed import DistributedSetupError, Ranks, setup
from pivot_envs.adapters.grpo.groups import Group, build_group, pack_groups, pass_budget
from pivot_envs.adapters.grpo.policy import TrainablePolicy, sync_weights, trainable_module
from pivot_envs.adapters.grpo.reference import frozen_reference, reference_logprobs, with_lora
from pivot_envs.adapters.grpo.shared_prefix import groups_logprobs

from pivot_envs.config import option, progress_bar
from pivot_envs.errors import PivotEnvsError
from pivot_envs.evaluate import EvalConfig, evaluate
from pivot_envs.extract import ExtractConfig, FilterConfig, dedup_pivots, extract_pivots, filter_pivots
from pivot_envs.pivot import Pivot, read_pivots, write_pivots
from pivot_envs.policy import SamplingParams, load_policy
from pivot_envs.profile import ProfileConfig, ProfileRun, profile
from pivot_envs.scoring import EnvPool, resolve_env

logger = logging.getLogger(__name__)


LOSS_LEVELS = ("token", "action")
LOSS_DENOMINATORS = ("trained", "sampled")


@dataclass
class GRPOConfig:
    """Hyperparameters of the GRPO update at pivots (paper Eq. 1, 7 and Algorithm 1)."""

    policy: str = option(
        "hf:smollm2", "policy spec to train (a local backend: hf:PATH, hf:smollm2, vllm:PATH, vllm:smollm2)"
    )
    batch_pivots: int = option(
        4,
        "B: pivots sampled per step (Algorithm 1, line 6). The paper's SWE-Bench run used 64 (its appendix: "
        "64 prompts x 16 generations, a batch of 1024); 4 fits one GPU, and a CPU",
    )
    group_size: int = option(
        8,
        "G: actions sampled per pivot, the group of Eq. 1 (Algorithm 1, line 8). The paper's SWE-Bench run used "
        "16; 8 halves the sampling per pivot",
    )
    learning_rate: float = option(
        1e-6, "AdamW learning rate (the paper gives none; 1e-6 is TRL's GRPO default)"
    )
    weight_decay: float = option(0.0, "AdamW weight decay")
    epsilon_low: float = option(
        0.2, "lower clip range of the importance weight w_i: clip(w, 1 - eps_low, ...) (Eq. 7)"
    )
    epsilon_high: float = option(
        0.2, "upper clip range of w_i: clip(w, ..., 1 + eps_high) (Eq. 7; DAPO raises it)"
    )
    beta: float = option(
        0.0,
        "coefficient of the k3 KL to the frozen reference pi_0 (Eq. 7; the paper gives no value). 0, TRL's "
        "default, loads no reference; NVIDIA's own tool-use recipe also runs without KL, but Theorem 3.3 (the "
        "update keeps pi_0's ordering of the actions outside the acceptable set) assumes beta > 0",
    )
    loss_level: str = option(
        "token",
        "what Eq. 7's ratio, clip and average are taken over. 'action', the paper's: one importance weight "
        "per action, w_i = exp(sum_t (log pi_theta - log pi_old)), clipped once, with the k3 KL of the whole action, "
        "averaged over the actions. 'token' (the default, as TRL and DAPO): a weight, clip and k3 per token, averaged "
        "over the action tokens, so long actions weigh more. The default stays 'token' because no run here was long "
        "enough to show the paper's choice trains better",
    )
    loss_denominator: str = option(
        "trained",
        "what the summed loss is divided by. 'trained': the tokens (or actions, see loss_level) of the "
        "groups trained on; zero-variance groups carry no gradient and are left out, so the step is as large "
        "whatever the share of uninformative groups. 'sampled': those of every valid sample of the batch, as the "
        "paper's expectation over pivots counts a zero-variance pivot as a zero; the step shrinks with the share "
        "of informative groups",
    )
    iterations: int = option(1, "optimizer steps per sampled batch (mu); >1 makes w_i differ from 1")
    temperature: float = option(
        1.0, "sampling temperature of the G actions; logprobs are taken at the same temperature"
    )
    top_p: float = option(1.0, "nucleus sampling threshold of the G actions")
    max_new_tokens: int = option(256, "longest action sampled, in tokens")
    leave_one_out: bool = option(
        False, "baseline r_i minus the mean of the other G-1 rewards instead of the group mean (Eq. 1)"
    )
    std_epsilon: float = option(1e-4, "epsilon_std added to the group's reward std (Eq. 1)")
    scale_by_std: bool = option(
        True, "divide by the group's reward std (Eq. 1); off gives Dr. GRPO's unscaled advantage"
    )
    max_grad_norm: float = option(1.0, "clip the gradient's global norm to this (0 disables)")
    tokens_per_pass: int | None = option(
        None,
        "padded tokens per forward/backward of the update: groups are packed into one pass (their prefixes in one "
        "forward, all their actions in a second) while groups x longest prefix + actions x longest action stays "
        "within it; a larger group runs alone. More per pass: fewer, larger passes, for a GPU (small passes are "
        "launch-bound); peak activation memory grows in proportion. 0: one group per pass (least memory; the "
        "faster choice on a CPU, where packing two groups was 1.7x slower). Default: 8192 on a GPU, 0 on a CPU",
    )
    seed: int = option(0, "seed of pivot sampling, action sampling and torch")
    lora: bool = option(
        False, "train LoRA adapters (peft) instead of all weights; the reference is the base model"
    )
    lora_rank: int = option(16, "LoRA rank r")
    lora_alpha: int = option(32, "LoRA alpha")
    steps: int = option(100, "training steps K_train (Algorithm 1, line 5)")
    checkpoint_every: int = option(
        50, "save a checkpoint every N steps (and at the end); 0 saves only at the end"
    )
    eval_every: int = option(25, "turn accuracy on the held-out pivots every N steps (greedy); 0 disables")
    eval_pivots: int = option(64, "at most this many held-out pivots per evaluation")
    num_envs: int = option(4, "envs scoring actions concurrently (threads)")
    reprofile_every: int = option(
        0,
        "online re-profiling (beyond the paper, its stated future work): every N steps, profile the candidates "
        "again with the current policy and train at the new D_adv, retiring pivots it now always solves and "
        "bringing back candidates that became mixed (grpo.reprofile); 0: the offline profile throughout, as the paper",
    )
    reprofile_k: int = option(8, "samples per candidate when re-profiling (K of Eq. 4)")
    reprofile_lambda_diff: float = option(0.9, "lambda_diff of the re-profiled D_adv (Eq. 5)")
    out: str = option("runs/grpo", "output directory: metrics.jsonl, checkpoints/, final/")
    resume: bool = option(False, "continue from the latest checkpoint in --out")

    def __post_init__(self) -> None:
        from pivot_envs.config import at_least, between, one_of

        at_least(
            self,
            1,
            "batch_pivots",
            "iterations",
            "max_new_tokens",
            "steps",
            "eval_pivots",
            "num_envs",
            "lora_rank",
            "lora_alpha",
        )
        at_least(self, 2, "reprofile_k")  # one sample has no variance: no candidate could be mixed
        at_least(self, 0, "reprofile_every")
        between(self, "reprofile_lambda_diff", 0, 1, open_low=True)
        at_least(self, 2, "group_size")  # a group of one has no baseline (Eq. 1): no update, ever
        at_least(
            self,
            0,
            "weight_decay",
            "beta",
            "epsilon_high",
            "std_epsilon",
            "max_grad_norm",
            "tokens_per_pass",
            "checkpoint_every",
            "eval_every",
        )
        between(self, "learning_rate", 0, 1, open_low=True)
        between(self, "epsilon_low", 0, 1)
        between(self, "top_p", 0, 1, open_low=True)
        between(self, "temperature", 0, float("inf"), open_low=True, open_high=True)  # logprobs divide by it
        one_of(self, "loss_level", LOSS_LEVELS)
        one_of(self, "loss_denominator", LOSS_DENOMINATORS)


@dataclass
class TrainResult:
    """What `train` leaves behind: where, how far, and the metrics of every step."""

    out: Path
    steps: int
    final: Path
    metrics_path: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0  # wall time of this call, setup and final checkpoint included


@dataclass
class PivotRLConfig:
    """Algorithm 1's settings: one config per step, composed, never repeated (the Require line's G,
    lambda_diff, K and the rest live in them). The GRPO run writes to OUT/train, whatever `train.out` says."""

    out: str = option(
        "runs/pivotrl", "output directory: candidates.jsonl, profiled.jsonl, pivots.jsonl, train/"
    )
    extract: ExtractConfig = field(
        default_factory=ExtractConfig, metadata={"help": "line 2: D_cand from trajectories"}
    )
    profile: ProfileConfig = field(
        default_factory=ProfileConfig, metadata={"help": "line 3: profiling (Eq. 4)"}
    )
    filter: FilterConfig = field(
        default_factory=FilterConfig, metadata={"help": "line 4: D_pivot = D_adv (Eq. 5)"}
    )
    train: GRPOConfig = field(default_factory=GRPOConfig, metadata={"help": "lines 5-14: GRPO at the pivots"})


class NoPivotsError(PivotEnvsError, ValueError):
    """Line 4 kept no pivot: every profiled candidate was uniformly solved, uniformly failed or too easy."""


@dataclass
class Selection:
    """What lines 1-4 made: D_cand, its profiles under pi_0, and D_pivot (the pivots `train` samples from)."""

    candidates: list[Pivot]
    profiled: list[Pivot]
    pivots: list[Pivot]
    profile_run: ProfileRun


@dataclass
class PivotRLResult:
    """A whole run of Algorithm 1: the pivots selected (lines 1-4) and the GRPO run at them (lines 5-14)."""

    selection: Selection
    training: TrainResult


# -- Algorithm 1, lines 1-4: the pivots -----------------------------------------------------------


def select_pivots(
    source: Iterable[Any],
    reference: TrainablePolicy | str,
    config: PivotRLConfig,
    env_id: str | None = None,
    reference_name: str | None = None,
) -> Selection:
    """D_pivot from expert trajectories: extract D_cand, profile it under the frozen reference pi_0, keep D_adv.

    source:    expert trajectories (D_sft, `Trajectory` records: `pivot_envs.formats` reads them),
               or candidates already extracted (`Pivot` records, taken into D_cand as they are).
    reference: pi_0, a Policy or a policy spec; profiling samples K actions from it per candidate.
    env_id:    the env that scores actions (default: `config.profile.env`, else pivot/<domain>-v0).
    reference_name: pi_0's name as profiles record it, when the policy object's weights changed in
               memory (a warm-up); see `pivot_envs.profile.profile`.
    Writes candidates.jsonl, profiled.jsonl (resumable: candidates profiled with the same settings
    are not profiled again) and pivots.jsonl into `config.out`. Raises NoPivotsError when D_pivot
    is empty, with the profiles' figures.
    """
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    # line 1 (Require): D_sft, pi_0, the verifier V (the env's reward), G and lambda_diff (config)
    items = list(source)
    given = [item for item in items if isinstance(item, Pivot)]
    trajectories = [item for item in items if not isinstance(item, Pivot)]
    # line 2: extract the turns D_cand = {(s_t, a*_t)} of every trajectory (eq:cand)
    candidates = given + list(extract_pivots(trajectories, config.extract))
    if not candidates:
        raise NoPivotsError(
            f"no candidate: the {len(items)} records given hold no assistant turn with a prefix"
        )
    write_pivots(candidates, out / "candidates.jsonl", desc="writing candidates")
    # line 3: profile each s in D_cand with K samples of pi_0: mean and variance of r_func (Eq. 4)
    profiling = replace(config.profile, env=env_id or config.profile.env)
    run = profile(candidates, reference, out / "profiled.jsonl", profiling, reference=reference_name)
    wanted = {pivot.id for pivot in candidates}
    profiled = [pivot for pivot in read_pivots(out / "profiled.jsonl") if pivot.id in wanted]
    # line 4: D_pivot <- D_adv = {var > 0 and mean < lambda_diff} (Eq. 5), near-duplicates dropped when asked;
    # filter.mode "adv-or-unsolved" falls back to the candidates below lambda_diff when D_adv is empty
    lambda_diff = config.filter.lambda_diff
    pivots = filter_pivots(profiled, lambda_diff=lambda_diff, mode=config.filter.mode)
    if config.filter.dedup:
        pivots = dedup_pivots(pivots, by=config.filter.dedup_by)
    mixed = [p for p in profiled if p.profile is not None and p.profile.var > 0]
    if not pivots:
        if config.filter.mode == "adv":
            why = f"{len(mixed)} had mixed rewards (var > 0) and none of them a mean below lambda_diff={lambda_diff}"
        else:  # adv-or-unsolved: not even the fallback holds a candidate
            why = f"none had a mean below lambda_diff={lambda_diff} (D_adv and the fallback of {config.filter.mode} are empty)"
        raise NoPivotsError(
            f"no pivot to train on: of {len(profiled)} profiled candidates (K={profiling.k}), {why}; raise K or "
            "lambda_diff, or start from a stronger reference policy"
        )
    logger.info(
        "lines 3-4: %d candidates profiled (K=%d), %d with mixed rewards; D_pivot holds %d (filter mode %s, "
        "lambda_diff %g)",
        len(profiled),
        profiling.k,
        len(mixed),
        len(pivots),
        config.filter.mode,
        lambda_diff,
    )
    write_pivots(pivots, out / "pivots.jsonl")
    return Selection(candidates, profiled, pivots, run)


# -- Eq. 1 (group_adv): the group-normalised advantage of Algorithm 1, line 11 ------------------


def group_advantages(
    rewards: Sequence[float],
    valid: Sequence[bool],
    std_epsilon: float = 1e-4,
    leave_one_out: bool = False,
    scale_by_std: bool = True,
) -> list[float] | None:
    """The advantages A_i of one group (Eq. 1) over its valid samples; None when the group carries no signal.

    Invalid samples (infrastructure failures) are left out of the mean and std and get advantage 0
    (the caller masks their tokens). A group whose valid rewards are all equal, or with fewer than
    two valid samples, has zero advantage everywhere (Proposition 1): None, so it is skipped.
    """
    kept = [r for r, ok in zip(rewards, valid) if ok]
    n = len(kept)
    if n < 2:
        return None
    mean = sum(kept) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in kept) / n)
    if std == 0.0:
        return None
    out = []
    for r, ok in zip(rewards, valid):
        if not ok:
            out.append(0.0)
            continue
        baseline = (mean * n - r) / (n - 1) if leave_one_out else mean
        # Eq. 1: A_i = (r_i - mean_j r_j) / (std_j r_j + eps_std), population std over the valid samples
        out.append((r - baseline) / (std + std_epsilon) if scale_by_std else r - baseline)
    return out


# -- Eq. 7 (pivotrl_obj): the clipped objective, with Eq. 8's weight and the k3 KL: line 13's loss -------


def clipped_loss(
    logprobs: Any,
    old_logprobs: Any,
    advantages: Any,
    mask: Any,
    epsilon_low: float,
    epsilon_high: float,
    beta: float = 0.0,
    ref_logprobs: Any = None,
    level: str = "token",
) -> tuple[Any, dict[str, float]]:
    """The summed loss of Eq. 7 over the actions (rows) of a pass, and its statistics.

    logprobs, old_logprobs, ref_logprobs and mask are (actions x tokens), advantages (actions,); mask
    is 1 at action tokens and 0 at padding (at level "token" a float mask weights the tokens, which
    gives exact expectations over an enumerated action space).
    level "token": per token t of action i, w = pi_theta / pi_old (Eq. 8), loss = -min(w A_i,
    clip(w, 1 - eps_low, 1 + eps_high) A_i) + beta * k3, summed over the masked tokens. level
    "action" (the paper's): the same with one w_i = pi_theta(a_i | s) / pi_old(a_i | s) per action
    (the product of its token ratios) and k3 of the action's summed logprobs, summed over actions.
    k3 = exp(ref - logp) - (ref - logp) - 1 is an unbiased, non-negative estimate of
    KL(pi_theta || pi_0). The caller divides by the units counted (tokens or actions). Stats are
    sums over those units: clipped ones, KL.
    """
    import torch

    if level == "action":
        # log pi(a_i | s) = sum_t log pi(a_i,t | s, a_i,<t): exact, whatever the padding of the pass
        logprobs, old_logprobs = (logprobs * mask).sum(1), (old_logprobs * mask).sum(1)
        ref_logprobs = (ref_logprobs * mask).sum(1) if ref_logprobs is not None else None
        mask, advantage = torch.ones_like(logprobs, dtype=torch.bool), advantages
    else:
        advantage = advantages.unsqueeze(1)
    # Eq. 8 (importance_weight): w_i = pi_theta(a_i | s) / pi_theta_old(a_i | s), per token or per action
    ratio = torch.exp(logprobs - old_logprobs)
    # Eq. 7: min(w_i A_i, clip(w_i, 1 - eps_low, 1 + eps_high) A_i), negated to minimise
    unclipped = ratio * advantage
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high) * advantage
    per_unit = -torch.min(unclipped, clipped)
    stats = {"clipped": float(((clipped < unclipped) * mask).sum())}
    if beta > 0.0:
        # Eq. 7's D_KL = beta KL(pi_theta || pi_0), estimated by k3 (Schulman)
        delta = ref_logprobs - logprobs
        kl = torch.exp(delta) - delta - 1.0
        per_unit = per_unit + beta * kl
        stats["kl"] = float((kl.detach() * mask).sum())
    return (per_unit * mask).sum(), stats


def loss_units(groups: Sequence[Group], level: str) -> int:
    """What Eq. 7's average runs over in `groups`: their action tokens (level "token") or their actions ("action")."""
    if level == "action":
        return sum(len(g.actions) for g in groups)
    return sum(len(a) for g in groups for a in g.actions)


# -- Algorithm 1, line 13: update theta with Eq. 7 over the batch ---------------------------------------------


def update(
    model: Any,
    reference: Any,
    optimizer: Any,
    groups: Sequence[Group],
    config: GRPOConfig,
    denominator: int | None = None,
    ranks: Ranks | None = None,
) -> dict[str, float]:
    """`config.iterations` AdamW steps on the batch's groups; returns the loss and its statistics.

    The loss is summed over the action tokens (or the actions, `config.loss_level`) of the groups
    and divided by `denominator`: by default their number (`loss_units`); `train` passes a larger
    one under `loss_denominator="sampled"`. The groups are packed into passes of at most
    `pass_budget` padded tokens (`pack_groups`): per pass, one forward over the prefixes, one over
    the actions, one backward, so only one pass's activations are alive at a time.
    Statistics (clip_fraction, kl) are means over the units trained, entropy over the tokens.
    Under torchrun (`ranks`, grpo.distributed) `groups` are this rank's share: units, `denominator`
    and statistics count every rank's, and the gradients are summed over the ranks before clipping.
    """
    import torch

    ranks = ranks or Ranks()
    params = [p for p in model.parameters() if p.requires_grad]
    tokens, units = ranks.total(loss_units(groups, "token"), loss_units(groups, config.loss_level))
    denominator = denominator or units
    passes = pack_groups(groups, pass_budget(config, model))
    old_logprobs, ref_logprobs = [], []  # per pass, fixed by the first iteration
    totals = {"loss": 0.0, "clip_fraction": 0.0, "kl": 0.0, "entropy": 0.0, "grad_norm": 0.0}
    for iteration in range(config.iterations):
        optimizer.zero_grad(set_to_none=True)
        for index, chunk in enumerate(passes):
            logprobs, mask, entropy = groups_logprobs(
                model, [(g.prefix, g.actions) for g in chunk], config.temperature, entropy=iteration == 0
            )
            if iteration == 0:
                # pi_theta_old is the policy that sampled: the weights before this batch's first step.
                old_logprobs.append(logprobs.detach())
                ref_logprobs.append(
                    reference_logprobs(model, reference, chunk, config) if config.beta > 0.0 else None
                )
                totals["entropy"] += float((entropy * mask).sum()) / tokens
            advantages = torch.tensor(
                [a for g in chunk for a in g.advantages], dtype=logprobs.dtype, device=logprobs.device
            )
            loss, stats = clipped_loss(
                logprobs,
                old_logprobs[index],
                advantages,
                mask,
                config.epsilon_low,
                config.epsilon_high,
                config.beta,
                ref_logprobs[index],
                config.loss_level,
            )
            (loss / denominator).backward()
            totals["loss"] += float(loss.detach()) / denominator / config.iterations
            totals["clip_fraction"] += stats["clipped"] / units / config.iterations
            totals["kl"] += stats.get("kl", 0.0) / units / config.iterations
        ranks.all_reduce_gradients(params)
        limit = config.max_grad_norm if config.max_grad_norm > 0 else float("inf")
        totals["grad_norm"] += float(torch.nn.utils.clip_grad_norm_(params, limit)) / config.iterations
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    summed = ("loss", "clip_fraction", "kl", "entropy")  # grad_norm is the same on every rank
    totals.update(zip(summed, ranks.total(*(totals[key] for key in summed))))
    return totals


# -- Algorithm 1, lines 5-14: the loop ----------------------------------------------------------------


def prepare_run(
    config: GRPOConfig, policy: TrainablePolicy | None, model: Any = None, ranks: Ranks | None = None
) -> tuple[Any, Any, Any, Any, Any, int]:
    """A GRPO run's set-up into `config.out`, shared by `train` and the E2E trainer (grpo.episodes):
    refuse an earlier run there (unless resuming), seed, load the policy when None, make its trainable
    module (LoRA optional) and the frozen reference, AdamW, the pivot sampler, and resume from the
    latest checkpoint. Returns (policy, model, reference, optimizer, sampler, first step - 1).
    Under torchrun (`ranks`) every rank starts from rank 0's weights."""
    import numpy as np
    import torch

    ranks = ranks or Ranks()
    out = Path(config.out)
    checkpoint = latest_checkpoint(out) if config.resume else None
    if checkpoint is None:  # a fresh run (a resume with no checkpoint starts afresh)
        refuse_earlier_run(out, resuming=config.resume)
    ranks.barrier()  # every rank has looked at --out before rank 0 writes there
    out.mkdir(parents=True, exist_ok=True)
    random.seed(config.seed)
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)

    if policy is None:
        policy = load_policy(config.policy)
    model = trainable_module(policy, model)
    if config.lora:
        model = with_lora(model, config)
    model.eval()  # dropout off: the update scores actions under the same distribution that sampled them
    reference = frozen_reference(model, config)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=config.learning_rate,
        weight_decay=config.weight_decay,
    )
    sampler = np.random.default_rng(config.seed)
    start = 0
    if checkpoint is not None:
        start = load_checkpoint(checkpoint, model, optimizer, sampler, config)
    ranks.broadcast_parameters(model)  # under torchrun every rank starts from rank 0's weights
    if checkpoint is not None or ranks.world_size > 1:
        sync_weights(policy, model)
    return policy, model, reference, optimizer, sampler, start


def train(
    config: GRPOConfig,
    pivots: Sequence[Pivot],
    policy: TrainablePolicy | None = None,
    env_id: str | Callable[[], Any] | None = None,
    heldout: Sequence[Pivot] | None = None,
    model: Any = None,
    candidates: Sequence[Pivot] | None = None,
    **env_kwargs: Any,
) -> TrainResult:
    """Algorithm 1, lines 5-14: train `policy` with GRPO at `pivots` (D_pivot); returns where the run's outputs are.

    policy:  a TrainablePolicy with a trainable `.model` (hf); loaded from `config.policy` when
             None. A backend that generates with other weights (vllm) gets them through
             `update_weights`; then pass the trainable `model`.
    env_id:  the env scoring actions (an id, or a factory of envs holding the pivots); by default
             `pivot/<domain>-v0` of the pivots' domain, built with `env_kwargs`.
    heldout: pivots for the turn accuracy logged every `config.eval_every` steps, graded by the
             domain's functional verifier whatever `env_kwargs["verifier"]` trains with.
    candidates: the pool `config.reprofile_every` re-profiles (D_cand; default: `pivots`, which can then
             only be retired).
    Under torchrun every rank calls it alike and trains its share of each step's pivots; rank 0
    alone evaluates and writes (grpo.distributed).
    """
    import numpy as np

    began_run = time.perf_counter()
    pivots, heldout = list(pivots), list(heldout or [])
    if not pivots:
        raise ValueError("no pivots to train on")
    if config.group_size < 2:
        raise ValueError(
            f"group_size must be >= 2 (Eq. 1 normalises within a group), got {config.group_size}"
        )
    ranks = setup()
    if config.reprofile_every and ranks.world_size > 1:
        raise DistributedSetupError(
            "reprofile_every: online re-profiling runs in one process only (every rank "
            "would have to agree on the re-profiled pivots); set it to 0 under torchrun"
        )
    if min(config.batch_pivots, len(pivots)) < ranks.world_size:
        raise DistributedSetupError(
            f"{min(config.batch_pivots, len(pivots))} pivots per step for {ranks.world_size} "
            "ranks: every rank needs one at least (raise --batch-pivots or start fewer ranks)"
        )
    out = Path(config.out)
    policy, model, reference, optimizer, sampler, start = prepare_run(config, policy, model, ranks)
    log = MetricsLog(out, start) if ranks.main else None
    if ranks.main:
        (out / "config.json").write_text(json.dumps(asdict(config), indent=2))
    # the pool online re-profiling draws from (the envs hold it only when re-profiling is on)
    reprofiling = config.reprofile_every > 0
    pool_of_candidates = list(candidates) if reprofiling and candidates is not None else list(pivots)
    held = list({p.id: p for p in [*pivots, *pool_of_candidates, *heldout]}.values())
    make_env = resolve_env(env_id, held, **env_kwargs)
    # Held-out accuracy is always graded by the domain's functional verifier, even when training uses another
    # (a strict ablation): an env id is built without `verifier`; a factory of envs is used as given.
    make_eval_env = resolve_env(env_id, held, **{k: v for k, v in env_kwargs.items() if k != "verifier"})
    if reprofiling and start:
        pivots = reprofile.restore(
            out, start, pool_of_candidates, pivots
        )  # the pivots in play at the checkpoint
    pool = EnvPool(make_env, config.num_envs)
    tokenizer = getattr(policy, "tokenizer", None)
    history: list[dict[str, Any]] = []
    bar = progress_bar(total=config.steps, initial=start, unit="step", desc="GRPO", enabled=ranks.main)

    try:
        # line 5: for k = 1, ..., K_train (line 14 ends it)
        for step in range(start + 1, config.steps + 1):
            began = time.perf_counter()
            changed = None
            if reprofile.due(
                step, config.reprofile_every
            ):  # beyond the paper: D_adv under the current policy
                changed = reprofile.reprofile(policy, pool, pool_of_candidates, pivots, step, config)
                pivots = changed.pivots
                reprofile.append(out, changed)
            # line 6: sample a minibatch of B pivots from D_pivot
            chosen = sampler.choice(len(pivots), size=min(config.batch_pivots, len(pivots)), replace=False)
            share = ranks.share(len(chosen))  # under torchrun this rank's B/N of them; all B in one process
            batch = [pivots[int(chosen[i])] for i in share]

            # line 7: for each s_b (lines 8-11 run batched over the B pivots)
            # line 8: G actions at each pivot from pi_theta_old, seeded per step and pivot: a resumed run samples
            # the same, and so does a rank given the pivot
            seeds = [int(np.random.SeedSequence([config.seed, step, i]).generate_state(1)[0]) for i in share]
            sampling = SamplingParams(config.temperature, config.top_p, config.max_new_tokens, seeds=seeds)
            completions = policy.generate([pivot.observation for pivot in batch], config.group_size, sampling)
            generated = time.perf_counter()

            # lines 9-10: execute the short rollout and score each action with the verifier (r_func, Eq. 6)
            scores = pool.score(
                [(pivot.id, c.action) for pivot, group in zip(batch, completions) for c in group]
            )
            scored = time.perf_counter()

            # line 11: group-normalised advantages (Eq. 1); invalid samples masked, zero-variance groups skipped
            groups, uninformative, zero_variance = [], [], 0
            for index, (pivot, group) in enumerate(zip(batch, completions)):
                mine = scores[index * config.group_size : (index + 1) * config.group_size]
                valid = [s.valid for s in mine]
                advantages = group_advantages(
                    [s.reward for s in mine],
                    valid,
                    config.std_epsilon,
                    config.leave_one_out,
                    config.scale_by_std,
                )
                if advantages is None:
                    zero_variance += 1
                    if (
                        config.loss_denominator == "sampled"
                    ):  # counted in the average as zeros (the paper's E_s)
                        uninformative.append(build_group(pivot.id, group, [0.0] * len(group), valid))
                    continue
                built = build_group(pivot.id, group, advantages, valid)
                if built.actions:
                    groups.append(built)

            # line 12 ends the per-pivot loop; line 13: update theta with Eq. 7, then hand the weights to the generator
            # (under torchrun: counted over every rank, and every rank updates when any has a group)
            trained, denominator, zero_variance, sampled_tokens = ranks.total(
                len(groups),
                loss_units(groups + uninformative, config.loss_level),
                zero_variance,
                sum(len(c.token_ids) for group in completions for c in group),
            )
            stats = update(model, reference, optimizer, groups, config, denominator, ranks) if trained else {}
            if trained:
                sync_weights(policy, model)
            updated = time.perf_counter()

            scores = ranks.gather(scores)  # every rank's, in the batch's order
            valid_scores = [s for s in scores if s.valid]
            rewards = [s.reward for s in valid_scores]
            record: dict[str, Any] = {
                "step": step,
                "reward_mean": float(np.mean(rewards)) if rewards else 0.0,
                "reward_std": float(np.std(rewards)) if rewards else 0.0,
                "strict_reward_mean": float(np.mean([s.strict_reward for s in valid_scores]))
                if valid_scores
                else 0.0,
                "frac_zero_variance": zero_variance / len(chosen),
                "frac_invalid": 1.0 - len(valid_scores) / len(scores),
                "groups_trained": trained,
                "action_tokens": sampled_tokens,
                "tokens_per_s": sampled_tokens / (updated - began),
                "time_generate_s": generated - began,
                "time_score_s": scored - generated,
                "time_update_s": updated - scored,
                **{
                    key: stats.get(key, 0.0)
                    for key in ("loss", "kl", "clip_fraction", "entropy", "grad_norm")
                },
            }
            if config.reprofile_every:
                record["pivots_in_play"] = len(pivots)
                if changed is not None:
                    record.update(
                        retired=len(changed.retired),
                        revived=len(changed.revived),
                        reprofile_mixed=changed.mixed,
                        reprofile_samples=changed.samples,
                    )
            history.append(record)
            bar.update()
            if not ranks.main:  # rank 0 alone evaluates, logs and saves
                continue
            if heldout and config.eval_every and step % config.eval_every == 0:
                report = evaluate(
                    policy,
                    heldout[: config.eval_pivots],
                    EvalConfig(max_new_tokens=config.max_new_tokens, num_envs=config.num_envs),
                    env=make_eval_env,
                )
                greedy = [row for row in report.rows if row.mode == "greedy"][-1]
                record["eval_turn_accuracy"] = greedy.functional.mean
                record["eval_strict_accuracy"] = greedy.strict.mean
            log.write(record)
            logger.info(
                "step %d/%d: reward mean %.3f std %.3f, zero-variance groups %.2f, invalid %.2f, loss %.4f, "
                "KL %.4f, %.0f tokens/s%s",
                step,
                config.steps,
                record["reward_mean"],
                record["reward_std"],
                record["frac_zero_variance"],
                record["frac_invalid"],
                record["loss"],
                record["kl"],
                record["tokens_per_s"],
                f", held-out turn accuracy {record['eval_turn_accuracy']:.3f}"
                if "eval_turn_accuracy" in record
                else "",
            )
            if config.checkpoint_every and step % config.checkpoint_every == 0:
                save_checkpoint(
                    out / "checkpoints" / f"step-{step}", model, tokenizer, optimizer, sampler, step, config
                )
    finally:
        bar.close()
        pool.close()
        if log is not None:
            log.close()

    final = out / "final"
    if ranks.main:
        save_checkpoint(final, model, tokenizer, optimizer, sampler, max(start, config.steps), config)
    ranks.barrier()  # the run's outputs are complete when any rank returns
    return TrainResult(
        out=out,
        steps=config.steps,
        final=final,
        metrics_path=out / "metrics.jsonl",
        history=history,
        seconds=time.perf_counter() - began_run,
    )


# -- Algorithm 1, lines 1-14 ----------------------------------------------------------------------


def pivotrl(
    source: Iterable[Any],
    policy: TrainablePolicy | str,
    config: PivotRLConfig | None = None,
    env_id: str | None = None,
    heldout: Sequence[Pivot] | None = None,
    reference_name: str | None = None,
) -> PivotRLResult:
    """PivotRL end to end, in the paper's order: select the pivots under pi_0 (lines 1-4), then train at them (5-14).

    source:  expert trajectories, or candidates already extracted (see `select_pivots`).
    policy:  pi_0 and the initial pi_theta (a TrainablePolicy or a spec such as hf:smollm2): it is
             profiled before any update, so the profiles are the frozen reference's.
    env_id:  the env that scores actions in profiling and training alike (default:
             `config.profile.env`, else pivot/<domain>-v0), built with `config.profile.env_kwargs`.
    heldout: pivots for the turn accuracy logged every `config.train.eval_every` steps.
    reference_name: pi_0's name in the profiles when `policy` was changed in memory (a warm-up).
    Writes candidates.jsonl, profiled.jsonl and pivots.jsonl into `config.out`, the GRPO run into
    `config.out`/train. When line 4 keeps no pivot it raises NoPivotsError before any training,
    unless `config.filter.mode` is "adv-or-unsolved", which then trains at the candidates pi_0
    never solved (see `pivot_envs.extract.filter_pivots`).
    """
    config = config or PivotRLConfig()
    if isinstance(policy, str):
        policy = load_policy(policy)
    selection = select_pivots(source, policy, config, env_id, reference_name)
    training = train(
        replace(config.train, out=str(Path(config.out) / "train")),
        selection.pivots,
        policy=policy,
        env_id=env_id or config.profile.env,
        heldout=heldout,
        candidates=selection.candidates,
        **config.profile.env_kwargs,
    )
    return PivotRLResult(selection, training)
