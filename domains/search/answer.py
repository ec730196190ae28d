"""Final answers of search agents: where the answer is in a message, and when two answers are the same.

A search agent ends with a message holding its answer. BrowseComp asks for
`Explanation: ... / Exact Answer: ... / Confidence: ...`; Search-R1 and this domain's bundled
expert write `Answer: X`. `extract_answer` takes the text after the last `Exact Answer:` (else
the last `Answer:`) up to the end of its line, or, when neither is there, the whole message.

`normalize_answer` is SQuAD's normalisation (the one BrowseComp-Plus and Search-R1 score exact
match with): lowercase, punctuation removed, the articles a/an/the removed, whitespace collapsed;
Unicode letters are folded to their unaccented form (NFKD) so that "Gödel" and "Godel" agree.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Iterable

# The last label wins: an agent may quote the format before giving its own answer.
_LABEL = re.compile(r"(?:exact\s+answer|final\s+answer|answer)\s*[:：]\s*", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation + "‘’“”–—…«»")
# Longer answers are not short answers: bounding the work keeps a 1 MB message cheap to score.
MAX_ANSWER_CHARS = 2000


def extract_answer(text: str) -> str:
    """The answer a message gives: after its last `Exact Answer:`/`Final Answer:`/`Answer:` label
    (to the end of that line), else inside its last `\\boxed{...}`, else the whole text (trimmed)."""
    labels = list(_LABEL.finditer(text))
    if labels:
        rest = text[labels[-1].end() :]
        return rest.split("\n", 1)[0].strip()
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1].strip()
    return text.strip()


def normalize_answer(answer: str) -> str:
    """SQuAD normalisation: accents folded, lowercase, punctuation and articles removed, whitespace collapsed."""
    return normalize_text(answer[:MAX_ANSWER_CHARS])


def normalize_text(text: str) -> str:
    """`normalize_answer` of a text of any length (a document the answer must be found in)."""
    folded = unicodedata.normalize("NFKD", text)
    folded = "".join(c for c in folded if not unicodedata.combining(c)).lower()
    return " ".join(_ARTICLES.sub(" ", folded.translate(_PUNCTUATION)).split())


def answer_matches(text: str, gold: Iterable[str]) -> bool:
    """Whether the answer in `text` equals one of the `gold` answers (the answer and its aliases)
    after normalisation; an answer that normalises to nothing matches nothing."""
    answer = normalize_answer(extract_answer(text))
    return bool(answer) and any(answer == normalize_answer(str(g)) for g in gold)
