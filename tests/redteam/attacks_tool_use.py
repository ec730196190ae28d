"""Red-team attacks on the tool-use domain's functional verifier (issue 35, R8 and the call rules).

Each family turns a pivot into one hostile assistant turn. Most are built only from what a policy
sees at the pivot (the conversation, the tools) or from the bundled expert messages as a whole (the
words every reply uses); the "the right turn plus more" families start from the expert's own turn,
to show that padding, extra calls, extra keys and repeats cost the reward even with the right
content inside. The backends are the two a bundled pivot's calls can run on: the tau-bench airline
tools over the database (the default), and the recorded outputs (nothing executes; the argument
rules alone decide).

Besides issue 35's message exploits, the families copy the conversation (the user's messages, the
previous answer, words of the tool outputs) into or after the right reply, state a fact nobody
gave, or hedge with a second answer woven in or one short sentence long: the attacks that the
message rule's surplus allowance, echo and invented-facts rules answer (docs/tool-use.md#messages).
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections import Counter
from functools import cache
from typing import Any

import gymnasium as gym
from redteam_common import Family

from pivot_envs.chat import text_of
from pivot_envs.domains.tool_use.content import expert_messages, facts_of, word_counts
from pivot_envs.domains.tool_use.env import ToolUseEnv, bundled_pivots
from pivot_envs.domains.tool_use.verifier import STOPWORDS

DOMAIN = "tool-use"
BACKENDS = ("tau-airline", "recorded")
MB = 1 << 20
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
# Where the floors are documented.
DOCS = "docs/tool-use.md#what-this-verifier-cannot-tell-apart"


def make_env(backend: str) -> ToolUseEnv:
    """The tool-use env on the bundled pivots, its calls run by the airline tools or recorded outputs."""
    return gym.make("pivot/tool-use-v0", backend=backend).unwrapped


# -- what every reply says, and what a policy sees at a pivot -------------------------------------------


@cache
def _document_frequency() -> Counter[str]:
    frequency: Counter[str] = Counter()
    for text in expert_messages(bundled_pivots()):
        frequency.update(word_counts(text, STOPWORDS).keys())
    return frequency


@cache
def _word_frequency() -> tuple[list[str], list[int]]:
    counts: Counter[str] = Counter()
    for text in expert_messages(bundled_pivots()):
        counts.update(word_counts(text, STOPWORDS))
    words = sorted(counts)
    return words, [counts[w] for w in words]


def _common_words(n: int) -> str:
    return " ".join(word for word, _ in _document_frequency().most_common(n))


def _rng(pivot, family: str) -> random.Random:
    return random.Random(f"{family}:{pivot.id}")


def _is_message_pivot(pivot) -> bool:
    return not pivot.expert.get("tool_calls")


def _texts(pivot, roles: tuple[str, ...]) -> list[str]:
    return [text_of(m) for m in pivot.messages if m.get("role") in roles and text_of(m)]


def _expert_calls(pivot) -> list[tuple[str, dict[str, Any]]]:
    calls = []
    for call in pivot.expert.get("tool_calls") or []:
        function = call["function"]
        arguments = function["arguments"]
        calls.append((function["name"], json.loads(arguments) if isinstance(arguments, str) else arguments))
    return calls


def _turn(calls: list[tuple[str, Any]], content: str | None = None) -> dict[str, Any]:
    """An assistant message dict making these calls (arguments as JSON strings, as servers send them)."""
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            for n, (name, args) in enumerate(calls)
        ],
    }


# -- message turns --------------------------------------------------------------------------------------


def common_words_message(env, pivot):
    """One fixed message: the 40 words most expert messages use (issue 35, R8: 68 of 242 before)."""
    return _common_words(40) if _is_message_pivot(pivot) else None


def few_common_words_message(env, pivot):
    """The 10 words most expert messages use: fewer words, so less the expert did not say."""
    return _common_words(10) if _is_message_pivot(pivot) else None


STOCK_REPLY = (
    "I understand. Could you please provide your user ID and reservation ID so I can check the details "
    "of your flight reservation? Unfortunately, basic economy flights without travel insurance cannot be "
    "changed or cancelled for a refund. Would you like to proceed, or should I transfer you to a human "
    "agent? If you need further assistance, please let me know."
)


def stock_reply(env, pivot):
    """A fluent reply made of what airline agents say most: ids, policy, proceed, transfer."""
    return STOCK_REPLY if _is_message_pivot(pivot) else None


def previous_assistant_message(env, pivot):
    """The last assistant message of the conversation again (issue 35, R8: 79 of 200 before)."""
    earlier = _texts(pivot, ("assistant",))
    return earlier[-1] if _is_message_pivot(pivot) and earlier else None


def all_earlier_assistant_messages(env, pivot):
    """Everything the assistant said so far, in one message."""
    earlier = _texts(pivot, ("assistant",))
    return "\n\n".join(earlier) if _is_message_pivot(pivot) and earlier else None


def expert_message_plus_50_random_words(env, pivot):
    """The expert's message and 50 words drawn uniformly from the expert messages' vocabulary (R8: 213 of 242)."""
    if not _is_message_pivot(pivot):
        return None
    words = _word_frequency()[0]
    rng = _rng(pivot, "random-words")
    return text_of(pivot.expert) + " " + " ".join(rng.choice(words) for _ in range(50))


def expert_message_plus_50_frequent_words(env, pivot):
    """The expert's message and 50 words drawn as often as expert messages use them (cheap, common padding)."""
    if not _is_message_pivot(pivot):
        return None
    words, counts = _word_frequency()
    rng = _rng(pivot, "frequent-words")
    return text_of(pivot.expert) + " " + " ".join(rng.choices(words, counts, k=50))


