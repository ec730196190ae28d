"""What an action did to the repository, read from its sandbox: the edit (changed files, their
hunks against the pivot's tree, the AST of each changed Python file), whether it touched the
tests, and the outcome of tests run the verifier's way (`run_tests`).

The effect verifier compares these for the sampled and the expert action, each run from the
same fork of the pivot's state. Every probe is one bounded sandbox command in a clean shell
(`run(clean=True)`), so nothing a call exported or defined reaches it; no result is read from
text the code under test could print.
"""

from __future__ import annotations

import re
import secrets
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

# Runs in the sandbox (python3 -c, a clean shell, cwd the workspace): the verifier's own test run.
# argv: workdir, mode ("run", or "list": load only), test ids ("*": discover). Its first line is a
# secret it makes before any repository code is imported; after it, only lines that start with the
# secret count ("<secret> runners ...", "<secret> test <index> pass|skip|fail", "<secret> tampered",
# "<secret> methods <count> <digest>"), written to a copy of stdout while the tests' stdin, stdout
# and stderr are /dev/null. The repository comes after the standard library on sys.path and bytecode
# in __pycache__ is ignored. A test passes when it ran and succeeded ("skip": succeeded with a skip
# or an expected failure), with unittest's classes and functions, the import hooks, the trace
# function and its own class as they were before (see `effects.run_tests`).
_RUNNER = r"""
import os, sys


def main(workdir, mode, names):
    import builtins, hashlib, importlib.util, shutil

    secret = os.urandom(16).hex()
    report = os.fdopen(os.dup(1), "w", buffering=1)
    quiet = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(quiet, fd)
    report.write(secret + "\n")
    root = os.path.realpath(workdir)
    sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != root]
    runners = [name for name in ("python", "python3", "pytest", "py.test") if shutil.which(name)]
    if importlib.util.find_spec("pytest") is not None:
        runners.append("pytest-module")
    report.write(f"{secret} runners {' '.join(runners)}\n")
    sys.path.append(root)
    sys.pycache_prefix = "/proc/pivot-no-bytecode"
    import unittest

    class Result(unittest.TestResult):
        def __init__(self):
            super().__init__()
            self.passed = []

        def addSuccess(self, test):
            super().addSuccess(test)
            self.passed.append(test.id())

    modules = {n: m for n, m in sys.modules.items() if n == "unittest" or n.startswith("unittest.")}
    framework = [Result] + [
        v for m in modules.values() for v in vars(m).values()
        if isinstance(v, type) and getattr(v, "__module__", "").startswith("unittest")
    ]

    def members(classes):
        return {(id(c), k): id(v) for c in classes for k, v in vars(c).items()}

    def fingerprint():
        hooks = (sys.meta_path, sys.path_hooks, [builtins.__import__, builtins.__build_class__])
        return {
            **{("module", n): id(sys.modules.get(n)) for n in modules},
            **{(n, k): id(v) for n, m in modules.items() for k, v in vars(m).items()},
            **members(framework),
            ("hooks",): [[id(h) for h in group] for group in hooks] + [id(sys.gettrace()), id(sys.getprofile())],
        }

    def changed(now, before):
        # A module attribute added on first use (unittest.IsolatedAsyncioTestCase) is no change.
        return any(now.get(k) != v for k, v in before.items()) or any(
            isinstance(k[0], int) for k in now.keys() - before.keys()
        )

    def flatten(suite):
        for test in suite:
            if isinstance(test, unittest.TestSuite):
                yield from flatten(test)
            else:
                yield test

    def patched(case):
        # A TestCase method (an assert) replaced on the test instance by anything but its own method.
        return any(
            callable(v) and hasattr(unittest.TestCase, k) and getattr(v, "__self__", None) is not case
            for k, v in vars(case).items()
        )

    def overrides(cases):
        # The TestCase methods the tests' classes define (a test's own assert helpers included).
        classes = {c for case in cases for c in type(case).__mro__}
        return {
            (id(c), k): id(v) for c in classes for k, v in vars(c).items()
            if callable(v) and hasattr(unittest.TestCase, k)
        }

    before = fingerprint()
    every = set()
    for index, name in enumerate(names):
        status = "fail"
        try:
            loader = unittest.TestLoader()
            suite = loader.discover(root, top_level_dir=root) if name == "*" else loader.loadTestsFromName(name)
            cases = list(flatten(suite))
            every.update(case.id() for case in cases)
            own = overrides(cases)
            if mode == "run" and cases:
                result = Result()
                suite.run(result)
                failed = result.failures or result.errors or result.unexpectedSuccesses
                if failed or result.testsRun != len(cases) or any(patched(case) for case in cases):
                    status = "fail"
                elif overrides(cases) != own:
                    status = "fail"
                elif result.skipped or result.expectedFailures:
                    status = "skip"
                elif sorted(result.passed) == sorted(case.id() for case in cases):
                    status = "pass"
        except BaseException:
            status = "fail"
        if changed(fingerprint(), before):
            report.write(f"{secret} tampered\n")
            break
        report.write(f"{secret} test {index} {status}\n")
    listed = "\n".join(sorted(every)).encode()
    report.write(f"{secret} methods {len(every)} {hashlib.sha256(listed).hexdigest()[:32]}\n")


main(sys.argv[1], sys.argv[2], sys.argv[3:])
"""
_SECRET = re.compile(r"[0-9a-f]{32}")


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
    """The sandbox's workspace against `base_tree` (the pivot's tree hash): hunks and AST digests.

    Both probes run in a clean shell (`run(clean=True)`): variables a call exported (GIT_DIR,
    PYTHONPATH, ...) do not reach them."""
    diff = sandbox.run(diff_command(workdir, base_tree, context=0), timeout=timeout, clean=True)
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
            clean=True,
        )
        for line in found.output.splitlines():
            path, _, digest = line.rpartition("\t")
            if path in hunks:
                effect.ast[path] = digest
    return effect


