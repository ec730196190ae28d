"""SWE tasks: a bug injected into one function of a repository, the tests it breaks, and the issue
text the agent is given.

Tasks are made by the project in the SWE-smith / R2E-Gym style (`make_tasks`): a mutation of the
AST of one top-level function in the repository's source files (a comparison operator flipped, an
off-by-one constant, a wrong default argument, an if-branch dropped, two call arguments swapped,
`+`/`-` or `and`/`or` exchanged), written back as a one-place text edit so the bug patch is a
small unified diff. The repository's tests run on the host in a scratch copy under the pinned
environment, with a time and memory bound: FAIL_TO_PASS are the tests that pass on the base and
fail with the bug (kept when there are 1 to 5, they fail the same way on a second run, and the
failing test calls the function by name); PASS_TO_PASS is a bounded sample of tests of the same
test module that pass both ways. The problem statement is written from the first failing test's
symptom (its failing line and the assertion message), never from the fix.

The task file is JSONL, one task per line, every field of `SweTask`:

    {"id": "more-itertools/chunked-flip_comparison-1", "repo": "more-itertools",
     "file": "more_itertools/more.py", "function": "chunked", "kind": "flip_comparison",
     "bug_patch": "--- a/more_itertools/more.py\\n+++ b/...", "fix_patch": "...",
     "fail_to_pass": ["tests.test_more.ChunkedTests.test_even"],
     "pass_to_pass": ["tests.test_more.ChunkedTests.test_odd"],
     "problem_statement": "..."}

A user's own tasks need the same fields (ids as the repository's test command takes them; patches
with `a/` and `b/` paths relative to the repository root), with the repository described by a
RepoSpec file (see `repo`). `make_tasks` discovers tests with unittest; tasks written by hand
work with any test command.
"""

from __future__ import annotations

import ast
import difflib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pivot_envs.errors import PivotEnvsError
from pivot_envs.jsonl import iter_records

from .repo import RepoSpec, apply_patch, bundled_repo, unpack

KINDS = (
    "flip_comparison",
    "off_by_one",
    "wrong_default",
    "drop_branch",
    "swap_arguments",
    "flip_arithmetic",
    "flip_boolean",
)
FIELDS = (
    "id",
    "repo",
    "file",
    "function",
    "kind",
    "bug_patch",
    "fix_patch",
    "fail_to_pass",
    "pass_to_pass",
    "problem_statement",
)
MAX_FAILING = 5
PASS_TO_PASS = 8
# Test classes slower than this on the base are left out of task discovery (more-itertools'
# prime and polynomial tests take 30 s of the suite's 37).
SLOW_CLASS_SECONDS = 0.5
TEST_TIMEOUT = 60.0
TEST_MEMORY_MB = 1024


class TaskFormatError(PivotEnvsError, ValueError):
    """A task file that cannot be read; the message names the file and the line."""


@dataclass(frozen=True)
class SweTask:
    """One injected-bug task (see the module docstring for the file format).

    bug_patch:    unified diff that injects the bug into the base.
    fix_patch:    its reverse, the expert's edit.
    fail_to_pass: tests that fail with the bug and pass with the fix.
    pass_to_pass: a bounded sample of tests of the same module that pass both ways.
    """

    id: str
    repo: str
    file: str
    function: str
    kind: str
    bug_patch: str
    fix_patch: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    problem_statement: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _task_from(data: Any, where: str) -> SweTask:
    if not isinstance(data, dict):
        raise TaskFormatError(f"{where}: a task must be a JSON object, got {type(data).__name__}")
    missing = [name for name in FIELDS if name not in data]
    if missing:
        raise TaskFormatError(f"{where}: task {data.get('id', '?')!r} lacks {', '.join(missing)}")
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise TaskFormatError(f"{where}: task {data['id']!r} has unknown field(s) {', '.join(unknown)}")
    for name in FIELDS:
        value = data[name]
        if name in ("fail_to_pass", "pass_to_pass"):
            if not isinstance(value, list) or not all(isinstance(test, str) and test for test in value):
                raise TaskFormatError(f"{where}: task {data['id']!r}: {name} must be a list of test ids")
        elif not isinstance(value, str) or (not value and name != "bug_patch"):
            raise TaskFormatError(f"{where}: task {data.get('id')!r}: {name} must be a non-empty string")
    if not data["fail_to_pass"]:
        raise TaskFormatError(f"{where}: task {data['id']!r}: fail_to_pass names no test")
    return SweTask(**{name: data[name] for name in FIELDS})


