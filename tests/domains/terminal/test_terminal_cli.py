"""`pivotrl sandbox build-image` and `pivotrl sandbox gc`."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pivot_envs.cli import main
from pivot_envs.domains.terminal.image import image_tag
from pivot_envs.sandboxes.cleanup import BWRAP_PREFIX, LABEL
from pivot_envs.sandboxes.docker_backend import DockerBackend


def test_build_image_is_idempotent_and_fast_when_built(has_docker, capsys):
    start = time.monotonic()
    assert main(["sandbox", "build-image"]) == 0
    assert time.monotonic() - start < 30
    assert image_tag() in capsys.readouterr().out


def test_gc_removes_what_a_dead_process_left_behind(has_docker, has_bwrap):
    import docker

    # A child process makes a container, a snapshot image and a bubblewrap directory, then dies without closing.
    code = (
        "import os, subprocess\n"
        "from pivot_envs.sandboxes.docker_backend import DockerBackend\n"
        "from pivot_envs.sandboxes.bwrap_backend import BwrapBackend\n"
        "from pivot_envs.domains.terminal.image import image_tag, rootfs_path\n"
        "d = DockerBackend(warm_pool=0); s = d.create(image_tag(), '/app'); s.snapshot()\n"
        "b = BwrapBackend(rootfs_path()); sb = b.create('/app')\n"
        # A sandbox that outlives its owner (as one does when the owner dies while its bwrap starts,
        # before the parent-death signal is armed): the same bwrap without --die-with-parent.
        "argv = [a for a in b.argv(sb.directory, '/app', ['sleep', '1000']) if a != '--die-with-parent']\n"
        "subprocess.Popen([*b._drop, *argv], start_new_session=True,\n"
        "                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(d.owner, b.root, flush=True)\n"
        "os._exit(0)\n"
    )
    owner, root = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    client = docker.from_env()
    mine = {"label": [f"pivot-envs.owner={owner}"]}
    assert client.containers.list(all=True, filters=mine) and Path(root).exists() and _processes_using(root)
    live = DockerBackend(warm_pool=0)
    live_sandbox = live.create(image_tag(), "/app")
    assert main(["sandbox", "gc"]) == 0
    assert client.containers.list(all=True, filters=mine) == []
    assert client.images.list(filters=mine) == []
    assert not Path(root).exists()
    deadline = time.monotonic() + 5  # SIGKILLed processes exit asynchronously
    while _processes_using(root) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_using(root)  # the dead process's bubblewrap sandbox was killed
    assert live_sandbox.run("echo still-here").output == "still-here\n"  # a live process's sandboxes stay
    live.close()
    assert client.images.list(filters={"label": [f"{LABEL}=base"]})  # the base image stays without --base
    assert not list(Path(tempfile.gettempdir()).glob(f"{BWRAP_PREFIX}{owner.split(':')[1]}-*"))


def test_a_process_that_never_closes_its_backends_leaves_nothing_at_exit(has_docker, has_bwrap):
    import docker

    code = (
        "from pivot_envs.sandboxes.docker_backend import DockerBackend\n"
        "from pivot_envs.sandboxes.bwrap_backend import BwrapBackend\n"
        "from pivot_envs.domains.terminal.image import image_tag, rootfs_path\n"
        "d = DockerBackend(warm_pool=1); s = d.create(image_tag(), '/app'); d.fork(s.snapshot())\n"
        "b = BwrapBackend(rootfs_path()); b.create('/app')\n"
        "print(d.owner, b.root, d.root, flush=True)\n"
    )
    owner, bwrap_root, docker_root = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    client = docker.from_env()
    mine = {"label": [f"pivot-envs.owner={owner}"]}
    assert client.containers.list(all=True, filters=mine) == []
    assert client.images.list(filters=mine) == []
    assert not Path(bwrap_root).exists() and not Path(docker_root).exists()


def _processes_using(root: str) -> list[int]:
    """Live processes whose command line names `root` (a bubblewrap sandbox's directories)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and root.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found
