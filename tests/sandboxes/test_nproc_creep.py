"""Without a cgroup (a host that is not root, or has no writable hierarchy) a bubblewrap sandbox's
process limit was RLIMIT_NPROC set per command to `processes` above the count of the host user's
processes: what each command left running (`setsid`, double forks) raised the next command's limit,
so 20 commands of a sandbox with processes=64 left 1,000 processes on the host. The kernel (5.14 and
later) counts RLIMIT_NPROC per user namespace, so each sandbox now gets a fixed ceiling on its own
processes, which what earlier commands left running counts against, and other sandboxes do not."""

from __future__ import annotations

import os
import time

import pytest

import pivot_envs.sandboxes.bwrap_backend as bwrap_backend
from pivot_envs.sandboxes import SandboxLimits, cgroups
from pivot_envs.sandboxes.processes import child_pids, nproc_per_namespace

PROCESSES = 16
# Forks up to 20 sleepers in sessions of their own (they outlive the command); a refused fork fails
# at once in Python (bash would retry it for 15 s).
LEAVE = """python3 -c '
import os
left = 0
for _ in range(20):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.setsid()
        os.execvp("sleep", ["sleep", "1000"])
    left += 1
print("left", left)
'"""


def namespace_of(sandbox) -> str:
    """The sandbox's PID namespace (its init's, bwrap's child)."""
    return os.readlink(f"/proc/{child_pids(sandbox.server.process.pid)[0]}/ns/pid")


def processes_in(namespace: str) -> int:
    """How many processes a PID namespace holds, counted from the host."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                count += os.readlink(f"/proc/{entry.name}/ns/pid") == namespace
            except OSError:
                continue
    return count


def left(result) -> int:
    return int(result.output.split()[-1])


def uncgrouped_backend(bwrap, monkeypatch) -> bwrap_backend.BwrapBackend:
    """A bubblewrap backend whose sandboxes get no cgroup, as on a host that is not root."""
    if not nproc_per_namespace():
        pytest.skip("this kernel counts RLIMIT_NPROC per host user, not per user namespace (before 5.14)")
    monkeypatch.setattr(bwrap_backend, "sandbox_cgroup", lambda limits: None)
    return bwrap_backend.BwrapBackend(bwrap, SandboxLimits(timeout=10.0, processes=PROCESSES), warm_pool=0)


def test_what_commands_leave_running_counts_against_one_fixed_ceiling_per_sandbox(has_bwrap, monkeypatch):
    backend = uncgrouped_backend(has_bwrap, monkeypatch)
    ceiling = PROCESSES + cgroups.INFRASTRUCTURE_PROCESSES
    try:
        sandbox, other = backend.new_sandbox("/app"), backend.new_sandbox("/app")
        first = sandbox.run(LEAVE)
        assert first.exit_code == 0 and left(first) > 10, first.output  # background processes may stay
        for _ in range(4):
            time.sleep(0.3)  # past the host's process count cache (0.25 s): each command saw the last's
            sandbox.run(LEAVE)
        namespace = namespace_of(sandbox)
        held = processes_in(namespace)
        assert left(first) <= held <= ceiling, held  # before: 80 and more (20 per command)
        # The sandbox still answers, and the other sandbox's ceiling is its own: this one's
        # processes take nothing from it.
        assert sandbox.run("echo ok").output.strip() == "ok"
        assert left(other.run(LEAVE)) == left(first)
        assert processes_in(namespace_of(other)) <= ceiling
    finally:
        backend.close()
    deadline = time.monotonic() + 5  # closing kills the namespace; its processes are reaped soon after
    while processes_in(namespace) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_in(namespace) == 0


def test_the_keystroke_shell_is_held_to_the_same_ceiling_without_a_cgroup(has_bwrap, monkeypatch):
    """Keystroke actions run in an interactive bash that the runner does not start, so its `ulimit -u`
    never applied: without a cgroup, forks from the keystroke shell were bounded by nothing. The
    shell now sets the runner's RLIMIT_NPROC inside the sandbox's user namespace before it starts."""
    from pivot_envs.sandboxes.shell import InteractiveShell

    backend = uncgrouped_backend(has_bwrap, monkeypatch)
    ceiling = PROCESSES + cgroups.INFRASTRUCTURE_PROCESSES
    try:
        sandbox = backend.new_sandbox("/app")
        shell = InteractiveShell(sandbox.interactive_argv())
        try:
            assert shell.run("ulimit -u", timeout=10).output.split()[-1] == str(ceiling)
            namespace = os.readlink(f"/proc/{child_pids(shell.child.pid)[0]}/ns/pid")  # its bwrap's
            assert namespace != namespace_of(sandbox)
            for _ in range(3):
                shell.run(LEAVE, timeout=20)  # 60 sleepers asked for
            held = processes_in(namespace)
            assert held <= ceiling, held  # before: 60 sleepers and the shells
            assert shell.run("echo alive", timeout=10).output.strip() == "alive"
        finally:
            shell.close()
    finally:
        backend.close()
