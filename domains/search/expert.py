"""The scripted expert of the search domain: tasks -> expert trajectories -> pivots.

The expert works like a search agent that knows where the answer is. For each evidence document in
turn it
1. searches: for the first document with the question's keywords, for a later one with the name
   the documents read so far (or the question) give it (the bridge entity: its title without a
   "(film)"-style qualifier), falling back to the full title when a query does not bring the
   document into the top k (a query that misses is not recorded);
2. opens the document with `get_document`;
and then answers `Answer: <answer>`. Every call runs through `tools.run_call` on the engine, so the
recorded tool messages are exactly what the env replays at reset.

Each assistant turn becomes a pivot (`pivot_envs.extract.extract_pivots`), with the bundled tools
(`search`, `get_document`) and `context = {"corpus", "corpus_id", "k", "task"}`.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pivot_envs.chat import assistant_message, tool_call
from pivot_envs.domains.search.corpus import Document
from pivot_envs.domains.search.engine import STOPWORDS, SearchEngine
from pivot_envs.domains.search.tasks import SearchTask, TaskError, answer_in_evidence, resolve_evidence
from pivot_envs.domains.search.tools import BrowseState, CallResult, bundled_tools, run_call
from pivot_envs.extract import ExtractConfig, extract_pivots
from pivot_envs.pivot import Pivot
from pivot_envs.trajectory import Trajectory

log = logging.getLogger(__name__)

DOMAIN_NAME = "search"
FORMAT = "search-expert"
SYSTEM_PROMPT = (
    "You are a search agent. Answer the user's question by searching a collection of documents.\n"
    "Tools: search(query) returns the top documents for a query (id, title, url and a snippet); "
    "get_document(docid) returns a document's text.\n"
    "Search, read the documents that answer the question, and when you know the answer reply with "
    "one line: 'Answer: <the answer>' (a name, a number, a year or a place)."
)
MAX_QUERY_WORDS = 16
_WORD = re.compile(r"\w+")
_QUALIFIER = re.compile(r"\s*\([^)]*\)$")


class ExpertError(TaskError):
    """A task the expert cannot turn into a trajectory: its evidence is not reached by any search
    in the top k, or no evidence document states its answer."""


def question_keywords(question: str) -> str:
    """The question's content words (stopwords and repeats dropped, at most MAX_QUERY_WORDS) as a query."""
    words: dict[str, str] = {}
    for word in _WORD.findall(question):
        if word.lower() not in STOPWORDS and word.lower() not in words:
            words[word.lower()] = word
    return " ".join(list(words.values())[:MAX_QUERY_WORDS])


def entity_name(title: str) -> str:
    """A title as prose names it: without a trailing qualifier ("Utopia (book)" -> "Utopia")."""
    return _QUALIFIER.sub("", title) or title


def candidate_queries(task: SearchTask, document: Document, hop: int, read: Sequence[str]) -> list[str]:
    """The queries the expert tries, in order, to reach `document` as the `hop`-th evidence after
    reading the texts `read`: the question's keywords on the first hop (or when nothing read names
    the document), the bridge name when the question or a text read names it, then the full title."""
    name = entity_name(document.title)
    named = any(name.casefold() in text.casefold() for text in (task.question, *read))
    queries = []
    if hop == 0 or not named:
        queries.append(question_keywords(task.question))
    if named:
        queries.append(name)
    queries.append(document.title)
    return [query for query in dict.fromkeys(queries) if query]


@dataclass
class _Episode:
    """The trajectory being written: messages, the browse state, and call ids."""

    engine: SearchEngine
    k: int
    messages: list[dict[str, Any]]
    state: BrowseState = field(default_factory=BrowseState)

    def call(self, name: str, arguments: dict[str, Any], result: CallResult | None = None) -> CallResult:
        """Record one assistant turn calling `name` and its tool reply; `result` when already run on this state."""
        if result is None:
            result = run_call(self.engine, name, arguments, self.state, k=self.k)
        call_id = f"call_{sum(1 for m in self.messages if m['role'] == 'assistant')}"
        self.messages.append(assistant_message(None, [tool_call(name, arguments, call_id)]))
        self.messages.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": result.text})
        return result

    def search_reaching(self, queries: Iterable[str], docid: str) -> bool:
        """Record the first search among `queries` whose top k holds `docid`; False when none does.

        Each query is tried on a copy of the state, so the ones that miss leave no trace."""
        for query in queries:
            trial = copy.deepcopy(self.state)
            result = run_call(self.engine, "search", {"query": query}, trial, k=self.k)
            if result.error is None and docid in result.docids:
                self.state = trial
                self.call("search", {"query": query}, result)
                return True
        return False


