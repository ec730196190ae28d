"""Asynchronous rollouts with bounded staleness (`GRPOConfig.max_staleness = s`, beyond the paper).

With s = 0 the trainer runs Algorithm 1 as printed: sample a batch (lines 6-10), then update on it
(11-13). With s >= 1 a background thread samples the next batches (generation, env execution, the
rewards) while the current one updates, so generation and the update overlap. Its parts:

- `Behaviour`: the weights that sample. For an hf policy, a copy of the trained module (the
  generator never reads weights the optimizer is writing); for vllm / vllm-server, the policy's own
  engine, updated through the usual `update_weights` path. `publish` brings them to the trained
  weights (the next policy version) under a lock that generation holds, so a batch is sampled from
  one version. The copy also scores each sample's behaviour logprobs log pi_old (Eq. 8's
  denominator) right after sampling, with the trainer's own forward (`groups_logprobs`), at the
  version that sampled it: the update does not recompute them from weights that have moved since.
- `Prefetcher`: the thread. Batch i is sampled only once version >= i - 1 - s is published, so it
  is at most s versions old when step i trains on it (it blocks; it never drops a batch). It draws
  the pivots from its own copy of the run's pivot sampler; each `Rollout` carries the sampler's
  state after its draw, which the trainer sets `run.sampler` to when it consumes the batch: a
  checkpoint records the consumed position, and a resumed run samples the prefetched batches again.
- `StaleGroup`: a `Group` with its samples' behaviour logprobs and version, which `update` uses as
  log pi_old.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pivot_envs.adapters.grpo.groups import Group, build_group
from pivot_envs.adapters.grpo.policy import _base_of, shares_module, sync_weights
from pivot_envs.adapters.grpo.run import Run, RunLog
from pivot_envs.adapters.grpo.shared_prefix import groups_logprobs
from pivot_envs.pivot import Pivot

if TYPE_CHECKING:
    from pivot_envs.scoring import EnvPool

LOG = "rollouts.jsonl"  # per step: the batch's pivots, the version that sampled them and its staleness


@dataclass
class Rollout:
    """One step's sampled batch (Algorithm 1, lines 6-10): the pivots drawn (`chosen`: indices into D_pivot,
    `batch`: this rank's), the completions and their scores, the sampler's state after the draw, the seconds
    generation and scoring took; with s >= 1 also the version that sampled and each sample's behaviour
    logprobs (per pivot, per completion; None for a completion without tokens)."""

    step: int
    chosen: list[int]
    batch: list[Any]
    completions: list[list[Any]]
    scores: list[Any]
    sampler_state: dict[str, Any]
    generate_s: float
    score_s: float
    version: int = 0
    behaviour: list[list[list[float] | None]] = field(default_factory=list)

    def groups_of(
        self, index: int, samples: Sequence[Any], advantages: list[float], valid: Sequence[bool]
    ) -> list[Group]:
        """The group `learn` trains on at the batch's `index`-th pivot, with its behaviour logprobs."""
        group = build_group(self.batch[index].id, samples, advantages, valid)
        return [stale_group(group, samples, self.behaviour[index], valid, self.version)]


@dataclass
class StaleGroup(Group):
    """A Group sampled ahead: its actions' behaviour logprobs (log pi_old per token) and the version that sampled."""

    old_logprobs: list[list[float]] = field(default_factory=list)
    version: int = 0


def stale_group(
    group: Group, completions: Sequence[Any], behaviour: Sequence[Any], valid: Sequence[bool], version: int
) -> StaleGroup:
    """`group` (from `build_group` over `completions`) with the behaviour logprobs of the actions it kept."""
    # build_group keeps the valid completions with tokens, in order: the same filter aligns the logprobs
    kept = [old for c, old, ok in zip(completions, behaviour, valid) if ok and c.token_ids]
    return StaleGroup(group.pivot_id, group.prefix, group.actions, group.advantages, kept, version)


def behaviour_tensor(chunk: Sequence[Group], like: Any) -> Any:
    """The behaviour logprobs of a pass's actions as `groups_logprobs` lays them out (one right-padded row per
    action, in group order), shaped and typed as `like`; None when the pass's groups carry none (s = 0)."""
    if not chunk or not all(isinstance(g, StaleGroup) for g in chunk):
        return None
    import torch

    old = torch.zeros_like(like)
    rows = [row for g in chunk for row in g.old_logprobs]
    for index, row in enumerate(rows):
        old[index, : len(row)] = torch.tensor(row, dtype=like.dtype)
    return old


