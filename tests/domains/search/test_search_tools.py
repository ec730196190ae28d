"""The search domain's tools: every spelling runs on one engine; a bad call is a result, not an exception."""

from __future__ import annotations

import json
import socket

import pytest

from pivot_envs.domains.search.engine import EngineError, open_engine
from pivot_envs.domains.search.http_engine import HttpEngine
from pivot_envs.domains.search.tools import (
    MAX_QUERIES,
    MAX_URLS,
    TOOL_NAMES,
    BrowseState,
    CallResult,
    bundled_tools,
    run_call,
)

EINSTEIN_URL = "https://en.wikipedia.org/wiki/Albert_Einstein"
# One call per kind, with the arguments each spelling takes.
CALLS = {
    "search": [{"query": "Albert Einstein relativity"}, {"queries": ["Albert Einstein relativity"]}],
    "open": [{"docid": "Albert_Einstein"}, {"urls": [EINSTEIN_URL], "goal": "his birth"}, {"id": EINSTEIN_URL},
             {"title": "albert einstein"}, {"url": EINSTEIN_URL}],
    "find": [{"pattern": "photoelectric"}],
}  # fmt: skip


@pytest.fixture(scope="module")
def engine():
    return open_engine()


def opened_at_einstein(engine) -> BrowseState:
    state = BrowseState()
    assert run_call(engine, "get_document", {"docid": "Albert_Einstein"}, state).error is None
    return state


@pytest.mark.parametrize("name", sorted(TOOL_NAMES))
def test_every_spelling_of_a_tool_reaches_the_engine(engine, name):
    kind = TOOL_NAMES[name]
    for arguments in CALLS[kind]:
        state = opened_at_einstein(engine)
        result = run_call(engine, name, json.dumps(arguments), state)
        assert (result.kind, result.error) == (kind, None), (arguments, result.text)
        assert "Albert_Einstein" in result.docids
    if kind == "find":
        assert "Nobel Prize in Physics" in result.text


def test_search_lists_numbered_hits_with_docid_url_and_snippet(engine):
    state = BrowseState()
    result = run_call(engine, "search", {"queries": ["Albert Einstein", "Jupiter planet"]}, state, k=3)
    hits = engine.search("Albert Einstein", 3) + engine.search("Jupiter planet", 3)
    assert result.text.startswith(
        "Results for 'Albert Einstein':\n\n[1] Albert Einstein (docid: Albert_Einstein, url: "
    )
    assert (
        f"[4] {hits[3].title} (docid: {hits[3].docid}, url: {hits[3].url})\n{hits[3].snippet}" in result.text
    )
    assert result.docids == tuple(dict.fromkeys(hit.docid for hit in hits))
    assert state.results == [hit.docid for hit in hits] and state.seen == list(result.docids)
    assert state.opened == [] and state.current is None


def test_a_call_says_how_many_queries_or_documents_it_asked_for_and_the_words_that_ranked_each_query(engine):
    search = run_call(engine, "search", {"queries": ["the Albert Einstein", "Jupiter planet"]}, BrowseState())
    assert search.requests == 2
    # "the" is in nearly every summary: the engine does not rank by it, so it is not counted.
    assert search.terms == (("albert", "einstein"), ("jupiter", "planet"))
    browse = run_call(engine, "browse", {"urls": [EINSTEIN_URL, "no such page", EINSTEIN_URL]}, BrowseState())
    assert (browse.requests, browse.docids, browse.terms) == (3, ("Albert_Einstein", "Albert_Einstein"), ())


def test_the_same_call_on_the_same_state_gives_the_same_text(engine):
    first = run_call(engine, "search", {"query": "French painter pointillism"}, BrowseState())
    assert run_call(engine, "search", '{"query": "French painter pointillism"}', BrowseState()) == first


def test_open_takes_the_number_of_a_result_of_the_last_search(engine):
    state = BrowseState()
    hits = engine.search("Jupiter moons", 5)
    run_call(engine, "search", {"query": "Jupiter moons"}, state)
    for ref in (3, "3"):
        result = run_call(engine, "open", {"id": ref}, state)
        assert result.docids == (hits[2].docid,) and state.current == hits[2].docid
    assert run_call(engine, "open", {"id": 6}, state).error == "unknown_docid"


