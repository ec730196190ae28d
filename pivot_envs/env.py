"""PivotEnv: one pivot, one action, one verdict (a single-step gymnasium.Env)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
from gymnasium.error import ResetNeeded

from pivot_envs.errors import PivotEnvsError
from pivot_envs.pivot import Pivot
from pivot_envs.spaces import Chat, Completion
from pivot_envs.verifiers import StrictVerifier, Verdict, Verifier


class InfrastructureError(PivotEnvsError, RuntimeError):
    """The environment (sandbox, tool backend), not the action, failed; the sample is invalid."""


@dataclass
class ParsedAction:
    """A parsed action: the assistant message in canonical form, or why parsing failed."""

    message: dict[str, Any] | None
    category: str = "ok"
    detail: str = ""


@dataclass
class Outcome:
    """What executing an action produced: messages appended to the observation (tool results),
    the output shown in `info["output"]`, and domain data for the verifier."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    output: Any = None
    data: dict[str, Any] = field(default_factory=dict)
    valid: bool = True
    detail: str = ""


PivotSource = str | os.PathLike | Iterable[Pivot] | Iterable[dict] | None


class PivotEnv(gym.Env):
    """A single-step environment at the pivots of expert trajectories.

    reset(seed, options) picks a pivot: `options={"pivot": id}`, `options={"index": i}`, or a
    draw from `self.np_random` (so two envs reset with the same seed pick the same pivot); it
    restores the pivot's state (for sandboxed domains: the filesystem and shell after the
    expert's earlier commands) and returns the observation {"messages": s_t, "tools"} and
    info {"pivot_id"}.

    step(action) takes raw completion text or an assistant message dict, parses it with the
    domain's parser, executes it (tool backend, sandbox), verifies it, and returns
    (observation after the action, reward, terminated=True, truncated=False, info) with
    info["category"] (the verdict's category), info["parsed"] (the assistant message, or None
    if unparseable), info["valid"] (False when the infrastructure failed: mask such samples
    out, never count them as reward 0), info["strict_reward"] (Eq. 2), info["output"] and
    info["detail"].

    The current pivot is `self.pivot`; the whole set is `self.pivots`. Domains subclass this and
    override `default_pivots`, `parse`, `restore`, `execute` and the `verifiers` table.
    """

    metadata = {"render_modes": ["ansi"]}
    domain: str = "generic"
    default_verifier: str = "strict"
    verifiers: dict[str, Callable[..., Verifier]] = {"strict": StrictVerifier}

    def __init__(
        self,
        pivots: PivotSource = None,
        verifier: str | Verifier | None = None,
        verifier_config: dict[str, Any] | None = None,
        render_mode: str | None = None,
    ) -> None:
        self.pivots: list[Pivot] = self._load_pivots(pivots)
        if not self.pivots:
            raise ValueError(f"{type(self).__name__}: the pivot set is empty")
        self._by_id = {pivot.id: i for i, pivot in enumerate(self.pivots)}
        self.verifier: Verifier = self._make_verifier(verifier or self.default_verifier, verifier_config or {})
        self.strict_verifier = StrictVerifier()
        self.observation_space = Chat()
        self.action_space = Completion()
        self.render_mode = render_mode
        self.pivot: Pivot | None = None
        self._last: dict[str, Any] | None = None
        self._stepped = False

    # -- domain hooks -------------------------------------------------------------------------

    def default_pivots(self) -> list[Pivot]:
        """The domain's bundled pivots, used when no `pivots` are given."""
        raise ValueError(f"{type(self).__name__} has no bundled pivots: pass pivots=PATH")

    def parse(self, action: Any) -> ParsedAction:
        """Turn a raw completion or a message dict into a canonical assistant message."""
        if isinstance(action, dict):
            return ParsedAction({"role": "assistant", **{k: v for k, v in action.items() if k != "role"}})
        if isinstance(action, str):
            return ParsedAction({"role": "assistant", "content": action})
        return ParsedAction(None, "unparseable", f"an action must be text or a message dict, got {type(action).__name__}")

    def restore(self, pivot: Pivot) -> None:
        """Restore the state at `pivot` (nothing to do for pure chat domains)."""

    def execute(self, pivot: Pivot, action: dict[str, Any]) -> Outcome:
        """Execute a parsed action at the restored state; raise InfrastructureError on env failure."""
        return Outcome()

    # -- gymnasium API --------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        options = options or {}
        if "pivot" in options:
            if options["pivot"] not in self._by_id:
                raise KeyError(f"unknown pivot id {options['pivot']!r} ({len(self.pivots)} pivots in this env)")
            index = self._by_id[options["pivot"]]
        elif "index" in options:
            index = int(options["index"])
            if not 0 <= index < len(self.pivots):
                raise IndexError(f"pivot index {index} out of range [0, {len(self.pivots)})")
        else:
            index = int(self.np_random.integers(len(self.pivots)))
        self.pivot = self.pivots[index]
        self._stepped = False
        self._last = None
        self.restore(self.pivot)
        return self.pivot.observation, {"pivot_id": self.pivot.id, "index": index}

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        if self.pivot is None or self._stepped:
            raise ResetNeeded("call reset() before step(): a pivot episode is one step long")
        pivot = self.pivot
        self._stepped = True
        try:
            parsed = self.parse(action)
        except Exception as error:  # a parser bug must not crash a training run; report it
            parsed = ParsedAction(None, "unparseable", f"parser error: {error!r}")
        if parsed.message is None:
            text = action if isinstance(action, str) else repr(action)
            verdict, strict, outcome = Verdict(0.0, parsed.category, parsed.detail), 0.0, Outcome()
            shown = {"role": "assistant", "content": text}
        else:
            shown = parsed.message
            try:
                outcome = self.execute(pivot, parsed.message)
            except InfrastructureError as error:
                outcome = Outcome(valid=False, detail=str(error))
            if outcome.valid:
                verdict = self.verifier.verify(pivot, parsed.message, outcome)
            else:
                verdict = Verdict(0.0, "infrastructure_error", outcome.detail, valid=False)
            strict = self.strict_verifier.verify(pivot, parsed.message).reward
        observation = {"messages": [*pivot.messages, shown, *outcome.messages], "tools": pivot.tools}
        info = {
            "pivot_id": pivot.id,
            "category": verdict.category,
            "detail": verdict.detail,
            "parsed": parsed.message,
            "valid": bool(verdict.valid and outcome.valid),
            "strict_reward": float(strict),
            "output": outcome.output,
        }
        self._last = {"action": shown, "reward": verdict.reward, "info": info}
        return observation, float(verdict.reward), True, False, info

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self.pivot is None:
            return None
        lines = [f"pivot {self.pivot.id} ({self.domain})"]
        lines += [f"[{m.get('role')}] {str(m.get('content'))[:200]}" for m in self.pivot.messages[-3:]]
        if self._last:
            lines.append(f"action: {str(self._last['action'].get('content'))[:200]}")
            lines.append(f"reward {self._last['reward']} ({self._last['info']['category']})")
        return "\n".join(lines)

    # -- helpers ----------------------------------------------------------------------------------

    def _load_pivots(self, pivots: PivotSource) -> list[Pivot]:
        if pivots is None:
            return list(self.default_pivots())
        if isinstance(pivots, (str, os.PathLike)):
            return load_pivot_file(pivots, domain=self.domain)
        return [p if isinstance(p, Pivot) else Pivot.from_dict(p) for p in pivots]

    def _make_verifier(self, verifier: str | Verifier, config: dict[str, Any]) -> Verifier:
        if not isinstance(verifier, str):
            return verifier
        if verifier not in self.verifiers:
            raise ValueError(
                f"unknown verifier {verifier!r} for {type(self).__name__}; choose one of {sorted(self.verifiers)}"
            )
        factory = self.verifiers[verifier]
        return factory(**config) if config else factory()


def load_pivot_file(path: str | os.PathLike, domain: str = "") -> list[Pivot]:
    """Pivots from a file: our pivot JSONL, or any trajectory format `pivot_envs.formats` reads."""
    from pivot_envs.formats import read_as_pivots

    return read_as_pivots(path, domain=domain)
