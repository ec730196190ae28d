"""The bash runner every command goes through, the command server that runs it inside a sandbox,
and the host side of both: the runner's argv and environment, and its report decoded.

Every command goes through one bash wrapper (RUNNER) that both backends execute inside the
sandbox: it restores the shell state (working directory, exported variables) saved by the
previous command, applies the resource limits, runs the command under `timeout -s KILL` (which
kills the command's whole process group), with stdin closed and output sent to a file (so a
background process that keeps the output open cannot hold the call), then reports the exit code,
the head and tail of the output and, optionally, a manifest of the workspace's files.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from .gitstate import git_state
from .manifest import HASH_BUDGET, KnownDigests, manifest, open_beneath, parse_manifest, read_bounded
from .output import join_cut, strip_ansi
from .protocol import (
    SHELL_BYTES,
    CommandRejected,
    CommandResult,
    SandboxError,
    SandboxLimits,
    command_problem,
)
from .trees import remove_tree

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


# The runner. Positional arguments: $1 command, $2 timeout (s; "host": the host enforces it by
# killing the runner's process group, which then needs no `timeout` process), $3 output bytes kept
# (0: leave the output in /.pivot/out for the host to read, and exit with the command's status),
# $4 file size limit (KB), $5 process limit (0: none), $6 address-space limit (KB, 0: none), $7 CPU
# seconds, $8 marker, $9 workspace to list in the manifest ("" for none), ${10} manifest entries,
# ${11} "clean" for a command in a fresh shell (CLEAN_INNER) instead of the saved shell state, ${12}
# the most bytes of the saved shell state printed after the manifest (head and tail halves).
# The command itself runs under $PIVOT_DROP (see the server below): a process with fewer
# capabilities than the server and the runner, so it cannot open their descriptors or read their
# memory through /proc.
# The shell state is saved with builtins only (export -p, printf): no extra process per command.
_INNER = r"""
[ -r /.pivot/env.sh ] && . /.pivot/env.sh >/dev/null 2>&1
trap '__pivot_rc=$?; { export -p; printf "cd -- %q\n" "$PWD"; } >/.pivot/env.sh 2>/dev/null; exit $__pivot_rc' EXIT
eval "$1"
"""

# A command in a fresh shell: the saved shell state is neither loaded nor saved, and Python does not
# put the script's directory or the working directory first on sys.path (checks and test runs that
# decide a reward: nothing a sample exported, defined or planted beside a script reaches them).
_CLEAN_INNER = r"""
unset PIVOT_INNER PIVOT_CLEAN_INNER PIVOT_RUNNER PIVOT_DROP PIVOT_WORKDIR
export PYTHONSAFEPATH=1 PYTHONNOUSERSITE=1
eval "$1"
"""

RUNNER = r"""
exec 2>/dev/null
[ -d /.pivot ] || mkdir -p /.pivot 2>/dev/null
ulimit -f "$4" 2>/dev/null
[ "$5" -gt 0 ] && ulimit -u "$5" 2>/dev/null
[ "$6" -gt 0 ] && ulimit -v "$6" 2>/dev/null
ulimit -t "$7" 2>/dev/null
if [ "${11}" = clean ]; then __pivot_inner=$PIVOT_CLEAN_INNER; else __pivot_inner=$PIVOT_INNER; fi
if [ "$2" = host ]; then  # the host kills this process group at the time limit: no timeout process
  exec >/.pivot/out 2>&1 </dev/null
  exec $PIVOT_DROP bash -c "$__pivot_inner" pivot "$1"
fi
if [ "$3" = 0 ]; then
  exec timeout -s KILL "$2" $PIVOT_DROP bash -c "$__pivot_inner" pivot "$1" >/.pivot/out 2>&1 </dev/null
