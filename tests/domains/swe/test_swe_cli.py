"""The scripted expert and `pivotrl swe` (make-tasks, build, build-sample --check), on real
bubblewrap sandboxes: the tests' tiny repository and two of the bundled more-itertools tasks."""

from __future__ import annotations

import dataclasses
import gzip
import json
import subprocess

import gymnasium as gym
import pytest
from swe_helpers import BUGGY, OPS, bug_patch

import pivot_envs
from pivot_envs.cli import main
from pivot_envs.domains.swe.cli import SampleMismatchError, check_sample
from pivot_envs.domains.swe.expert import (
    ExpertError,
    expert_pivots,
    run_expert,
    same_outputs,
    write_expert_data,
)
from pivot_envs.domains.swe.repo import bundled_repo, start_tree
from pivot_envs.domains.swe.tasks import SweTask, bundled_tasks, make_patch, read_tasks, tasks_file
from pivot_envs.domains.terminal.image import rootfs_path
from pivot_envs.pivot import read_pivots
from pivot_envs.sandboxes.bwrap_backend import BwrapBackend

gym.register_envs(pivot_envs)

MEAN_TASK = SweTask(
    id="calc/mean-0",
    repo="calc",
    file="calc/ops.py",
    function="mean",
    kind="off_by_one",
    bug_patch=bug_patch(),
    fix_patch=make_patch("calc/ops.py", BUGGY, OPS),
    fail_to_pass=["tests.test_ops.MeanTests.test_mean"],
    pass_to_pass=["tests.test_ops.AddTests.test_add"],
    problem_statement="`mean` gives a wrong result: mean([1, 2, 3]) is 1.5, not 2.",
)


@pytest.fixture
def bwrap(has_bwrap):
    backend = BwrapBackend(rootfs_path(), warm_pool=0)
    yield backend
    backend.close()


@pytest.fixture
def calc_spec(calc_repo, tmp_path):
    spec = tmp_path / "calc.toml"
    spec.write_text(f'name = "calc"\narchive = "{calc_repo.archive}"\nsources = ["calc/ops.py"]\n')
    return spec


def test_the_expert_works_like_an_agent_and_its_run_replays_to_the_same_outputs(bwrap, calc_repo):
    first = run_expert(bwrap, MEAN_TASK, calc_repo, index=1)
    assert [step.name for step in first.steps] == ["bash"] * 3 + ["str_replace_editor"] * 2 + ["bash"] * 2 + [
        "submit"
    ]
    reproduce, final = first.steps[2], first.steps[5]
    assert reproduce.exit_code != 0 and "AssertionError: 1.5 != 2" in reproduce.text
    assert final.exit_code == 0 and "Ran 2 tests" in final.text
    assert "+    return sum(values) / len(values)" in first.steps[-1].text  # submit shows the fix
    # The tree changes at the edit, and only there.
    hashes = [step.tree_before for step in first.steps]
    assert (
        len(set(hashes[:5])) == 1
        and len(set(hashes[5:] + [first.tree_after])) == 1
        and hashes[4] != hashes[5]
    )
    assert same_outputs(first, run_expert(bwrap, MEAN_TASK, calc_repo, index=1)) == ""

    pivots = expert_pivots(first)
    assert [pivot.id for pivot in pivots] == [f"swe/calc/mean-0/t{turn}" for turn in range(8)]
    last = pivots[-1]
    assert last.domain == "swe" and last.context["tree_hash"] == hashes[-1] and last.context["executable"]
    assert last.context["task"] == MEAN_TASK.to_dict() and last.context["repo_spec"]["name"] == "calc"
    assert last.expert["tool_calls"][0]["function"]["name"] == "submit"
    assert len(last.messages) == 2 + 2 * 7 and last.messages[-1]["content"] == first.steps[6].text


def test_a_task_whose_tests_do_not_fail_with_the_bug_is_refused(bwrap, calc_repo):
    task = dataclasses.replace(MEAN_TASK, fail_to_pass=["tests.test_ops.AddTests.test_add"])
    with pytest.raises(ExpertError, match="calc/mean-0: FAIL_TO_PASS tests pass with the bug"):
        run_expert(bwrap, task, calc_repo)


