"""Bad input at the search env: every action scores 0 or 1 with a category, never an exception.

Named cases first (empty and whitespace queries, FTS5 syntax, a 1 MB query, unknown doc ids,
non-string arguments, deep nesting, 50 repeated calls, a missing or corrupt index), then property
tests over arbitrary queries, arguments, tool names and raw text (deterministic: derandomized,
fixed example budgets).
"""

from __future__ import annotations

import json
import time

import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pivot_envs.domains.search.tools import TOOL_NAMES

FUZZ = settings(max_examples=250, deadline=None, derandomize=True, report_multiple_bugs=False)
PIVOT_IDS = ["verdi/t0", "verdi/t1", "verdi/t3", "verdi/t4"]


def call(name: str, arguments) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"function": {"name": name, "arguments": arguments}}],
    }


@pytest.fixture(scope="module")
def env(search_pivots):
    made = gym.make("pivot/search-v0", pivots=search_pivots)
    yield made.unwrapped
    made.close()


def step(env, action, pivot_id: str = "verdi/t0") -> tuple[float, dict]:
    env.reset(options={"pivot": pivot_id})
    _, reward, terminated, truncated, info = env.step(action)
    json.dumps(info)
    assert reward in (0.0, 1.0) and terminated and not truncated
    assert info["category"] != "env_error", info["detail"]
    return reward, info


@pytest.mark.parametrize("query", ["", "   \n\t ", '"', "***", "^", "()", ":"])
def test_a_query_without_words_scores_zero_as_an_empty_query(env, query):
    reward, info = step(env, call("search", {"query": query}))
    assert (reward, info["category"], info["valid"]) == (0.0, "empty_query", True)


@pytest.mark.parametrize(
    "query",
    [
        '"La traviata',
        "La traviata*",
        "NEAR(La traviata)",
        "La OR traviata",
        "((La traviata",
        "title:traviata",
        "^traviata AND NOT opera",
        "traviata)) OR ((",
    ],
)
def test_fts5_syntax_in_a_query_is_searched_as_words_never_interpreted(env, query):
    reward, info = step(env, call("search", {"query": query}))
    assert info["valid"] and info["category"] == "evidence_reached"
    assert "[1] La traviata (docid: La_traviata" in info["output"]


def test_a_one_megabyte_query_scores_zero_as_too_long_and_quickly(env):
    started = time.perf_counter()
    reward, info = step(env, call("search", {"query": "traviata " * 116_509}))
    assert (reward, info["category"], info["valid"]) == (0.0, "query_too_long", True)
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("docid", ["No_such_article", "", "https://example.com/x", "x" * 100_000])
def test_an_unknown_document_scores_zero_as_unknown_docid(env, docid):
    reward, info = step(env, call("get_document", {"docid": docid}), "verdi/t1")
    assert reward == 0.0 and info["valid"] and info["category"] in ("unknown_docid", "bad_argument")


@pytest.mark.parametrize(
    "arguments",
    [
        {"query": 3},
        {"query": None},
        {"query": ["a", 1]},
        {"queries": []},
        {"queries": [{"q": 1}]},
        {"docid": {"a": 1}},
        {},
        '{"query": ',
        "[1, 2]",
    ],
)
def test_arguments_of_the_wrong_type_score_zero_with_a_category(env, arguments):
    name = "get_document" if "docid" in arguments else "search"
    reward, info = step(env, call(name, arguments))
    assert (
        reward == 0.0 and info["valid"] and info["category"] in ("bad_argument", "unparseable", "wrong_kind")
    )


def test_deeply_nested_arguments_score_zero_as_unparseable(env):
    nested: object = "traviata"
    for _ in range(5000):
        nested = [nested]
    reward, info = step(env, call("search", {"query": nested}))
    assert (reward, info["valid"]) == (0.0, True) and info["category"] in ("unparseable", "bad_argument")


def test_fifty_repeated_calls_are_refused_and_fifty_allowed_ones_run_within_the_step_bound(
    env, search_pivots
):
    calls = [{"function": {"name": "search", "arguments": {"query": "La traviata"}}}] * 50
    reward, info = step(env, {"role": "assistant", "content": None, "tool_calls": calls})
    assert (reward, info["category"], info["valid"]) == (0.0, "too_many_tool_calls", True)
    wide = gym.make("pivot/search-v0", pivots=search_pivots, limits={"max_calls": 50}).unwrapped
    started = time.perf_counter()
    reward, info = step(wide, {"role": "assistant", "content": None, "tool_calls": calls})
    assert info["valid"] and len(info["output"]) == 50 and time.perf_counter() - started < 10
    wide.close()


def test_an_unknown_tool_scores_zero_and_the_agent_is_told_the_tools(env):
    reward, info = step(env, call("delete_corpus", {}))
    assert (reward, info["category"]) == (0.0, "unknown_tool") and "get_document" in info["output"]


def test_a_corrupt_index_makes_the_step_invalid_with_the_engine_named(search_pivots, tmp_path):
    broken = tmp_path / "index.sqlite"
    broken.write_bytes(b"this is not a database" * 100)
    env = gym.make("pivot/search-v0", pivots=search_pivots, engine=str(broken)).unwrapped
    for action in (call("search", {"query": "opera"}), "Answer: Busseto"):
        reward, info = step(env, action)
        assert (reward, info["valid"], info["category"]) == (0.0, False, "infrastructure_error")
        assert "index.sqlite" in info["detail"]
    env.close()


# -- property tests ----------------------------------------------------------------------------------

odd_text = (
    st.text(max_size=60)
    | st.text(st.sampled_from('"*^():NEAR OR AND NOT\\\x00\n\t{}[]<>'), max_size=40)
    | st.builds(lambda a, s: a + s, st.text(max_size=10), st.characters(categories=["Cs"]))
    | st.text(max_size=1).map(lambda c: c * 20_000)
)
plain_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | odd_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
names = st.sampled_from(sorted(TOOL_NAMES)) | st.text(max_size=20)
arguments = (
    st.fixed_dictionaries({"query": odd_text})
    | st.fixed_dictionaries({"queries": st.lists(odd_text, max_size=7)})
    | st.fixed_dictionaries({"docid": odd_text | st.integers()})
    | st.fixed_dictionaries({"urls": st.lists(odd_text, max_size=7), "goal": odd_text})
    | st.fixed_dictionaries({"pattern": odd_text})
    | st.dictionaries(st.text(max_size=8), plain_json, max_size=4)
)


@FUZZ
@given(pivot=st.sampled_from(PIVOT_IDS), name=names, args=arguments, calls=st.integers(1, 5))
def test_any_call_scores_zero_or_one_with_a_category_and_never_raises(env, pivot, name, args, calls):
    action = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"function": {"name": name, "arguments": args}}] * calls,
    }
    reward, info = step(env, action, pivot)
    assert info["valid"]


@FUZZ
@given(pivot=st.sampled_from(PIVOT_IDS), text=odd_text, block=plain_json)
def test_any_raw_text_scores_zero_or_one_with_a_category_and_never_raises(env, pivot, text, block):
    for action in (text, f"{text}<tool_call>{json.dumps(block)}</tool_call>", f"Answer: {text}"):
        reward, info = step(env, action, pivot)
        assert info["valid"]
