"""Harbor (Terminal-Bench 2) task directories, and agent trajectories on them, as terminal tasks and pivots.

A Harbor task directory holds `task.toml` (`[verifier] timeout_sec`, `[agent] timeout_sec`,
`[environment]`), `instruction.md`, `environment/Dockerfile`, `tests/test.sh` (which writes the reward
to `/logs/verifier/reward.txt` or `reward.json`) and optionally `solution/solve.sh` (the oracle).
`load_task` validates one (errors name the file and the field) and `HarborTask.to_task` maps it to the
terminal domain's `Task`:

- set-up: the Dockerfile replayed on the terminal base image, one command per instruction (WORKDIR,
  ENV, RUN, COPY/ADD of local files), so the task runs on both sandbox backends; or, on Docker, the
  image `build_environment` builds from the Dockerfile itself (`image=`). Either way the Dockerfile's
  `FROM` must be the locally built base image (`pivot-envs/terminal-base`): nothing is pulled here.
- check: the task's tests copied to `/tests`, `bash /tests/test.sh` run within `[verifier] timeout_sec`,
  and the reward read back: the check passes iff the reward is at least 1.
- expert: an agent trajectory's commands (`read_trajectory`: Harbor's ATIF `trajectory.json`, a JSON
  list of commands, or a text file with one command a line), else the oracle (`solution/` copied to
  `/solution` and `bash /solution/solve.sh`, as Harbor's OracleAgent runs it).

`harbor_pivots` replays the trajectory in a sandbox and makes one pivot per agent step that runs a
command (ATIF counts steps, not tool calls: a step's bash tool calls are one command, joined in order).
See docs/harbor.md.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import re
import shlex
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

from pivot_envs.errors import PivotEnvsError
from pivot_envs.pivot import Pivot

from .prefix import BASE_IMAGE
from .tasks import Task, TaskFileError, TaskRun, run_task, task_pivots

FORMAT = "harbor"
CHECK_MARGIN = (
    5.0  # seconds the check may take beyond [verifier] timeout_sec (copying the tests in, the reward)
)
MAX_ARCHIVE = 4 * 1024 * 1024  # bytes of tests, solution or copied files a task may carry into its commands
# Bash tools whose arguments hold one command: Terminus-2's `bash_command` ({"keystrokes": "ls\n"}),
# mini-swe-agent's in Harbor's converter (`bash_command`, {"command": ...}), and the usual `bash`.
COMMAND_TOOLS = ("bash_command", "bash", "execute_bash", "shell")
COMMAND_ARGUMENTS = ("command", "cmd", "keystrokes")
# Tools that end a run without acting on the environment.
DONE_TOOLS = ("mark_task_complete", "task_complete", "submit", "finish")
# Harbor's canary lines (`strip_canary` in harbor/models/task/task.py): leading HTML or hash comments naming a canary.
_CANARY = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.IGNORECASE)
IGNORED_INSTRUCTIONS = (
    "LABEL",
    "EXPOSE",
    "CMD",
    "ENTRYPOINT",
    "HEALTHCHECK",
    "STOPSIGNAL",
    "VOLUME",
    "MAINTAINER",
)


class HarborTaskError(TaskFileError):
    """A Harbor task directory that cannot be used here; the message names the file and the field."""


class HarborTrajectoryError(PivotEnvsError, ValueError):
    """An agent trajectory that cannot be read as commands; the message names the file and the step."""


class HarborPackageError(PivotEnvsError, RuntimeError):
    """The `harbor` package's interpreter is missing, fails or times out (strict validation needs it)."""


# -- strict validation: the installed `harbor` package's own loader and models -----------------------

HARBOR_PYTHON_ENV = "PIVOT_ENVS_HARBOR_PYTHON"
HARBOR_CHECK_TIMEOUT = 120.0  # seconds for one harbor_check.py run (importing harbor takes about 1 s)
# Harbor's [task] name: its PackageInfo's org/name pattern (harbor/constants.py ORG_NAME_PATTERN).
TASK_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*/[a-zA-Z0-9][a-zA-Z0-9._-]*$")
# The fields of Harbor's models this module's own (fast) reader reads, with Harbor's defaults as read
# here ("required": no default; "factory": an empty table or list). test_harbor_package.py checks them
# against the installed harbor (`harbor_fields`), so the fast reader cannot drift from Harbor unseen.
READ_FIELDS: dict[str, dict[str, Any]] = {
    "TaskConfig": {"task": None, "metadata": "factory", "verifier": "factory", "agent": "factory"},
    "VerifierConfig": {"timeout_sec": 600.0, "env": "factory"},
    "AgentConfig": {"timeout_sec": None},
    "EnvironmentConfig": {"docker_image": None},
    "PackageInfo": {"name": "required"},
    "Trajectory": {"session_id": None, "steps": "required"},
    "Step": {"step_id": "required", "source": "required", "tool_calls": None, "is_copied_context": None},
    "ToolCall": {"function_name": "required", "arguments": "required"},
}
STEP_SOURCES = ("system", "user", "agent")


