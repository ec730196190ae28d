"""The Sandbox protocol shared by sandboxed domains (terminal, SWE), and its result types.

A sandbox runs shell commands in an isolated filesystem and shell state. `run(command, timeout)`
returns a CommandResult (exit code, output with ANSI sequences stripped and the middle cut when it
is too long, whether the hard timeout fired, and the workspace's files after the command when
asked), `snapshot()` freezes the current state, `fork(snapshot)` starts a new sandbox from a
snapshot, and `close()` removes everything the sandbox made. Backends live in their domains
(`pivot_envs.domains.terminal.backends`: Docker and bubblewrap); everything here is light.

Every command goes through one bash wrapper (RUNNER) that both backends execute inside the
sandbox: it restores the shell state (working directory, exported variables) saved by the
previous command, applies the resource limits, runs the command under `timeout -s KILL` (which
kills the command's whole process group), with stdin closed and output sent to a file (so a
background process that keeps the output open cannot hold the call), then reports the exit code,
the head and tail of the output and, optionally, a manifest of the workspace's files.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pivot_envs.config import option
from pivot_envs.errors import PivotEnvsError

# Where the runner keeps the shell state and the last output, inside every sandbox; outside the
# workspace, so it never shows up as a changed file.
STATE_DIR = "/.pivot"

# Non-interactive defaults: no pager, no colours, no progress bars, no prompts.
SAFE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TERM": "dumb",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "MANPAGER": "cat",
    "SYSTEMD_PAGER": "",
    "NO_COLOR": "1",
    "PIP_PROGRESS_BAR": "off",
    "PIP_NO_INPUT": "1",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "DEBIAN_FRONTEND": "noninteractive",
    "GIT_AUTHOR_NAME": "pivot",
    "GIT_AUTHOR_EMAIL": "pivot@example.com",
    "GIT_COMMITTER_NAME": "pivot",
    "GIT_COMMITTER_EMAIL": "pivot@example.com",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}


@dataclass
class SandboxLimits:
    """Resource limits applied to every command (both backends)."""

    timeout: float = option(10.0, "hard wall-clock limit of one command in seconds; the whole process tree is killed")
    output_bytes: int = option(16384, "output kept per command (head and tail halves; the middle is cut with a marker)")
    memory_mb: int = option(1024, "memory limit (Docker: container memory; bubblewrap: address space per process)")
    cpus: float = option(1.0, "CPU share (Docker --cpus); bubblewrap limits CPU time instead")
    cpu_seconds: int = option(60, "CPU time per process in seconds (RLIMIT_CPU)")
    processes: int = option(128, "process-count limit (Docker pids limit; bubblewrap RLIMIT_NPROC above the current count)")
    file_mb: int = option(64, "largest file a command may write in MB (RLIMIT_FSIZE): bounds disk filling and endless output")
    disk_mb: int = option(1024, "most a sandbox may write in all, in MB: a command over it is killed (checked every 0.1 s)")
    manifest_files: int = option(5000, "at most this many workspace entries are compared for file changes")


@dataclass
class FileChange:
    """One workspace path whose content, type or mode changed ("added", "removed", "modified")."""

    path: str
    kind: str


@dataclass
class CommandResult:
    """What running one command produced.

    exit_code: the command's exit status (137 after the hard timeout or a SIGKILL).
    output:    stdout and stderr interleaved, ANSI stripped, middle cut when over the limit.
    timed_out: the hard timeout fired and the process tree was killed.
    truncated: how many output bytes were cut (0 when none).
    files:     the workspace manifest after the command ({path: "type mode digest"}), when asked.
    seconds:   wall-clock time of the call.
    """

    command: str
    exit_code: int
    output: str
    timed_out: bool = False
    truncated: int = 0
    files: dict[str, str] | None = None
    seconds: float = 0.0

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

    def run(self, command: str, timeout: float | None = None, files: bool = False) -> CommandResult: ...

    def snapshot(self) -> Snapshot: ...

    def fork(self, snapshot: Snapshot) -> Sandbox: ...

    def close(self) -> None: ...


def file_changes(before: dict[str, str], after: dict[str, str]) -> list[FileChange]:
    """The workspace paths added, removed or modified between two manifests, sorted by path."""
    changes = [FileChange(p, "added") for p in after.keys() - before.keys()]
    changes += [FileChange(p, "removed") for p in before.keys() - after.keys()]
    changes += [FileChange(p, "modified") for p in before.keys() & after.keys() if before[p] != after[p]]
    return sorted(changes, key=lambda change: change.path)


_ANSI = re.compile(
    r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC ... BEL/ST (titles, hyperlinks)
    r"|\x1b\[[0-?]*[ -/]*[@-~]"  # CSI (colours, cursor movement)
    r"|\x1b[PX^_][^\x1b]*\x1b\\"  # DCS/SOS/PM/APC strings
    r"|\x1b[@-Z\\-_]"  # other two-byte escapes
    r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"  # stray control characters (keep \t \n \r)
)


def strip_ansi(text: str) -> str:
    """Remove terminal escape sequences, and keep only what a carriage return left visible on each line."""
    text = _ANSI.sub("", text.replace("\r\n", "\n"))
    return "\n".join(line.rsplit("\r", 1)[-1] if "\r" in line else line for line in text.split("\n"))


def cut_marker(cut: int) -> str:
    """The line that replaces the middle of an over-long output."""
    return f"\n[... {cut} bytes of output cut ...]\n"


def new_marker() -> str:
    """A random per-session marker command output cannot guess (runner headers, shell prompts)."""
    return "PIVOT" + secrets.token_hex(8)


# The runner. Positional arguments: $1 command, $2 timeout (s; "host": the host enforces it by
# killing the runner's process group, which then needs no `timeout` and no second bash), $3
# output bytes kept (0: leave the output in /.pivot/out for the host to read, and exit with the
# command's status), $4 file size limit (KB), $5 process limit (0: none), $6 address-space limit
# (KB, 0: none), $7 CPU seconds, $8 marker, $9 workspace to list in the manifest ("" for none),
# ${10} manifest entries.
# The shell state is saved with builtins only (export -p, printf): no extra process per command.
_INNER = r"""
[ -r /.pivot/env.sh ] && . /.pivot/env.sh >/dev/null 2>&1
trap '__pivot_rc=$?; { export -p; printf "cd -- %q\n" "$PWD"; } >/.pivot/env.sh 2>/dev/null; exit $__pivot_rc' EXIT
eval "$1"
"""

RUNNER = r"""
exec 2>/dev/null
[ -d /.pivot ] || mkdir -p /.pivot 2>/dev/null
ulimit -f "$4" 2>/dev/null
[ "$5" -gt 0 ] && ulimit -u "$5" 2>/dev/null
[ "$6" -gt 0 ] && ulimit -v "$6" 2>/dev/null
ulimit -t "$7" 2>/dev/null
if [ "$2" = host ]; then  # the host kills this process group at the time limit: no timeout process
  exec >/.pivot/out 2>&1 </dev/null
  set -- "$1"
  eval "$PIVOT_INNER"
  exit
