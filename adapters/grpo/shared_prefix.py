"""log pi(a_i | s) of a group's actions with the prefix s shared across the group: the trainer's kernels.

A pivot's group shares one long prefix (the state s, often a thousand tokens) and differs only in
short actions (tens of tokens). `groups_logprobs` runs each prefix once, with gradients, and its
key/value cache is shared by the group's G actions; several groups go in one pass (their prefixes
in one forward, all their actions in a second), so a GPU runs few large kernels instead of many
small ones. `action_logprobs` is its one-group case; `sequence_logprobs` is the naive
per-sequence computation they equal up to float rounding (tests/adapters/test_shared_prefix.py).

Every function takes a transformers causal LM and token ids and returns torch tensors; torch is
imported inside them, so importing this module stays light.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pivot_envs.adapters.kv_cache import cache_of, with_cache


def right_pad(rows: Sequence[Sequence[int]], device: Any) -> tuple[Any, Any]:
    """Rows of token ids right-padded to the longest: (ids [N, T], mask [N, T], True on real tokens)."""
    import torch

    width = max(len(row) for row in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    mask = torch.zeros(len(rows), width, dtype=torch.bool, device=device)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(list(row), dtype=torch.long, device=device)
        mask[i, : len(row)] = True
    return ids, mask


def repeat_rows(tensor: Any, counts: Sequence[int]) -> Any:
    """Row i of `tensor` repeated counts[i] times, in order: `tensor[repeat_interleave(counts)]` with a
    repeatable backward.

    Each row is expanded to its copies and the parts concatenated, so the backward sums each row's
    copies in a fixed order. Indexing with a tensor (`tensor[rows]`, and transformers'
    `batch_select_indices`) backpropagates with `index_put_(accumulate=True)`, which a CPU runs in
    parallel with atomic adds unless `torch.use_deterministic_algorithms` is on: the gradients then
    differ in the last bits from run to run, and a few training steps amplify that into different
    samples (tests/adapters/test_shared_prefix.py).
    """
    import torch

    rest = tensor.shape[1:]
    return torch.cat([tensor[i : i + 1].expand(count, *rest) for i, count in enumerate(counts)])


def repeat_cache_rows(cache: Any, counts: Sequence[int], device: Any = None) -> None:
    """Each row of a transformers key/value cache repeated counts[i] times, in place.

    A layer that holds keys and values only (transformers' `DynamicLayer`, its sliding-window kind)
    gets `repeat_rows`; any other kind (an indexer's keys, linear attention's recurrent states, a
    quantized cache) keeps its own `batch_select_indices`, which knows its state: correct, though
    not repeatable bit for bit on a CPU. `device`: where that index goes (the model's).
    """
    import torch
    from transformers.cache_utils import DynamicLayer

    rows = None
    for layer in cache.layers:
        if type(layer).batch_select_indices is not DynamicLayer.batch_select_indices:
            if rows is None:
                rows = torch.repeat_interleave(torch.tensor(list(counts), device=device))
            layer.batch_select_indices(rows)
        elif layer.keys is not None and layer.keys.numel() > 0:
            layer.keys = repeat_rows(layer.keys, counts)
            layer.values = repeat_rows(layer.values, counts)


def token_logprobs(logits: Any, ids: Any, temperature: float = 1.0) -> Any:
    """log softmax(logits / T)[ids] per position, without materialising the full log-softmax."""
    logits = logits.float() / temperature
    return logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)


def token_entropy(logits: Any, temperature: float = 1.0) -> Any:
    """Entropy of softmax(logits / T) per position (no gradient)."""
    import torch

    with torch.no_grad():
        logits = logits.float() / temperature
        logz = logits.logsumexp(-1, keepdim=True)
        return -(torch.exp(logits - logz) * (logits - logz)).sum(-1)


def groups_logprobs(
    model: Any,
    groups: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]],
    temperature: float = 1.0,
    entropy: bool = False,
) -> tuple[Any, Any, Any]:
    """Per-token log pi(a_i | s) of several groups' actions, each group (s, [a_1..a_G]) after its own prefix,
    in two forward passes: every prefix runs once, all the actions run together.

    The prefixes run in one pass (right-padded to the longest, with their attention mask) and keep
    their key/value cache. Each group's cache rows are repeated to its G actions (`repeat_cache_rows`,
    which stays in the autograd graph, so a prefix gets the gradients of all its actions), and
    the right-padded actions of every group run in one pass on top, at positions P, P+1, ... after their
    own prefix's length P, attending to their own prefix's tokens (mask = prefix mask | action mask).
    The first action token is predicted by its prefix's last position, so the last action token is
    never an input. Returns (logprobs [R, T], mask [R, T], entropy [R, T] or None), one row per action
    in group order; each group's rows equal its `sequence_logprobs` up to float rounding.
    """
    import torch

    device = next(model.parameters()).device
    prefixes, prefix_mask = right_pad([prefix for prefix, _ in groups], device)
    ids, mask = right_pad([action for _, actions in groups for action in actions], device)
    width = ids.shape[1]
    lengths = prefix_mask.sum(1)
    counts = [len(actions) for _, actions in groups]  # the action rows of each group, in group order
    positions = torch.arange(prefixes.shape[1], device=device).expand_as(prefixes)
    out = model(
        input_ids=prefixes,
        attention_mask=prefix_mask.long(),
        position_ids=positions,
        use_cache=True,
        logits_to_keep=(lengths - 1)[:, None],
    )  # each prefix's last position only
    logits = repeat_rows(out.logits, counts)
    if width > 1:
        cache = cache_of(out)
        repeat_cache_rows(cache, counts, device)
        attention = torch.cat([repeat_rows(prefix_mask, counts), mask[:, :-1]], dim=1).long()
        positions = repeat_rows(lengths, counts)[:, None] + torch.arange(width - 1, device=device)
        rest = model(
            input_ids=ids[:, :-1],
            attention_mask=attention,
            position_ids=positions,
            **with_cache(cache),
            use_cache=True,
        )
        logits = torch.cat([logits, rest.logits], dim=1)
    logprobs = token_logprobs(logits, ids, temperature)
    return logprobs, mask, token_entropy(logits, temperature) if entropy else None


def action_logprobs(
    model: Any,
    prefix_ids: Sequence[int],
    actions: Sequence[Sequence[int]],
    temperature: float = 1.0,
    entropy: bool = False,
) -> tuple[Any, Any, Any]:
    """Per-token log pi(a_i | s) of one group's G actions after its shared prefix: `groups_logprobs` of one group.

    The prefix runs once with its key/value cache shared by the G actions. Returns (logprobs [G, T],
    mask [G, T], entropy [G, T] or None), equal to `sequence_logprobs` up to float rounding.
    """
    return groups_logprobs(model, [(prefix_ids, actions)], temperature, entropy)


def sequence_logprobs(
    model: Any, prefix_ids: Sequence[int], actions: Sequence[Sequence[int]], temperature: float = 1.0
) -> tuple[Any, Any]:
    """The naive computation `action_logprobs` replaces: G full sequences s + a_i, right-padded."""
    import torch

    device = next(model.parameters()).device
    ids, mask = right_pad(actions, device)
    group, width = ids.shape
    prefix = torch.tensor([list(prefix_ids)], dtype=torch.long, device=device).expand(group, -1)
    full = torch.cat([prefix, ids], dim=1)
    attention = torch.cat([torch.ones_like(prefix), mask.long()], dim=1)
    out = model(input_ids=full, attention_mask=attention, logits_to_keep=width + 1)
    return token_logprobs(out.logits[:, :-1, :], ids, temperature), mask