@dataclass
class HarborVerdict:
    """Harbor's verdict on one path: `ok`, else `error` (one line) and `fields` (dotted pydantic locations);
    `data` holds what Harbor read (a task's name, instruction, timeouts...; a trajectory's steps)."""

    path: str
    kind: str  # "task", "trajectory" or "missing"
    ok: bool
    error: str = ""
    fields: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)


def harbor_python() -> Path:
    """The interpreter with `harbor` installed: $PIVOT_ENVS_HARBOR_PYTHON, else .venv-harbor/bin/python
    beside this venv; HarborPackageError naming `make setup` when there is none."""
    import os
    import sys

    configured = os.environ.get(HARBOR_PYTHON_ENV)
    if configured:
        path = Path(configured)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise HarborPackageError(f"${HARBOR_PYTHON_ENV}={configured}: not an executable interpreter")
        return path
    path = Path(sys.prefix).parent / ".venv-harbor" / "bin" / "python"
    if not path.is_file():
        raise HarborPackageError(
            f"no Harbor interpreter: {path} does not exist and ${HARBOR_PYTHON_ENV} is not set; "
            "`make setup` creates .venv-harbor (Python 3.12 with harbor==0.25.0)"
        )
    return path


def _run_harbor_check(arguments: list[str], timeout: float) -> list[dict]:
    import subprocess

    python = harbor_python()
    script = Path(__file__).with_name("harbor_check.py")
    # -I: this folder (whose harbor.py would shadow the package), PYTHONPATH and user site stay out.
    command = [str(python), "-I", str(script), *arguments]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as error:
        raise HarborPackageError(f"{python} harbor_check.py: no answer within {timeout:g} s") from error
    except OSError as error:
        raise HarborPackageError(f"{python}: cannot run: {error}") from error
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise HarborPackageError(
            f"{python} harbor_check.py failed: {last} (is harbor==0.25.0 installed there? `make setup`)"
        )
    try:
        return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    except json.JSONDecodeError as error:
        raise HarborPackageError(f"{python} harbor_check.py: unreadable output: {error}") from error


def harbor_check(paths: list[str | Path], timeout: float = HARBOR_CHECK_TIMEOUT) -> list[HarborVerdict]:
    """Harbor's own verdict on each path, in one run of Harbor's interpreter: a directory is loaded as a
    task (harbor.models.task.task.Task), a file validated as an ATIF trajectory (harbor's Trajectory)."""
    if not paths:
        return []
    verdicts = _run_harbor_check([str(Path(path).resolve()) for path in paths], timeout)
    if len(verdicts) != len(paths):
        raise HarborPackageError(f"harbor_check.py answered {len(verdicts)} verdicts for {len(paths)} paths")
    known = {"path", "kind", "ok", "error", "fields"}
    return [
        HarborVerdict(
            path=str(path),
            kind=verdict.get("kind", ""),
            ok=bool(verdict.get("ok")),
            error=verdict.get("error", ""),
            fields=list(verdict.get("fields", [])),
            data={key: value for key, value in verdict.items() if key not in known},
        )
        for path, verdict in zip(paths, verdicts)
    ]


def harbor_fields(timeout: float = HARBOR_CHECK_TIMEOUT) -> dict[str, Any]:
    """The installed harbor's model fields and defaults (`models`) and ATIF's literals (`literals`)."""
    answer = _run_harbor_check(["--fields"], timeout)
    if len(answer) != 1 or not isinstance(answer[0], dict) or "models" not in answer[0]:
        raise HarborPackageError("harbor_check.py --fields: unexpected answer")
    return answer[0]


def validate_with_harbor(task_dir: str | Path | None = None, trajectory: str | Path | None = None) -> None:
    """Strict validation: Harbor's own loader on `task_dir` and its ATIF model on `trajectory` (an ATIF
    `.json`; command lists and text files are this project's formats, not Harbor's, and are skipped).
    HarborTaskError / HarborTrajectoryError carry Harbor's message, naming the field."""
    paths = [Path(task_dir)] if task_dir is not None else []
    if trajectory is not None and _is_atif(Path(trajectory)):
        paths.append(Path(trajectory))
    for verdict in harbor_check(paths):
        if not verdict.ok:
            error = HarborTaskError if verdict.kind == "task" else HarborTrajectoryError
            raise error(f"{verdict.path}: Harbor's own loader rejects it: {verdict.error}")


def _is_atif(path: Path) -> bool:
    if path.suffix != ".json" or not path.is_file():
        return False
    try:
        return isinstance(json.loads(path.read_text(encoding="utf-8")), dict)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return True  # not JSON at all: let Harbor's model say why


@dataclass
class TrajectoryStep:
    """One agent step that runs a command: its ATIF `step_id` (1-based) and the command (its bash calls joined)."""

    step_id: int
    command: str
    copied_context: bool = False  # ATIF `is_copied_context`: replayed for the state, no pivot made of it


