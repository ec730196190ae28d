"""Red-team attacks on the search domain's retrieval verifier (issue 35, R7 and every other rule).

Each family turns a pivot into one hostile browsing step, built only from what a policy sees at the
pivot (the question, the prefix's results and documents) plus, for the "the right step plus more"
families, the expert's own call: those show that extra calls, documents and words cost the reward
even when the right one is among them. The backends are the two engines a step can run on: the
bundled FTS5 index, and the same index behind the HTTP protocol (`http_engine.serve_engine`), whose
client counts a query's words without the FTS engine's scored-word list.
"""

from __future__ import annotations

import json
import random
import re
import threading
from functools import cache
from typing import Any

from redteam_common import Family

from pivot_envs.chat import calls_of, text_of
from pivot_envs.domains.search.corpus import read_corpus
from pivot_envs.domains.search.engine import open_engine
from pivot_envs.domains.search.env import SearchEnv
from pivot_envs.domains.search.expert import question_keywords
from pivot_envs.domains.search.http_engine import serve_engine
from pivot_envs.domains.search.tools import TOOL_NAMES
from pivot_envs.domains.search.verifier import gold_answers, turn_kind

DOMAIN = "search"
BACKENDS = ("bundled", "http")
# Where the floors are documented.
DOCS = "docs/search.md#what-this-verifier-cannot-tell-apart"


@cache
def _http_url() -> str:
    """The bundled index served over HTTP in this process (one server, started on first use)."""
    server = serve_engine(open_engine("bundled"), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.server_address[:2]
    return f"http://{host}:{port}"


def make_env(backend: str) -> SearchEnv:
    """The search env on the bundled pivots, its calls run by the bundled index or the HTTP engine."""
    return SearchEnv(engine="bundled" if backend == "bundled" else _http_url())


# -- what a policy sees at a pivot ---------------------------------------------------------------------


def _calls(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            for n, (name, args) in enumerate(calls)
        ],
    }


def _state(env: SearchEnv):
    return env.replay.state if env.replay is not None else None


def _seen(env: SearchEnv) -> list[str]:
    state = _state(env)
    return list(state.seen) if state is not None else []


def _titles(env: SearchEnv, docids: list[str]) -> list[str]:
    return [document.title for docid in docids if (document := env.engine.get(docid)) is not None]


def _question(pivot) -> str:
    task = pivot.context.get("task")
    if isinstance(task, dict) and task.get("question"):
        return str(task["question"])
    users = [text_of(m) for m in pivot.messages if m.get("role") == "user"]
    return users[-1] if users else ""


def _queries_of(message: dict[str, Any]) -> list[str]:
    """The queries a turn's search calls ask (`query` or `queries`)."""
    queries = []
    for name, arguments in calls_of(message):
        if TOOL_NAMES.get(name) == "search" and isinstance(arguments, dict):
            value = arguments.get("queries", arguments.get("query"))
            queries.extend(
                [value] if isinstance(value, str) else [q for q in value or () if isinstance(q, str)]
            )
    return queries


def _expert_queries(pivot) -> list[str]:
    return _queries_of(pivot.expert)


def _prefix_queries(pivot) -> list[str]:
    return [q for m in pivot.messages if m.get("role") == "assistant" for q in _queries_of(m)]


@cache
def _title_words() -> tuple[str, ...]:
    return tuple(
        sorted({w.lower() for d in read_corpus() for w in d.title.split() if w.isalpha() and len(w) > 4})
    )


@cache
def _all_titles() -> tuple[str, ...]:
    return tuple(d.title for d in read_corpus())


def _wrong_answers(env: SearchEnv, pivot, count: int) -> list[str]:
    """Other tasks' answers (plausible-looking, wrong here), chosen by the pivot's id."""
    gold = {a.casefold() for a in gold_answers(pivot)}
    answers = sorted(
        {
            str(p.context["task"]["answer"])
            for p in env.pivots
            if isinstance(p.context.get("task"), dict) and p.context["task"].get("answer")
        }
    )
    answers = [a for a in answers if a.casefold() not in gold]
    return random.Random(pivot.id).sample(answers, min(count, len(answers)))


def _at(kind: str):
    """A family's attack applies only at pivots whose expert turn is of `kind`, with an engine (executed)."""

    def wrap(build):
        def attack(env: SearchEnv, pivot) -> Any:
            if turn_kind(pivot.expert) != kind or (kind != "answer" and env.engine is None):
                return None
            return build(env, pivot)

        attack.__name__ = build.__name__
        return attack

    return wrap


def _expert_calls(pivot) -> list[tuple[str, dict[str, Any]]]:
    return [(name, arguments) for name, arguments in calls_of(pivot.expert)]