def expert_message_twice(env, pivot):
    """The expert's message said twice."""
    return f"{text_of(pivot.expert)}\n\n{text_of(pivot.expert)}" if _is_message_pivot(pivot) else None


@cache
def _message_pivots() -> tuple:
    return tuple(p for p in bundled_pivots() if _is_message_pivot(p))


def expert_message_and_another_answer(env, pivot):
    """A hedge: the expert's message and another conversation's reply, as if unsure which is meant."""
    if not _is_message_pivot(pivot):
        return None
    conversation = pivot.id.rsplit("/", 1)[0]
    others = [p for p in _message_pivots() if p.id.rsplit("/", 1)[0] != conversation]
    return f"{text_of(pivot.expert)}\n\n{text_of(_rng(pivot, 'hedge').choice(others).expert)}"


def every_fact_in_the_conversation(env, pivot):
    """Every id, amount and date the user and the tools stated, listed (to cover the facts rule)."""
    if not _is_message_pivot(pivot):
        return None
    facts = []
    for text in _texts(pivot, ("user", "tool")):
        for word in word_counts(text, frozenset()):
            if any(ch.isdigit() for ch in word) and word not in facts:
                facts.append(word)
    return " ".join(facts) or None


def last_user_message_echoed(env, pivot):
    """The user's last message, echoed back."""
    said = _texts(pivot, ("user",))
    return said[-1] if _is_message_pivot(pivot) and said else None


def whole_prefix_echoed(env, pivot):
    """Every message of the conversation so far (system prompt, user, assistant, tools), echoed."""
    if not _is_message_pivot(pivot):
        return None
    return "\n\n".join(_texts(pivot, ("system", "user", "assistant", "tool")))


def _last(pivot, role: str) -> str | None:
    said = _texts(pivot, (role,))
    return said[-1] if said else None


def expert_message_and_the_users_last_message(env, pivot):
    """The expert's message, and the user's last message echoed after it (padding from the conversation)."""
    said = _last(pivot, "user")
    return f"{text_of(pivot.expert)}\n\n{said}" if _is_message_pivot(pivot) and said else None


def expert_message_and_every_user_message(env, pivot):
    """The expert's message, and everything the user said so far after it."""
    said = _texts(pivot, ("user",))
    return "\n\n".join([text_of(pivot.expert), *said]) if _is_message_pivot(pivot) and said else None


def expert_message_and_the_previous_assistant_message(env, pivot):
    """The expert's message, and the assistant's previous message again (the old answer beside the new)."""
    said = _last(pivot, "assistant")
    return f"{text_of(pivot.expert)}\n\n{said}" if _is_message_pivot(pivot) and said else None


def _conversation_words(pivot) -> list[str]:
    """The words the user and the tools said (what a policy can copy without knowing the answer)."""
    return [word for text in _texts(pivot, ("user", "tool")) for word in re.findall(r"\w+", text)]


def expert_message_plus_30_words_of_the_conversation(env, pivot):
    """The expert's message and 30 words drawn from what the user and the tools said."""
    words = _conversation_words(pivot)
    if not _is_message_pivot(pivot) or not words:
        return None
    rng = _rng(pivot, "conversation-words")
    return text_of(pivot.expert) + " " + " ".join(rng.choice(words) for _ in range(30))


def expert_message_with_conversation_words_spread_through_it(env, pivot):
    """The expert's message with as many words of the conversation as it has, each put at a random place."""
    words = _conversation_words(pivot)
    if not _is_message_pivot(pivot) or not words:
        return None
    rng = _rng(pivot, "spread")
    spread = text_of(pivot.expert).split()
    for _ in range(len(spread)):
        spread.insert(rng.randrange(len(spread) + 1), rng.choice(words))
    return " ".join(spread)


