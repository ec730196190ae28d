"""An LLM-judge verifier any domain can use: is a candidate action as good as the expert's here?

The judge is any Policy (a spec such as `hf:smollm2` or `openai:URL#MODEL`, or a Policy object),
sampled greedily. It sees the conversation so far, the expert's action and the candidate action,
and must end its answer with `VERDICT: ACCEPT` or `VERDICT: REJECT` (see JUDGE_PROMPT). An
answer with no readable verdict is a typed result (category "judge_unparseable", valid=False:
the judge failed, not the action), never an exception; so is a judge that cannot be reached
("judge_error"). Verdicts are cached by (pivot id, canonical action), in memory and optionally
in a JSONL file that later runs read back.

`JudgedVerifier` adds the judge to a domain's functional verifier: the judge decides the samples
the functional verifier rejected (optionally only some categories, e.g. free-text messages).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pivot_envs.chat import calls_of, canonical_action, text_of
from pivot_envs.config import option
from pivot_envs.policy import Policy, SamplingParams, load_policy
from pivot_envs.verifiers import Verdict, Verifier

if TYPE_CHECKING:
    from pivot_envs.pivot import Pivot

JUDGE_PROMPT = """You are checking one step of an AI agent that talks to a user and calls tools.
Below are the conversation so far, the action a skilled expert took next, and a candidate action.
The candidate is acceptable if it does what the expert's action does at this point: the same tool \
with equivalent arguments, or a message with the same substance (the same question, information or \
decision), even if worded differently. It is not acceptable if it calls another tool, uses \
different argument values, skips a needed step, or tells the user something different.

## Conversation so far
{state}

## Expert action
{expert}

## Candidate action
{candidate}

