"""The Sandbox protocol shared by the sandboxed domains (terminal, SWE), and its result types.

A sandbox runs shell commands in an isolated filesystem and shell state. `run(command, timeout)`
returns a CommandResult (exit code, output with ANSI sequences stripped and the middle cut when it
is too long, whether the hard timeout fired, and the workspace's files after the command when
asked; `clean=True` runs it in a fresh shell, for checks that decide a reward), `snapshot()`
freezes the current state, `fork(snapshot)` starts a new sandbox from a snapshot,
`system_writes()` lists what commands changed outside the writable roots, and `close()` removes
everything the sandbox made. The backends implementing it are
`pivot_envs.sandboxes.bwrap_backend` and `pivot_envs.sandboxes.docker_backend`; everything here
is light.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pivot_envs.config import option
from pivot_envs.errors import PivotEnvsError


@dataclass
class SandboxLimits:
    """Resource limits applied to every command (both backends)."""

    timeout: float = option(
        10.0, "hard wall-clock limit of one command in seconds; the whole process tree is killed"
    )
    output_bytes: int = option(
        16384, "output kept per command (head and tail halves; the middle is cut with a marker)"
    )
    memory_mb: int = option(
        1024,
        "memory limit (Docker: container memory; bubblewrap: the sandbox's cgroup when run as root, and the address space of each process)",
    )
    cpus: float = option(1.0, "CPU share (Docker --cpus); bubblewrap limits CPU time instead")
    cpu_seconds: int = option(60, "CPU time per process in seconds (RLIMIT_CPU)")
    processes: int = option(
        128,
        "process-count limit (Docker pids limit; bubblewrap: the sandbox's cgroup when run as root, plus RLIMIT_NPROC, a fixed ceiling per sandbox on Linux 5.14 and later)",
    )
    file_mb: int = option(
        64, "largest file a command may write in MB (RLIMIT_FSIZE): bounds disk filling and endless output"
    )
    disk_mb: int = option(
        1024,
        "most a sandbox may write in all, in MB: checked before each command and every 0.1 s while it runs; "
        "a command over it is killed, and a sandbox over it may not grow (docs/reliability.md)",
    )
    entries: int = option(
        100_000,
        "files, directories and links a sandbox's writable tree may hold: the disk check counts them, and a command past it is killed like one past disk_mb",
    )
    manifest_files: int = option(5000, "at most this many workspace entries are compared for file changes")


@dataclass
class FileChange:
    """One workspace path whose content, type or mode changed ("added", "removed", "modified")."""

    path: str
    kind: str


# The most of a command's saved shell state a result carries (a command may export a megabyte).
SHELL_BYTES = 64 * 1024


@dataclass
class CommandResult:
    """What running one command produced.

    exit_code: the command's exit status (137 after the hard timeout or a SIGKILL).
    output:    stdout and stderr interleaved, ANSI stripped, middle cut when over the limit.
    timed_out: the hard timeout fired and the process tree was killed.
    truncated: how many output bytes were cut (0 when none).
    files:     the workspace manifest after the command ({path: "type mode digest"}), when asked.
    seconds:   wall-clock time of the call.
    shell:     the shell state after the command, when the manifest was asked: the runner's saved
               `export -p` lines and `cd -- DIR` line, at most SHELL_BYTES (head and tail halves).
    git:       the workspace's git repository state after the command, when the manifest was asked and
               the sandbox's tree was read from the host (`gitstate.git_state`: HEAD, refs, index
               entries; "" without a repository); None otherwise.
    left_running: how many processes the command left running after its shell exited (background
               jobs, `setsid` and double-forked children still alive then), counted in the sandbox
               after the command and before its files are read; processes that earlier commands
               left are not counted. None where the sandbox cannot tell (Docker without the command
               channel, keystrokes sent to an interactive shell, a command that killed the server).
    """

    command: str
    exit_code: int
    output: str
    timed_out: bool = False
    truncated: int = 0
    files: dict[str, str] | None = None
    seconds: float = 0.0
    shell: str | None = None
    git: str | None = None
    left_running: int | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def to_dict(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "exit_code": self.exit_code,
            "output": self.output,
            "timed_out": self.timed_out,
            "truncated": self.truncated,
            "seconds": round(self.seconds, 4),
            "left_running": self.left_running,
        }


@dataclass
class Snapshot:
    """A frozen sandbox state a backend can fork: `ref` is backend data (image id, directory)."""

    backend: str
    ref: str
    workdir: str
    files: dict[str, str] = field(default_factory=dict)


class SandboxError(PivotEnvsError, RuntimeError):
    """The sandbox itself failed (daemon gone, backend missing), not the command run in it."""


class CommandRejected(PivotEnvsError, ValueError):
    """A command that cannot cross into a sandbox intact (a NUL byte, text that is not Unicode)."""


def command_problem(command: str) -> str:
    """Why `command` cannot be run as it is ("" when it can).

    A NUL byte cannot be part of a bash command (bash's strings end at it) and would split the
    request the command server reads; a lone surrogate is not text and has no UTF-8 form.
    """
    at = command.find("\0")
    if at >= 0:
        return f"the command contains a NUL byte (at character {at})"
    try:
        command.encode("utf-8")
    except UnicodeEncodeError as error:
        return f"the command is not valid Unicode text (a lone surrogate at character {error.start})"
    return ""


@runtime_checkable
class Sandbox(Protocol):
    """An isolated filesystem plus shell state that runs commands (see the module docstring)."""

    backend: str
    workdir: str

    def run(
        self, command: str, timeout: float | None = None, files: bool = False, clean: bool = False
    ) -> CommandResult:
        """Run `command` in the sandbox's shell state (exported variables and working directory of
        the commands before it), or with `clean=True` in a fresh shell in the workspace: that state
        neither loaded nor saved, the environment exactly the sandbox's defaults plus
        PYTHONSAFEPATH=1 and PYTHONNOUSERSITE=1. `files`: list the workspace afterwards."""
        ...

    def system_writes(self) -> list[str]:
        """Absolute paths outside the writable roots (the workspace, /root, /tmp, /.pivot) that
        commands added, changed or removed since the sandbox was created or forked (at most 50)."""
        ...

    def stop_processes(self, timeout: float = 5.0) -> bool:
        """Kill every process earlier commands left running (background jobs, daemons); whether none
        is left. Called before a check or test run that decides a reward."""
        ...

    def snapshot(self) -> Snapshot: ...

    def fork(self, snapshot: Snapshot) -> Sandbox: ...

    def close(self) -> None: ...


def file_changes(before: dict[str, str], after: dict[str, str]) -> list[FileChange]:
    """The workspace paths added, removed or modified between two manifests, sorted by path."""
    changes = [FileChange(p, "added") for p in after.keys() - before.keys()]
    changes += [FileChange(p, "removed") for p in before.keys() - after.keys()]
    changes += [FileChange(p, "modified") for p in before.keys() & after.keys() if before[p] != after[p]]
    return sorted(changes, key=lambda change: change.path)
