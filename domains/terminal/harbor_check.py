"""Validate Harbor task directories and ATIF trajectories with the installed `harbor` package's own code.

Run by Harbor's interpreter (Python >= 3.12, `harbor` installed; see docs/harbor.md), not imported by
pivot-envs: it imports only `harbor` and the standard library.

    python -I harbor_check.py PATH...      one JSON verdict a line per PATH (a directory is a task,
                                           a file a trajectory), exit 0 even when a verdict is "ok": false
    python -I harbor_check.py --fields     the fields and defaults of Harbor's models, as one JSON object

A task directory is loaded with `harbor.models.task.task.Task` (TaskConfig from task.toml, the tests and
instruction checked) and `Task.is_valid_dir`; a trajectory with `harbor.models.trajectories.Trajectory`.
A rejected path's verdict has "error" (one line) and "fields" (pydantic's locations, dotted: "verifier.timeout_sec").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _isolate() -> None:
    """Drop this file's folder from sys.path: its `harbor.py` (pivot-envs' reader) would shadow the package."""
    sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != HERE]


def _location(loc: tuple) -> str:
    return ".".join(str(part) for part in loc) or "(the whole document)"


def _failure(path: Path, kind: str, error: BaseException) -> dict[str, Any]:
    from pydantic import ValidationError

    if isinstance(error, ValidationError):
        problems = error.errors(include_url=False)
        fields = [_location(problem["loc"]) for problem in problems]
        first = problems[0]
        message = f"{error.title} rejects `{fields[0]}`: {first['msg']} (got {first.get('input')!r})" + (
            f" and {len(problems) - 1} more" if len(problems) > 1 else ""
        )
        return {"path": str(path), "kind": kind, "ok": False, "error": message, "fields": fields}
    text = " ".join(str(error).split()) or type(error).__name__
    return {
        "path": str(path),
        "kind": kind,
        "ok": False,
        "error": f"{type(error).__name__}: {text}",
        "fields": [],
    }


def check_task(path: Path) -> dict[str, Any]:
    """Load a task directory with Harbor's Task; the verdict carries what Harbor read from it."""
    from harbor.models.task.task import Task

    try:
        task = Task(path)
    except Exception as error:  # noqa: BLE001 - any failure of Harbor's loader is the verdict
        return _failure(path, "task", error)
    if not Task.is_valid_dir(path):
        return {
            "path": str(path),
            "kind": "task",
            "ok": False,
            "error": "Task.is_valid_dir: not a valid Harbor task directory (no environment/ and no "
            "[environment] docker_image, or an input path outside the task)",
            "fields": ["environment"],
        }
    config = task.config
    return {
        "path": str(path),
        "kind": "task",
        "ok": True,
        "name": task.name,
        "instruction": task.instruction,
        "verifier_timeout_sec": config.verifier.timeout_sec,
        "verifier_env": dict(config.verifier.env),
        "agent_timeout_sec": config.agent.timeout_sec,
        "docker_image": config.environment.docker_image,
        "metadata": config.metadata,
    }


def check_trajectory(path: Path) -> dict[str, Any]:
    """Validate a trajectory file with Harbor's ATIF Trajectory model."""
    from harbor.models.trajectories import Trajectory

    try:
        trajectory = Trajectory.model_validate_json(path.read_bytes())
    except Exception as error:  # noqa: BLE001 - any failure of Harbor's model is the verdict
        return _failure(path, "trajectory", error)
    return {
        "path": str(path),
        "kind": "trajectory",
        "ok": True,
        "schema_version": trajectory.schema_version,
        "session_id": trajectory.session_id,
        "steps": [
            {
                "step_id": step.step_id,
                "source": step.source,
                "tools": [call.function_name for call in step.tool_calls or []],
                "is_copied_context": bool(step.is_copied_context),
            }
            for step in trajectory.steps
        ],
    }


def fields() -> dict[str, Any]:
    """Harbor's model fields (name -> default, or "required") for the tables and objects pivot-envs reads."""
    import typing

    from harbor.models.task.config import (
        AgentConfig,
        EnvironmentConfig,
        PackageInfo,
        TaskConfig,
        VerifierConfig,
    )
    from harbor.models.trajectories import Step, ToolCall, Trajectory
    from pydantic_core import PydanticUndefined

    def describe(model: Any) -> dict[str, Any]:
        found = {}
        for name, info in model.model_fields.items():
            if info.default is PydanticUndefined and info.default_factory is None:
                found[name] = "required"
            elif info.default_factory is not None:
                found[name] = "factory"
            else:
                found[name] = (
                    info.default if isinstance(info.default, (str, int, float, type(None))) else "other"
                )
        return found

    literals = {
        "Trajectory.schema_version": list(
            typing.get_args(Trajectory.model_fields["schema_version"].annotation)
        ),
        "Step.source": list(typing.get_args(Step.model_fields["source"].annotation)),
    }
    models = {
        "TaskConfig": TaskConfig,
        "VerifierConfig": VerifierConfig,
        "AgentConfig": AgentConfig,
        "EnvironmentConfig": EnvironmentConfig,
        "PackageInfo": PackageInfo,
        "Trajectory": Trajectory,
        "Step": Step,
        "ToolCall": ToolCall,
    }
    return {"models": {name: describe(model) for name, model in models.items()}, "literals": literals}


def main(argv: list[str]) -> int:
    _isolate()
    if argv == ["--fields"]:
        print(json.dumps(fields(), default=str))
        return 0
    if not argv or any(arg.startswith("--") for arg in argv):
        print("usage: harbor_check.py PATH... | --fields", file=sys.stderr)
        return 2
    for arg in argv:
        path = Path(arg)
        if path.is_dir():
            verdict = check_task(path)
        elif path.is_file():
            verdict = check_trajectory(path)
        else:
            verdict = {
                "path": arg,
                "kind": "missing",
                "ok": False,
                "error": "no such file or directory",
                "fields": [],
            }
        print(json.dumps(verdict, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