@dataclass
class TestReport:
    """What the verifier's own run of named tests measured in a sandbox (see `run_tests`).

    outcomes: per named test id, "pass" (every test it names ran and passed), "skip" (it succeeded,
              but a test was skipped or failed as expected) or "fail" (anything else, an id not
              reported included).
    methods:  how many test methods the ids name together, and a digest of their sorted ids
              (`digest`), so two lists of ids that name the same tests compare equal.
    runners:  the test runners the sandbox has on its default PATH ("python", "python3",
              "pytest", "py.test"; "pytest-module" when `python3 -m pytest` imports).
    tampered: the code under test changed unittest's classes or functions, the import hooks or the
              trace function while it ran.
    complete: every id was reported (False after a time-out, a crash or tampering).
    files:    the workspace manifest after the run, when asked.
    """

    outcomes: dict[str, str] = field(default_factory=dict)
    methods: int = 0
    digest: str = ""
    runners: frozenset[str] = frozenset()
    tampered: bool = False
    complete: bool = False
    files: dict[str, str] | None = None

    @property
    def passed(self) -> dict[str, bool]:
        """Per id, whether it passed (a skip is no pass: code that skips the tests proves nothing)."""
        return {test: outcome == "pass" for test, outcome in self.outcomes.items()}

    @property
    def successful(self) -> bool:
        """Whether the run as a whole succeeded as a test runner reports it (exit status 0: skips allowed)."""
        return self.complete and bool(self.outcomes) and all(o != "fail" for o in self.outcomes.values())


def is_unittest(repo: Any) -> bool:
    """Whether the repository's test command is unittest's (the verifier's own runner then runs its tests)."""
    return repo.test_command.startswith(("python3 -m unittest", "python -m unittest"))


