"""The search verifier's levels on real steps (bundled engine), and answer normalisation.

Pivots (conftest): verdi/t0 searches "La traviata opera composer", t1 opens La_traviata, t2
searches "Giuseppe Verdi", t3 opens Giuseppe_Verdi, t4 answers Busseto; the evidence is
La_traviata and Giuseppe_Verdi.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re

import gymnasium as gym
import pytest

from pivot_envs.chat import calls_of
from pivot_envs.config import ConfigError
from pivot_envs.domains.search.answer import answer_matches, extract_answer, normalize_answer
from pivot_envs.domains.search.corpus import read_corpus
from pivot_envs.domains.search.env import bundled_pivots
from pivot_envs.domains.search.verifier import CALL_TEXT_EXTRA_CHARS, SearchVerifier, turn_kind
from pivot_envs.errors import UnknownNameError


def call(name: str, **arguments) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"function": {"name": name, "arguments": json.dumps(arguments)}}],
    }


@pytest.fixture(scope="module")
def envs(search_pivots):
    made = {
        level: gym.make("pivot/search-v0", pivots=search_pivots, verifier=level)
        for level in ("retrieval", "args", "name", "strict")
    }
    yield made
    for env in made.values():
        env.close()


def score(env, pivot_id: str, action) -> tuple[float, dict]:
    env.reset(options={"pivot": pivot_id})
    _, reward, _, _, info = env.step(action)
    return reward, info


def test_a_paraphrased_query_reaching_the_same_evidence_scores_one_under_retrieval_and_zero_under_args(envs):
    paraphrase = call("search", query="who composed the opera La traviata")
    reward, info = score(envs["retrieval"], "verdi/t0", paraphrase)
    assert (reward, info["category"], info["strict_reward"]) == (1.0, "evidence_reached", 0.0)
    assert score(envs["args"], "verdi/t0", paraphrase)[1]["category"] == "other_arguments"
    assert score(envs["args"], "verdi/t0", paraphrase)[0] == 0.0


def test_a_search_reaching_unseen_evidence_another_way_scores_one(envs):
    # "Busseto" finds Giuseppe_Verdi, evidence nothing in the prefix has shown yet.
    assert score(envs["retrieval"], "verdi/t0", call("search", query="Busseto"))[0] == 1.0


def test_a_search_that_only_finds_evidence_already_seen_scores_zero(envs):
    # At t2 La_traviata was found and read; the expert now looks for Verdi.
    reward, info = score(envs["retrieval"], "verdi/t2", call("search", query="traviata"))
    assert (reward, info["category"]) == (0.0, "evidence_missed")


def test_a_search_missing_the_evidence_scores_zero(envs):
    reward, info = score(envs["retrieval"], "verdi/t0", call("search", query="Pierre Curie wife"))
    assert (reward, info["category"], info["valid"]) == (0.0, "evidence_missed", True)


def test_opening_the_experts_document_or_unopened_evidence_scores_one_and_rereading_scores_zero(envs):
    assert score(envs["retrieval"], "verdi/t1", call("get_document", docid="La_traviata"))[0] == 1.0
    # Other evidence not yet opened: a step forward too, whatever the expert chose.
    assert score(envs["retrieval"], "verdi/t1", call("get_document", docid="Giuseppe_Verdi"))[0] == 1.0
    # The same document by its url, through the NeMo-Gym spelling of the open tool.
    url = "https://en.wikipedia.org/wiki/La_traviata"
    assert score(envs["retrieval"], "verdi/t1", call("browse", urls=[url], goal="who wrote it"))[0] == 1.0
    reward, info = score(envs["retrieval"], "verdi/t3", call("get_document", docid="La_traviata"))
    assert (reward, info["category"]) == (0.0, "other_document")
    assert score(envs["retrieval"], "verdi/t1", call("get_document", docid="Opera"))[0] == 0.0


def test_a_step_of_another_kind_than_the_experts_scores_zero(envs):
    reward, info = score(envs["retrieval"], "verdi/t0", "Answer: Busseto")
    assert (reward, info["category"]) == (0.0, "wrong_kind")
    assert "answered where the expert searched" in info["detail"]
    reward, info = score(envs["retrieval"], "verdi/t4", call("search", query="Busseto"))
    assert (reward, info["category"]) == (0.0, "wrong_kind")
    reward, info = score(envs["retrieval"], "verdi/t0", call("get_document", docid="Giuseppe_Verdi"))
    assert (reward, info["category"]) == (0.0, "wrong_kind")


def test_answers_score_one_only_on_a_normalised_match_with_the_answer_or_an_alias(envs):
    for text in (
        "Answer: Busseto",
        "answer:  the BUSSETO.",
        "Explanation: near Parma.\nExact Answer: Busseto\nConfidence: 90%",
        "Answer: Busseto, Italy",
        "Busseto",
    ):
        assert score(envs["retrieval"], "verdi/t4", text)[0] == 1.0, text
    for text in ("Answer: Parma", "Answer: Busseto or Parma", "I think it is a small town.", "Answer:"):
        reward, info = score(envs["retrieval"], "verdi/t4", text)
        assert (reward, info["category"]) == (0.0, "wrong_answer"), text


def test_a_message_never_scores_for_being_a_message_at_any_level(envs):
    for level in ("retrieval", "args", "name"):
        assert score(envs[level], "verdi/t4", "Answer: Parma")[0] == 0.0
        assert score(envs[level], "verdi/t4", "Answer: Busseto")[0] == 1.0


def test_the_args_level_ignores_case_whitespace_and_key_order_but_not_words(envs):
    same = call("search", query="  la TRAVIATA   opera composer ")
    assert score(envs["args"], "verdi/t0", same)[0] == 1.0
    assert score(envs["args"], "verdi/t0", call("search", query="La traviata composer"))[0] == 0.0


def test_the_name_level_accepts_any_call_of_the_experts_tool(envs):
    assert score(envs["name"], "verdi/t0", call("search", query="Pierre Curie wife"))[0] == 1.0
    assert score(envs["name"], "verdi/t0", call("get_document", docid="La_traviata"))[0] == 0.0


def test_the_strict_reward_is_reported_beside_every_level(envs, by_id):
    for level in ("retrieval", "args", "name"):
        assert score(envs[level], "verdi/t2", by_id["verdi/t2"].expert)[1]["strict_reward"] == 1.0
        assert (
            score(envs[level], "verdi/t2", call("search", query="giuseppe  verdi"))[1]["strict_reward"] == 0.0
        )
    assert score(envs["strict"], "verdi/t2", call("search", query="giuseppe  verdi"))[0] == 0.0


def test_query_stuffing_with_unrelated_keywords_never_scores_on_the_bundled_pivots():
    """The documented rate: 32 random title words (the most a query may hold) reach none of the
    191 bundled search pivots' targets (0 of 191); a 50-word query is refused as too long."""
    pivots = [p for p in bundled_pivots() if turn_kind(p.expert) == "search"]
    words = sorted({w.lower() for d in read_corpus() for w in re.findall(r"[A-Za-z]{5,}", d.title)})
    rng = random.Random(0)
    env = gym.make("pivot/search-v0", pivots=pivots)
    scored = 0.0
    for pivot in pivots:
        scored += score(env, pivot.id, call("search", query=" ".join(rng.sample(words, 32))))[0]
    assert scored / len(pivots) <= 0.02, f"{scored:.0f} of {len(pivots)} stuffed queries scored"
    reward, info = score(env, pivots[0].id, call("search", query=" ".join(rng.sample(words, 50))))
    assert (reward, info["category"]) == (0.0, "query_too_long")
    env.close()


