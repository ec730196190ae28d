"""The transformers generation backend: `HFPolicy` (CPU or CUDA), the embedded default.

A pivot's prompt is a long shared prefix (the conversation so far) followed by n short sampled
actions. `generate` prefills each prompt once and shares its KV cache across the n samples (the
cache's rows repeated n times into a preallocated `StaticCache` that the decode steps fill in
place), instead of recomputing the prefix n times as `model.generate(num_return_sequences=n)`
does. The sampling loop is written out here so every completion carries the exact
log-probability of each sampled token under the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pivot_envs.adapters.chat_template import encode_prompt

from pivot_envs.policy import Completion, PolicySpecError, SamplingParams

EMBEDDED = "smollm2"


class HFPolicy:
    """A transformers causal LM as a Policy.

    model:       a `transformers` causal LM (updated in place by trainers: `policy.model`).
    tokenizer:   its tokenizer (with a chat template; see `chat_template.render_prompt`); None
                 allows only `generate_ids`, whose completions then carry no text.
    device:      where to run ("cpu", "cuda", "cuda:1"); defaults to the model's device.
    batch_size:  chats prefilled together; the decode batch is batch_size * n rows.
    name:        recorded in profiles as the reference policy's name.
    share_prefix: prefill each prompt once for its n samples (False: once per sample, the
                 naive way, kept for comparison).
    stop_token_ids: the ids that end a completion (default: the tokenizer's and the model's
                 end-of-sequence ids and `<|im_end|>`; an empty list never stops early).
    max_prompt_tokens: fit longer prompts to this many tokens (`chat_template.fit_prompt`:
                 tool descriptions, then the oldest turns, then the middle of the longest
                 message are left out); None renders every prompt whole.

    Logprobs are those of the model's own distribution (log-softmax of the logits, before
    temperature and top-p), at the sampled ids, so a trainer can use them as the behaviour
    policy's logprobs. `token_ids` end with the stop token when the completion stopped
    (finish_reason "stop"); `text` leaves it out.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any | None,
        device: str | None = None,
        batch_size: int = 8,
        name: str | None = None,
        share_prefix: bool = True,
        stop_token_ids: Sequence[int] | None = None,
        max_prompt_tokens: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.device = str(device) if device is not None else str(next(model.parameters()).device)
        if device is not None:
            self.model.to(device)
        self.batch_size = batch_size
        self.share_prefix = share_prefix
        self.max_prompt_tokens = max_prompt_tokens or None
        self.name = name or f"hf:{getattr(model, 'name_or_path', '') or type(model).__name__}"
        self.stop_ids = set(stop_token_ids) if stop_token_ids is not None else self._stop_ids()
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = pad if pad is not None else min(self.stop_ids, default=0)

    @classmethod
    def from_pretrained(
        cls, path_or_name: str, device: str = "cpu", dtype: Any = None, **options: Any
    ) -> HFPolicy:
        """Load a checkpoint directory or hub name ("smollm2" is the embedded SmolLM2-135M-Instruct)."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if path_or_name == EMBEDDED:
            from pivot_envs.adapters import smollm2

            model, tokenizer = smollm2.load(device=device, dtype=dtype)
            return cls(model, tokenizer, device=device, name=f"hf:{EMBEDDED}", **options)
        tokenizer = AutoTokenizer.from_pretrained(path_or_name)
        model = AutoModelForCausalLM.from_pretrained(path_or_name, dtype=dtype or torch.float32).to(device)
        model.eval()
        return cls(model, tokenizer, device=device, name=f"hf:{path_or_name}", **options)

    def _stop_ids(self) -> set[int]:
        ids: set[int] = set()
        tokenizer_eos = getattr(self.tokenizer, "eos_token_id", None)
        for source in (tokenizer_eos, getattr(self.model.generation_config, "eos_token_id", None)):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, (list, tuple)):
                ids.update(int(i) for i in source)
        if self.tokenizer is not None:
            end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
            if isinstance(end, int) and end != self.tokenizer.unk_token_id:
                ids.add(end)
        if not ids:
            raise ValueError(f"{self.name}: neither tokenizer nor model defines an end-of-sequence token to stop at")
        return ids

    def encode(self, chat: dict[str, Any]) -> list[int]:
        """The prompt token ids of a chat ({"messages", "tools"})."""
        if self.tokenizer is None:
            raise ValueError(f"{self.name} has no tokenizer: it can only generate from token ids (generate_ids)")
        return encode_prompt(self.tokenizer, chat["messages"], chat.get("tools") or [], self.max_prompt_tokens)

    def generate(
        self, chats: Sequence[dict[str, Any]], n: int, sampling: SamplingParams
    ) -> list[list[Completion]]:
        """n completions for each chat, in order; seeded by `sampling.seed` when given."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        return self.generate_ids([self.encode(chat) for chat in chats], n, sampling)

    def generate_ids(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        """n completions for each already-tokenized prompt (the engine under `generate`)."""
        import torch

        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        generator = torch.Generator(device=self.device)
        if sampling.seed is not None:
            generator.manual_seed(int(sampling.seed))
        else:
            generator.seed()
        prompts = [list(p) for p in prompts]
        if any(not p for p in prompts):
            raise ValueError("every prompt needs at least one token")
        out: list[list[Completion]] = []
        for start in range(0, len(prompts), self.batch_size):
            out.extend(self._generate_batch(prompts[start : start + self.batch_size], n, sampling, generator))
        return out

    def _generate_batch(
        self, prompts: list[list[int]], n: int, sampling: SamplingParams, generator: Any
    ) -> list[list[Completion]]:
        import torch

        device = torch.device(self.device)
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):  # left padding: every prompt ends at the same column
            ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[row, width - len(prompt) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        if not self.share_prefix:  # the naive way, kept for comparison: prefill every sample's copy
            ids, mask = ids.repeat_interleave(n, dim=0), mask.repeat_interleave(n, dim=0)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        rows, steps = len(prompts) * n, max(sampling.max_new_tokens, 0)
        sampled = torch.full((rows, steps), self.pad_id, dtype=torch.long, device=device)
        logprobs = torch.zeros(sampled.shape, dtype=torch.float32, device=device)
        lengths = torch.zeros(rows, dtype=torch.long, device=device)
        finished = torch.zeros(rows, dtype=torch.bool, device=device)
        stop = torch.tensor(sorted(self.stop_ids), device=device)
        with torch.inference_mode():
            result = self.model(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1
            )
            repeats = n if self.share_prefix else 1
            cache = self._preallocated(result.past_key_values, repeats, width + steps)
            logits = result.logits[:, -1, :].repeat_interleave(repeats, dim=0)
            attention = torch.zeros((rows, width + steps), dtype=mask.dtype, device=device)
            attention[:, :width] = mask.repeat_interleave(repeats, dim=0)
            position = positions[:, -1:].repeat_interleave(repeats, dim=0)
            for step in range(steps):
                log_probs = torch.log_softmax(logits.float(), dim=-1)
                token = self._sample(logits.float(), sampling, generator)
                token = torch.where(finished, torch.full_like(token, self.pad_id), token)
                sampled[:, step] = token
                logprobs[:, step] = log_probs.gather(-1, token[:, None])[:, 0]
                lengths += (~finished).long()
                finished |= torch.isin(token, stop)
                if bool(finished.all()) or step + 1 == steps:
                    break
                attention[:, width + step] = 1
                position = position + 1
                result = self.model(
                    input_ids=token[:, None],
                    attention_mask=attention,
                    position_ids=position,
                    past_key_values=cache,
                    use_cache=True,
                )
                logits = result.logits[:, -1, :]
        return self._completions(prompts, n, sampled.cpu(), logprobs.cpu(), lengths.cpu())

    def _preallocated(self, prefill: Any, repeats: int, length: int) -> Any:
        """The prompts' key/value cache copied into a `StaticCache` of `length` positions, each row repeated
        `repeats` times: the decode steps then write in place instead of growing every layer's cache by
        concatenation at every token (which copies the whole cache each step)."""
        from transformers import StaticCache

        cache = StaticCache(config=self.model.config, max_cache_len=length)
        for index, layer in enumerate(prefill.layers):
            cache.update(layer.keys.repeat_interleave(repeats, dim=0), layer.values.repeat_interleave(repeats, dim=0), index)
        return cache

    @staticmethod
    def _sample(logits: Any, sampling: SamplingParams, generator: Any) -> Any:
        import torch

        if sampling.temperature <= 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits / sampling.temperature, dim=-1)
        if sampling.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            # Keep the smallest prefix whose mass reaches top_p (the most likely token always stays).
            drop = sorted_probs.cumsum(-1) - sorted_probs >= sampling.top_p
            sorted_probs = sorted_probs.masked_fill(drop, 0.0)
            choice = torch.multinomial(sorted_probs, 1, generator=generator)
            return order.gather(-1, choice)[:, 0]
        return torch.multinomial(probs, 1, generator=generator)[:, 0]

    def _completions(
        self, prompts: list[list[int]], n: int, sampled: Any, logprobs: Any, lengths: Any
    ) -> list[list[Completion]]:
        out = []
        for index, prompt in enumerate(prompts):
            group = []
            for row in range(index * n, index * n + n):
                length = int(lengths[row])
                token_ids = sampled[row, :length].tolist()
                stopped = bool(token_ids) and token_ids[-1] in self.stop_ids
                shown = token_ids[:-1] if stopped else token_ids
                group.append(
                    Completion(
                        text=self.tokenizer.decode(shown, skip_special_tokens=False) if self.tokenizer else "",
                        token_ids=token_ids,
                        logprobs=logprobs[row, :length].tolist(),
                        finish_reason="stop" if stopped else "length",
                        prompt_token_ids=list(prompt),
                    )
                )
            out.append(group)
        return out


def from_spec(rest: str, **options: Any) -> HFPolicy:
    """`hf:PATH_OR_NAME` (`hf:smollm2` is the embedded model); options: device, dtype, batch_size."""
    if not rest:
        raise PolicySpecError("policy spec 'hf:' needs a model: hf:PATH_OR_NAME or hf:smollm2")
    return HFPolicy.from_pretrained(rest, **options)
