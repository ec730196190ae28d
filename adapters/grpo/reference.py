"""The trainable module's setup beside the loop: LoRA adapters, and the frozen reference pi_0 of
Eq. 7's KL term (a frozen copy of the initial weights, or with LoRA the base model itself).

`config` is the run's `GRPOConfig`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pivot_envs.adapters.grpo.groups import Group
from pivot_envs.adapters.grpo.shared_prefix import groups_logprobs


def with_lora(model: Any, config: Any) -> Any:
    """`model` with LoRA adapters of `config.lora_rank` and `config.lora_alpha` on every linear layer (peft)."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=config.lora_rank, lora_alpha=config.lora_alpha, target_modules="all-linear", task_type="CAUSAL_LM"
    )
    # injects the adapters into `model` in place: the policy generates with them
    return get_peft_model(model, lora)


def frozen_reference(model: Any, config: Any) -> Any:
    """The frozen pi_0 of Eq. 7: None when beta = 0; with LoRA the base model (adapters disabled) serves."""
    import copy

    if config.beta <= 0.0 or config.lora:
        return None
    reference = copy.deepcopy(model)
    reference.requires_grad_(False)
    return reference.eval()


def reference_logprobs(model: Any, reference: Any, groups: Sequence[Group], config: Any) -> Any:
    """log pi_0(a_i | s) of the groups' action tokens at `config.temperature`, without gradient: from
    `reference`, or with LoRA (`reference` None) from `model` with its adapters disabled."""
    import torch

    pairs = [(g.prefix, g.actions) for g in groups]
    with torch.no_grad():
        if reference is not None:
            return groups_logprobs(reference, pairs, config.temperature)[0]
        with model.disable_adapter():
            return groups_logprobs(model, pairs, config.temperature)[0]
