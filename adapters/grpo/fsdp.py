"""FSDP2 in the bundled trainer (`--fsdp` under torchrun): the policy sharded over the ranks, not replicated.

    torchrun --nproc-per-node 2 -m pivot_envs.adapters.grpo --pivots pivots.jsonl --fsdp --out runs/grpo

`shard` applies `torch.distributed.fsdp.fully_shard` to each decoder layer, then to the model (and
to the frozen reference of Eq. 7's KL, when there is one): each rank holds 1/N of every weight, of
its gradient and of AdamW's state. A sharded forward all-gathers each layer's weights from every
rank, so every rank must run the same forwards and backwards in the same order:

- the update's passes (grpo.shared_prefix: one or two forwards, one backward) are lined up by
  `aligned`: two-forward passes first, then one-forward passes, and a rank with fewer of either
  runs zero-weight padding passes until every rank has as many (its gradients add zeros);
- sampling and the held-out evaluation run inside `gathered`: the whole weights are gathered once,
  then each rank generates as many tokens as it needs without collectives (as TRL and verl
  gather the weights for generation);
- checkpoints hold the gathered full weights and optimizer state (`full_state`, collective; rank 0
  writes them in the one-process format), and a resume loads them into the shards (`load_full_state`),
  so a run resumes with or without `--fsdp` and with any number of ranks.

Gradients are summed over the ranks (reduce-scatter with divide factor 1), as the data-parallel
path sums them: the loss is already divided by the units counted over every rank.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from pivot_envs.adapters.grpo.distributed import DistributedSetupError, Ranks
from pivot_envs.adapters.grpo.groups import Group


def sharding(config: Any, ranks: Ranks) -> bool:
    """Whether this run shards: `config.fsdp` under torchrun (one process has nothing to shard with)."""
    return bool(getattr(config, "fsdp", False)) and ranks.world_size > 1


def sharded(model: Any) -> bool:
    """Whether `model` was sharded by `shard` (an FSDP2 module)."""
    if model is None:
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def decoder_layers(model: Any) -> list[Any]:
    """The decoder layers of a transformers model (or of a peft model's base): the modules of the classes
    its `_no_split_modules` names, which transformers declares for every causal LM."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    layers = [module for module in base.modules() if type(module).__name__ in names]
    if not layers:
        raise DistributedSetupError(
            f"--fsdp: {type(base).__name__} declares no decoder layer class (_no_split_modules); "
            "train it without --fsdp"
        )
    return layers


def shard(model: Any, reference: Any = None) -> None:
    """Shard `model` (and `reference`) in place with FSDP2: each decoder layer, then the whole model.

    Every forward then re-gathers a layer's weights (and frees them after it), the backward
    reduce-scatters its gradients, summed over the ranks (divide factor 1)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    for module in (model, reference):
        if module is None:
            continue
        for layer in decoder_layers(module):
            fully_shard(layer, reshard_after_forward=True)
        fully_shard(module, reshard_after_forward=True)
        # FSDP takes the first module to run forward as its root; with LoRA the policy samples through peft's
        # inner base model, so the root is settled here (what FSDP's first forward would do)
        module._get_fsdp_state()._lazy_init()
        for part in module.modules():
            if isinstance(part, FSDPModule):
                part.set_gradient_divide_factor(1.0)
                part.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no PREMUL_SUM


@contextlib.contextmanager
def gathered(model: Any) -> Iterator[None]:
    """Inside, `model`'s whole weights are on every rank and forwards run no collective (sampling, evaluation);
    entering is a collective (every rank must enter together), leaving frees the gathered weights. No-op
    when `model` is not sharded."""
    if not sharded(model):
        yield
        return
    from torch.distributed.fsdp import FSDPModule

    parts = [part for part in model.modules() if isinstance(part, FSDPModule)]
    for part in parts:
        part.unshard()
        part.set_reshard_after_forward(False)  # each forward would otherwise free what the next gathers again
    try:
        yield
    finally:
        for part in parts:
            part.set_reshard_after_forward(True)
            part.reshard()


def _forwards(chunk: Sequence[Group]) -> int:
    """The forwards `groups_logprobs` runs for a pass: the prefixes, and the actions when any has two tokens."""
    return 2 if max(len(a) for g in chunk for a in g.actions) > 1 else 1


def _padding(forwards: int) -> list[Group]:
    """A one-token pass of `forwards` forwards (an action of one or two tokens), trained with weight 0."""
    return [Group("<fsdp padding>", [0], [[0] * forwards], [0.0])]


def aligned(passes: Sequence[Sequence[Group]], ranks: Ranks) -> list[tuple[list[Group], bool]]:
    """This rank's passes as (groups, padding) in the order every rank runs the same forwards and backwards:
    its two-forward passes, padding to the most any rank has, then its one-forward passes, padded alike."""
    import torch
    import torch.distributed as dist

    two = [list(chunk) for chunk in passes if _forwards(chunk) == 2]
    one = [list(chunk) for chunk in passes if _forwards(chunk) == 1]
    most = torch.tensor([len(two), len(one)], dtype=torch.int64, device=ranks.device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    most_two, most_one = most.tolist()
    return (
        [(chunk, False) for chunk in two]
        + [(_padding(2), True)] * (most_two - len(two))
        + [(chunk, False) for chunk in one]
        + [(_padding(1), True)] * (most_one - len(one))
    )


def full_state(model: Any, optimizer: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The whole weights and AdamW state gathered on rank 0, in CPU memory (a collective: every rank calls it;
    the others get empty dicts). The optimizer state is keyed as `optimizer.state_dict()` keys it in one
    process (by the parameter's place), so the checkpoint is the same whatever the run's layout."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=options)
    # gathered, tied weights (lm_head and the embeddings) come apart: keep the first, as save_pretrained does
    first: dict[int, str] = {}
    for name, param in model.state_dict(keep_vars=True).items():
        if first.setdefault(id(param), name) != name:
            weights.pop(name, None)
    if optimizer is None:
        return weights, None
    state = get_optimizer_state_dict(model, optimizer, options=options)
    if not state:
        return weights, {}
    order = [name for group in state["param_groups"] for name in group["params"]]
    place = {name: index for index, name in enumerate(order)}
    groups = [
        {**group, "params": [place[name] for name in group["params"]]} for group in state["param_groups"]
    ]
    return weights, {
        "state": {place[name]: value for name, value in state["state"].items()},
        "param_groups": groups,
    }


def saved_weights(path: Any, model: Any) -> dict[str, Any]:
    """The whole weights a checkpoint at `path` holds for `model`, keyed as `model.state_dict()`: the model's
    (transformers), or with LoRA its adapters alone (peft's file, its keys given the adapter's name)."""
    if hasattr(model, "disable_adapter"):
        from safetensors.torch import load_file

        names = {
            name.replace(f".{model.active_adapter}.", "."): name
            for name in model.state_dict()
            if "lora_" in name
        }
        return {
            names[key]: value for key, value in load_file(str(path / "adapter_model.safetensors")).items()
        }
    from transformers import AutoModelForCausalLM

    dtype = next(model.parameters()).dtype
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).state_dict()


def load_full_state(
    model: Any, optimizer: Any, weights: dict[str, Any], state: dict[str, Any] | None
) -> None:
    """Load whole weights (a state dict of the unsharded model) and the one-process optimizer state of a
    checkpoint into the shards of `model` and `optimizer` (every rank passes the same)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    # strict only without LoRA: a LoRA checkpoint holds the adapters, the base weights stay as loaded
    options = StateDictOptions(full_state_dict=True, strict=not hasattr(model, "disable_adapter"))
    set_model_state_dict(model, weights, options=options)
    if optimizer is None or state is None:
        return
    # AdamW was given the trainable parameters in this order: the one-process state's indices name them
    names = [name for name, param in model.named_parameters() if param.requires_grad]
    by_name = {
        "state": {names[index]: value for index, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [names[index] for index in group["params"]]}
            for group in state["param_groups"]
        ],
    }
    set_optimizer_state_dict(model, optimizer, by_name, options=options)
