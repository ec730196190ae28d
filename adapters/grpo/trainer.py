"""PivotRL's Algorithm 1, top to bottom: the bundled GRPO trainer at pivots (`pivotrl` runs all of it).

In order: lines 1-4 (`select_pivots`); the math of the loop (Eq. 1 group advantage; Eq. 7 clipped
objective with Eq. 8's importance weight and the k3 KL to pi_0; the update); lines 11-13 (`learn`,
E2E RL's too); lines 5-14 (`train`). Equations are numbered and named as in the paper's LaTeX
source (other modules still number from Eq. 3 on one lower); Algorithm 1's lines as it prints them.
Beside it: `config` (the settings), `run` (set-up, and `RunLog`: metrics, evaluation, checkpoints) and
`rollouts` (beyond the paper: lines 6-10 sampled ahead while line 13 updates, `max_staleness`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from pivot_envs.adapters.grpo import fsdp, reprofile, rollouts
from pivot_envs.adapters.grpo.config import GRPOConfig, PivotRLConfig
from pivot_envs.adapters.grpo.distributed import Ranks, check_split, setup
from pivot_envs.adapters.grpo.groups import Group, build_group, loss_units, pack_groups, pass_budget
from pivot_envs.adapters.grpo.policy import TrainablePolicy, sync_weights
from pivot_envs.adapters.grpo.reference import reference_logprobs
from pivot_envs.adapters.grpo.results import NoPivotsError, PivotRLResult, Selection, TrainResult
from pivot_envs.adapters.grpo.rollouts import Rollout
from pivot_envs.adapters.grpo.run import Run, RunLog, prepare_run, turn_accuracy
from pivot_envs.adapters.grpo.shared_prefix import groups_logprobs
from pivot_envs.config import at_least
from pivot_envs.extract import dedup_pivots, extract_pivots, filter_pivots
from pivot_envs.pivot import Pivot, read_pivots, write_pivots
from pivot_envs.policy import SamplingParams, load_policy
from pivot_envs.profile import profile
from pivot_envs.scoring import EnvPool, resolve_env

logger = logging.getLogger(__name__)

STATS = ("loss", "kl", "clip_fraction", "entropy", "grad_norm")  # the update's figures in a step's record


# -- Algorithm 1, lines 1-4: the pivots -----------------------------------------------------------


def select_pivots(
    source: Iterable[Any],
    reference: TrainablePolicy | str,
    config: PivotRLConfig,
    env_id: str | None = None,
    reference_name: str | None = None,
) -> Selection:
    """D_pivot from expert trajectories (`Trajectory`s; `Pivot`s are taken into D_cand as they are): extract
    D_cand, profile it under the frozen reference pi_0 (a Policy or a spec, named `reference_name` in the
    profiles when a warm-up changed its weights; scored by `env_id`, default `config.profile.env`), keep
    D_adv. Writes candidates.jsonl, profiled.jsonl (resumable) and pivots.jsonl into `config.out`; raises
    NoPivotsError, with the profiles' figures, when D_pivot is empty."""
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
        raise NoPivotsError.of(len(profiled), profiling.k, len(mixed), config.filter)
    figures = (len(profiled), profiling.k, len(mixed), len(pivots), config.filter.mode, lambda_diff)
    logger.info(
        "lines 3-4: %d candidates profiled (K=%d), %d with mixed rewards; D_pivot holds %d (filter mode %s, "
        "lambda_diff %g)",
        *figures,
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
    """The advantages A_i of one group (Eq. 1) over its valid samples; None when the group carries no signal
    (its valid rewards all equal, or fewer than two valid: zero advantage everywhere, Proposition 1).
    Invalid samples (infrastructure failures) are left out of the mean and std and get advantage 0."""
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
    """The loss of Eq. 7 summed over the actions (rows) of a pass, and its sums of clipped units and KL; the
    caller divides by the units (tokens or actions). logprobs, old_logprobs, ref_logprobs and mask (1 at
    action tokens, 0 at padding; a float mask may weight tokens) are (actions x tokens), advantages
    (actions,). level "token": a w (Eq. 8), clip and k3 per token; "action" (the paper's): one per action,
    w_i = pi_theta(a_i | s) / pi_old(a_i | s). k3 = exp(ref - logp) - (ref - logp) - 1 estimates the KL."""
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
    """`config.iterations` AdamW steps on the groups; returns the loss and its statistics (clip_fraction
    and kl per unit, entropy per token). The loss is summed over the units (`config.loss_level`) and
    divided by `denominator` (default: their number). Groups run in passes of `pass_budget` padded tokens:
    per pass one forward over the prefixes, one over the actions, one backward. Under torchrun (`ranks`)
    units and statistics count every rank's, and the gradients are summed over the ranks before clipping."""
    import torch

    ranks = ranks or Ranks()
    # Eq. 7's clip range and KL coefficient, and what its ratio and average are taken over
    low, high, beta, level = config.epsilon_low, config.epsilon_high, config.beta, config.loss_level
    params = [p for p in model.parameters() if p.requires_grad]
    tokens, units = ranks.total(loss_units(groups, "token"), loss_units(groups, level))
    denominator = denominator or units
    passes = pack_groups(groups, pass_budget(config, model))
    sharded = fsdp.sharded(model)
    # sharded (grpo.fsdp): every rank runs the same forwards, padded with zero-weight passes
    schedule = fsdp.aligned(passes, ranks) if sharded else [(chunk, False) for chunk in passes]
    fixed = []  # per pass, by the first iteration: log pi_theta_old and log pi_0 of its actions
    totals = {"loss": 0.0, "clip_fraction": 0.0, "kl": 0.0, "entropy": 0.0, "grad_norm": 0.0}
    for iteration in range(config.iterations):
        optimizer.zero_grad(set_to_none=True)
        for index, (chunk, padding) in enumerate(schedule):
            logprobs, mask, entropy = groups_logprobs(
                model, [(g.prefix, g.actions) for g in chunk], config.temperature, entropy=iteration == 0
            )
            if iteration == 0:
                reference_pass = reference_logprobs(model, reference, chunk, config) if beta > 0.0 else None
                # pi_theta_old is the policy that sampled: the weights before this batch's first step, or,
                # sampled ahead (grpo.rollouts), the behaviour logprobs recorded with the samples
                behaviour = rollouts.behaviour_tensor(chunk, logprobs.detach())
                fixed.append((logprobs.detach() if behaviour is None else behaviour, reference_pass))
                if not padding:
                    totals["entropy"] += float((entropy * mask).sum()) / tokens
            advantages = torch.tensor(
                [a for g in chunk for a in g.advantages], dtype=logprobs.dtype, device=logprobs.device
            )
            old, ref = fixed[index]
            loss, stats = clipped_loss(logprobs, old, advantages, mask, low, high, beta, ref, level)
            if padding:  # its backward only runs FSDP's collectives: its gradients are zeros
                (loss * 0.0).backward()
                continue
            (loss / denominator).backward()
            totals["loss"] += float(loss.detach()) / denominator / config.iterations
            totals["clip_fraction"] += stats["clipped"] / units / config.iterations
            totals["kl"] += stats.get("kl", 0.0) / units / config.iterations
        if not sharded:  # sharded, the backward has reduce-scattered the gradients already
            ranks.all_reduce_gradients(params)
        limit = config.max_grad_norm if config.max_grad_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, limit)
        norm = norm.full_tensor() if sharded else norm  # a sharded norm is a DTensor over the ranks
        totals["grad_norm"] += float(norm) / config.iterations
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    summed = ("loss", "clip_fraction", "kl", "entropy")  # grad_norm is the same on every rank
    totals.update(zip(summed, ranks.total(*(totals[key] for key in summed))))
    return totals


