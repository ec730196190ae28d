"""Messages and free text are accepted for their content (issue 35, R8), not for overlapping common words."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from importlib import resources

import gymnasium as gym
import pytest
from tool_use_helpers import expert_call, first, hermes, measured, step

from pivot_envs import Pivot
from pivot_envs.chat import text_of
from pivot_envs.config import ConfigError
from pivot_envs.domains.tool_use.content import WordWeights, expert_messages, word_counts
from pivot_envs.domains.tool_use.verifier import STOPWORDS, FunctionalConfig, FunctionalVerifier
from pivot_envs.pivot import write_pivots

MB = 1 << 20


def earlier_assistant_texts(pivot) -> list[str]:
    return [text_of(m) for m in pivot.messages if m["role"] == "assistant" and text_of(m)]


def scored(env, pivots, action_of) -> list[str]:
    """The ids of the pivots where the action `action_of(pivot)` (skipped when None) scores above 0."""
    hits = []
    for pivot in pivots:
        action = action_of(pivot)
        if action is not None and step(env, pivot, action)[0] > 0:
            hits.append(pivot.id)
    return hits


@pytest.fixture(scope="module")
def corpus_words(message_pivots):
    """(the 40 words most expert messages use, the vocabulary of the expert messages)."""
    frequency, vocabulary = Counter(), set()
    for text in expert_messages(message_pivots):
        words = word_counts(text, STOPWORDS)
        frequency.update(words.keys())
        vocabulary.update(words)
    return " ".join(w for w, _ in frequency.most_common(40)), sorted(vocabulary)


def test_every_bundled_expert_message_and_its_light_rewording_scores_one(recorded_env, message_pivots):
    for pivot in message_pivots:
        text = text_of(pivot.expert)
        reworded = " ".join(w.upper() if i % 3 == 0 else w for i, w in enumerate(text.split()))
        # Commas spaced out, but not those inside a number: "$17 ,021" would be two other amounts.
        reworded = re.sub(r",(?!\d{3}\b)", " ,", reworded.replace(" please", ""))
        for action in (text, reworded):
            reward, info, _ = step(recorded_env, pivot, action)
            assert (reward, info["category"]) == (1.0, "correct"), (pivot.id, info["detail"])


def test_one_fixed_message_of_the_words_most_expert_messages_use_scores_nowhere(
    recorded_env, message_pivots, corpus_words
):
    # Issue 35, R8: the token-set F1 >= 0.35 accepted it at 67 of 242 message pivots.
    assert scored(recorded_env, message_pivots, lambda p: corpus_words[0]) == []


def test_repeating_the_previous_assistant_message_scores_nowhere(recorded_env, message_pivots):
    # Issue 35, R8: accepted at 79 of 200 pivots with an earlier assistant message.
    def previous(pivot):
        texts = earlier_assistant_texts(pivot)
        return texts[-1] if texts else None

    assert scored(recorded_env, message_pivots, previous) == []


def test_the_expert_message_plus_50_random_words_scores_nowhere(recorded_env, message_pivots, corpus_words):
    # Issue 35, R8: accepted at 211 of 242.
    vocabulary = corpus_words[1]

    def padded(pivot):
        rng = random.Random(pivot.id)
        return text_of(pivot.expert) + " " + " ".join(rng.choice(vocabulary) for _ in range(50))

    assert scored(recorded_env, message_pivots, padded) == []


def test_saying_the_expert_message_twice_or_echoing_the_user_scores_nowhere(recorded_env, message_pivots):
    assert scored(recorded_env, message_pivots, lambda p: f"{text_of(p.expert)}\n\n{text_of(p.expert)}") == []

    def last_user(pivot):
        return next((text_of(m) for m in reversed(pivot.messages) if m["role"] == "user"), None)

    assert scored(recorded_env, message_pivots, last_user) == []


def test_a_message_with_other_amounts_than_the_expert_states_first_is_facts_missing(recorded_env, pivots):
    # The expert corrects the total the previous turn gave ($329 -> $299); the old amounts overlap
    # nearly every word but are the wrong reply.
    pivot = next(p for p in pivots if p.id == "tau-airline/task11/trial0/t8")
    wrong = text_of(pivot.expert).replace("299", "329").replace("201", "171")
    reward, info, _ = step(recorded_env, pivot, wrong)
    assert (reward, info["category"]) == (0.0, "message_facts_missing")
    assert "201" in info["detail"] and "299" in info["detail"]


def test_a_message_closer_to_an_earlier_turn_than_to_the_experts_scores_zero(recorded_env, pivots):
    # The expert restates its previous answer in other words; repeating the previous turn verbatim
    # shares most of the words (recall 0.88, precision 0.90) but is not this turn's reply.
    pivot = next(p for p in pivots if p.id == "tau-airline/task44/trial0/t4")
    reward, info, _ = step(recorded_env, pivot, earlier_assistant_texts(pivot)[-1])
    assert (reward, info["category"]) == (0.0, "message_repeats_earlier_turn")


def equivalent_messages() -> dict:
    data = resources.files("pivot_envs.domains.tool_use").joinpath("data", "equivalent_messages.json")
    return json.loads(data.read_text())


def paired_replies(pivots) -> dict[str, list[tuple]]:
    """(pivot, the reply of another trial meant to be equivalent there) by split, tuning or held-out."""
    by_id, data = {p.id: p for p in pivots}, equivalent_messages()
    replies: dict[str, list[tuple]] = {"tuning": [], "held-out": []}
    for pair in data["pairs"]:
        for here, there in ((pair["a"], pair["b"]), (pair["b"], pair["a"])):
            replies[pair["split"]].append((by_id[here], text_of(by_id[there].expert)))
    for reply in data["one_way"]:
        replies[reply["split"]].append((by_id[reply["pivot"]], reply["message"]))
    return replies


def test_replies_of_other_trials_that_say_the_same_are_accepted_where_they_say_little_else(
    recorded_env, pivots
):
    # Hand-paired replies that say the same thing in other words (data/equivalent_messages.json). The
    # surplus allowance and ceiling were chosen on the 50 tuning replies (20 accepted before them and the
    # number forms), and checked on the 35 held-out ones (12 before). The old token-set F1 accepted all
    # 50, and also 78 of 199 neighbouring (wrong) replies. A judge (message_check="judge") tells the
    # rest apart.
    replies = paired_replies(pivots)
    accepted = {
        split: [pivot.id for pivot, reply in items if step(recorded_env, pivot, reply)[0] == 1.0]
        for split, items in replies.items()
    }
    assert (len(replies["tuning"]), len(replies["held-out"])) == (50, 35)
    assert len(accepted["tuning"]) >= 24 and len(accepted["held-out"]) >= 14
    assert {
        "tau-airline/task18/trial0/t0",
        "tau-airline/task36/trial1/t1",
        "tau-airline/task49/trial1/t0",
        "tau-airline/task24/trial0/t0",  # "Sure, I can help ... you would like to modify": a word or two more
        "tau-airline/task48/trial1/t0",
    } <= set(accepted["tuning"])
    assert {
        "tau-airline/task6/trial0/t0",  # "modify" for "change"
        "tau-airline/task26/trial0/t4",  # "However, the reservation ..." for a numbered list
    } <= set(accepted["held-out"])


def test_a_failed_trials_wrong_reply_at_the_same_step_scores_zero(recorded_env, pivots):
    # Other flights or totals, another member tier, a refund the policy does not allow: close in words,
    # wrong in facts or in what it does.
    by_id = {p.id: p for p in pivots}
    wrong = equivalent_messages()["wrong"]
    assert len(wrong) == 8
    for reply in wrong:
        assert step(recorded_env, by_id[reply["pivot"]], reply["message"])[0] == 0.0, reply["differs"]


def test_dates_and_amounts_are_the_same_facts_however_they_are_written():
    assert word_counts("Flight on May 9th, 2024 for $1,194.", STOPWORDS) == word_counts(
        "Flight on 2024-05-09 for $1194.", STOPWORDS
    )
    assert word_counts("Departure 09:00 on Sept. 3", STOPWORDS) == word_counts(
        "Departure 9:00 on 09-03", STOPWORDS
    )
    assert word_counts("You may book it in May", STOPWORDS) == Counter({"book": 1})  # no day: no date


def test_the_numbers_of_a_numbered_list_are_not_facts_a_reply_must_state(pivots):
    # The expert numbers its two reservations ("1. **Reservation IFOYYZ** ... 2. ..."); the same reply
    # from another task's trial says "However, the reservation NQNU5R ...": 1 and 2 were facts to state.
    pivot = next(p for p in pivots if p.id == "tau-airline/task26/trial0/t4")
    compiled = FunctionalVerifier().plan(pivot).compiled_message
    assert {"1", "2"} <= compiled.bag.keys() and not {"1", "2"} & compiled.new_facts
    assert "nqnu5r" in compiled.known_facts  # a word with a digit the user gave


def test_a_message_that_states_a_fact_the_conversation_never_stated_scores_zero(recorded_env, pivots):
    # A confirmation number nobody gave: 6% of the message's word weight, within the precision rule.
    pivot = next(p for p in pivots if p.id == "tau-airline/task20/trial0/t5")
    reward, info, _ = step(
        recorded_env, pivot, text_of(pivot.expert) + " Your confirmation number is QX7Z41."
    )
    assert (reward, info["category"]) == (0.0, "message_facts_invented") and "qx7z41" in info["detail"]
    # Facts the conversation stated may be repeated: the reservation id the user gave, the flight's date.
    repeated = text_of(pivot.expert) + " This is for reservation 1N99U6 on May 19."
    assert step(recorded_env, pivot, repeated)[0] == 1.0


def test_the_users_message_or_the_previous_answer_appended_to_the_right_reply_scores_zero(
    recorded_env, message_pivots
):
    def last(pivot, role):
        return next((text_of(m) for m in reversed(pivot.messages) if m["role"] == role and text_of(m)), None)

    def with_user(pivot):
        return f"{text_of(pivot.expert)}\n\n{last(pivot, 'user')}"

    def with_previous_answer(pivot):
        previous = last(pivot, "assistant")
        return f"{text_of(pivot.expert)}\n\n{previous}" if previous else None

    # 44 and 13 of 242 before: a fifth of a long reply's weight may be another text, and an echo was one.
    # The five left append a fact and a word or two ("My user ID is amelia_sanchez_4739.").
    assert len(scored(recorded_env, message_pivots, with_user)) <= 5
    assert scored(recorded_env, message_pivots, with_previous_answer) == []
    pivot = next(p for p in message_pivots if p.id == "tau-airline/task20/trial0/t5")
    reward, info, _ = step(recorded_env, pivot, with_user(pivot))
    assert (reward, info["category"]) == (0.0, "message_repeats_earlier_turn")


def test_a_short_reply_may_say_a_word_or_two_more_but_not_itself_twice(recorded_env, message_pivots):
    pivot = next(p for p in message_pivots if p.id == "tau-airline/task6/trial0/t0")
    reply = (
        "I can help you with that. Could you please provide your user ID and the reservation ID for the "
        "flight you want to modify?"
    )  # the expert's "would like to change": precision 0.66, within the surplus allowance
    assert step(recorded_env, pivot, reply)[0] == 1.0
    shortest = min(message_pivots, key=lambda p: len(text_of(p.expert)))
    reward, info, _ = step(recorded_env, shortest, f"{text_of(shortest.expert)} {text_of(shortest.expert)}")
    assert (reward, info["category"]) == (0.0, "message_content_different")


def test_a_long_reply_may_not_carry_more_than_the_surplus_ceiling_beyond_the_experts(recorded_env, pivots):
    # The longest expert message (seven reservations) and a sentence of its own: precision 0.87 passed.
    pivot = next(p for p in pivots if p.id == "tau-airline/task30/trial1/t9")
    padded = text_of(pivot.expert) + (
        " I also checked the seat maps, meal options, lounge access, wifi plans and upgrade waitlists for "
        "every one of these flights."
    )
    reward, info, _ = step(recorded_env, pivot, padded)
    assert (reward, info["category"]) == (0.0, "message_content_different") and "over 40" in info["detail"]


def test_the_neighbouring_reply_of_the_same_conversation_is_rarely_accepted(recorded_env, message_pivots):
    by_conversation: dict[str, list] = {}
    for pivot in message_pivots:
        by_conversation.setdefault(pivot.id.rsplit("/", 1)[0], []).append(pivot)
    following = {
        a.id: text_of(b.expert) for turns in by_conversation.values() for a, b in zip(turns, turns[1:])
    }
    hits = scored(recorded_env, message_pivots, lambda p: following.get(p.id))
    # The two left restate the same answer (task18/trial1/t5, task44/trial0/t3); 78 of 199 before.
    assert len(following) == 199 and len(hits) <= 2


def test_word_weights_come_from_a_fixed_corpus_so_a_pivot_subset_scores_alike(message_pivots):
    pivot = message_pivots[40]
    text = " ".join(text_of(pivot.expert).split()[:-4]) + " Thank you for flying with us today."
    full = gym.make("pivot/tool-use-v0", backend="recorded").unwrapped
    subset = gym.make("pivot/tool-use-v0", pivots=message_pivots[38:42], backend="recorded").unwrapped
    assert step(full, pivot, text)[1]["detail"] == step(subset, pivot, text)[1]["detail"]


def test_message_corpus_reads_the_word_weights_from_a_pivot_file(tmp_path, message_pivots):
    path = tmp_path / "mine.jsonl"
    write_pivots(message_pivots[:3], path)
    mine = FunctionalVerifier(message_corpus=str(path)).content.weights
    bundled = FunctionalVerifier().content.weights
    assert mine.documents == 3 and bundled.documents == 236  # distinct texts of 242 messages
    assert mine("zeppelin") == pytest.approx(1 + 1.3862944)  # ln(4 / 1) + 1: a word no message says
    assert bundled("reservation") < bundled("nonstop") < bundled("zeppelin")


def test_weights_and_word_bags_are_what_the_check_claims():
    weights = WordWeights.of(["the flight is late", "a flight", "late again", "late again"], STOPWORDS)
    assert weights.documents == 3  # distinct texts
    assert weights("flight") == pytest.approx(1 + 0.2876821)  # ln(4 / 3) + 1
    assert weights("unseen") >= weights("late") >= 1.0
    assert word_counts("The Flight, the FLIGHT!", STOPWORDS) == Counter({"flight": 2})
    assert word_counts("Yes, please.", STOPWORDS) == Counter({"yes": 1, "please": 1})  # nothing else to keep
    assert word_counts("a b c d", frozenset(), most=3) is None


def test_free_text_arguments_padded_with_a_repeated_or_random_words_do_not_match(
    recorded_env, call_pivots, corpus_words
):
    pivot = first(call_pivots, "transfer_to_human_agents")
    name, arguments = expert_call(pivot)
    summary = arguments["summary"]
    rng, vocabulary = random.Random(0), corpus_words[1]
    for padded in (
        summary + " note" * 5000,  # one word, 30 KB: the old token-set F1 saw one extra word
        summary + " " + " ".join(rng.choice(vocabulary) for _ in range(50)),
    ):
        reward, info, _ = step(recorded_env, pivot, hermes(name, {"summary": padded}))
        assert (reward, info["category"]) == (0.0, "argument_value_different")
    shortened = " ".join(summary.split()[: len(summary.split()) * 4 // 5])
    assert step(recorded_env, pivot, hermes(name, {"summary": shortened}))[0] == 1.0


def test_a_megabyte_message_is_refused_in_bounded_time(recorded_env, message_pivots):
    pivot = message_pivots[0]
    text = (text_of(pivot.expert) + "\n") * (MB // len(text_of(pivot.expert)))
    (reward, info, _), seconds, _ = measured(step, recorded_env, pivot, text)
    assert (reward, info["category"]) == (0.0, "message_content_different") and seconds < 5


def test_the_content_thresholds_are_validated():
    for name in ("message_recall", "message_precision", "text_recall", "text_precision"):
        with pytest.raises(ConfigError, match=f"FunctionalConfig.{name} = 1.5: must be in"):
            FunctionalConfig(**{name: 1.5})
    for name in ("message_surplus_allowance", "message_surplus_ceiling", "message_echo"):
        with pytest.raises(ConfigError, match=f"FunctionalConfig.{name} = -1: must be in"):
            FunctionalConfig(**{name: -1})


def test_a_pivot_without_earlier_turns_or_facts_is_judged_by_its_words_alone():
    expert = {"role": "assistant", "content": "Your booking is confirmed for Tuesday."}
    pivot = Pivot(
        id="mine/1", domain="tool-use", messages=[{"role": "system", "content": "s"}], expert=expert
    )
    verifier = FunctionalVerifier()
    assert (
        verifier.verify(pivot, {"role": "assistant", "content": "Booking confirmed: Tuesday."}).reward == 1.0
    )
    assert verifier.verify(pivot, {"role": "assistant", "content": "It is cancelled."}).reward == 0.0


def test_a_long_text_is_read_as_a_stream_with_the_same_bag_as_a_short_one():
    words = "the flight x1 is late and the reservation is yes " * 10_000  # 500 KB, past the stream size
    assert word_counts(words, STOPWORDS, most=40_001) == word_counts(words, STOPWORDS)
    assert word_counts(words, STOPWORDS, most=39_999) is None
    only_stopwords = "the a is " * 30_000
    assert word_counts(only_stopwords, STOPWORDS, most=90_000) == Counter(
        {"the": 30_000, "a": 30_000, "is": 30_000}
    )
    assert word_counts(only_stopwords, STOPWORDS, most=89_999) is None