def test_an_unknown_level_is_refused_by_name():
    with pytest.raises(UnknownNameError, match="did you mean 'retrieval'"):
        SearchVerifier("retreival")


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("Explanation: x\nExact Answer: Russell David Lyons\nConfidence: 80%", "Russell David Lyons"),
        ("The answer: 1943. Final Answer: 1944", "1944"),
        ("Answer:\nTrolltunga", "Trolltunga"),
        ("so it is \\boxed{42}", "42"),
        ("  just this  ", "just this"),
    ],
)
def test_the_answer_is_taken_after_the_last_label_or_is_the_whole_message(text, answer):
    assert extract_answer(text) == answer


def test_normalisation_folds_case_accents_punctuation_articles_and_spaces():
    assert normalize_answer("  The Gödel Prize!  ") == "godel prize"
    assert normalize_answer("Jean-Paul") == "jeanpaul"  # SQuAD drops punctuation, it does not split on it
    assert answer_matches("Answer: an apple", ["Apple"]) and not answer_matches("Answer: ...", ["..."])
    assert normalize_answer("x" * 1_000_000) == "x" * 2000  # a 1 MB answer is cut, not scanned


def test_an_expert_turn_of_several_kinds_is_matched_by_the_same_mix_only(by_id):
    mixed = dict(by_id["verdi/t0"].expert)
    mixed["tool_calls"] = [*mixed["tool_calls"], call("get_document", docid="La_traviata")["tool_calls"][0]]
    pivot = dataclasses.replace(by_id["verdi/t0"], expert=mixed)
    env = gym.make("pivot/search-v0", pivots=[pivot])
    assert score(env, pivot.id, mixed)[0] == 1.0
    reward, info = score(env, pivot.id, call("search", query="La traviata"))
    assert (reward, info["category"], info["valid"]) == (0.0, "wrong_kind", True)
    assert "where the expert called tools of several kinds" in info["detail"]
    env.close()