@dataclass
class HarborTask:
    """A validated Harbor task directory (see the module docstring)."""

    path: Path
    name: str
    instruction: str
    workdir: str
    setup: list[str]
    verifier_timeout: float
    agent_timeout: float | None
    base_image: str
    verifier_env: dict[str, str] = field(default_factory=dict)
    # The Dockerfile's ENV: the image's environment, which Harbor's verifier runs in (the check runs in
    # a fresh shell, so it is exported there, before the verifier's own env).
    image_env: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    written: list[str] = field(default_factory=list)  # directories the Dockerfile writes (COPY, WORKDIR)
    tests: bytes = b""
    solution: bytes | None = None

    @property
    def check_timeout(self) -> float:
        return self.verifier_timeout + CHECK_MARGIN

    @property
    def check(self) -> str:
        """The check: the tests into /tests, test.sh within the verifier's timeout, exit 0 iff the reward >= 1."""
        exports = "".join(
            f"export {key}={shlex.quote(value)}\n"
            for key, value in {**self.image_env, **self.verifier_env}.items()
        )
        return (
            "rm -rf /tests /logs/verifier && mkdir -p /tests /logs/verifier && "
            f"{_unpack(self.tests, '/tests', 'PIVOT_TESTS')}\n"
            f"{exports}"
            f"timeout -k 2 {self.verifier_timeout:g} bash /tests/test.sh > /logs/verifier/test-stdout.txt 2>&1\n"
            "status=$?\n"
            "tail -c 2000 /logs/verifier/test-stdout.txt\n"
            f"[ $status -eq 124 ] && echo '[tests timed out after {self.verifier_timeout:g} s ([verifier] timeout_sec)]'\n"
            f"python3 -c {shlex.quote(_READ_REWARD)}\n"
            "status=$?\n"
            "rm -rf /tests /logs/verifier\n"
            "(exit $status)"
        )

    def oracle_command(self) -> str:
        """Harbor's oracle as one command: solution/ into /solution, then `bash /solution/solve.sh`."""
        if self.solution is None:
            raise HarborTaskError(
                f"{self.path}/solution/solve.sh: the task has no solution (oracle) to replay"
            )
        return (
            f"rm -rf /solution && mkdir -p /solution && {_unpack(self.solution, '/solution', 'PIVOT_SOLUTION')}\n"
            "DEBIAN_FRONTEND=noninteractive bash /solution/solve.sh"
        )

    def bubblewrap_problem(self) -> str:
        """Why the Dockerfile's set-up cannot be snapshotted on bubblewrap ("" when it can): only the workdir,
        /tmp and /root of a bubblewrap sandbox are kept, so the Dockerfile must write nowhere else."""
        kept = (self.workdir, "/tmp", "/root")
        outside = [path for path in self.written if not any(_within(path, root) for root in kept)]
        if outside:
            return (
                f"{self.path}/environment/Dockerfile writes {', '.join(outside)}, outside the workdir "
                f"{self.workdir}, /tmp and /root, which are all a bubblewrap sandbox keeps: use Docker"
            )
        return ""

    def to_task(self, commands: list[str] | None = None, image: str | None = None) -> Task:
        """The terminal `Task`: the Dockerfile as set-up on the base image, or `image` (built by
        `build_environment`, no set-up); the expert is `commands`, else the oracle."""
        return Task(
            id=self.name,
            instruction=self.instruction,
            setup=[] if image else list(self.setup),
            expert=list(commands) if commands else [self.oracle_command()],
            check=self.check,
            workdir=self.workdir,
            image=image or BASE_IMAGE,
            check_timeout=self.check_timeout,
        )


