"""The functional verifier of conversational tool use (paper Eq. 6), and a cached strict one.

A sampled assistant turn is locally acceptable when it does what the expert's turn does:

- tool calls: the same tool, with arguments equal under the tool's JSON schema (key order never
  matters; an optional argument equal to its default counts as absent; integers compare exactly,
  other numbers by value within a tolerance; enum and id-like strings after trim/case/NFKC
  normalization; free-text strings by their weighted words, as messages, stating no fact the
  expert's value does not; arrays in order unless configured as sets).
  Several calls in one turn are matched as a multiset (maximum bipartite matching) and scored in
  `binary`, `fractional` or `f1` mode. Where the pivot's backend can execute calls, a call whose output
  and state change equal the expert call's (run from the same state) is accepted even when its
  arguments differ in form (execution equivalence), and a call the argument rules accept is
  rejected when its execution differs from the expert call's (a measured effect decides).
- messages: a tool call where a message was expected fails; a message must pass a content check
  (by default the `content` module's: the expert message's informative words and new facts, little
  else, no fact the conversation never stated, and not a repeat of an earlier turn; or a pluggable
  judge). A message is never accepted
  merely for being a message, unless `message_check="any"` asks for exactly that.
- text beside tool calls (`call_text`): the calls decide, but the text a call turn also says (HTML
  comments aside) may state no fact (a word with a digit, a code in 5-8 capitals, a number in words)
  that neither the expert's turn nor the conversation states, may not swap a fact of the expert's
  text for another, and may say at most `message_surplus_ceiling` of word weight beyond the expert's
  own text: a right call cannot carry a false confirmation or a stuffed reply to the user.

Every rule is a field of `FunctionalConfig`, passed as
`gym.make("pivot/tool-use-v0", verifier_config={...})`.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from pivot_envs.chat import text_of, tool_name, tool_parameters
from pivot_envs.config import ConfigError, between, option
from pivot_envs.domains.tool_use.content import (
    ContentCheck,
    ExpertMessage,
    ExpertText,
    corpus_weights,
    facts_of,
    spellable,
    spelled_facts,
    visible,
)
from pivot_envs.domains.tool_use.parser import arguments_of
from pivot_envs.registry import import_object
from pivot_envs.verifiers import StrictVerifier, Verdict

if TYPE_CHECKING:
    from pivot_envs.pivot import Pivot

CORRECT = "correct"
MODES = ("binary", "fractional", "f1")

# Common English function words; dropped before texts are compared so that two unrelated
# sentences do not look similar because both say "the", "to" and "you".
STOPWORDS = frozenset(
    """a an the and or but if then so of to in on at by for with from as is are was were be been being
    it its this that these those i you he she we they me him her us them my your his our their
    do does did have has had will would can could should shall may might must not no yes please
    there here what which who whom when where why how all any each some just also than too very""".split()
)
_TOKEN = re.compile(r"\w+")
_DIGIT = re.compile(r"\d")


@dataclass
class FunctionalConfig:
    """The rules of the functional verifier (each one a flag of the generated CLI)."""

    mode: str = option(
        "binary",
        "score of a turn with several calls: binary (1 only if the calls match the expert's one to one), "
        "fractional (matched / max(expected, sampled)), f1 (2 * matched / (expected + sampled))",
        choices=MODES,
    )
    float_tolerance: float = option(
        1e-6, "relative and absolute tolerance when a float compares (5 == 5.0 always; two integers exactly)"
    )
    normalize_enums: bool = option(
        True, "compare enum-typed strings after trim, case folding and Unicode NFKC"
    )
    normalize_ids: bool = option(
        True, "compare id-like strings (see id_pattern) after trim, case folding and NFKC"
    )
    id_pattern: str = option(
        r"(?:^|_)(?:id|ids|code|codes|number|numbers|key|uuid)$",
        "regex over argument names that marks id-like strings",
    )
    free_text_pattern: str = option(
        r"(?:summary|thought|reason|message|content|description|query|text|note|notes|comment|explanation|instructions?)$",
        "regex over argument names that marks free-text strings (compared by weighted words, as messages)",
    )
    free_text_min_tokens: int = option(
        4,
        "a string whose expert value has at least this many tokens, mostly words, is free text too (0: off)",
    )
    text_recall: float = option(
        0.5, "a free-text argument must state at least this share of the expert value's word weight (IDF)"
    )
    text_precision: float = option(
        0.8, "at least this share of a free-text argument's word weight must be the expert value's"
    )
    drop_stopwords: bool = option(True, "drop common English function words before comparing texts")
    unordered_arrays: tuple[str, ...] = option(
        (), "argument names whose arrays compare as multisets, not in order"
    )
    allow_extra_arguments: bool = option(
        False, "accept arguments the expert did not pass (otherwise extra_argument)"
    )
    message_check: str = option(
        "similarity",
        "how a message turn is judged: similarity (the expert message's weighted words and new facts, not "
        "a repeat of an earlier turn; see message_recall and message_precision), judge (the message_judge "
        "callable), any (accept every message: NeMo-Gym's behaviour, reward-hackable)",
        choices=("similarity", "judge", "any"),
    )
    message_recall: float = option(
        0.5, "a message must state at least this share of the expert message's word weight (IDF-weighted)"
    )
    message_precision: float = option(
        0.8,
        "at least this share of a message's word weight must be the expert message's (padding, a second "
        "answer or a repeated text cost reward)",
    )
    message_surplus_allowance: float = option(
        12.0,
        "word weight (IDF) a message may say beyond the expert message's where message_precision falls "
        "short, if less than the expert message's own: two or three words ('Sure, I can help' for "
        "'I can help')",
    )
    message_surplus_ceiling: float = option(
        40.0,
        "word weight (IDF) a message may never say beyond the expert message's, however long that is "
        "(about ten words: a second answer beside a long right one)",
    )
    message_echo: float = option(
        6.0,
        "where a message's words beyond the expert message's, facts aside, weigh more than this (IDF), "
        "they may not be mostly words the user or the assistant already said",
    )
    message_corpus: str | None = option(
        None,
        "pivot file whose expert messages give the word weights (IDF) of messages and free text; None: the "
        "bundled tau-bench airline pivots",
    )
    message_judge: str | Callable[..., Any] | None = option(
        None,
        "judge(pivot, expected_text, actual_text) -> bool or float in [0, 1], or its 'module:function' path",
    )
    execution_equivalence: bool = option(
        True,
        "accept a call whose output and state change equal the expert call's, executed from the same state",
    )
    call_text: bool = option(
        True,
        "check the text beside a call turn's calls: no fact (a word with a digit, a code in capitals, a number "
        "in words) neither the expert's turn "
        "nor the conversation states, and at most message_surplus_ceiling of word weight beyond the expert's "
        "text (False: the calls alone decide, whatever the turn tells the user)",
    )
    execution_decides: bool = option(
        True,
        "where the backend executes calls, also reject a call the argument rules accept when its execution "
        "differs from the expert call's (e.g. an id in another case that the database does not find)",
    )

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"FunctionalConfig.mode must be one of {MODES}, got {self.mode!r}")
        if self.message_check not in ("similarity", "judge", "any"):
            raise ConfigError(
                f"FunctionalConfig.message_check must be similarity, judge or any, got {self.message_check!r}"
            )
        for name in ("text_recall", "text_precision", "message_recall", "message_precision"):
            between(self, name, 0, 1)
        for name in ("message_surplus_allowance", "message_surplus_ceiling", "message_echo"):
            between(self, name, 0, math.inf)
        if self.message_check == "judge" and self.message_judge is None:
            raise ConfigError("FunctionalConfig: message_check='judge' needs a message_judge")
        if isinstance(self.message_judge, str):
            self.message_judge = import_object(self.message_judge)
        self.unordered_arrays = tuple(self.unordered_arrays)


# -- text normalization --------------------------------------------------------------------------


def normalize(text: str) -> str:
    """Trimmed, NFKC-normalized, case-folded text."""
    return unicodedata.normalize("NFKC", text).strip().casefold()


# -- schemas -------------------------------------------------------------------------------------

_JSON_TYPES = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
    type(None): "null",
}
_NO_DEFAULT = object()
_SCALARS = frozenset({str, int, float, bool, type(None)})


class _Field:
    """A compiled JSON-schema node: what the comparison of one argument needs."""

    __slots__ = ("name", "types", "enum", "default", "is_id", "is_free", "items", "properties", "unordered")

    def __init__(
        self, schema: Any, name: str, config: FunctionalConfig, id_re: re.Pattern, free_re: re.Pattern
    ) -> None:
        schema = schema if isinstance(schema, dict) else {}
        self.name = name
        declared = schema.get("type")
        variants = schema.get("anyOf") or schema.get("oneOf")
        if declared is None and isinstance(variants, list):
            declared = [
                v.get("type") for v in variants if isinstance(v, dict) and isinstance(v.get("type"), str)
            ]
        if isinstance(declared, str):
            declared = [declared]
        self.types = frozenset(declared) if declared else None
        self.enum = isinstance(schema.get("enum"), list)
        self.default = schema.get("default", _NO_DEFAULT)
        self.is_id = bool(name) and id_re.search(name) is not None
        self.is_free = bool(name) and free_re.search(name) is not None
        self.unordered = name in config.unordered_arrays
        items = schema.get("items")
        self.items = _Field(items, name, config, id_re, free_re) if isinstance(items, dict) else None
        properties = schema.get("properties")
        self.properties = (
            {key: _Field(sub, key, config, id_re, free_re) for key, sub in properties.items()}
            if isinstance(properties, dict)
            else {}
        )


def _json_type(value: Any) -> str:
    return _JSON_TYPES.get(type(value), "unknown")


def _type_ok(value: Any, types: frozenset[str]) -> bool:
    kind = _json_type(value)
    if kind in types:
        return True
    if kind == "integer" and "number" in types:
        return True
    return kind == "number" and "integer" in types and value.is_integer()


def _fast_ok(value: Any) -> bool:
    """Whether Python == on this expert value cannot be fooled by bool/int confusion (True == 1)."""
    kind = type(value)
    if kind is bool:
        return False
    if kind in (int, float):
        return value not in (0, 1)
    if kind is dict:
        return all(_fast_ok(v) for v in value.values())
    if kind is list:
        return all(_fast_ok(v) for v in value)
    return True


@dataclass
class _ExpertCall:
    name: str
    arguments: Any
    field: _Field | None
    fast_ok: bool


@dataclass
class _Plan:
    """What the verifier precompiles once per pivot."""

    expert: dict[str, Any]
    calls: list[_ExpertCall]
    message: str
    compiled_message: ExpertMessage | None  # for message turns judged by the content module
    # for call turns with call_text: the expert's text beside its calls, and the facts its calls state
    aside: ExpertMessage | None = None
    call_facts: frozenset[str] = frozenset()


Mismatch = tuple[str, str]  # (category, detail)


def bipartite_matching(edges: list[list[int]], n_right: int) -> list[int]:
    """Maximum bipartite matching (Kuhn): edges[i] lists the right nodes left node i may take.

    Returns match_of_right (left index or -1 per right node).
    """
    match_of_right = [-1] * n_right

    def augment(left: int, seen: list[bool]) -> bool:
        for right in edges[left]:
            if not seen[right]:
                seen[right] = True
                if match_of_right[right] < 0 or augment(match_of_right[right], seen):
                    match_of_right[right] = left
                    return True
        return False

    for left in range(len(edges)):
        augment(left, [False] * n_right)
    return match_of_right


class FunctionalVerifier:
    """Functional reward for tool use (paper Eq. 6); see the module docstring for the rules.

    Build it with a FunctionalConfig or its fields as keywords:
    `FunctionalVerifier(mode="f1", message_precision=0.7)`. Expert data (parsed calls, compiled
    schemas, message tokens) is compiled lazily and cached by pivot id.
    """

    name = "functional"

    def __init__(self, config: FunctionalConfig | dict[str, Any] | None = None, **overrides: Any) -> None:
        if isinstance(config, dict):
            overrides = {**config, **overrides}
            config = None
        if config is None:
            known = {f.name for f in fields(FunctionalConfig)}
            unknown = sorted(set(overrides) - known)
            if unknown:
                raise ConfigError(f"unknown functional verifier option(s) {unknown}; known: {sorted(known)}")
            config = FunctionalConfig(**overrides)
        self.config = config
        self._id_re = re.compile(config.id_pattern)
        self._free_re = re.compile(config.free_text_pattern)
        self._plans: dict[str, _Plan] = {}
        self._tool_fields: dict[str, _Field] = {}
        self._expert_texts: dict[str, ExpertText] = {}
        self._last_match: tuple[_ExpertCall, Any, Mismatch | None] | None = None
        self._content: ContentCheck | None = None

    @property
    def content(self) -> ContentCheck:
        """The check of messages and free text by weighted words (built on first use: it reads the corpus)."""
        if self._content is None:
            stopwords = STOPWORDS if self.config.drop_stopwords else frozenset()
            self._content = ContentCheck(corpus_weights(self.config.message_corpus, stopwords), stopwords)
        return self._content

    # -- compilation ---------------------------------------------------------------------------

    def _tool_field(self, tool: dict[str, Any]) -> _Field:
        params = tool_parameters(tool)
        key = tool_name(tool) + "\x00" + json.dumps(params, sort_keys=True)
        compiled = self._tool_fields.get(key)
        if compiled is None:
            compiled = self._tool_fields[key] = _Field(params, "", self.config, self._id_re, self._free_re)
        return compiled

    def plan(self, pivot: Pivot) -> _Plan:
        """The compiled expert data of a pivot (cached by pivot id)."""
        plan = self._plans.get(pivot.id)
        if plan is not None and plan.expert is pivot.expert:
            return plan
        schemas = {tool_name(t): t for t in pivot.tools if isinstance(t, dict)}
        calls = []
        for call in pivot.expert.get("tool_calls") or []:
            function = call.get("function", call) if isinstance(call, dict) else {}
            if not isinstance(function, dict):
                function = {}
            name = str(function.get("name", ""))
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments) if arguments.strip() else {}
                except ValueError:
                    pass  # compared as it stands; no sampled call can be equal to broken JSON
            elif arguments is None:
                arguments = {}
            field = self._tool_field(schemas[name]) if name in schemas else None
            calls.append(_ExpertCall(name, arguments, field, _fast_ok(arguments)))
        text = _content(pivot.expert)
        judged = not calls and self.config.message_check == "similarity"
        plan = _Plan(pivot.expert, calls, text, self.content.expert_message(pivot, text) if judged else None)
        if calls and self.config.call_text:
            plan.aside = self.content.expert_message(pivot, text)
            plan.call_facts = frozenset(
                fact
                for call in calls
                for arguments in (json.dumps(call.arguments, ensure_ascii=False),)
                for fact in facts_of(arguments) | spellable(arguments)
            )
        self._plans[pivot.id] = plan
        return plan

    # -- argument comparison ---------------------------------------------------------------------

    def _is_free_text(self, expected: str, field: _Field | None) -> bool:
        if field is not None and (field.enum or field.is_id):
            return False
        if field is not None and field.is_free:
            return True
        minimum = self.config.free_text_min_tokens
        if minimum <= 0:
            return False
        found = _TOKEN.findall(expected)
        return len(found) >= minimum and sum(1 for t in found if not t.isdigit()) * 2 >= len(found)

    def _compare_strings(
        self, expected: str, actual: str, field: _Field | None, path: str
    ) -> Mismatch | None:
        if expected == actual:
            return None
        config = self.config
        if field is not None and (
            (field.enum and config.normalize_enums) or (field.is_id and config.normalize_ids)
        ):
            if normalize(expected) == normalize(actual):
                return None
            return "argument_value_different", f"{path}: expected {expected!r}, got {actual!r}"
        if self._is_free_text(expected, field):
            compiled = self._expert_texts.get(expected)
            if compiled is None:
                # Expert strings only (bounded by the pivot set): sampled text is never cached.
                compiled = self._expert_texts[expected] = self.content.expert_text(expected)
            problem = self.content.compare(compiled, actual, config.text_recall, config.text_precision)[0]
            if problem is not None:
                return "argument_value_different", f"{path}: free text {problem}"
            # Rules 1 and 2 weigh words; a fact (a word with a digit) the expert's value does not state is
            # another id, amount or date however little it weighs. Facts left out are allowed (a summary
            # may be shorter).
            invented = sorted(facts_of(actual) - facts_of(expected))
            if invented:
                shown = ", ".join(invented[:5]) + (" ..." if len(invented) > 5 else "")
                return (
                    "argument_value_different",
                    f"{path}: free text states {shown}, which the expert's does not",
                )
            return None
        # Plain strings: whitespace and Unicode form do not count, case does.
        if unicodedata.normalize("NFKC", expected).strip() == unicodedata.normalize("NFKC", actual).strip():
            return None
        return "argument_value_different", f"{path}: expected {expected!r}, got {actual!r}"

    def _compare_numbers(self, expected: float, actual: float, path: str) -> Mismatch | None:
        """Two integers compare exactly (a float cannot hold every one); otherwise by value within
        `float_tolerance`. An integer too large for a float (10**400) is another value, not an error."""
        if type(expected) is int and type(actual) is int:
            same = expected == actual
        else:
            tolerance = self.config.float_tolerance
            try:
                same = math.isclose(expected, actual, rel_tol=tolerance, abs_tol=tolerance)
            except OverflowError:
                same = False
        return None if same else ("argument_value_different", f"{path}: expected {expected}, got {actual}")

    def compare(self, expected: Any, actual: Any, field: _Field | None, path: str) -> Mismatch | None:
        """None when `actual` equals `expected` under the schema rules, else (category, detail)."""
        if type(expected) is type(actual) and type(expected) in _SCALARS and expected == actual:
            return None
        if field is not None and field.types is not None:
            if not _type_ok(actual, field.types):
                return (
                    "argument_type_mismatch",
                    f"{path}: expected {'/'.join(sorted(field.types))}, got {_json_type(actual)}",
                )
        expected_type, actual_type = _json_type(expected), _json_type(actual)
        numeric = ("integer", "number")
        if expected_type != actual_type and not (expected_type in numeric and actual_type in numeric):
            return "argument_type_mismatch", f"{path}: expected {expected_type}, got {actual_type}"
        if expected_type in numeric:
            return self._compare_numbers(expected, actual, path)
        if expected_type == "string":
            return self._compare_strings(expected, actual, field, path)
        if expected_type == "array":
            return self._compare_arrays(expected, actual, field, path)
        if expected_type == "object":
            return self.compare_objects(expected, actual, field, path)
        if expected == actual:
            return None
        return "argument_value_different", f"{path}: expected {expected!r}, got {actual!r}"

    def _compare_arrays(
        self, expected: list, actual: list, field: _Field | None, path: str
    ) -> Mismatch | None:
        items = field.items if field is not None else None
        if len(expected) != len(actual):
            return "argument_value_different", f"{path}: expected {len(expected)} items, got {len(actual)}"
        if field is not None and field.unordered:
            edges = [
                [j for j, a in enumerate(actual) if self.compare(e, a, items, path) is None] for e in expected
            ]
            if -1 in bipartite_matching(edges, len(actual)):
                return "argument_value_different", f"{path}: the items differ (compared as a set)"
            return None
        for index, (e, a) in enumerate(zip(expected, actual)):
            found = self.compare(e, a, items, f"{path}[{index}]")
            if found is not None:
                return found
        return None

    def _is_default(self, value: Any, field: _Field | None, key: str) -> bool:
        """Whether `value` equals the schema's default for the argument (absent or given, the same call)."""
        return (
            field is not None
            and field.default is not _NO_DEFAULT
            and self.compare(field.default, value, field, key) is None
        )

    def compare_objects(
        self, expected: dict, actual: dict, field: _Field | None, path: str = ""
    ) -> Mismatch | None:
        """Compare two argument objects: missing, extra, then each shared value."""
        properties = field.properties if field is not None else {}
        prefix = f"{path}." if path else ""
        for key, value in expected.items():
            if key not in actual and not self._is_default(value, properties.get(key), key):
                return "missing_argument", f"{prefix}{key} is missing"
        for key, value in actual.items():
            if key in expected or self._is_default(value, properties.get(key), key):
                continue
            if not self.config.allow_extra_arguments:
                return "extra_argument", f"{prefix}{key} was not expected"
        for key, value in expected.items():
            if key in actual:
                found = self.compare(value, actual[key], properties.get(key), prefix + key)
                if found is not None:
                    return found
        return None

    def match_call(self, expert: _ExpertCall, name: str, arguments: Any) -> Mismatch | None:
        """None when a sampled call (name, parsed arguments) equals an expert call by the argument rules."""
        if name != expert.name:
            return "unexpected_tool", f"expected {expert.name}, got {name}"
        if expert.fast_ok and arguments == expert.arguments:
            return None
        last = self._last_match
        # The recorded backend and the verdict compare the same decoded call: compute it once.
        if last is not None and last[0] is expert and last[1] is arguments:
            return last[2]
        if not isinstance(arguments, dict) or not isinstance(expert.arguments, dict):
            found = (
                None
                if arguments == expert.arguments
                else ("argument_type_mismatch", "arguments are not a JSON object")
            )
        else:
            found = self.compare_objects(expert.arguments, arguments, expert.field)
        result = None if found is None else (found[0], f"{name}: {found[1]}")
        self._last_match = (expert, arguments, result)
        return result

    def expert_index_for(self, pivot: Pivot, name: str, arguments: Any) -> int | None:
        """The index of the first expert call the sampled call equals by the argument rules."""
        for index, expert in enumerate(self.plan(pivot).calls):
            if self.match_call(expert, name, arguments) is None:
                return index
        return None

    # -- verdicts ----------------------------------------------------------------------------------

    def verify(self, pivot: Pivot, action: dict[str, Any], outcome: Any = None) -> Verdict:
        """Score a canonical assistant message at a pivot; `outcome.data["equivalence"]`, when
        present, decides execution equivalence (see ToolUseEnv)."""
        plan = self.plan(pivot)
        verdict = self._verify_turn(plan, pivot, action, outcome)
        if verdict.reward > 0 and plan.aside is not None and (aside := _content(action)):
            refused = self._verify_aside(plan, aside)
            if refused is not None:
                return refused
        return verdict

    def _verify_turn(self, plan: _Plan, pivot: Pivot, action: dict[str, Any], outcome: Any) -> Verdict:
        raw_calls = action.get("tool_calls") or []
        if not plan.calls:
            if raw_calls:
                return Verdict(
                    0.0,
                    "expected_message_got_tool_call",
                    f"the expert answered with a message; got {len(raw_calls)} tool call(s)",
                )
            return self._verify_message(pivot, plan, _content(action))
        if not raw_calls:
            return Verdict(
                0.0,
                "expected_tool_call_got_message",
                f"the expert called {', '.join(c.name for c in plan.calls)}",
            )
        sampled = []
        for call in raw_calls:
            function = call.get("function", call) if isinstance(call, dict) else {}
            arguments, valid = arguments_of(call)
            if not valid:
                return Verdict(0.0, "unparseable", "a tool call's arguments are not valid JSON")
            sampled.append((str(function.get("name", "")) if isinstance(function, dict) else "", arguments))
        oracle = getattr(outcome, "data", {}).get("equivalence")
        equivalence = oracle if self.config.execution_equivalence else None
        decides = oracle if self.config.execution_decides else None
        if len(sampled) == 1 and len(plan.calls) == 1:
            name, arguments = sampled[0]
            found = self.match_call(plan.calls[0], name, arguments)
            if found is None:
                if (
                    decides is not None
                    and not _same_arguments(plan.calls[0], arguments)
                    and not decides(0, name, arguments)
                ):
                    return Verdict(
                        0.0, "execution_different", f"{name}: the arguments match, the execution does not"
                    )
                return Verdict(1.0, CORRECT)
            if _accepts(equivalence, 0, name, plan.calls[0].name, arguments):
                return Verdict(
                    1.0,
                    CORRECT,
                    f"{found[1]}; accepted by execution equivalence",
                    extra={"execution_equivalent": True},
                )
            if equivalence is not None and _expert_failed(equivalence, 0):
                return Verdict(0.0, found[0], f"{found[1]} (the expert's call fails here: {FAILED})")
            return Verdict(0.0, found[0], found[1])
        return self._verify_calls(plan, sampled, equivalence, decides)

    def _verify_calls(
        self, plan: _Plan, sampled: list[tuple[str, Any]], equivalence: Any, decides: Any
    ) -> Verdict:
        experts = plan.calls
        mismatches: dict[tuple[int, int], Mismatch] = {}
        edges: list[list[int]] = []
        executed = False
        for i, (name, arguments) in enumerate(sampled):
            row = []
            for j, expert in enumerate(experts):
                found = self.match_call(expert, name, arguments)
                if (
                    found is None
                    and decides is not None
                    and not _same_arguments(expert, arguments)
                    and not decides(j, name, arguments)
                ):
                    found = ("execution_different", f"{name}: the arguments match, the execution does not")
                if found is None:
                    row.append(j)
                    continue
                if _accepts(equivalence, j, name, expert.name, arguments):
                    row.append(j)
                    executed = True
                    continue
                mismatches[i, j] = found
            edges.append(row)
        match_of_expert = bipartite_matching(edges, len(experts))
        matched = sum(1 for left in match_of_expert if left >= 0)
        n_expert, n_sampled = len(experts), len(sampled)
        if matched == n_expert == n_sampled:
            detail = "accepted by execution equivalence for some calls" if executed else ""
            return Verdict(1.0, CORRECT, detail, extra={"execution_equivalent": executed})
        mode = self.config.mode
        if mode == "fractional":
            reward = matched / max(n_expert, n_sampled)
        elif mode == "f1":
            reward = 2.0 * matched / (n_expert + n_sampled)
        else:
            reward = 0.0
        summary = f"{matched} of {n_expert} expert call(s) matched by {n_sampled} sampled call(s)"
        if n_expert != n_sampled:
            return Verdict(reward, "wrong_call_count", summary)
        taken = {left for left in match_of_expert if left >= 0}
        for j, left in enumerate(match_of_expert):
            if left >= 0:
                continue
            # Explain the first unmatched expert call by its closest unmatched sampled call.
            candidates = [i for i in range(n_sampled) if i not in taken]
            same_name = [i for i in candidates if sampled[i][0] == experts[j].name]
            i = (same_name or candidates)[0]
            category, detail = mismatches.get((i, j), ("unexpected_tool", experts[j].name))
            return Verdict(reward, category, f"{summary}; {detail}")
        return Verdict(reward, "wrong_call_count", summary)

    def _verify_aside(self, plan: _Plan, text: str) -> Verdict | None:
        """A call turn's text: None if it passes (`call_text`), else the verdict that refuses it."""
        expert = plan.aside
        assert expert is not None
        if text == expert.text:
            return None
        text = visible(text)
        ceiling = self.config.message_surplus_ceiling
        content = self.content
        problem, _, measured = content.compare(expert, text, 0.0, 0.0, 0.0, ceiling)
        if problem is not None or measured is None:
            return Verdict(0.0, "call_text_too_long", f"the text beside the calls: {problem}")
        bag = measured[0]
        invented = sorted(
            {
                word
                for word in bag.keys() - expert.bag.keys()
                if _DIGIT.search(word) and word not in expert.known_facts and word not in plan.call_facts
            }
            | (spelled_facts(text, content.stopwords) - expert.known_words - plan.call_facts)
        )
        if invented:
            shown = ", ".join(invented[:5]) + (" ..." if len(invented) > 5 else "")
            return Verdict(
                0.0,
                "call_text_facts_invented",
                f"the text beside the calls states {shown}, which neither the expert's turn nor the "
                "conversation states",
            )
        substituted = content.substituted(expert, text, bag, plan.call_facts)
        if substituted:
            return Verdict(0.0, "call_text_facts_substituted", f"the text beside the calls: {substituted}")
        return None

    def _verify_message(self, pivot: Pivot, plan: _Plan, text: str) -> Verdict:
        config = self.config
        if not text:
            return Verdict(0.0, "message_content_different", "empty message")
        if config.message_check == "any":
            return Verdict(1.0, CORRECT, "message_check='any' accepts every message")
        if config.message_check == "judge":
            try:
                score = config.message_judge(pivot, plan.message, text)  # type: ignore[misc]
            except Exception as error:  # the judge is infrastructure: its failure must not read as reward 0
                return Verdict(0.0, "infrastructure_error", f"message judge failed: {error!r}", valid=False)
            reward = float(score)
            if not 0.0 <= reward <= 1.0:
                return Verdict(
                    0.0,
                    "infrastructure_error",
                    f"message judge returned {score!r}, not in [0, 1]",
                    valid=False,
                )
            return Verdict(
                reward, CORRECT if reward > 0 else "message_content_different", f"judge score {reward:.2f}"
            )
        category, detail = self.content.judge_message(
            plan.compiled_message,
            text,
            config.message_recall,
            config.message_precision,
            config.message_surplus_allowance,
            config.message_surplus_ceiling,
            config.message_echo,
        )
        return Verdict(0.0, category, detail) if category else Verdict(1.0, CORRECT, detail)