# -- Algorithm 1, lines 11-13: from a step's rewards to the new weights ------------------------------------


def learn(
    run: Run,
    outcomes: Sequence[tuple[str, Sequence[Any], Sequence[float], Sequence[bool]]],
    groups_of: Callable[[str, Sequence[Any], list[float], Sequence[bool]], list[Group]],
    publish: Callable[[], None] | None = None,
) -> tuple[list[Group], int, int, dict[str, float]]:
    """Lines 11-13 of a step, the pivot trainer's and E2E RL's: Eq. 1 over each group (`outcomes`: its id,
    samples, rewards, validity), Eq. 7's update on the groups `groups_of(id, samples, advantages, valid)`
    makes (a pivot's group; an episode's turns), the weights to the generator (`publish`, default
    `sync_weights`; sampling ahead, the trainer publishes every version itself). Returns this rank's groups
    trained, over every rank the groups trained and without signal, and the update's figures (`STATS`)."""
    config = run.config
    groups, uninformative, zero_variance = [], [], 0
    for key, samples, rewards, valid in outcomes:
        # line 11: group-normalised advantages (Eq. 1); invalid samples masked, zero-variance groups skipped
        advantages = group_advantages(
            rewards, valid, config.std_epsilon, config.leave_one_out, config.scale_by_std
        )
        if advantages is None:
            zero_variance += 1
            if config.loss_denominator == "sampled":  # counted in the average as zeros (the paper's E_s)
                uninformative += groups_of(key, samples, [0.0] * len(samples), valid)
            continue
        groups += [group for group in groups_of(key, samples, advantages, valid) if group.actions]
    # line 12 ends the per-pivot loop; line 13: update theta with Eq. 7, then hand the weights to the generator
    # (under torchrun: counted over every rank, and every rank updates when any has a group)
    units = loss_units(groups + uninformative, config.loss_level)
    trained, denominator, zero_variance = run.ranks.total(len(groups), units, zero_variance)
    stats = {}
    if trained:
        stats = update(run.model, run.reference, run.optimizer, groups, config, denominator, run.ranks)
        (publish or (lambda: sync_weights(run.policy, run.model)))()
    return groups, trained, zero_variance, {key: stats.get(key, 0.0) for key in STATS}


