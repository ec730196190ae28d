"""The search agent's tools, as the ecosystem spells them, all run on one SearchEngine.

Every spelling maps to one of three kinds (TOOL_NAMES):

- search: `search(query)` (BrowseComp-Plus), `search(queries: [...])` (NeMo-Gym; at most
  MAX_QUERIES), also `web_search`, `browser.search`. Each query gives its top-k hits, numbered
  across the call: `[n] Title (docid: D, url: U)` then a snippet.
- open: `get_document(docid)` (BrowseComp-Plus), `browse(urls: [...], goal)` (NeMo-Gym; at most
  MAX_URLS; `goal` is not used), `open(id | url | title)` (also `browser.open`, `fetch`,
  `open_url`). A reference is a docid, a url or an exact title; `open` also takes the number of a
  result of the last search (`open(id=2)`). The text shown is cut at `max_document_chars` with a
  marker `[... N more characters]`.
- find: `find(pattern)` (also `browser.find`, `find_in_page`): case-insensitive occurrences of
  `pattern` in the document opened last, each with its surrounding text (at most MAX_FIND_MATCHES).

`run_call` never raises for a bad call: it returns a CallResult whose `error` is a category
("unknown_tool", "bad_argument", "empty_query", "query_too_long", "unknown_docid",
"no_open_document") and whose text tells the agent what went wrong. Only EngineError (the engine
failed, not the call) propagates. The text depends only on the engine, the state and the call, so
replaying a trajectory's calls reproduces its tool messages exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pivot_envs.domains.search.corpus import Document
from pivot_envs.domains.search.engine import Hit, QueryError, SearchEngine, counted_terms

MAX_QUERIES = 5
MAX_URLS = 5
MAX_DOCUMENT_CHARS = 4000
MAX_FIND_MATCHES = 5
FIND_CONTEXT_CHARS = 120
MAX_REF_CHARS = 2000

TOOL_NAMES: dict[str, str] = {
    "search": "search", "web_search": "search", "browser.search": "search",
    "get_document": "open", "browse": "open", "open": "open", "browser.open": "open", "fetch": "open",
    "open_url": "open",
    "find": "find", "browser.find": "find", "find_in_page": "find",
}  # fmt: skip


@dataclass
class BrowseState:
    """What the agent has retrieved so far; run_call updates it (rebuilt at reset by replaying)."""

    # Docids that appeared in a result or were opened, each once, in the order first met.
    seen: list[str] = field(default_factory=list)
    opened: list[str] = field(default_factory=list)  # docids opened, each once, in order
    current: str | None = None  # the document `find` searches in: the one opened last
    results: list[str] = field(default_factory=list)  # the last search call's hits, as numbered in its text

    def saw(self, docids: list[str]) -> None:
        """Add the docids not seen yet to `seen`, in order."""
        self.seen.extend(docid for docid in dict.fromkeys(docids) if docid not in self.seen)


@dataclass(frozen=True)
class CallResult:
    """One tool call's outcome: the tool message text, the kind of call, the documents it reached
    (a search's hits, the documents opened) and an error category when the call was bad.

    requests: what the call asked for: a search's queries, an open's document references, 1 otherwise.
    terms:    a search's queries, each as the words its results were ranked by (`engine.counted_terms`).
    """

    text: str
    kind: str
    docids: tuple[str, ...]
    error: str | None = None
    requests: int = 1
    terms: tuple[tuple[str, ...], ...] = ()


class _BadCall(Exception):
    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category


def _arguments(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            raise _BadCall("bad_argument", "the arguments are not valid JSON") from None
    if not isinstance(arguments, dict):
        raise _BadCall("bad_argument", f"the arguments must be a JSON object, got {type(arguments).__name__}")
    return arguments


def _strings(arguments: dict[str, Any], one: str, many: str, bound: int) -> list[str]:
    """The string argument `one`, or the list of strings `many` (1..bound of them)."""
    if one in arguments and many not in arguments:
        values = [arguments[one]]
    elif many in arguments:
        values = arguments[many]
        if isinstance(values, str):
            values = [values]
        if not isinstance(values, list) or not values:
            raise _BadCall("bad_argument", f"'{many}' must be a non-empty list of strings")
        if len(values) > bound:
            raise _BadCall("bad_argument", f"at most {bound} {many} per call, got {len(values)}")
    else:
        raise _BadCall("bad_argument", f"missing argument '{one}' (or '{many}': a list)")
    for value in values:
        if not isinstance(value, str):
            raise _BadCall("bad_argument", f"'{one}' must be a string, got {type(value).__name__}")
    return values


def _hit_text(number: int, hit: Hit) -> str:
    return f"[{number}] {hit.title} (docid: {hit.docid}, url: {hit.url})\n{hit.snippet}"


def _search(engine: SearchEngine, arguments: dict[str, Any], state: BrowseState, k: int) -> CallResult:
    queries = _strings(arguments, "query", "queries", MAX_QUERIES)
    blocks, reached, terms = [], [], []
    for query in queries:
        try:
            hits = engine.search(query, k)
            terms.append(counted_terms(engine, query))
        except QueryError as error:
            raise _BadCall(error.category, f"{error} (query {query[:100]!r})") from None
        header = f"Results for {query!r}:" if hits else f"No results for {query!r}."
        blocks.append(
            "\n\n".join([header, *(_hit_text(len(reached) + n, hit) for n, hit in enumerate(hits, 1))])
        )
        reached.extend(hit.docid for hit in hits)
    state.results = reached
    state.saw(reached)
    return CallResult(
        "\n\n".join(blocks),
        "search",
        tuple(dict.fromkeys(reached)),
        requests=len(queries),
        terms=tuple(terms),
    )


def _document_text(document: Document, limit: int) -> str:
    text = document.text[:limit]
    if len(document.text) > limit:
        text += f"\n[... {len(document.text) - limit} more characters]"
    return f"{document.title} (docid: {document.docid}, url: {document.url})\n\n{text}"


def _resolve(engine: SearchEngine, ref: Any, state: BrowseState) -> Document | None:
    """The document `ref` names: a result number of the last search (an int or a digit string that
    is not a docid), else a docid, url or title."""
    if isinstance(ref, int) and not isinstance(ref, bool):
        return engine.get(state.results[ref - 1]) if 1 <= ref <= len(state.results) else None
    if not isinstance(ref, str):
        raise _BadCall("bad_argument", f"a document reference must be a string, got {type(ref).__name__}")
    if len(ref) > MAX_REF_CHARS:
        raise _BadCall("bad_argument", f"a document reference has at most {MAX_REF_CHARS} characters")
    document = engine.lookup(ref)
    if document is None and ref.strip().isdigit():
        return _resolve(engine, int(ref.strip()), state)
    return document


def _open(
    engine: SearchEngine, name: str, arguments: dict[str, Any], state: BrowseState, limit: int
) -> CallResult:
    if "urls" in arguments or "url" in arguments:
        refs: list[Any] = _strings(arguments, "url", "urls", MAX_URLS)
    else:
        keys = ("docid", "doc_id", "id", "title", "ref")
        present = [key for key in keys if key in arguments]
        if not present:
            raise _BadCall("bad_argument", f"{name} needs one of 'docid', 'id', 'url' or 'title'")
        refs = [arguments[present[0]]]
    blocks, opened, missing = [], [], []
    for ref in refs:
        document = _resolve(engine, ref, state)
        if document is None:
            missing.append(ref)
            blocks.append(
                f"Error: no document {ref!r:.200} in the corpus (use a docid or url from search results)"
            )
        else:
            opened.append(document.docid)
            blocks.append(_document_text(document, limit))
    if opened:
        state.saw(opened)
        state.opened.extend(docid for docid in dict.fromkeys(opened) if docid not in state.opened)
        state.current = opened[-1]
    # Some documents found: the call worked (the missing ones are said in its text).
    return CallResult(
        "\n\n".join(blocks), "open", tuple(opened), None if opened else "unknown_docid", requests=len(refs)
    )


def _find(engine: SearchEngine, arguments: dict[str, Any], state: BrowseState) -> CallResult:
    pattern = arguments.get("pattern", arguments.get("query"))
    if not isinstance(pattern, str):
        raise _BadCall("bad_argument", "find needs 'pattern', a string")
    if not pattern.strip():
        raise _BadCall("empty_query", "the pattern is empty")
    if len(pattern) > MAX_REF_CHARS:
        raise _BadCall("query_too_long", f"the pattern has more than {MAX_REF_CHARS} characters")
    document = engine.get(state.current) if state.current is not None else None
    if document is None:
        raise _BadCall("no_open_document", "find searches the document opened last; open a document first")
    text, needle = document.text, pattern.lower()
    lowered, starts, at = text.lower(), [], text.lower().find(needle)
    while at >= 0 and len(starts) < MAX_FIND_MATCHES:
        starts.append(at)
        at = lowered.find(needle, at + max(1, len(needle)))
    if not starts:
        return CallResult(f"No match for {pattern!r} in {document.title}.", "find", (document.docid,))
    lines = [f"Matches for {pattern!r} in {document.title} (docid: {document.docid}):"]
    for number, start in enumerate(starts, 1):
        low, high = (
            max(0, start - FIND_CONTEXT_CHARS),
            min(len(text), start + len(needle) + FIND_CONTEXT_CHARS),
        )
        lines.append(f"[{number}] {'...' if low else ''}{text[low:high]}{'...' if high < len(text) else ''}")
    return CallResult("\n".join(lines), "find", (document.docid,))


def run_call(
    engine: SearchEngine,
    name: str,
    arguments: Any,
    state: BrowseState,
    *,
    k: int = 5,
    max_document_chars: int = MAX_DOCUMENT_CHARS,
) -> CallResult:
    """Run one tool call `name(arguments)` on `engine` and update `state`.

    `arguments` may be a dict or a JSON string (anything else is a bad call); `k` is the number of
    hits per query; opened documents are cut at `max_document_chars`. Returns the CallResult (with
    an `error` category for a bad call, whose state is left unchanged); raises EngineError only.
    """
    kind = TOOL_NAMES.get(name) if isinstance(name, str) else None
    if kind is None:
        known = ", ".join(sorted(TOOL_NAMES))
        return CallResult(
            f"Error: unknown tool {name!r:.100}; the tools are: {known}", "unknown", (), "unknown_tool"
        )
    try:
        parsed = _arguments(arguments)
        if kind == "search":
            return _search(engine, parsed, state, k)
        if kind == "open":
            return _open(engine, name, parsed, state, max_document_chars)
        return _find(engine, parsed, state)
    except (_BadCall, QueryError) as error:
        return CallResult(f"Error: {error}", kind, (), error.category)


def _function(name: str, description: str, parameter: str, about: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {parameter: {"type": "string", "description": about}},
                "required": [parameter],
            },
        },
    }


def bundled_tools() -> list[dict[str, Any]]:
    """The OpenAI function schemas of the bundled tasks' tools: search(query), get_document(docid)."""
    return [
        _function(
            "search",
            "Search the Wikipedia corpus. Returns the top results, each with its docid, title, url and a snippet.",
            "query",
            "What to search for, in words",
        ),
        _function(
            "get_document",
            f"Read a document of the corpus by its docid (its text, cut after {MAX_DOCUMENT_CHARS} characters).",
            "docid",
            "The docid of a search result",
        ),
    ]
