"""Render a pivot's chat (messages + tools) into a generation prompt for any tokenizer.

Tokenizers whose chat template speaks tools (it references `tools`) get the canonical chat
form through `apply_chat_template(messages, tools=...)`. Templates that do not (SmolLM2, the
embedded default, ignores `tools` and fails on `content=None` and on role `tool`) get the
messages normalised Hermes-style first: the tools are described in the system prompt inside
`<tools>` with the instruction to answer with `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
blocks, assistant tool calls become such blocks in the content, and tool replies become
`<tool_response>` blocks in a user turn. Domain parsers read the same `<tool_call>` blocks back.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from pivot_envs.chat import parse_arguments, text_of, tool_to_chat
from pivot_envs.errors import PivotEnvsError

log = logging.getLogger(__name__)


class ChatTemplateError(PivotEnvsError, ValueError):
    """A model whose tokenizer has no chat template, or one that cannot cut an assistant turn out of a chat."""


TOOLS_PREAMBLE = (
    "# Tools\n\n"
    "You can call functions to help with the request. Their signatures are listed, one JSON "
    "object per line, inside <tools></tools> tags:\n<tools>\n{tools}\n</tools>\n\n"
    "To call a function, answer with one block per call, each holding a JSON object with the "
    "function's name and its arguments:\n"
    '<tool_call>\n{{"name": "<function name>", "arguments": {{<arguments as a JSON object>}}}}\n</tool_call>\n'
    "To reply to the user instead, answer with plain text."
)


def template_speaks_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders the `tools` argument itself."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the default one is what renders
        template = template.get("default") or template.get("tool_use") or ""
    return isinstance(template, str) and "tools" in template


def tools_block(tools: Sequence[dict[str, Any]]) -> str:
    """The system-prompt section describing `tools` Hermes-style."""
    lines = "\n".join(json.dumps(tool_to_chat(tool), ensure_ascii=False) for tool in tools)
    return TOOLS_PREAMBLE.format(tools=lines)


def tool_call_block(name: str, arguments: Any) -> str:
    """One `<tool_call>` block; arguments that are not valid JSON are kept as their raw string."""
    parsed, _ = parse_arguments(arguments)
    return (
        "<tool_call>\n"
        + json.dumps({"name": name, "arguments": parsed}, ensure_ascii=False)
        + "\n</tool_call>"
    )


def _assistant_text(message: dict[str, Any]) -> str:
    parts = [text_of(message)] if text_of(message) else []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call) if isinstance(call, dict) else {}
        parts.append(tool_call_block(str(function.get("name", "")), function.get("arguments")))
    return "\n".join(parts)


def _content_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ("" if content is None else json.dumps(content))


def prompt_messages(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """The messages normalised for a template that does not speak tools.

    Returns plain {"role", "content": str} messages (roles system/user/assistant only): the
    tools described in the system prompt (added if there is none), assistant tool calls as
    `<tool_call>` blocks, and consecutive tool replies merged into one user turn of
    `<tool_response>` blocks. Reasoning content is dropped (it is not part of the state shown).
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "tool":
            block = "<tool_response>\n" + _content_text(message) + "\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool": True})
        elif role == "assistant":
            out.append({"role": "assistant", "content": _assistant_text(message)})
        elif role in ("system", "developer"):
            out.append({"role": "system", "content": _content_text(message)})
        else:
            out.append({"role": str(role or "user"), "content": _content_text(message)})
    for message in out:
        message.pop("_tool", None)
    if tools:
        section = tools_block(tools)
        if out and out[0]["role"] == "system":
            out[0]["content"] = (out[0]["content"].rstrip() + "\n\n" + section).lstrip()
        else:
            out.insert(0, {"role": "system", "content": section})
    return out


