"""What an action did to the repository, read from its sandbox: the edit (changed files, their
hunks against the pivot's tree, the AST of each changed Python file) and the task's test results.

The effect verifier compares these for the sampled and the expert action, each run from the
same fork of the pivot's state. Every probe is one bounded sandbox command.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from .tools import diff_command

MAX_FILES = 200  # changed files read per probe; more is reported as truncated
_FILE = re.compile(r"^diff --git a/(.*) b/(.*)$")
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")

# Runs in the sandbox: the sha256 of `ast.dump` of each named Python file, "deleted" or "syntax_error".
_AST_DIGESTS = r"""
import ast, hashlib, sys
for path in sys.argv[1:]:
    try:
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read())
        print(path, hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:32], sep="\t")
    except FileNotFoundError:
        print(path, "deleted", sep="\t")
    except (SyntaxError, ValueError):
        print(path, "syntax_error", sep="\t")
"""

# Runs in the sandbox: each unittest id (a module, class or test) run alone; prints "<id>\t<pass|fail>".
_UNITTEST = r"""
import io, sys, unittest
sys.path.insert(0, ".")
outcomes = []
for name in sys.argv[1:]:
    try:
        suite = unittest.defaultTestLoader.loadTestsFromName(name)
        result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(suite)
        ok = result.wasSuccessful() and result.testsRun > 0
    except Exception:
        ok = False
    outcomes.append(f"{name}\t{'pass' if ok else 'fail'}")
sys.stdout.flush()
print("PIVOT-TESTS")
print("\n".join(outcomes))
"""


@dataclass
class EditEffect:
    """An edit's effect against the pivot's tree.

    hunks:     per changed path, the changed line ranges of the pivot's version ([start, end), 1-based;
               a pure insertion after line n is [n + 1, n + 1)).
    ast:       per changed .py path, a digest of its AST ("deleted", "syntax_error").
    truncated: more files changed than were read.
    """

    hunks: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    ast: dict[str, str] = field(default_factory=dict)
    truncated: bool = False

    def touches(self, other: EditEffect) -> bool:
        """Whether a hunk of this edit overlaps (or borders) a hunk of `other` in the same file."""
        for path, ranges in self.hunks.items():
            for start, end in ranges:
                for other_start, other_end in other.hunks.get(path, []):
                    if start <= other_end and other_start <= end:
                        return True
        return False

    def to_dict(self) -> dict[str, Any]:
        return {"files": sorted(self.hunks), "truncated": self.truncated}


def parse_diff(text: str) -> dict[str, list[tuple[int, int]]]:
    """The changed line ranges of the old side of a `git diff -U0`, per path."""
    hunks: dict[str, list[tuple[int, int]]] = {}
    path = None
    for line in text.splitlines():
        found = _FILE.match(line)
        if found:
            path = found.group(2)
            hunks.setdefault(path, [])
            continue
        found = _HUNK.match(line)
        if found and path is not None:
            start, count = int(found.group(1)), int(found.group(2) or 1)
            hunks[path].append((start, start + count) if count else (start + 1, start + 1))
    return hunks


def edit_effect(sandbox: Any, workdir: str, base_tree: str, timeout: float) -> EditEffect:
    """The sandbox's workspace against `base_tree` (the pivot's tree hash): hunks and AST digests."""
    diff = sandbox.run(diff_command(workdir, base_tree, context=0), timeout=timeout)
    hunks = parse_diff(diff.output)
    truncated = len(hunks) > MAX_FILES or diff.truncated > 0
    paths = sorted(hunks)[:MAX_FILES]
    effect = EditEffect({path: hunks[path] for path in paths}, truncated=truncated)
    python = [path for path in paths if path.endswith(".py")]
    if python:
        quoted = " ".join(shlex.quote(path) for path in python)
        found = sandbox.run(
            f"cd -- {shlex.quote(workdir)} && python3 -I -S -c {shlex.quote(_AST_DIGESTS)} {quoted}",
            timeout=timeout,
        )
        for line in found.output.splitlines():
            path, _, digest = line.rpartition("\t")
            if path in hunks:
                effect.ast[path] = digest
    return effect


def task_test_results(sandbox: Any, repo: Any, tests: list[str], timeout: float) -> dict[str, bool]:
    """Whether each of `tests` passes in the sandbox's workspace (a test that does not report: fails).

    `repo` is the task's RepoSpec: unittest repositories run every id in one process; any other
    test command runs once per id (its exit status is the outcome). Bounded by `timeout` in all.
    """
    if not tests:
        return {}
    exports = " ".join(f"{key}={shlex.quote(value)}" for key, value in sorted(repo.env.items()))
    workdir = shlex.quote(repo.workdir)
    if repo.test_command.startswith(("python3 -m unittest", "python -m unittest")):
        ids = " ".join(shlex.quote(test) for test in tests)
        command = f"cd -- {workdir} && env {exports} python3 -c {shlex.quote(_UNITTEST)} {ids}"
    else:
        runs = "; ".join(
            f"( {repo.tests_command([test])} ) >/dev/null 2>&1 && echo {shlex.quote(test)}$'\\tpass'"
            f" || echo {shlex.quote(test)}$'\\tfail'"
            for test in tests
        )
        command = f"cd -- {workdir} && echo PIVOT-TESTS; {runs}"
    result = sandbox.run(command, timeout=timeout)
    _, _, report = result.output.rpartition("PIVOT-TESTS\n")
    passed = {line.rpartition("\t")[0] for line in report.splitlines() if line.endswith("\tpass")}
    return {test: test in passed for test in tests}
