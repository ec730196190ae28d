"""SearchEnv: `pivot/search-v0`, the next browsing step of a deep-search agent at a pivot.

A search agent's state is what it has retrieved so far. reset() restores it by replaying the
prefix's tool calls on the engine (`tools.run_call`) into a `BrowseState` and checks each output
against the recorded tool message, once per pivot per env (cached). A pivot is served in one of
three replay modes, named in reset's and step's `info["replay"]`:

- "executed": the pivot was recorded on this engine's corpus (`context["corpus_id"]` is the
  engine's) and every replayed output equals the recorded one. Sampled calls run on the engine
  from the prefix state, and so do the expert's (for the retrieval verifier).
- "stale": recorded on this corpus, but a replayed output differs from the recorded one (the
  corpus, the engine's ranking or the tools changed since). reset's `info["stale"]` names the
  first differing call. The pivot is never silently used: every step at it is invalid
  (valid=False, category "stale_pivot"), so trainers mask it out; rebuild the pivots
  (`pivotrl search build`) to use it again.
- "recorded": the pivot carries no `corpus_id`, or another one (external trajectories,
  NeMo-Gym task rows): the prefix keeps its recorded outputs and nothing is run. Answers are
  scored as everywhere; tool turns are scored by their arguments (see `verifier`).

An engine that fails (a missing or corrupt index, an HTTP endpoint down) makes the step invalid
(valid=False, category "infrastructure_error"), never an exception; the next reset tries again.
"""

from __future__ import annotations

import copy
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cache, partial
from importlib import resources
from typing import Any

from pivot_envs.chat import calls_of, text_of
from pivot_envs.config import ConfigError, at_least, between, config_of, option
from pivot_envs.domains.search.corpus import CorpusError
from pivot_envs.domains.search.engine import EngineError, SearchEngine, open_engine
from pivot_envs.domains.search.tools import MAX_DOCUMENT_CHARS, BrowseState, CallResult, run_call
from pivot_envs.domains.search.verifier import Reach, SearchVerifier
from pivot_envs.domains.tool_use.parser import parse_action
from pivot_envs.env import InfrastructureError, Outcome, ParsedAction, PivotEnv, PivotSource
from pivot_envs.pivot import Pivot, iter_pivots
from pivot_envs.verifiers import StrictVerifier

PIVOTS_RESOURCE = ("data", "pivots.jsonl.gz")
DEFAULT_K = 5
# Replays an env keeps (first in, first out): a few KB each, the docids a prefix reached.
REPLAYS_KEPT = 4096


@dataclass
class SearchLimits:
    """Bounds of one step of the search env."""

    max_calls: int = option(
        4,
        "most tool calls one turn may make (the pivot's expert turn's count, if higher); a turn with more scores 0 "
        "as too_many_tool_calls and none of its calls runs",
    )
    document_chars: int = option(
        MAX_DOCUMENT_CHARS,
        "characters of a document an open/get_document/browse call shows; the rest is cut with a marker",
    )
    step_timeout_s: float = option(
        30.0,
        "wall-clock seconds for a step's calls; past it the step is an infrastructure failure (valid=False)",
    )

    def __post_init__(self) -> None:
        at_least(self, 1, "max_calls", "document_chars")
        between(self, "step_timeout_s", 0, float("inf"), open_low=True, open_high=True)

    @classmethod
    def of(cls, value: SearchLimits | dict[str, Any] | None) -> SearchLimits:
        """Limits from a SearchLimits, a dict of its fields (unknown names refused), or None (the defaults)."""
        return config_of(cls, value, "search limit")


@dataclass
class Replay:
    """A pivot's prefix replayed on the engine (computed once per pivot per env).

    mode:     "executed", "stale" or "recorded" (see the module docstring).
    state:    the browse state after the prefix (empty when nothing ran).
    expert:   the expert turn's call results from that state (for the retrieval verifier).
    evidence: the task's evidence as docids of the engine (titles and urls resolved).
    stale:    the first prefix call whose output differs from the recorded one, else None.
    """

    mode: str
    state: BrowseState = field(default_factory=BrowseState)
    expert: tuple[CallResult, ...] = ()
    evidence: frozenset[str] = frozenset()
    stale: dict[str, Any] | None = None