def run_tests(
    sandbox: Any, repo: Any, tests: list[str], timeout: float, mode: str = "run", files: bool = False
) -> TestReport:
    """Run (or with mode="list", only load) `tests` in the sandbox's workspace, the verifier's way.

    The run is a clean shell (`run(clean=True)`: none of the calls' exported variables, functions
    or working directory) with the repository's pinned environment. `repo` is the task's RepoSpec:
    a unittest repository runs every id through `_RUNNER` (see there: a secret-tagged report,
    the repository after the standard library, skips and a changed unittest never passing); any
    other test command runs once per id and its exit status is the outcome. Bounded by `timeout`.
    """
    if not tests:
        return TestReport(complete=True)
    workdir = shlex.quote(repo.workdir)
    if is_unittest(repo):
        ids = " ".join(shlex.quote(test) for test in tests)
        command = f"cd -- {workdir} && {repo.assignments()} python3 -c {shlex.quote(_RUNNER)} {workdir} {mode} {ids}"
        result = sandbox.run(command, timeout=timeout, files=files, clean=True)
        return _read_report(result.output, tests, result.files)
    secret = secrets.token_hex(16)
    runners = (
        f"printf '{secret} runners'; for r in python python3 pytest py.test;"
        " do command -v $r >/dev/null && printf ' %s' $r; done;"
        " python3 -c 'import pytest' >/dev/null 2>&1 && printf ' pytest-module'; echo"
    )
    runs = "; ".join(
        f"( {repo.tests_command([test])} ) </dev/null >/dev/null 2>&1 && echo {secret} test {index} pass"
        f" || echo {secret} test {index} fail"
        for index, test in enumerate(tests)
    )
    result = sandbox.run(
        f"echo {secret}; {runners}; cd -- {workdir} && {runs}", timeout=timeout, files=files, clean=True
    )
    return _read_report(result.output, tests, result.files)


def _read_report(output: str, tests: list[str], files: dict[str, str] | None) -> TestReport:
    """A TestReport from a run's output: only lines tagged with the secret the runner printed first
    (before it, only Python's or bash's own start-up can have printed anything)."""
    lines = output.splitlines()
    report = TestReport(outcomes={test: "fail" for test in tests}, files=files)
    at = next((index for index, line in enumerate(lines) if _SECRET.fullmatch(line.strip())), None)
    if at is None:
        return report
    secret = lines[at].strip() + " "
    seen = set()
    for line in lines[at + 1 :]:
        if not line.startswith(secret):
            continue
        words = line[len(secret) :].split()
        if words[:1] == ["runners"]:
            report.runners = frozenset(words[1:])
        elif words[:1] == ["tampered"]:
            report.tampered = True
        elif len(words) == 3 and words[0] == "test" and words[1].isdigit() and int(words[1]) < len(tests):
            report.outcomes[tests[int(words[1])]] = words[2] if words[2] in ("pass", "skip") else "fail"
            seen.add(int(words[1]))
        elif len(words) == 3 and words[0] == "methods" and words[1].isdigit():
            report.methods, report.digest = int(words[1]), words[2]
    report.complete = len(seen) == len(tests) and not report.tampered
    return report


_TEST_DIRS = {"tests", "test", "testing"}


def is_test_file(path: str, tests: list[str]) -> bool:
    """Whether a workspace path is part of the tests: under a tests/test/testing directory, named like a
    test module (test_*.py, *_test.py, conftest.py), or a module or package a test id's module path
    passes through (`tests.py` or `tests/__init__.py` for `tests.test_x.C.t`)."""
    parts = path.split("/")
    name = parts[-1]
    if _TEST_DIRS & set(parts[:-1]) or name == "conftest.py":
        return True
    if name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")):
        return True
    module = ".".join(parts[:-1] + [name.split(".", 1)[0]]).removesuffix(".__init__")
    return any(test == module or test.startswith(module + ".") for test in tests)


def changed_test_files(
    before: dict[str, str], after: dict[str, str], reference: dict[str, str], tests: list[str]
) -> list[str]:
    """Test files (`is_test_file`) that differ between `before` and `after` (workspace manifests) and
    are not as in `reference` (the expert's manifest after its edit), sorted."""
    return sorted(
        path
        for path in before.keys() | after.keys()
        if before.get(path) != after.get(path)
        and after.get(path) != reference.get(path)
        and is_test_file(path, tests)
    )
