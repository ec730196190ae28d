"""The scripted expert: works a task the way a coding agent does, for real, in a sandbox.

Its plan (`expert_plan`): locate the function (`grep -rn "def f("`), reproduce the failure (run the
FAIL_TO_PASS tests), view the function (`str_replace_editor view` with a view range), fix it
(`str_replace` of the buggy lines by the base's lines), run the FAIL_TO_PASS and PASS_TO_PASS
tests, review `git diff`, and `submit`. Every other task first looks at the repository (`ls`), so
trajectories are not all one shape. `run_expert` executes the plan through the domain's tool
executor (`tools.execute_call`) in a sandbox holding the task's start state, recording each
call's tool message and the workspace's tree hash before it; it checks that the reproduction
fails and the final test run passes. `expert_pivots` turns the run into one pivot per assistant
turn through the project's extraction (`extract_pivots`), with the context the env restores from.
"""

from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pivot_envs.chat import assistant_message, tool_call
from pivot_envs.errors import PivotEnvsError
from pivot_envs.extract import ExtractConfig, extract_pivots
from pivot_envs.pivot import Pivot, write_pivots
from pivot_envs.trajectory import Trajectory

from .repo import RepoSpec, repo_context, start_sandbox, start_tree
from .tasks import SweTask, patched_text
from .tools import default_tools, execute_call, tree_hash

HARNESS = "persistent"
FORMAT = "pivot-envs swe tasks"
# A function longer than this is viewed around the bug rather than whole.
VIEW_LINES = 60
TEST_TIMEOUT = 120.0
SYSTEM_PROMPT = (
    "You are a software engineer fixing a bug in the repository at {workdir}. Work one tool call at a time: "
    "`bash` runs a command in the repository (no network), `str_replace_editor` views and edits files (absolute "
    "paths), and `submit` hands in the repository's changes when the fix is done."
)
USER_PROMPT = (
    "<issue>\n{statement}\n</issue>\n\nThe repository is checked out at {workdir}. Find the cause, fix it with a "
    "minimal change to the library's source (not the tests), check that the tests pass, and submit."
)
# What differs between two runs of the same call: unittest's run time ("Ran 3 tests in 0.004s") and
# object addresses in reprs ("<object object at 0x7f...>").
_VOLATILE = re.compile(r"(?<=Ran )(\d+ tests? in )\d+\.\d+s|(?<= at )0x[0-9a-f]+")


def _blank(match: re.Match) -> str:
    return f"{match.group(1)}<time>" if match.group(1) else "0x<address>"


class ExpertError(PivotEnvsError, RuntimeError):
    """The expert's plan does not solve its task, or its outputs differ between two runs."""


@dataclass
class ExpertStep:
    """One call of the plan, and what running it recorded."""

    name: str
    arguments: dict[str, Any]
    text: str = ""
    exit_code: int | None = None
    tree_before: str = ""


@dataclass
class ExpertRun:
    """A task, its repository, and the steps of the expert's run (the final tree hash after the last)."""

    task: SweTask
    repo: RepoSpec
    steps: list[ExpertStep] = field(default_factory=list)
    tree_after: str = ""

    def outputs(self) -> list[str]:
        """The tool messages with unittest's timings and object addresses blanked (what must be equal between runs)."""
        return [_VOLATILE.sub(_blank, step.text) for step in self.steps]


def fix_edit(buggy: str, fixed: str) -> tuple[str, str, int, int]:
    """The str_replace that turns `buggy` into `fixed`: (old_str, new_str, first line, last line of old_str).

    old_str is the changed lines grown by one line of context on each side until it occurs
    exactly once in `buggy`, as an agent would pick it.
    """
    before, after = buggy.splitlines(keepends=True), fixed.splitlines(keepends=True)
    blocks = [
        b
        for b in difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes()
        if b[0] != "equal"
    ]
    if not blocks:
        raise ExpertError("the fix changes nothing")
    i1, i2, j1, j2 = blocks[0][1], blocks[-1][2], blocks[0][3], blocks[-1][4]
    while True:
        old = "".join(before[i1:i2])
        if old.strip() and buggy.count(old) == 1:
            return old, "".join(after[j1:j2]), i1 + 1, i2
        if i1 == 0 and i2 == len(before):
            raise ExpertError("no unique old_str for the fix")
        i1, j1 = (i1 - 1, j1 - 1) if i1 > 0 else (i1, j1)
        i2, j2 = (i2 + 1, j2 + 1) if i2 < len(before) else (i2, j2)