# The reward as Harbor's verifier reads it (harbor/verifier/verifier.py): reward.json when it exists
# (its numeric "reward", falling back to reward.txt), else reward.txt (one float).
_READ_REWARD = """
import json, pathlib, sys
d = pathlib.Path("/logs/verifier")
def text():
    raw = (d / "reward.txt").read_text().strip()
    if not raw:
        sys.exit("[reward.txt is empty]")
    return float(raw)
try:
    if (d / "reward.json").exists():
        data = json.loads((d / "reward.json").read_text())
        reward = data.get("reward") if isinstance(data, dict) else None
        if not isinstance(reward, (int, float)) or isinstance(reward, bool):
            reward = text()
    elif (d / "reward.txt").exists():
        reward = text()
    else:
        sys.exit("[no reward: the tests wrote neither /logs/verifier/reward.txt nor reward.json]")
except (ValueError, OSError) as error:
    sys.exit(f"[unreadable reward: {error}]")
print(f"[reward {reward:g}]")
sys.exit(0 if reward >= 1 else 1)
"""


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _archive(files: dict[str, Path], what: str) -> bytes:
    """A gzipped tar of `files` (archive name -> path on disk), deterministic; refuses more than MAX_ARCHIVE."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, path in sorted(files.items()):
            info = tar.gettarinfo(str(path), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            if info.isfile():
                with open(path, "rb") as handle:
                    tar.addfile(info, handle)
            else:
                tar.addfile(info)
    data = buffer.getvalue()
    if len(data) > MAX_ARCHIVE:
        raise HarborTaskError(
            f"{what}: {len(data)} bytes compressed, more than the {MAX_ARCHIVE} a task may carry"
        )
    return data


def _tree(directory: Path) -> dict[str, Path]:
    """Every file and directory under `directory`, by its path relative to it (symbolic links refused)."""
    found = {}
    for path in sorted(directory.rglob("*")):
        if path.is_symlink():
            raise HarborTaskError(f"{path}: symbolic links are not copied into a task's sandbox")
        found[path.relative_to(directory).as_posix()] = path
    return found


def _unpack(data: bytes, target: str, marker: str) -> str:
    """A command that unpacks the gzipped tar `data` into the directory `target` (a shell word, quoted by
    the caller) from a quoted here-document of its base64."""
    encoded = base64.encodebytes(data).decode()
    return f"base64 -d <<'{marker}' | tar -xzf - -C {target}\n{encoded}{marker}"


def strip_canary(text: str) -> str:
    """The instruction without its leading canary comment lines and the blank lines after them (as Harbor shows it)."""
    lines = text.split("\n")
    index = 0
    while index < len(lines) and _CANARY.match(lines[index].strip()):
        index += 1
    while index < len(lines) and not lines[index].strip():
        index += 1
    return "\n".join(lines[index:])


# -- task.toml --------------------------------------------------------------------------------------


def _number(table: dict, key: str, where: str, default: float | None) -> float | None:
    value = table.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise HarborTaskError(f"{where}: `{key}` must be a positive number of seconds, got {value!r}")
    return float(value)


def _table(data: dict, key: str, path: Path) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise HarborTaskError(f"{path}: `{key}` must be a table ([{key}]), got {type(value).__name__}")
    return value


def _read_config(path: Path) -> dict:
    import tomllib

    if not path.is_file():
        raise HarborTaskError(f"{path}: missing (a Harbor task directory has task.toml)")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise HarborTaskError(f"{path}: not valid TOML: {error}") from error
    except UnicodeDecodeError as error:
        raise HarborTaskError(f"{path}: not UTF-8 text: {error}") from error
    return data


# -- environment/Dockerfile -------------------------------------------------------------------------


@dataclass
class _Instruction:
    line: int
    keyword: str
    arguments: str


def _instructions(text: str) -> list[_Instruction]:
    """The Dockerfile's instructions (continuation lines joined, comments and blank lines dropped)."""
    found: list[_Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += raw.rstrip()[:-1] + "\n"
            continue
        pending += raw
        keyword, _, arguments = pending.strip().partition(" ")
        found.append(_Instruction(start, keyword.upper(), arguments.strip()))
        pending = ""
    if pending:
        keyword, _, arguments = pending.strip().partition(" ")
        found.append(_Instruction(start, keyword.upper(), arguments.strip()))
    return found


def _exec_form(arguments: str) -> list[str] | None:
    if not arguments.startswith("["):
        return None
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, list) and all(isinstance(item, str) for item in value) else None