def read_tasks(path: str | os.PathLike[str]) -> list[SweTask]:
    """The tasks of a JSONL file; TaskFormatError names the file and the line of a bad or repeated task."""
    path = Path(path)
    tasks, seen = [], set()
    try:
        records = list(iter_records(path, "task", TaskFormatError))
    except OSError as error:
        raise TaskFormatError(f"{path}: cannot read the task file: {error.strerror}") from None
    for number, data in records:
        where = f"{path}:{number}"
        task = _task_from(data, where)
        if task.id in seen:
            raise TaskFormatError(f"{where}: task id {task.id!r} is defined twice")
        seen.add(task.id)
        tasks.append(task)
    return tasks


def write_tasks(tasks: list[SweTask], path: str | os.PathLike[str]) -> int:
    """Write tasks as JSONL (one per line, keys in field order); returns how many."""
    with Path(path).open("w", encoding="utf-8") as handle:
        for task in tasks:
            handle.write(json.dumps(task.to_dict(), ensure_ascii=False) + "\n")
    return len(tasks)


def tasks_file() -> Path:
    """The bundled task file."""
    return Path(str(resources.files("pivot_envs.domains.swe") / "data" / "tasks.jsonl"))


def bundled_tasks() -> list[SweTask]:
    """The bundled tasks: bugs injected into more-itertools."""
    return read_tasks(tasks_file())


# -- patches -------------------------------------------------------------------------------------


def make_patch(file: str, before: str, after: str) -> str:
    """The unified diff (paths a/FILE, b/FILE, 3 lines of context) that turns `before` into `after`."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{file}", f"b/{file}"
    )
    return "".join(lines)


def patched_text(directory: Path, file: str, patch: str) -> str:
    """`file`'s text after applying `patch` to a scratch copy of it (the original is left alone)."""
    with tempfile.TemporaryDirectory(prefix="pivot-swe-patch-") as scratch:
        target = Path(scratch) / file
        target.parent.mkdir(parents=True)
        shutil.copyfile(directory / file, target)
        apply_patch(Path(scratch), patch)
        return target.read_text(encoding="utf-8")


# -- mutations -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutation:
    """One bug: `function` in `file` changed at `line` (1-based), characters start:end of the file replaced."""

    file: str
    function: str
    kind: str
    line: int
    start: int
    end: int
    replacement: str

    def apply(self, text: str) -> str:
        """The mutated file, from the original `text`."""
        return text[: self.start] + self.replacement + text[self.end :]


_COMPARE = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
}
_FLIPPED = {
    "<": "<=",
    "<=": "<",
    ">": ">=",
    ">=": ">",
    "==": "!=",
    "!=": "==",
    "is": "is not",
    "is not": "is",
    "in": "not in",
    "not in": "in",
}


def _offset(lines: list[str], line: int, column: int) -> int:
    """The character offset in the file of (1-based line, UTF-8 byte column), as ast reports positions."""
    start = sum(len(text) for text in lines[: line - 1])
    return start + len(lines[line - 1].encode("utf-8")[:column].decode("utf-8", errors="replace"))