def test_make_tasks_and_build_work_on_a_users_repository(has_bwrap, calc_spec, tmp_path, capsys):
    tasks = tmp_path / "tasks.jsonl"
    assert main(["swe", "make-tasks", "--repo", str(calc_spec), "--count", "1", "--out", str(tasks)]) == 0
    assert "wrote 1 tasks" in capsys.readouterr().out
    made = read_tasks(tasks)
    assert len(made) == 1 and made[0].repo == "calc"
    out = tmp_path / "pivots.jsonl"
    assert (
        main(
            [
                "swe",
                "build",
                "--repo",
                str(calc_spec),
                "--tasks",
                str(tasks),
                "--out",
                str(out),
                "--sandbox",
                "bwrap",
            ]
        )
        == 0
    )
    pivots = read_pivots(out)
    assert len(pivots) == 7 and {pivot.context["repo"] for pivot in pivots} == {"calc"}
    assert pivots[0].messages[1]["content"].startswith("<issue>\n" + made[0].problem_statement)
    # The env restores the user's repository from the spec the pivots carry: the expert's edit scores 1.
    env = gym.make("pivot/swe-v0", pivots=str(out), sandbox="bwrap")
    try:
        env.reset(options={"index": 3})
        _, reward, _, _, info = env.step(env.unwrapped.pivot.expert)
        assert reward == 1.0 and info["valid"], info
    finally:
        env.close()


def test_build_with_a_repository_but_no_tasks_is_refused_in_one_line(calc_spec, capsys):
    assert main(["swe", "build", "--repo", str(calc_spec)]) != 0
    assert capsys.readouterr().err == (
        "pivotrl swe: error: --repo needs --tasks: the bundled tasks are for the bundled repository\n"
    )


def test_build_sample_check_passes_on_shipped_tasks(has_bwrap, capsys):
    tasks = bundled_tasks()
    chosen = f"{tasks[1].id},{tasks[-2].id}"
    assert main(["swe", "build-sample", "--check", "--only", chosen, "--sandbox", "bwrap"]) == 0
    assert "pivots match" in capsys.readouterr().out


def test_check_refuses_a_stale_sample(bwrap, calc_repo, tmp_path):
    pivots = expert_pivots(run_expert(bwrap, MEAN_TASK, calc_repo))
    shipped = tmp_path / "pivots.jsonl.gz"
    write_expert_data(pivots, shipped)
    check_sample(pivots, shipped, every_task=True)
    with gzip.open(shipped, "rt") as handle:
        records = [json.loads(line) for line in handle]
    records[3]["messages"][-1]["content"] = "an output nobody recorded"
    shipped.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode()))
    with pytest.raises(SampleMismatchError, match="pivot swe/calc/mean-0/t3 differs from a fresh build"):
        check_sample(pivots, shipped, every_task=True)
    write_expert_data(pivots[:-1], shipped)
    with pytest.raises(SampleMismatchError, match="pivot swe/calc/mean-0/t6 is not shipped"):
        check_sample(pivots, shipped, every_task=True)


def test_shipped_sample_has_a_pivot_for_every_expert_turn_of_every_task():
    tasks = bundled_tasks()
    pivots = read_pivots(tasks_file().with_name("pivots.jsonl.gz"))
    assert len(pivots) >= 120
    assert {pivot.trajectory_id for pivot in pivots} == {f"swe/{task.id}" for task in tasks}
    kinds = {pivot.expert["tool_calls"][0]["function"]["name"] for pivot in pivots}
    assert kinds == {"bash", "str_replace_editor", "submit"}
    assert all(pivot.context["tree_hash"] and pivot.context["harness"] == "persistent" for pivot in pivots)
    # The tree hash at the first turn is the start state's, as git computes it on the host.
    first = next(p for p in pivots if p.source["turn"] == 0 and p.trajectory_id == f"swe/{tasks[0].id}")
    tree = start_tree(bundled_repo(), tasks[0].bug_patch)
    assert (
        first.context["tree_hash"]
        == subprocess.run(
            ["git", "write-tree"], cwd=tree, capture_output=True, text=True, check=True
        ).stdout.strip()
    )
