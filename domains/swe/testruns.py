"""Test commands read from their words: the test ids a command names (`named_tests`) and whether a
command is a plain test run (`plain_test_run`), which the effect verifier requires of a sample at
a test-run pivot.

A plain test run is one test runner on named tests and nothing else, so that running the command
runs those tests: an optional `cd` into the repository, assignments of the repository's own pinned
test environment, the runner (`python3 -m unittest`, `python3 -m pytest`, `pytest`; `python` for
`python3`) with flags that change neither which tests run nor whether they run (verbosity, buffer,
traceback style, fail fast), the test ids, an optional `2>&1`, and output filters (`| tail`,
`| grep`, `| cat`). Anything else (another command before or after, `-k`, `--help`, an expansion,
a redirection into a file, a variable such as PYTHONPATH) can keep the tests from running while the
command still names them.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass

_SAFE = re.compile(r"[A-Za-z0-9_./:=,+@%\[\]-]+")
_OPERATORS = ("2>&1", "&&", "|")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_FLAGS = {
    "unittest": re.compile(r"-[vqbcf]+|--(?:verbose|quiet|buffer|catch|failfast|locals)"),
    "pytest": re.compile(
        r"-(?:v+|q+|s|x|l|r[a-zA-Z]+)|--(?:no-header|disable-warnings|color=(?:yes|no|auto)"
        r"|tb=(?:auto|long|short|line|native|no))"
    ),
}
# Test ids each runner takes: unittest dotted names or .py paths; pytest paths with ::parts.
_IDS = {
    "unittest": re.compile(r"\w+(?:\.\w+)*|[\w./-]+\.py"),
    "pytest": re.compile(r"(?:\./)?(?:[\w-]+/)*[\w-]+(?:\.py|/)?(?:::[\w\[\]-]+)*"),
}
_PYTHON_FLAGS = ("-B", "-u")
_FILTERS = {
    "tail": re.compile(r"-n|-n?\+?\d+|\+?\d+"),
    "grep": re.compile(r"[^-].*|-[viEFwxnHhc]+|-[ABC]\d*|-e"),
    "cat": re.compile(r"(?!)"),
}


def test_id(argument: str) -> str:
    """A test id as unittest's dotted name (`tests/test_x.py::C::t` -> `tests.test_x.C.t`)."""
    path, _, rest = argument.partition("::")
    return ".".join([path.removesuffix(".py").replace("/", ".").strip("."), *filter(None, rest.split("::"))])