fi
if [ "$3" = 0 ]; then
  exec timeout -s KILL "$2" bash -c "$PIVOT_INNER" pivot "$1" >/.pivot/out 2>&1 </dev/null
fi
timeout -s KILL "$2" bash -c "$PIVOT_INNER" pivot "$1" >/.pivot/out 2>&1 </dev/null
rc=$?
size=$(stat -c %s /.pivot/out 2>/dev/null || echo 0)
printf '%s %s %s\n' "$8" "$rc" "$size"
half=$(( $3 / 2 ))
if [ "$size" -gt "$3" ]; then head -c "$half" /.pivot/out; tail -c "$half" /.pivot/out; else cat /.pivot/out; fi
if [ -n "$9" ] && cd "$9" 2>/dev/null; then
  printf '\n%s manifest\n' "$8"
  timeout -s KILL 10 find . -mindepth 1 -name .git -prune -o -printf '%y %m %p -> %l\n' 2>/dev/null | head -n "${10}"
  printf '%s digests\n' "$8"
  timeout -s KILL 10 find . -name .git -prune -o -type f -print0 2>/dev/null | head -z -n "${10}" | xargs -0 -r md5sum 2>/dev/null
fi
exit 0
"""


# The command server both backends start once per sandbox: it reads a request (the runner's
# arguments, NUL-separated) from the FIFO /.pivot-chan/in, runs the runner, and writes its report
# followed by a trailer line "<marker> exit <status>" to the FIFO /.pivot-chan/out. A command then
# costs a bash fork in the sandbox instead of a `docker exec` through the daemon or a new bwrap.
# The channel is mounted read-only, so commands cannot remove it.
# The server ignores SIGPIPE (the host may stop reading); commands get the default back. Job
# control (set -m) runs each request in a process group of its own, which the host can kill.
SERVER = r"""
trap '' PIPE
set -m
while :; do
  args=()
  while IFS= read -r -d '' arg; do args+=("$arg"); done </.pivot-chan/in || exit 1  # channel gone: stop
  [ "${#args[@]}" -gt 7 ] || continue
  { ( trap - PIPE; cd "$PIVOT_WORKDIR" 2>/dev/null; set -- "${args[@]}"; unset args arg; eval "$PIVOT_RUNNER" )
    printf '\n%s exit %s\n' "${args[7]}" "$?"; } >/.pivot-chan/out