class Behaviour:
    """The policy that samples ahead, one published version of the trained `model` at a time (see the module)."""

    def __init__(self, policy: Any, model: Any, version: int, temperature: float) -> None:
        self.model, self.temperature, self.version = model, temperature, version
        self.lock = threading.Lock()  # held while sampling and while publishing: a batch sees one version
        self.published = threading.Condition()
        self.shared = shares_module(policy, model)
        self.copy = copy.deepcopy(model)  # scores the behaviour logprobs (and generates, hf)
        self.copy.eval()
        self.train_policy = policy
        if self.shared:  # hf: generate with the copy, never with the weights the optimizer writes
            self.policy = copy.copy(policy)
            self.policy.model = _base_of(self.copy) if policy.model is not model else self.copy
        else:  # vllm: the engine holds weights of its own; `publish` updates them under the lock
            self.policy = policy

    def publish(self, version: int) -> None:
        """Bring the sampling weights to the trained model's now, as policy version `version`."""
        import torch

        with self.lock:
            with torch.no_grad():
                self.copy.load_state_dict(self.model.state_dict())
            if not self.shared:
                sync_weights(self.train_policy, self.model)
            self.version = version
        with self.published:
            self.published.notify_all()

    def generate(self, chats: Sequence[Any], n: int, sampling: Any) -> tuple[list[list[Any]], tuple]:
        """n completions per chat from the current version, and (that version, their behaviour logprobs)."""
        with self.lock:
            completions = self.policy.generate(chats, n, sampling)
            return completions, (self.version, [self.logprobs(group) for group in completions])

    def logprobs(self, group: Sequence[Any]) -> list[list[float] | None]:
        """log pi_old of each completion's tokens under the sampling weights (None without tokens or prompt)."""
        import torch

        actions = [list(c.token_ids) for c in group if c.token_ids]
        if not actions or not group[0].prompt_token_ids:
            return [None] * len(group)  # build_group refuses such a group, naming the pivot
        with torch.no_grad():
            logprobs, _, _ = groups_logprobs(
                self.copy, [(list(group[0].prompt_token_ids), actions)], self.temperature
            )
        rows = iter(logprobs.float().cpu().tolist())
        return [next(rows)[: len(c.token_ids)] if c.token_ids else None for c in group]

    def wait_for(self, version: int, stopped: threading.Event) -> bool:
        """Block until `version` (or a later one) is published; False when `stopped` first."""
        with self.published:
            while self.version < version and not stopped.is_set():
                self.published.wait(timeout=0.1)
        return not stopped.is_set()


class Prefetcher:
    """The sampling thread of an asynchronous run: steps start+1 .. steps, each sampled by `sample(step,
    sampler)` once `behaviour` has published version step - 1 - max_staleness. `next()` hands the trainer
    the batches in order (re-raising the thread's error); leaving the context stops the thread."""

    def __init__(
        self,
        sample: Callable[[int, Any], Rollout],
        behaviour: Behaviour,
        sampler: Any,
        start: int,
        steps: int,
        max_staleness: int,
    ) -> None:
        import queue

        import numpy as np

        self.sample, self.behaviour, self.max_staleness = sample, behaviour, max_staleness
        self.sampler = (
            np.random.default_rng()
        )  # the thread's own copy: the run's records the consumed position
        self.sampler.bit_generator.state = sampler.bit_generator.state
        self.steps = range(start + 1, steps + 1)
        self.queue: queue.Queue = queue.Queue()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="grpo-rollouts", daemon=True)

    def __enter__(self) -> Prefetcher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join()

    def _run(self) -> None:
        import torch

        try:
            # A new thread starts at OpenMP's default thread count; torch sets it to the process's setting
            # (torch.set_num_threads) on the thread's first call into torch. vLLM's CPU attention reads
            # OpenMP's count before any such call and fails its check when the two differ: call first.
            torch.get_num_threads()
            for step in self.steps:
                # at most s versions behind when step `step` trains on it (which runs at version step - 1)
                if not self.behaviour.wait_for(step - 1 - self.max_staleness, self.stopped):
                    return
                self.queue.put(self.sample(step, self.sampler))
        except BaseException as error:  # handed to the trainer, which raises it in its own thread
            self.queue.put(error)

    def next(self) -> Rollout:
        """The next step's batch, once sampled; raises what the sampling thread raised."""
        item = self.queue.get()
        if isinstance(item, BaseException):
            raise item
        return item


