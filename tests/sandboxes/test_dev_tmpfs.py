"""bubblewrap's /dev is a tmpfs (half the host's memory) that no per-process limit counts: without a cgroup (a
host that is not root, or has no writable hierarchy) a sandbox with memory_mb=256 kept 480 MB of host memory in
/dev/shm for its life. /dev/shm now holds at most memory_mb and the rest of /dev is read-only."""

from __future__ import annotations

import pivot_envs.sandboxes.bwrap_backend as bwrap_backend
from pivot_envs.sandboxes import SandboxLimits


def test_without_a_cgroup_dev_holds_at_most_the_memory_limit(has_bwrap, monkeypatch):
    monkeypatch.setattr(bwrap_backend, "sandbox_cgroup", lambda limits: None)  # what a non-root host gets
    backend = bwrap_backend.BwrapBackend(has_bwrap, SandboxLimits(timeout=20.0, memory_mb=64))
    try:
        sandbox = backend.new_sandbox("/app")
        result = sandbox.run(
            "for i in 1 2 3 4; do head -c 40M /dev/zero > /dev/shm/f$i 2>/dev/null; done; du -sm /dev/shm;"
            " touch /dev/elsewhere 2>&1; echo x > /dev/null && echo null-writes"
        )
        held, *rest = result.output.splitlines()
        assert int(held.split()[0]) <= 64, result.output
        assert "Read-only file system" in rest[0] and rest[-1] == "null-writes", result.output
    finally:
        backend.close()
