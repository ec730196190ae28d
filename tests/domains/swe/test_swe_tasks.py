"""SWE tasks: the JSONL task format, bug injection on the AST, FAIL_TO_PASS / PASS_TO_PASS discovery
by running the repository's tests, and the bundled more-itertools tasks."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from pivot_envs.domains.swe.repo import bundled_repo, start_tree
from pivot_envs.domains.swe.tasks import (
    KINDS,
    MAX_FAILING,
    PASS_TO_PASS,
    Discovery,
    SweTask,
    TaskFormatError,
    bundled_tasks,
    find_mutations,
    make_patch,
    make_tasks,
    patched_text,
    read_tasks,
    run_unittest,
    write_tasks,
)

TASK = {
    "id": "calc/mean-0",
    "repo": "calc",
    "file": "calc/ops.py",
    "function": "mean",
    "kind": "off_by_one",
    "bug_patch": "--- a/calc/ops.py\n+++ b/calc/ops.py\n",
    "fix_patch": "--- a/calc/ops.py\n+++ b/calc/ops.py\n",
    "fail_to_pass": ["tests.test_ops.MeanTests.test_mean"],
    "pass_to_pass": [],
    "problem_statement": "mean is wrong",
}


def write_lines(path, *records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_tasks_round_trip_through_the_jsonl_file(tmp_path):
    task = SweTask(**TASK)
    assert write_tasks([task], tmp_path / "tasks.jsonl") == 1
    assert read_tasks(tmp_path / "tasks.jsonl") == [task]


@pytest.mark.parametrize(
    ("second", "message"),
    [
        ("{not json", r"tasks.jsonl:3: not JSON"),
        (
            {k: v for k, v in TASK.items() if k != "fix_patch"},
            r"tasks.jsonl:3: task 'calc/mean-0' lacks fix_patch",
        ),
        (
            {**TASK, "fail_to_pass": "tests.test_ops"},
            r"tasks.jsonl:3: .*fail_to_pass must be a list of test ids",
        ),
        ({**TASK, "fail_to_pass": []}, r"tasks.jsonl:3: .*fail_to_pass names no test"),
        ({**TASK, "extra": 1}, r"tasks.jsonl:3: .*unknown field\(s\) extra"),
        (
            {**TASK, "id": "calc/mean-1", "problem_statement": ""},
            r"tasks.jsonl:3: .*problem_statement must be",
        ),
    ],
)
def test_a_bad_task_names_the_file_and_the_line(tmp_path, second, message):
    other = {**TASK, "id": "calc/add-0"}
    path = write_lines(tmp_path / "tasks.jsonl", other, "", second)
    with pytest.raises(TaskFormatError, match=message):
        read_tasks(path)


def test_a_repeated_task_id_names_its_second_line(tmp_path):
    with pytest.raises(TaskFormatError, match=r"tasks.jsonl:2: task id 'calc/mean-0' is defined twice"):
        read_tasks(write_lines(tmp_path / "tasks.jsonl", TASK, TASK))


SOURCE = """def window(items, n=2, strict=False):
    if n < 1:
        raise ValueError("n must be positive")
    out = []
    for i in range(len(items) - n + 1):
        out.append(tuple(items[i:i + n]))
    if strict and not out:
        raise ValueError("too short")
    return divmod(len(out), n)[0] + out[0][0]