class _Dockerfile:
    """The Dockerfile translated to set-up commands on the base image (see `load_task`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.context = path.parent
        self.base = ""
        self.workdir = ""
        self.setup: list[str] = []
        self.written: list[str] = []
        self.env: dict[str, str] = {}  # the image's ENV, which Harbor's verifier runs with
        text = path.read_text(encoding="utf-8")
        for instruction in _instructions(text):
            self._translate(instruction)
        if not self.base:
            raise HarborTaskError(f"{path}: no FROM instruction")
        if not self.workdir:
            raise HarborTaskError(
                f"{path}: no WORKDIR: the terminal domain runs commands in the task's "
                "workdir, which the Dockerfile must set (e.g. WORKDIR /app)"
            )

    def where(self, instruction: _Instruction) -> str:
        return f"{self.path}:{instruction.line} ({instruction.keyword})"

    def _no_variables(self, instruction: _Instruction) -> None:
        if "$" in instruction.arguments:
            raise HarborTaskError(
                f"{self.where(instruction)}: variable substitution is not supported here; write the value out"
            )

    def _translate(self, instruction: _Instruction) -> None:
        from .image import DEFAULT_IMAGE, image_tag, is_base_image

        keyword, arguments, where = instruction.keyword, instruction.arguments, self.where(instruction)
        if keyword != "FROM" and not self.base:
            raise HarborTaskError(
                f"{where}: the Dockerfile must start with FROM (ARG before FROM is not supported)"
            )
        if keyword == "FROM":
            if self.base:
                raise HarborTaskError(f"{where}: multi-stage builds (a second FROM) are not supported")
            words = [word for word in arguments.split() if not word.startswith("--platform")]
            if len(words) not in (1, 3) or (len(words) == 3 and words[1].upper() != "AS"):
                raise HarborTaskError(f"{where}: expected `FROM IMAGE [AS NAME]`, got {arguments!r}")
            if not is_base_image(words[0]):
                raise HarborTaskError(
                    f"{where}: base image {words[0]!r} is not one built here: only {DEFAULT_IMAGE} "
                    f"(untagged, :latest or {image_tag()}) is, and nothing can be pulled "
                    "(no network); rewrite the environment on the base image"
                )
            self.base = words[0]
        elif keyword == "WORKDIR":
            self._no_variables(instruction)
            target = str(PurePosixPath(self.workdir or "/") / arguments.strip().strip('"'))
            if not arguments:
                raise HarborTaskError(f"{where}: WORKDIR needs a directory")
            self.workdir = target
            self.written.append(target)
            self.setup.append(f"# {where}\nmkdir -p {shlex.quote(target)} && cd {shlex.quote(target)}")
        elif keyword == "ENV":
            self._no_variables(instruction)
            try:
                words = shlex.split(arguments)
            except ValueError as error:
                raise HarborTaskError(f"{where}: cannot parse {arguments!r}: {error}") from error
            if not words:
                raise HarborTaskError(f"{where}: ENV needs KEY=VALUE")
            pairs = (
                [tuple(word.split("=", 1)) for word in words]
                if "=" in words[0]
                else [(words[0], " ".join(words[1:]))]
            )
            for pair in pairs:
                if len(pair) != 2 or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", pair[0]):
                    raise HarborTaskError(f"{where}: expected KEY=VALUE pairs, got {arguments!r}")
            exports = " ".join(f"{key}={shlex.quote(value)}" for key, value in pairs)
            self.setup.append(f"# {where}\nexport {exports}")
            self.env.update(pairs)
        elif keyword == "RUN":
            command = _exec_form(arguments)
            script = shlex.join(command) if command is not None else arguments
            if not script.strip():
                raise HarborTaskError(f"{where}: RUN needs a command")
            if script.lstrip().startswith("--"):
                raise HarborTaskError(f"{where}: RUN flags (--mount, --network...) are not supported")
            # A subshell from the current WORKDIR: a RUN's cd and exports do not outlive it, as in Docker.
            self.setup.append(f"# {where}\n(\n{script}\n)")
        elif keyword in ("COPY", "ADD"):
            self._copy(instruction)
        elif keyword == "USER":
            if arguments.strip() not in ("root", "0", "0:0", "root:root"):
                raise HarborTaskError(
                    f"{where}: only USER root is supported (the sandboxes run commands as root)"
                )
        elif keyword in IGNORED_INSTRUCTIONS:
            pass  # metadata, or how the container starts: Harbor starts its own command, and so do we
        else:
            raise HarborTaskError(
                f"{where}: {keyword} is not supported here (supported: FROM, WORKDIR, ENV, "
                f"RUN, COPY, ADD of local files, USER root; ignored: {', '.join(IGNORED_INSTRUCTIONS)})"
            )

    def _copy(self, instruction: _Instruction) -> None:
        where = self.where(instruction)
        self._no_variables(instruction)
        words = _exec_form(instruction.arguments)
        if words is None:
            try:
                words = shlex.split(instruction.arguments)
            except ValueError as error:
                raise HarborTaskError(f"{where}: cannot parse {instruction.arguments!r}: {error}") from error
        flags = [word for word in words if word.startswith("--")]
        if flags:
            raise HarborTaskError(f"{where}: {' '.join(flags)} is not supported (files are copied as root)")
        if len(words) < 2:
            raise HarborTaskError(f"{where}: expected SOURCE... DESTINATION")
        *sources, destination = words
        target = PurePosixPath(self.workdir or "/") / destination
        as_directory = destination.endswith("/") or len(sources) > 1
        files: dict[str, Path] = {}
        context = self.context.resolve()
        for source in sources:
            if "://" in source:
                raise HarborTaskError(
                    f"{where}: {source!r}: remote sources cannot be fetched here (no network)"
                )
            matches = (
                sorted(self.context.glob(source))
                if any(c in source for c in "*?[")
                else [self.context / source]
            )
            if not matches or not all(match.exists() for match in matches):
                raise HarborTaskError(f"{where}: {source!r} is not in the build context {self.context}")
            for match in matches:
                resolved = match.resolve()
                if resolved != context and context not in resolved.parents:
                    raise HarborTaskError(f"{where}: {source!r} is outside the build context {self.context}")
                if (
                    instruction.keyword == "ADD"
                    and match.is_file()
                    and re.search(r"\.(tar|tgz|tar\.\w+)$", match.name)
                ):
                    raise HarborTaskError(
                        f"{where}: ADD of an archive (unpacked by Docker) is not supported; "
                        "COPY it and unpack it with RUN"
                    )
                if match.is_dir():
                    for name, path in _tree(match).items():
                        files[str(target / name).lstrip("/")] = path
                else:
                    place = target / match.name if as_directory or len(matches) > 1 else target
                    files[str(place).lstrip("/")] = match
        if not as_directory and len(files) == 1 and matches[0].is_file():
            # One file to a name without a final /: into that directory when it exists (as Docker does), else as that name.
            self.written.append(str(target.parent))
            name, dest = shlex.quote(matches[0].name), shlex.quote(str(target))
            unpack = _unpack(_archive({matches[0].name: matches[0]}, where), '"$from"', "PIVOT_COPY")
            self.setup.append(
                f"# {where}\n(\nfrom=$(mktemp -d) && {unpack}\n"
                f'if [ -d {dest} ]; then cp -a "$from"/{name} {dest}/; '
                f'else mkdir -p {shlex.quote(str(target.parent))} && cp -a "$from"/{name} {dest}; fi\n'
                'status=$?; rm -rf "$from"; exit $status\n)'
            )
            return
        # A directory's contents, or several files: into the directory `target`.
        self.written.append(str(target))
        data = _archive(files, where)
        self.setup.append(
            f"# {where}\nmkdir -p {shlex.quote(str(target))} && {_unpack(data, '/', 'PIVOT_COPY')}"
        )


# -- the task directory -----------------------------------------------------------------------------


def load_task(directory: str | Path, strict: bool = False) -> HarborTask:
    """Read and validate a Harbor task directory; HarborTaskError names the file and the field. `strict`
    also loads it with the installed harbor package's own Task loader first (`validate_with_harbor`)."""
    path = Path(directory)
    if not path.is_dir():
        raise HarborTaskError(
            f"{path}: not a directory (a Harbor task is a directory with task.toml, "
            "instruction.md, environment/ and tests/)"
        )
    if strict:
        validate_with_harbor(task_dir=path)
    config = _read_config(path / "task.toml")
    toml = path / "task.toml"
    verifier = _table(config, "verifier", toml)
    agent = _table(config, "agent", toml)
    environment = _table(config, "environment", toml)
    metadata = _table(config, "metadata", toml)
    package = _table(config, "task", toml)
    verifier_timeout = _number(verifier, "timeout_sec", f"{toml} [verifier]", 600.0)
    agent_timeout = _number(agent, "timeout_sec", f"{toml} [agent]", None)
    env = verifier.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise HarborTaskError(f"{toml} [verifier]: `env` must be a table of strings, got {env!r}")
    if "task" in config and "name" not in package:
        raise HarborTaskError(f"{toml} [task]: `name` is required (Harbor's PackageInfo: org/name)")
    name = package.get("name", path.resolve().name)
    if "name" in package and not (isinstance(name, str) and TASK_NAME.match(name) and ".." not in name):
        raise HarborTaskError(f"{toml} [task]: `name` must be org/name, as Harbor requires, got {name!r}")

    instruction_path = path / "instruction.md"
    if not instruction_path.is_file():
        raise HarborTaskError(f"{instruction_path}: missing (a Harbor task's instruction)")
    instruction = strip_canary(instruction_path.read_text(encoding="utf-8")).strip()
    if not instruction:
        raise HarborTaskError(f"{instruction_path}: the instruction is empty")

    env_dir = path / "environment"
    if (env_dir / "docker-compose.yaml").exists() or (env_dir / "docker-compose.yml").exists():
        raise HarborTaskError(
            f"{env_dir}/docker-compose.yaml: multi-container environments are not supported "
            "(a terminal sandbox is one container)"
        )
    docker_image = environment.get("docker_image")
    dockerfile = env_dir / "Dockerfile"
    if docker_image is not None:
        from .image import is_base_image

        if not isinstance(docker_image, str) or not is_base_image(docker_image):
            raise HarborTaskError(
                f"{toml} [environment]: docker_image {docker_image!r} is a prebuilt image that "
                f"cannot be pulled here (no network); only {BASE_IMAGE} is available"
            )
        parsed = None
    elif not dockerfile.is_file():
        raise HarborTaskError(f"{dockerfile}: missing (set [environment] docker_image or write a Dockerfile)")
    else:
        parsed = _Dockerfile(dockerfile)

    test_script = path / "tests" / "test.sh"
    if not test_script.is_file():
        raise HarborTaskError(
            f"{test_script}: missing (the verifier's entry point, which writes /logs/verifier/reward.txt)"
        )
    tests = _archive(_tree(path / "tests"), f"{path}/tests")
    solve = path / "solution" / "solve.sh"
    solution = _archive(_tree(path / "solution"), f"{path}/solution") if solve.is_file() else None
    return HarborTask(
        path=path,
        name=name,
        instruction=instruction,
        workdir=parsed.workdir if parsed else "/app",
        setup=parsed.setup if parsed else ["mkdir -p /app && cd /app"],
        verifier_timeout=verifier_timeout,
        agent_timeout=agent_timeout,
        base_image=parsed.base if parsed else docker_image,
        verifier_env=dict(env),
        image_env=dict(parsed.env) if parsed else {},
        metadata=metadata,
        written=parsed.written if parsed else ["/app"],
        tests=tests,
        solution=solution,
    )


