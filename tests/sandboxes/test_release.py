"""Releasing a snapshot (a prefix state evicted from the cache) frees what it holds at once, also when a
warm fork of it is being made at that moment or a live fork still uses it: nothing waits for close()."""

from __future__ import annotations

import threading
import time

import pytest
from sandbox_fixtures import FAST_LIMITS

from pivot_envs.domains.terminal import image
from pivot_envs.sandboxes.bwrap_backend import BwrapBackend
from pivot_envs.sandboxes.docker_backend import DockerBackend


def eventually(condition, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def a_snapshot(backend):
    """A snapshot of a sandbox whose workspace holds f ("hi"); the sandbox is closed."""
    sandbox = backend.create(image.image_tag(), "/app") if backend.name == "docker" else backend.create()
    sandbox.run("echo hi > f")
    snapshot = sandbox.snapshot()
    sandbox.close()
    return snapshot


def held_start(backend, method: str) -> tuple[threading.Event, threading.Event, list]:
    """Make the backend's `method` (what a warm fork starts with) stop after it has started one, until `go`."""
    started, go, made = threading.Event(), threading.Event(), []
    original = getattr(backend, method)

    def start(*args):
        result = original(*args)
        made.append((args, result))
        started.set()
        go.wait(30)
        return result

    setattr(backend, method, start)
    return started, go, made


def test_bwrap_a_snapshot_released_while_its_warm_fork_starts_leaves_no_sandbox(has_bwrap):
    with BwrapBackend(has_bwrap, FAST_LIMITS, warm_pool=1) as backend:
        snapshot = a_snapshot(backend)
        started, go, made = held_start(backend, "start_server")
        backend.prewarm(snapshot)
        assert started.wait(30)
        backend.release(snapshot)
        go.set()
        (directory, _), server = made[0]
        # the warm fork is killed and deleted now, not kept in a pool nobody reads until close()
        assert eventually(lambda: not server.alive() and not directory.exists())
        assert snapshot.ref not in backend._pools


@pytest.fixture
def docker_backend(has_docker):
    backend = DockerBackend(FAST_LIMITS, warm_pool=1)
    yield backend
    backend.close()


def exists(backend: DockerBackend, kind: str, ref: str) -> bool:
    import docker

    try:
        (backend.client.images if kind == "image" else backend.client.containers).get(ref)
        return True
    except docker.errors.NotFound:
        return False


def test_docker_a_snapshot_released_while_its_warm_container_starts_leaves_no_container_or_image(
    docker_backend,
):
    backend = docker_backend
    snapshot = a_snapshot(backend)
    started, go, made = held_start(backend, "_start")
    backend.prewarm(snapshot)
    assert started.wait(30)
    backend.release(snapshot)
    assert exists(backend, "image", snapshot.ref)  # the warm container being started still uses it
    go.set()
    _, (container, _) = made[0]
    assert eventually(lambda: not exists(backend, "container", container.id))
    assert eventually(lambda: not exists(backend, "image", snapshot.ref))


def test_docker_a_released_snapshots_image_goes_when_its_last_fork_closes(docker_backend):
    backend = docker_backend
    backend.warm_pool = 0
    snapshot = a_snapshot(backend)
    fork = backend.fork(snapshot)
    backend.release(snapshot)
    assert exists(backend, "image", snapshot.ref)  # a live fork runs on it
    assert fork.run("cat f").output == "hi\n"
    fork.close()
    assert eventually(lambda: not exists(backend, "image", snapshot.ref))
