"""Verifiers score a parsed action at a pivot: verify(pivot, action, outcome) -> Verdict.

The strict exact-match verifier (the paper's ablation baseline, Eq. 2) lives here; functional
verifiers live in their domains. So does the rule the search, terminal and SWE verifiers share for
the text a turn says beside its tool calls (`text_beside_calls_too_long`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pivot_envs.chat import canonical_action
from pivot_envs.config import ConfigError

if TYPE_CHECKING:
    from pivot_envs.pivot import Pivot


@dataclass
class Verdict:
    """The result of verifying one action.

    reward:   in [0, 1] (1 = locally acceptable, paper Eq. 6).
    category: why ("correct", "unparseable", "unexpected_tool", ...).
    detail:   a human-readable explanation.
    valid:    False when the infrastructure failed (sandbox, backend), not the action; such
              samples must be masked out of group statistics, never counted as reward 0.
    """

    reward: float
    category: str
    detail: str = ""
    valid: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


# The text beside a turn's calls may be this many characters longer than the expert's (whitespace runs
# counted as one): room for "Let me search for X." or a few sentences of reasoning, not a report.
CALL_TEXT_EXTRA_CHARS = 300
_SPACE = re.compile(r"\s+")


def text_chars(text: str) -> int:
    """A text's length in characters, each whitespace run counted as one."""
    return len(_SPACE.sub(" ", text).strip())


def check_call_text_extra_chars(owner: str, extra_chars: Any) -> int:
    """`extra_chars` when it is an integer >= 0, else a ConfigError naming `owner` and the option."""
    if isinstance(extra_chars, bool) or not isinstance(extra_chars, int) or extra_chars < 0:
        raise ConfigError(f"{owner}: call_text_extra_chars must be an integer >= 0, got {extra_chars!r}")
    return extra_chars


def text_beside_calls_too_long(text: str, expert_text: str, extra_chars: int) -> Verdict | None:
    """The text a turn says beside its tool calls, against the expert's text beside its calls: None when
    it is the expert's or at most `extra_chars` characters longer (`text_chars`), else the verdict that
    refuses it (0, "call_text_too_long"). The calls decide a tool turn; this bounds what it may say beside
    them, so a stuffed report beside the right call earns nothing."""
    if text == expert_text:
        return None
    length, expert_length = text_chars(text), text_chars(expert_text)
    if length <= expert_length + extra_chars:
        return None
    return Verdict(
        0.0,
        "call_text_too_long",
        f"the text beside the calls is {length} characters, the expert's {expert_length}: at most "
        f"{extra_chars} more (call_text_extra_chars)",
    )


@runtime_checkable
class Verifier(Protocol):
    """Scores an action (an assistant message in canonical form) at a pivot."""

    name: str

    def verify(self, pivot: Pivot, action: dict[str, Any], outcome: Any = None) -> Verdict: ...


class StrictVerifier:
    """Reward 1 only when the action equals the expert's in canonical form (paper Eq. 2)."""

    name = "strict"

    def verify(self, pivot: Pivot, action: dict[str, Any], outcome: Any = None) -> Verdict:
        if canonical_action(action) == canonical_action(pivot.expert):
            return Verdict(1.0, "exact_match")
        return Verdict(0.0, "not_exact_match", "the action differs from the expert's in canonical form")