def bundled_dir() -> Path:
    """The folder of the bundled Harbor tasks (data/harbor/<task>/) and their trajectories (data/harbor/trajectories/)."""
    return Path(str(resources.files("pivot_envs.domains.terminal") / "data" / "harbor"))


def bundled_tasks() -> list[Path]:
    """The bundled Harbor task directories (written by this project in Harbor's format)."""
    return sorted(path.parent for path in bundled_dir().glob("*/task.toml"))


def bundled_trajectory(task: str) -> Path:
    """The bundled agent trajectory (ATIF) on the bundled task `task`."""
    return bundled_dir() / "trajectories" / f"{task}.json"


# -- the Docker image -------------------------------------------------------------------------------


def build_environment(task: HarborTask) -> str:
    """Build the task's environment/Dockerfile with Docker, `FROM` the locally built base image, and return
    the tag (`pivot-envs/harbor-<name>:<hash>`; built once per content, no network). HarborTaskError when
    the Dockerfile does not build."""
    import docker

    from pivot_envs.sandboxes.cleanup import LABEL

    from .image import base_rootfs, image_tag, import_image

    dockerfile = task.path / "environment" / "Dockerfile"
    if not dockerfile.is_file():
        raise HarborTaskError(f"{dockerfile}: missing (a task on the prebuilt base image needs no build)")
    base = import_image(base_rootfs(build=False), image_tag())
    digest = hashlib.sha256(base.encode())
    for name, path in _tree(task.path / "environment").items():
        digest.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"/") + b"\0")
    slug = re.sub(r"[^a-z0-9_.-]+", "-", task.name.lower()).strip("-.") or "task"
    tag = f"pivot-envs/harbor-{slug}:{digest.hexdigest()[:12]}"
    client = docker.from_env()
    try:
        try:
            client.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
        with tempfile.TemporaryDirectory(prefix="pivot-envs-harbor-") as context:
            shutil.copytree(task.path / "environment", context, dirs_exist_ok=True)
            text = (Path(context) / "Dockerfile").read_text(encoding="utf-8")
            # FROM names the base image as the task wrote it; the local image carries this package list's key.
            text = re.sub(
                r"(?im)^(\s*FROM\s+(?:--platform=\S+\s+)?)\S+", lambda m: m.group(1) + base, text, count=1
            )
            (Path(context) / "Dockerfile").write_text(text, encoding="utf-8")
            try:
                client.images.build(
                    path=context,
                    tag=tag,
                    pull=False,
                    rm=True,
                    forcerm=True,
                    network_mode="none",
                    labels={LABEL: "harbor"},
                )
            except docker.errors.BuildError as error:
                log = "".join(str(line.get("stream", line.get("error", ""))) for line in error.build_log)
                raise HarborTaskError(f"{dockerfile}: docker build failed: {error}: {log[-800:]}") from error
        return tag
    finally:
        client.close()


