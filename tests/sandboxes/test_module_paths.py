"""Where the sandboxes live: `pivot_envs.sandboxes`, outside the core; the old paths still work."""

from __future__ import annotations

import pickle
import subprocess
import sys

import gymnasium as gym
import pytest
from pivot_envs.sandboxes import SandboxLimits
from pivot_envs.sandboxes.bwrap_backend import BwrapBackend
from pivot_envs.sandboxes.cleanup import gc
from pivot_envs.sandboxes.docker_backend import DockerBackend

import pivot_envs

gym.register_envs(pivot_envs)


def test_importing_the_core_does_not_import_the_sandboxes():
    code = "import sys, pivot_envs; print(sorted(m for m in sys.modules if 'sandbox' in m))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_old_core_module_still_gives_sandbox_limits_and_warns_naming_the_new_path(monkeypatch):
    monkeypatch.delitem(sys.modules, "pivot_envs.sandbox", raising=False)
    with pytest.warns(DeprecationWarning, match=r"import from pivot_envs\.sandboxes") as warned:
        import pivot_envs.sandbox as old
    assert warned[0].filename == __file__  # the warning points at the importing line
    assert old.SandboxLimits is SandboxLimits
    env = gym.make("pivot/terminal-v0", sandbox="bwrap", limits=old.SandboxLimits(timeout=2.5, disk_mb=64))
    try:
        assert (env.unwrapped.limits.timeout, env.unwrapped.limits.disk_mb) == (2.5, 64)
    finally:
        env.close()


def test_the_old_terminal_backends_module_still_gives_the_backends_and_warns_naming_the_new_path(monkeypatch):
    monkeypatch.delitem(sys.modules, "pivot_envs.domains.terminal.backends", raising=False)
    with pytest.warns(DeprecationWarning, match=r"import from pivot_envs\.sandboxes\.bwrap_backend"):
        import pivot_envs.domains.terminal.backends as old
    assert (old.BwrapBackend, old.DockerBackend, old.gc) == (BwrapBackend, DockerBackend, gc)
    assert (old.LABEL, old.OWNER_LABEL, old.BWRAP_PREFIX) == (
        "pivot-envs",
        "pivot-envs.owner",
        "pivot-envs-bwrap-",
    )


def test_sandbox_limits_pickled_under_the_old_module_path_still_load():
    # Protocol 0 names the class's module as text: what a pickle made before the move holds.
    old = pickle.dumps(SandboxLimits(timeout=2.5), protocol=0).replace(
        b"pivot_envs.sandboxes.protocol\n", b"pivot_envs.sandbox\n"
    )
    assert b"pivot_envs.sandbox\n" in old
    assert pickle.loads(old) == SandboxLimits(timeout=2.5)
