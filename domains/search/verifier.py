"""The search domain's verifier: is the sampled browsing step functionally the expert's?

The paper's appendix states no local verifier for its browsing domain (BrowseComp); these levels
are the library's choice. Each is chosen with `gym.make("pivot/search-v0", verifier=LEVEL)`, and
the strict exact-match reward (paper Eq. 2) is always reported beside it in `info["strict_reward"]`.

A turn is of one kind: `answer` (a message, no tool call), or the kind its calls map to through the
tool aliases (`search`, `open`, `find`; see `tools.TOOL_NAMES`). At every level a final answer
scores 1 only when the answer it gives (`answer.extract_answer`) equals the gold answer or an alias
after normalisation (`answer.normalize_answer`), never for being a message.

- `retrieval` (default): the sampled turn must be of the expert's kind (a search where the expert
  answered cannot be equivalent to the answer, nor an answer to a search: "wrong_kind"). Then
  - a search scores 1 when its top-k results reach an evidence document not yet seen anywhere in
    the prefix (in a result or opened). When the expert's own search reached no such document, what
    it reached also counts: the evidence among its results, or, when it reached no evidence at all,
    its top hit (so the expert's action always scores 1, and re-finding a document already seen
    scores only where the expert did the same);
  - an open (get_document, browse, open) scores 1 for the document the expert opened, or an
    evidence document not yet opened in the prefix (re-reading an opened one adds nothing);
  - a find scores 1 when it finds the passages the expert's find found, in the same document
    (the same lines of output after its header: "Verdi" and "verdi" find the same), and some;
  - a turn whose calls all failed (empty query, unknown document, unknown tool, ...) scores 0 with
    the failure's category.
  At a pivot recorded on another corpus (`info["replay"] == "recorded"`) calls cannot be run, so
  tool turns are judged at the `args` level (the category says so).
- `args`: the same tool names and the same arguments after normalisation (key order, case and
  whitespace of strings), as a multiset of calls.
- `name`: the same tool names as a multiset (a message where the expert answered scores 1 only
  with the right answer, as everywhere).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pivot_envs.domains.search.answer import answer_matches, extract_answer
from pivot_envs.domains.search.tools import TOOL_NAMES, BrowseState, CallResult

from pivot_envs.chat import calls_of, text_of
from pivot_envs.env import Outcome
from pivot_envs.errors import UnknownNameError
from pivot_envs.pivot import Pivot
from pivot_envs.verifiers import Verdict

LEVELS = ("retrieval", "args", "name")
# What an action of each kind is called in a verdict's detail.
_DOING = {
    "answer": "answered",
    "search": "searched",
    "open": "opened a document",
    "find": "searched in a document",
}
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Reach:
    """What executing the calls at a pivot touched, for the retrieval level.

    sample:   the sampled turn's call results, in order.
    expert:   the expert turn's call results, run from the same prefix state.
    prefix:   the browse state after the prefix (what was seen and opened before the turn).
    evidence: the task's evidence documents, as docids of the engine.
    """

    sample: tuple[CallResult, ...]
    expert: tuple[CallResult, ...]
    prefix: BrowseState
    evidence: frozenset[str] = field(default_factory=frozenset)


def turn_kind(message: dict[str, Any]) -> str:
    """ "answer" for a message without tool calls; else the kind every call maps to ("search",
    "open", "find"), "unknown" when a call's tool is not a known alias, "mixed" for several kinds."""
    names = [name for name, _ in calls_of(message)]
    if not names:
        return "answer"
    kinds = {TOOL_NAMES.get(name, "unknown") for name in names}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def gold_answers(pivot: Pivot) -> list[str]:
    """The accepted answers at `pivot`: its task's answer and aliases (`context["task"]`), else the
    row's `ground_truth` (NeMo-Gym task rows), else the answer the expert's message gives."""
    task = pivot.context.get("task")
    if isinstance(task, dict) and task.get("answer") is not None:
        return [str(task["answer"]), *map(str, task.get("aliases") or ())]
    if pivot.context.get("ground_truth") is not None:
        return [str(pivot.context["ground_truth"])]
    return [extract_answer(text_of(pivot.expert))]


def normalized_calls(message: dict[str, Any]) -> Counter:
    """A turn's calls as a multiset of canonical JSON texts: (name, arguments) with object keys
    sorted and every string lowercased with its whitespace runs collapsed."""
    return Counter(
        json.dumps([name, _normalized(arguments)], sort_keys=True, ensure_ascii=False)
        for name, arguments in calls_of(message)
    )