def _native_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Canonical messages prepared for a tool-aware template: arguments as objects, no None content."""
    out = []
    for message in messages:
        message = dict(message)
        if message.get("content") is None:
            message["content"] = ""
        if message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                function = dict(call.get("function", call))
                function["arguments"], _ = parse_arguments(function.get("arguments"))
                calls.append({**call, "type": "function", "function": function})
            message["tool_calls"] = calls
        out.append(message)
    return out


def render_prompt(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
) -> str:
    """The generation prompt for a chat: the rendered messages ending with the assistant header."""
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat template"
        )
    if template_speaks_tools(tokenizer):
        return tokenizer.apply_chat_template(
            _native_messages(messages),
            tools=[tool_to_chat(tool) for tool in tools] if tools else None,
            add_generation_prompt=True,
            tokenize=False,
        )
    return tokenizer.apply_chat_template(
        prompt_messages(messages, tools), add_generation_prompt=True, tokenize=False
    )


def encode_prompt(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    max_tokens: int | None = None,
) -> list[int]:
    """The token ids of `render_prompt` (the template already holds the special tokens).

    With `max_tokens`, a prompt longer than that is fitted to it by `fit_prompt`.
    """
    ids = _token_ids(tokenizer, render_prompt(tokenizer, messages, tools))
    if not max_tokens or len(ids) <= max_tokens:
        return ids
    ids = _token_ids(tokenizer, fit_prompt(tokenizer, messages, tools, max_tokens))
    return ids[-max_tokens:]  # last resort when even the kept parts exceed the budget


def encode_action(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    action: dict[str, Any],
) -> list[int]:
    """The token ids a policy would generate for the assistant message `action` after `messages`:
    the template's rendering of the chat with `action` appended, less the generation prompt, up to
    and including its end-of-turn tokens (what SFT on expert turns trains on)."""
    prompt = render_prompt(tokenizer, messages, tools)
    chat = [*messages, action]
    if template_speaks_tools(tokenizer):
        full = tokenizer.apply_chat_template(
            _native_messages(chat),
            tools=[tool_to_chat(tool) for tool in tools] if tools else None,
            tokenize=False,
        )
    else:
        full = tokenizer.apply_chat_template(prompt_messages(chat, tools), tokenize=False)
    if not full.startswith(prompt):
        raise ChatTemplateError(
            f"the chat template of {getattr(tokenizer, 'name_or_path', tokenizer)!r} does not render an assistant "
            "turn as a continuation of its generation prompt, so the expert turn's tokens cannot be cut out"
        )
    return _token_ids(tokenizer, full[len(prompt) :].rstrip("\n"))


def _token_ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def compact_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool schema without descriptions and titles (names, types and required fields stay)."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in ("description", "title")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(tool_to_chat(tool))


def _cut_middle(text: str, keep: int) -> str:
    """`text` with its middle replaced by a marker, keeping about `keep` characters."""
    keep = max(0, keep)
    if keep >= len(text):
        return text
    head, tail = text[: keep // 2], text[len(text) - (keep - keep // 2) :] if keep else ""
    return f"{head}\n[... {len(text) - keep} characters left out ...]\n{tail}"


def fit_prompt(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    max_tokens: int,
) -> str:
    """Render a chat within `max_tokens`, leaving out only as much as needed, in this order:
    tool descriptions; the oldest turns after the system prompt (the last turn always stays);
    then the middle of the longest remaining message (a marker says how much went).

    For small models on a CPU budget: the state is shortened, so use it knowingly (the policy's
    `max_prompt_tokens`, off by default). Prompts within the budget are rendered unchanged.
    """

    def size(text: str) -> int:
        return len(_token_ids(tokenizer, text))

    text = render_prompt(tokenizer, messages, tools)
    if size(text) <= max_tokens:
        return text
    tools = [compact_tool(tool) for tool in tools or []]
    native = template_speaks_tools(tokenizer)
    # On templates without tool support the tools live in the system prompt, which may be cut too.
    chat = _native_messages(messages) if native else prompt_messages(messages, tools)
    shown_tools = tools if native else None

    def render(chat: list[dict[str, Any]]) -> str:
        if native:
            return render_prompt(tokenizer, chat, shown_tools)
        return tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)

    text = render(chat)
    if size(text) <= max_tokens:
        return text
    head = 1 if chat and chat[0].get("role") in ("system", "developer") else 0
    lo, hi = 0, max(0, len(chat) - head - 1)  # turns to drop: find the fewest that fit
    while lo < hi:
        mid = (lo + hi) // 2
        if size(render(chat[:head] + chat[head + mid :])) <= max_tokens:
            hi = mid
        else:
            lo = mid + 1
    chat = [dict(m) for m in chat[:head] + chat[head + lo :]]
    text = render(chat)
    for _ in range(6):
        excess = size(text) - max_tokens
        if excess <= 0:
            break
        candidates = [m for m in chat if isinstance(m.get("content"), str) and m["content"]]
        if not candidates:
            break
        longest = max(candidates, key=lambda m: len(m["content"]))
        content = longest["content"]
        chars_per_token = len(content) / max(1, size(content))
        longest["content"] = _cut_middle(content, len(content) - int((excess + 32) * chars_per_token))
        text = render(chat)
    return text


class PromptTooLongError(PivotEnvsError, ValueError):
    """A prompt that fitting cannot bring within the tokens the model's context window leaves for it."""


