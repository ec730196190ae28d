"""The Policy protocol: what generation backends (adapters) implement.

The core uses policies for profiling and judging; `pivot_envs.adapters` implements them (hf,
openai, vllm). A chat is an env observation: {"messages": [...], "tools": [...]}.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pivot_envs.config import ConfigError
from pivot_envs.errors import PivotEnvsError


@dataclass
class SamplingParams:
    """How to sample: temperature 0 means greedy.

    `top_k` keeps the k most likely tokens (0: all), `min_p` the tokens at least `min_p` times as
    likely as the most likely one (0: all), `top_p` the smallest set holding that much mass; the
    filters apply together, as in vLLM. `stop` ends a completion at the first of these strings: its
    text stops before the string, its `token_ids` end with the token that completed it.

    `seed` seeds a whole generate call. `seeds`, when given, holds one seed per chat: chat i's n
    samples are drawn from `seeds[i]` alone, so they are the same whatever other chats share the
    call (the profiler seeds each pivot this way, and a resumed run samples what an uninterrupted
    one did). A backend that cannot seed per chat uses `seed`.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = None
    seeds: list[int] | None = None
    top_k: int = 0
    min_p: float = 0.0
    stop: list[str] | None = None

    def __post_init__(self) -> None:
        if self.top_k < 0:
            raise ConfigError(f"sampling.top_k must be >= 0 (0 keeps every token), got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ConfigError(f"sampling.min_p must be in [0, 1], got {self.min_p}")
        if self.stop is not None and (
            isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop)
        ):
            raise ConfigError(f"sampling.stop must be a list of non-empty strings, got {self.stop!r}")

    def chat_seeds(self, chats: int) -> list[int | None]:
        """The seed of each of `chats` chats: `seeds` (checked to hold one per chat), else `seed` for all."""
        if self.seeds is None:
            return [self.seed] * chats
        if len(self.seeds) != chats:
            raise ValueError(
                f"sampling.seeds holds {len(self.seeds)} seeds for {chats} chats: it needs one per chat"
            )
        return list(self.seeds)


@dataclass
class Completion:
    """One sampled action: its text, the sampled token ids and their logprobs under the policy.

    `prompt_token_ids` are the ids of the rendered prompt the action was sampled after (set by
    local backends), so a trainer trains on exactly the tokens that were sampled.

    `message` is set when the backend already parsed the turn (an OpenAI-compatible server's
    assistant message with `tool_calls`); envs accept either the text or the message.
    """

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    message: dict[str, Any] | None = None
    finish_reason: str = ""
    prompt_token_ids: list[int] = field(default_factory=list)

    @property
    def action(self) -> str | dict[str, Any]:
        """What to pass to `env.step`."""
        return self.message if self.message is not None else self.text


@runtime_checkable
class Policy(Protocol):
    """Generates n completions for each chat."""

    name: str

    def generate(
        self, chats: Sequence[dict[str, Any]], n: int, sampling: SamplingParams
    ) -> list[list[Completion]]: ...


POLICY_GROUP = "pivot_envs.policies"
SPEC_FORMS = (
    "hf:PATH_OR_NAME, hf:smollm2, openai:BASE_URL[,BASE_URL...]#MODEL, vllm:PATH, "
    "vllm-server:BASE_URL[,BASE_URL...]#MODEL, vllm-server:PATH"
)


class PolicySpecError(PivotEnvsError, ValueError):
    """A policy spec that names no installed backend or is malformed; the message lists the accepted forms."""


def load_policy(spec: str, **options: Any) -> Policy:
    """Build a Policy from a spec `SCHEME:REST` (see SPEC_FORMS); options go to the backend.

    Schemes are the entry points of the group `pivot_envs.policies`, each a factory
    `from_spec(rest, **options) -> Policy`, so third-party backends plug in the same way.
    """
    from importlib.metadata import entry_points

    scheme, sep, rest = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    backends = {ep.name: ep for ep in entry_points(group=POLICY_GROUP)}
    if not sep or not rest or scheme not in backends:
        known = ", ".join(sorted(backends)) or "none installed"
        raise PolicySpecError(f"bad policy spec {spec!r}: expected one of {SPEC_FORMS} (schemes: {known})")
    factory = backends[scheme].load()
    return factory(rest, **options)
