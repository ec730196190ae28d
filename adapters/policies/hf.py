"""The transformers generation backend: `HFPolicy` (CPU or CUDA), the embedded default.

A pivot's prompt is a long shared prefix (the conversation so far) followed by n short sampled
actions. `generate` prefills each prompt once and shares its KV cache across the n samples (the
cache's rows repeated n times into a preallocated `StaticCache` that the decode steps fill in
place), instead of recomputing the prefix n times as `model.generate(num_return_sequences=n)`
does. The sampling loop is written out here so every completion carries the exact
log-probability of each sampled token under the model.

Each sampled token is where a uniform draw falls in the token distribution's cumulative mass, the
draws made on the CPU before decoding. With one seed per chat (`SamplingParams.seeds`) a chat's
draws come from its own generator, so its samples are the same whatever batch it is in (up to the
float rounding of batched forward passes), at the speed of batched decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pivot_envs.adapters import chat_template
from pivot_envs.adapters.kv_cache import cache_of, with_cache
from pivot_envs.config import ConfigError
from pivot_envs.errors import PivotEnvsError
from pivot_envs.policy import Completion, PolicySpecError, SamplingParams

EMBEDDED = "smollm2"
MIN_SHARED_HEAD = 16  # a shorter common head is not worth a forward pass of its own


class TokenizerError(PivotEnvsError, ValueError):
    """A model whose tokenizer and generation config define no end-of-sequence token to stop at."""


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
    share_head:  prefill the head a batch's prompts have in common (the system prompt's start,
                 for the pivots of one domain) once for the batch, when it is at least
                 `MIN_SHARED_HEAD` tokens; the samples are those of prefilling each prompt whole,
                 up to float rounding (only with share_prefix).
    stop_token_ids: the ids that end a completion (default: the tokenizer's and the model's
                 end-of-sequence ids and `<|im_end|>`; an empty list never stops early).
    max_prompt_tokens: fit longer prompts to this many tokens (`chat_template.fit_prompt`:
                 tool descriptions, then the oldest turns, then the middle of the longest
                 message are left out); None: only to what the context window leaves.
    context_window: the model's context in tokens (default: the config's max_position_embeddings,
                 else the tokenizer's model_max_length): prompts are fitted to it less the
                 `max_new_tokens` sampled after them (`chat_template.PromptFitter`, one logged notice).

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
        share_head: bool = True,
        stop_token_ids: Sequence[int] | None = None,
        max_prompt_tokens: int | None = None,
        context_window: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"HFPolicy batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.device = str(device) if device is not None else str(next(model.parameters()).device)
        if device is not None:
            self.model.to(device)
        self.batch_size = batch_size
        self.share_prefix = share_prefix
        self.share_head = share_head
        self.max_prompt_tokens = max_prompt_tokens or None
        self.name = name or f"hf:{getattr(model, 'name_or_path', '') or type(model).__name__}"
        self.context_window = context_window or chat_template.context_window(model, tokenizer)
        self.fitter = chat_template.PromptFitter(self.name, self.context_window, self.max_prompt_tokens)
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
            raise TokenizerError(
                f"{self.name}: neither tokenizer nor model defines an end-of-sequence token to stop at"
            )
        return ids

    def encode(self, chat: dict[str, Any], max_new_tokens: int = 0) -> list[int]:
        """The prompt token ids of a chat ({"messages", "tools"}), fitted to leave `max_new_tokens`
        of the context window (and within `max_prompt_tokens`)."""
        return self.encode_all([chat], max_new_tokens)[0]

    def encode_all(self, chats: Sequence[dict[str, Any]], max_new_tokens: int = 0) -> list[list[int]]:
        """`encode` of each chat, with one notice for the lot when some had to be fitted."""
        if self.tokenizer is None:
            raise ValueError(
                f"{self.name} has no tokenizer: it can only generate from token ids (generate_ids)"
            )
        return self.fitter.encode(self.tokenizer, chats, max_new_tokens)

    def generate(
        self, chats: Sequence[dict[str, Any]], n: int, sampling: SamplingParams
    ) -> list[list[Completion]]:
        """n completions for each chat, in order; seeded by `sampling.seeds` (one per chat) or
        `sampling.seed` when given."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        return self.generate_ids(self.encode_all(chats, max(sampling.max_new_tokens, 0)), n, sampling)

    def generate_ids(
        self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams
    ) -> list[list[Completion]]:
        """n completions for each already-tokenized prompt (the engine under `generate`)."""
        import torch

        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        prompts = [list(p) for p in prompts]
        if any(not p for p in prompts):
            raise ValueError("every prompt needs at least one token")
        self.fitter.check(prompts, max(sampling.max_new_tokens, 0))  # never silently past the window
        # The uniform draw behind each sampled token, made on the CPU (the same for every device):
        # n rows per prompt from the prompt's own seed when seeds are given (its samples then do
        # not depend on the batch it is in), else from one generator for the whole call.
        steps = max(sampling.max_new_tokens, 0)
        if sampling.seeds is not None:
            generators = [
                torch.Generator().manual_seed(int(seed)) for seed in sampling.chat_seeds(len(prompts))
            ]
            draws = torch.cat(
                [torch.rand((n, steps), generator=g) for g in generators] or [torch.zeros((0, steps))]
            )
        else:
            generator = torch.Generator()
            if sampling.seed is None:
                generator.seed()
            else:
                generator.manual_seed(int(sampling.seed))
            draws = torch.rand((len(prompts) * n, steps), generator=generator)
        out: list[list[Completion]] = []
        for start in range(0, len(prompts), self.batch_size):
            batch = prompts[start : start + self.batch_size]
            out.extend(self._generate_batch(batch, n, sampling, draws[start * n : (start + len(batch)) * n]))
        return out

    def _generate_batch(
        self, prompts: list[list[int]], n: int, sampling: SamplingParams, draws: Any
    ) -> list[list[Completion]]:
        import torch

        device = torch.device(self.device)
        # Shared: each prompt prefilled once, its cache repeated n times. Naive: n copies prefilled.
        repeats, copies = (n, 1) if self.share_prefix else (1, n)
        rows, steps = len(prompts) * n, max(sampling.max_new_tokens, 0)
        draws = draws.to(device)
        sampled = torch.full((rows, steps), self.pad_id, dtype=torch.long, device=device)
        logprobs = torch.zeros(sampled.shape, dtype=torch.float32, device=device)
        lengths = torch.zeros(rows, dtype=torch.long, device=device)
        finished = torch.zeros(rows, dtype=torch.bool, device=device)
        stop = torch.tensor(sorted(self.stop_ids), device=device)
        with torch.inference_mode():
            layers, mask, logits, positions = self._prefill(prompts, copies, device)
            width = mask.shape[1]
            cache = self._preallocated(layers, repeats, width + steps)
            logits = logits.repeat_interleave(repeats, dim=0)
            attention = torch.zeros((rows, width + steps), dtype=mask.dtype, device=device)
            attention[:, :width] = mask.repeat_interleave(repeats, dim=0)
            position = positions.repeat_interleave(repeats, dim=0)
            for step in range(steps):
                log_probs = torch.log_softmax(logits.float(), dim=-1)
                token = self._sample(logits.float(), sampling, draws[:, step])
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
                    **with_cache(cache),
                    use_cache=True,
                )
                logits = result.logits[:, -1, :]
        return self._completions(
            prompts, n, sampled.cpu(), logprobs.cpu(), lengths.cpu(), sampling.stop or []
        )

    def _prefill(self, prompts: list[list[int]], copies: int, device: Any) -> tuple[list, Any, Any, Any]:
        """The prompts' key/value cache, left-padded so every prompt ends at the same column:
        (per-layer (keys, values), attention mask, last logits, last positions), `copies` rows per
        prompt (the naive way prefills each sample's copy).

        Prompts that share a head of at least MIN_SHARED_HEAD tokens are prefilled together, the
        head once and each tail on top of its cache; the others together, whole. The parts' caches
        are then left-padded (masked) to one width and put back in the prompts' order.
        """
        import torch

        parts = []
        for head, rows in self._head_groups(prompts):
            part = self._prefill_part([prompts[row] for row in rows], head, copies, device)
            parts.append((rows, *part))
        if len(parts) == 1:
            return parts[0][1:]
        width = max(mask.shape[1] for _, _, mask, _, _ in parts)

        def left_pad(tensor: Any, dim: int) -> Any:
            missing = width - tensor.shape[dim]
            if not missing:
                return tensor
            shape = list(tensor.shape)
            shape[dim] = missing
            return torch.cat([torch.zeros(shape, dtype=tensor.dtype, device=tensor.device), tensor], dim=dim)

        order = torch.tensor([row for rows, *_ in parts for row in rows], device=device).argsort()
        layers = [
            tuple(torch.cat([left_pad(part[1][index][kv], 2) for part in parts])[order] for kv in (0, 1))
            for index in range(len(parts[0][1]))
        ]
        mask = torch.cat([left_pad(part[2], 1) for part in parts])[order]
        logits = torch.cat([part[3] for part in parts])[order]
        positions = torch.cat([part[4] for part in parts])[order]
        return layers, mask, logits, positions

    def _prefill_part(
        self, prompts: list[list[int]], head: int, copies: int, device: Any
    ) -> tuple[list, Any, Any, Any]:
        """`_prefill` of prompts sharing their first `head` tokens (0: none), `copies` rows each."""
        import torch

        tails = [prompt[head:] for prompt in prompts]
        width = head + max(len(tail) for tail in tails)
        ids = torch.full((len(prompts), width - head), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        mask[:, :head] = 1
        for row, tail in enumerate(tails):  # left-padded tails: every prompt ends at the same column
            ids[row, ids.shape[1] - len(tail) :] = torch.tensor(tail, dtype=torch.long)
            mask[row, width - len(tail) :] = 1
        ids, mask = (
            ids.to(device).repeat_interleave(copies, dim=0),
            mask.to(device).repeat_interleave(copies, dim=0),
        )
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, head:]  # a tail goes on right after the head
        cache = None
        if head:  # once for the part, its cache then repeated for each prompt's tail
            head_ids = torch.tensor([prompts[0][:head]], dtype=torch.long, device=device)
            cache = cache_of(self.model(input_ids=head_ids, use_cache=True, logits_to_keep=1))
            cache.batch_repeat_interleave(len(prompts))
        result = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            **with_cache(cache),
            use_cache=True,
            logits_to_keep=1,
        )
        layers = [(layer.keys, layer.values) for layer in cache_of(result).layers]
        return layers, mask, result.logits[:, -1, :], positions[:, -1:]

    def _head_groups(self, prompts: list[list[int]]) -> list[tuple[int, list[int]]]:
        """(shared head length, row indices) of the parts `_prefill` prefills: prompts whose first
        MIN_SHARED_HEAD tokens agree go together with their common head (each keeps a tail token);
        the rest together with none. Everything in one part without head sharing."""
        if not (self.share_head and self.share_prefix) or len(prompts) < 2:
            return [(0, list(range(len(prompts))))]
        from pivot_envs.adapters.sft import common_prefix_length

        clusters: dict[tuple[int, ...], list[int]] = {}
        groups, alone = [], []
        for row, prompt in enumerate(prompts):
            if len(prompt) > MIN_SHARED_HEAD:
                clusters.setdefault(tuple(prompt[:MIN_SHARED_HEAD]), []).append(row)
            else:
                alone.append(row)
        for rows in clusters.values():
            if len(rows) < 2:
                alone += rows
                continue
            members = [prompts[row] for row in rows]
            groups.append((min(common_prefix_length(members), min(len(p) for p in members) - 1), rows))
        if alone:
            groups.append((0, sorted(alone)))
        return groups

    def _preallocated(self, layers: list, repeats: int, length: int) -> Any:
        """The prompts' key/value cache copied into a `StaticCache` of `length` positions, each row repeated
        `repeats` times: the decode steps then write in place instead of growing every layer's cache by
        concatenation at every token (which copies the whole cache each step)."""
        from transformers import StaticCache

        cache = StaticCache(config=self.model.config, max_cache_len=length)
        for index, (keys, values) in enumerate(layers):
            cache.update(
                keys.repeat_interleave(repeats, dim=0), values.repeat_interleave(repeats, dim=0), index
            )
        return cache

    @staticmethod
    def _sample(logits: Any, sampling: SamplingParams, draws: Any) -> Any:
        """One token per row: greedy at temperature 0, else the token where each row's uniform
        draw falls in the cumulative mass of the distribution left by top-k, min-p and top-p, in
        vLLM's order (inverse-CDF sampling, so a row's token depends on its own draw and logits only)."""
        import torch

        if sampling.temperature <= 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits / sampling.temperature, dim=-1)
        if sampling.top_k and sampling.top_k < probs.shape[-1]:
            kth = probs.topk(sampling.top_k, dim=-1).values[:, -1:]
            probs = probs.masked_fill(probs < kth, 0.0)
        if sampling.min_p > 0:
            probs = probs.masked_fill(probs < sampling.min_p * probs.amax(dim=-1, keepdim=True), 0.0)
        if sampling.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            # Keep the smallest prefix whose mass reaches top_p of what is left (the most likely token always stays).
            drop = sorted_probs.cumsum(-1) - sorted_probs >= sampling.top_p * sorted_probs.sum(
                -1, keepdim=True
            )
            choice = _inverse_cdf(sorted_probs.masked_fill(drop, 0.0), draws)
            return order.gather(-1, choice[:, None])[:, 0]
        return _inverse_cdf(probs, draws)

    def _completions(
        self, prompts: list[list[int]], n: int, sampled: Any, logprobs: Any, lengths: Any, stop: Sequence[str]
    ) -> list[list[Completion]]:
        out = []
        for index, prompt in enumerate(prompts):
            group = []
            for row in range(index * n, index * n + n):
                length = int(lengths[row])
                token_ids = sampled[row, :length].tolist()
                stopped = bool(token_ids) and token_ids[-1] in self.stop_ids
                shown = token_ids[:-1] if stopped else token_ids
                text = self.tokenizer.decode(shown, skip_special_tokens=False) if self.tokenizer else ""
                cut = self._stop_string_end(shown, text, stop)
                if cut is not None:  # tokens after a stop string were sampled but are not the completion's
                    length, stopped = cut, True
                    token_ids = token_ids[:length]
                    text = _before_first(text, stop)
                group.append(
                    Completion(
                        text=text,
                        token_ids=token_ids,
                        logprobs=logprobs[row, :length].tolist(),
                        finish_reason="stop" if stopped else "length",
                        prompt_token_ids=list(prompt),
                    )
                )
            out.append(group)
        return out

    def _stop_string_end(self, token_ids: list[int], text: str, stop: Sequence[str]) -> int | None:
        """How many tokens it takes for the decoded text to hold one of the `stop` strings (None: it never does).

        A row samples independently of what follows its tokens, so stopping there afterwards gives the
        completion that stopping while decoding would have given."""
        if not stop or not any(s in text for s in stop):
            return None
        for length in range(1, len(token_ids) + 1):
            if any(s in self.tokenizer.decode(token_ids[:length], skip_special_tokens=False) for s in stop):
                return length
        return None


def _before_first(text: str, stop: Sequence[str]) -> str:
    """`text` up to the earliest occurrence of any of the `stop` strings."""
    return text[: min(text.find(s) for s in stop if s in text)]


def _inverse_cdf(weights: Any, draws: Any) -> Any:
    """Per row, the first index whose cumulative weight exceeds the row's draw (in [0, 1)) times
    the row's total: index i with probability weights[i] / total; a zero weight is never picked."""
    import torch

    cdf = weights.cumsum(-1)
    total = cdf[:, -1:]
    # Just below the total, so a product rounded up cannot land past the last token of positive weight.
    target = torch.minimum(
        draws[:, None].to(cdf.dtype) * total, torch.nextafter(total, torch.zeros_like(total))
    )
    return torch.searchsorted(cdf, target, right=True)[:, 0]


def from_spec(rest: str, **options: Any) -> HFPolicy:
    """`hf:PATH_OR_NAME` (`hf:smollm2` is the embedded model); options: device, dtype, batch_size."""
    if not rest:
        raise PolicySpecError("policy spec 'hf:' needs a model: hf:PATH_OR_NAME or hf:smollm2")
    return HFPolicy.from_pretrained(rest, **options)