class RolloutLog:
    """OUT/rollouts.jsonl: per step the pivots trained on, the version that sampled them and the staleness;
    a resumed run keeps the lines up to its checkpoint's step."""

    def __init__(self, out: Path, start: int, enabled: bool) -> None:
        self.path, self.enabled = out / LOG, enabled
        if not enabled:
            return
        lines = self.path.read_text().splitlines() if start and self.path.is_file() else []
        kept = [line for line in lines if line and json.loads(line)["step"] <= start]
        self.path.write_text("".join(line + "\n" for line in kept))

    def write(self, step: int, pivots: Sequence[str], version: int, staleness: int, samples: int) -> None:
        if self.enabled:
            record = {"step": step, "pivots": list(pivots), "version": version, "staleness": staleness}
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(record | {"samples": samples}) + "\n")


# -- the trainer's loop, sampled ahead -------------------------------------------------------------------


def asynchronous(
    run: Run, pivots: Sequence[Pivot], pool: EnvPool, log: RunLog, heldout: Sequence[Pivot]
) -> None:
    """Lines 5-14 with `config.max_staleness` = s >= 1: a thread samples each step's batch from weights at most
    s versions (updates) old, while the trainer updates on the batch before it; the update's log pi_old is
    the behaviour logprobs recorded at sampling. A step's record adds the version that sampled its batch and
    its staleness (mean and max over its samples); OUT/rollouts.jsonl lists its pivots."""
    from pivot_envs.adapters.grpo.trainer import (  # it imports this module
        learn,
        outcomes_of,
        sample,
        step_record,
    )

    config = run.config
    behaviour = Behaviour(run.policy, run.model, run.start, config.temperature)
    records = RolloutLog(Path(config.out), run.start, run.ranks.main)

    def ahead(step: int, sampler: Any) -> Rollout:
        return sample(run, pivots, step, pool, sampler, behaviour.generate)

    with Prefetcher(ahead, behaviour, run.sampler, run.start, config.steps, config.max_staleness) as prefetch:
        for step in range(run.start + 1, config.steps + 1):
            began = time.perf_counter()
            rollout = prefetch.next()
            staleness = step - 1 - rollout.version  # this step updates version step - 1
            if not 0 <= staleness <= config.max_staleness:  # the thread waits for versions: never reached
                raise RuntimeError(
                    f"step {step}: batch sampled by version {rollout.version}, past max_staleness"
                )
            run.sampler.bit_generator.state = rollout.sampler_state  # the consumed position, for checkpoints

            learning = time.perf_counter()
            outcomes = [
                (index, *rest) for index, (_, *rest) in enumerate(outcomes_of(rollout, config.group_size))
            ]
            _, trained, zero_variance, stats = learn(run, outcomes, rollout.groups_of, publish=lambda: None)
            record = step_record(run, rollout, began, learning, trained, zero_variance, stats)
            # version `step`, once the batch being sampled is done (the lock): the thread may then sample
            # step + 1 + s; meanwhile this thread has nothing to train on before that batch anyway
            waited = time.perf_counter()
            behaviour.publish(step)
            record["time_publish_s"] = time.perf_counter() - waited
            samples = len(rollout.chosen) * config.group_size  # every rank's
            record |= {
                "policy_version": rollout.version,
                "staleness_mean": float(staleness),
                "staleness_max": staleness,
            }
            records.write(step, [pivots[i].id for i in rollout.chosen], rollout.version, staleness, samples)
            evaluating = heldout and config.eval_every and step % config.eval_every == 0
            saving = config.checkpoint_every and step % config.checkpoint_every == 0
            # the evaluation generates with the policy (the engine itself, vllm) and the checkpoint saves its
            # tokenizer: neither while the thread samples
            with behaviour.lock if evaluating or saving else contextlib.nullcontext():
                log.step(record)
