"""Verifiers score a parsed action at a pivot: verify(pivot, action, outcome) -> Verdict.

The strict exact-match verifier (the paper's ablation baseline, Eq. 2) lives here; functional
verifiers live in their domains.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pivot_envs.chat import canonical_action

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
