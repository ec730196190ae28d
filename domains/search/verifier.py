"""The search domain's verifier: is the sampled browsing step functionally the expert's?

The paper's appendix states no local verifier for its browsing domain (BrowseComp); these levels
are the library's choice. Each is chosen with `gym.make("pivot/search-v0", verifier=LEVEL)`, and
the strict exact-match reward (paper Eq. 2) is always reported beside it in `info["strict_reward"]`.

A turn is of one kind: `answer` (a message, no tool call), or the kind its calls map to through the
tool aliases (`search`, `open`, `find`; see `tools.TOOL_NAMES`). At every level a final answer
scores 1 only when the answer it gives (`answer.extract_answer`) equals the gold answer or an alias
after normalisation (`answer.normalize_answer`), never for being a message.

- `retrieval` (default): the sampled turn must be of the expert's kind (a search where the expert
  answered cannot be equivalent to the answer, nor an answer to a search: "wrong_kind"), and every
  call of it must work (a failed call scores 0 with its category). As tool-use matches parallel
  calls as a multiset, a turn's extra calls cost the reward: it may ask for no more queries,
  documents or finds than the expert's turn did ("extra_queries", "extra_documents", "extra_finds").
  Then, for each kind in the turn:
  - a search scores 1 when its results reach an evidence document not yet seen anywhere in the
    prefix (in a result or opened). When the expert's own search reached no such document, it
    found again what the prefix had shown: then the evidence among its results not yet read, or,
    when it reached none, its top hit, counts too, at a rank no lower than the expert's search gives
    it ("ranked_lower"). Its queries are ranked by at most EXTRA_QUERY_WORDS more words than the
    expert's longest ("query_stuffed"), and its results show at most EXTRA_KNOWN_RESULTS more
    documents seen before than the expert's, and a new one where the expert's did ("known_results").
    So a paraphrase that finds the evidence scores 1, the expert always scores 1, and neither a
    query stuffed with the question or with candidates, nor a repeat of an earlier search, does;
  - an open (get_document, browse, open) scores 1 when every document it asks for is the one the
    expert opened or an evidence document not yet opened in the prefix, each once (re-reading an
    opened one adds nothing);
  - a find scores 1 when each find finds passages the expert's finds found, in the same document
    (the same lines of output after its header: "Verdi" and "verdi" find the same), and some.
  At a pivot recorded on another corpus (`info["replay"] == "recorded"`) calls cannot be run, so
  tool turns are judged at the `args` level (the category says so).
- `args`: the same tool names and the same arguments after normalisation (key order, case and
  whitespace of strings), as a multiset of calls.
- `name`: the same tool names as a multiset (a message where the expert answered scores 1 only
  with the right answer, as everywhere).

Text beside a tool turn's calls (`call_text`, on at `retrieval` and `args`, off at `name`, which
reads tool names only): the calls decide, but the text the turn also says may be at most
`call_text_extra_chars` (CALL_TEXT_EXTRA_CHARS) characters longer than the expert's text beside its
calls, whitespace runs counted as one ("call_text_too_long"), and may give no final answer (an
answer label or a \\boxed{}, read by `answer.extract_answer`) that the expert's text does not give
("answer_beside_call"). So "Let me search for X." passes, and a guess or a stuffed report does not.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pivot_envs.chat import calls_of, text_of
from pivot_envs.config import ConfigError
from pivot_envs.domains.search.answer import answer_matches, extract_answer, normalize_answer
from pivot_envs.domains.search.engine import MAX_TERMS
from pivot_envs.domains.search.tools import TOOL_NAMES, BrowseState, CallResult
from pivot_envs.env import Outcome
from pivot_envs.errors import UnknownNameError
from pivot_envs.pivot import Pivot
from pivot_envs.verifiers import (
    CALL_TEXT_EXTRA_CHARS,
    Verdict,
    check_call_text_extra_chars,
    text_beside_calls_too_long,
)

LEVELS = ("retrieval", "args", "name")
# What an action of each kind is called in a verdict's detail.
_DOING = {
    "answer": "answered",
    "search": "searched",
    "open": "opened a document",
    "find": "searched in a document",
}
_SPACE = re.compile(r"\s+")
# A query may be ranked by this many more words than the expert's longest (the engine's counted
# words): room for a paraphrase's qualifier ("born", a place, a date), not for a second question.
EXTRA_QUERY_WORDS = 3
# A search may show this many more documents the prefix had already shown than the expert's did: a
# query naming what the agent has read, for context, brings that document back.
EXTRA_KNOWN_RESULTS = 1
# The text beside a tool turn's calls may be CALL_TEXT_EXTRA_CHARS (300) characters longer than the
# expert's, whitespace runs counted as one (pivot_envs.verifiers, the rule the terminal and SWE share).
# The levels that read the text beside calls unless told otherwise (`name` reads tool names only).
CALL_TEXT_LEVELS = ("retrieval", "args")


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

    call_text:             read the text beside a tool turn's calls (see the module docstring); None:
                           on at the levels of CALL_TEXT_LEVELS, off at `name`.
    call_text_extra_chars: characters that text may say beyond the expert's text beside its calls.
    """

    def __init__(
        self,
        level: str = "retrieval",
        call_text: bool | None = None,
        call_text_extra_chars: int = CALL_TEXT_EXTRA_CHARS,
    ) -> None:
        if level not in LEVELS:
            raise UnknownNameError("search verifier level", level, LEVELS)
        if call_text is not None and not isinstance(call_text, bool):
            raise ConfigError(f"SearchVerifier: call_text must be true, false or None, got {call_text!r}")
        extra = check_call_text_extra_chars("SearchVerifier", call_text_extra_chars)
        self.name = level
        self.call_text = level in CALL_TEXT_LEVELS if call_text is None else call_text
        self.call_text_extra_chars = extra

    def verify(self, pivot: Pivot, action: dict[str, Any], outcome: Outcome | None = None) -> Verdict:
        expert_kind, kind = turn_kind(pivot.expert), turn_kind(action)
        if kind == "answer" or expert_kind == "answer":
            return self._answer(pivot, action, kind, expert_kind)
        if self.call_text:
            refused = _call_text_refusal(text_of(action), text_of(pivot.expert), self.call_text_extra_chars)
            if refused is not None:
                return refused
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