# -- Algorithm 1, lines 6-10: a step's batch, sampled and scored ------------------------------------------


def sample(
    run: Run,
    pivots: Sequence[Pivot],
    step: int,
    pool: EnvPool,
    sampler: Any,
    generate: Callable[[list[Any], int, SamplingParams], tuple[list[list[Any]], Any]],
) -> Rollout:
    """Lines 6-10 of step `step`: B pivots drawn with `sampler`, G actions at each from `generate` (returning
    the completions and what `Rollout` records of the version that sampled: (version, behaviour logprobs) or
    None), executed and scored by the envs of `pool`."""
    import numpy as np

    config, ranks = run.config, run.ranks
    # line 6: sample a minibatch of B pivots from D_pivot
    chosen = sampler.choice(len(pivots), size=min(config.batch_pivots, len(pivots)), replace=False)
    drawn = sampler.bit_generator.state  # the position a checkpoint after this step records
    share = ranks.share(len(chosen))  # under torchrun this rank's B/N of them; all B in one process
    batch = [pivots[int(chosen[i])] for i in share]

    # line 7: for each s_b (lines 8-11 run batched over the B pivots)
    # line 8: G actions at each pivot from pi_theta_old, seeded per step and pivot: a resumed run samples
    # the same, and so does a rank given the pivot
    seeds = [int(np.random.SeedSequence([config.seed, step, i]).generate_state(1)[0]) for i in share]
    sampling = SamplingParams(config.temperature, config.top_p, config.max_new_tokens, seeds=seeds)
    began = time.perf_counter()
    completions, sampled_by = generate([pivot.observation for pivot in batch], config.group_size, sampling)
    generated = time.perf_counter()

    # lines 9-10: execute the short rollout and score each action with the verifier (r_func, Eq. 6)
    scores = pool.score([(pivot.id, c.action) for pivot, group in zip(batch, completions) for c in group])
    indices = [int(i) for i in chosen]
    rollout = Rollout(
        step, indices, batch, completions, scores, drawn, generated - began, time.perf_counter() - generated
    )
    if sampled_by is not None:
        rollout.version, rollout.behaviour = sampled_by
    return rollout


def synchronous(run: Run) -> Callable[[list[Any], int, SamplingParams], tuple[list[list[Any]], None]]:
    """Algorithm 1's generation: the policy as it is now (pi_theta_old is the weights before this step)."""

    def generate(chats: list[Any], n: int, sampling: SamplingParams) -> tuple[list[list[Any]], None]:
        with fsdp.gathered(run.model):  # sharded (grpo.fsdp): whole weights while sampling
            return run.policy.generate(chats, n, sampling), None

    return generate


def outcomes_of(rollout: Rollout, group_size: int) -> list[tuple[Any, list[Any], list[float], list[bool]]]:
    """Per pivot of the batch: its key (the pivot's id), samples, rewards and validity, as `learn` takes them."""
    outcomes = []
    for index, (pivot, group) in enumerate(zip(rollout.batch, rollout.completions)):
        mine = rollout.scores[index * group_size : (index + 1) * group_size]
        outcomes.append((pivot.id, group, [s.reward for s in mine], [s.valid for s in mine]))
    return outcomes


def step_record(
    run: Run,
    rollout: Rollout,
    began: float,
    learning: float,
    trained: int,
    zero_variance: int,
    stats: dict[str, float],
) -> dict[str, Any]:
    """A step's record in metrics.jsonl: the rewards of its batch, its groups and the update's figures
    (`began`: when the step began; `learning`: when its lines 11-13 began)."""
    import numpy as np

    updated = time.perf_counter()
    ranks = run.ranks
    (sampled,) = ranks.total(sum(len(c.token_ids) for group in rollout.completions for c in group))
    scores = ranks.gather(rollout.scores)  # every rank's, in the batch's order
    kept = [s for s in scores if s.valid]
    rewards, strict = [s.reward for s in kept], [s.strict_reward for s in kept]
    return {
        "step": rollout.step,
        "reward_mean": float(np.mean(rewards)) if rewards else 0.0,
        "reward_std": float(np.std(rewards)) if rewards else 0.0,
        "strict_reward_mean": float(np.mean(strict)) if strict else 0.0,
        "frac_zero_variance": zero_variance / len(rollout.chosen),
        "frac_invalid": 1.0 - len(kept) / len(scores),
        "groups_trained": trained,
        "action_tokens": sampled,
        "tokens_per_s": sampled / (updated - began),
        "time_generate_s": rollout.generate_s,
        "time_score_s": rollout.score_s,
        "time_update_s": updated - learning,
        **stats,
    }