class _Mutator:
    """Collects the mutations of one source file, as (kind, line, start, end, replacement) edits."""

    def __init__(self, file: str, text: str) -> None:
        self.file, self.text = file, text
        self.lines = text.splitlines(keepends=True)
        self.tree = ast.parse(text)

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (
            _offset(self.lines, node.lineno, node.col_offset),
            _offset(self.lines, node.end_lineno, node.end_col_offset),
        )

    def gap(self, left: ast.AST, right: ast.AST) -> tuple[int, int, str] | None:
        """The text between two operands on one line (where the operator is), or None."""
        if left.end_lineno != right.lineno:
            return None
        start = _offset(self.lines, left.end_lineno, left.end_col_offset)
        end = _offset(self.lines, right.lineno, right.col_offset)
        return start, end, self.text[start:end]

    def edits(self, function: ast.FunctionDef) -> Iterator[tuple[str, int, int, int, str]]:
        defaults = function.args.defaults + [d for d in function.args.kw_defaults if d is not None]
        for default in defaults:
            if isinstance(default, ast.Constant) and default.lineno == default.end_lineno:
                start, end = self.span(default)
                value = default.value
                if isinstance(value, bool):
                    yield "wrong_default", default.lineno, start, end, str(not value)
                elif isinstance(value, int) and not isinstance(value, bool):
                    yield "wrong_default", default.lineno, start, end, str(value + 1)
        for node in ast.walk(function):
            yield from self._node_edits(node)

    def _node_edits(self, node: ast.AST) -> Iterator[tuple[str, int, int, int, str]]:
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            found = self.gap(node.left, node.comparators[0])
            token = _COMPARE.get(type(node.ops[0]))
            if found and token and " ".join(found[2].strip(" ()").split()) == token:
                start, end, between = found
                yield (
                    "flip_comparison",
                    node.lineno,
                    start,
                    end,
                    between.replace(between.strip(" ()"), _FLIPPED[token]),
                )
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            found = self.gap(node.left, node.right)
            token = "+" if isinstance(node.op, ast.Add) else "-"
            if found and found[2].strip(" ()") == token:
                start, end, between = found
                yield (
                    "flip_arithmetic",
                    node.lineno,
                    start,
                    end,
                    between.replace(token, "-" if token == "+" else "+"),
                )
            if isinstance(node.right, ast.Constant) and type(node.right.value) is int:
                start, end = self.span(node.right)
                yield "off_by_one", node.lineno, start, end, str(node.right.value + 1)
        elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
            found = self.gap(node.values[0], node.values[1])
            token = "and" if isinstance(node.op, ast.And) else "or"
            if found and found[2].strip(" ()") == token:
                start, end, between = found
                yield (
                    "flip_boolean",
                    node.lineno,
                    start,
                    end,
                    between.replace(token, "or" if token == "and" else "and"),
                )
        elif isinstance(node, (ast.Subscript, ast.Slice)):
            parts = [node.slice] if isinstance(node, ast.Subscript) else [node.lower, node.upper]
            for part in parts:
                if isinstance(part, ast.Constant) and type(part.value) is int:
                    start, end = self.span(part)
                    yield (
                        "off_by_one",
                        part.lineno,
                        start,
                        end,
                        str(part.value + 1 if part.value >= 0 else part.value - 1),
                    )
        elif isinstance(node, ast.Call):
            args = node.args
            if (
                isinstance(node.func, ast.Name)
                and node.func.id == "range"
                and args
                and isinstance(args[-1], ast.Constant)
                and type(args[-1].value) is int
            ):
                start, end = self.span(args[-1])
                yield "off_by_one", node.lineno, start, end, str(args[-1].value + 1)
            if (
                len(args) >= 2
                and not any(isinstance(a, ast.Starred) for a in args[:2])
                and args[0].lineno == args[1].end_lineno
            ):
                first, second = self.span(args[0]), self.span(args[1])
                a, between, b = (
                    self.text[first[0] : first[1]],
                    self.text[first[1] : second[0]],
                    self.text[second[0] : second[1]],
                )
                if a != b:
                    yield "swap_arguments", node.lineno, first[0], second[1], b + between + a
        elif isinstance(node, ast.If) and not node.orelse:
            yield from self._drop(node)

    def _drop(self, node: ast.If) -> Iterator[tuple[str, int, int, int, str]]:
        """Drop a whole if-statement (no else) that starts a line of its own; a block left empty does not parse."""
        first, last = node.lineno, node.end_lineno
        line = self.lines[first - 1]
        if line.lstrip().startswith("if ") and node.col_offset == len(line) - len(line.lstrip()):
            start = _offset(self.lines, first, 0)
            end = _offset(self.lines, last + 1, 0) if last < len(self.lines) else len(self.text)
            yield "drop_branch", first, start, end, ""

    def mutations(self) -> Iterator[Mutation]:
        for function in self.tree.body:
            if not isinstance(function, ast.FunctionDef):
                continue
            # Each edit stays inside its function: parsing the function alone checks it (the whole file is slow).
            first = _offset(self.lines, function.lineno, 0)
            last = (
                _offset(self.lines, function.end_lineno + 1, 0)
                if function.end_lineno < len(self.lines)
                else len(self.text)
            )
            source = self.text[first:last]
            dump = ast.dump(ast.parse(source))
            for kind, line, start, end, replacement in self.edits(function):
                text = source[: start - first] + replacement + source[end - first :]
                try:
                    mutated = ast.parse(text)
                except SyntaxError:
                    continue  # e.g. a dropped branch that was its block's only statement
                if ast.dump(mutated) != dump:
                    yield Mutation(self.file, function.name, kind, line, start, end, replacement)


