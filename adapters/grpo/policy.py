"""What the trainer needs from a policy backend (`TrainablePolicy`), and how trained weights reach it.

The trainer samples each group with the policy (Algorithm 1, line 8) and updates a torch module
(line 13). Either the policy generates with that module itself (hf: `policy.model`, updated in
place), or it generates with weights of its own and takes the trained ones after each update
(vllm: `policy.update_weights`, with the trainable module passed to `train(model=...)`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from pivot_envs.adapters.attention import use_linear_memory_attention
from pivot_envs.errors import PivotEnvsError
from pivot_envs.policy import Completion, SamplingParams


class UntrainablePolicyError(PivotEnvsError, ValueError):
    """The policy gives the trainer no module to train, or no way to hand it the trained weights."""


@runtime_checkable
class TrainablePolicy(Protocol):
    """A Policy the GRPO trainer can train (the `policy` of `train`).

    generate: n completions per chat, each with `prompt_token_ids` and `token_ids` set to the exact
              ids sampled (local backends: hf, vllm), so the update scores the tokens that were
              sampled; completions without them are refused, naming the pivot (`build_group`).
    name:     shown in errors.

    And one of (checked by `trainable_module` before the first step):
    model:    the torch module it generates with (hf): the trainer updates it in place;
    update_weights(state_dict): takes the trained weights after each update (vllm), with
              `trainable_model()` giving the torch module to train when no `model=` is passed.

    Optional: `tokenizer`, saved with each checkpoint so it loads as `hf:CHECKPOINT`.
    """

    name: str

    def generate(
        self, chats: Sequence[dict[str, Any]], n: int, sampling: SamplingParams
    ) -> list[list[Completion]]: ...


def _base_of(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def shares_module(policy: Any, model: Any) -> bool:
    """Whether the policy generates with `model` itself (or with the base of its LoRA wrapper)."""
    return getattr(policy, "model", None) in (model, _base_of(model))


def trainable_module(policy: TrainablePolicy, model: Any = None) -> Any:
    """The torch module to train: `model`, else the module the policy generates with, else the one
    its `trainable_model()` loads (a policy whose engine holds no torch module of ours: vllm).

    Raises UntrainablePolicyError naming the policy when there is none, or when the policy
    neither generates with `model` nor takes new weights (`update_weights`): its samples would
    never follow the training. A module on transformers' `sdpa` attention is switched to
    `attention.ATTENTION`, which keeps a float32 update's memory linear in the prefix on a GPU.
    """
    name = getattr(policy, "name", policy)
    module = model if model is not None else getattr(policy, "model", None)
    if module is None and hasattr(policy, "trainable_model"):  # vllm: its checkpoint loaded in transformers
        module = policy.trainable_model()
    if module is None:
        raise UntrainablePolicyError(f"policy {name!r} has no trainable .model; pass model=")
    if not shares_module(policy, module) and not hasattr(policy, "update_weights"):
        raise UntrainablePolicyError(
            f"policy {name!r} neither shares the trained module nor has update_weights()"
        )
    use_linear_memory_attention(module)
    return module


def sync_weights(policy: TrainablePolicy, model: Any) -> None:
    """Give the generation backend the new weights: nothing when it generates with `model` itself
    (hf), `policy.update_weights(state_dict)` otherwise (vllm; LoRA merged into the base weights)."""
    if shares_module(policy, model):
        return
    if not hasattr(policy, "update_weights"):
        raise UntrainablePolicyError(
            f"policy {getattr(policy, 'name', policy)!r} neither shares the trained module nor has update_weights()"
        )
    if hasattr(model, "merge_adapter"):
        model.merge_adapter()
        try:
            state = {
                key.replace("base_model.model.", "", 1).replace(".base_layer", ""): value
                for key, value in model.state_dict().items()
                if "lora_" not in key
            }
            policy.update_weights(state)
        finally:
            model.unmerge_adapter()
    else:
        policy.update_weights(model.state_dict())