fi
[ -f /.pivot/out ] && [ ! -L /.pivot/out ] || rm -rf /.pivot/out
timeout -s KILL "$2" $PIVOT_DROP bash -c "$__pivot_inner" pivot "$1" >/.pivot/out 2>&1 </dev/null
rc=$?
size=$(stat -c %s /.pivot/out 2>/dev/null || echo 0)
printf '%s %s %s\n' "$8" "$rc" "$size"
half=$(( $3 / 2 ))
if [ "$size" -gt "$3" ]; then head -c "$half" /.pivot/out; tail -c "$half" /.pivot/out; else cat /.pivot/out; fi
if [ -n "$9" ] && cd "$9" 2>/dev/null; then
  printf '\n%s manifest\n' "$8"
  timeout -s KILL 10 find . -name .git -type d -exec test -f {}/HEAD -a ! -h {}/HEAD \; -prune -o -printf '%y %m %p\0%l\0' 2>/dev/null | head -z -n "$(( ${10} * 2 + 2 ))"
  printf '%s digests\n' "$8"
  timeout -s KILL 10 find . -name .git -type d -exec test -f {}/HEAD -a ! -h {}/HEAD \; -prune -o -type f -print0 2>/dev/null | head -z -n "${10}" | xargs -0 -r md5sum 2>/dev/null
  size=0
  if [ -f /.pivot/env.sh ] && [ ! -L /.pivot/env.sh ]; then size=$(stat -c %s /.pivot/env.sh 2>/dev/null || echo 0); fi
  printf '%s shell %s\n' "$8" "$size"
  if [ "$size" -gt 0 ]; then
    if [ "$size" -gt "${12}" ]; then
      head -c "$(( ${12} / 2 ))" /.pivot/env.sh; tail -c "$(( ${12} / 2 ))" /.pivot/env.sh
    else
      cat /.pivot/env.sh
    fi
  fi
fi
exit 0
"""

# How a command drops below the server (the argv prefix the runner puts before its bash, in
# PIVOT_DROP): the kernel lets a process open another's descriptors, environment or memory under
# /proc only when its capabilities include the other's, so a command whose capabilities are a
# strict subset of the server's cannot reach the channel's descriptors the server holds. bubblewrap:
# the server alone holds CAP_SETPCAP (bwrap --cap-add) and commands hold none, as before; Docker:
# commands hold root's usual capabilities but CAP_SETPCAP. Without setpriv in the image, commands
# run as the server does, and the sandbox reports `channel_isolated = False`.
DROP_ALL = "setpriv --bounding-set=-all --inh-caps=-all --ambient-caps=-all --"
DROP_SETPCAP = "setpriv --bounding-set=-setpcap --"

# The command server both backends start once per sandbox. It opens the channel (see channel.py)
# once: the FIFO `in` (a line GO per request), the reply FIFO `out` and the request file (the
# runner's arguments, NUL-separated), says "ready" on `out` (with "drop" when commands run below
# it), and the host then removes the three paths, so no command can open them. For each request it
# re-reads the request file through its own descriptor, runs the runner in a subshell that closes
# the channel's descriptors, and writes the report followed by a trailer line "<marker> exit
# <status> <left>" to `out`. A command then costs a fork and an exec in the sandbox instead of a
# `docker exec` through the daemon or a new bwrap.
# <left> counts what the command left running (CommandResult.left_running), taken after the
# request's subshell returns and before the trailer, so before the host reads the sandbox's files:
# the live processes (not zombies) whose PID was not in /proc when the request began, less those
# whose parent was there and is not PID 1 or the server or its ancestors (`keep`, found once): the
# children a daemon of an earlier command forks are that daemon's, not this command's. Builtins
# only (a glob of /proc before, a glob and a read of each new process's stat after): no process.
# The server ignores SIGPIPE (the host may stop reading); commands get the default back. Job
# control (set -m) runs each request in a process group of its own, which the host can kill.
SERVER = r"""
trap '' PIPE
set -m
exec 3<>/.pivot-chan/in 4>/.pivot-chan/out 5</.pivot-chan/request || exit 1
if [ -n "$PIVOT_DROP" ] && ! command -v setpriv >/dev/null 2>&1; then PIVOT_DROP=; fi
keep=" 1 " p=$$
while [ "$p" -gt 1 ] && { read -r s </proc/$p/stat; } 2>/dev/null; do keep="$keep$p "; s=${s##*) }; set -- $s; p=$2; done
printf 'ready %s\n' "${PIVOT_DROP:+drop}" >&4
while :; do
  go=
  IFS= read -r go <&3 || exit 1
  [ "$go" = go ] || continue
  args=()
  while IFS= read -r -d '' arg; do args+=("$arg"); done </proc/self/fd/5 || exit 1
  [ "${#args[@]}" -gt 7 ] || continue
  before=" "; for d in /proc/[0-9]*; do before="$before${d#/proc/} "; done
  { ( trap - PIPE; exec 3<&- 5<&- 4>&-; cd "$PIVOT_WORKDIR" 2>/dev/null; set -- "${args[@]}"; unset args arg go; eval "$PIVOT_RUNNER" )
    rc=$? left=0
    for d in /proc/[0-9]*; do
      case $before in *" ${d#/proc/} "*) continue ;; esac
      { read -r s <"$d/stat"; } 2>/dev/null || continue
      s=${s##*) }; set -- $s
      case $1 in Z|X) continue ;; esac
      case $before in *" $2 "*) case $keep in *" $2 "*) ;; *) continue ;; esac ;; esac
      left=$((left + 1))
    done
    printf '\n%s exit %s %s\n' "${args[7]}" "$rc" "$left"; } >&4