def test_a_find_scores_one_when_it_finds_the_experts_passages_whatever_the_case(by_id):
    # At verdi/t2 the document opened last is La_traviata; here the expert looks for Verdi in it.
    pivot = dataclasses.replace(by_id["verdi/t2"], expert=call("find", pattern="Verdi"))
    env = gym.make("pivot/search-v0", pivots=[pivot])
    assert score(env, pivot.id, pivot.expert)[0] == 1.0
    assert score(env, pivot.id, call("find", pattern="verdi"))[0] == 1.0
    reward, info = score(env, pivot.id, call("find", pattern="Piave"))
    assert (reward, info["category"]) == (0.0, "other_passages")
    reward, info = score(env, pivot.id, call("find", pattern="Busseto"))
    assert (reward, info["category"]) == (0.0, "other_passages") and info["output"].startswith("No match")
    env.close()


# -- a turn's extra calls, documents and words cost the reward (issue 35, R7) ---------------------------


def calls(*pairs: tuple[str, dict]) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"call_{n}", "function": {"name": name, "arguments": json.dumps(arguments)}}
            for n, (name, arguments) in enumerate(pairs)
        ],
    }


@pytest.fixture(scope="module")
def bundled_env():
    env = gym.make("pivot/search-v0")
    yield env
    env.close()


def test_opening_every_seen_document_scores_zero_though_the_experts_is_among_them(envs):
    envs["retrieval"].reset(options={"pivot": "verdi/t1"})
    seen = list(envs["retrieval"].unwrapped.replay.state.seen)
    assert "La_traviata" in seen and len(seen) == 5
    reward, info = score(envs["retrieval"], "verdi/t1", call("browse", urls=seen, goal="read them all"))
    assert (reward, info["category"], info["valid"]) == (0.0, "extra_documents", True)
    shotgun = calls(*(("get_document", {"docid": docid}) for docid in seen[:4]))
    assert score(envs["retrieval"], "verdi/t1", shotgun)[1]["category"] == "extra_documents"


def test_the_experts_document_with_one_more_or_twice_scores_zero(envs):
    for extra in ("Opera", "La_traviata"):
        turn = calls(("get_document", {"docid": "La_traviata"}), ("get_document", {"docid": extra}))
        reward, info = score(envs["retrieval"], "verdi/t1", turn)
        assert (reward, info["category"]) == (0.0, "extra_documents"), extra


def test_several_queries_in_one_turn_score_zero_where_the_expert_asked_one(envs):
    for turn in (
        call("search", queries=["Giuseppe Verdi", "Verdi"]),
        calls(("search", {"query": "Giuseppe Verdi"}), ("search", {"query": "Busseto"})),
    ):
        reward, info = score(envs["retrieval"], "verdi/t2", turn)
        assert (reward, info["category"]) == (0.0, "extra_queries")
        assert "asks for 2 queries, the expert's for 1" in info["detail"]


def test_a_query_stuffed_with_the_question_scores_zero_and_a_name_with_a_qualifier_scores_one(envs):
    question = "The composer of the opera La traviata was born near which small town?"
    reward, info = score(envs["retrieval"], "verdi/t2", call("search", query=f"Giuseppe Verdi {question}"))
    assert (reward, info["category"]) == (0.0, "query_stuffed")
    assert "ranked by 10 words" in info["detail"] and "the expert's by 2" in info["detail"]
    for reworded in ("who was Giuseppe Verdi", "Giuseppe Verdi born", "Verdi composer Italy"):
        assert score(envs["retrieval"], "verdi/t2", call("search", query=reworded))[0] == 1.0, reworded


def test_a_search_that_shows_again_what_was_seen_scores_zero(envs):
    # Verdi is new, but the other names bring back three documents the first search showed.
    reward, info = score(
        envs["retrieval"], "verdi/t2", call("search", query="Giuseppe Verdi Puccini Berlioz")
    )
    assert (reward, info["category"]) == (0.0, "known_results")
    assert "show 4 documents seen before and 1 new ones, the expert's 1 and 4" in info["detail"]


