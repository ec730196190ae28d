"""The bundled tasks: every expert trajectory solves its task (run for real in bubblewrap), and the
bundled pivots are the ones the task file generates."""

from __future__ import annotations

import json

import pytest

from pivot_envs.domains.terminal import bundled_pivots
from pivot_envs.domains.terminal.tasks import load_tasks, run_task, task_pivots
from pivot_envs.sandboxes.bwrap_backend import BwrapBackend


@pytest.fixture(scope="module")
def runs(has_bwrap):
    backend = BwrapBackend(has_bwrap)
    yield {task.id: run_task(backend, task) for task in load_tasks()}
    backend.close()


def test_there_are_at_least_thirty_tasks():
    assert len(load_tasks()) >= 30


def test_every_experts_trajectory_passes_its_check(runs):
    unsolved = {tid: run.check_after.output for tid, run in runs.items() if not run.solved}
    assert unsolved == {}


def test_no_task_is_solved_before_the_expert_acts(runs):
    solved_already = [tid for tid, run in runs.items() if run.check_before.ok]
    assert solved_already == []


def test_the_bundled_pivots_are_generated_from_the_task_file(runs):
    generated = [p for task in load_tasks() for p in task_pivots(runs[task.id])]
    bundled = bundled_pivots()
    assert [p.id for p in bundled] == [p.id for p in generated]
    assert [p.expert for p in bundled] == [p.expert for p in generated]
    assert [p.context for p in bundled] == [p.context for p in generated]
    # Prefix outputs are real replay outputs; some hold timestamps (ls -l), so compare their exit codes.
    assert [shape(p.messages) for p in bundled] == [shape(p.messages) for p in generated]


def shape(messages: list[dict]) -> str:
    return json.dumps([m if m["role"] != "tool" else m["content"].rsplit("\n", 1)[-1] for m in messages])


def test_a_task_file_error_names_the_file_and_the_task(tmp_path):
    bad = tmp_path / "tasks.toml"
    bad.write_text('[[task]]\nid = "x"\ninstruction = "i"\nexpert = []\ncheck = "true"\n')
    with pytest.raises(ValueError, match=r"tasks.toml: task 'x'"):
        load_tasks(bad)