def _expert_refs(pivot) -> set[str]:
    return {str(v) for _, arguments in calls_of(pivot.expert) for v in (arguments or {}).values()}


# -- opens (R7) ----------------------------------------------------------------------------------------


@_at("open")
def open_every_seen_document(env, pivot):
    urls = _seen(env)[:20]
    return _calls(*(("browse", {"urls": urls[i : i + 5], "goal": "read"}) for i in range(0, len(urls), 5)))


@_at("open")
def open_four_seen_documents(env, pivot):
    # The last search's results, where the next document to read usually is.
    return _calls(*(("get_document", {"docid": docid}) for docid in _state(env).results[:4]))


@_at("open")
def open_experts_document_and_one_more(env, pivot):
    others = [d for d in _seen(env) if d not in _expert_refs(pivot)]
    return (
        _calls(*_expert_calls(pivot), ("get_document", {"docid": random.Random(pivot.id).choice(others)}))
        if others
        else None
    )


@_at("open")
def open_experts_document_twice(env, pivot):
    return _calls(*_expert_calls(pivot), *_expert_calls(pivot))


@_at("open")
def open_the_first_result(env, pivot):
    return _calls(("open", {"id": 1})) if _state(env).results else None


@_at("open")
def open_one_random_seen_document(env, pivot):
    return _calls(("get_document", {"docid": random.Random(pivot.id).choice(_seen(env))}))


# -- searches (R7) -------------------------------------------------------------------------------------


def _asks_other_than_the_question(pivot) -> bool:
    """Whether the expert's search is something else than the question's keywords (where it is, the
    question is the expert's own query: the documented floor)."""
    keywords = question_keywords(_question(pivot)).casefold()
    return all(query.casefold() != keywords for query in _expert_queries(pivot))


def _expert_shows_something_new(env: SearchEnv) -> bool:
    """Whether the expert's search shows a document the prefix has not (where it does not, it repeats an
    earlier search, and a repeat is its equivalent: search-076/t2 of the bundled pivots)."""
    seen = set(_seen(env))
    return any(docid not in seen for result in env.replay.expert for docid in result.docids)


@_at("search")
def search_twenty_queries_with_the_experts(env, pivot):
    rng = random.Random(pivot.id)
    guesses = [*_titles(env, _seen(env)), *rng.sample(_all_titles(), 20)][:19]
    queries = [*_expert_queries(pivot)[:1], *guesses]
    return _calls(*(("search", {"queries": queries[i : i + 5]}) for i in range(0, 20, 5)))


@_at("search")
def search_four_calls_of_guesses(env, pivot):
    rng = random.Random(pivot.id)
    guesses = [_question(pivot), *_titles(env, _seen(env)), *rng.sample(_all_titles(), 20)][:20]
    return _calls(*(("search", {"queries": guesses[i : i + 5]}) for i in range(0, 20, 5)))


@_at("search")
def search_experts_query_plus_the_question(env, pivot):
    if not _asks_other_than_the_question(pivot):
        return None
    return _calls(("search", {"query": f"{_expert_queries(pivot)[0]} {_question(pivot)}"}))


@_at("search")
def search_experts_query_plus_seen_titles(env, pivot):
    titles = _titles(env, _seen(env))
    if not titles:
        return None
    return _calls(("search", {"query": " ".join([_expert_queries(pivot)[0], *titles])[:900]}))


@_at("search")
def search_experts_query_plus_random_titles(env, pivot):
    titles = random.Random(pivot.id).sample(_all_titles(), 4)
    return _calls(("search", {"query": " ".join([*titles, _expert_queries(pivot)[0]])}))


@_at("search")
def search_every_seen_title(env, pivot):
    if not _expert_shows_something_new(env):
        return None
    titles = _titles(env, _seen(env))
    return _calls(("search", {"query": " ".join(titles)[:900]})) if titles else None


@_at("search")
def search_thirty_two_random_title_words(env, pivot):
    return _calls(("search", {"query": " ".join(random.Random(pivot.id).sample(_title_words(), 32))}))


@_at("search")
def search_the_question(env, pivot):
    return _calls(("search", {"query": _question(pivot)})) if _asks_other_than_the_question(pivot) else None


@_at("search")
def search_the_previous_query_again(env, pivot):
    if not _expert_shows_something_new(env):
        return None
    earlier = _prefix_queries(pivot)
    if not earlier or earlier[-1].casefold() in {q.casefold() for q in _expert_queries(pivot)}:
        return None
    return _calls(("search", {"query": earlier[-1]}))


