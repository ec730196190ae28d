"""One pivot's group as the update trains on it, and how a batch's groups are packed into passes.

A `Group` holds the exact token ids the policy sampled at one pivot (its prompt, then each valid
action) with Eq. 1's advantages. `update` (grpo.trainer, Algorithm 1 line 13) runs the groups of
a batch in passes of at most `pass_budget` padded tokens each (`pack_groups`): per pass one forward
over the prefixes, one over the actions (grpo.shared_prefix). Eq. 7's average runs over the groups'
action tokens or actions (`loss_units`).

`config` is the run's `GRPOConfig` (this module reads its `tokens_per_pass`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pivot_envs.adapters.grpo.policy import UntrainablePolicyError


@dataclass
class Group:
    """One pivot's sampled actions, ready for the update: the exact sampled token ids and Eq. 1's advantages."""

    pivot_id: str
    prefix: list[int]
    actions: list[list[int]]
    advantages: list[float]


def build_group(
    pivot_id: str, completions: Sequence[Any], advantages: Sequence[float], valid: Sequence[bool]
) -> Group:
    """The group trained on: prompt ids + sampled ids exactly as sampled (no decode/re-encode), invalid samples dropped."""
    prompts = {tuple(c.prompt_token_ids) for c in completions}
    if not completions or () in prompts:
        raise UntrainablePolicyError(
            f"pivot {pivot_id}: the policy returned completions without prompt_token_ids; "
            "the GRPO trainer needs a local backend that reports the exact tokens it sampled (hf, vllm)"
        )
    if len(prompts) != 1:
        raise ValueError(f"pivot {pivot_id}: the group's completions were sampled after different prompts")
    kept = [(list(c.token_ids), a) for c, a, ok in zip(completions, advantages, valid) if ok and c.token_ids]
    return Group(pivot_id, list(completions[0].prompt_token_ids), [t for t, _ in kept], [a for _, a in kept])


def padded_tokens(groups: Sequence[Group]) -> int:
    """The tokens `groups_logprobs` pads a pass of k groups with R actions to: k x longest prefix + R x longest action."""
    actions = [a for g in groups for a in g.actions]
    return len(groups) * max(len(g.prefix) for g in groups) + len(actions) * max(len(a) for a in actions)


def pack_groups(groups: Sequence[Group], tokens_per_pass: int) -> list[list[Group]]:
    """The groups of a batch split into passes of at most `tokens_per_pass` padded tokens each.

    Groups are taken longest prefix first, so the groups padded together have similar prefixes;
    a group over the budget runs alone; `tokens_per_pass` 0 gives one group per pass.
    """
    passes: list[list[Group]] = []
    for group in sorted(groups, key=lambda g: len(g.prefix), reverse=True):
        if passes and padded_tokens(passes[-1] + [group]) <= tokens_per_pass:
            passes[-1].append(group)
        else:
            passes.append([group])
    return passes


def pass_budget(config: Any, model: Any) -> int:
    """`config.tokens_per_pass`, or its default for the model's device: 8192 on a GPU, where small passes are
    launch-bound, and 0 (one group per pass) on a CPU, where the update is compute-bound and a packed pass's
    activations (gigabytes at 1k-token prefixes) made it slower (benchmarks/RESULTS.md)."""
    if config.tokens_per_pass is not None:
        return config.tokens_per_pass
    return 0 if next(model.parameters()).device.type == "cpu" else 8192


def loss_units(groups: Sequence[Group], level: str) -> int:
    """What Eq. 7's average runs over in `groups`: their action tokens (level "token") or their actions ("action")."""
    if level == "action":
        return sum(len(g.actions) for g in groups)
    return sum(len(a) for g in groups for a in g.actions)
