"""Search tasks: questions with their answer and the evidence documents that answer them.

A task file is JSONL, one task per line:

    {"id": "q1", "question": "In which town was the composer of La traviata born?",
     "answer": "Busseto", "aliases": ["Busseto, Italy"], "evidence": ["La traviata", "Giuseppe Verdi"]}

- `id`: a non-empty string, unique in the file (pivot ids are `<id>/t<turn>`);
- `question`, `answer`: non-empty strings; the answer should be short (a name, a number, a place);
- `aliases` (optional): other spellings of the answer that also count as correct;
- `evidence`: the documents that answer the question, in the order an agent would read them (a
  multi-hop question names the bridge document first), each a title of the corpus (exact,
  case-insensitive), a document id or a url.

`read_tasks` checks the format (a bad line raises TaskError naming the file and line number);
`resolve_evidence` turns the evidence into document ids with the engine's `lookup`, and an unknown
title raises TaskError with the closest titles the engine finds for it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pivot_envs.domains.search.answer import normalize_answer, normalize_text
from pivot_envs.domains.search.corpus import Document
from pivot_envs.domains.search.engine import QueryError, SearchEngine
from pivot_envs.errors import PivotEnvsError, did_you_mean
from pivot_envs.jsonl import iter_records

TASKS_FILE = Path(__file__).resolve().parent / "data" / "tasks.jsonl"
FIELDS = ("id", "question", "answer", "aliases", "evidence")
REQUIRED = ("id", "question", "answer", "evidence")
# The expert searches and opens every evidence document: a bound on its work per task.
MAX_EVIDENCE = 10
MAX_TEXT_CHARS = 2000


class TaskError(PivotEnvsError, ValueError):
    """A task that cannot be used: a malformed line, or evidence the corpus does not hold.
    The message names the file and line number."""


@dataclass(frozen=True)
class SearchTask:
    """One question with its gold answer and evidence (see the module docstring for the format).

    `where` is "file:line" of the line it was read from, for error messages ("" when built in code).
    """

    id: str
    question: str
    answer: str
    evidence: tuple[str, ...]
    aliases: tuple[str, ...] = ()
    where: str = ""

    @property
    def answers(self) -> tuple[str, ...]:
        """The answer and its aliases: what a final answer may equal."""
        return (self.answer, *self.aliases)

    def context(self, evidence_docids: Sequence[str]) -> dict[str, Any]:
        """The task as it goes into a pivot's context, with its evidence as document ids."""
        return {
            "id": self.id,
            "question": self.question,
            "answer": self.answer,
            "aliases": list(self.aliases),
            "evidence": list(evidence_docids),
        }

    def _fail(self, message: str) -> TaskError:
        return TaskError(
            f"{self.where}: task {self.id!r}: {message}" if self.where else f"task {self.id!r}: {message}"
        )


def _text(record: dict[str, Any], name: str, where: str) -> str:
    value = record[name]
    if not isinstance(value, str) or not value.strip():
        raise TaskError(f"{where}: '{name}' must be a non-empty string, got {value!r:.80}")
    if len(value) > MAX_TEXT_CHARS:
        raise TaskError(
            f"{where}: '{name}' has {len(value)} characters; at most {MAX_TEXT_CHARS} are allowed"
        )
    return value.strip()


def _texts(record: dict[str, Any], name: str, where: str) -> tuple[str, ...]:
    values = record.get(name, [])
    if not isinstance(values, list) or not all(isinstance(v, str) and v.strip() for v in values):
        raise TaskError(f"{where}: '{name}' must be a list of non-empty strings, got {values!r:.80}")
    return tuple(v.strip() for v in values)


def parse_task(record: Any, where: str = "") -> SearchTask:
    """A task from one decoded JSONL record; TaskError naming `where` ("file:line") when it is malformed."""
    if not isinstance(record, dict):
        raise TaskError(f"{where}: a task must be a JSON object, got {type(record).__name__}")
    for name in record:
        if name not in FIELDS:
            raise TaskError(f"{where}: unknown field {name!r}{did_you_mean(name, FIELDS)}")
    for name in REQUIRED:
        if name not in record:
            raise TaskError(f"{where}: missing field '{name}' (a task needs {', '.join(REQUIRED)})")
    evidence = _texts(record, "evidence", where)
    if not evidence:
        raise TaskError(f"{where}: 'evidence' is empty: name at least one document that answers the question")
    if len(evidence) > MAX_EVIDENCE:
        raise TaskError(f"{where}: {len(evidence)} evidence documents; at most {MAX_EVIDENCE} are allowed")
    return SearchTask(
        id=_text(record, "id", where),
        question=_text(record, "question", where),
        answer=_text(record, "answer", where),
        evidence=evidence,
        aliases=_texts(record, "aliases", where),
        where=where,
    )


def read_tasks(path: str | os.PathLike[str] = TASKS_FILE) -> list[SearchTask]:
    """Every task of a JSONL task file (blank lines skipped), default the bundled one.

    Raises TaskError naming the file and line of the first bad line (not JSON, not a task, a
    duplicate id) or when the file has no task, and FileNotFoundError when it does not exist.
    """
    path = Path(path)
    tasks: list[SearchTask] = []
    lines: dict[str, int] = {}
    for number, record in iter_records(path, "task", TaskError):
        where = f"{path}:{number}"
        task = parse_task(record, where)
        if task.id in lines:
            raise TaskError(f"{where}: duplicate task id {task.id!r} (first on line {lines[task.id]})")
        lines[task.id] = number
        tasks.append(task)
    if not tasks:
        raise TaskError(f"{path}: no tasks in the file")
    return tasks


def resolve_evidence(task: SearchTask, engine: SearchEngine) -> list[Document]:
    """The task's evidence documents, looked up by title, id or url with `engine.lookup`.

    Raises TaskError naming the task's line and the unknown reference, with the titles of the
    engine's top hits for it as suggestions, or naming a document listed twice.
    """
    documents = []
    for ref in task.evidence:
        document = engine.lookup(ref)
        if document is None:
            try:
                near = [hit.title for hit in engine.search(ref, k=5)]
            except QueryError:
                near = []
            raise task._fail(f"evidence {ref!r} is not a document of the corpus{did_you_mean(ref, near)}")
        if any(document.docid == seen.docid for seen in documents):
            raise task._fail(f"evidence {ref!r} names document {document.docid!r} a second time")
        documents.append(document)
    return documents


def answer_in_evidence(task: SearchTask, documents: Sequence[Document]) -> bool:
    """Whether the answer or an alias appears in an evidence document's title or text, both
    normalised as the verifier scores answers (`answer.normalize_answer`: case, accents,
    punctuation, articles and whitespace, a non-breaking space included, do not count); an
    answer that normalises to nothing appears nowhere, as it matches nothing when scored."""
    answers = [normalized for answer in task.answers if (normalized := normalize_answer(answer))]
    texts = [normalize_text(f"{document.title}\n{document.text}") for document in documents]
    return any(answer in text for answer in answers for text in texts)