@cache
def bundled_pivots() -> tuple[Pivot, ...]:
    """The bundled search pivots (read once per process; shared, treat as read-only)."""
    path = resources.files("pivot_envs.domains.search").joinpath(*PIVOTS_RESOURCE)
    return tuple(iter_pivots(str(path)))


class SearchEnv(PivotEnv):
    """A single-step env whose action is the next browsing step: search, open a document, or answer.

    gym.make("pivot/search-v0", pivots=None, verifier="retrieval", engine=None, k=None, limits=None)

    pivots:   a pivot file (or any trajectory format `pivot_envs.formats` reads; NeMo-Gym task rows
              with a `ground_truth` become answer pivots), a list of pivots; None for the bundled sample.
    verifier: "retrieval" (default), "args", "name" (see `verifier`) or "strict" (exact match, Eq. 2).
    engine:   what `engine.open_engine` takes: "bundled", a corpus or index path, an http(s) URL, a
              dict, an engine object; None opens each pivot's `context["corpus"]` (pivots without
              one run in "recorded" mode and need no engine).
    k:        results per search in a step; None: the k the pivot was recorded with (`context["k"]`, else 5).
    limits:   per-step bounds (SearchLimits or a dict of its fields: max_calls, document_chars, step_timeout_s).

    The action is raw completion text (Hermes `<tool_call>` blocks, parsed as in the tool-use
    domain) or an assistant message dict. step() returns the observation with one tool message per
    call after the action; info["output"] is the tool output (a list for several calls),
    info["replay"] the pivot's replay mode.
    """

    domain = "search"
    default_verifier = "retrieval"
    verifiers = {
        "retrieval": partial(SearchVerifier, "retrieval"),
        "args": partial(SearchVerifier, "args"),
        "name": partial(SearchVerifier, "name"),
        "strict": StrictVerifier,
    }

    def __init__(
        self,
        pivots: PivotSource = None,
        verifier: str | Any | None = None,
        verifier_config: dict[str, Any] | None = None,
        engine: str | os.PathLike | dict | SearchEngine | None = None,
        k: int | None = None,
        limits: SearchLimits | dict[str, Any] | None = None,
        render_mode: str | None = None,
    ) -> None:
        if isinstance(pivots, (str, os.PathLike)):
            from pivot_envs.formats.nemo_gym_tasks import read_with_task_pivots

            pivots = read_with_task_pivots(pivots, domain=self.domain)
        super().__init__(pivots, verifier, verifier_config, render_mode)
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ConfigError(f"SearchEnv: k must be a positive integer, got {k!r}")
        self.k = k
        self.limits = SearchLimits.of(limits)
        self.engine_spec = engine
        self._engines: dict[str, SearchEngine] = {}
        self._replays: OrderedDict[str, Replay] = OrderedDict()
        self._last_prefix: tuple[str, list[dict[str, Any]], Replay] | None = None
        self.engine: SearchEngine | None = None
        self.replay: Replay | None = None
        self._broken = ""

    # -- domain hooks ------------------------------------------------------------------------------

    def default_pivots(self) -> list[Pivot]:
        return list(bundled_pivots())

    def parse(self, action: Any) -> ParsedAction:
        parsed = parse_action(action)
        calls = len((parsed.message or {}).get("tool_calls") or ())
        expert_calls = len(self.pivot.expert.get("tool_calls") or ()) if self.pivot is not None else 0
        allowed = max(self.limits.max_calls, expert_calls)
        if calls > allowed:
            detail = f"the turn makes {calls} tool calls; at most {allowed} run in one turn (SearchLimits.max_calls)"
            return ParsedAction(None, "too_many_tool_calls", detail)
        return parsed

    def restore(self, pivot: Pivot) -> None:
        self._broken = ""
        self.engine = self.replay = None
        if not self._needs_engine(pivot):
            self.replay = Replay("recorded")
            return
        try:
            engine = self.engine_for(pivot)
            self.replay = self._replay_of(pivot, engine)
            # A pivot recorded on another corpus runs nothing on this one.
            self.engine = engine if self.replay.mode != "recorded" else None
        except (EngineError, CorpusError) as error:
            # Not cached: the next reset tries the engine again.
            self._broken = f"pivot {pivot.id}: the search engine failed: {error}"

    def execute(self, pivot: Pivot, action: dict[str, Any]) -> Outcome:
        if self._broken or self.replay is None:
            raise InfrastructureError(
                self._broken or f"pivot {pivot.id}: no replayed prefix state (reset first)"
            )
        replay = self.replay
        if replay.mode == "stale":
            raise InfrastructureError(f"pivot {pivot.id} is stale: {_describe(replay.stale)}")
        calls = action.get("tool_calls") or []
        if not calls or replay.mode == "recorded" or self.engine is None:
            return Outcome(data={"replay": replay.mode})
        state = _copy_state(replay.state)
        k = self.k or _recorded_k(pivot)
        deadline = time.monotonic() + self.limits.step_timeout_s
        results, messages = [], []
        for call, (name, arguments) in zip(calls, calls_of(action)):
            result = run_call(
                self.engine, name, arguments, state, k=k, max_document_chars=self.limits.document_chars
            )
            if time.monotonic() > deadline:
                raise InfrastructureError(
                    f"pivot {pivot.id}: the {self.engine.name} engine took longer than the step's deadline of "
                    f"{self.limits.step_timeout_s} s (SearchLimits.step_timeout_s)"
                )
            results.append(result)
            messages.append(
                {"role": "tool", "tool_call_id": call.get("id", ""), "name": name, "content": result.text}
            )
        reach = Reach(tuple(results), replay.expert, replay.state, replay.evidence)
        output = [result.text for result in results]
        return Outcome(
            messages, output[0] if len(output) == 1 else output, {"replay": replay.mode, "reach": reach}
        )

    # -- gymnasium API -----------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        observation, info = super().reset(seed=seed, options=options)
        info["replay"] = self.replay.mode if self.replay is not None else "failed"
        if self.replay is not None and self.replay.stale is not None:
            info["stale"] = dict(self.replay.stale)
        if self._broken:
            info["engine_error"] = self._broken
        return observation, info

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        observation, reward, terminated, truncated, info = super().step(action)
        info["replay"] = self.replay.mode if self.replay is not None else "failed"
        if self.replay is not None and self.replay.mode == "stale" and not info["valid"]:
            info["category"] = "stale_pivot"
            self._last["category"] = "stale_pivot"
        return observation, reward, terminated, truncated, info

    # -- engines and replay ------------------------------------------------------------------------

    def _needs_engine(self, pivot: Pivot) -> bool:
        """Whether the pivot's prefix can be replayed: it names the corpus it was recorded on."""
        return bool(pivot.context.get("corpus_id"))

    def engine_for(self, pivot: Pivot) -> SearchEngine:
        """The engine that runs calls at `pivot`: the env's `engine`, else the pivot's `context["corpus"]`
        (opened once per env). Raises EngineError or CorpusError when it cannot be opened."""
        spec = self.engine_spec if self.engine_spec is not None else pivot.context.get("corpus", "bundled")
        key = spec if isinstance(spec, str) else repr(spec)
        if key not in self._engines:
            self._engines[key] = open_engine(spec)
        return self._engines[key]

    def _replay_of(self, pivot: Pivot, engine: SearchEngine) -> Replay:
        """The pivot's replay on `engine`, from the cache or computed (an EngineError is not cached)."""
        key = f"{pivot.id}\0{engine.corpus_id}"
        replay = self._replays.get(key)
        if replay is None:
            replay = replay_prefix(pivot, engine, self._continued(pivot, engine))
            if len(self._replays) >= REPLAYS_KEPT:
                self._replays.popitem(last=False)
            self._replays[key] = replay
            self._last_prefix = (engine.corpus_id, pivot.messages, replay)
        return replay

    def _continued(self, pivot: Pivot, engine: SearchEngine) -> tuple[int, Replay] | None:
        """The last replay computed, when its prefix begins this pivot's (the next turn of the same
        trajectory): this replay continues from it instead of running the shared calls again."""
        if self._last_prefix is None:
            return None
        corpus_id, messages, replay = self._last_prefix
        count = len(messages)
        if corpus_id != engine.corpus_id or count > len(pivot.messages) or pivot.messages[:count] != messages:
            return None
        return count, replay

    def replay_report(self) -> list[dict[str, Any]]:
        """Every pivot's replay verdict: [{"pivot", "replay", "stale"?, "error"?}], in order (replays each once)."""
        rows = []
        for pivot in self.pivots:
            row: dict[str, Any] = {"pivot": pivot.id}
            if not self._needs_engine(pivot):
                row["replay"] = "recorded"
            else:
                try:
                    replay = self._replay_of(pivot, self.engine_for(pivot))
                except (EngineError, CorpusError) as error:
                    row.update(replay="failed", error=str(error))
                else:
                    row["replay"] = replay.mode
                    if replay.stale is not None:
                        row["stale"] = replay.stale
            rows.append(row)
        return rows


