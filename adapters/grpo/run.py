"""What surrounds Algorithm 1 in a run, so that the trainer's loop reads as the algorithm (as CleanRL's does).

`prepare_run` sets a run up: seeds, pi_theta's trainable module (LoRA optional), the frozen
reference pi_0, AdamW, the pivot sampler, and the resume from the latest checkpoint; it returns the
`Run`. `RunLog` owns what the run records in its `config.out`: config.json, metrics.jsonl (and
TensorBoard, via `checkpoints.MetricsLog`), the held-out evaluation every `eval_every` steps
(`turn_accuracy` for pivots), a checkpoint every `checkpoint_every` steps and final/, the progress
bar and a log line per step. Both trainers use them: the pivot trainer (`grpo.trainer.train`) and
E2E RL (`grpo.episodes.train_episodes`). Under torchrun rank 0 alone evaluates, writes and saves.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pivot_envs.adapters.grpo import fsdp
from pivot_envs.adapters.grpo.checkpoints import (
    MetricsLog,
    latest_checkpoint,
    load_checkpoint,
    refuse_earlier_run,
    save_checkpoint,
)
from pivot_envs.adapters.grpo.config import GRPOConfig
from pivot_envs.adapters.grpo.distributed import DistributedSetupError, Ranks
from pivot_envs.adapters.grpo.policy import TrainablePolicy, shares_module, sync_weights, trainable_module
from pivot_envs.adapters.grpo.reference import frozen_reference, with_lora
from pivot_envs.adapters.grpo.results import TrainResult
from pivot_envs.config import progress_bar
from pivot_envs.evaluate import EvalConfig, evaluate
from pivot_envs.pivot import Pivot
from pivot_envs.policy import load_policy

logger = logging.getLogger(__name__)


@dataclass
class Run:
    """A GRPO run's state: the policy that samples, the module trained (pi_theta), the frozen reference
    pi_0 (None when beta = 0, or with LoRA), AdamW, the pivot sampler, and the step it starts after."""

    config: GRPOConfig
    policy: TrainablePolicy
    model: Any
    reference: Any
    optimizer: Any
    sampler: Any
    start: int
    ranks: Ranks
    began: float  # when its set-up began: the run's wall time counts from there


def prepare_run(
    config: GRPOConfig, policy: TrainablePolicy | None, model: Any = None, ranks: Ranks | None = None
) -> Run:
    """A GRPO run's set-up into `config.out`, shared by `train` and the E2E trainer (grpo.episodes):
    refuse an earlier run there (unless resuming), seed, load the policy when None, make its trainable
    module (`model`, else the policy's; LoRA optional) and the frozen reference, AdamW, the pivot
    sampler, and resume from the latest checkpoint. Under torchrun (`ranks`) every rank starts from
    rank 0's weights; with `config.fsdp` the module and the reference are then sharded (grpo.fsdp)."""
    import numpy as np
    import torch

    began = time.perf_counter()
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
    sharding = fsdp.sharding(config, ranks)
    if sharding:
        if not shares_module(policy, model):
            raise DistributedSetupError(
                "--fsdp: shards a policy that generates with the trained module itself (hf); "
                f"{getattr(policy, 'name', policy)!r} trains without --fsdp"
            )
        ranks.broadcast_parameters(model)  # whole weights are broadcast before they are cut into shards
    reference = frozen_reference(model, config)
    if sharding:
        fsdp.shard(model, reference)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=config.learning_rate,
        weight_decay=config.weight_decay,
    )
    sampler = np.random.default_rng(config.seed)
    start = 0
    if checkpoint is not None:
        start = load_checkpoint(checkpoint, model, optimizer, sampler, config)
    if not sharding:
        ranks.broadcast_parameters(model)  # under torchrun every rank starts from rank 0's weights
    if checkpoint is not None or ranks.world_size > 1:
        sync_weights(policy, model)
    return Run(config, policy, model, reference, optimizer, sampler, start, ranks, began)


def turn_accuracy(run: Run, heldout: Sequence[Pivot], make_env: Callable[[], Any]) -> dict[str, float]:
    """The greedy turn accuracy of `run.policy` at `heldout` under the envs of `make_env` (functional, and
    strict), as the figures a step's record holds: `eval_turn_accuracy`, `eval_strict_accuracy`."""
    config = run.config
    eval_config = EvalConfig(max_new_tokens=config.max_new_tokens, num_envs=config.num_envs)
    report = evaluate(run.policy, heldout, eval_config, env=make_env)
    greedy = [row for row in report.rows if row.mode == "greedy"][-1]
    return {"eval_turn_accuracy": greedy.functional.mean, "eval_strict_accuracy": greedy.strict.mean}


