"""Bubblewrap sandboxes leave no zombie behind where the host's PID 1 does not reap orphans.

Many containers (CI jobs, `python train.py` as a pod's PID 1) have a PID 1 that never reaps a
process it inherits: an orphan stays a zombie for good, holding a PID and counting against the
user's process limit. The workload runs in a PID namespace of its own under such a PID 1, which
then counts the zombies it was left.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

# PID 1 of the new namespace: runs the workload as its child and never reaps anything else.
PID_1 = r"""
import os, subprocess, sys
code = subprocess.run(sys.argv[1:]).returncode
zombies = []
for entry in os.listdir("/proc"):
    try:
        fields = open(f"/proc/{entry}/stat", "rb").read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        continue
    if fields[0] == b"Z":
        zombies.append(entry)
print("zombies", len(zombies), flush=True)
sys.exit(code)
"""

# Every way a sandbox ends that does not involve a command killing the command server: plain
# commands, a time limit, the disk limit, forks from a snapshot (warm ones included), an
# interactive shell, and closing the backend with warm forks still pooled.
WORKLOAD = r"""
import sys
from pivot_envs.sandboxes import SandboxLimits
from pivot_envs.sandboxes.available import bwrap_available
from pivot_envs.sandboxes.bwrap_backend import BwrapBackend
from pivot_envs.sandboxes.shell import InteractiveShell

assert bwrap_available()
backend = BwrapBackend(sys.argv[1], SandboxLimits(timeout=1.0, disk_mb=20), warm_pool=3)
sandbox = backend.create("/app")
assert sandbox.run("echo hi > f").exit_code == 0
assert sandbox.run("sleep 30").timed_out
assert sandbox.run("head -c 50M /dev/zero > big; sleep 5").exit_code == 137
snapshot = sandbox.snapshot()
for _ in range(6):
    fork = backend.fork(snapshot)
    assert fork.run("cat f").output == "hi\n"
    fork.close()
shell = InteractiveShell(backend.fork(snapshot).interactive_argv(), timeout=10)
assert shell.run("echo typed").output.strip() == "typed"
shell.close()
sandbox.close()
backend.close()
print("workload done", flush=True)
"""


def test_no_sandbox_leaves_a_zombie_where_pid_1_does_not_reap(has_bwrap, tmp_path):
    probe = ["unshare", "--pid", "--fork", "--mount-proc", "true"]
    if (
        os.geteuid() != 0
        or shutil.which("unshare") is None
        or subprocess.run(probe, capture_output=True).returncode
    ):
        pytest.skip(
            "needs root allowed to make PID namespaces (util-linux's unshare) for a non-reaping PID 1"
        )
    pid_1 = tmp_path / "pid_1.py"
    pid_1.write_text(PID_1)
    done = subprocess.run(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            sys.executable,
            str(pid_1),
            sys.executable,
            "-c",
            WORKLOAD,
            str(has_bwrap),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "workload done" in done.stdout, done.stdout + done.stderr[-2000:]
    assert "zombies 0" in done.stdout, done.stdout