def replay_prefix(pivot: Pivot, engine: SearchEngine, start: tuple[int, Replay] | None = None) -> Replay:
    """Replay the pivot's prefix calls on `engine`, comparing each output with the recorded tool
    message (matched by tool_call_id, else by position), then run the expert's calls from the
    resulting state. `start` = (n, replay of a prefix equal to the first n messages): continue from
    its state. A pivot recorded on another corpus (its `corpus_id` is not the engine's) is
    "recorded" without running anything. Raises EngineError when the engine fails."""
    if pivot.context.get("corpus_id") != engine.corpus_id:
        return Replay("recorded")
    k = _recorded_k(pivot)
    begin, state, stale = 0, BrowseState(), None
    if start is not None and start[1].mode != "recorded":
        begin, state, stale = start[0], _copy_state(start[1].state), start[1].stale
    messages = pivot.messages
    for index in range(begin, len(messages)):
        message = messages[index]
        if message.get("role") != "assistant" or not message.get("tool_calls"):
            continue
        recorded = _recorded_outputs(messages, index)
        for position, (call, (name, arguments)) in enumerate(zip(message["tool_calls"], calls_of(message))):
            result = run_call(engine, name, arguments, state, k=k)
            expected = recorded.get(call.get("id")) if call.get("id") in recorded else recorded.get(position)
            if stale is None and expected is not None and result.text != expected:
                stale = {
                    "message": index,
                    "call": position,
                    "tool": name,
                    "recorded": expected[:300],
                    "replayed": result.text[:300],
                }
    expert_state = _copy_state(state)
    expert = tuple(
        run_call(engine, name, arguments, expert_state, k=k) for name, arguments in calls_of(pivot.expert)
    )
    return Replay("stale" if stale else "executed", state, expert, _evidence(pivot, engine), stale)


