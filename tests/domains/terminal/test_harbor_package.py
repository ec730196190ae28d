"""The Harbor reader against the real `harbor` package (0.25, in its own Python 3.12 venv, run as a subprocess):
the bundled tasks load through Harbor's own Task loader and the bundled trajectories validate against its ATIF
model, reading what our fast reader reads; malformed tasks and trajectories are rejected by Harbor's models with
the field named in our error; the fields our reader reads are Harbor's, with Harbor's defaults; and a missing,
broken or slow Harbor interpreter is a typed error."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from pivot_envs.domains.terminal import harbor
from pivot_envs.domains.terminal.harbor import (
    HarborPackageError,
    HarborTaskError,
    HarborTrajectoryError,
    load_task,
    read_trajectory,
)

TASKS = ["csv-to-json", "fix-json-config", "log-error-summary"]


@pytest.fixture(scope="module")
def harbor_python() -> Path:
    try:
        return harbor.harbor_python()
    except HarborPackageError as error:
        pytest.skip(f"the harbor package's interpreter is absent (make setup creates it): {error}")


def copy_task(tmp_path: Path, name: str = "csv-to-json") -> Path:
    target = tmp_path / name
    shutil.copytree(harbor.bundled_dir() / name, target)
    return target


# -- the bundled tasks and trajectories through Harbor's own code -----------------------------------------


def test_each_bundled_task_loads_through_harbors_own_loader_as_our_reader_reads_it(harbor_python):
    verdicts = harbor.harbor_check([harbor.bundled_dir() / name for name in TASKS])
    for name, verdict in zip(TASKS, verdicts):
        assert verdict.ok and verdict.kind == "task", verdict.error
        ours = load_task(harbor.bundled_dir() / name, strict=True)
        assert verdict.data["name"] == ours.name == name
        assert verdict.data["instruction"].strip() == ours.instruction
        assert verdict.data["verifier_timeout_sec"] == ours.verifier_timeout
        assert verdict.data["agent_timeout_sec"] == ours.agent_timeout
        assert verdict.data["verifier_env"] == ours.verifier_env
        assert verdict.data["metadata"] == ours.metadata
        assert verdict.data["docker_image"] is None


def test_each_bundled_trajectory_validates_against_harbors_atif_model_with_our_steps(harbor_python):
    paths = [harbor.bundled_trajectory(name) for name in TASKS]
    for path, verdict in zip(paths, harbor.harbor_check(paths)):
        assert verdict.ok and verdict.kind == "trajectory", verdict.error
        session, steps = read_trajectory(path, strict=True)
        assert verdict.data["session_id"] == session
        # Our steps are Harbor's agent steps that call a bash tool, with Harbor's step ids.
        bash = [
            step["step_id"]
            for step in verdict.data["steps"]
            if step["source"] == "agent" and set(step["tools"]) & set(harbor.COMMAND_TOOLS)
        ]
        assert [step.step_id for step in steps] == bash


# -- malformed input rejected by Harbor's models, the field named ------------------------------------------


@pytest.mark.parametrize(
    "toml,field",
    [
        ('[verifier]\ntimeout_sec = "soon"\n', "verifier.timeout_sec"),
        ('[task]\nname = "no-org"\n', "task.name"),
        ('[environment]\nos = "beos"\n', "environment.os"),
        ('[agent]\nnetwork_mode = "sometimes"\n', "agent.network_mode"),
    ],
)
def test_a_malformed_task_is_rejected_by_harbors_model_naming_the_field(tmp_path, harbor_python, toml, field):
    task_dir = copy_task(tmp_path)
    (task_dir / "task.toml").write_text(toml)
    [verdict] = harbor.harbor_check([task_dir])
    assert not verdict.ok and verdict.fields[0] == field
    with pytest.raises(
        HarborTaskError, match=rf"Harbor's own loader rejects it: TaskConfig rejects `{field}`"
    ):
        load_task(task_dir, strict=True)


def test_a_task_without_its_test_script_is_rejected_by_harbors_loader(tmp_path, harbor_python):
    task_dir = copy_task(tmp_path)
    (task_dir / "tests" / "test.sh").unlink()
    with pytest.raises(
        HarborTaskError, match=r"Harbor's own loader rejects it: FileNotFoundError: .*tests/test\.sh"
    ):
        load_task(task_dir, strict=True)


def _bundled_atif() -> dict:
    return json.loads(harbor.bundled_trajectory("csv-to-json").read_text())


def _agent_index(data: dict) -> int:
    return next(index for index, step in enumerate(data["steps"]) if step.get("tool_calls"))


@pytest.mark.parametrize(
    "change,field",
    [
        (
            lambda d, i: d["steps"][i]["tool_calls"][0].pop("tool_call_id"),
            "steps.{i}.tool_calls.0.tool_call_id",
        ),
        (lambda d, i: d["steps"][i].update(colour="blue"), "steps.{i}.colour"),
        (lambda d, i: d.pop("agent"), "agent"),
    ],
)
def test_a_malformed_trajectory_our_reader_accepts_is_rejected_by_harbors_model_naming_the_field(
    tmp_path, harbor_python, change, field
):
    data = _bundled_atif()
    index = _agent_index(data)
    change(data, index)
    path = tmp_path / "trajectory.json"
    path.write_text(json.dumps(data))
    assert read_trajectory(path)[1]  # the fast reader does not read this field
    expected = field.format(i=index)
    with pytest.raises(HarborTrajectoryError, match=rf"Trajectory rejects `{expected}`"):
        read_trajectory(path, strict=True)


@pytest.mark.parametrize(
    "toml,ours,theirs",
    [
        ("[verifier]\ntimeout_sec = 'x'\n", r"\[verifier\]: `timeout_sec`", "verifier.timeout_sec"),
        ("[agent]\ntimeout_sec = 'long'\n", r"\[agent\]: `timeout_sec`", "agent.timeout_sec"),
        ("verifier = 3\n", r"`verifier` must be a table", "verifier"),
        ("[verifier]\nenv = { A = 1 }\n", r"\[verifier\]: `env`", "verifier.env.A"),
        ("[task]\nname = 'plain'\n", r"\[task\]: `name` must be org/name", "task.name"),
        ("[task]\nversion = '1'\n", r"\[task\]: `name` is required", "task.name"),
    ],
)
def test_the_fast_reader_rejects_what_harbor_rejects_in_the_fields_it_reads(
    tmp_path, harbor_python, toml, ours, theirs
):
    task_dir = copy_task(tmp_path)
    (task_dir / "task.toml").write_text(toml)
    with pytest.raises(HarborTaskError, match=ours):
        load_task(task_dir)
    [verdict] = harbor.harbor_check([task_dir])
    assert not verdict.ok and verdict.fields[0] == theirs


# -- the fast reader's fields are Harbor's -------------------------------------------------------------


def test_the_fields_our_reader_reads_are_harbors_with_harbors_defaults(harbor_python):
    found = harbor.harbor_fields()
    for model, fields in harbor.READ_FIELDS.items():
        for name, default in fields.items():
            assert found["models"][model].get(name, "absent") == default, f"{model}.{name}"
    assert tuple(found["literals"]["Step.source"]) == harbor.STEP_SOURCES
    # Our reader accepts any ATIF-v1.x: every version Harbor knows is one, and the bundled ones are known.
    versions = found["literals"]["Trajectory.schema_version"]
    assert all(version.startswith("ATIF-v1.") for version in versions)
    assert {_bundled_atif()["schema_version"]} <= set(versions)


# -- the interpreter ------------------------------------------------------------------------------------


def test_a_missing_interpreter_is_a_typed_error_naming_make_setup(tmp_path, monkeypatch):
    monkeypatch.delenv(harbor.HARBOR_PYTHON_ENV, raising=False)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / ".venv"))
    with pytest.raises(
        HarborPackageError, match=r"no Harbor interpreter: .*`make setup` creates \.venv-harbor"
    ):
        harbor.harbor_python()
    monkeypatch.setenv(harbor.HARBOR_PYTHON_ENV, str(tmp_path / "python"))
    with pytest.raises(HarborPackageError, match=r"PIVOT_ENVS_HARBOR_PYTHON=.*not an executable interpreter"):
        load_task(harbor.bundled_dir() / "csv-to-json", strict=True)


def test_an_interpreter_without_harbor_is_a_typed_error(monkeypatch):
    # This venv's Python (3.11) has no harbor: the script fails to import it.
    monkeypatch.setenv(harbor.HARBOR_PYTHON_ENV, sys.executable)
    with pytest.raises(HarborPackageError, match=r"No module named 'harbor'.*make setup"):
        harbor.harbor_check([harbor.bundled_dir() / "csv-to-json"])


def test_a_harbor_check_past_its_timeout_is_a_typed_error(harbor_python):
    with pytest.raises(HarborPackageError, match=r"no answer within 0\.01 s"):
        harbor.harbor_check([harbor.bundled_dir() / "csv-to-json"], timeout=0.01)


def test_the_check_script_reports_a_missing_path_and_refuses_unknown_options(harbor_python, tmp_path):
    [verdict] = harbor.harbor_check([tmp_path / "nowhere"])
    assert (verdict.ok, verdict.kind) == (False, "missing")
    with pytest.raises(HarborPackageError, match="usage: harbor_check.py"):
        harbor._run_harbor_check(["--bogus"], 60)


def test_pivotrl_sandbox_harbor_validate_stops_on_a_task_harbor_rejects_with_its_field(
    tmp_path, harbor_python, capsys
):
    from pivot_envs.cli import main

    task_dir = copy_task(tmp_path)
    text = (task_dir / "task.toml").read_text()
    (task_dir / "task.toml").write_text(text.replace("[environment]", '[environment]\nos = "plan9"', 1))
    code = main(["sandbox", "harbor", str(task_dir), "--validate"])
    err = capsys.readouterr().err
    assert code != 0 and "Harbor's own loader rejects it" in err and "environment.os" in err
    assert "Traceback" not in err
