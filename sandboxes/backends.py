"""Choosing and making a sandbox backend, the same way for every sandboxed domain (terminal, SWE).

`SandboxConfig` holds the options every sandboxed domain's env has (its config class extends it);
`resolve_sandbox` turns a requested kind ("auto", "docker", "bwrap") into the backend this machine
can run; `make_backend` makes it on a base root filesystem, imported as a Docker image first for
Docker; `SandboxedEnv` is the part of a sandboxed domain's env that does this on its first reset,
holds its prefix cache and current fork, and closes them. Importing this module is light: the
backends are imported when one is made.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pivot_envs.config import option
from pivot_envs.errors import MissingExtraError, UnknownNameError

from .protocol import SandboxError, SandboxLimits

SANDBOXES = ("auto", "docker", "bwrap")


@dataclass
class SandboxConfig:
    """The sandbox options of a sandboxed domain's env (terminal, SWE): its config class extends this one."""

    sandbox: str = option(
        "auto", "sandbox backend: auto (Docker when a daemon answers, else bubblewrap)", choices=SANDBOXES
    )
    prefix_cache: int = option(16, "prefix snapshots kept (least recently used evicted)")
    warm_pool: int = option(
        4, "forks made ahead per snapshot (Docker: started containers; bubblewrap: directory copies)"
    )
    build_image: bool = option(
        True, "build the base root filesystem/image when it is missing (needs root and debootstrap)"
    )


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

    Docker runs the root filesystem imported as the image `image_tag` (imported now when missing), its
    base for `new_sandbox`. Returns (the backend, the base image's Docker tag; "" on bubblewrap).
    """
    if kind == "docker":
        from .docker_backend import DockerBackend
        from .image import import_image

        tag = import_image(rootfs, image_tag)
        return DockerBackend(limits, warm_pool=warm_pool, base_image=tag), tag
    if kind == "bwrap":
        from .bwrap_backend import BwrapBackend

        return BwrapBackend(rootfs, limits, warm_pool=warm_pool), ""
    raise UnknownNameError("sandbox backend", kind, SANDBOXES[1:])


class SandboxedEnv:
    """What the sandboxed domains' envs (terminal, SWE) share: the backend chosen and made on first use,
    with the base image and the domain's prefix cache; the fork of the current sample; closing all.

    An env using it has `config` (a `SandboxConfig`), `limits`, and says which base image it runs on
    (`base_image`) and how to make its prefix cache (`make_prefixes`). `backend`, `prefixes` and
    `sandbox` are None until first use.
    """

    config: SandboxConfig
    limits: SandboxLimits
    backend: Any = None
    prefixes: Any = None
    sandbox: Any = None
    _sandbox_kind: str | None = None

    def base_image(self) -> tuple[Path, str]:
        """The root filesystem the env's sandboxes start from, and its Docker image's tag (built if asked)."""
        raise NotImplementedError

    def make_prefixes(self, rootfs: Path, docker_base: str) -> Any:
        """The env's prefix cache on `self.backend` (`docker_base`: the base image's Docker tag, "" on bubblewrap)."""
        raise NotImplementedError

    @property
    def sandbox_kind(self) -> str:
        """'docker' or 'bwrap': chosen on first use (see `resolve_sandbox`), not when the env is made."""
        if self._sandbox_kind is None:
            self._sandbox_kind = resolve_sandbox(self.config.sandbox)
        return self._sandbox_kind

    def _ensure_backend(self) -> None:
        """Choose the backend and make it, with the base image and the prefix cache, on first use."""
        if self.backend is not None:
            return
        rootfs, image_tag = self.base_image()
        self.backend, tag = make_backend(
            self.sandbox_kind, self.limits, self.config.warm_pool, rootfs, image_tag
        )
        self.prefixes = self.make_prefixes(rootfs, tag)

    def _fork_state(self, pivot_id: str, state: Any) -> Any:
        """Fork the sample's sandbox from a replayable prefix `state` into `self.sandbox`; returns the state,
        marked not replayable (with the reason) when the fork fails."""
        if state.replayable:
            try:
                self.sandbox = self.backend.fork(state.snapshot)
            except SandboxError as error:
                return dataclasses.replace(
                    state, replayable=False, reason=f"pivot {pivot_id}: fork failed: {error}"
                )
        return state

    def _close_fork(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None

    def _close_sandboxes(self) -> None:
        """Remove every sandbox, snapshot, container and image this env made (and nothing of another env's)."""
        self._close_fork()
        if self.prefixes is not None:
            self.prefixes.clear()
        if self.backend is not None:
            self.backend.close()
            self.backend = None
            self.prefixes = None