def find_mutations(directory: Path, files: tuple[str, ...] | list[str]) -> list[Mutation]:
    """Every mutation of every top-level function in `files` (relative to `directory`), in file order."""
    found = []
    for file in files:
        found.extend(_Mutator(file, (directory / file).read_text(encoding="utf-8")).mutations())
    return found


# -- running tests on the host -------------------------------------------------------------------

# Runs unittest test ids (all of tests/ when none) and prints one JSON object: per test id its
# outcome, seconds, and for a failure the error type, message, the failing test line and the test
# method's source.
_RUNNER = r"""
import inspect, json, sys, time, traceback, unittest
def leaves(suite):
    for test in suite:
        if isinstance(test, unittest.TestSuite):
            yield from leaves(test)
        else:
            yield test
def describe(test, err):
    kind, value, tb = err
    frames = [f for f in traceback.extract_tb(tb) if "/tests/" in f.filename.replace("\\", "/")]
    where = frames[-1] if frames else None
    try:
        source = inspect.getsource(getattr(test, test._testMethodName))
    except (AttributeError, OSError, TypeError):
        source = ""
    return {"type": kind.__name__, "message": str(value)[:1500], "source": source[:4000],
            "file": where.filename.rsplit("/tests/", 1)[-1] if where else "", "line": where.lineno if where else 0,
            "code": where.line if where else "", "function": where.name if where else ""}
class Result(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.outcomes = {}
    def put(self, test, outcome, detail=None):
        if self.outcomes.get(test.id(), {}).get("outcome") in ("fail", "error"):
            return
        self.outcomes[test.id()] = {"outcome": outcome, **(detail or {})}
    def addSuccess(self, test): self.put(test, "pass")
    def addFailure(self, test, err): self.put(test, "fail", describe(test, err))
    def addError(self, test, err): self.put(test, "error", describe(test, err))
    def addSkip(self, test, reason): self.put(test, "skip")
    def addExpectedFailure(self, test, err): self.put(test, "pass")
    def addUnexpectedSuccess(self, test): self.put(test, "fail", {"type": "UnexpectedSuccess", "message": ""})
    def addSubTest(self, test, subtest, err):
        if err is not None:
            self.put(test, "fail" if issubclass(err[0], test.failureException) else "error", describe(test, err))
names = json.loads(sys.argv[1])
loader = unittest.TestLoader()
suite = loader.loadTestsFromNames(names) if names else loader.discover("tests", top_level_dir=".")
result = Result()
for test in leaves(suite):
    if not names and not test.id().startswith("tests."):
        continue
    start = time.perf_counter()
    test.run(result)
    result.outcomes.setdefault(test.id(), {"outcome": "error", "type": "NotRun", "message": ""})
    result.outcomes[test.id()]["seconds"] = time.perf_counter() - start
sys.stdout.write("\n@@outcomes@@" + json.dumps(result.outcomes))
"""


class TestRunError(PivotEnvsError, RuntimeError):
    """The tests could not be run at all (the runner crashed, or ran out of time or memory)."""