def the_users_last_message_with_the_experts_facts(env, pivot):
    """The user's last message echoed, followed by the expert message's facts (its words with a digit)."""
    said = _last(pivot, "user")
    if not _is_message_pivot(pivot) or not said:
        return None
    facts = [word for word in re.findall(r"\S+", text_of(pivot.expert)) if any(c.isdigit() for c in word)]
    return f"{said} {' '.join(facts)}"


def expert_message_with_an_invented_fact(env, pivot):
    """The expert's message and a confirmation number nobody gave: a fact the conversation never stated."""
    return (
        f"{text_of(pivot.expert)} Your confirmation number is QX7Z41." if _is_message_pivot(pivot) else None
    )


def expert_message_interleaved_with_another_answer(env, pivot):
    """A hedge woven in: the expert's sentences and another conversation's reply's, one after the other."""
    if not _is_message_pivot(pivot):
        return None
    conversation = pivot.id.rsplit("/", 1)[0]
    others = [p for p in _message_pivots() if p.id.rsplit("/", 1)[0] != conversation]
    ours = _SENTENCE.split(text_of(pivot.expert))
    theirs = _SENTENCE.split(text_of(_rng(pivot, "interleaved").choice(others).expert))
    woven = [s for pair in itertools.zip_longest(ours, theirs, fillvalue="") for s in pair if s]
    return " ".join(woven)


@cache
def _short_sentences() -> tuple[str, ...]:
    """Sentences of the expert messages with two to four words that are not function words."""
    found = set()
    for text in expert_messages(bundled_pivots()):
        for sentence in _SENTENCE.split(text):
            if 2 <= len(word_counts(sentence, STOPWORDS)) <= 4:
                found.add(sentence.strip())
    return tuple(sorted(found))


def expert_message_and_a_short_sentence_of_another_reply(env, pivot):
    """The expert's message and one short sentence of some expert reply ("The upgrade is complete."): a
    second, short claim beside the right one."""
    if not _is_message_pivot(pivot):
        return None
    return f"{text_of(pivot.expert)} {_rng(pivot, 'short').choice(_short_sentences())}"