Think briefly, then end your answer with exactly one line:
VERDICT: ACCEPT
or
VERDICT: REJECT"""

_VERDICT = re.compile(r"verdict\W{0,6}(accept|reject)", re.IGNORECASE)


def parse_verdict(text: str) -> bool | None:
    """True for ACCEPT, False for REJECT, None when the answer holds no verdict (the last one counts)."""
    found = _VERDICT.findall(text or "")
    return found[-1].lower() == "accept" if found else None


def render_action(message: dict[str, Any]) -> str:
    """An assistant action as judge-readable text: its message text and its tool calls as JSON."""
    parts = []
    if text_of(message):
        parts.append(f"message: {text_of(message)}")
    for name, arguments in calls_of(message):
        parts.append(
            "tool call: "
            + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False, sort_keys=True)
        )
    return "\n".join(parts) or "(empty)"


def render_state(messages: Sequence[dict[str, Any]], max_chars: int) -> str:
    """The conversation as `[role] text` lines, keeping the most recent `max_chars` characters."""
    lines = []
    for message in messages:
        role = message.get("role", "")
        if role == "assistant":
            lines.append(f"[assistant] {render_action(message)}")
        else:
            content = message.get("content")
            text = content if isinstance(content, str) else text_of(message)
            lines.append(f"[{role}] {text}")
    state = "\n".join(lines)
    return state if len(state) <= max_chars else "...\n" + state[-max_chars:]


@dataclass
class JudgeConfig:
    """Options of the LLM judge."""

    policy: str = option("hf:smollm2", "policy spec of the judge model (hf:..., openai:URL#MODEL, vllm:...)")
    max_new_tokens: int = option(256, "token budget of one judgement")
    max_state_chars: int = option(6000, "the conversation shown to the judge is cut to its last N characters")
    cache_path: str | None = option(None, "JSONL file persisting verdicts across runs (None: memory only)")


class JudgeVerifier:
    """Scores an action 1.0 when the judge accepts it, 0.0 when it rejects it (a Verifier).

    policy:      a Policy or a policy spec (built on first use).
    cache_path:  JSONL file of verdicts, read at start and appended to (flushed) as verdicts come.
    """

    name = "judge"

    def __init__(
        self,
        policy: Policy | str = "hf:smollm2",
        cache_path: str | os.PathLike[str] | None = None,
        max_new_tokens: int = 256,
        max_state_chars: int = 6000,
        policy_options: dict[str, Any] | None = None,
    ) -> None:
        self._policy = policy
        self.policy_options = dict(policy_options or {})
        self.max_new_tokens = max_new_tokens
        self.max_state_chars = max_state_chars
        self.cache: dict[tuple[str, str], dict[str, Any]] = {}
        self.cache_path = Path(cache_path) if cache_path else None
        self._lock = threading.Lock()
        if self.cache_path and self.cache_path.exists():
            self._load_cache(self.cache_path)

    @classmethod
    def from_config(cls, config: JudgeConfig) -> JudgeVerifier:
        return cls(config.policy, config.cache_path, config.max_new_tokens, config.max_state_chars)

    @property
    def policy(self) -> Policy:
        if isinstance(self._policy, str):
            self._policy = load_policy(self._policy, **self.policy_options)
        return self._policy

    def _load_cache(self, path: Path) -> None:
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
                self.cache[(entry["pivot"], entry["action"])] = entry
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # a blank line or one cut by a crash: that verdict is simply asked again

    def prompt(self, pivot: Pivot, action: dict[str, Any]) -> str:
        """The judge prompt for one candidate action at a pivot."""
        return JUDGE_PROMPT.format(
            state=render_state(pivot.messages, self.max_state_chars),
            expert=render_action(pivot.expert),
            candidate=render_action(action),
        )

    def judge_many(self, items: Sequence[tuple[Pivot, dict[str, Any]]]) -> list[Verdict]:
        """Verdicts for several (pivot, action) pairs; uncached ones are judged in one generate call."""
        keys = [(pivot.id, canonical_action(action)) for pivot, action in items]
        with self._lock:
            missing = {key: item for key, item in zip(keys, items) if key not in self.cache}
            if missing:
                self._ask(missing)
            entries = [self.cache[key] for key in keys]
            for key in missing:
                if "error" in self.cache[key]:
                    del self.cache[key]  # a failed judgement is not kept: the pair is judged again later
            return [self._verdict(entry) for entry in entries]

    def verify(self, pivot: Pivot, action: dict[str, Any], outcome: Any = None) -> Verdict:
        return self.judge_many([(pivot, action)])[0]

    def _ask(self, missing: dict[tuple[str, str], tuple[Pivot, dict[str, Any]]]) -> None:
        chats = [
            {"messages": [{"role": "user", "content": self.prompt(p, a)}], "tools": []}
            for p, a in missing.values()
        ]
        sampling = SamplingParams(temperature=0.0, max_new_tokens=self.max_new_tokens)
        try:
            groups = self.policy.generate(chats, 1, sampling)
        except Exception as error:  # the judge's infrastructure failed: an invalid verdict, not a crash
            for key in missing:
                self.cache[key] = {
                    "pivot": key[0],
                    "action": key[1],
                    "accept": None,
                    "error": repr(error)[:300],
                }
            return
        entries = []
        for key, group in zip(missing, groups):
            text = group[0].text
            entry = {"pivot": key[0], "action": key[1], "accept": parse_verdict(text), "text": text}
            self.cache[key] = entry
            entries.append(entry)
        if self.cache_path and entries:
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            with self.cache_path.open("a", encoding="utf-8") as handle:
                handle.writelines(json.dumps(e, ensure_ascii=False) + "\n" for e in entries)
                handle.flush()

    def _verdict(self, entry: dict[str, Any]) -> Verdict:
        if "error" in entry:
            return Verdict(0.0, "judge_error", f"the judge failed: {entry['error']}", valid=False)
        if entry["accept"] is None:
            return Verdict(
                0.0,
                "judge_unparseable",
                f"no VERDICT line in the judge's answer: {entry['text'][-200:]!r}",
                valid=False,
            )
        if entry["accept"]:
            return Verdict(1.0, "judge_accept", entry.get("text", "")[-300:])
        return Verdict(0.0, "judge_reject", entry.get("text", "")[-300:])


class JudgedVerifier:
    """A domain's verifier, with the judge deciding what it rejected.

    base:        the functional verifier.
    judge:       a JudgeVerifier.
    categories:  judge only rejections of these categories (None: every rejection). Invalid
                 verdicts (infrastructure failures) are never sent to the judge.
    """

    def __init__(self, base: Verifier, judge: JudgeVerifier, categories: Sequence[str] | None = None) -> None:
        self.base = base
        self.judge = judge
        self.categories = set(categories) if categories is not None else None
        self.name = f"{base.name}+judge"

    def verify(self, pivot: Pivot, action: dict[str, Any], outcome: Any = None) -> Verdict:
        verdict = self.base.verify(pivot, action, outcome)
        if verdict.reward >= 1.0 or not verdict.valid:
            return verdict
        if self.categories is not None and verdict.category not in self.categories:
            return verdict
        judged = self.judge.verify(pivot, action, outcome)
        judged.extra = {
            **judged.extra,
            "functional": {"category": verdict.category, "detail": verdict.detail},
        }
        return judged
