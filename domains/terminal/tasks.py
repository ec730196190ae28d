"""The bundled terminal tasks (data/tasks.toml) and the pivots generated from them (data/pivots.jsonl).

A task is a small job in /app of the base image: `instruction`, `setup` (bash run once), the
expert's commands and a `check` that exits 0 when the job is done. `run_task` replays the
expert's trajectory in a sandbox and records every command's output; `task_pivots` turns the
trajectory into one pivot per expert command (the prefix holds the earlier commands and their
real outputs). Regenerate the bundled pivots with:

    python -m pivot_envs.domains.terminal.tasks [--sandbox bwrap|docker]
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pivot_envs.errors import PivotEnvsError
from pivot_envs.pivot import Pivot, write_pivots
from pivot_envs.sandboxes import CommandResult

from .parse import BASH_TOOL, canonical_message
from .prefix import BASE_IMAGE

SYSTEM_PROMPT = (
    "You are an expert Linux user working in a bash terminal in {workdir}. Solve the task one command at a "
    "time: answer with exactly one bash command, as a call to the `bash` tool or in one ```bash code block. "
    "The command's output and exit code come back as the tool's reply."
)


class TaskFileError(PivotEnvsError, ValueError):
    """A task definition file that cannot be read as tasks; the message names the file and the task."""


class TaskError(PivotEnvsError, RuntimeError):
    """A task that cannot be replayed: its setup failed, or its expert's commands do not pass its check."""


@dataclass
class Task:
    """One bundled task (see the module docstring). `setup` is one script or a list of commands run in turn."""

    id: str
    instruction: str
    setup: str | list[str]
    expert: list[str]
    check: str
    workdir: str = "/app"
    image: str = BASE_IMAGE
    check_timeout: float = 30.0  # seconds the check may run (a Harbor task: its [verifier] timeout_sec + 5)

    @property
    def context(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "setup": self.setup,
            "workdir": self.workdir,
            "task": self.id,
            "check": self.check,
        }


@dataclass
class TaskRun:
    """What replaying a task produced: each expert command's result, and the check before and after."""

    task: Task
    results: list[CommandResult] = field(default_factory=list)
    check_before: CommandResult | None = None
    check_after: CommandResult | None = None

    @property
    def solved(self) -> bool:
        return self.check_after is not None and self.check_after.ok


def tasks_file() -> Path:
    """The bundled task definition file."""
    return Path(str(resources.files("pivot_envs.domains.terminal") / "data" / "tasks.toml"))


def load_tasks(path: str | Path | None = None) -> list[Task]:
    """Read task definitions (TOML, `[[task]]` tables); a bad task raises TaskFileError naming the file and the task."""
    import tomllib

    path = Path(path or tasks_file())
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    tasks, seen = [], set()
    for index, raw in enumerate(data.get("task", [])):
        missing = [key for key in ("id", "instruction", "expert", "check") if key not in raw]
        if missing:
            raise TaskFileError(f"{path}: task #{index} ({raw.get('id', '?')}) lacks {', '.join(missing)}")
        if raw["id"] in seen:
            raise TaskFileError(f"{path}: task id {raw['id']!r} is defined twice")
        seen.add(raw["id"])
        expert = raw["expert"]
        if (
            not isinstance(expert, list)
            or not expert
            or not all(isinstance(c, str) and c.strip() for c in expert)
        ):
            raise TaskFileError(f"{path}: task {raw['id']!r}: 'expert' must be a non-empty list of commands")
        tasks.append(
            Task(
                raw["id"],
                raw["instruction"],
                raw.get("setup", "").strip(),
                expert,
                raw["check"],
                raw.get("workdir", "/app"),
                raw.get("image", BASE_IMAGE),
            )
        )
    return tasks