def test_finding_a_document_already_read_again_scores_zero(bundled_env):
    # search-001/t2: La_traviata was found and read; the expert now searches Giuseppe Verdi, whom the
    # first search also showed.
    reward, info = score(bundled_env, "search-001/t2", call("search", query="La traviata"))
    assert (reward, info["category"]) == (0.0, "evidence_missed")
    assert score(bundled_env, "search-001/t2", call("search", query="Verdi"))[0] == 1.0


def test_where_the_expert_finds_a_seen_document_again_a_search_must_rank_it_as_high(bundled_env):
    # search-004/t2: the first search showed Sergei_Eisenstein; the expert's search by name brings it first.
    reward, info = score(bundled_env, "search-004/t2", call("search", query="Battleship Potemkin"))
    assert (reward, info["category"]) == (0.0, "ranked_lower")
    assert (
        "at rank 2; the expert's search, which finds no evidence not seen before, brings it to rank 1"
        in (info["detail"])
    )
    assert score(bundled_env, "search-004/t2", call("search", query="Eisenstein film director"))[0] == 1.0
    # search-030/t2: the previous query again shows the document where it was, under the expert's.
    reward, info = score(bundled_env, "search-030/t2", call("search", query="Planck units"))
    assert (reward, info["category"]) == (0.0, "ranked_lower")


def test_a_failed_call_beside_a_working_one_costs_the_turn(by_id):
    expert = calls(("search", {"query": "Giuseppe Verdi"}), ("search", {"query": "Busseto"}))
    pivot = dataclasses.replace(by_id["verdi/t2"], expert=expert)
    env = gym.make("pivot/search-v0", pivots=[pivot])
    assert score(env, pivot.id, expert)[0] == 1.0
    reward, info = score(
        env, pivot.id, calls(("search", {"query": "Giuseppe Verdi"}), ("search", {"query": " "}))
    )
    assert (reward, info["category"], info["valid"]) == (0.0, "empty_query", True)
    env.close()


def test_a_find_repeated_in_one_turn_scores_zero(by_id):
    pivot = dataclasses.replace(by_id["verdi/t2"], expert=call("find", pattern="Verdi"))
    env = gym.make("pivot/search-v0", pivots=[pivot])
    reward, info = score(env, pivot.id, calls(("find", {"pattern": "Verdi"}), ("find", {"pattern": "verdi"})))
    assert (reward, info["category"]) == (0.0, "extra_finds")
    env.close()


def test_reworded_and_respelled_expert_steps_still_score_one_on_every_bundled_pivot(bundled_env):
    """What is right stays right: the expert's query lowercased, reversed or asked as "who is", in the
    NeMo-Gym list form or another spelling of the tool; its document by url, title or result number."""
    base = bundled_env.unwrapped
    missed = []
    for pivot in bundled_pivots():
        kind = turn_kind(pivot.expert)
        (name, arguments), *_ = calls_of(pivot.expert) or [(None, None)]
        base.reset(options={"pivot": pivot.id})
        if kind == "search":
            query = arguments["query"]
            variants = [
                call("search", query=query.lower()),
                call("search", query=" ".join(reversed(query.split()))),
                call("search", query=f"who is {query}"),
                call("search", queries=[query]),
                call("web_search", query=query),
            ]
        elif kind == "open":
            document = base.engine.get(arguments["docid"])
            number = base.replay.state.results.index(document.docid) + 1
            variants = [
                call("browse", urls=[document.url], goal="read it"),
                call("open", title=document.title),
                call("open", id=number),
            ]
        else:
            continue
        for variant in variants:
            if score(bundled_env, pivot.id, variant)[0] != 1.0:
                missed.append((pivot.id, variant["tool_calls"][0]["function"]))
    assert missed == []


# -- the text beside a turn's calls (call_text) ----------------------------------------------------------


def beside(message: dict, text: str) -> dict:
    return {**message, "content": text}


def test_the_expert_and_a_short_courtesy_text_beside_its_calls_score_one(envs, by_id):
    expert = by_id["verdi/t2"].expert
    for level in ("retrieval", "args"):
        assert score(envs[level], "verdi/t2", expert)[0] == 1.0
        for text in ("Let me search for Giuseppe Verdi.", "The opera is by Verdi; next, where he was born."):
            assert score(envs[level], "verdi/t2", beside(expert, text))[0] == 1.0, (level, text)
    # As raw completion text: the prose around the <tool_call> block is the text beside the call.
    raw = 'Let me look up the composer.\n<tool_call>\n{"name": "search", "arguments": {"query": "Giuseppe Verdi"}}\n</tool_call>'
    assert score(envs["retrieval"], "verdi/t2", raw)[0] == 1.0


