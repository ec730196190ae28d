"""A short supervised warm-up on expert turns, before profiling: for reference policies too weak
to ever succeed at a pivot.

PivotRL learns only where the reference policy's samples sometimes succeed and sometimes fail
(paper Eq. 4-5): a policy that never succeeds gives zero-variance groups everywhere, so GRPO has
nothing to learn from. A small model (SmolLM2-135M, the embedded default) is such a policy on
tool calls. A few epochs of SFT on the training side's expert turns make it succeed sometimes;
that warmed-up model is then the reference policy pi_0 that profiling, filtering and GRPO use.

The loss is the mean negative log-likelihood of the expert action's tokens after the pivot's
prompt (the tokens the policy would generate for the expert turn, `encode_action`). With
`detach_prefix` (the default) the prompt runs without gradient and only the action's tokens
are back-propagated: the prompt is most of the sequence (about 1000 of 1065 tokens for the
bundled tool-use pivots); the loss value is the same, the gradient leaves out what flows through
the prompt's keys and values. The head a batch's prompts share runs once. A step took 3.2x less
time than full back-propagation on a CPU (benchmarks/sft_warm_up.py).
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pivot_envs.adapters.kv_cache import cache_of, with_cache
from pivot_envs.config import ConfigError, progress_bar
from pivot_envs.errors import PivotSetError
from pivot_envs.pivot import Pivot


@dataclass
class SFTConfig:
    """Options of the warm-up."""

    epochs: int = 1
    batch_size: int = 4  # examples per optimizer step
    learning_rate: float = 5e-5
    max_action_tokens: int = 256  # longer expert turns are cut (their end is then not learned)
    detach_prefix: bool = True  # see the module docstring
    max_grad_norm: float = 1.0
    seed: int = 0
    max_steps: int = (
        0  # stop after this many optimizer steps (0: every epoch's); epochs cycle in seeded orders
    )
    metrics: str | None = None  # a JSONL of per-step records, appended as they come
    progress: bool = True


def expert_examples(
    policy: Any, pivots: Sequence[Pivot], max_action_tokens: int = 256
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, expert action ids) per pivot: the prompt as the policy encodes it (its prompt
    budget applies), the action as the policy would generate the expert turn."""
    from pivot_envs.adapters.chat_template import encode_action

    examples = []
    for pivot in pivots:
        prompt = policy.encode(pivot.observation)
        action = encode_action(
            policy.tokenizer, pivot.observation["messages"], pivot.observation.get("tools"), pivot.expert
        )
        if len(prompt) < 2 or not action:
            raise PivotSetError(f"pivot {pivot.id}: empty prompt or expert action after encoding")
        examples.append((prompt, action[:max_action_tokens]))
    return examples


def turn_logprobs(
    model: Any,
    batch: Sequence[tuple[Sequence[int], Sequence[int]]],
    detach_prefix: bool = True,
    share_head: bool = True,
) -> tuple[Any, Any]:
    """Per-token log pi(action | prompt) of each (prompt, action) pair: (logprobs [N, T], mask [N, T]).

    detach_prefix=False: `grpo.shared_prefix.groups_logprobs` (exact gradients). True: the prompts without
    their last token run without gradient and fill a key/value cache; each prompt's last token
    and its action then run with gradient on top, so every action token, the first included, is
    predicted by a position that is back-propagated. With `share_head`, the head the prompts have
    in common (the system prompt's start, for the prompts of one domain) runs once for the batch;
    the values are the same either way.
    """
    import torch

    from pivot_envs.adapters.grpo.shared_prefix import groups_logprobs, right_pad, token_logprobs

    if not detach_prefix:
        logprobs, mask, _ = groups_logprobs(model, [(prompt, [action]) for prompt, action in batch])
        return logprobs, mask
    device = next(model.parameters()).device
    heads = [prompt[:-1] for prompt, _ in batch]
    shared = common_prefix_length(heads) if share_head else 0
    tails, tail_mask = right_pad([head[shared:] for head in heads], device)
    head_mask = torch.cat([torch.ones(len(batch), shared, dtype=torch.bool, device=device), tail_mask], dim=1)
    lengths = head_mask.sum(1)
    cache = None
    with torch.no_grad():
        if shared:
            head = torch.tensor([list(heads[0][:shared])], dtype=torch.long, device=device)
            cache = cache_of(model(input_ids=head, use_cache=True, logits_to_keep=1))
            cache.batch_repeat_interleave(len(batch))
        if tails.shape[1]:
            positions = shared + torch.arange(tails.shape[1], device=device).expand_as(tails)
            cache = cache_of(
                model(
                    input_ids=tails,
                    attention_mask=head_mask.long(),
                    position_ids=positions,
                    **with_cache(cache),
                    use_cache=True,
                    logits_to_keep=1,
                )
            )
    ids, mask = right_pad([action for _, action in batch], device)
    inputs, _ = right_pad([[prompt[-1], *action[:-1]] for prompt, action in batch], device)
    width = ids.shape[1]
    attention = torch.cat([head_mask, mask], dim=1).long()
    positions = lengths[:, None] + torch.arange(width, device=device)
    logits = model(
        input_ids=inputs, attention_mask=attention, position_ids=positions, **with_cache(cache)
    ).logits
    return token_logprobs(logits, ids), mask