class RunLog:
    """The records, evaluations and checkpoints of `run`; a context manager (leaving it closes the bar
    and the metrics), and `finish` then saves final/.

    settings: what config.json holds (the trainer's whole config).
    evaluate: the held-out evaluation, returning the figures it adds to its step's record (None: none).
    """

    def __init__(
        self,
        run: Run,
        settings: dict[str, Any],
        desc: str,
        evaluate: Callable[[], dict[str, float]] | None = None,
    ) -> None:
        self.run, self.config, self.evaluate = run, run.config, evaluate
        self.out, self.main = Path(run.config.out), run.ranks.main
        self.history: list[dict[str, Any]] = []
        self.metrics = MetricsLog(self.out, run.start) if self.main else None
        if self.main:
            (self.out / "config.json").write_text(json.dumps(settings, indent=2))
        self.bar = progress_bar(
            total=self.config.steps, initial=run.start, unit="step", desc=desc, enabled=self.main
        )

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()
        if self.metrics is not None:
            self.metrics.close()

    @property
    def resumed(self) -> list[dict[str, Any]]:
        """The records of the steps before a resumed run's first (none in a fresh run)."""
        return self.metrics.kept if self.metrics is not None else []

    def step(self, record: dict[str, Any], note: str = "") -> None:
        """Keep a step's `record`; on rank 0 add the held-out evaluation when due, write the record to
        metrics.jsonl, log it (with `note`), and save a checkpoint when due."""
        step, config = record["step"], self.config
        self.history.append(record)
        self.bar.update()
        evaluating = self.evaluate is not None and config.eval_every and step % config.eval_every == 0
        saving = config.checkpoint_every and step % config.checkpoint_every == 0
        if not self.main:
            if fsdp.sharded(self.run.model):  # sharded: every rank takes part in gathering the weights
                if evaluating:
                    with fsdp.gathered(self.run.model):
                        pass
                if saving:
                    self.save(self.out / "checkpoints" / f"step-{step}", step)
            return
        if evaluating:
            with fsdp.gathered(self.run.model):
                record.update(self.evaluate())
        self.metrics.write(record)
        held_out = [
            f", held-out {k[5:].replace('_', ' ')} {v:.3f}" for k, v in record.items() if k[:5] == "eval_"
        ]
        logger.info(
            "step %d/%d: reward mean %.3f std %.3f, zero-variance groups %.2f, invalid %.2f, loss %.4f, "
            "KL %.4f, %.0f tokens/s%s%s",
            step,
            config.steps,
            record["reward_mean"],
            record["reward_std"],
            record["frac_zero_variance"],
            record["frac_invalid"],
            record["loss"],
            record["kl"],
            record["tokens_per_s"],
            f", {note}" if note else "",
            "".join(held_out),
        )
        if saving:
            self.save(self.out / "checkpoints" / f"step-{step}", step)

    def save(self, path: Path, step: int) -> None:
        """A checkpoint of the run at `step` (`checkpoints.save_checkpoint`); a sharded model's whole weights
        and optimizer state are gathered first (every rank calls this, rank 0 writes)."""
        run = self.run
        full = fsdp.full_state(run.model, run.optimizer) if fsdp.sharded(run.model) else None
        if not self.main:
            return
        tokenizer = getattr(run.policy, "tokenizer", None)
        save_checkpoint(path, run.model, tokenizer, run.optimizer, run.sampler, step, self.config, full)

    def finish(self) -> TrainResult:
        """Save final/ (rank 0), wait for every rank, and return where the run's outputs are."""
        final = self.out / "final"
        if self.main or fsdp.sharded(self.run.model):
            self.save(final, max(self.run.start, self.config.steps))
        self.run.ranks.barrier()  # the run's outputs are complete when any rank returns
        return TrainResult(
            out=self.out,
            steps=self.config.steps,
            final=final,
            metrics_path=self.out / "metrics.jsonl",
            history=self.history,
            seconds=time.perf_counter() - self.run.began,
        )