def _normalized(value: Any) -> Any:
    if isinstance(value, str):
        return _SPACE.sub(" ", value).strip().lower()
    if isinstance(value, list):
        return [_normalized(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _normalized(item) for key, item in value.items()}
    return value


class SearchVerifier:
    """Scores a sampled browsing step at a pivot at one level of LEVELS (see the module docstring).

    verify(pivot, action, outcome) reads `outcome.data["reach"]` (a Reach, set by SearchEnv's
    execute) for the retrieval level; without it (a pivot whose calls were not run, or a direct
    call with no outcome) tool turns are judged by their arguments.
    """

    def __init__(self, level: str = "retrieval") -> None:
        if level not in LEVELS:
            raise UnknownNameError("search verifier level", level, LEVELS)
        self.name = level

    def verify(self, pivot: Pivot, action: dict[str, Any], outcome: Outcome | None = None) -> Verdict:
        expert_kind, kind = turn_kind(pivot.expert), turn_kind(action)
        if kind == "answer" or expert_kind == "answer":
            return self._answer(pivot, action, kind, expert_kind)
        if self.name == "name":
            same = Counter(n for n, _ in calls_of(action)) == Counter(n for n, _ in calls_of(pivot.expert))
            return (
                Verdict(1.0, "same_tools")
                if same
                else Verdict(0.0, "other_tools", "the turn calls other tools than the expert's")
            )
        reach = outcome.data.get("reach") if outcome is not None else None
        if self.name == "args" or reach is None:
            return _by_arguments(pivot, action, unexecuted=self.name != "args")
        return _by_retrieval(reach, kind, expert_kind)

    def _answer(self, pivot: Pivot, action: dict[str, Any], kind: str, expert_kind: str) -> Verdict:
        if kind != expert_kind:
            return Verdict(
                0.0,
                "wrong_kind",
                f"the turn {_doing(kind)} where the expert {_doing(expert_kind)}",
            )
        gold = gold_answers(pivot)
        if answer_matches(text_of(action), gold):
            return Verdict(1.0, "correct_answer")
        given = extract_answer(text_of(action))
        return Verdict(
            0.0,
            "wrong_answer",
            f"answer {given[:200]!r} is not {gold[0][:200]!r} (or an alias) after normalisation",
        )


def _by_arguments(pivot: Pivot, action: dict[str, Any], unexecuted: bool) -> Verdict:
    """The `args` level; `unexecuted`: standing in for `retrieval` at a pivot whose calls cannot run."""
    why = " (the pivot's calls were not run: recorded on another corpus)" if unexecuted else ""
    if normalized_calls(action) == normalized_calls(pivot.expert):
        return Verdict(1.0, "same_arguments", why.strip(" ()"))
    return Verdict(0.0, "other_arguments", f"the calls differ from the expert's after normalisation{why}")


def _by_retrieval(reach: Reach, kind: str, expert_kind: str) -> Verdict:
    worked = [result for result in reach.sample if result.error is None]
    if not worked:
        failed = reach.sample[0] if reach.sample else None
        category = failed.error if failed is not None else "no_call"
        return Verdict(0.0, category, failed.text[:300] if failed is not None else "the turn made no call")
    if kind != expert_kind:
        return Verdict(
            0.0,
            "wrong_kind",
            f"the turn {_doing(kind)} where the expert {_doing(expert_kind)}",
        )
    reached = _docids(worked)
    expert = [result for result in reach.expert if result.error is None]
    if kind == "find":
        if {_passages(result) for result in worked} & {_passages(result) for result in expert} - {()}:
            return Verdict(1.0, "same_passages")
        return Verdict(0.0, "other_passages", "the find found other passages than the expert's")
    if kind == "search":
        targets = reach.evidence - set(reach.prefix.seen)
        if not _docids(expert) & targets:
            # The expert's search found nothing new: equivalence is reaching what it reached.
            targets |= (_docids(expert) & reach.evidence) or {
                result.docids[0] for result in expert if result.docids
            }
        if reached & targets:
            return Verdict(1.0, "evidence_reached", f"reached {sorted(reached & targets)[:5]}")
        return Verdict(
            0.0, "evidence_missed", f"the results {sorted(reached)[:10]} hold none of {sorted(targets)[:10]}"
        )
    targets = _docids(expert) | (reach.evidence - set(reach.prefix.opened))
    if reached & targets:
        return Verdict(1.0, "evidence_opened", f"opened {sorted(reached & targets)[:5]}")
    return Verdict(0.0, "other_document", f"opened {sorted(reached)[:5]}, none of {sorted(targets)[:10]}")


def _passages(result: CallResult) -> tuple[str, ...]:
    """What a find found: the lines after its header (none for "No match"), with the document."""
    lines = result.text.splitlines()[1:]
    return (*result.docids, *lines) if lines else ()


def _doing(kind: str) -> str:
    return _DOING.get(kind, "called tools of several kinds" if kind == "mixed" else "called unknown tools")


def _docids(results: Iterable[CallResult]) -> set[str]:
    return {docid for result in results for docid in result.docids}
