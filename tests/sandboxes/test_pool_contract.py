"""The backend contract (`pivot_envs.sandboxes.pool`) on both real backends: `new_sandbox` makes a fresh
sandbox on the backend's base (or, on Docker, another image) the same way on both; a backend belongs
to the process that made it (a forked child shares no warm sandbox with it, and the child's close or
exit leaves the parent's sandboxes alone), and closing it twice is safe."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from sandbox_fixtures import FAST_LIMITS
from test_release import a_snapshot

from pivot_envs.domains.terminal import image
from pivot_envs.sandboxes import Sandbox, SandboxError
from pivot_envs.sandboxes.backends import make_backend
from pivot_envs.sandboxes.pool import ImageUnavailableError, SandboxBackend


def test_both_backends_keep_the_backend_contract_and_hand_out_sandboxes(backend):
    snapshot = a_snapshot(backend)
    fork = backend.fork(snapshot)
    assert isinstance(backend, SandboxBackend)
    assert isinstance(fork, Sandbox)
    assert fork.run("cat f").output == "hi\n"
    fork.close()


def test_new_sandbox_starts_an_empty_workspace_on_the_base_image_of_either_backend(kind, rootfs):
    made, _ = make_backend(kind, FAST_LIMITS, 0, rootfs, image.image_tag())
    with made:
        sandbox = made.new_sandbox("/work")
        assert isinstance(sandbox, Sandbox)
        # The base image's packages are there, the workspace is the named directory and empty.
        result = sandbox.run("pwd; ls -A | wc -l; command -v jq")
        assert result.ok and result.output.split() == ["/work", "0", "/usr/bin/jq"], result.output
        sandbox.run("echo hi > f")
        fork = made.fork(sandbox.snapshot())
        assert fork.run("cat f").output == "hi\n"
        fork.close()
        sandbox.close()


def test_new_sandbox_names_an_image_on_docker_and_bubblewrap_refuses_one(kind, rootfs):
    made, tag = make_backend(kind, FAST_LIMITS, 0, rootfs, image.image_tag())
    with made:
        if kind == "docker":
            # Another local image by name (here the base's own tag); a missing one is not pulled.
            named = made.new_sandbox("/app", tag)
            assert named.run("pwd").output.strip() == "/app"
            named.close()
            with pytest.raises(SandboxError, match="not available locally") as missing:
                made.new_sandbox("/app", "pivot-envs/no-such-image:0")
            assert not isinstance(missing.value, ImageUnavailableError)
        else:
            with pytest.raises(ImageUnavailableError, match="runs on Docker only"):
                made.new_sandbox("/app", "python:3.12")


def test_a_docker_backend_made_without_a_base_image_asks_for_one(has_docker):
    from pivot_envs.sandboxes.docker_backend import DockerBackend

    with DockerBackend(FAST_LIMITS, warm_pool=0) as made:
        with pytest.raises(SandboxError, match="no base image"):
            made.new_sandbox("/app")
        named = made.new_sandbox("/app", has_docker)
        assert named.run("true").ok
        named.close()


def test_closing_a_backend_twice_is_safe_and_a_closed_sandbox_refuses_commands(backend):
    snapshot = a_snapshot(backend)
    fork = backend.fork(snapshot)
    fork.close()
    fork.close()
    backend.close()
    backend.close()
    assert backend.closed
    with pytest.raises(SandboxError, match="closed"):
        fork.run("true")


def test_a_forked_process_gets_no_warm_sandbox_of_its_parent(backend):
    backend.warm_pool = 1
    snapshot = a_snapshot(backend)
    backend.prewarm(snapshot)
    assert backend.wait_warm(snapshot, timeout=120)
    pid = os.fork()
    if pid == 0:  # the child: a fork of its own, then its own close
        code = 3
        try:
            signal.alarm(120)  # a child stuck on its parent's pool must not hang the suite
            fork = backend.fork(snapshot)
            read = fork.run("cat f; echo child > mark")
            fork.close()
            backend.close()
            code = 0 if read.output == "hi\n" else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's warm sandbox was not the child's: the child's write is not in it, and it still runs.
    fork = backend.fork(snapshot)
    assert fork.run("cat mark 2>/dev/null; cat f").output == "hi\n"
    fork.close()


CHILD_EXITS = """
import os, sys
from pivot_envs.sandboxes import SandboxLimits
kind, rootfs, tag = sys.argv[1:4]
if kind == "bwrap":
    from pivot_envs.sandboxes.bwrap_backend import BwrapBackend
    backend = BwrapBackend(rootfs, SandboxLimits(timeout=3.0))
    sandbox = backend.create()
else:
    from pivot_envs.sandboxes.docker_backend import DockerBackend
    backend = DockerBackend(SandboxLimits(timeout=3.0), warm_pool=0)
    sandbox = backend.create(tag, "/app")
sandbox.run("echo kept > f")
pid = os.fork()
if pid == 0:
    sys.exit(0)  # the child's interpreter exits normally: its exit handlers and finalizers run
os.waitpid(pid, 0)
print(sandbox.run("cat f").output.strip())
backend.close()
"""


def test_a_forked_childs_exit_leaves_the_parents_sandboxes_running(kind, rootfs):
    tag = image.import_image(rootfs, image.image_tag()) if kind == "docker" else ""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD_EXITS), kind, str(rootfs), tag],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "kept"
