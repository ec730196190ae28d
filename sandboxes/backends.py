"""Choosing and making a sandbox backend, the same way for every sandboxed domain (terminal, SWE).

`resolve_sandbox` turns a requested kind ("auto", "docker", "bwrap") into the backend this machine
can run; `make_backend` makes it on a base root filesystem, imported as a Docker image first for
Docker. Importing this module is light: the backends are imported when one is made.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from pivot_envs.errors import MissingExtraError, UnknownNameError

from .protocol import SandboxError, SandboxLimits

SANDBOXES = ("auto", "docker", "bwrap")


def resolve_sandbox(kind: str) -> str:
    """'docker' or 'bwrap' for a requested kind ("auto": Docker when its SDK is installed and a
    daemon answers, else bubblewrap); raises MissingExtraError without the Docker SDK for
    kind='docker', SandboxError saying how to install a backend when none is usable."""
    from .available import INSTALL_HELP, bwrap_available, docker_available

    if kind not in SANDBOXES:
        raise UnknownNameError("sandbox", kind, SANDBOXES)
    sdk = importlib.util.find_spec("docker") is not None
    if kind == "docker" and not sdk:
        raise MissingExtraError("sandbox='docker'", "docker", "docker")
    if kind in ("auto", "docker") and docker_available():
        return "docker"
    if kind == "docker":
        raise SandboxError(
            "sandbox='docker': the Docker daemon does not answer (is dockerd running?)\n" + INSTALL_HELP
        )
    if bwrap_available():
        return "bwrap"
    if kind == "bwrap":
        raise SandboxError(
            "sandbox='bwrap': bubblewrap is missing or cannot create namespaces here\n" + INSTALL_HELP
        )
    no_sdk = "" if sdk else "\n(The Docker SDK is not installed either: pip install 'pivot-envs[docker]'.)"
    raise SandboxError(INSTALL_HELP + no_sdk)


def make_backend(
    kind: str, limits: SandboxLimits | None, warm_pool: int, rootfs: Path, image_tag: str
) -> tuple[Any, str]:
    """A backend of `kind` ('docker' or 'bwrap', as `resolve_sandbox` returns) on the base root
    filesystem `rootfs`, with `limits` and `warm_pool` forks made ahead per snapshot.

    Docker runs the root filesystem imported as the image `image_tag` (imported now when missing).
    Returns (the backend, the base image's Docker tag; "" on bubblewrap).
    """
    if kind == "docker":
        from .docker_backend import DockerBackend
        from .image import import_image

        tag = import_image(rootfs, image_tag)
        return DockerBackend(limits, warm_pool=warm_pool), tag
    if kind == "bwrap":
        from .bwrap_backend import BwrapBackend

        return BwrapBackend(rootfs, limits, warm_pool=warm_pool), ""
    raise UnknownNameError("sandbox backend", kind, SANDBOXES[1:])