def _call_text_refusal(text: str, expert_text: str, extra_chars: int) -> Verdict | None:
    """The text beside a tool turn's calls: None if it passes, else the verdict that refuses it."""
    if text == expert_text:
        return None
    too_long = text_beside_calls_too_long(text, expert_text, extra_chars)
    if too_long is not None:
        return too_long
    given = _answer_given(text)
    if given is not None and given != _answer_given(expert_text):
        return Verdict(
            0.0,
            "answer_beside_call",
            f"the text beside the calls gives the answer {given[:200]!r}, which the expert's turn does not: "
            "an answer is a turn of its own",
        )
    return None


def _answer_given(text: str) -> str | None:
    """The answer a text gives by an answer label or a \\boxed{} (`extract_answer`), normalised; None
    where it has neither (extract_answer then takes the whole text) or the answer is empty."""
    whole = text.strip()
    given = extract_answer(whole)
    return (normalize_answer(given) or None) if given != whole else None


def _by_arguments(pivot: Pivot, action: dict[str, Any], unexecuted: bool) -> Verdict:
    """The `args` level; `unexecuted`: standing in for `retrieval` at a pivot whose calls cannot run."""
    why = " (the pivot's calls were not run: recorded on another corpus)" if unexecuted else ""
    if normalized_calls(action) == normalized_calls(pivot.expert):
        return Verdict(1.0, "same_arguments", why.strip(" ()"))
    return Verdict(0.0, "other_arguments", f"the calls differ from the expert's after normalisation{why}")


def _by_retrieval(reach: Reach, kind: str, expert_kind: str) -> Verdict:
    if not reach.sample:
        return Verdict(0.0, "no_call", "the turn made no call")
    failed = next((result for result in reach.sample if result.error is not None), None)
    if failed is not None:
        # A failed call is never part of the expert's turn: it costs the turn, as an unmatched call does.
        return Verdict(0.0, failed.error, failed.text[:300])
    kinds = sorted({result.kind for result in reach.expert})
    if kind != expert_kind or {result.kind for result in reach.sample} != set(kinds):
        return Verdict(0.0, "wrong_kind", f"the turn {_doing(kind)} where the expert {_doing(expert_kind)}")
    verdict = Verdict(0.0, "no_call", "the expert's turn made no call")
    for part in kinds:
        sample = [result for result in reach.sample if result.kind == part]
        expert = [result for result in reach.expert if result.kind == part and result.error is None]
        asked, allowed = sum(result.requests for result in sample), sum(result.requests for result in expert)
        if asked > allowed:
            what = _REQUESTS[part]
            return Verdict(
                0.0,
                f"extra_{what}",
                f"the turn asks for {asked} {what}, the expert's for {allowed}: each one more costs the reward",
            )
        verdict = _RULES[part](sample, expert, reach)
        if not verdict.reward:
            return verdict
    return verdict


