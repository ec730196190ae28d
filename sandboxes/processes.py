"""The host processes behind a bubblewrap sandbox: the user it drops to, the limits and cgroup set
before it starts, the bwrap running its command server, and killing what it runs."""

from __future__ import annotations

import functools
import logging
import os
import platform
import re
import shutil
import subprocess
import time
from pathlib import Path

from . import cgroups
from .cgroups import SandboxCgroup
from .channel import Channel
from .protocol import SandboxLimits
from .runner import SERVER

logger = logging.getLogger(__name__)

NOBODY = 65534


@functools.lru_cache(maxsize=1)
def default_signals_argv() -> tuple[str, ...]:
    """`env --default-signal` (coreutils 8.31+) where the host has it, to start a sandbox's server
    with every signal at its default action: signals the host process ignores (SIGINT and SIGQUIT
    in any job a script starts in the background) would otherwise stay ignored in every command
    of the sandbox. (subprocess already clears the blocked mask.)"""
    try:
        works = (
            subprocess.run(["env", "--default-signal", "true"], capture_output=True, timeout=10).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        works = False
    return ("env", "--default-signal") if works else ()


def host_environment() -> dict[str, str]:
    """The environment of the host processes that start a sandbox (setpriv, prlimit, bwrap): PATH
    only. bwrap stays the sandbox's PID 1, whose /proc/1/environ every command can read, so the
    trainer's or server's variables (API keys, tokens) must never reach it."""
    return {"PATH": os.environ.get("PATH", os.defpath)}


def drop_privileges() -> list[str]:
    """The argv prefix that runs a sandbox as `nobody` when this process is root (setpriv), else none."""
    # Root is exempt from RLIMIT_NPROC; running the sandbox as `nobody` makes the limit real.
    if os.geteuid() == 0 and shutil.which("setpriv"):
        return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    return []


def hard_limits(limits: SandboxLimits) -> list[str]:
    """A `prlimit` argv prefix that sets the file-size and address-space limits, soft and hard, on
    the sandbox's first process: set by the host before the sandbox exists, so nothing a command
    sends can raise them (the runner's per-command ulimits can only lower them further)."""
    if not shutil.which("prlimit"):
        return []
    file_bytes, memory_bytes = limits.file_mb << 20, limits.memory_mb << 20
    return ["prlimit", f"--fsize={file_bytes}:{file_bytes}", f"--as={memory_bytes}:{memory_bytes}", "--"]


def sandbox_cgroup(limits: SandboxLimits) -> SandboxCgroup | None:
    """A cgroup bounding the whole sandbox's memory and processes, or None where none can be made
    (not root, no writable hierarchy: the rlimits stay the limits; cgroups.hierarchy logs why, once)."""
    if not cgroups.available():
        return None
    try:
        return SandboxCgroup(limits.memory_mb << 20, limits.processes + cgroups.INFRASTRUCTURE_PROCESSES)
    except OSError as error:
        logger.warning("bubblewrap sandbox without a cgroup: %s", error)
        return None


class BwrapServer:
    """A sandbox's bwrap process running the command server, and its channel directory."""

    def __init__(
        self, process: subprocess.Popen, channel: Channel, cgroup: SandboxCgroup | None = None
    ) -> None:
        self.process = process
        self.channel = channel
        self.cgroup = cgroup

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill_request(self) -> None:
        """Kill the process group of the request the server is running (the time limit)."""
        for init in child_pids(self.process.pid):
            for shell in child_pids(init):
                if cmdline(shell).startswith(b"bash\0-c\0" + SERVER.encode()[:40]):
                    for job in child_pids(shell):  # each request runs in a process group of its own (set -m)
                        try:
                            os.killpg(job, 9)
                        except (ProcessLookupError, PermissionError):
                            continue

    def kill(self) -> None:
        """Kill the sandbox's PID namespace, so every process in it; the bwrap then exits by itself."""
        # Killing the namespace's init (bwrap's child) lets bwrap reap it and exit: killing bwrap
        # instead would leave the init to the host's PID 1 (a zombie there, or a live sandbox if
        # bwrap was killed before the init armed its parent-death signal).
        deadline = time.monotonic() + 2.0
        while self.process.poll() is None:
            if kill_children(self.process.pid):
                return
            if time.monotonic() > deadline:  # no namespace yet after 2 s: bwrap is stuck starting
                self.process.kill()
                return
            time.sleep(0.001)

    def stop(self) -> None:
        """Kill the sandbox, reap its bwrap and drop the channel."""
        self.kill()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.cgroup is not None:
            self.cgroup.remove()
        self.channel.close()


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def kill_children(pid: int) -> bool:
    """SIGKILL the children of `pid` (of a bwrap: its namespace's init, so the whole sandbox, and
    bwrap then reaps it and exits); whether it had any."""
    children = child_pids(pid)
    for child in children:
        try:
            os.kill(child, 9)
        except ProcessLookupError:
            pass
    return bool(children)


def child_pids(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@functools.lru_cache(maxsize=1)
def nproc_per_namespace() -> bool:
    """Whether the kernel counts RLIMIT_NPROC per user namespace (Linux 5.14 and later, where the
    count lives in the namespace's ucounts): each sandbox is a user namespace of its own, so its
    limit then counts its own processes alone, not those of every sandbox of the same host user."""
    found = re.match(r"(\d+)\.(\d+)", platform.release())
    return found is not None and (int(found[1]), int(found[2])) >= (5, 14)


def process_limit(limits: SandboxLimits, uid: int) -> int:
    """The RLIMIT_NPROC each command of a sandbox runs under (the runner's `ulimit -u`).

    Where the kernel counts per user namespace: a fixed ceiling on the sandbox's own processes,
    `processes` + the infrastructure's (as its cgroup's), which whatever earlier commands left
    running counts against. It used to be `processes` above the count of `uid`'s processes when
    the command started, so what each command left running raised the next one's limit: without a
    cgroup, 20 commands of a sandbox with processes=64 left 1,000 processes. Older kernels count
    every process of `uid` on the host (every sandbox's): there the limit stays `processes` above
    that count, and only a cgroup bounds what commands leave running."""
    if nproc_per_namespace():
        return limits.processes + cgroups.INFRASTRUCTURE_PROCESSES
    return user_process_count(uid) + limits.processes


_COUNTS: dict[int, tuple[float, int]] = {}


def user_process_count(uid: int, max_age: float = 0.25) -> int:
    """How many processes `uid` runs (RLIMIT_NPROC counts them all); a count up to `max_age` s old is reused."""
    now = time.monotonic()
    cached = _COUNTS.get(uid)
    if cached is not None and now - cached[0] < max_age:
        return cached[1]
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += 1
            except OSError:
                continue
    _COUNTS[uid] = (now, count)
    return count