def _function_lines(text: str, function: str, near: int) -> tuple[int, int]:
    """The 1-based line range of the innermost `def function` around line `near` (decorators and the
    whole signature included), bounded to VIEW_LINES around `near`; 10 lines around `near` when there is none."""
    import ast

    spans = [
        (min([node.lineno, *(d.lineno for d in node.decorator_list)]), node.end_lineno)
        for node in ast.walk(ast.parse(text))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name == function
        and node.lineno <= near <= node.end_lineno
    ]
    first, last = max(spans) if spans else (max(1, near - 10), near + 10)
    if last - first + 1 > VIEW_LINES:
        first, last = max(first, near - VIEW_LINES // 2), min(last, near + VIEW_LINES // 2)
    return first, last


def expert_plan(task: SweTask, repo: RepoSpec, index: int = 0) -> list[tuple[str, dict[str, Any]]]:
    """The expert's calls for `task`, as (tool name, arguments); `index` varies the opening."""
    tree = start_tree(repo, task.bug_patch)
    buggy = (tree / task.file).read_text(encoding="utf-8")
    old, new, first, last = fix_edit(buggy, patched_text(tree, task.file, task.fix_patch))
    view = _function_lines(buggy, task.function, first)
    path = f"{repo.workdir.rstrip('/')}/{task.file}"
    package = task.file.split("/", 1)[0] if "/" in task.file else "."
    failing = " ".join(shlex.quote(test) for test in task.fail_to_pass)
    everything = " ".join(shlex.quote(test) for test in [*task.fail_to_pass, *task.pass_to_pass])
    plan: list[tuple[str, dict[str, Any]]] = [("bash", {"command": "ls"})] if index % 2 else []
    plan += [
        (
            "bash",
            {"command": f"grep -rn --include='*.py' {shlex.quote(f'def {task.function}(')} {package} | sort"},
        ),
        ("bash", {"command": f"python3 -m unittest {failing}"}),
        (
            "str_replace_editor",
            {"command": "view", "path": path, "view_range": [min(view[0], first), max(view[1], last)]},
        ),
        ("str_replace_editor", {"command": "str_replace", "path": path, "old_str": old, "new_str": new}),
        ("bash", {"command": f"python3 -m unittest {everything}"}),
        ("bash", {"command": "git diff"}),
        ("submit", {}),
    ]
    return plan


def run_expert(backend: Any, task: SweTask, repo: RepoSpec, index: int = 0) -> ExpertRun:
    """Execute the expert's plan in a new sandbox of `backend` from the task's start state.

    Raises ExpertError when the reproduction does not fail, a call errs, or the final test run
    (FAIL_TO_PASS and PASS_TO_PASS) does not pass.
    """
    run = ExpertRun(task, repo)
    sandbox = start_sandbox(backend, repo, task.bug_patch)
    try:
        for name, arguments in expert_plan(task, repo, index):
            step = ExpertStep(name, arguments, tree_before=tree_hash(sandbox, repo.workdir))
            result = execute_call(
                sandbox,
                name,
                arguments,
                harness=HARNESS,
                workdir=repo.workdir,
                timeout=TEST_TIMEOUT,
                files=False,
            )
            if result.error:
                raise ExpertError(
                    f"task {task.id}: the expert's {name} call {arguments} failed ({result.error}): "
                    f"{result.text[-500:]}"
                )
            step.text, step.exit_code = result.text, result.exit_code
            run.steps.append(step)
        run.tree_after = tree_hash(sandbox, repo.workdir)
    finally:
        sandbox.close()
    tests = [
        s for s in run.steps if s.name == "bash" and s.arguments["command"].startswith("python3 -m unittest")
    ]
    if tests[0].exit_code == 0:
        raise ExpertError(f"task {task.id}: FAIL_TO_PASS tests pass with the bug: {tests[0].text[-500:]}")
    if tests[-1].exit_code != 0:
        raise ExpertError(f"task {task.id}: the tests fail after the expert's fix: {tests[-1].text[-1500:]}")
    return run


def trajectory_of(run: ExpertRun) -> Trajectory:
    """The run as a chat trajectory: system, user (the issue), then assistant call / tool reply pairs."""
    workdir = run.repo.workdir
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT.format(workdir=workdir)},
        {
            "role": "user",
            "content": USER_PROMPT.format(statement=run.task.problem_statement, workdir=workdir),
        },
    ]
    for turn, step in enumerate(run.steps):
        call_id = f"call_{turn}"
        messages.append(assistant_message(None, [tool_call(step.name, step.arguments, call_id)]))
        messages.append({"role": "tool", "tool_call_id": call_id, "name": step.name, "content": step.text})
    context = {**repo_context(run.repo), "task": run.task.to_dict(), "harness": HARNESS, "executable": True}
    return Trajectory(
        id=f"swe/{run.task.id}",
        messages=messages,
        tools=default_tools(),
        reward=1.0,
        context=context,
        format=FORMAT,
    )


def expert_pivots(run: ExpertRun) -> list[Pivot]:
    """One pivot per assistant turn of the run, each with the tree hash of /repo at that turn."""
    pivots = list(extract_pivots([trajectory_of(run)], ExtractConfig(domain="swe")))
    for pivot in pivots:
        pivot.context["tree_hash"] = run.steps[pivot.source["turn"]].tree_before
    return pivots


def same_outputs(first: ExpertRun, second: ExpertRun) -> str:
    """ "" when two runs of a task recorded the same outputs and trees, else where they first differ."""
    for turn, (a, b) in enumerate(zip(first.outputs(), second.outputs())):
        if a != b:
            return f"turn {turn}: {a[:300]!r} != {b[:300]!r}"
    if [s.tree_before for s in first.steps] != [s.tree_before for s in second.steps]:
        return "the tree hashes differ"
    return "" if len(first.steps) == len(second.steps) else "the runs have different lengths"


def write_expert_data(pivots: list[Pivot], path: Path) -> int:
    """Write pivots with the one pivot writer; a path ending in .gz is then gzipped with a fixed
    mtime, so the bytes are the same on every build."""
    import gzip

    if path.suffix != ".gz":
        return write_pivots(pivots, path)
    plain = path.with_suffix("")
    count = write_pivots(pivots, plain)
    with gzip.GzipFile(path, "wb", compresslevel=9, mtime=0) as handle:
        handle.write(plain.read_bytes())
    plain.unlink()
    return count


def normalized_record(pivot: Pivot) -> dict[str, Any]:
    """The pivot's JSON form with unittest's timings and object addresses blanked in its tool messages (for comparing builds)."""
    import json

    data = json.loads(json.dumps(pivot.to_dict()))
    for message in data["messages"]:
        if message.get("role") == "tool" and isinstance(message.get("content"), str):
            message["content"] = _VOLATILE.sub(_blank, message["content"])
    return data