@_at("search")
def search_the_title_of_the_document_read(env, pivot):
    if not _expert_shows_something_new(env):
        return None
    state = _state(env)
    titles = _titles(env, [state.current]) if state.current else []
    expert_words = {word.casefold() for query in _expert_queries(pivot) for word in re.findall(r"\w+", query)}
    if not titles or expert_words & {word.casefold() for word in re.findall(r"\w+", titles[0])}:
        return None
    return _calls(("search", {"query": titles[0]}))


@_at("search")
def search_four_names_from_the_document_read(env, pivot):
    state = _state(env)
    document = env.engine.get(state.current) if state.current else None
    if document is None:
        return None
    title = set(document.title.casefold().split())
    names = [
        w
        for w in dict.fromkeys(re.findall(r"\b[A-Z][a-z]{3,}\b", document.text))
        if w.casefold() not in title
    ]
    return _calls(("search", {"query": " ".join(names[:4])})) if names else None


# -- the text beside the expert's calls -----------------------------------------------------------------


def _beside_experts_calls(build):
    """A family's attack: the expert's own calls, with the text `build` makes beside them (at tool turns)."""

    def attack(env: SearchEnv, pivot) -> Any:
        if turn_kind(pivot.expert) == "answer":
            return None
        return {**_calls(*_expert_calls(pivot)), "content": build(env, pivot)}

    attack.__name__ = build.__name__
    return attack


@_beside_experts_calls
def expert_calls_with_an_answer_beside(env, pivot):
    # The gold answer (the guess that would score as an answer turn) with a wrong one before it.
    return f"I think it is {_wrong_answers(env, pivot, 1)[0]}, let me check.\nAnswer: {_gold(pivot)}"


@_beside_experts_calls
def expert_calls_with_a_boxed_guess_beside(env, pivot):
    return f"Searching to confirm \\boxed{{{_wrong_answers(env, pivot, 1)[0]}}}."