done
"""
CHANNEL_DIR = "/.pivot-chan"

# Kills what earlier commands left running (background jobs, daemons, `setsid` children): every
# process but PID 1, this shell's ancestors (the command server and the runner) and PID 1's oldest
# child (the server, or the keep-alive, which nothing started later can be). Rounds of: look, exit 0
# when none is left, kill them all, let them die; exit 1 if some still live after ten (processes that
# fork faster than they are killed). Run with clean=True (see `stop_processes`).
STOP_LEFTOVERS = r"""
born() { local s; { read -r s </proc/$1/stat; } 2>/dev/null || return 1; s=${s##*) }; set -- $s; state=$1 parent=$2 start=${20}; }
keep=" 1 " pid=$BASHPID
while [ "$pid" -gt 1 ] && born "$pid"; do keep="$keep$pid " pid=$parent; done
first= first_start=
for d in /proc/[0-9]*; do
  born "${d#/proc/}" && [ "$parent" = 1 ] || continue
  if [ -z "$first" ] || [ "$start" -lt "$first_start" ]; then first=${d#/proc/} first_start=$start; fi
done
keep="$keep$first "
for round in 1 2 3 4 5 6 7 8 9 10; do
  left=
  for d in /proc/[0-9]*; do
    case $keep in *" ${d#/proc/} "*) continue ;; esac
    born "${d#/proc/}" && [ "$state" != Z ] && [ "$state" != X ] || continue
    left="$left ${d#/proc/}"
  done
  [ -n "$left" ] || exit 0
  kill -9 $left 2>/dev/null
  sleep 0.05
done
exit 1
"""


def stop_processes(sandbox: Any, timeout: float = 5.0) -> bool:
    """Kill every process the commands in `sandbox` left running, within `timeout` seconds; whether none
    is left. Run it before a check or test run that decides a reward, so nothing of the sample's runs
    beside it (a background loop rewriting the tests, a daemon answering for a tool)."""
    return sandbox.run(STOP_LEFTOVERS, timeout=timeout, clean=True).ok


def runner_argv(
    command: str,
    timeout: float | None,
    limits: SandboxLimits,
    marker: str,
    manifest_dir: str = "",
    nproc: int = 0,
    address_space_kb: int = 0,
    report: bool = True,
    clean: bool = False,
) -> list[str]:
    """The argv that runs `command` through the runner inside a sandbox.

    timeout=None: the caller enforces the time limit by killing the runner's process group (only
    with report=False, through the command server).

    report=True: the runner prints a header, the cut output and the manifest (Docker without a
    readable container filesystem).
    report=False: it leaves the output in /.pivot/out and exits with the command's status, for
    backends that read the sandbox's files from the host (bubblewrap, local Docker).

    clean=True: the command runs in a fresh shell (see `_CLEAN_INNER`), not in the saved shell state.

    Raises CommandRejected for a command that cannot cross into the sandbox intact (see
    `command_problem`): the arguments travel NUL-separated, so none may contain a NUL.
    """
    problem = command_problem(command)
    if problem:
        raise CommandRejected(problem)
    return [
        "bash",
        "-c",
        RUNNER,
        "pivot-runner",
        command,
        "host" if timeout is None else f"{max(timeout, 0.1):.3f}",
        str(limits.output_bytes if report else 0),
        str(limits.file_mb * 1024),
        str(nproc),
        str(address_space_kb),
        str(limits.cpu_seconds),
        marker,
        manifest_dir,
        str(limits.manifest_files),
        "clean" if clean else "",
        str(SHELL_BYTES),
    ]


def runner_env(drop: str = "") -> dict[str, str]:
    """The environment the server and runner start with: SAFE_ENV, the runner's scripts and `drop`
    (the argv prefix that puts commands below the server, DROP_ALL or DROP_SETPCAP; "" for none)."""
    return {
        **SAFE_ENV,
        "PIVOT_INNER": _INNER,
        "PIVOT_CLEAN_INNER": _CLEAN_INNER,
        "PIVOT_RUNNER": RUNNER,
        "PIVOT_DROP": drop,
    }


def parse_runner_output(
    raw: bytes, command: str, marker: str, limits: SandboxLimits, timeout: float, seconds: float
) -> CommandResult:
    """Decode what RUNNER printed into a CommandResult; raises SandboxError when the header is missing."""
    start = raw.find(marker.encode())
    header_end = raw.find(b"\n", start) if start >= 0 else -1
    header = raw[start:header_end].decode("utf-8", "replace").split() if header_end >= 0 else []
    if len(header) != 3 or header[0] != marker:
        raise SandboxError(f"the sandbox runner did not report (got {raw[:300]!r}); is bash in the image?")
    exit_code, size = int(header[1]), int(header[2])
    kept = min(size, limits.output_bytes)
    output = join_cut(raw[header_end + 1 : header_end + 1 + kept], size - kept, limits.output_bytes)
    files = shell = None
    tail = raw[header_end + 1 + kept :]
    # The shell state comes last, after "<marker> shell <size>": the marker is random, so nothing a command
    # printed or named can forge that line.
    shell_at = tail.find(b"\n%s shell " % marker.encode())
    if shell_at >= 0:
        line_end = tail.find(b"\n", shell_at + 1)
        saved_size = tail[shell_at + len(marker) + 8 : line_end if line_end >= 0 else len(tail)]
        saved = tail[line_end + 1 :] if line_end >= 0 else b""
        if saved_size.isdigit():
            shell = join_cut(saved, max(int(saved_size) - len(saved), 0), SHELL_BYTES)
        tail = tail[:shell_at]
    rest = tail.decode("utf-8", "replace")
    manifest_at = rest.find(f"\n{marker} manifest\n")
    if manifest_at >= 0:
        files = parse_manifest(rest[manifest_at:], marker)
    # timeout -s KILL reports 137; so does a command killed by SIGKILL for other reasons, which
    # the elapsed time tells apart.
    timed_out = exit_code == 137 and seconds >= timeout * 0.95
    return CommandResult(
        command, exit_code, strip_ansi(output), timed_out, size - kept, files, seconds, shell
    )


def clear_output(root: str | os.PathLike, state: str) -> None:
    """Remove the output path in the state directory `state` under `root` unless it is a regular
    file, which is emptied: a FIFO, link or directory a command left there would hold or misdirect
    the next command's output (the runner opens it for writing), and a command the host refuses to
    start must not show the previous one's. Links are never followed."""
    try:
        directory = open_beneath(root, state)
    except OSError:
        return
    try:
        info = os.stat("out", dir_fd=directory, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            remove_directory(directory, "out")
        elif not stat.S_ISREG(info.st_mode):
            os.unlink("out", dir_fd=directory)
        elif info.st_size:
            os.close(
                os.open("out", os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=directory)
            )
    except OSError:
        pass
    finally:
        os.close(directory)


REMOVE_SECONDS = 60  # the most a removal of a tree a command left may take


def remove_directory(parent: int, name: str) -> None:
    """Remove the directory `name` in the open directory `parent`, however deep, without following a
    link: trees.remove_tree reaching it through the inherited descriptor (/proc/self/fd), so no path
    component a command could swap for a link is resolved."""
    remove_tree(f"/proc/self/fd/{parent}/{name}", pass_fds=(parent,), timeout=REMOVE_SECONDS)


def result_from_files(
    root: str | os.PathLike,
    state: str,
    workspace: str | None,
    command: str,
    exit_code: int,
    limits: SandboxLimits,
    timeout: float,
    seconds: float,
    known: KnownDigests | None = None,
) -> CommandResult:
    """A CommandResult read from the host side of a sandbox (the runner ran with report=False).

    `root` is the sandbox's tree on the host; `state` (the state directory) and `workspace` are
    paths under it, opened from `root` one component at a time without following a link, so a
    command that swapped one for a link out of its tree is not read through it. The output file
    is read only when it is a regular file, without blocking and at most `limits.output_bytes`
    of it. `known`: digests the workspace manifest may reuse for files left alone (see
    manifest.KnownDigests).
    """
    size, body, problem = read_bounded(root, os.path.join(state, "out"), limits.output_bytes)
    kept = min(size, limits.output_bytes)
    output = join_cut(body, size - kept, limits.output_bytes)
    if problem:
        output += f"\n[{problem}]\n"
    files = shell = git = None
    if workspace is not None:
        files = manifest(
            os.path.join(root, workspace), limits.manifest_files, known, beneath=root, budget=HASH_BUDGET
        )
        saved_size, saved, problem = read_bounded(root, os.path.join(state, "env.sh"), SHELL_BYTES)
        shell = None if problem else join_cut(saved, saved_size - len(saved), SHELL_BYTES)
        directories = (path for path, entry in files.items() if entry.startswith("d ") and path != ".")
        git = git_state(root, workspace, directories)  # "." is the workspace's own entry, read as ""
    timed_out = exit_code == 137 and seconds >= timeout * 0.95
    return CommandResult(
        command, exit_code, strip_ansi(output), timed_out, size - kept, files, seconds, shell, git
    )
