"""A process that exits cleanly leaves no cgroup behind: neither its sandboxes' cgroups nor the
`pivot-envs-<pid>` parents they lived in, whether it closed its backend or left it to the
finalizers that run at exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pivot_envs.sandboxes import cgroups

SCRIPT = """
import os, sys
from pivot_envs.sandboxes import SandboxLimits, cgroups
from pivot_envs.sandboxes.bwrap_backend import BwrapBackend

backend = BwrapBackend(sys.argv[1], SandboxLimits(timeout=3.0), warm_pool=0)
sandboxes = [backend.create("/app") for _ in range(2)]
for sandbox in sandboxes:
    sandbox.run("true")
print(os.getpid(), *cgroups.hierarchy().parents, sep="\\n", flush=True)
if sys.argv[2] == "close":
    backend.close()
"""


@pytest.mark.parametrize("ending", ["close", "exit"], ids=["backend closed", "left to the finalizers"])
def test_a_clean_exit_leaves_no_cgroup_parent_behind(has_bwrap, ending):
    if not cgroups.available():
        pytest.skip(f"no cgroup for bubblewrap sandboxes here: {cgroups.hierarchy()}")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(has_bwrap), ending], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    pid, *parents = done.stdout.split()
    assert parents and all(parent.endswith(f"{cgroups.PREFIX}{pid}") for parent in parents)
    left = [parent for parent in parents if Path(parent).exists()]
    assert left == [], f"cgroup parents left after a clean exit: {left}"
