"""The SWE domain tests' own repository: a tiny Python package with one test file, a bug injected
into it, and an expert trajectory of five calls (grep, view, str_replace, test run, submit), so
the tests do not depend on the bundled more-itertools data.
"""

from __future__ import annotations

import difflib
import json

from pivot_envs.chat import assistant_message, tool_call
from pivot_envs.domains.swe import default_tools
from pivot_envs.domains.swe.repo import RepoSpec, repo_context
from pivot_envs.pivot import Pivot

OPS = """def add(a, b):
    return a + b


def mean(values):
    if not values:
        raise ValueError("mean of nothing")
    return sum(values) / len(values)


def clamp(x, low, high):
    return max(low, min(x, high))
"""
BUGGY = OPS.replace("return sum(values) / len(values)", "return sum(values) / (len(values) + 1)")
TESTS = """import unittest

from calc.ops import add, clamp, mean


class AddTests(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)


class MeanTests(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3]), 2)

    def test_empty(self):
        with self.assertRaises(ValueError):
            mean([])


class ClampTests(unittest.TestCase):
    def test_clamp(self):
        self.assertEqual(clamp(5, 0, 3), 3)
"""
FIX_OLD = "    return sum(values) / (len(values) + 1)"
FIX_NEW = "    return sum(values) / len(values)"
PROBLEM = "calc.ops.mean([1, 2, 3]) returns 1.5 instead of 2.0."
# The expert's calls, in order: a pivot at turn t has the first t as its prefix and call t as the expert's.
EXPERT_CALLS = [
    ("bash", {"command": "grep -rn 'def mean' --include=*.py ."}),
    ("str_replace_editor", {"command": "view", "path": "/repo/calc/ops.py"}),
    (
        "str_replace_editor",
        {"command": "str_replace", "path": "/repo/calc/ops.py", "old_str": FIX_OLD, "new_str": FIX_NEW},
    ),
    ("bash", {"command": "python3 -m unittest tests.test_ops.MeanTests"}),
    ("submit", {}),
]


def call_message(name: str, arguments: dict, index: int = 0) -> dict:
    """An assistant turn making one call."""
    return assistant_message(None, [tool_call(name, arguments, f"call_{index}")])


def bug_patch() -> str:
    diff = difflib.unified_diff(
        OPS.splitlines(True), BUGGY.splitlines(True), "a/calc/ops.py", "b/calc/ops.py"
    )
    return "".join(diff)


def calc_pivot(repo: RepoSpec, turn: int, harness: str = "persistent", **context) -> Pivot:
    """The pivot at `turn` of the expert trajectory (placeholder tool outputs in the prefix)."""
    task = {
        "id": "calc-mean",
        "repo": "calc",
        "file": "calc/ops.py",
        "function": "mean",
        "kind": "off_by_one",
        "bug_patch": bug_patch(),
        "fix_patch": "",
        "fail_to_pass": ["tests.test_ops.MeanTests"],
        "pass_to_pass": ["tests.test_ops.AddTests", "tests.test_ops.ClampTests"],
        "problem_statement": PROBLEM,
    }
    messages = [
        {"role": "system", "content": "You fix bugs in the repository at /repo."},
        {"role": "user", "content": PROBLEM},
    ]
    for index, (name, arguments) in enumerate(EXPERT_CALLS[:turn]):
        messages += [
            call_message(name, arguments, index),
            {"role": "tool", "tool_call_id": f"call_{index}", "content": "(output)"},
        ]
    name, arguments = EXPERT_CALLS[turn]
    full_context = {**repo_context(repo), "task": task, "harness": harness, "executable": True, **context}
    return Pivot(
        f"calc-mean/t{turn}",
        "swe",
        messages,
        call_message(name, arguments, turn),
        tools=default_tools(),
        context=json.loads(json.dumps(full_context)),
        source={"trajectory": "calc-mean", "turn": turn},
    )