# -- trajectories -----------------------------------------------------------------------------------


def _step_command(step: dict, where: str) -> tuple[str | None, list[str]]:
    """The command an ATIF agent step runs (its bash tool calls joined in order), or None, and the other tools."""
    calls = step.get("tool_calls") or []
    if not isinstance(calls, list):
        raise HarborTrajectoryError(f"{where}: `tool_calls` must be a list")
    commands, others = [], []
    for index, call in enumerate(calls):
        at = f"{where} tool_calls[{index}]"
        if not isinstance(call, dict) or not isinstance(call.get("function_name"), str):
            raise HarborTrajectoryError(f"{at}: expected an object with `function_name` and `arguments`")
        arguments = call.get("arguments")
        if not isinstance(arguments, dict):
            raise HarborTrajectoryError(f"{at}: `arguments` must be an object (ATIF requires it)")
        name = call["function_name"]
        if name in DONE_TOOLS:
            continue
        if name not in COMMAND_TOOLS:
            others.append(name)
            continue
        key = next((key for key in COMMAND_ARGUMENTS if isinstance(arguments.get(key), str)), None)
        if key is None:
            raise HarborTrajectoryError(
                f"{at}: {name} has none of the arguments {', '.join(COMMAND_ARGUMENTS)}"
            )
        text = arguments[key]
        if key == "keystrokes":
            if not text.endswith("\n"):
                raise HarborTrajectoryError(
                    f"{at}: keystrokes {text[:60]!r} do not end with Enter: an interactive key press, not a "
                    "command, cannot be replayed"
                )
            text = text[:-1]
        if text.strip():
            commands.append(text)
    return ("\n".join(commands) if commands else None), others


