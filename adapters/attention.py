"""Attention that keeps the trainer's memory linear in the prefix on a GPU in float32.

transformers' `sdpa` attention hands a grouped-query model's keys and values to
`scaled_dot_product_attention` with `enable_gqa=True` when a pass has no attention mask (a single
prefix, or prefixes of one length: the common case of the shared-prefix passes). On CUDA in float32
no fused kernel takes that call: flash attention and cuDNN need 16-bit inputs, and the
memory-efficient kernel does not admit grouped query heads (`check_batch_size_and_num_heads_dense
<false>` in torch's `sdp_utils.cpp`). It falls to the math kernel, which keeps each layer's
heads x P x P attention weights for the backward: 2.35 GiB a layer for SmolLM2-135M at P = 8.4k,
70 GB over its 30 layers. That is what ran an H200 out of memory when sampling ahead added its
generation on top (`benchmarks/RESULTS.md`).

`ATTENTION` ("pivot_sdpa") is transformers' `sdpa` with one change: in exactly that case (CUDA,
float32, no mask, more than one query, fewer key/value heads than query heads) it repeats the key/value
heads first, as transformers itself does when there is a mask, so the memory-efficient kernel can
take the call. Everywhere else it is transformers' `sdpa`, call for call (on a CPU, whose kernels
take grouped heads, nothing changes, bit for bit). `use_linear_memory_attention(model)` switches a
model that runs `sdpa` to it; the name is not saved with the model's config.
"""

from __future__ import annotations

from typing import Any

ATTENTION = "pivot_sdpa"
UNGROUPED_ON = frozenset({"cuda"})  # devices where grouped float32 attention without a mask falls to math


class _Ungrouped:
    """What transformers' `sdpa_attention_forward` reads of its module, with the heads already ungrouped."""

    num_key_value_groups = 1

    def __init__(self, module: Any) -> None:
        self.is_causal = getattr(module, "is_causal", True)


def ungroups(query: Any, key: Any, attention_mask: Any) -> bool:
    """Whether this call would reach SDPA as grouped float32 attention without a mask on a device in
    `UNGROUPED_ON`: the case only the math kernel takes."""
    import torch

    return (
        query.device.type in UNGROUPED_ON
        and query.dtype == torch.float32
        and attention_mask is None
        and query.shape[2] > 1
        and key.shape[1] < query.shape[1]
    )


def pivot_sdpa(
    module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any
) -> tuple[Any, Any]:
    """transformers' `sdpa_attention_forward`, with the key/value heads repeated first where `ungroups`."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    if ungroups(query, key, attention_mask):
        groups = query.shape[1] // key.shape[1]
        key, value, module = repeat_kv(key, groups), repeat_kv(value, groups), _Ungrouped(module)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register() -> None:
    """Make `ATTENTION` known to transformers (its attention and its mask: `sdpa`'s)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, pivot_sdpa)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def use_linear_memory_attention(model: Any) -> bool:
    """Switch `model` (a transformers model, or a PEFT wrapper of one) from `sdpa` to `ATTENTION`; True
    when switched or already on it, False for any other attention (eager, flash, flex: left as chosen)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current == ATTENTION:
        return True
    if current != "sdpa" or not hasattr(base, "set_attn_implementation"):
        return False
    register()
    base.set_attn_implementation(ATTENTION)
    return True
