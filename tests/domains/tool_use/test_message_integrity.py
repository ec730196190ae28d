"""A message (or the text beside the right calls) must say what the expert said (audit 2, H6-H11): text
hidden in an HTML comment is not said, a code in capitals and a number in words are facts, a message
may not swap a fact of the expert's for another, and a keyword list is no reply."""

from __future__ import annotations

from tool_use_helpers import step

from pivot_envs.chat import text_of
from pivot_envs.domains.tool_use.content import spelled_facts, visible
from pivot_envs.domains.tool_use.verifier import STOPWORDS

LONG_REPLY = "tau-airline/task20/trial0/t5"  # a long expert message: a few words more fit its precision


def _pivot(pivots, pivot_id):
    return next(p for p in pivots if p.id == pivot_id)


def _with_text(pivot, text):
    return {**pivot.expert, "content": f"{text_of(pivot.expert)} {text}".strip()}


def test_html_comments_are_hidden_text_and_dropped_before_judging():
    assert visible("I can help. <!-- I cannot help. --> Bye") == "I can help.   Bye"
    assert visible("Shown <!-- never closed, never shown") == "Shown  "
    assert visible("no comment at all") == "no comment at all"


def test_the_expert_message_hidden_in_a_comment_beside_a_refusal_scores_zero(recorded_env, message_pivots):
    # Before: 239 of 242 message pivots scored 1 (the refusal was a short surplus beside the hidden reply).
    for pivot in message_pivots[:20]:
        refusal = f"<!-- {text_of(pivot.expert)} --> Sorry, I cannot help with that."
        reward, info, _ = step(recorded_env, pivot, refusal)
        assert (reward, info["category"]) == (0.0, "message_content_different"), pivot.id
    # A comment beside the right reply costs nothing: it is not said.
    pivot = message_pivots[0]
    assert step(recorded_env, pivot, f"{text_of(pivot.expert)} <!-- note to self -->")[0] == 1.0


def test_codes_in_capitals_and_numbers_in_words_are_facts():
    assert spelled_facts("Confirmation QXWZKP, code HATHAT.", STOPWORDS) == {"qxwzkp", "hathat"}
    assert spelled_facts("Refund: five Thousand dollars, for one of them.", STOPWORDS) == {"five", "thousand"}
    # Not codes: four or nine capitals, a function word in capitals, a word in title or lower case.
    assert spelled_facts("NOTE: IMPORTANT, WHICH Qxwzkp qxwzkp", STOPWORDS) == set()


def test_a_letter_code_nobody_gave_is_an_invented_fact(recorded_env, message_pivots):
    # Before: 242 of 242 (only words with a digit were facts).
    pivot = message_pivots[0]
    reward, info, _ = step(recorded_env, pivot, f"{text_of(pivot.expert)} Confirmation QXWZKP.")
    assert (reward, info["category"]) == (0.0, "message_facts_invented") and "qxwzkp" in info["detail"]


def test_an_amount_in_words_nobody_gave_is_an_invented_fact(recorded_env, pivots):
    # Before: 93 of 242 (those whose precision leaves room for three words) scored 1.
    pivot = _pivot(pivots, LONG_REPLY)
    reward, info, _ = step(recorded_env, pivot, f"{text_of(pivot.expert)} Refund: five thousand dollars.")
    assert (reward, info["category"]) == (0.0, "message_facts_invented")
    assert "thousand" in info["detail"]  # "five" the conversation says (the policy's "five passengers")
    # Facts the conversation stated may still be repeated.
    assert (
        step(recorded_env, pivot, f"{text_of(pivot.expert)} This is for reservation 1N99U6 on May 19.")[0]
        == 1.0
    )


def test_an_old_fact_swapped_for_another_of_the_conversation_is_a_substitution(recorded_env, pivots):
    # The expert restates May 24 (an earlier assistant turn stated it, so rule 3 does not require it); the
    # conversation states May 15 too, so rule 4 allowed the swap. Before: 50 of 53 such swaps scored 1.
    pivot = _pivot(pivots, "tau-airline/task6/trial0/t10")
    text = text_of(pivot.expert)
    assert "May 24" in text
    swapped = text.replace("May 24", "May 15")
    reward, info, _ = step(recorded_env, pivot, swapped)
    assert (reward, info["category"]) == (0.0, "message_facts_substituted"), info["detail"]


def test_a_keyword_list_of_the_experts_heaviest_words_is_too_short(recorded_env, pivots):
    # Precision 1 and recall over one half, but no sentence. Before: 195 of 242 such lists scored 1.
    pivot = _pivot(pivots, "tau-airline/task6/trial0/t2")
    reward, info, _ = step(recorded_env, pivot, "m05knl uhdahf two profile found")
    assert (reward, info["category"]) == (0.0, "message_too_short"), info["detail"]


def test_text_beside_the_right_calls_may_not_state_a_letter_code_or_an_amount_in_words(
    recorded_env, call_pivots
):
    # Before: 169 of 169 call pivots kept the calls' reward with either.
    pivot = call_pivots[0]
    for claim, fact in (("Confirmation QXWZKP.", "qxwzkp"), ("Refund: five thousand dollars.", "thousand")):
        reward, info, _ = step(recorded_env, pivot, _with_text(pivot, claim))
        assert (reward, info["category"]) == (0.0, "call_text_facts_invented"), claim
        assert fact in info["detail"]
    # The expert's own turn, and one with a comment beside it, still score 1.
    assert step(recorded_env, pivot, dict(pivot.expert))[0] == 1.0
    assert step(recorded_env, pivot, _with_text(pivot, "<!-- Confirmation QXWZKP. -->"))[0] == 1.0
