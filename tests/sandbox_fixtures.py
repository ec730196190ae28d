"""Sandbox fixtures the sandboxes' and the terminal domain's tests share (their conftests import
them): real sandboxes (bubblewrap and Docker) on the terminal domain's base image.

Every test that needs a sandbox asks for one of `rootfs`, `has_bwrap`, `has_docker`, `kind`,
`backend` or `sandbox`: a missing part is then a skip with the reason (a failure under CI=true,
see tests/conftest.py), never an error. Build the image with `sudo pivotrl sandbox build-image`,
start dockerd for the Docker tests.
"""

from __future__ import annotations

import importlib.util

import pytest

from pivot_envs.domains.terminal import image
from pivot_envs.sandboxes import SandboxLimits
from pivot_envs.sandboxes.available import bwrap_available, docker_available
from pivot_envs.sandboxes.bwrap_backend import BwrapBackend
from pivot_envs.sandboxes.docker_backend import DockerBackend

FAST_LIMITS = SandboxLimits(timeout=3.0)


@pytest.fixture(scope="session")
def rootfs():
    path = image.rootfs_path()
    if not image.rootfs_ready(path):
        pytest.skip(f"base root filesystem {path} is not built: run `sudo pivotrl sandbox build-image`")
    return path


@pytest.fixture(scope="session")
def has_bwrap(rootfs):
    if not bwrap_available():
        pytest.skip("bubblewrap is not installed or cannot create namespaces (apt-get install bubblewrap)")
    return rootfs


@pytest.fixture(scope="session")
def has_docker(rootfs):
    if importlib.util.find_spec("docker") is None:
        pytest.skip("the Docker SDK is not installed: pip install 'pivot-envs[docker]'")
    if not docker_available():
        pytest.skip("no Docker daemon answers (start dockerd: `make setup` does)")
    return image.import_image(rootfs, image.image_tag())


@pytest.fixture(params=["bwrap", "docker"])
def kind(request):
    """Each sandbox kind in turn ("bwrap", "docker"), skipped with the reason where it is missing."""
    request.getfixturevalue("has_bwrap" if request.param == "bwrap" else "has_docker")
    return request.param


@pytest.fixture(params=["bwrap", "docker"])
def backend(request):
    """A fresh backend of each kind, closed (everything it made removed) after the test."""
    if request.param == "bwrap":
        made = BwrapBackend(request.getfixturevalue("has_bwrap"), FAST_LIMITS)
    else:
        made = DockerBackend(FAST_LIMITS, warm_pool=0, base_image=request.getfixturevalue("has_docker"))
    yield made
    made.close()


@pytest.fixture
def sandbox(backend):
    """A fresh sandbox on the base image, with /app as its workspace."""
    return backend.new_sandbox("/app")