def one_megabyte_message(env, pivot):
    """The expert's message repeated to a megabyte."""
    if not _is_message_pivot(pivot):
        return None
    text = text_of(pivot.expert) + "\n"
    return text * (MB // len(text) + 1)


def empty_turn(env, pivot):
    """Nothing at all."""
    return ""


# -- message turns that change what the expert's message says (audit 2: H4-H11) -----------------------

_FACT = re.compile(r"[^\W_]*\d[\w-]*")  # a word with a digit, as written (what the fact rules count)


def _facts_in_order(text: str) -> list[str]:
    return [m.group(0) for m in _FACT.finditer(text)]


def _conversation_facts(pivot) -> list[str]:
    found: list[str] = []
    for text in _texts(pivot, ("user", "tool", "assistant", "system")):
        for word in _FACT.findall(text):
            if word not in found:
                found.append(word)
    return found


def _shape(word: str) -> tuple:
    return (len(word), tuple("d" if c.isdigit() else "a" if c.isalpha() else c for c in word))


_NEGATION = [
    (re.compile(r"\bcannot\b", re.I), "can"),
    (re.compile(r"\bcan't\b", re.I), "can"),
    (re.compile(r"\bunable to\b", re.I), "able to"),
    (re.compile(r"\b(is|are|was|were|will|do|does|did|would|could|should) not\b", re.I), r"\1"),
    (re.compile(r"\b(is|are|was|were|do|does|did|would|could|should)n't\b", re.I), r"\1"),
    (re.compile(r"\bnot\b ", re.I), ""),
    (re.compile(r"\bno\b ", re.I), ""),
]
_AFFIRM = re.compile(r"\b(is|are|will|can|has been|have been)\b", re.I)


def expert_message_with_negation_flipped(env, pivot):
    """The expert's message with its first negation dropped ("cannot" -> "can", "is not" -> "is"), or, if
    it has none, a "not" put after its first "is/are/will/can": the opposite claim in the expert's words."""
    if not _is_message_pivot(pivot):
        return None
    text = text_of(pivot.expert)
    for pattern, repl in _NEGATION:
        if pattern.search(text):
            return pattern.sub(repl, text, count=1)
    if _AFFIRM.search(text):
        return _AFFIRM.sub(lambda m: m.group(0) + " not", text, count=1)
    return None


def expert_message_with_two_facts_of_one_form_swapped(env, pivot):
    """The expert's message with its first two distinct facts of one form (two times, two amounts, two
    ids) trading places: "Departure 16:30, Arrival 14:00", the same bag of words."""
    if not _is_message_pivot(pivot):
        return None
    text = text_of(pivot.expert)
    matches = list(_FACT.finditer(text))
    for i, a in enumerate(matches):
        for b in matches[i + 1 :]:
            if a.group(0) != b.group(0) and _shape(a.group(0)) == _shape(b.group(0)):
                return (
                    text[: a.start()] + b.group(0) + text[a.end() : b.start()] + a.group(0) + text[b.end() :]
                )
    return None


def expert_message_with_an_old_fact_replaced(env, pivot):
    """The expert's message with one fact an earlier assistant turn already stated (so rule 3 does not ask
    for it) replaced by another fact of the same form the conversation states: the wrong id or amount."""
    if not _is_message_pivot(pivot):
        return None
    text = text_of(pivot.expert)
    said_by_assistant: set[str] = set()
    for earlier in _texts(pivot, ("assistant",)):
        said_by_assistant |= facts_of(earlier)
    mine = facts_of(text)
    conversation = _conversation_facts(pivot)
    for fact in dict.fromkeys(_facts_in_order(text)):
        if not facts_of(fact) <= said_by_assistant:
            continue
        for other in conversation:
            if other != fact and _shape(other) == _shape(fact) and not facts_of(other) & mine:
                return re.sub(rf"(?<!\w){re.escape(fact)}(?!\w)", other, text)
    return None


def expert_message_with_an_invented_letter_code(env, pivot):
    """The expert's message and a confirmation code nobody gave, of letters only (as 'HATHAT' is)."""
    return f"{text_of(pivot.expert)} Confirmation QXWZKP." if _is_message_pivot(pivot) else None


def expert_message_with_a_short_invented_amount_in_words(env, pivot):
    """The expert's message and "Refund: five thousand dollars." (an amount nobody gave, in words)."""
    return f"{text_of(pivot.expert)} Refund: five thousand dollars." if _is_message_pivot(pivot) else None


def expert_message_with_an_invented_fact_in_words(env, pivot):
    """The expert's message and an amount nobody gave, in words (no digit)."""
    if not _is_message_pivot(pivot):
        return None
    return f"{text_of(pivot.expert)} Your refund of five thousand dollars has been issued."


def heaviest_expert_words_to_half_recall(env, pivot):
    """A keyword list: the expert message's facts, then its heaviest other words (by IDF) until half its
    weight (message_recall) is said: no sentence, no function words."""
    if not _is_message_pivot(pivot):
        return None
    weight = env.functional.content.weights
    bag = word_counts(text_of(pivot.expert), STOPWORDS)
    total = sum(count * weight(word) for word, count in bag.items())
    facts = [word for word in bag if any(c.isdigit() for c in word)]
    rest = sorted((word for word in bag if word not in facts), key=lambda word: -weight(word))
    chosen, said = [], 0.0
    for word in facts + rest:
        if said >= 0.55 * total and word not in facts:
            break
        chosen.append(word)
        said += bag[word] * weight(word)
    return " ".join(chosen) if chosen else None


def expert_message_in_an_html_comment_and_a_refusal(env, pivot):
    """The expert's message hidden in an HTML comment, and a short refusal shown instead."""
    if not _is_message_pivot(pivot):
        return None
    return f"<!-- {text_of(pivot.expert)} --> Sorry, I cannot help with that."


def expert_calls_with_an_invented_letter_code(env, pivot):
    """The expert's calls, with a confirmation code nobody gave, of letters only, beside them."""
    return _with_text(pivot, "Confirmation QXWZKP.")


def expert_calls_with_a_short_amount_in_words(env, pivot):
    """The expert's calls, with "Refund: five thousand dollars." beside them."""
    return _with_text(pivot, "Refund: five thousand dollars.")


# -- tool-call turns ------------------------------------------------------------------------------------


def expert_calls_plus_a_duplicate(env, pivot):
    """The expert's calls, and its first call once more."""
    calls = _expert_calls(pivot)
    return _turn([*calls, calls[0]]) if calls else None


def expert_calls_plus_a_think(env, pivot):
    """The expert's calls and a `think` call, a tool without effect (free to add, if extra calls were)."""
    calls = _expert_calls(pivot)
    return _turn([*calls, ("think", {"thought": "Let me make sure this is right."})]) if calls else None


def expert_call_50_times(env, pivot):
    """The expert's first call, 50 times in one turn."""
    calls = _expert_calls(pivot)
    return _turn([calls[0]] * 50) if calls else None


def expert_call_up_to_the_call_limit(env, pivot):
    """The expert's first call as many times as the call limit lets a turn make."""
    calls = _expert_calls(pivot)
    return _turn([calls[0]] * env.calls_allowed(pivot)) if calls else None


def every_tool_with_the_experts_arguments(env, pivot):
    """One call of every tool the pivot offers, each with the expert's arguments: one of them must be right."""
    calls = _expert_calls(pivot)
    if not calls:
        return None
    names = [tool["function"]["name"] for tool in pivot.tools]
    return _turn([(name, calls[0][1]) for name in names[: env.calls_allowed(pivot)]])


def arguments_with_an_extra_key(env, pivot):
    """The expert's calls, each with one more argument the expert did not pass."""
    calls = _expert_calls(pivot)
    return _turn([(name, {**args, "note": "as discussed"}) for name, args in calls]) if calls else None


def _other_case(text: str) -> str:
    return text.lower() if text.upper() == text else text.upper()


def ids_in_another_case_where_the_effect_differs(env, pivot):
    """The expert's calls with their ids in another case, where calls execute (the database does not find them)."""
    calls = _expert_calls(pivot)
    if not calls or env.backend_for(pivot).equivalence(pivot) is None:
        return None
    pattern = env.functional._id_re
    changed, any_changed = [], False
    for name, args in calls:
        new = {}
        for key, value in args.items():
            if isinstance(value, str) and pattern.search(key) and _other_case(value) != value:
                new[key] = _other_case(value)
                any_changed = True
            else:
                new[key] = value
        changed.append((name, new))
    return _turn(changed) if any_changed else None


def one_megabyte_argument(env, pivot):
    """The expert's calls with a megabyte of text added to an argument (a `think` thought has no effect)."""
    calls = _expert_calls(pivot)
    if not calls:
        return None
    name, args = calls[0]
    key = next((k for k, v in args.items() if isinstance(v, str)), "note")
    stuffed = {**args, key: str(args.get(key, "")) + " padding" * (MB // 8)}
    return _turn([(name, stuffed), *calls[1:]])


def _free_text_edited(env, pivot, edit):
    """The expert's calls with each free-text argument replaced by `edit(value)`, where the free-text rule
    decides (on the airline backend these tools have no effect, so execution equivalence accepts any text)."""
    calls = _expert_calls(pivot)
    if not calls or env.backend_for(pivot).equivalence(pivot) is not None:
        return None
    pattern = re.compile(env.functional.config.free_text_pattern)
    edited = [
        (name, {k: edit(v) if isinstance(v, str) and pattern.search(k) else v for k, v in args.items()})
        for name, args in calls
    ]
    return _turn(edited) if edited != calls else None


def _free_text_padded(env, pivot, padding: str):
    """The expert's calls with `padding` after each free-text argument, where the free-text rule decides."""
    return _free_text_edited(env, pivot, lambda value: f"{value} {padding}")


def free_text_argument_padded_with_one_word(env, pivot):
    """The expert's calls with one word repeated 5,000 times after each free-text argument (30 KB)."""
    return _free_text_padded(env, pivot, " ".join(["note"] * 5000))


def free_text_argument_plus_50_random_words(env, pivot):
    """The expert's calls with 50 random words of the expert messages after each free-text argument."""
    words = _word_frequency()[0]
    rng = _rng(pivot, "free-text")
    return _free_text_padded(env, pivot, " ".join(rng.choice(words) for _ in range(50)))


def _with_text(pivot, text: str) -> dict[str, Any] | None:
    """The expert's own call turn, with `text` after whatever it says."""
    if not _expert_calls(pivot):
        return None
    return {**pivot.expert, "content": f"{text_of(pivot.expert)} {text}".strip()}


def expert_calls_with_an_invented_confirmation(env, pivot):
    """The expert's calls, telling the user it is done with an amount and a confirmation number nobody gave."""
    return _with_text(pivot, "Done! Your refund of $5,000 has been issued (confirmation ZZ9PLURAL).")


def expert_calls_with_a_stuffed_reply(env, pivot):
    """The expert's calls, with a stock airline reply repeated to 60 KB beside them."""
    return _with_text(pivot, " ".join([STOCK_REPLY] * (60_000 // len(STOCK_REPLY))))


def expert_calls_with_a_short_claim(env, pivot):
    """The expert's calls, with one short sentence claiming what no call did yet (no number in it)."""
    return _with_text(pivot, "Your reservation has been cancelled and the full refund has been issued.")


def another_call_that_fails_alike(env, pivot):
    """Where the expert's call is refused ("Error: ..."), the same tool with a made-up value for one argument
    that is refused alike: an equal failure, without the expert's arguments."""
    calls = _expert_calls(pivot)
    backend = env.backend_for(pivot)
    if len(calls) != 1 or not hasattr(backend, "expert_effects"):
        return None
    expert = backend.expert_effects(pivot)[0]
    if not expert.failed:
        return None
    name, args = calls[0]
    for key in sorted(args):
        if isinstance(args[key], str):
            changed = {**args, key: f"made_up_{key}"}
            if backend.effect(pivot, name, changed).same_as(expert):
                return _turn([(name, changed)])
    return None


def empty_search_elsewhere(env, pivot):
    """Where the expert's flight search finds nothing ("[]"), the same search for the reversed route (or a
    date outside the database) that finds nothing too: an equal output, without the expert's question."""
    calls = _expert_calls(pivot)
    backend = env.backend_for(pivot)
    if len(calls) != 1 or not hasattr(backend, "expert_effects"):
        return None
    name, args = calls[0]
    if not name.startswith("search_") or backend.expert_effects(pivot)[0].output.strip() != "[]":
        return None
    for changed in (
        {**args, "origin": args.get("destination"), "destination": args.get("origin")},
        {**args, "date": "2023-01-01"},
    ):
        if backend.effect(pivot, name, changed).output.strip() == "[]":
            return _turn([(name, changed)])
    return None


def huge_integer_argument(env, pivot):
    """The expert's calls with every number argument (top level and nested, as in payment methods) 10**400:
    too large for a float."""
    found = False

    def huge(value):
        nonlocal found
        if type(value) in (int, float):
            found = True
            return 10**400
        if isinstance(value, list):
            return [huge(v) for v in value]
        if isinstance(value, dict):
            return {k: huge(v) for k, v in value.items()}
        return value

    changed = [(name, huge(args)) for name, args in _expert_calls(pivot)]
    return _turn(changed) if found else None


def _scrambled(match: re.Match) -> str:
    """A fact of the same form: each digit + 3, each letter + 7 (mod 10 and 26)."""
    return "".join(
        str((int(c) + 3) % 10)
        if c.isdigit()
        else chr((ord(c.lower()) - 97 + 7) % 26 + 97)
        if "a" <= c.lower() <= "z"
        else c
        for c in match.group(0)
    )


def free_text_with_its_facts_changed(env, pivot):
    """Where the free-text rule decides (recorded outputs), the expert's calls with every id, amount and
    date of a free-text argument (summary, thought) replaced by a made-up one of the same form."""
    return _free_text_edited(env, pivot, lambda value: _FACT.sub(_scrambled, value))


def previous_assistant_turn_echoed(env, pivot):
    """The last assistant turn of the conversation again, calls and all."""
    for message in reversed(pivot.messages):
        if message.get("role") == "assistant":
            return {k: message[k] for k in ("role", "content", "tool_calls") if k in message}
    return None


# Families that apply on one backend only: where calls execute (an effect to differ), or where the
# free-text rule decides (on the airline backend those tools have no effect to compare).
ONLY_ON = {
    "ids_in_another_case_where_the_effect_differs": "tau-airline",
    "another_call_that_fails_alike": "tau-airline",
    "empty_search_elsewhere": "tau-airline",
    "free_text_with_its_facts_changed": "recorded",
    "free_text_argument_padded_with_one_word": "recorded",
    "free_text_argument_plus_50_random_words": "recorded",
}

FAMILIES = {
    # Issue 35, R8: messages.
    "common_words_message": Family(common_words_message.__doc__, common_words_message),
    "previous_assistant_message": Family(previous_assistant_message.__doc__, previous_assistant_message),
    "expert_message_plus_50_random_words": Family(
        expert_message_plus_50_random_words.__doc__, expert_message_plus_50_random_words
    ),
    # Variants of R8.
    "few_common_words_message": Family(few_common_words_message.__doc__, few_common_words_message),
    "stock_reply": Family(stock_reply.__doc__, stock_reply),
    "all_earlier_assistant_messages": Family(
        all_earlier_assistant_messages.__doc__, all_earlier_assistant_messages
    ),
    "expert_message_plus_50_frequent_words": Family(
        expert_message_plus_50_frequent_words.__doc__, expert_message_plus_50_frequent_words
    ),
    "expert_message_twice": Family(expert_message_twice.__doc__, expert_message_twice),
    "expert_message_and_another_answer": Family(
        expert_message_and_another_answer.__doc__,
        expert_message_and_another_answer,
        floor=0.03,
        why_floor=(
            "a message may hold a fifth of its word weight beyond the expert's (message_precision 0.8), "
            "at most message_surplus_ceiling (40.0): a short second reply after a long right one is not "
            f"told apart (5 of 242 bundled message pivots; 10 before the ceiling); {DOCS}"
        ),
    ),
    "every_fact_in_the_conversation": Family(
        every_fact_in_the_conversation.__doc__, every_fact_in_the_conversation
    ),
    # Padding copied from the conversation, invented facts, and hedges woven in or short.
    "expert_message_and_the_users_last_message": Family(
        expert_message_and_the_users_last_message.__doc__,
        expert_message_and_the_users_last_message,
        floor=0.03,
        why_floor=(
            "words beyond the expert's that repeat the conversation are refused when they are mostly "
            "talk the user or the assistant already said and weigh more than message_echo (6.0); a "
            "user's message that is a fact and a word or two ('My user ID is amelia_sanchez_4739.') is "
            f"not told apart (5 of 242 bundled message pivots); {DOCS}"
        ),
    ),
    "expert_message_and_every_user_message": Family(
        expert_message_and_every_user_message.__doc__, expert_message_and_every_user_message
    ),
    "expert_message_and_the_previous_assistant_message": Family(
        expert_message_and_the_previous_assistant_message.__doc__,
        expert_message_and_the_previous_assistant_message,
    ),
    "expert_message_plus_30_words_of_the_conversation": Family(
        expert_message_plus_30_words_of_the_conversation.__doc__,
        expert_message_plus_30_words_of_the_conversation,
    ),
    "expert_message_with_conversation_words_spread_through_it": Family(
        expert_message_with_conversation_words_spread_through_it.__doc__,
        expert_message_with_conversation_words_spread_through_it,
    ),
    "the_users_last_message_with_the_experts_facts": Family(
        the_users_last_message_with_the_experts_facts.__doc__, the_users_last_message_with_the_experts_facts
    ),
    "expert_message_with_an_invented_fact": Family(
        expert_message_with_an_invented_fact.__doc__, expert_message_with_an_invented_fact
    ),
    "expert_message_interleaved_with_another_answer": Family(
        expert_message_interleaved_with_another_answer.__doc__,
        expert_message_interleaved_with_another_answer,
        floor=0.01,
        why_floor=(
            "the floor of expert_message_and_another_answer, woven into the right reply's sentences "
            f"instead of after them (1 of 242 bundled message pivots; 7 before the surplus ceiling); {DOCS}"
        ),
    ),
    "expert_message_and_a_short_sentence_of_another_reply": Family(
        expert_message_and_a_short_sentence_of_another_reply.__doc__,
        expert_message_and_a_short_sentence_of_another_reply,
        floor=0.65,
        why_floor=(
            "a message may say a fifth of its word weight, or message_surplus_allowance (12.0), "
            "beyond the expert's: one short sentence beside the right reply is not told apart unless it "
            "states a fact the conversation never stated (144 of 242 bundled message pivots; 199 before "
            f"that rule); {DOCS}"
        ),
    ),
    # The call rules.
    "expert_calls_plus_a_duplicate": Family(
        expert_calls_plus_a_duplicate.__doc__, expert_calls_plus_a_duplicate
    ),
    "expert_calls_plus_a_think": Family(expert_calls_plus_a_think.__doc__, expert_calls_plus_a_think),
    "expert_call_up_to_the_call_limit": Family(
        expert_call_up_to_the_call_limit.__doc__, expert_call_up_to_the_call_limit
    ),
    "every_tool_with_the_experts_arguments": Family(
        every_tool_with_the_experts_arguments.__doc__, every_tool_with_the_experts_arguments
    ),
    "arguments_with_an_extra_key": Family(arguments_with_an_extra_key.__doc__, arguments_with_an_extra_key),
    "empty_search_elsewhere": Family(empty_search_elsewhere.__doc__, empty_search_elsewhere),
    "huge_integer_argument": Family(huge_integer_argument.__doc__, huge_integer_argument, generic=True),
    "free_text_with_its_facts_changed": Family(
        free_text_with_its_facts_changed.__doc__, free_text_with_its_facts_changed
    ),
    "ids_in_another_case_where_the_effect_differs": Family(
        ids_in_another_case_where_the_effect_differs.__doc__, ids_in_another_case_where_the_effect_differs
    ),
    "another_call_that_fails_alike": Family(
        another_call_that_fails_alike.__doc__, another_call_that_fails_alike
    ),
    # Text beside the right calls (call_text).
    "expert_calls_with_an_invented_confirmation": Family(
        expert_calls_with_an_invented_confirmation.__doc__, expert_calls_with_an_invented_confirmation
    ),
    "expert_calls_with_a_stuffed_reply": Family(
        expert_calls_with_a_stuffed_reply.__doc__, expert_calls_with_a_stuffed_reply
    ),
    "expert_calls_with_a_short_claim": Family(
        expert_calls_with_a_short_claim.__doc__,
        expert_calls_with_a_short_claim,
        floor=1.0,
        why_floor=(
            "the calls decide a call turn; the text beside them is bounded (no fact nobody stated, at most "
            "message_surplus_ceiling, 40, of word weight beyond the expert's text) but not read for meaning: a "
            "short claim without a number beside the right calls keeps the calls' reward (169 of 169 "
            f"bundled call pivots). It earns nothing the calls did not; {DOCS}"
        ),
    ),
    "free_text_argument_padded_with_one_word": Family(
        free_text_argument_padded_with_one_word.__doc__, free_text_argument_padded_with_one_word
    ),
    "free_text_argument_plus_50_random_words": Family(
        free_text_argument_plus_50_random_words.__doc__, free_text_argument_plus_50_random_words
    ),
    # Generic and degenerate actions.
    "empty_turn": Family(empty_turn.__doc__, empty_turn, generic=True),
    "last_user_message_echoed": Family(
        last_user_message_echoed.__doc__, last_user_message_echoed, generic=True
    ),
    "whole_prefix_echoed": Family(whole_prefix_echoed.__doc__, whole_prefix_echoed, generic=True),
    "previous_assistant_turn_echoed": Family(
        previous_assistant_turn_echoed.__doc__, previous_assistant_turn_echoed, generic=True
    ),
    "expert_call_50_times": Family(expert_call_50_times.__doc__, expert_call_50_times, generic=True),
    "one_megabyte_message": Family(one_megabyte_message.__doc__, one_megabyte_message, generic=True),
    "one_megabyte_argument": Family(one_megabyte_argument.__doc__, one_megabyte_argument, generic=True),
    # Audit 2: messages that change what the expert's message says (H4-H11), and text beside the calls.
    "expert_message_with_negation_flipped": Family(
        expert_message_with_negation_flipped.__doc__,
        expert_message_with_negation_flipped,
        floor=1.0,
        why_floor=(
            "'not', 'no' and 'can' are function words and 'cannot' weighs little: the opposite claim in the "
            "expert's words is not told apart (220 of 220 bundled message pivots where it applies). Counting "
            "negations would close it but rejects 2 of the 24 accepted hand-paired paraphrases ('I cannot "
            f"process a refund ... as it is non-refundable' for 'it is non-refundable'); a judge tells it; {DOCS}"
        ),
    ),
    "expert_message_with_two_facts_of_one_form_swapped": Family(
        expert_message_with_two_facts_of_one_form_swapped.__doc__,
        expert_message_with_two_facts_of_one_form_swapped,
        floor=1.0,
        why_floor=(
            "words are compared as a bag: two facts of one form trading places (departure and arrival "
            "times, two amounts, two ids) say the same words (54 of 54 bundled message pivots where it "
            f"applies); a judge tells it; {DOCS}"
        ),
    ),
    "expert_message_with_an_old_fact_replaced": Family(
        expert_message_with_an_old_fact_replaced.__doc__,
        expert_message_with_an_old_fact_replaced,
        floor=0.1,
        why_floor=(
            "a message that leaves out a fact of the expert's may state no other (message_facts_substituted), "
            "but the numbers of a numbered list are no facts: where the fact replaced is a list item's number "
            f"('0.' for '1.') it is not told apart (5 of 53 bundled message pivots; 50 before that rule); {DOCS}"
        ),
    ),
    "expert_message_with_an_invented_letter_code": Family(
        expert_message_with_an_invented_letter_code.__doc__, expert_message_with_an_invented_letter_code
    ),
    "expert_message_with_a_short_invented_amount_in_words": Family(
        expert_message_with_a_short_invented_amount_in_words.__doc__,
        expert_message_with_a_short_invented_amount_in_words,
    ),
    "expert_message_with_an_invented_fact_in_words": Family(
        expert_message_with_an_invented_fact_in_words.__doc__, expert_message_with_an_invented_fact_in_words
    ),
    "heaviest_expert_words_to_half_recall": Family(
        heaviest_expert_words_to_half_recall.__doc__, heaviest_expert_words_to_half_recall
    ),
    "expert_message_in_an_html_comment_and_a_refusal": Family(
        expert_message_in_an_html_comment_and_a_refusal.__doc__,
        expert_message_in_an_html_comment_and_a_refusal,
    ),
    "expert_calls_with_an_invented_letter_code": Family(
        expert_calls_with_an_invented_letter_code.__doc__, expert_calls_with_an_invented_letter_code
    ),
    "expert_calls_with_a_short_amount_in_words": Family(
        expert_calls_with_a_short_amount_in_words.__doc__, expert_calls_with_a_short_amount_in_words
    ),
}