def test_find_searches_the_document_opened_last(engine):
    state = opened_at_einstein(engine)
    assert run_call(engine, "find", {"pattern": "PHOTOELECTRIC"}, state).text.count("[1]") == 1
    run_call(engine, "get_document", {"docid": "Jupiter"}, state)
    assert state.current == "Jupiter" and state.opened == ["Albert_Einstein", "Jupiter"]
    in_jupiter = run_call(engine, "find", {"pattern": "photoelectric"}, state)
    assert (in_jupiter.text, in_jupiter.error) == ("No match for 'photoelectric' in Jupiter.", None)
    assert run_call(engine, "find", {"pattern": "Sun"}, state).text.startswith("Matches for 'Sun' in Jupiter")
    assert run_call(engine, "find", {"pattern": "Sun"}, BrowseState()).error == "no_open_document"


def test_a_long_document_is_cut_with_a_marker(engine):
    text = engine.get("Albert_Einstein").text
    result = run_call(
        engine, "get_document", {"docid": "Albert_Einstein"}, BrowseState(), max_document_chars=100
    )
    assert result.text.endswith(f"{text[:100]}\n[... {len(text) - 100} more characters]")
    whole = run_call(engine, "get_document", {"docid": "Albert_Einstein"}, BrowseState())
    assert whole.text.endswith(text) and "more characters]" not in whole.text


def test_browse_reports_unknown_urls_beside_the_documents_it_found(engine):
    state = BrowseState()
    some = run_call(engine, "browse", {"urls": ["https://example.com/nothing", EINSTEIN_URL]}, state)
    assert (some.docids, some.error) == (("Albert_Einstein",), None)
    assert "Error: no document 'https://example.com/nothing'" in some.text
    none = run_call(engine, "browse", {"urls": ["https://example.com/nothing"]}, state)
    assert (none.docids, none.error) == ((), "unknown_docid")


@pytest.mark.parametrize(
    ("name", "arguments", "category"),
    [
        ("search", {"query": ""}, "empty_query"),
        ("search", {"query": "   "}, "empty_query"),
        ("search", {"query": "x" * (1 << 20)}, "query_too_long"),
        ("search", {"query": 42}, "bad_argument"),
        ("search", {"queries": ["Einstein", None]}, "bad_argument"),
        ("search", {"queries": []}, "bad_argument"),
        ("search", {"queries": ["Einstein"] * (MAX_QUERIES + 1)}, "bad_argument"),
        ("search", {"q": "Einstein"}, "bad_argument"),
        ("search", "not json", "bad_argument"),
        ("search", "[1, 2]", "bad_argument"),
        ("search", 17, "bad_argument"),
        ("search", None, "bad_argument"),
        ("search", "[" * 100_000, "bad_argument"),
        ("get_document", {"docid": "No_such_document"}, "unknown_docid"),
        ("get_document", {"docid": ["Albert_Einstein"]}, "bad_argument"),
        ("get_document", {"docid": 2.5}, "bad_argument"),
        ("get_document", {}, "bad_argument"),
        ("get_document", {"docid": "x" * 10_000}, "bad_argument"),
        ("browse", {"urls": [EINSTEIN_URL] * (MAX_URLS + 1)}, "bad_argument"),
        ("browse", {"urls": [3]}, "bad_argument"),
        ("open", {"id": True}, "bad_argument"),
        ("find", {"pattern": ""}, "empty_query"),
        ("find", {"pattern": {"x": 1}}, "bad_argument"),
        ("delete_everything", {}, "unknown_tool"),
        (None, {}, "unknown_tool"),
    ],
)
def test_a_bad_call_gives_an_error_category_and_leaves_the_state_alone(engine, name, arguments, category):
    state = opened_at_einstein(engine)
    before = BrowseState(list(state.seen), list(state.opened), state.current, list(state.results))
    result = run_call(engine, name, arguments, state)
    assert isinstance(result, CallResult) and result.error == category, result.text
    assert result.text.startswith("Error: ") and result.docids == ()
    assert state == before


def test_an_engine_failure_propagates_out_of_a_call():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    down = HttpEngine(f"http://127.0.0.1:{port}", timeout_s=2, retries=0)
    with pytest.raises(EngineError, match="ConnectionRefusedError"):
        run_call(down, "search", {"query": "Einstein"}, BrowseState())


def test_the_bundled_tools_are_search_and_get_document_and_run(engine):
    tools = bundled_tools()
    assert [tool["function"]["name"] for tool in tools] == ["search", "get_document"]
    state = BrowseState()
    for tool, value in zip(tools, ["Albert Einstein", "Albert_Einstein"]):
        (required,) = tool["function"]["parameters"]["required"]
        assert run_call(engine, tool["function"]["name"], {required: value}, state).error is None
