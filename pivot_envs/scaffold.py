"""`pivotrl new-domain NAME`: an installable domain package to start from.

new_domain("calc", "pivot-envs-calc") writes:

    pivot-envs-calc/
      pyproject.toml             the distribution pivot-envs-calc, entry point calc = pivot_envs_calc:DOMAIN
      README.md
      pivot_envs_calc/
        __init__.py              DOMAIN, the DomainSpec
        env.py                   CalcEnv (PivotEnv): restore, execute, the verifier table
        parse.py                 raw completion -> assistant message (Hermes <tool_call> blocks)
        verifier.py              the functional verifier (same tool results, same final number)
        backend.py               the tools: a calculator that can go offline (an infrastructure failure)
        data/pivots.jsonl        four sample pivots
      tests/test_domain.py       check_pivot_env on pivot/calc-v0, and the verifier's rules

After `pip install -e pivot-envs-calc`, `gym.make("pivot/calc-v0")` works and its tests pass.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from string import Template

from pivot_envs.chat import tool_call
from pivot_envs.errors import PivotEnvsError
from pivot_envs.pivot import Pivot

NAME_RULE = "lowercase letters, digits, '-' and '_', starting with a letter (at most 40 characters)"
_NAME = re.compile(r"[a-z][a-z0-9_-]{0,39}")


class ScaffoldError(PivotEnvsError, ValueError):
    """new-domain refused: a name against the rule, a taken name, or a directory that is not empty."""


def check_name(name: str) -> None:
    """Raise ScaffoldError when `name` breaks NAME_RULE or an installed domain already has it."""
    from pivot_envs.registry import discover

    if not _NAME.fullmatch(name):
        raise ScaffoldError(f"invalid domain name {name!r}: a domain name is {NAME_RULE}")
    installed = discover().get(name)
    if installed is not None:
        raise ScaffoldError(
            f"a domain named {name!r} is already installed ({installed.value}): choose another name"
        )


def new_domain(name: str, directory: str | os.PathLike | None = None) -> list[Path]:
    """Write the package of a new domain `name` into `directory` (default ./pivot-envs-NAME), which
    must be new or empty; returns the files written. Raises ScaffoldError for a bad or taken name
    or a directory that holds anything."""
    check_name(name)
    root = Path(directory if directory is not None else f"pivot-envs-{name}")
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise ScaffoldError(
            f"{root} already exists and is not an empty directory: new-domain never overwrites"
        )
    module = "pivot_envs_" + name.replace("-", "_")
    values = {
        "name": name,
        "module": module,
        "env_class": "".join(part.capitalize() for part in re.split(r"[-_]", name) if part) + "Env",
    }
    files = {
        path.replace("MODULE", module): Template(text).substitute(values) for path, text in TEMPLATES.items()
    }
    files[f"{module}/data/pivots.jsonl"] = "".join(
        json.dumps(p.to_dict()) + "\n" for p in sample_pivots(name)
    )
    written = []
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def sample_pivots(domain: str) -> list[Pivot]:
    """The scaffold's sample pivots: two calculator conversations, a tool call and an answer in each."""
    system = {"role": "system", "content": "You are a calculator assistant. Use the tools, then answer."}
    pivots = []
    for trajectory, (question, tool, a, b, answer) in enumerate(
        [
            ("What is 17 + 25?", "add", 17, 25, "17 + 25 = 42."),
            ("What is 6 times 8?", "multiply", 6, 8, "6 times 8 is 48."),
        ],
        start=1,
    ):
        call = tool_call(tool, {"a": a, "b": b}, "call_0")
        prefix = [system, {"role": "user", "content": question}]
        after_call = [
            *prefix,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": answer.rstrip(".").split()[-1]},
        ]
        for turn, (messages, expert) in enumerate(
            [
                (prefix, {"role": "assistant", "content": None, "tool_calls": [call]}),
                (after_call, {"role": "assistant", "content": answer}),
            ]
        ):
            pivots.append(
                Pivot(
                    id=f"calc/{trajectory}/t{turn}",
                    domain=domain,
                    messages=messages,
                    expert=expert,
                    tools=CALCULATOR_TOOLS,
                    source={"trajectory": f"calc/{trajectory}", "turn": turn},
                )
            )
    return pivots


def _tool(name: str, description: str) -> dict:
    number = {"type": "number"}
    parameters = {"type": "object", "properties": {"a": number, "b": number}, "required": ["a", "b"]}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


CALCULATOR_TOOLS = [_tool("add", "a + b"), _tool("multiply", "a * b")]

TEMPLATES: dict[str, str] = {}

TEMPLATES["pyproject.toml"] = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "pivot-envs-$name"
version = "0.1.0"
description = "The $name domain for pivot-envs: pivot/$name-v0"
requires-python = ">=3.10"
dependencies = ["pivot-envs"]

[project.optional-dependencies]
test = ["pytest>=8"]

# `import pivot_envs` reads this group and registers pivot/$name-v0 (the module loads on gym.make).
[project.entry-points."pivot_envs.domains"]
$name = "$module:DOMAIN"