"""


def test_each_mutation_kind_is_a_small_edit_of_one_place(tmp_path):
    (tmp_path / "mod.py").write_text(SOURCE)
    found = find_mutations(tmp_path, ["mod.py"])
    edits = {}
    for mutation in found:
        changed = [
            line
            for line in make_patch("mod.py", SOURCE, mutation.apply(SOURCE)).splitlines()
            if line[:1] in "+-" and line[:3] not in ("+++", "---")
        ]
        edits.setdefault(mutation.kind, []).append(changed)
        assert mutation.function == "window"
    assert set(edits) == set(KINDS)
    assert ["-    if n < 1:", "+    if n <= 1:"] in edits["flip_comparison"]
    assert ["-def window(items, n=2, strict=False):", "+def window(items, n=3, strict=False):"] in edits[
        "wrong_default"
    ]
    assert ["-    if n < 1:", '-        raise ValueError("n must be positive")'] in edits["drop_branch"]
    assert [
        "-        out.append(tuple(items[i:i + n]))",
        "+        out.append(tuple(items[i:i - n]))",
    ] in edits["flip_arithmetic"]
    assert ["-    for i in range(len(items) - n + 1):", "+    for i in range(len(items) - n + 2):"] in edits[
        "off_by_one"
    ]
    assert [
        "-    return divmod(len(out), n)[0] + out[0][0]",
        "+    return divmod(n, len(out))[0] + out[0][0]",
    ] in edits["swap_arguments"]
    assert ["-    if strict and not out:", "+    if strict or not out:"] in edits["flip_boolean"]


def test_make_tasks_finds_the_tests_a_bug_breaks_and_describes_the_symptom(calc_repo):
    discovery = Discovery()
    tasks = make_tasks(calc_repo, count=3, seed=1, discovery=discovery)
    # One task per function; clamp's only mutations swap the arguments of max and min, which breaks no test.
    assert sorted(task.function for task in tasks) == ["add", "mean"]
    assert discovery.rejected["no test fails"] >= 1
    for task in tasks:
        assert 1 <= len(task.fail_to_pass) <= MAX_FAILING and set(task.fail_to_pass).isdisjoint(
            task.pass_to_pass
        )
        assert (
            f"`{task.function}`" in task.problem_statement and task.fail_to_pass[0] in task.problem_statement
        )
        buggy = start_tree(calc_repo, task.bug_patch)
        outcomes = run_unittest(buggy, task.fail_to_pass + task.pass_to_pass, calc_repo.env)
        assert {t for t, o in outcomes.items() if o["outcome"] != "pass"} == set(task.fail_to_pass)
        assert (
            patched_text(buggy, task.file, task.fix_patch) == (start_tree(calc_repo) / task.file).read_text()
        )
    # The same seed finds the same tasks.
    assert make_tasks(calc_repo, count=3, seed=1) == tasks


def test_bundled_tasks_spread_over_functions_kinds_and_files():
    tasks = bundled_tasks()
    assert len(tasks) >= 20
    assert len({task.function for task in tasks}) == len(tasks)
    assert len(Counter(task.kind for task in tasks)) >= 5
    assert {task.file for task in tasks} == set(bundled_repo().sources)
    for task in tasks:
        assert 1 <= len(task.fail_to_pass) <= MAX_FAILING and len(task.pass_to_pass) <= PASS_TO_PASS
        # The issue text shows the symptom, never the code the fix restores.
        restored = [
            line[1:].strip() for line in task.fix_patch.splitlines() if line[:1] == "+" and line[:3] != "+++"
        ]
        assert not any(len(line) > 12 and line in task.problem_statement for line in restored), task.id


def test_bundled_bugs_break_their_fail_to_pass_tests_and_the_fix_mends_them():
    repo = bundled_repo()
    tasks = bundled_tasks()
    sample = [tasks[0], tasks[len(tasks) // 2], tasks[-1]]
    base = start_tree(repo)
    for task in sample:
        tree = start_tree(repo, task.bug_patch)
        assert patched_text(tree, task.file, task.fix_patch) == (base / task.file).read_text()
        buggy = run_unittest(tree, task.fail_to_pass + task.pass_to_pass, repo.env)
        assert {t for t, o in buggy.items() if o["outcome"] != "pass"} == set(task.fail_to_pass), task.id
        fixed = run_unittest(base, task.fail_to_pass + task.pass_to_pass, repo.env)
        assert {o["outcome"] for o in fixed.values()} == {"pass"}, task.id