done
"""
CHANNEL_DIR = "/.pivot-chan"


def runner_argv(command: str, timeout: float | None, limits: SandboxLimits, marker: str, manifest_dir: str = "",
                nproc: int = 0, address_space_kb: int = 0, report: bool = True) -> list[str]:
    """The argv that runs `command` through the runner inside a sandbox.

    timeout=None: the caller enforces the time limit by killing the runner's process group (only
    with report=False, through the command server).

    report=True: the runner prints a header, the cut output and the manifest (Docker without a
    readable container filesystem).
    report=False: it leaves the output in /.pivot/out and exits with the command's status, for
    backends that read the sandbox's files from the host (bubblewrap, local Docker).

    Raises CommandRejected for a command that cannot cross into the sandbox intact (see
    `command_problem`): the arguments travel NUL-separated, so none may contain a NUL.
    """
    problem = command_problem(command)
    if problem:
        raise CommandRejected(problem)
    return [
        "bash", "-c", RUNNER, "pivot-runner", command, "host" if timeout is None else f"{max(timeout, 0.1):.3f}",
        str(limits.output_bytes if report else 0),
        str(limits.file_mb * 1024), str(nproc), str(address_space_kb), str(limits.cpu_seconds), marker,
        manifest_dir, str(limits.manifest_files),
    ]


def runner_env() -> dict[str, str]:
    """The environment every command sees (SAFE_ENV plus the runner's scripts)."""
    return {**SAFE_ENV, "PIVOT_INNER": _INNER, "PIVOT_RUNNER": RUNNER}


def parse_runner_output(raw: bytes, command: str, marker: str, limits: SandboxLimits, timeout: float,
                        seconds: float) -> CommandResult:
    """Decode what RUNNER printed into a CommandResult; raises SandboxError when the header is missing."""
    start = raw.find(marker.encode())
    header_end = raw.find(b"\n", start) if start >= 0 else -1
    header = raw[start:header_end].decode("utf-8", "replace").split() if header_end >= 0 else []
    if len(header) != 3 or header[0] != marker:
        raise SandboxError(f"the sandbox runner did not report (got {raw[:300]!r}); is bash in the image?")
    exit_code, size = int(header[1]), int(header[2])
    kept = min(size, limits.output_bytes)
    output = _join_cut(raw[header_end + 1: header_end + 1 + kept], size - kept, limits.output_bytes)
    files = None
    rest = raw[header_end + 1 + kept:].decode("utf-8", "replace")
    manifest_at = rest.find(f"\n{marker} manifest\n")
    if manifest_at >= 0:
        files = _parse_manifest(rest[manifest_at:], marker)
    # timeout -s KILL reports 137; so does a command killed by SIGKILL for other reasons, which
    # the elapsed time tells apart.
    timed_out = exit_code == 137 and seconds >= timeout * 0.95
    return CommandResult(command, exit_code, strip_ansi(output), timed_out, size - kept, files, seconds)


def result_from_files(state_dir: str | os.PathLike, workspace: str | os.PathLike | None, command: str,
                      exit_code: int, limits: SandboxLimits, timeout: float, seconds: float,
                      within: str | os.PathLike | None = None) -> CommandResult:
    """A CommandResult read from the host side of a sandbox (the runner ran with report=False).

    `within` is the sandbox's tree on the host: a state directory, output file or workspace the
    command replaced by a link pointing out of it is not read (the link would be followed on the
    host), and the output file itself is opened without following a link.
    """
    out = Path(state_dir) / "out"
    size, body = 0, b""
    try:
        descriptor = os.open(out, os.O_RDONLY | os.O_NOFOLLOW) if _inside(out, within) else None
    except OSError:
        descriptor = None
    if descriptor is not None:
        with os.fdopen(descriptor, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > limits.output_bytes:
                half = limits.output_bytes // 2
                body = handle.read(half)
                handle.seek(size - half)
                body += handle.read(half)
            else:
                body = handle.read()
    kept = min(size, limits.output_bytes)
    output = _join_cut(body, size - kept, limits.output_bytes)
    files = None
    if workspace is not None:
        files = manifest(workspace, limits.manifest_files) if _inside(workspace, within) else {}
    timed_out = exit_code == 137 and seconds >= timeout * 0.95
    return CommandResult(command, exit_code, strip_ansi(output), timed_out, size - kept, files, seconds)


def _inside(path: str | os.PathLike, root: str | os.PathLike | None) -> bool:
    """Whether `path`, with every link resolved on the host, stays inside `root` (True without a root)."""
    if root is None:
        return True
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))