def test_an_answer_beside_the_experts_calls_scores_zero(envs, by_id):
    expert = by_id["verdi/t2"].expert
    for text in ("Answer: Busseto", "I am sure now. Final Answer: Parma", "so it is \\boxed{Busseto}"):
        for level in ("retrieval", "args"):
            reward, info = score(envs[level], "verdi/t2", beside(expert, text))
            assert (reward, info["category"], info["valid"]) == (0.0, "answer_beside_call", True), (
                level,
                text,
            )
    reward, info = score(envs["retrieval"], "verdi/t1", beside(by_id["verdi/t1"].expert, "Answer: Busseto"))
    assert (reward, info["category"]) == (0.0, "answer_beside_call")
    assert "gives the answer 'busseto'" in info["detail"]
    # An empty label gives no answer.
    assert score(envs["retrieval"], "verdi/t2", beside(expert, "Searching for the answer:"))[0] == 1.0


def test_a_stuffed_text_beside_the_experts_calls_scores_zero(envs, by_id):
    expert = by_id["verdi/t2"].expert
    stuffed = "Busseto Parma Verdi opera " * 2400  # 60 KB
    for level in ("retrieval", "args"):
        reward, info = score(envs[level], "verdi/t2", beside(expert, stuffed))
        assert (reward, info["category"], info["valid"]) == (0.0, "call_text_too_long", True), level
    assert "at most 300 more (call_text_extra_chars)" in info["detail"]
    # The bound is the expert's text plus CALL_TEXT_EXTRA_CHARS, whitespace runs counted as one.
    assert CALL_TEXT_EXTRA_CHARS == 300
    assert score(envs["retrieval"], "verdi/t2", beside(expert, "x" * 300))[0] == 1.0
    assert (
        score(envs["retrieval"], "verdi/t2", beside(expert, "x" * 301))[1]["category"] == "call_text_too_long"
    )
    assert score(envs["retrieval"], "verdi/t2", beside(expert, "Verdi" + " " * 5000 + "."))[0] == 1.0


def test_the_bound_follows_the_experts_own_text_and_its_answer(by_id):
    reasoning = ("The opera's composer is Verdi; his birthplace is the question. " * 6).strip()  # 377 chars
    pivot = dataclasses.replace(by_id["verdi/t2"], expert=beside(by_id["verdi/t2"].expert, reasoning))
    env = gym.make("pivot/search-v0", pivots=[pivot])
    assert score(env, pivot.id, pivot.expert)[0] == 1.0
    assert score(env, pivot.id, beside(pivot.expert, reasoning + "x" * 300))[0] == 1.0
    assert (
        score(env, pivot.id, beside(pivot.expert, reasoning + "x" * 301))[1]["category"]
        == "call_text_too_long"
    )
    env.close()
    # An expert that states a provisional answer beside its call: the same answer passes, another does not.
    pivot = dataclasses.replace(
        pivot, expert=beside(pivot.expert, "Provisional answer: Busseto\nLet me check that.")
    )
    env = gym.make("pivot/search-v0", pivots=[pivot])
    assert score(env, pivot.id, beside(pivot.expert, "Answer: the BUSSETO"))[0] == 1.0
    assert score(env, pivot.id, beside(pivot.expert, "Answer: Parma"))[1]["category"] == "answer_beside_call"
    env.close()


def test_the_name_level_reads_no_text_beside_calls_unless_asked(envs, by_id, search_pivots):
    guess = beside(by_id["verdi/t2"].expert, "Answer: Parma")
    assert score(envs["name"], "verdi/t2", guess)[0] == 1.0
    env = gym.make(
        "pivot/search-v0", pivots=search_pivots, verifier="name", verifier_config={"call_text": True}
    )
    assert score(env, "verdi/t2", guess)[1]["category"] == "answer_beside_call"
    env.close()
    env = gym.make("pivot/search-v0", pivots=search_pivots, verifier_config={"call_text": False})
    assert score(env, "verdi/t2", guess)[0] == 1.0
    env.close()
    with pytest.raises(ConfigError, match="call_text_extra_chars"):
        SearchVerifier("retrieval", call_text_extra_chars=-1)