# Tokenizers that know no limit say 1e30 (transformers' VERY_LARGE_INTEGER): no context window is that long.
SANE_CONTEXT = 10_000_000


def _sane(value: Any) -> int | None:
    return value if isinstance(value, int) and 0 < value <= SANE_CONTEXT else None


def context_window(model: Any = None, tokenizer: Any = None) -> int | None:
    """A model's context window in tokens: its config's (or, given a config, that one's)
    `max_position_embeddings`, else the tokenizer's `model_max_length`; None where neither is known (or sane)."""
    config = getattr(model, "config", model)
    return _sane(getattr(config, "max_position_embeddings", None)) or _sane(
        getattr(tokenizer, "model_max_length", None)
    )


class PromptFitter:
    """Fits a policy's prompts to what its model can take: `min(max_prompt_tokens, context -
    max_new_tokens)` tokens, by `fit_prompt` (tool descriptions, the oldest turns, then the middle of
    the longest message are left out). The first time it cuts, it logs one notice (per fitter, so per
    policy) saying how many prompts were cut and naming `--max-prompt-tokens`; `fitted` counts them
    all. A prompt it cannot fit raises a one-line PromptTooLongError before anything is generated.

    name:              the policy's name, for messages.
    context:           the model's context window (None: unknown, only `max_prompt_tokens` applies).
    max_prompt_tokens: the user's budget (None: the context window's room alone).
    """

    def __init__(self, name: str, context: int | None, max_prompt_tokens: int | None) -> None:
        self.name, self.context, self.max_prompt_tokens = name, context, max_prompt_tokens or None
        self.fitted = 0
        self.noticed = False

    def budget(self, max_new_tokens: int = 0) -> int | None:
        """The most tokens a prompt may have before `max_new_tokens` are sampled after it (None: no limit)."""
        if self.context is None:
            return self.max_prompt_tokens
        room = self.context - max(0, max_new_tokens)
        if room < 1:
            raise PromptTooLongError(
                f"{self.name}: {max_new_tokens} new tokens leave no room for a prompt in the model's "
                f"context window of {self.context} tokens; lower --max-new-tokens"
            )
        return min(room, self.max_prompt_tokens) if self.max_prompt_tokens else room

    def limit(self, max_new_tokens: int) -> str:
        """What sets the budget, in words."""
        if self.context is None or (
            self.max_prompt_tokens and self.max_prompt_tokens <= self.budget(max_new_tokens)
        ):
            return f"--max-prompt-tokens {self.max_prompt_tokens}"
        return f"the model's context window of {self.context} tokens less {max(0, max_new_tokens)} new tokens"

    def check(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
        """Raise PromptTooLongError if a tokenized prompt leaves no room for `max_new_tokens` in the context."""
        if self.context is None:
            return
        room = self.context - max(0, max_new_tokens)
        longest = max((len(prompt) for prompt in prompts), default=0)
        if longest > room:
            raise PromptTooLongError(
                f"{self.name}: a prompt of {longest} tokens leaves no room for {max_new_tokens} new tokens in "
                f"the model's context window of {self.context}; fit it first (--max-prompt-tokens)"
            )

    def encode(
        self, tokenizer: Any, chats: Sequence[dict[str, Any]], max_new_tokens: int = 0
    ) -> list[list[int]]:
        """The prompt token ids of each chat ({"messages", "tools"}), each within `budget(max_new_tokens)`."""
        budget = self.budget(max_new_tokens)
        prompts, cut = [], 0
        for chat in chats:
            messages, tools = chat["messages"], chat.get("tools") or []
            ids = _token_ids(tokenizer, render_prompt(tokenizer, messages, tools))
            if budget is not None and len(ids) > budget:
                whole = len(ids)
                ids = _token_ids(tokenizer, fit_prompt(tokenizer, messages, tools, budget))
                if len(ids) > budget:
                    raise PromptTooLongError(
                        f"{self.name}: a prompt of {whole} tokens cannot be fitted to {budget} "
                        f"({self.limit(max_new_tokens)}): what must stay takes {len(ids)}; "
                        "raise --max-prompt-tokens or lower --max-new-tokens"
                    )
                cut += 1
            prompts.append(ids)
        self.fitted += cut
        if cut and not self.noticed:
            self.noticed = True
            log.warning(
                "%s: %d of %d prompts were longer than the %d tokens left for a prompt (%s) and were fitted "
                "(older turns, then the middle of long messages, left out); later fits are not logged. "
                "Set --max-prompt-tokens to choose the budget",
                self.name,
                cut,
                len(chats),
                budget,
                self.limit(max_new_tokens),
            )
        return prompts