def disk_usage(root: str | os.PathLike, stop_above: int | None = None) -> int:
    """Bytes allocated under `root` (links not followed); stops counting once above `stop_above`."""
    total, pending = 0, [os.fspath(root)]
    while pending:
        try:
            entries = os.scandir(pending.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += info.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
        if stop_above is not None and total > stop_above:
            break
    return total


def _join_cut(body: bytes, cut: int, limit: int) -> str:
    if not cut:
        return body.decode("utf-8", "replace")
    half = limit // 2
    return body[:half].decode("utf-8", "replace") + cut_marker(cut) + body[half:].decode("utf-8", "replace")


def manifest(root: str | os.PathLike, limit: int = 5000) -> dict[str, str]:
    """The workspace manifest from the host side, in the runner's format ({path: "type mode [digest]"}).

    .git is left out: commit objects differ between equivalent commands (timestamps, order).
    """
    entries: dict[str, str] = {}
    base = Path(root)
    for directory, dirs, names in os.walk(base):
        dirs[:] = sorted(d for d in dirs if d != ".git")
        for name in [*dirs, *names]:
            if len(entries) >= limit:
                return entries
            path = Path(directory, name)
            relative = str(path.relative_to(base))
            try:
                info = path.lstat()
            except OSError:
                continue
            mode = oct(stat.S_IMODE(info.st_mode))[2:]
            if stat.S_ISLNK(info.st_mode):
                entries[relative] = f"l {mode} -> {os.readlink(path)}"
            elif stat.S_ISDIR(info.st_mode):
                entries[relative] = f"d {mode}"
            elif stat.S_ISREG(info.st_mode):
                digest = _digest(path)
                entries[relative] = f"f {mode} {digest}"
            else:
                entries[relative] = f"p {mode}"
    return entries


def _digest(path: Path) -> str:
    # O_NOFOLLOW: a file swapped for a link after the lstat is not followed out of the sandbox.
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return "unreadable"
    digest = hashlib.md5()
    with os.fdopen(descriptor, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _parse_manifest(text: str, marker: str) -> dict[str, str]:
    listing, _, digests = text.partition(f"{marker} digests\n")
    entries: dict[str, str] = {}
    for line in listing.splitlines():
        parts = line.split(" ", 2)
        if len(parts) != 3 or parts[0] not in "fdlps" or len(parts[0]) != 1:
            continue
        kind, mode, rest = parts
        path, _, target = rest.rpartition(" -> ")
        entries[path.removeprefix("./")] = f"{kind} {mode}" + (f" -> {target}" if kind == "l" else "")
    for line in digests.splitlines():
        digest, _, path = line.partition("  ")
        path = path.removeprefix("./")
        if path in entries:
            entries[path] += f" {digest}"
    return entries
