"""Harbor task directories as terminal tasks and pivots: the bundled tasks' oracles pass their tests and the
untouched environments fail them (bubblewrap and Docker, the Dockerfile as set-up and as a built image), the
bundled trajectories replay into pivots the env scores 1 for the expert's command, and malformed task
directories and trajectories give errors naming the file and field, or bounded failures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gymnasium as gym
import pytest

from pivot_envs.cli import main
from pivot_envs.domains.terminal import harbor
from pivot_envs.domains.terminal.harbor import (
    HarborTaskError,
    HarborTrajectoryError,
    load_task,
    read_trajectory,
)
from pivot_envs.domains.terminal.image import image_tag, is_base_image
from pivot_envs.domains.terminal.prefix import BASE_IMAGE
from pivot_envs.domains.terminal.tasks import TaskError, run_task
from pivot_envs.pivot import read_pivots
from pivot_envs.sandboxes.bwrap_backend import BwrapBackend
from pivot_envs.sandboxes.docker_backend import DockerBackend

TASKS = ["csv-to-json", "fix-json-config", "log-error-summary"]
WORKDIRS = {"csv-to-json": "/app", "fix-json-config": "/srv/service", "log-error-summary": "/app"}


def bundled(name: str) -> Path:
    return harbor.bundled_dir() / name


def copy_task(tmp_path: Path, name: str = "log-error-summary", dockerfile: str | None = None) -> Path:
    """A copy of bundled task `name` under `tmp_path`, its Dockerfile replaced by `dockerfile` if given."""
    target = tmp_path / name
    shutil.copytree(bundled(name), target)
    if dockerfile is not None:
        (target / "environment" / "Dockerfile").write_text(dockerfile)
    return target


@pytest.fixture(scope="module")
def bwrap(has_bwrap):
    backend = BwrapBackend(has_bwrap)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def docker_backend(has_docker):
    backend = DockerBackend(warm_pool=0, base_image=has_docker)
    yield backend
    backend.close()


@pytest.fixture
def any_backend(kind, request):
    return request.getfixturevalue("bwrap" if kind == "bwrap" else "docker_backend")


# -- the task directory ----------------------------------------------------------------------------


def test_the_bundled_tasks_are_the_three_written_here():
    assert [path.name for path in harbor.bundled_tasks()] == TASKS
    for name in TASKS:
        assert harbor.bundled_trajectory(name).is_file()


@pytest.mark.parametrize("name", TASKS)
def test_a_bundled_task_maps_to_a_terminal_task(name):
    task = load_task(bundled(name))
    assert task.name == name and task.workdir == WORKDIRS[name]
    assert task.check_timeout == task.verifier_timeout + 5
    mapped = task.to_task(["true"])
    assert mapped.instruction == task.instruction and mapped.expert == ["true"]
    assert mapped.setup == task.setup and mapped.image == BASE_IMAGE and mapped.workdir == task.workdir
    assert mapped.check_timeout == task.check_timeout and "bash /tests/test.sh" in mapped.check
    built = task.to_task(image="pivot-envs/harbor-x:1")
    assert built.setup == [] and built.image == "pivot-envs/harbor-x:1"
    assert "bash /solution/solve.sh" in built.expert[0]


def test_task_toml_fields_are_read_as_harbor_defines_them():
    task = load_task(bundled("csv-to-json"))
    assert (task.verifier_timeout, task.agent_timeout) == (30.0, 600.0)
    assert task.verifier_env == {"EXPECTED_ROWS": "4"}
    assert task.metadata["difficulty"] == "medium"
    assert "export EXPECTED_ROWS=4" in task.check


def test_the_canary_line_is_stripped_from_the_instruction():
    task = load_task(bundled("log-error-summary"))
    assert "canary" not in task.instruction and task.instruction.startswith("The services in `/app/logs`")


def test_the_dockerfile_becomes_one_set_up_command_per_instruction():
    task = load_task(bundled("csv-to-json"))
    assert [command.splitlines()[0].rsplit(" ", 1)[-1] for command in task.setup] == [
        "(WORKDIR)",
        "(COPY)",
        "(ENV)",
        "(RUN)",
    ]
    assert "export LC_ALL=C.UTF-8 DATA_DIR=/app/data" in task.setup[2]
    assert "chmod -R a-w /app/data" in task.setup[3]  # the exec form, quoted


def test_continuation_lines_and_ignored_instructions(tmp_path):
    task_dir = copy_task(
        tmp_path,
        dockerfile=(
            "FROM pivot-envs/terminal-base\n# a comment\nLABEL maintainer=x\nWORKDIR /app\n"
            'RUN echo one \\\n    && echo two > /app/two.txt\nENV A 1 2\nCMD ["bash"]\n'
        ),
    )
    task = load_task(task_dir)
    assert len(task.setup) == 3
    assert "echo one \n    && echo two > /app/two.txt" in task.setup[1]
    assert task.setup[2].endswith("export A='1 2'")


@pytest.mark.parametrize(
    "reference,expected",
    [
        ("pivot-envs/terminal-base", True),
        ("pivot-envs/terminal-base:latest", True),
        (image_tag(), True),
        ("pivot-envs/terminal-base:0123456789ab", False),
        ("ubuntu:22.04", False),
        ("ghcr.io/laude-institute/t-bench/python-3-13:20250620", False),
        ("localhost:5000/pivot-envs/terminal-base", False),
    ],
)
def test_is_base_image(reference, expected):
    assert is_base_image(reference) is expected


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda d: (d / "instruction.md").unlink(), r"instruction\.md: missing"),
        (
            lambda d: (d / "instruction.md").write_text("<!-- canary GUID x -->\n\n"),
            r"instruction\.md: the instruction is empty",
        ),
        (lambda d: (d / "task.toml").write_text("[verifier\ntimeout_sec = 1"), r"task\.toml: not valid TOML"),
        (lambda d: (d / "task.toml").unlink(), r"task\.toml: missing"),
        (
            lambda d: (d / "task.toml").write_text("[verifier]\ntimeout_sec = -3\n"),
            r"task\.toml \[verifier\]: `timeout_sec`",
        ),
        (
            lambda d: (d / "task.toml").write_text("[agent]\ntimeout_sec = 'long'\n"),
            r"task\.toml \[agent\]: `timeout_sec`",
        ),
        (lambda d: (d / "task.toml").write_text("verifier = 3\n"), r"task\.toml: `verifier` must be a table"),
        (
            lambda d: (d / "task.toml").write_text("[task]\nname = 'plain'\n"),
            r"task\.toml \[task\]: `name` must be org/name, as Harbor requires",
        ),
        (lambda d: (d / "task.toml").write_text("[verifier]\nenv = { A = 1 }\n"), r"\[verifier\]: `env`"),
        (
            lambda d: (d / "task.toml").write_text("[environment]\ndocker_image = 'ghcr.io/x/y:1'\n"),
            r"\[environment\]: docker_image 'ghcr.io/x/y:1' is a prebuilt image that cannot be pulled",
        ),
        (lambda d: (d / "tests" / "test.sh").unlink(), r"tests/test\.sh: missing"),
        (lambda d: (d / "environment" / "Dockerfile").unlink(), r"environment/Dockerfile: missing"),
        (
            lambda d: (d / "environment" / "docker-compose.yaml").write_text("services: {}\n"),
            r"multi-container",
        ),
    ],
)
def test_a_malformed_task_directory_names_the_file_and_field(tmp_path, change, message):
    task_dir = copy_task(tmp_path)
    change(task_dir)
    with pytest.raises(HarborTaskError, match=message):
        load_task(task_dir)


@pytest.mark.parametrize(
    "dockerfile,message",
    [
        (
            "FROM ubuntu:22.04\nWORKDIR /app\n",
            r"Dockerfile:1 \(FROM\): base image 'ubuntu:22.04' is not one built here",
        ),
        ("FROM pivot-envs/terminal-base:0123456789ab\nWORKDIR /app\n", r"Dockerfile:1 \(FROM\)"),
        (
            "ARG V=1\nFROM pivot-envs/terminal-base\n",
            r"Dockerfile:1 \(ARG\): the Dockerfile must start with FROM",
        ),
        (
            "FROM pivot-envs/terminal-base\nWORKDIR /app\nFROM pivot-envs/terminal-base\n",
            r"Dockerfile:3 \(FROM\): multi-stage",
        ),
        ("FROM pivot-envs/terminal-base\nRUN true\n", r"Dockerfile: no WORKDIR"),
        (
            "FROM pivot-envs/terminal-base\nWORKDIR /app\nCOPY missing.txt /app/\n",
            r"Dockerfile:3 \(COPY\): 'missing.txt' is not in",
        ),
        (
            "FROM pivot-envs/terminal-base\nWORKDIR /app\nCOPY ../task.toml /app/\n",
            r"Dockerfile:3 \(COPY\): '../task.toml' is outside",
        ),
        (
            "FROM pivot-envs/terminal-base\nWORKDIR /app\nADD https://x.org/f /app/\n",
            r"Dockerfile:3 \(ADD\): .*remote",
        ),
        (
            "FROM pivot-envs/terminal-base\nWORKDIR /app\nUSER nobody\n",
            r"Dockerfile:3 \(USER\): only USER root",
        ),
        (
            'FROM pivot-envs/terminal-base\nWORKDIR /app\nSHELL ["/bin/zsh"]\n',
            r"Dockerfile:3 \(SHELL\): SHELL is not supported",
        ),
        (
            "FROM pivot-envs/terminal-base\nWORKDIR $HOME\n",
            r"Dockerfile:2 \(WORKDIR\): variable substitution",
        ),
    ],
)
def test_a_dockerfile_the_sandboxes_cannot_build_is_refused_naming_the_line(tmp_path, dockerfile, message):
    task_dir = copy_task(tmp_path, dockerfile=dockerfile)
    with pytest.raises(HarborTaskError, match=message):
        load_task(task_dir)


def test_a_task_without_a_solution_needs_a_trajectory(tmp_path):
    task_dir = copy_task(tmp_path)
    shutil.rmtree(task_dir / "solution")
    task = load_task(task_dir)
    assert task.solution is None and task.to_task(["ls"]).expert == ["ls"]
    with pytest.raises(HarborTaskError, match=r"solution/solve\.sh: the task has no solution"):
        task.to_task()


# -- trajectories ----------------------------------------------------------------------------------


def test_an_atif_trajectory_makes_one_step_per_agent_step_with_commands():
    session, steps = read_trajectory(harbor.bundled_trajectory("log-error-summary"))
    assert session == "log-error-summary-example-1"
    # Steps 1-2 are system and user; 3-6 run commands (3 has two calls, joined); 7 only marks the task complete.
    assert [step.step_id for step in steps] == [3, 4, 5, 6]
    assert steps[0].command == "ls logs\nhead -n 3 logs/api.log"
    assert steps[-1].command == "cat report.txt"


def test_command_lists_and_text_files_are_trajectories(tmp_path):
    listed = tmp_path / "commands.json"
    listed.write_text(json.dumps(["ls", "cat a\n"]))
    assert [(s.step_id, s.command) for s in read_trajectory(listed)[1]] == [(1, "ls"), (2, "cat a\n")]
    text = tmp_path / "commands.sh"
    text.write_text("# the expert\nls -la\n\ngrep -c x file\n")
    assert [s.command for s in read_trajectory(text)[1]] == ["ls -la", "grep -c x file"]


def _atif(steps: list[dict]) -> dict:
    return {
        "schema_version": "ATIF-v1.6",
        "session_id": "s",
        "agent": {"name": "a", "version": "1"},
        "steps": steps,
    }


def _agent(step_id: int, name: str = "bash_command", arguments: dict | None = None) -> dict:
    return {
        "step_id": step_id,
        "source": "agent",
        "message": "",
        "tool_calls": [
            {"tool_call_id": "c", "function_name": name, "arguments": arguments or {"keystrokes": "ls\n"}}
        ],
    }


@pytest.mark.parametrize(
    "data,message",
    [
        ("{not json", r"not valid JSON"),
        (_atif([]), r"`steps` must be a non-empty list"),
        ({**_atif([_agent(1)]), "schema_version": "v2"}, r"`schema_version` must be an ATIF-v1.x version"),
        (_atif([_agent(2)]), r"steps\[0\]: `step_id` must be 1"),
        (_atif([{"step_id": 1, "source": "robot", "message": ""}]), r"steps\[0\]: `source`"),
        (
            _atif([_agent(1, arguments={"keystrokes": "C-c"})]),
            r"steps\[0\] tool_calls\[0\]: keystrokes 'C-c' do not end",
        ),
        (
            _atif([_agent(1, name="web_search", arguments={"q": "x"})]),
            r"steps\[0\]: tool 'web_search' is not a bash command",
        ),
        (
            _atif([_agent(1, arguments={"path": "x"})]),
            r"tool_calls\[0\]: bash_command has none of the arguments",
        ),
        (_atif([{"step_id": 1, "source": "user", "message": "hi"}]), r"no agent step runs a command"),
        (
            _atif([{**_agent(1), "tool_calls": [{"tool_call_id": "c", "function_name": "bash"}]}]),
            r"tool_calls\[0\]: `arguments` must be an object \(ATIF requires it\)",
        ),
        ([], r"a command list must be a non-empty list"),
    ],
)
def test_a_malformed_trajectory_names_the_file_and_step(tmp_path, data, message):
    path = tmp_path / "trajectory.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    with pytest.raises(HarborTrajectoryError, match=message):
        read_trajectory(path)
    with pytest.raises(HarborTrajectoryError, match="no such trajectory file"):
        read_trajectory(tmp_path / "missing.json")


# -- replays in the sandboxes ----------------------------------------------------------------------


@pytest.mark.parametrize("name", TASKS)
def test_the_oracle_passes_and_the_untouched_environment_fails(any_backend, name):
    run, _, _ = harbor.replay(any_backend, load_task(bundled(name)))
    assert not run.check_before.ok and "[reward 0]" in run.check_before.output
    assert run.solved, run.check_after.output
    assert "[reward 1]" in run.check_after.output


@pytest.mark.parametrize("name", TASKS)
def test_the_docker_built_environment_behaves_as_the_replayed_dockerfile(docker_backend, name):
    task = load_task(bundled(name))
    tag = harbor.build_environment(task)
    assert tag.startswith(f"pivot-envs/harbor-{name}:") and harbor.build_environment(task) == tag
    run, _, _ = harbor.replay(docker_backend, task, image=tag)
    assert not run.check_before.ok and run.solved, run.check_after.output
    # Docker's WORKDIR is where commands run, and ENV reaches them, in the built image as in the replay.
    sandbox = docker_backend.create(tag, task.workdir)
    try:
        assert sandbox.run("pwd").output.strip() == task.workdir
    finally:
        sandbox.close()


def test_a_built_image_is_refused_on_bubblewrap(bwrap):
    task = load_task(bundled("fix-json-config")).to_task(image="pivot-envs/harbor-fix-json-config:abc")
    with pytest.raises(TaskError, match=r"runs on Docker only: bubblewrap has the base image"):
        run_task(bwrap, task)


def test_a_build_that_fails_is_a_clear_error(tmp_path, has_docker):
    task_dir = copy_task(tmp_path, dockerfile="FROM pivot-envs/terminal-base\nWORKDIR /app\nRUN exit 3\n")
    with pytest.raises(HarborTaskError, match=r"Dockerfile: docker build failed"):
        harbor.build_environment(load_task(task_dir))


def test_a_failing_run_instruction_names_its_line(tmp_path, bwrap):
    task_dir = copy_task(tmp_path, dockerfile="FROM pivot-envs/terminal-base\nWORKDIR /app\nRUN exit 3\n")
    with pytest.raises(TaskError, match=r"setup failed \(exit 3\): .*Dockerfile:3 \(RUN\)"):
        harbor.replay(bwrap, load_task(task_dir))


def test_a_dockerfile_writing_outside_the_kept_folders_is_refused_on_bubblewrap(tmp_path, bwrap):
    task_dir = copy_task(
        tmp_path, dockerfile="FROM pivot-envs/terminal-base\nWORKDIR /app\nCOPY logs /opt/logs\n"
    )
    with pytest.raises(HarborTaskError, match=r"writes /opt/logs, outside the workdir /app.*use Docker"):
        harbor.replay(bwrap, load_task(task_dir))


def test_a_test_script_that_loops_is_bounded_by_the_verifier_timeout(tmp_path, bwrap):
    task_dir = copy_task(tmp_path)
    (task_dir / "task.toml").write_text("[verifier]\ntimeout_sec = 2\n")
    (task_dir / "tests" / "test.sh").write_text("#!/bin/bash\nwhile true; do sleep 0.1; done\n")
    task = load_task(task_dir)
    assert task.check_timeout == 7
    run, _, _ = harbor.replay(bwrap, task, trajectory=None)
    assert not run.check_after.ok and not run.check_after.timed_out
    assert "[tests timed out after 2 s ([verifier] timeout_sec)]" in run.check_after.output
    assert "no reward" in run.check_after.output


def test_a_reward_below_one_fails_and_reward_json_is_read(tmp_path, bwrap):
    task_dir = copy_task(tmp_path)
    (task_dir / "tests" / "test.sh").write_text(
        '#!/bin/bash\nmkdir -p /logs/verifier\necho \'{"reward": 0.5, "n": 2}\' > /logs/verifier/reward.json\n'
    )
    run, _, _ = harbor.replay(bwrap, load_task(task_dir))
    assert not run.check_after.ok and "[reward 0.5]" in run.check_after.output


@pytest.mark.parametrize("name", TASKS)
def test_the_bundled_trajectory_replays_into_pivots_the_env_scores_one(any_backend, kind, name):
    task = load_task(bundled(name))
    run, pivots = harbor.harbor_pivots(any_backend, task, harbor.bundled_trajectory(name))
    assert run.solved and not run.check_before.ok
    _, steps = read_trajectory(harbor.bundled_trajectory(name))
    assert [p.id for p in pivots] == [f"harbor/{name}/{name}-example-1/s{s.step_id}" for s in steps]
    assert all(p.source["format"] == "harbor" and p.source["reward"] == 1.0 for p in pivots)
    assert pivots[0].messages[1]["content"] == task.instruction
    env = gym.make("pivot/terminal-v0", pivots=pivots, sandbox=kind, warm_pool=0).unwrapped
    try:
        for index, pivot in enumerate(pivots):
            env.reset(options={"index": index})
            _, reward, _, _, info = env.step(pivot.expert)
            assert info["valid"] and reward == 1.0, (pivot.id, info)
    finally:
        env.close()


def test_pivots_on_the_docker_built_image_replay_on_docker(docker_backend):
    task = load_task(bundled("fix-json-config"))
    tag = harbor.build_environment(task)
    run, pivots = harbor.harbor_pivots(
        docker_backend, task, harbor.bundled_trajectory("fix-json-config"), tag
    )
    assert run.solved and all(p.context["image"] == tag and p.context["setup"] == [] for p in pivots)
    env = gym.make("pivot/terminal-v0", pivots=pivots, sandbox="docker", warm_pool=0).unwrapped
    try:
        env.reset(options={"index": 2})
        _, reward, _, _, info = env.step(pivots[2].expert)
        assert info["valid"] and reward == 1.0, info
    finally:
        env.close()


def test_copied_context_steps_build_the_state_but_make_no_pivot(tmp_path, bwrap):
    data = json.loads(harbor.bundled_trajectory("log-error-summary").read_text())
    data["steps"][2]["is_copied_context"] = True
    path = tmp_path / "trajectory.json"
    path.write_text(json.dumps(data))
    _, pivots = harbor.harbor_pivots(bwrap, load_task(bundled("log-error-summary")), path)
    assert [p.source["atif_step"] for p in pivots] == [4, 5, 6]
    assert pivots[0].messages[2]["tool_calls"][0]["function"]["arguments"]  # step 3 is in the prefix


def test_the_cli_writes_pivots_and_exits_zero_when_the_tests_pass(tmp_path, bwrap, capsys):
    out = tmp_path / "pivots.jsonl"
    name = "csv-to-json"
    code = main(
        [
            "sandbox",
            "harbor",
            str(bundled(name)),
            "--trajectory",
            str(harbor.bundled_trajectory(name)),
            "--out",
            str(out),
            "--sandbox",
            "bwrap",
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "tests before: exit 1" in printed and "[reward 1]" in printed
    assert len(read_pivots(out)) == 3


def test_the_cli_exits_one_when_the_tests_fail(tmp_path, bwrap, capsys):
    commands = tmp_path / "commands.txt"
    commands.write_text("ls\n")
    assert (
        main(
            [
                "sandbox",
                "harbor",
                str(bundled("csv-to-json")),
                "--trajectory",
                str(commands),
                "--sandbox",
                "bwrap",
            ]
        )
        == 1
    )
    assert "[reward 0]" in capsys.readouterr().out


def test_the_cli_builds_the_image_on_docker(has_docker, capsys):
    assert (
        main(
            ["sandbox", "harbor", str(bundled("log-error-summary")), "--sandbox", "docker", "--docker-build"]
        )
        == 0
    )
    assert "image pivot-envs/harbor-log-error-summary:" in capsys.readouterr().out


def test_a_harbor_task_is_an_episode_of_the_end_to_end_env(has_bwrap):
    from pivot_envs.domains.terminal.episode import TerminalEpisodeEnv

    task = load_task(bundled("fix-json-config"))
    env = TerminalEpisodeEnv([task.to_task()], sandbox="bwrap", limits={"timeout": 30.0})
    try:
        observation, info = env.reset(options={"task": "fix-json-config"})
        assert observation["messages"][1]["content"] == task.instruction
        env.step({"role": "assistant", "content": f"```bash\n{task.oracle_command()}\n```"})
        _, reward, terminated, _, info = env.step("The config parses now.")
        assert terminated and reward == 1.0, info
    finally:
        env.close()


def test_copy_follows_docker_into_an_existing_directory_or_to_a_new_name(tmp_path, any_backend):
    task_dir = copy_task(
        tmp_path,
        dockerfile=(
            "FROM pivot-envs/terminal-base\nWORKDIR /app\nRUN mkdir -p conf\n"
            "COPY logs/api.log /app/conf\nCOPY logs/worker.log renamed.log\nCOPY logs/*.log all/\n"
        ),
    )
    commands = tmp_path / "commands.txt"
    commands.write_text("ls conf all && wc -l < renamed.log\n")
    task = load_task(task_dir)
    images = [None] + ([harbor.build_environment(task)] if any_backend.name == "docker" else [])
    outputs = [harbor.replay(any_backend, task, commands, image)[0].results[0].output for image in images]
    assert outputs[0] == "all:\napi.log\nworker.log\n\nconf:\napi.log\n6\n"
    assert set(outputs) == {outputs[0]}  # the Docker-built image agrees with the replayed Dockerfile


def test_a_task_on_the_prebuilt_base_image_needs_no_dockerfile(tmp_path, bwrap):
    task_dir = copy_task(tmp_path, "csv-to-json")
    shutil.rmtree(task_dir / "environment")
    (task_dir / "task.toml").write_text(
        "[verifier]\nenv = { EXPECTED_ROWS = '4' }\n[environment]\ndocker_image = 'pivot-envs/terminal-base'\n"
    )
    (task_dir / "solution" / "solve.sh").write_text("echo '[]' > /app/people.json\n")
    task = load_task(task_dir)
    assert task.workdir == "/app" and task.verifier_timeout == 600
    run, _, _ = harbor.replay(bwrap, task)
    assert not run.solved and "people.json is []\n[reward 0]" in run.check_after.output


def test_pivots_whose_set_up_writes_outside_the_workdir_replay_on_docker_only(
    tmp_path, docker_backend, has_bwrap
):
    task_dir = copy_task(
        tmp_path, dockerfile="FROM pivot-envs/terminal-base\nWORKDIR /app\nCOPY logs /opt/logs\n"
    )
    commands = tmp_path / "commands.json"
    commands.write_text(json.dumps(["ls /opt/logs", "wc -l /opt/logs/api.log"]))
    _, pivots = harbor.harbor_pivots(docker_backend, load_task(task_dir), commands)
    assert all("writes /opt/logs" in p.context["docker_only"] for p in pivots)
    for kind in ("docker", "bwrap"):
        env = gym.make("pivot/terminal-v0", pivots=pivots, sandbox=kind, warm_pool=0).unwrapped
        try:
            env.reset(options={"index": 1})
            _, reward, _, _, info = env.step(pivots[1].expert)
        finally:
            env.close()
        if kind == "docker":
            assert info["valid"] and reward == 1.0, info
        else:
            assert not info["valid"] and "replays on Docker only" in info["detail"], info


def test_a_process_left_running_cannot_rewrite_the_tests_while_the_check_runs_them(has_bwrap):
    from pivot_envs.domains.terminal.episode import TerminalEpisodeEnv

    # Before processes were stopped ahead of the check, this watcher won the race about half the time.
    watcher = (
        "(while :; do [ -f /tests/test.sh ] && printf 'mkdir -p /logs/verifier; echo 1 > "
        "/logs/verifier/reward.txt\\n' > /tests/test.sh; done) >/dev/null 2>&1 &"
    )
    task = load_task(bundled("fix-json-config"))
    env = TerminalEpisodeEnv([task.to_task()], sandbox="bwrap", max_turns=1, limits={"timeout": 30.0})
    try:
        for _ in range(4):
            env.reset(options={"task": "fix-json-config"})
            _, reward, _, _, info = env.step(f"```bash\n{watcher}\n```")
            assert (reward, info["valid"]) == (0.0, True), info
            assert "[reward 0]" in info["check"]["output"]
    finally:
        env.close()


def test_the_dockerfiles_env_reaches_the_tests_as_in_harbors_image(tmp_path, bwrap):
    # The check runs in a fresh shell: the Dockerfile's ENV must come from the task, as the image's does.
    task_dir = copy_task(tmp_path, "log-error-summary")
    script = task_dir / "tests" / "test.sh"
    script.write_text(
        script.read_text().replace(
            "mkdir -p /logs/verifier\n",
            'mkdir -p /logs/verifier\n[ "$REPORT_PATH" = /app/report.txt ] || exit 1\n',
        )
    )
    run = run_task(bwrap, load_task(task_dir).to_task())
    assert run.solved, run.check_after.output