# -- Algorithm 1, lines 5-14: the loop ----------------------------------------------------------------


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

    policy: a TrainablePolicy with a trainable `.model` (hf), or one taking the trained weights through
    `update_weights` (vllm) with the trainable `model`; loaded from `config.policy` when None. env_id:
    an env id or a factory of envs (default: pivot/<domain>-v0 of the pivots, built with `env_kwargs`).
    heldout: pivots for the turn accuracy every `config.eval_every` steps, graded by the domain's
    functional verifier whatever `env_kwargs["verifier"]` trains with. candidates: the pool
    `config.reprofile_every` re-profiles (default: `pivots`). Under torchrun every rank calls it alike.
    """

    pivots, heldout = list(pivots), list(heldout or [])
    if not pivots:
        raise NoPivotsError("no pivots to train on: the pivot set given to train() is empty")
    at_least(config, 2, "group_size")  # Eq. 1 normalises within a group (the config checks it too when built)
    ranks = setup()
    check_split(ranks, min(config.batch_pivots, len(pivots)), config.reprofile_every > 0)
    run = prepare_run(config, policy, model, ranks)
    online = reprofile.Online(config, pivots, candidates, run.start)  # beyond the paper: D_adv re-profiled
    held = list({p.id: p for p in [*pivots, *online.pool, *heldout]}.values())  # every pivot the envs score
    make_env = resolve_env(env_id, held, **env_kwargs)
    # Held-out accuracy is always graded by the domain's functional verifier, even when training uses another
    # (a strict ablation): an env id is built without `verifier`; a factory of envs is used as given.
    eval_env = resolve_env(env_id, held, **{k: v for k, v in env_kwargs.items() if k != "verifier"})
    evaluation = (lambda: turn_accuracy(run, heldout[: config.eval_pivots], eval_env)) if heldout else None

    settings = asdict(config)
    if not config.max_staleness:  # recorded only when given: a synchronous run's config.json is as before it
        del settings["max_staleness"]
    with EnvPool(make_env, config.num_envs) as pool, RunLog(run, settings, "GRPO", evaluation) as log:
        if config.max_staleness:
            rollouts.asynchronous(run, online.pivots, pool, log, heldout)  # beyond the paper: sampled ahead
        else:
            # line 5: for k = 1, ..., K_train (line 14 ends it)
            for step in range(run.start + 1, config.steps + 1):
                began = time.perf_counter()
                pivots = online.pivots_at(step, run.policy, pool)  # re-profiled when due (beyond the paper)
                rollout = sample(run, pivots, step, pool, run.sampler, synchronous(run))
                # lines 11-13: Eq. 1 per group, the update with Eq. 7, the new weights to the generator
                learning = time.perf_counter()
                outcomes = outcomes_of(rollout, config.group_size)
                _, trained, zero_variance, stats = learn(run, outcomes, lambda *group: [build_group(*group)])
                record = step_record(run, rollout, began, learning, trained, zero_variance, stats)
                log.step(record | online.metrics())  # the held-out evaluation, metrics.jsonl and checkpoints
    return log.finish()


# -- Algorithm 1, lines 1-14 ----------------------------------------------------------------------


def pivotrl(
    source: Iterable[Any],
    policy: TrainablePolicy | str,
    config: PivotRLConfig | None = None,
    env_id: str | None = None,
    heldout: Sequence[Pivot] | None = None,
    reference_name: str | None = None,
    model: Any = None,
) -> PivotRLResult:
    """PivotRL end to end, in the paper's order: select the pivots under pi_0 (lines 1-4), then train at them (5-14).

    policy: pi_0 and the initial pi_theta (a TrainablePolicy or a spec), profiled before any update;
    `model`: the module to train when it generates with weights of its own (vllm), e.g. warmed up.
    source, env_id, reference_name: see `select_pivots`; heldout: see `train`. The GRPO run goes to
    `config.out`/train; an empty D_pivot raises NoPivotsError before it (see `select_pivots`).
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
        model=model,
        candidates=selection.candidates,
        **config.profile.env_kwargs,
    )
    return PivotRLResult(selection, training)