def _limit_memory() -> None:
    import resource

    limit = TEST_MEMORY_MB << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def run_unittest(
    directory: Path, tests: list[str], env: dict[str, str], timeout: float = TEST_TIMEOUT
) -> dict[str, dict]:
    """Run unittest ids (every test under tests/ when empty) in `directory` on the host, under the
    pinned `env`, a time limit and a memory limit; returns {test id: {"outcome", "seconds", ...}}.

    Raises TestRunError when the run times out or the runner's report is missing.
    """
    run_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(directory),
        **env,
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    try:
        done = subprocess.run(
            [sys.executable, "-c", _RUNNER, json.dumps(tests)],
            cwd=directory,
            env=run_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=_limit_memory,
        )
    except subprocess.TimeoutExpired:
        raise TestRunError(f"the tests did not finish within {timeout:.0f} s") from None
    _, found, report = done.stdout.rpartition("\n@@outcomes@@")
    if not found:
        raise TestRunError(f"the test runner crashed (exit {done.returncode}): {done.stderr[-500:]}")
    return json.loads(report)


# -- making tasks --------------------------------------------------------------------------------


def problem_statement(function: str, test: str, failure: dict[str, Any]) -> str:
    """An issue-like text from a failing test's symptom: what fails and how, never where the fix is."""
    kind, message = failure.get("type", "AssertionError"), failure.get("message", "").strip()
    if kind == "AssertionError" and "not raised" in message:
        title = f"`{function}` does not raise the error it should"
    elif kind == "AssertionError":
        title = f"`{function}` gives a wrong result"
    else:
        title = f"`{function}` raises {kind}"
    trace = []
    if failure.get("file"):
        trace.append(f'  File "tests/{failure["file"]}", line {failure["line"]}, in {failure["function"]}')
        trace.append(f"    {failure.get('code', '')}")
    trace.append(f"{kind}: {message}" if message else kind)
    return (
        f"{title}\n\nRunning `python3 -m unittest {test}` fails:\n\n```\n" + "\n".join(trace) + "\n```\n\n"
        "The test is right and the library is wrong. Fix the library so that the test passes "
        "without breaking other tests; do not change the tests."
    )


def _mentions(source: str, function: str) -> bool:
    return re.search(rf"\b{re.escape(function)}\b", source) is not None


@dataclass
class Discovery:
    """What make_tasks tried: mutations screened, and why each rejected one was rejected."""

    screened: int = 0
    rejected: dict[str, int] = field(default_factory=dict)

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


def _pass_to_pass(
    base: dict[str, dict], broken: dict[str, dict], failing: list[str], rng: random.Random
) -> list[str]:
    """Up to PASS_TO_PASS tests of the failing tests' module passing both ways, those of the same classes first."""
    classes = {test.rsplit(".", 1)[0] for test in failing}
    modules = {test.rsplit(".", 2)[0] for test in failing}
    both = sorted(
        t
        for t, o in base.items()
        if o["outcome"] == "pass"
        and broken.get(t, {}).get("outcome") == "pass"
        and t.rsplit(".", 2)[0] in modules
    )
    near = [t for t in both if t.rsplit(".", 1)[0] in classes]
    far = [t for t in both if t.rsplit(".", 1)[0] not in classes]
    rng.shuffle(near)
    rng.shuffle(far)
    return sorted((near + far)[:PASS_TO_PASS])


def _interleave(mutations: list[Mutation], rng: random.Random) -> list[Mutation]:
    """The mutations shuffled, then taken one kind at a time in turn, so every kind gets tried early."""
    by_kind: dict[str, list[Mutation]] = {}
    for mutation in mutations:
        by_kind.setdefault(mutation.kind, []).append(mutation)
    for group in by_kind.values():
        rng.shuffle(group)
    order = []
    while any(by_kind.values()):
        for kind in KINDS:
            if by_kind.get(kind):
                order.append(by_kind[kind].pop())
    return order