@_beside_experts_calls
def expert_calls_with_a_stuffed_text(env, pivot):
    # 60 KB of the question, the seen titles and candidate answers, as a report to the user.
    words = [_question(pivot), *_titles(env, _seen(env)), _gold(pivot), *_wrong_answers(env, pivot, 5)]
    text = " ".join(words)
    return (text + " ") * (60_000 // (len(text) + 1) + 1)


# -- answers -------------------------------------------------------------------------------------------


def _gold(pivot) -> str:
    return gold_answers(pivot)[0]


@_at("answer")
def answer_candidates_in_one_line(env, pivot):
    return "Answer: " + ", ".join([_gold(pivot), *_wrong_answers(env, pivot, 2)])


@_at("answer")
def answer_wrong_or_right(env, pivot):
    return f"Answer: {_wrong_answers(env, pivot, 1)[0]} or {_gold(pivot)}"


@_at("answer")
def answer_labelled_candidates_right_first(env, pivot):
    return "\n".join(f"Answer: {a}" for a in [_gold(pivot), *_wrong_answers(env, pivot, 2)])


@_at("answer")
def answer_boxed_candidates_right_first(env, pivot):
    return " ".join(f"\\boxed{{{a}}}" for a in [_gold(pivot), *_wrong_answers(env, pivot, 2)])


@_at("answer")
def answer_every_seen_title(env, pivot):
    titles = _titles(env, _seen(env)) if env.engine is not None else []
    return "Answer: " + "; ".join(titles) if titles else None


# -- generic and degenerate actions --------------------------------------------------------------------


def empty(env, pivot):
    return ""


def the_question_echoed(env, pivot):
    return _question(pivot)


def the_previous_turn_echoed(env, pivot):
    turns = [m for m in pivot.messages if m.get("role") == "assistant"]
    return dict(turns[-1]) if turns else None


def the_prefix_echoed(env, pivot):
    return "\n\n".join(text_of(m) for m in pivot.messages)


def the_experts_call_fifty_times(env, pivot):
    calls = _expert_calls(pivot)
    return _calls(*(calls * 50)[:50]) if calls else None


def a_one_megabyte_query(env, pivot):
    return _calls(("search", {"query": "traviata " * 116_509}))


def a_one_megabyte_answer(env, pivot):
    return "Answer: " + ("Busseto Parma Verdi " * 52_429)


FAMILIES: dict[str, Family] = {
    "open_every_seen_document": Family(
        "four browse calls of five urls: every document the prefix has shown (issue 35 R7)",
        open_every_seen_document,
    ),
    "open_four_seen_documents": Family(
        "four get_document calls: the last search's first four results", open_four_seen_documents
    ),
    "open_experts_document_and_one_more": Family(
        "the expert's get_document plus one more seen document", open_experts_document_and_one_more
    ),
    "open_experts_document_twice": Family("the expert's get_document, twice", open_experts_document_twice),
    "open_one_random_seen_document": Family(
        "one seen document, chosen at random (the baseline of R7)",
        open_one_random_seen_document,
        floor=0.3,
        why_floor=(
            "a single open of a document the prefix showed scores when it is the expert's document or unopened "
            f"evidence: a guess among the seen documents, 0.25 in expectation on the bundled pivots ({DOCS})"
        ),
    ),
    "open_the_first_result": Family(
        "open(id=1): the last search's first result",
        open_the_first_result,
        floor=1.0,
        why_floor=(
            "the bundled expert's search brings the document it opens next to the top: at 188 of 191 open pivots "
            f"the first result is the expert's document, so opening it is the expert's action ({DOCS})"
        ),
        generic=True,
    ),
    "search_twenty_queries_with_the_experts": Family(
        "four search calls of five queries, the expert's query among them",
        search_twenty_queries_with_the_experts,
    ),
    "search_four_calls_of_guesses": Family(
        "four search calls of five queries: the question, the seen titles, random titles",
        search_four_calls_of_guesses,
    ),
    "search_experts_query_plus_the_question": Family(
        "stuffed: the expert's query with the question pasted in (where the expert searched something else)",
        search_experts_query_plus_the_question,
    ),
    "search_experts_query_plus_seen_titles": Family(
        "stuffed: the expert's query plus the title of every seen document",
        search_experts_query_plus_seen_titles,
    ),
    "search_experts_query_plus_random_titles": Family(
        "stuffed: four random titles plus the expert's query", search_experts_query_plus_random_titles
    ),
    "search_every_seen_title": Family("one query of every seen document's title", search_every_seen_title),
    "search_thirty_two_random_title_words": Family(
        "32 random title words (the most a query may hold)", search_thirty_two_random_title_words
    ),
    "search_the_question": Family(
        "the question as the query (where the expert searched something else than its keywords)",
        search_the_question,
        generic=True,
    ),
    "search_the_previous_query_again": Family(
        "the prefix's last query again (where the expert's is another)",
        search_the_previous_query_again,
        generic=True,
    ),
    "search_the_title_of_the_document_read": Family(
        "the title of the document read last, searched again (where it shares no word with the expert's query: "
        "the units Watt and Joule are named after the bridge, and searching them is the expert's search)",
        search_the_title_of_the_document_read,
        generic=True,
    ),
    "search_four_names_from_the_document_read": Family(
        "the first four capitalised names of the document read last, as one query",
        search_four_names_from_the_document_read,
        floor=0.3,
        why_floor=(
            "a query naming a few candidates, within the expert's words + 3, reaches each of them (OR search) and "
            "scores where the bridge is among them and ranks as high as the expert's search ranks it: 26 of the 99 "
            f"later search pivots ({DOCS})"
        ),
    ),
    "expert_calls_with_an_answer_beside": Family(
        "the expert's calls with 'Answer: <the gold answer>' beside them (the text beside calls, call_text)",
        expert_calls_with_an_answer_beside,
    ),
    "expert_calls_with_a_boxed_guess_beside": Family(
        "the expert's calls with a wrong answer in \\boxed{} beside them",
        expert_calls_with_a_boxed_guess_beside,
    ),
    "expert_calls_with_a_stuffed_text": Family(
        "the expert's calls with 60 KB of question, titles and candidates beside them",
        expert_calls_with_a_stuffed_text,
        generic=True,
    ),
    "answer_candidates_in_one_line": Family("Answer: right, wrong, wrong", answer_candidates_in_one_line),
    "answer_wrong_or_right": Family("Answer: wrong or right", answer_wrong_or_right),
    "answer_labelled_candidates_right_first": Family(
        "three labelled answers, the right one first", answer_labelled_candidates_right_first
    ),
    "answer_boxed_candidates_right_first": Family(
        "three boxed answers, the right one first", answer_boxed_candidates_right_first
    ),
    "answer_every_seen_title": Family("Answer: every seen document's title", answer_every_seen_title),
    "empty": Family("the empty completion", empty, generic=True),
    "the_question_echoed": Family("the question as the completion", the_question_echoed, generic=True),
    "the_previous_turn_echoed": Family(
        "the prefix's last assistant turn again", the_previous_turn_echoed, generic=True
    ),
    "the_prefix_echoed": Family("the whole prefix's text as the completion", the_prefix_echoed, generic=True),
    "the_experts_call_fifty_times": Family(
        "the expert's call repeated 50 times in one turn", the_experts_call_fifty_times, generic=True
    ),
    "a_one_megabyte_query": Family("a search with a 1 MB query", a_one_megabyte_query, generic=True),
    "a_one_megabyte_answer": Family("a 1 MB answer of candidate words", a_one_megabyte_answer, generic=True),
}