def read_trajectory(path: str | Path, strict: bool = False) -> tuple[str, list[TrajectoryStep]]:
    """The commands of an agent trajectory: (its id, one TrajectoryStep per agent step that runs a command).

    Harbor's ATIF `trajectory.json` (`schema_version` "ATIF-v1.x"; an agent step's bash tool calls are one
    command, joined in order; `mark_task_complete` and the like are skipped), a JSON list of command strings,
    or any other file as one command a line (blank lines and `#` comments skipped). `strict` also validates
    an ATIF file with the installed harbor package's own Trajectory model (`validate_with_harbor`).
    """
    path = Path(path)
    if not path.is_file():
        raise HarborTrajectoryError(f"{path}: no such trajectory file")
    if strict:
        validate_with_harbor(trajectory=path)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise HarborTrajectoryError(f"{path}: not valid JSON: {error}") from error
        if isinstance(data, list):
            if not data or not all(isinstance(item, str) and item.strip() for item in data):
                raise HarborTrajectoryError(
                    f"{path}: a command list must be a non-empty list of non-empty strings"
                )
            return path.stem, [TrajectoryStep(index + 1, command) for index, command in enumerate(data)]
        return _read_atif(data, path)
    commands = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not commands:
        raise HarborTrajectoryError(f"{path}: no commands (one a line)")
    return path.stem, [TrajectoryStep(index + 1, command) for index, command in enumerate(commands)]


def _read_atif(data: Any, path: Path) -> tuple[str, list[TrajectoryStep]]:
    if not isinstance(data, dict):
        raise HarborTrajectoryError(f"{path}: expected an ATIF trajectory object or a list of commands")
    version = data.get("schema_version")
    if not isinstance(version, str) or not version.startswith("ATIF-v1."):
        raise HarborTrajectoryError(f"{path}: `schema_version` must be an ATIF-v1.x version, got {version!r}")
    steps = data.get("steps")
    if not isinstance(steps, list) or not steps:
        raise HarborTrajectoryError(f"{path}: `steps` must be a non-empty list")
    found = []
    for index, step in enumerate(steps):
        where = f"{path}: steps[{index}]"
        if not isinstance(step, dict):
            raise HarborTrajectoryError(f"{where}: expected an object")
        if step.get("step_id") != index + 1:
            raise HarborTrajectoryError(
                f"{where}: `step_id` must be {index + 1} (sequential from 1), got {step.get('step_id')!r}"
            )
        if step.get("source") not in STEP_SOURCES:
            raise HarborTrajectoryError(
                f"{where}: `source` must be system, user or agent, got {step.get('source')!r}"
            )
        if step["source"] != "agent":
            if step.get("tool_calls"):
                raise HarborTrajectoryError(f"{where}: only agent steps have `tool_calls`")
            continue
        command, others = _step_command(step, where)
        if others and command is None:
            raise HarborTrajectoryError(
                f"{where}: tool {others[0]!r} is not a bash command and cannot be replayed "
                f"(bash tools: {', '.join(COMMAND_TOOLS)})"
            )
        if command is not None:
            found.append(TrajectoryStep(index + 1, command, bool(step.get("is_copied_context"))))
    if not found:
        raise HarborTrajectoryError(f"{path}: no agent step runs a command")
    session = data.get("session_id")
    return (session if isinstance(session, str) and session else path.stem), found


# -- pivots -----------------------------------------------------------------------------------------


def replay(
    backend: Any, task: HarborTask, trajectory: str | Path | None = None, image: str | None = None
) -> tuple[TaskRun, list[TrajectoryStep], str]:
    """Replay the trajectory's commands (else the oracle) in a fresh sandbox of `backend` from the task's
    environment (its Dockerfile as set-up, or `image`); returns the run, the steps and the trajectory id."""
    if trajectory is not None:
        session, steps = read_trajectory(trajectory)
    else:
        session, steps = "oracle", [TrajectoryStep(1, task.oracle_command())]
    if backend.name == "bwrap" and image is None:
        problem = task.bubblewrap_problem()
        if problem:
            raise HarborTaskError(problem)
    return run_task(backend, task.to_task([step.command for step in steps], image)), steps, session


def harbor_pivots(
    backend: Any, task: HarborTask, trajectory: str | Path | None = None, image: str | None = None
) -> tuple[TaskRun, list[Pivot]]:
    """Replay the trajectory (see `replay`) and make one pivot per agent step that runs a command (none for
    ATIF's copied-context steps, which only build the state). Pivot ids: harbor/<task>/<trajectory>/s<step_id>.
    A set-up that writes where bubblewrap keeps nothing marks the pivots `context["docker_only"]` (the reason)."""
    run, steps, session = replay(backend, task, trajectory, image)
    trajectory_id = f"harbor/{task.name}/{session}"
    problem = "" if image else task.bubblewrap_problem()
    docker_only = {"docker_only": problem} if problem else {}
    pivots = []
    for step, pivot in zip(steps, task_pivots(run)):
        if step.copied_context:
            continue
        source = {
            **pivot.source,
            "trajectory": trajectory_id,
            "format": FORMAT,
            "atif_step": step.step_id,
            "task_dir": task.path.name,
        }
        pivots.append(
            dataclasses.replace(
                pivot,
                id=f"{trajectory_id}/s{step.step_id}",
                context={**pivot.context, **docker_only},
                source=source,
            )
        )
    return run, pivots