def make_tasks(
    repo: RepoSpec | None = None,
    count: int = 24,
    seed: int = 0,
    max_tries: int = 600,
    progress: Callable[[int], None] | None = None,
    discovery: Discovery | None = None,
) -> list[SweTask]:
    """Inject bugs into `repo`'s source files until `count` tasks are found (one per function).

    Runs the repository's unittest suite on the host: once on the base (to find the passing tests
    and leave out slow test classes), then once per screened mutation over the fast classes, and
    twice more over the failing tests to keep only deterministic failures. `progress(n)` is called
    after each screened mutation. Returns the tasks in the order found.
    """
    repo = repo or bundled_repo()
    discovery = discovery if discovery is not None else Discovery()
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="pivot-swe-tasks-") as scratch:
        work = Path(scratch)
        unpack(repo, work)
        base = run_unittest(work, [], repo.env, timeout=600)
        seconds: dict[str, float] = {}
        for test, outcome in base.items():
            seconds[test.rsplit(".", 1)[0]] = seconds.get(test.rsplit(".", 1)[0], 0.0) + outcome.get(
                "seconds", 0.0
            )
        fast = sorted(name for name, spent in seconds.items() if spent <= SLOW_CLASS_SECONDS)
        # A bug that makes a loop endless is cut off at a few times the base's run time.
        timeout = max(10.0, 4 * sum(spent for spent in seconds.values() if spent <= SLOW_CLASS_SECONDS))
        originals = {file: (work / file).read_text(encoding="utf-8") for file in repo.sources}
        tasks: list[SweTask] = []
        done_functions: set[tuple[str, str]] = set()
        for mutation in _interleave(find_mutations(work, repo.sources), rng)[:max_tries]:
            if len(tasks) >= count:
                break
            if (mutation.file, mutation.function) in done_functions:
                continue
            discovery.screened += 1
            try:
                (work / mutation.file).write_text(mutation.apply(originals[mutation.file]), encoding="utf-8")
                task = _screen(
                    repo,
                    work,
                    mutation,
                    base,
                    fast,
                    originals[mutation.file],
                    rng,
                    discovery,
                    len(tasks),
                    timeout,
                )
            finally:
                (work / mutation.file).write_text(originals[mutation.file], encoding="utf-8")
            if progress is not None:
                progress(len(tasks) + (task is not None))
            if task is not None:
                tasks.append(task)
                done_functions.add((mutation.file, mutation.function))
    return tasks


def _screen(
    repo: RepoSpec,
    work: Path,
    mutation: Mutation,
    base: dict[str, dict],
    fast: list[str],
    original: str,
    rng: random.Random,
    discovery: Discovery,
    index: int,
    timeout: float,
) -> SweTask | None:
    """The task a mutation makes (the mutated file is in `work`), or None with the reason counted."""
    try:
        broken = run_unittest(work, fast, repo.env, timeout)
    except TestRunError:
        discovery.reject("tests time out or crash")
        return None
    failing = sorted(
        t
        for t, o in broken.items()
        if o["outcome"] in ("fail", "error") and base.get(t, {}).get("outcome") == "pass"
    )
    if not failing:
        discovery.reject("no test fails")
        return None
    if len(failing) > MAX_FAILING:
        discovery.reject(f"more than {MAX_FAILING} tests fail")
        return None
    first = broken[failing[0]]
    if not _mentions(first.get("source", ""), mutation.function):
        discovery.reject("the failing test does not call the function")
        return None
    for _ in range(2):
        try:
            again = run_unittest(work, failing, repo.env, timeout)
        except TestRunError:
            again = {}
        if any(again.get(t, {}).get("outcome") not in ("fail", "error") for t in failing) or again[
            failing[0]
        ].get("message") != first.get("message"):
            discovery.reject("the failure is not deterministic")
            return None
    return SweTask(
        id=f"{repo.name}/{mutation.function}-{mutation.kind}-{index}",
        repo=repo.name,
        file=mutation.file,
        function=mutation.function,
        kind=mutation.kind,
        bug_patch=make_patch(mutation.file, original, mutation.apply(original)),
        fix_patch=make_patch(mutation.file, mutation.apply(original), original),
        fail_to_pass=failing,
        pass_to_pass=_pass_to_pass(base, broken, failing, rng),
        problem_statement=problem_statement(mutation.function, failing[0], first),
    )