def _search_verdict(sample: list[CallResult], expert: list[CallResult], reach: Reach) -> Verdict:
    """A search: within the expert's query words, reaching a target, re-showing no more than it did."""
    words = max((len(terms) for result in expert for terms in result.terms), default=MAX_TERMS)
    longest = max((terms for result in sample for terms in result.terms), key=len, default=())
    if len(longest) > words + EXTRA_QUERY_WORDS:
        return Verdict(
            0.0,
            "query_stuffed",
            f"a query is ranked by {len(longest)} words ({' '.join(longest)[:200]}), the expert's by {words}: "
            f"at most {EXTRA_QUERY_WORDS} more are a paraphrase",
        )
    seen, reached, reached_by_expert = set(reach.prefix.seen), _docids(sample), _docids(expert)
    targets = reach.evidence - seen
    if not reached & targets:
        if not reached_by_expert & targets:
            # The expert's search found nothing new: it found again a document seen before (never one
            # already read), or its top hit, and brought it to the top: equivalence is doing the same.
            targets = (reached_by_expert & (reach.evidence - set(reach.prefix.opened))) or {
                result.docids[0] for result in expert if result.docids
            }
        rank, rank_by_expert = _rank(sample, targets), _rank(expert, targets)
        if rank is None:
            return Verdict(
                0.0,
                "evidence_missed",
                f"the results {sorted(reached)[:10]} hold none of {sorted(targets)[:10]}",
            )
        if rank_by_expert is not None and rank > rank_by_expert:
            return Verdict(
                0.0,
                "ranked_lower",
                f"the results hold {sorted(targets)[:5]} at rank {rank}; the expert's search, which finds no "
                f"evidence not seen before, brings it to rank {rank_by_expert}",
            )
    known, new = reached & seen, reached - seen
    known_by_expert, new_by_expert = reached_by_expert & seen, reached_by_expert - seen
    if len(known) > len(known_by_expert) + EXTRA_KNOWN_RESULTS or (new_by_expert and not new):
        return Verdict(
            0.0,
            "known_results",
            f"the results show {len(known)} documents seen before and {len(new)} new ones, the expert's "
            f"{len(known_by_expert)} and {len(new_by_expert)}",
        )
    return Verdict(1.0, "evidence_reached", f"reached {sorted(reached & targets)[:5]}")


def _open_verdict(sample: list[CallResult], expert: list[CallResult], reach: Reach) -> Verdict:
    """An open: every document asked for is the expert's or evidence not yet opened, each once."""
    targets = _docids(expert) | (reach.evidence - set(reach.prefix.opened))
    opened = [docid for result in sample for docid in result.docids]
    useful = set(opened) & targets
    asked = sum(result.requests for result in sample)
    if len(useful) < asked:
        return Verdict(
            0.0,
            "other_document",
            f"opened {opened[:5]} of {asked} asked for; each must be one of {sorted(targets)[:10]}, once",
        )
    return Verdict(1.0, "evidence_opened", f"opened {sorted(useful)[:5]}")


def _find_verdict(sample: list[CallResult], expert: list[CallResult], reach: Reach) -> Verdict:
    """A find: each one finds passages the expert's finds found, in the same document, none twice."""
    found = [_passages(result) for result in sample]
    wanted = {_passages(result) for result in expert} - {()}
    if found and len(set(found)) == len(found) and set(found) <= wanted:
        return Verdict(1.0, "same_passages")
    return Verdict(0.0, "other_passages", "the find found other passages than the expert's")


_RULES = {"search": _search_verdict, "open": _open_verdict, "find": _find_verdict}
# What each kind's calls ask for, counted against the expert's turn (and its category: extra_<what>).
_REQUESTS = {"search": "queries", "open": "documents", "find": "finds"}


def _rank(results: Iterable[CallResult], targets: set[str] | frozenset[str]) -> int | None:
    """The position (from 1) of the first target among a turn's search results, in order; None if none."""
    ranked = list(dict.fromkeys(docid for result in results for docid in result.docids))
    return next((n for n, docid in enumerate(ranked, 1) if docid in targets), None)


def _passages(result: CallResult) -> tuple[str, ...]:
    """What a find found: the lines after its header (none for "No match"), with the document."""
    lines = result.text.splitlines()[1:]
    return (*result.docids, *lines) if lines else ()


def _doing(kind: str) -> str:
    return _DOING.get(kind, "called tools of several kinds" if kind == "mixed" else "called unknown tools")


def _docids(results: Iterable[CallResult]) -> set[str]:
    return {docid for result in results for docid in result.docids}