FAILED = "a call that fails alike is not accepted beyond the argument rules"


def _expert_failed(equivalence: Any, index: int) -> bool:
    """Whether the oracle says the expert's `index`-th call was refused (see backends.Equivalence)."""
    failed = getattr(equivalence, "expert_failed", None)
    return bool(failed(index)) if failed is not None else False


def _accepts(equivalence: Any, index: int, name: str, expert_name: str, arguments: Any) -> bool:
    """Whether execution equivalence accepts a call the argument rules reject: the same tool, an equal
    execution, and an expert call that did something (a refusal is shared by many wrong calls)."""
    return (
        equivalence is not None
        and name == expert_name
        and not _expert_failed(equivalence, index)
        and equivalence(index, name, arguments)
    )


def _same_arguments(expert: _ExpertCall, arguments: Any) -> bool:
    """Whether a call's arguments are the expert call's own: the expert's call is the reference, so its
    effect needs no execution to be the expert's."""
    return expert.fast_ok and arguments == expert.arguments


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content.strip() if isinstance(content, str) else ""


def json_identical(a: Any, b: Any) -> bool:
    """Whether two decoded JSON values serialize identically (key order aside): 5 != 5.0, True != 1."""
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is dict:
        return len(a) == len(b) and all(k in b and json_identical(v, b[k]) for k, v in a.items())
    if kind is list:
        return len(a) == len(b) and all(json_identical(x, y) for x, y in zip(a, b))
    if kind is float:
        return repr(a) == repr(b)  # tells -0.0 from 0.0 and NaN from itself, as the JSON text does
    return a == b