def common_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """How many leading ids every row has in common."""
    first = rows[0]
    length = min(len(row) for row in rows)
    for row in rows[1:]:
        length = next((i for i, (a, b) in enumerate(zip(first[:length], row[:length])) if a != b), length)
    return length


def warm_up(
    policy: Any,
    pivots: Sequence[Pivot],
    config: SFTConfig | None = None,
    model: Any = None,
    on_step: Callable[[int, bool], None] | None = None,
) -> list[dict[str, Any]]:
    """Fine-tune `policy`'s model (or `model`) on the pivots' expert turns in place; returns the
    per-step records (epoch, step, loss, tokens, seconds), also appended to `config.metrics`.
    `on_step(step, last)` is called after each optimizer step (a validation, a checkpoint)."""
    import torch

    from pivot_envs.adapters.grpo.policy import UntrainablePolicyError

    config = config or SFTConfig()
    model = model if model is not None else getattr(policy, "model", None)
    if model is None:
        raise UntrainablePolicyError(
            f"{getattr(policy, 'name', policy)!r} has no trainable model: the SFT warm-up needs an hf policy"
        )
    if config.epochs < 0 or config.batch_size < 1:
        raise ConfigError(
            f"SFTConfig: epochs must be >= 0 and batch_size >= 1 (got {config.epochs}, {config.batch_size})"
        )
    examples = expert_examples(policy, pivots, config.max_action_tokens)
    if not examples or config.epochs == 0:
        return []
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.learning_rate)
    metrics = Path(config.metrics) if config.metrics else None
    if metrics is not None:
        metrics.parent.mkdir(parents=True, exist_ok=True)
    steps_per_epoch = math.ceil(len(examples) / config.batch_size)
    total = config.epochs * steps_per_epoch
    total = min(total, config.max_steps) if config.max_steps > 0 else total
    bar = progress_bar(total=total, unit="step", desc="SFT warm-up", enabled=config.progress)
    records: list[dict[str, Any]] = []
    was_training = model.training
    model.train()
    order = list(range(len(examples)))
    try:
        for epoch in range(config.epochs):
            random.Random(f"{config.seed}/{epoch}").shuffle(order)
            for start in range(0, len(order), config.batch_size):
                if len(records) >= total:
                    break
                began = time.perf_counter()
                batch = [examples[i] for i in order[start : start + config.batch_size]]
                logprobs, mask = turn_logprobs(model, batch, config.detach_prefix)
                loss = -(logprobs * mask).sum() / mask.sum()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if config.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
                optimizer.step()
                record = {
                    "epoch": epoch,
                    "step": len(records) + 1,
                    "loss": float(loss.item()),
                    "tokens": int(mask.sum().item()),
                    "seconds": time.perf_counter() - began,
                }
                records.append(record)
                if metrics is not None:
                    with metrics.open("a") as handle:
                        handle.write(
                            json.dumps(
                                {**record, **({"config": asdict(config)} if len(records) == 1 else {})}
                            )
                            + "\n"
                        )
                bar.update(1)
                bar.set_postfix(loss=f"{record['loss']:.3f}")
                if on_step is not None:
                    on_step(record["step"], record["step"] == total)
    finally:
        bar.close()
        model.train(was_training)
        model.zero_grad(set_to_none=True)
    return records
