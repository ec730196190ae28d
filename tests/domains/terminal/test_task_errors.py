"""A task that cannot be replayed, or a task file that cannot be read, is a typed error naming the task."""

from __future__ import annotations

import pytest

from pivot_envs.domains.terminal.tasks import Task, TaskError, TaskFileError, generate, load_tasks, run_task
from pivot_envs.errors import PivotEnvsError
from pivot_envs.sandboxes.bwrap_backend import BwrapBackend


def test_a_failing_setup_is_a_task_error_naming_the_task_and_its_exit_code(has_bwrap):
    backend = BwrapBackend(has_bwrap)
    try:
        with pytest.raises(TaskError, match=r"task broken-setup: setup failed \(exit 3\)") as raised:
            run_task(backend, Task("broken-setup", "do nothing", "exit 3", ["true"], "true"))
    finally:
        backend.close()
    # Typed for the CLI, and still what callers that caught RuntimeError catch.
    assert isinstance(raised.value, PivotEnvsError) and isinstance(raised.value, RuntimeError)


def test_an_expert_that_does_not_pass_the_check_stops_generation_with_a_task_error(has_bwrap, tmp_path):
    unsolvable = Task("never-done", "create /app/done", "", ["true"], "test -e /app/done")
    with pytest.raises(TaskError, match="task never-done: the expert's trajectory does not pass the check"):
        generate(tmp_path / "pivots.jsonl", "bwrap", tasks=[unsolvable])
    assert not (tmp_path / "pivots.jsonl").exists()


def test_a_task_defined_twice_is_a_task_file_error(tmp_path):
    path = tmp_path / "tasks.toml"
    path.write_text('[[task]]\nid = "a"\ninstruction = "i"\nexpert = ["true"]\ncheck = "true"\n' * 2)
    with pytest.raises(TaskFileError, match=r"tasks.toml: task id 'a' is defined twice") as raised:
        load_tasks(path)
    assert isinstance(raised.value, ValueError)