def _recorded_outputs(messages: list[dict[str, Any]], index: int) -> dict[Any, str]:
    """The tool messages answering the assistant message at `index`: by tool_call_id and by position."""
    outputs: dict[Any, str] = {}
    position = 0
    for message in messages[index + 1 :]:
        if message.get("role") != "tool":
            break
        text = (
            text_of(message)
            if isinstance(message.get("content"), list)
            else str(message.get("content") or "")
        )
        outputs[position] = text
        if message.get("tool_call_id"):
            outputs[message["tool_call_id"]] = text
        position += 1
    return outputs


def _evidence(pivot: Pivot, engine: SearchEngine) -> frozenset[str]:
    """The task's evidence (docids, titles or urls) as docids of `engine`; unknown ones are dropped."""
    task = pivot.context.get("task")
    refs = task.get("evidence") if isinstance(task, dict) else None
    docids = set()
    for ref in refs or ():
        document = engine.lookup(ref) if isinstance(ref, str) else None
        if document is not None:
            docids.add(document.docid)
    return frozenset(docids)


def _recorded_k(pivot: Pivot) -> int:
    k = pivot.context.get("k")
    return k if isinstance(k, int) and not isinstance(k, bool) and k > 0 else DEFAULT_K


def _copy_state(state: BrowseState) -> BrowseState:
    return copy.deepcopy(state)


def _describe(stale: dict[str, Any] | None) -> str:
    if not stale:
        return "its replay differs from the recording"
    return (
        f"call {stale['call']} ({stale['tool']}) of message {stale['message']} returns another output than the "
        f"recorded one (rebuild the pivots on this corpus)"
    )