def named_tests(command: str) -> frozenset[str]:
    """The test ids a test command names, normalised (`tests/test_x.py::C::t` -> `tests.test_x.C.t`); "*" for all.

    Lenient: it reads the words after the first unittest/pytest up to a shell operator (used for
    the expert's command, which is the reference, not for a sample's)."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    ids: set[str] = set()
    for index, word in enumerate(words):
        if word in ("unittest", "pytest", "py.test") or word.endswith("/pytest"):
            for argument in words[index + 1 :]:
                if any(mark in argument for mark in "<>|;&"):
                    break  # the command goes on past the test runner's arguments
                if argument.startswith("-") or argument in ("discover",):
                    continue
                ids.add(test_id(argument))
            break
    return frozenset(ids or {"*"})


@dataclass(frozen=True)
class TestRun:
    """A plain test run (see the module docstring).

    needs: the runners that must be present for it to run ("python3", "pytest", "pytest-module",
           as `effects.TestReport.runners` names them).
    ids:   the test ids it names, normalised (`test_id`); {"*"} when it names none (all tests).
    piped: its output goes through a filter, so its exit status is the filter's.
    """

    needs: tuple[str, ...]
    ids: frozenset[str]
    piped: bool


def _tokens(command: str) -> list[tuple[str, str]] | None:
    """("word", text) and ("op", operator) tokens of a command of plain words, or None when it has
    anything else (an expansion, a backslash, another operator, an unclosed quote)."""
    tokens: list[tuple[str, str]] = []
    at = 0
    while at < len(command):
        if command[at] in " \t":
            at += 1
            continue
        operator = next((op for op in _OPERATORS if command.startswith(op, at)), None)
        if operator == "|" and command.startswith("||", at):
            return None
        if operator is not None:
            tokens.append(("op", operator))
            at += len(operator)
            continue
        parts = []
        while at < len(command) and command[at] not in " \t|" and not command.startswith("&&", at):
            quote = command[at]
            if quote in "'\"":
                end = command.find(quote, at + 1)
                inside = command[at + 1 : end]
                if end < 0 or (quote == '"' and any(mark in inside for mark in "$`\\!")):
                    return None
                parts.append(inside)
                at = end + 1
                continue
            found = _SAFE.match(command, at)
            if found is None:
                return None
            parts.append(found.group())
            at = found.end()
        tokens.append(("word", "".join(parts)))
    return tokens


def plain_test_run(command: str, workdir: str, env: dict[str, str]) -> TestRun | str:
    """The command as a plain test run, or why it is not one (see the module docstring).

    workdir: the repository (the only directory a `cd` may go to); env: its pinned test
    environment (the only assignments allowed, with their values)."""
    tokens = _tokens(command.strip())
    if not tokens:
        return "it has shell syntax beyond words, quotes, `&&` after a cd, `2>&1` and pipes"
    at = 0
    if tokens[0] == ("word", "cd"):
        target = tokens[1][1] if len(tokens) > 1 and tokens[1][0] == "word" else ""
        if tokens[2:3] != [("op", "&&")] or posixpath.normpath(target) not in (
            posixpath.normpath(workdir),
            ".",
        ):
            return "it changes into another directory than the repository"
        at = 3
    while at < len(tokens) and tokens[at][0] == "word" and _ASSIGNMENT.match(tokens[at][1]):
        key, _, value = tokens[at][1].partition("=")
        if env.get(key) != value:
            return f"it sets {key}={value}, which is not the repository's test environment"
        at += 1
    word = tokens[at][1] if at < len(tokens) and tokens[at][0] == "word" else ""
    if word in ("pytest", "py.test"):
        style, needs = "pytest", (word,)
        at += 1
    elif word in ("python", "python3"):
        at += 1
        while at < len(tokens) and tokens[at][1] in _PYTHON_FLAGS:
            at += 1
        module = tokens[at + 1][1] if tokens[at : at + 1] == [("word", "-m")] and at + 1 < len(tokens) else ""
        if module not in ("unittest", "pytest"):
            return "it runs python, but not `-m unittest` or `-m pytest`"
        style, needs = module, (word, "pytest-module") if module == "pytest" else (word,)
        at += 2
    else:
        return "it does not start with a test runner"
    ids = set()
    while at < len(tokens) and tokens[at][0] == "word":
        argument = tokens[at][1]
        if argument.startswith("-"):
            if not _FLAGS[style].fullmatch(argument):
                return f"{argument} changes which tests run or whether they run"
        elif _IDS[style].fullmatch(argument) and argument != "discover":
            ids.add(test_id(argument))
        else:
            return f"{argument!r} is not a test id the {style} runner takes"
        at += 1
    if tokens[at : at + 1] == [("op", "2>&1")]:
        at += 1
    piped = False
    while at < len(tokens):
        name = tokens[at + 1][1] if tokens[at] == ("op", "|") and at + 1 < len(tokens) else ""
        if name not in _FILTERS:
            return "it goes on after the test run with more than an output filter (tail, grep, cat)"
        at += 2
        while at < len(tokens) and tokens[at][0] == "word":
            if not _FILTERS[name].fullmatch(tokens[at][1]):
                return f"{name} {tokens[at][1]} is not an output filter"
            at += 1
        piped = True
    return TestRun(needs, frozenset(ids or {"*"}), piped)