[tool.setuptools.packages.find]
include = ["$module*"]  # the package and its data/ folder

[tool.setuptools.package-data]
"*" = ["*.jsonl"]

[tool.pytest.ini_options]
testpaths = ["tests"]
"""

TEMPLATES["README.md"] = """\
# pivot-envs-$name

The `$name` domain for [pivot-envs](https://github.com/pivot-envs/pivot-envs): `pivot/$name-v0`.

    pip install -e .
    pytest

It starts as a calculator tool domain: replace the tools (`$module/backend.py`), the parser
(`parse.py`), the verifier (`verifier.py`) and the pivots (`data/pivots.jsonl`) with your own,
and keep `tests/test_domain.py` passing: it runs `check_pivot_env`, the pivot contract.
"""

TEMPLATES["MODULE/__init__.py"] = '''\
"""The $name domain: `pivot/$name-v0`."""

from pivot_envs.registry import DomainSpec

from $module.env import $env_class

DOMAIN = DomainSpec(
    name="$name",
    env_class=$env_class,
    description="$name: calculator tool calls and answers (made by pivotrl new-domain)",
    verifiers=("functional", "strict"),
)

__all__ = ["DOMAIN", "$env_class"]
'''

TEMPLATES["MODULE/env.py"] = '''\
"""$env_class: `pivot/$name-v0`, the next assistant turn of a calculator conversation."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from pivot_envs import Outcome, ParsedAction, Pivot, PivotEnv, StrictVerifier, read_pivots

from $module.backend import Calculator
from $module.parse import parse_action
from $module.verifier import FunctionalVerifier


class $env_class(PivotEnv):
    """gym.make("pivot/$name-v0", pivots=None, verifier="functional")

    reset() gives the pivot's conversation and a fresh calculator; step(action) parses the turn,
    runs its tool calls (their results are appended to the observation as tool messages), runs
    the expert's calls from the same state, and scores the turn with the verifier.
    """

    domain = "$name"
    default_verifier = "functional"
    verifiers = {"functional": FunctionalVerifier, "strict": StrictVerifier}

    def default_pivots(self) -> list[Pivot]:
        with resources.as_file(resources.files("$module") / "data" / "pivots.jsonl") as path:
            return read_pivots(path)

    def parse(self, action: Any) -> ParsedAction:
        return parse_action(action)

    def restore(self, pivot: Pivot) -> None:
        self.calculator = Calculator()  # the state at the pivot: a calculator has none but being up

    def execute(self, pivot: Pivot, action: dict[str, Any]) -> Outcome:
        results = self.run_calls(self.calculator, action)  # InfrastructureError: the sample is invalid
        expert = self.run_calls(Calculator(), pivot.expert)
        messages = [
            {"role": "tool", "tool_call_id": call["id"], "content": result}
            for call, result in zip(action.get("tool_calls") or [], results, strict=True)
        ]
        return Outcome(messages=messages, output=results, data={"results": results, "expert_results": expert})

    @staticmethod
    def run_calls(calculator: Calculator, message: dict[str, Any]) -> list[str]:
        calls = message.get("tool_calls") or []
        return [calculator.run(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
'''

TEMPLATES["MODULE/backend.py"] = '''\
"""The tools of the $name domain: a calculator. A real domain puts its backend here (a database, a
sandbox, a service) and raises InfrastructureError when the backend, not the action, fails."""

from __future__ import annotations

import json
from typing import Any

from pivot_envs import InfrastructureError

FUNCTIONS = {"add": lambda a, b: a + b, "multiply": lambda a, b: a * b}


class Calculator:
    """Runs one tool call; `online = False` stands for a backend that went down."""

    def __init__(self) -> None:
        self.online = True

    def run(self, name: str, arguments: dict[str, Any]) -> str:
        """The call's result as text; a bad call is the action's fault and gets an error text."""
        if not self.online:
            raise InfrastructureError("the calculator backend is offline")
        function = FUNCTIONS.get(name)
        if function is None:
            return f"Error: no tool {name!r}; the tools are {sorted(FUNCTIONS)}"
        if sorted(arguments) != ["a", "b"]:
            return f"Error: {name} takes the arguments a and b, got {sorted(arguments)}"
        if not all(isinstance(arguments[key], (int, float)) and not isinstance(arguments[key], bool) for key in "ab"):
            return f"Error: {name}: a and b must be numbers"
        return json.dumps(function(arguments["a"], arguments["b"]))
'''

TEMPLATES["MODULE/parse.py"] = '''\
"""Completions to assistant messages: Hermes `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
blocks become tool calls, other text a message; a message dict is checked and kept."""

from __future__ import annotations

import json
import re
from typing import Any

from pivot_envs import ParsedAction
from pivot_envs.chat import tool_call
from pivot_envs.env import message_problem

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def parse_action(action: Any) -> ParsedAction:
    """The assistant message of `action` (text or a message dict), or category "unparseable" and why."""
    if isinstance(action, dict):
        problem = message_problem(action)
        if problem:
            return ParsedAction(None, "unparseable", problem)
        functions = [call.get("function", call) for call in action.get("tool_calls") or []]
        content = action.get("content")
        if isinstance(content, list):  # content parts: their text
            content = "".join(part.get("text", "") for part in content)
        return _message(content, [(function["name"], function.get("arguments") or {}) for function in functions])
    if not isinstance(action, str):
        return ParsedAction(None, "unparseable", f"an action is text or a message dict, got {type(action).__name__}")
    if not action.strip():
        return ParsedAction(None, "unparseable", "empty completion")
    calls = []
    for index, block in enumerate(TOOL_CALL.findall(action)):
        try:
            call = json.loads(block)
        except ValueError as error:
            return ParsedAction(None, "unparseable", f"tool call {index} is not JSON: {error}")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return ParsedAction(None, "unparseable", f'tool call {index} is not {{"name": ..., "arguments": {{...}}}}')
        calls.append((call["name"], call.get("arguments") or {}))
    return _message(TOOL_CALL.sub("", action).strip() or None, calls)


def _message(content: Any, calls: list[tuple[str, Any]]) -> ParsedAction:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    for index, (name, arguments) in enumerate(calls):
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError as error:
                return ParsedAction(None, "unparseable", f"tool call {index} ({name}): arguments are not JSON: {error}")
        if not isinstance(arguments, dict):
            return ParsedAction(None, "unparseable", f"tool call {index} ({name}): arguments must be a JSON object")
        message.setdefault("tool_calls", []).append(tool_call(name, arguments, f"call_{index}"))
    return ParsedAction(message)
'''

TEMPLATES["MODULE/verifier.py"] = '''\
"""The functional verifier of the $name domain: what the turn does, not how it is written."""

from __future__ import annotations

import re
from typing import Any

from pivot_envs import Outcome, Pivot, Verdict

NUMBER = re.compile(r"-?\\d+(?:\\.\\d+)?")


class FunctionalVerifier:
    """A tool turn scores 1 when it calls the expert's tools, in order, and they return the expert's
    results (add(25, 17) is add(17, 25)); a message scores 1 when its last number is the expert's."""

    name = "functional"

    def verify(self, pivot: Pivot, action: dict[str, Any], outcome: Outcome | None = None) -> Verdict:
        names = [call["function"]["name"] for call in action.get("tool_calls") or []]
        expected = [call["function"]["name"] for call in pivot.expert.get("tool_calls") or []]
        if expected or names:
            if names != expected:
                return Verdict(0.0, "wrong_tools", f"called {names}, the expert called {expected}")
            data = outcome.data if outcome is not None else {}
            if data.get("results") != data.get("expert_results"):
                return Verdict(0.0, "wrong_result", f"results {data.get('results')}, the expert's {data.get('expert_results')}")
            return Verdict(1.0, "same_result")
        said, wanted = NUMBER.findall(action.get("content") or ""), NUMBER.findall(pivot.expert.get("content") or "")
        if said and wanted and float(said[-1]) == float(wanted[-1]):
            return Verdict(1.0, "same_answer")
        return Verdict(0.0, "wrong_answer", f"expected the answer {wanted[-1] if wanted else None}")
'''

TEMPLATES["tests/test_domain.py"] = '''\
"""The $name domain keeps the pivot contract, and its verifier rewards what a turn does."""

import gymnasium as gym
import pivot_envs  # registers pivot/$name-v0
import pytest
from pivot_envs import PivotEnv, check_pivot_env

ENV_ID = "pivot/$name-v0"


@pytest.fixture
def env():
    env = gym.make(ENV_ID)
    yield env.unwrapped
    env.close()


def take_the_calculator_offline(env: PivotEnv):
    """check_pivot_env's hook: make the next step's backend fail (a message turn calls nothing)."""
    if not env.pivot.expert.get("tool_calls"):
        return False
    env.calculator.online = False
    return None


def test_the_env_is_registered():
    assert ENV_ID in pivot_envs.ENV_IDS


def test_the_env_keeps_the_pivot_contract(env):
    report = check_pivot_env(env, pivots=len(env.pivots), break_infrastructure=take_the_calculator_offline)
    assert "infrastructure_failure_invalid" in report.passed, report


def test_a_call_with_its_arguments_swapped_returns_the_same_result_and_scores_one(env):
    env.reset(options={"pivot": "calc/1/t0"})
    _, reward, _, _, info = env.step('<tool_call>{"name": "add", "arguments": {"a": 25, "b": 17}}</tool_call>')
    assert (reward, info["category"], info["output"]) == (1.0, "same_result", ["42"])


def test_a_call_to_the_other_tool_scores_zero(env):
    env.reset(options={"pivot": "calc/1/t0"})
    _, reward, _, _, info = env.step('<tool_call>{"name": "multiply", "arguments": {"a": 17, "b": 25}}</tool_call>')
    assert (reward, info["category"], info["valid"]) == (0.0, "wrong_tools", True)


def test_an_answer_is_judged_by_its_number_not_its_wording(env):
    env.reset(options={"pivot": "calc/1/t1"})
    assert env.step("The sum is 42")[1] == 1.0
    env.reset(options={"pivot": "calc/1/t1"})
    assert env.step("The sum is 41")[1] == 0.0
'''