class CachedStrictVerifier(StrictVerifier):
    """The strict verifier (paper Eq. 2): equal to `pivot_envs.chat.canonical_action` equality,
    computed without serializing, with the expert's decoded calls cached by pivot id."""

    def __init__(self) -> None:
        self._expert: dict[str, tuple[dict[str, Any], str, list[tuple[str, Any, Any]]]] = {}

    def _expert_form(self, pivot: Pivot) -> tuple[dict[str, Any], str, list[tuple[str, Any, Any]]]:
        cached = self._expert.get(pivot.id)
        if cached is None or cached[0] is not pivot.expert:
            calls = []
            for call in pivot.expert.get("tool_calls") or []:
                function = call.get("function", call) if isinstance(call, dict) else {}
                name = str(function.get("name", "")) if isinstance(function, dict) else ""
                raw = function.get("arguments") if isinstance(function, dict) else None
                calls.append((name, raw, arguments_of(call)[0]))
            cached = self._expert[pivot.id] = (pivot.expert, text_of(pivot.expert), calls)
        return cached

    def verify(self, pivot: Pivot, action: dict[str, Any], outcome: Any = None) -> Verdict:
        _, content, expert_calls = self._expert_form(pivot)
        calls = action.get("tool_calls") or []
        same = text_of(action) == content and len(calls) == len(expert_calls)
        for call, (name, raw, value) in zip(calls, expert_calls) if same else ():
            function = call.get("function", call) if isinstance(call, dict) else {}
            if (str(function.get("name", "")) if isinstance(function, dict) else "") != name:
                same = False
                break
            text = function.get("arguments") if isinstance(function, dict) else None
            if not (isinstance(raw, str) and text == raw) and not json_identical(
                arguments_of(call)[0], value
            ):
                same = False
                break
        if same:
            return Verdict(1.0, "exact_match")
        return Verdict(0.0, "not_exact_match", "the action differs from the expert's in canonical form")
