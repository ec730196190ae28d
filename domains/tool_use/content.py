"""How the functional verifier judges text by its content: message turns and free-text arguments.

Text is compared with the expert's as bags of words (NFKC, case-folded, English function words
dropped, numbers written alike: "May 19" is "5-19" as in "2024-05-19", "1,194" is "1194"), each
word weighted by its inverse document frequency over a corpus of expert messages, so that words
every reply says ("reservation", "assist", "proceed") weigh little and the words that make this
reply this reply (an id, an amount, "nonstop", "non-refundable") weigh much.
Counts matter (a bag, not a set): the expert's text twice is half padding. Text matches when

1. it states at least `recall` of the expert text's weight (it says what the expert said), and
2. at least `precision` of its own weight is the expert's (it says little the expert did not:
   padding, a second answer beside the right one, or a repeated text all cost reward). For a
   message, the weight it says beyond the expert's (its surplus) may instead be up to an
   `allowance` (two or three words: "Sure, I can help" for "I can help") when that is less than
   the expert message's own weight, and is never more than a `ceiling`, however long the expert's.

A message turn must also pass the rules of the conversation:

3. it states every fact of the expert's message that no earlier assistant turn stated: the words
   with a digit (ids, amounts, dates, flight numbers, counts; not the numbers of a numbered list);
   and where it leaves out any fact of the expert's message, it states no fact (a word with a digit,
   a code) the expert's message does not: an old fact swapped for another of the conversation;
4. it states no fact that neither the expert's message nor the conversation (system prompt, user,
   assistant and tool turns) states: no invented id, amount or date, no code written in 5-8
   capitals ("QXWZKP", as the letter-only "HATHAT" is an id) and no number in words ("five
   thousand"; "one" is a pronoun too often to count);
5. the words it says beyond the expert's, facts aside, are not mostly (`ECHO_SHARE`) words the user
   or the assistant already said, where they weigh more than `echo` (the user's last message
   appended to the right reply is an echo; "for reservation 1N99U6" repeats a fact);
6. it is not closer to an earlier turn of the conversation (the assistant's or the user's) than to
   the expert's message: repeating what was already said is not this turn's reply, even where it
   overlaps this one;
7. it has at least `MIN_LENGTH_SHARE` as many word tokens (function words included) as the expert's
   message: a list of the expert's heaviest words is no sentence.

Text inside an HTML comment (`<!-- ... -->`, to the end if unclosed) is hidden where the reply is
rendered: it is dropped from both texts before they are judged.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from pivot_envs.chat import text_of

if TYPE_CHECKING:
    from pivot_envs.pivot import Pivot

_TOKEN = re.compile(r"\w+")
_DIGIT = re.compile(r"\d")
_LONG_TEXT = 1 << 16  # characters; a longer text is tokenized as a stream, stopping at `most` words
_MONTHS = {
    name: str(number)
    for number, names in enumerate(
        (
            "jan january",
            "feb february",
            "mar march",
            "apr april",
            "may",
            "jun june",
            "jul july",
            "aug august",
            "sep sept september",
            "oct october",
            "nov november",
            "dec december",
        ),
        start=1,
    )
    for name in names.split()
}
# A month name and a day ("May 19", "may 9th") is the ISO date's month and day ("05-19": "5", "19");
# one pattern per month, each starting with its name, which a search finds fast.
_DATES = {name: re.compile(rf"\b{name}\.?\s+(\d{{1,2}}(?:st|nd|rd|th)?)\b(?![.,]\d)") for name in _MONTHS}
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")  # "1,194" is "1194"
_THREE_DIGITS_AFTER_A_COMMA = re.compile(r",\d{3}(?!\d)")  # found faster than _THOUSANDS (no lookbehind)
_LIST_ITEM = re.compile(r"(?m)^[ \t]*0*(\d{1,3})[.)](?=\s)")  # "1. ..." numbers a list; it states no fact
ECHO_SHARE = 0.9  # the talk a message adds, this much made of earlier turns' words, echoes them
MIN_LENGTH_SHARE = 0.5  # a message has at least this share of the expert message's word tokens
_HIDDEN = re.compile(r"<!--.*?(?:-->|\Z)", re.S)  # an HTML comment: not shown, so not said
_CODE = re.compile(r"\b[A-Z]{5,8}\b")  # a word in 5-8 capitals is written as a code ("HATHAT")
# Numbers in words: a fact as "5000" is ("one" is left out: "which one", "one of them").
_NUMBER_WORDS = frozenset(
    """zero two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen
    seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand
    million billion trillion""".split()
)


def visible(text: str) -> str:
    """The text as shown: HTML comments (to the text's end if unclosed) dropped."""
    return _HIDDEN.sub(" ", text) if "<!--" in text else text


def spelled_facts(text: str, stopwords: frozenset[str]) -> set[str]:
    """The facts of a text written without a digit, case-folded: its codes (words in 5-8 capitals, function
    words aside) and its numbers in words."""
    normalized = unicodedata.normalize("NFKC", text)
    codes = {code.casefold() for code in _CODE.findall(normalized)} - stopwords
    return codes | _NUMBER_WORDS.intersection(_TOKEN.findall(normalized.casefold()))


def spellable(text: str) -> set[str]:
    """The words of a text, in any case, that would be facts written in capitals or as numbers in words
    (what `spelled_facts` finds in a text that writes them so)."""
    return {
        word
        for word in _TOKEN.findall(unicodedata.normalize("NFKC", text).casefold())
        if word in _NUMBER_WORDS or (5 <= len(word) <= 8 and word.isascii() and word.isalpha())
    }


def _stated_numbers(text: str, bag: Counter[str]) -> set[str]:
    """The words with a digit that a text, whose bag of words is `bag`, states as facts: those it says more
    often than it numbers list items with them ("1. ..." states no fact)."""
    listed = Counter(match.group(1) for match in _LIST_ITEM.finditer(text))
    return {word for word, count in bag.items() if _DIGIT.search(word) and count > listed[word]}


def _token_count(text: str) -> int:
    """The word tokens of a text, function words included."""
    return len(_TOKEN.findall(unicodedata.normalize("NFKC", text)))


def _numbers_alike(normalized: str) -> Counter[str]:
    """The bag of word tokens of a normalized text with its numbers written one way: no thousands
    separators ("1,194" is "1194"), dates as ISO's ("May 9th" is "5", "9", as "2024-05-09" is "2024",
    "5", "9"), no leading zeros ("05" is "5", "09:00" is "9:0")."""
    if _THREE_DIGITS_AFTER_A_COMMA.search(normalized):
        normalized = _THOUSANDS.sub("", normalized)
    bag = Counter(_TOKEN.findall(normalized))
    for name in _MONTHS.keys() & bag.keys():
        for match in _DATES[name].finditer(normalized):
            day = match.group(1)
            for word, number in ((name, _MONTHS[name]), (day, day.rstrip("stndrh"))):
                if bag[word] > 1:
                    bag[word] -= 1
                else:
                    del bag[word]
                bag[number] += 1
    padded = [word for word in bag if word[0] == "0" and len(word) > 1 and word.isdigit()]
    for word in padded:
        bag[word.lstrip("0") or "0"] += bag.pop(word)
    return bag


def _chunked_words(normalized: str) -> Iterator[str]:
    """The word tokens of a long normalized text, read in pieces cut at a space or line end (so that reading
    can stop early); a date or number cut at a piece's end is read as its two parts."""
    start, size = 0, len(normalized)
    while start < size:
        end = min(size, start + _LONG_TEXT)
        if end < size:
            cut = max(normalized.rfind(" ", start, end), normalized.rfind("\n", start, end))
            end = cut + 1 if cut > start else end
        piece = normalized[start:end]
        yield from _numbers_alike(piece).elements() if _DIGIT.search(piece) else _TOKEN.findall(piece)
        start = end


def word_counts(text: str, stopwords: frozenset[str], most: float | None = None) -> Counter[str] | None:
    """The bag of normalized word tokens of a text, function words dropped (unless it has nothing else).

    With `most`: None when the bag holds more than `most` words (a long text is read only that far).
    """
    normalized = unicodedata.normalize("NFKC", text).casefold()
    if most is not None and len(normalized) > _LONG_TEXT:
        return _bounded_word_counts(normalized, stopwords, most)
    bag = _numbers_alike(normalized) if _DIGIT.search(normalized) else Counter(_TOKEN.findall(normalized))
    dropped = stopwords.intersection(bag)
    if dropped and len(dropped) < len(bag):
        for word in dropped:
            bag.pop(word)
    if most is not None and sum(bag.values()) > most:
        return None
    return bag


def facts_of(text: str) -> set[str]:
    """The words with a digit of a text (ids, amounts, dates), normalized as in its bag of words."""
    if not _DIGIT.search(text):
        return set()
    return {word for word in word_counts(text, frozenset()) if _DIGIT.search(word)}


def _bounded_word_counts(normalized: str, stopwords: frozenset[str], most: float) -> Counter[str] | None:
    kept: Counter[str] = Counter()
    only_stopwords: Counter[str] = Counter()  # the bag if the text turns out to hold nothing else
    kept_size = stopword_size = 0
    for word in _chunked_words(normalized):
        if word not in stopwords:
            kept[word] += 1
            kept_size += 1
            if kept_size > most:
                return None
        elif not kept and stopword_size <= most:
            only_stopwords[word] += 1
            stopword_size += 1
    if kept:
        return kept
    return None if stopword_size > most else only_stopwords


@dataclass(frozen=True)
class WordWeights:
    """Inverse document frequency of words over a corpus of expert messages: ln((N + 1) / (df + 1)) + 1.

    Every word weighs at least 1 (a corpus word is in at most N documents).
    """

    documents: int
    frequency: dict[str, int]

    @classmethod
    def of(cls, texts: Iterable[str], stopwords: frozenset[str]) -> WordWeights:
        """Weights from message texts (each distinct text one document)."""
        frequency: Counter[str] = Counter()
        distinct = set(texts)
        for text in distinct:
            frequency.update(word_counts(text, stopwords).keys())
        return cls(len(distinct), dict(frequency))

    def __call__(self, word: str) -> float:
        return math.log((self.documents + 1) / (self.frequency.get(word, 0) + 1)) + 1.0


def expert_messages(pivots: Iterable[Pivot]) -> list[str]:
    """The text of every expert turn that is a message (no tool call) among `pivots`."""
    return [text_of(p.expert) for p in pivots if not p.expert.get("tool_calls") and text_of(p.expert)]


@cache
def corpus_weights(path: str | None, stopwords: frozenset[str]) -> WordWeights:
    """Word weights over the expert messages of a pivot file; None: the bundled tau-bench airline pivots.

    A fixed corpus, not the env's own pivots, so a pivot's reward does not depend on which other
    pivots were loaded with it (profiling D_cand and training on D_adv score an action alike).
    """
    if path is None:
        from pivot_envs.domains.tool_use.env import bundled_pivots

        return WordWeights.of(expert_messages(bundled_pivots()), stopwords)
    from pivot_envs.pivot import iter_pivots

    return WordWeights.of(expert_messages(iter_pivots(path)), stopwords)


@dataclass
class ExpertText:
    """An expert text as the check needs it: its bag of words and their total weight."""

    bag: Counter[str]
    weight: float


@dataclass
class ExpertMessage(ExpertText):
    """An expert message turn, with what the conversation rules need (compiled once per pivot)."""

    text: str
    new_facts: frozenset[str]  # words with a digit that no earlier assistant turn stated
    known_facts: frozenset[str]  # words with a digit that the expert's message or the conversation states
    earlier: list[ExpertText]  # the earlier assistant and user turns with text
    said: Counter[str]  # the earlier assistant and user turns' words, each as often as one turn says it
    facts: frozenset[str] = frozenset()  # its facts: words with a digit (not list numbers) and codes
    known_words: frozenset[str] = frozenset()  # words the message or the conversation says, as `spellable`
    tokens: int = 0  # its word tokens, function words included


class ContentCheck:
    """Compares sampled text with expert text by weighted words (see the module docstring)."""

    def __init__(self, weights: WordWeights, stopwords: frozenset[str]) -> None:
        self.weights = weights
        self.stopwords = stopwords
        self._known: dict[str, float] = {}  # the weights of the words met so far (at most KNOWN_WORDS)

    KNOWN_WORDS = 1 << 20

    def _weight_of(self, word: str) -> float:
        weight = self.weights(word)
        if len(self._known) < self.KNOWN_WORDS:
            self._known[word] = weight
        return weight

    def _compiled(self, text: str) -> ExpertText:
        bag = word_counts(text, self.stopwords)
        known = self._known
        total = 0.0
        for word, count in bag.items():
            weight = known.get(word)
            total += count * (self._weight_of(word) if weight is None else weight)
        return ExpertText(bag, total)

    def expert_text(self, text: str) -> ExpertText:
        """An expert's free text, compiled."""
        return self._compiled(text)

    def expert_message(self, pivot: Pivot, text: str) -> ExpertMessage:
        """An expert's message turn at a pivot, with its new facts and the earlier turns, compiled."""
        raw, text = text, visible(text)
        compiled = self._compiled(text)
        earlier = []
        assistant_said: set[str] = set()
        said: Counter[str] = Counter()
        known = {word for word in compiled.bag if _DIGIT.search(word)}
        known_words = spellable(text)
        for message in pivot.messages:
            if not isinstance(message, dict):
                continue
            role, content = message.get("role"), text_of(message)
            known.update(facts_of(content))
            known_words.update(spellable(content))
            for call in message.get("tool_calls") or ():
                function = call.get("function", call) if isinstance(call, dict) else None
                if isinstance(function, dict):
                    arguments = str(function.get("arguments", ""))
                    known.update(facts_of(arguments))
                    known_words.update(spellable(arguments))
            if role in ("assistant", "user") and content:
                turn = self._compiled(content)
                earlier.append(turn)
                said |= turn.bag
                if role == "assistant":
                    assistant_said.update(turn.bag)
        stated = _stated_numbers(text, compiled.bag)
        facts = frozenset(word for word in stated if word not in assistant_said)
        stated |= spelled_facts(text, self.stopwords) - _NUMBER_WORDS
        return ExpertMessage(
            bag=compiled.bag,
            weight=compiled.weight,
            text=raw,
            new_facts=facts,
            known_facts=frozenset(known),
            earlier=earlier,
            said=said,
            facts=frozenset(stated),
            known_words=frozenset(known_words),
            tokens=_token_count(text),
        )

    def substituted(self, expert: ExpertMessage, text: str, bag: Counter[str], also: frozenset[str]) -> str:
        """Where a text leaves out a fact of the expert's, the facts it states that the expert's text (or
        `also`) does not, listed; "" where it leaves none out or states none other."""
        if not any(fact not in bag for fact in expert.facts):
            return ""
        stated = _stated_numbers(text, bag) | (spelled_facts(text, self.stopwords) - _NUMBER_WORDS)
        other = sorted(stated - expert.bag.keys() - expert.facts - also)
        if not other:
            return ""
        left_out = sorted(fact for fact in expert.facts if fact not in bag)
        return f"it states {_listed(other)} where the expert's message states {_listed(left_out)}"

    def _weigh(self, bag: Counter[str], expert: ExpertText) -> tuple[float, float]:
        """(the bag's total weight, its weight shared with the expert text's)."""
        known, theirs = self._known, expert.bag
        own = common = 0.0
        for word, count in bag.items():
            weight = known.get(word)
            if weight is None:
                weight = self._weight_of(word)
            own += count * weight
            other = theirs.get(word)
            if other:
                common += (count if count < other else other) * weight
        return own, common

    def compare(
        self,
        expert: ExpertText,
        text: str,
        recall: float,
        precision: float,
        allowance: float = 0.0,
        ceiling: float = math.inf,
    ) -> tuple[str | None, str, tuple[Counter[str], float, float] | None]:
        """(None if the text matches by rules 1 and 2 else why not, the scores, and for a match what the
        message rules reuse: its bag, its weight, the weight it shares with the expert text's).

        The surplus (the text's weight beyond the expert's) may be up to `allowance` where precision
        falls short, if less than the expert text's weight, and never more than `ceiling`."""
        # Every word weighs at least 1, so a bag of more words than its greatest allowed weight cannot pass.
        if precision > 0 or ceiling < math.inf:
            most = expert.weight + min(
                max(expert.weight / precision - expert.weight if precision > 0 else math.inf, allowance),
                max(ceiling, allowance),
            )
        else:
            most = None
        bag = word_counts(text, self.stopwords, most)
        if bag is None:
            return f"over {most:.0f} words: more than precision {precision} and the surplus allowed", "", None
        # The expert's words, however cased, spaced or punctuated (dict ==: Counter's == is Python code).
        if dict.__eq__(bag, expert.bag):
            return None, "recall 1.00, precision 1.00", (bag, expert.weight, expert.weight)
        own, common = self._weigh(bag, expert)
        got_recall = common / expert.weight if expert.weight else 1.0
        got_precision = common / own if own else 0.0
        surplus = own - common
        scores = f"recall {got_recall:.2f}, precision {got_precision:.2f}"
        if got_recall < recall:
            return f"{scores}: recall < {recall}", scores, None
        if got_precision < precision and not (surplus <= allowance and surplus < expert.weight):
            return f"{scores}: precision < {precision}", scores, None
        if surplus > max(ceiling, allowance):
            return (
                f"{scores}: it says {surplus:.1f} of word weight beyond the expert's, over {ceiling}",
                scores,
                None,
            )
        return None, scores, (bag, own, common)

    def judge_message(
        self,
        expert: ExpertMessage,
        text: str,
        recall: float,
        precision: float,
        allowance: float = 0.0,
        ceiling: float = math.inf,
        echo: float = math.inf,
    ) -> tuple[str | None, str]:
        """(None if a message turn's text passes all seven rules else its category, detail)."""
        if text == expert.text:  # passes every rule: recall and precision 1, closest to itself
            return None, "the expert's message"
        text = visible(text)
        problem, scores, measured = self.compare(expert, text, recall, precision, allowance, ceiling)
        if problem is not None or measured is None:
            return "message_content_different", problem or scores
        bag, own, common = measured
        # After compare: a text this long is bounded in words by the expert message's weight.
        tokens = _token_count(text)
        if tokens < MIN_LENGTH_SHARE * expert.tokens:
            return (
                "message_too_short",
                f"{tokens} word tokens where the expert's message has {expert.tokens} (at least "
                f"{MIN_LENGTH_SHARE} of them)",
            )
        if dict.__eq__(bag, expert.bag):
            return None, scores  # every rule holds for the expert's own words
        known = self._known
        missing = sorted(expert.new_facts - bag.keys())
        if missing:
            return (
                "message_facts_missing",
                f"the expert's message states {_listed(missing)}; this one does not",
            )
        invented = sorted(
            {
                word
                for word in bag.keys() - expert.bag.keys()
                if word not in expert.known_facts and _DIGIT.search(word)
            }
            | (spelled_facts(text, self.stopwords) - expert.known_words)
        )
        if invented:
            return (
                "message_facts_invented",
                f"neither the expert's message nor the conversation states {_listed(invented)}",
            )
        substituted = self.substituted(expert, text, bag, frozenset())
        if substituted:
            return "message_facts_substituted", substituted
        if own - common > echo:
            # The talk it adds: facts the conversation stated may be repeated (rule 4 bounds the rest).
            theirs, said = expert.bag, expert.said
            talk = echoed = 0.0
            for word, count in bag.items():
                extra = count - theirs.get(word, 0)
                if extra > 0 and not _DIGIT.search(word):
                    weight = known.get(word)
                    weight = self.weights(word) if weight is None else weight
                    talk += extra * weight
                    if word in said:
                        echoed += min(extra, said[word]) * weight
            if talk > echo and echoed >= ECHO_SHARE * talk:
                detail = f"{echoed:.1f} of the {talk:.1f} word weight it adds to the expert's was said before"
                return "message_repeats_earlier_turn", detail
        to_expert = 2.0 * common / (own + expert.weight)
        for index, turn in enumerate(expert.earlier):
            total = own + turn.weight
            if 2.0 * min(own, turn.weight) <= to_expert * total:
                continue  # the turn is too short or too long to be closer than the expert's message
            theirs = turn.bag
            shared = 0.0
            for word, count in bag.items():
                other = theirs.get(word)
                if other:
                    weight = known.get(word)
                    shared += (count if count < other else other) * (
                        self.weights(word) if weight is None else weight
                    )
            to_turn = 2.0 * shared / total
            if to_turn > to_expert:
                detail = f"closer to earlier turn {index + 1} ({to_turn:.2f}) than to the expert's message ({to_expert:.2f})"
                return "message_repeats_earlier_turn", detail
        return None, scores


def _listed(words: list[str]) -> str:
    return ", ".join(words[:8]) + (f" and {len(words) - 8} more" if len(words) > 8 else "")