def run_task(backend: Any, task: Task) -> TaskRun:
    """Replay `task` in a fresh sandbox of `backend`: setup, check (expected to fail), expert commands, check.

    Raises TaskError when the setup fails; a check that fails after the expert is in the TaskRun (`solved`).
    """
    from pivot_envs.sandboxes.pool import ImageUnavailableError

    from .image import is_base_image

    try:
        sandbox = backend.new_sandbox(task.workdir, None if is_base_image(task.image) else task.image)
    except ImageUnavailableError as error:
        raise TaskError(
            f"task {task.id}: {error} (a Harbor task replays its Dockerfile as set-up there)"
        ) from error
    run = TaskRun(task)
    try:
        for command in [task.setup] if isinstance(task.setup, str) else task.setup:
            if not command:
                continue
            setup = sandbox.run(command, timeout=max(60.0, task.check_timeout))
            if not setup.ok:
                raise TaskError(
                    f"task {task.id}: setup failed (exit {setup.exit_code}): {command[:200]!r}: "
                    f"{setup.output[-500:]}"
                )
        run.check_before = run_check(sandbox, task)
        for command in task.expert:
            run.results.append(sandbox.run(command))
        run.check_after = run_check(sandbox, task)
    finally:
        sandbox.close()
    return run


# The check's shell: a HOME of its own, so configuration written to /root (~/.gitconfig, ~/.config) does not
# steer the check's tools; then the check, from the workdir.
CHECK_SHELL = (
    'HOME="$(mktemp -d 2>/dev/null || echo /nonexistent)"; export HOME\ncd {workdir} && {{ {check}\n}}'
)


def run_check(sandbox: Any, task: Task, timeout: float | None = None) -> CommandResult:
    """Run `task`'s check in `sandbox` within `timeout` seconds (default: the task's `check_timeout`).

    It runs in a fresh shell (`clean=True`): the variables, functions and working directory the commands
    before it left (the expert's, or an episode's) neither reach it nor change, its PATH and Python are the
    sandbox's own, and its HOME is an empty directory. Its text comes from the task, not the sandbox.
    """
    timeout = task.check_timeout if timeout is None else timeout
    command = CHECK_SHELL.format(workdir=shlex.quote(task.workdir), check=task.check)
    return sandbox.run(command, timeout=timeout, clean=True)


def task_pivots(run: TaskRun) -> list[Pivot]:
    """One pivot per expert command of a replayed task."""
    task = run.task
    trajectory = f"terminal/{task.id}"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT.format(workdir=task.workdir)},
        {"role": "user", "content": task.instruction},
    ]
    pivots = []
    for turn, (command, result) in enumerate(zip(task.expert, run.results)):
        expert = canonical_message(command)
        expert["tool_calls"][0]["id"] = f"call_{turn}"
        context = {**task.context, "prefix_exit_codes": [r.exit_code for r in run.results[:turn]]}
        pivots.append(
            Pivot(
                id=f"{trajectory}/t{turn}",
                domain="terminal",
                messages=[dict(m) for m in messages],
                expert=expert,
                tools=[BASH_TOOL],
                context=context,
                source={
                    "trajectory": trajectory,
                    "turn": turn,
                    "reward": 1.0 if run.solved else 0.0,
                    "format": "pivot-envs terminal tasks",
                },
            )
        )
        messages.append(expert)
        messages.append(
            {
                "role": "tool",
                "tool_call_id": f"call_{turn}",
                "content": f"{result.output}\n[exit code {result.exit_code}]",
            }
        )
    return pivots


def generate(out: str | Path, sandbox: str = "bwrap", tasks: list[Task] | None = None) -> int:
    """Replay every task and write their pivots to `out`; raises TaskError if a task's expert does not solve it."""
    from pivot_envs.sandboxes.backends import resolve_sandbox
    from pivot_envs.sandboxes.bwrap_backend import BwrapBackend
    from pivot_envs.sandboxes.docker_backend import DockerBackend

    from .image import image_tag, rootfs_path

    kind = resolve_sandbox(sandbox)
    backend = (
        BwrapBackend(rootfs_path()) if kind == "bwrap" else DockerBackend(warm_pool=0, base_image=image_tag())
    )
    pivots: list[Pivot] = []
    try:
        for task in tasks or load_tasks():
            run = run_task(backend, task)
            if not run.solved:
                raise TaskError(
                    f"task {task.id}: the expert's trajectory does not pass the check: "
                    f"{run.check_after.output if run.check_after else ''}"
                )
            pivots.extend(task_pivots(run))
    finally:
        backend.close()
    return write_pivots(pivots, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Regenerate the bundled terminal pivots from data/tasks.toml."
    )
    parser.add_argument("--sandbox", default="bwrap", choices=("auto", "docker", "bwrap"))
    parser.add_argument("--out", default=str(tasks_file().with_name("pivots.jsonl")))
    args = parser.parse_args(argv)
    count = generate(args.out, args.sandbox)
    print(f"wrote {count} pivots to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