def expert_trajectory(
    task: SearchTask,
    engine: SearchEngine,
    *,
    k: int = 5,
    evidence: Sequence[Document] | None = None,
    context: dict[str, Any] | None = None,
) -> Trajectory:
    """The expert's trajectory for `task` on `engine` (k results per search).

    `evidence` is the task's resolved evidence (default: `resolve_evidence(task, engine)`), `context`
    the trajectory's context. Raises ExpertError when no evidence document states the answer or a
    document cannot be reached by search, TaskError for evidence the corpus does not hold.
    """
    documents = list(evidence) if evidence is not None else resolve_evidence(task, engine)
    if not answer_in_evidence(task, documents):
        raise ExpertError(
            f"{task.where}: task {task.id!r}: no evidence document states the answer {task.answer!r}"
            + (f" or an alias ({', '.join(task.aliases)})" if task.aliases else "")
        )
    episode = _Episode(
        engine, k, [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.question}]
    )
    read: list[str] = []
    for hop, document in enumerate(documents):
        queries = candidate_queries(task, document, hop, read)
        if not episode.search_reaching(queries, document.docid):
            raise ExpertError(
                f"{task.where}: task {task.id!r}: evidence {document.title!r} is not in the top {k} "
                f"of any query the expert tries ({', '.join(repr(q) for q in queries)})"
            )
        opened = episode.call("get_document", {"docid": document.docid})
        if opened.error is not None:
            raise ExpertError(
                f"{task.where}: task {task.id!r}: get_document({document.docid!r}) failed: {opened.error}"
            )
        read.append(opened.text)
    episode.messages.append(assistant_message(f"Answer: {task.answer}"))
    return Trajectory(
        id=task.id,
        messages=episode.messages,
        tools=bundled_tools(),
        reward=1.0,
        context=dict(context or {}),
        format=FORMAT,
    )


@dataclass
class BuildReport:
    """What a build did: tasks read, trajectories and pivots written, and the tasks skipped and why."""

    tasks: int = 0
    trajectories: int = 0
    pivots: int = 0
    skipped: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line: '92 tasks -> 90 expert trajectories -> 455 pivots (2 tasks skipped)'."""
        line = f"{self.tasks} tasks -> {self.trajectories} expert trajectories -> {self.pivots} pivots"
        return line + (f" ({len(self.skipped)} tasks skipped)" if self.skipped else "")


def build_pivots(
    tasks: Sequence[SearchTask],
    engine: SearchEngine,
    *,
    corpus: str = "bundled",
    k: int = 5,
    skip_unreachable: bool = False,
    report: BuildReport | None = None,
) -> list[Pivot]:
    """One pivot per assistant turn of the expert trajectory of every task, in task order.

    `corpus` is what the pivots record as `context["corpus"]` (what `open_engine` takes to open
    this engine again: "bundled", a corpus path, a URL). A task the expert cannot solve raises
    ExpertError, or with `skip_unreachable` is logged as a warning and counted in `report.skipped`.
    """
    from pivot_envs.config import progress_bar

    report = report if report is not None else BuildReport()
    report.tasks += len(tasks)
    trajectories = []
    bar = progress_bar(tasks, desc="expert trajectories", unit=" tasks", terminal_only=True)
    for task in bar:
        try:
            documents = resolve_evidence(task, engine)
            context = {
                "corpus": corpus,
                "corpus_id": engine.corpus_id,
                "k": k,
                "task": task.context([document.docid for document in documents]),
            }
            trajectories.append(expert_trajectory(task, engine, k=k, evidence=documents, context=context))
        except ExpertError as error:
            if not skip_unreachable:
                raise
            log.warning("skipped: %s", error)
            report.skipped.append(str(error))
    report.trajectories += len(trajectories)
    pivots = list(extract_pivots(trajectories, ExtractConfig(domain=DOMAIN_NAME)))
    report.pivots += len(pivots)
    return pivots
