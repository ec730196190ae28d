"""The terminal domain's base image: a Debian root filesystem with the packages the bundled tasks
use, imported into Docker (built by `pivot_envs.sandboxes.image`).

The root filesystem is kept in `<cache>/terminal/rootfs-<key>` and the image tagged
`pivot-envs/terminal-base:<key>`, the key a hash of the suite and the package list.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from pivot_envs.config import option
from pivot_envs.sandboxes.available import docker_available
from pivot_envs.sandboxes.image import (
    apt_mirror,
    cache_dir,
    cannot_build,
    docker_image_exists,
    image_key,
    import_image,
    rootfs_ready,
)
from pivot_envs.sandboxes.image import build_rootfs as build_debian_rootfs
from pivot_envs.sandboxes.protocol import SandboxError

logger = logging.getLogger(__name__)

# The generic steps are part of this module's interface (the set-up script and tests use them).
__all__ = [
    "DEFAULT_IMAGE",
    "PACKAGES",
    "ImageConfig",
    "apt_mirror",
    "base_rootfs",
    "build_command",
    "build_image",
    "build_rootfs",
    "cache_dir",
    "cannot_build",
    "docker_image_exists",
    "image_key",
    "image_tag",
    "import_image",
    "is_base_image",
    "rootfs_path",
    "rootfs_ready",
]

# What the bundled tasks use beyond the minbase essentials (coreutils, grep, sed, tar, gzip, findutils...).
PACKAGES = (
    "python3",
    "git",
    "gawk",
    "bzip2",
    "xz-utils",
    "zip",
    "unzip",
    "procps",
    "file",
    "jq",
    "patch",
    "bc",
)
DEFAULT_IMAGE = "pivot-envs/terminal-base"


@dataclass
class ImageConfig:
    """How the base image is built (`pivotrl sandbox build-image`)."""

    suite: str = option("bookworm", "Debian suite debootstrap installs")
    mirror: str = option("", "Debian mirror URL (default: the first one apt uses here, else deb.debian.org)")
    cache_dir: str = option(
        "",
        "where the root filesystem is kept (default: $PIVOT_ENVS_CACHE, ~/.cache/pivot-envs, root: /var/cache/pivot-envs)",
    )
    docker: bool = option(True, "also import the root filesystem as a Docker image when a daemon answers")
    rebuild: bool = option(False, "build again even when a complete root filesystem exists")


def image_tag(suite: str = "bookworm") -> str:
    """The Docker tag of the base image built from this package list."""
    return f"{DEFAULT_IMAGE}:{image_key(suite, PACKAGES)}"


def is_base_image(reference: str, suite: str = "bookworm") -> bool:
    """Whether an image reference names this base image: `pivot-envs/terminal-base` untagged, `:latest`,
    or tagged with this package list's key (another key is another package list, not built here)."""
    name, tag = reference, ""
    if ":" in reference.rsplit("/", 1)[-1]:
        name, tag = reference.rsplit(":", 1)
    return name == DEFAULT_IMAGE and tag in ("", "latest", image_key(suite, PACKAGES))


def rootfs_path(config: ImageConfig | None = None) -> Path:
    """Where the (complete or not yet built) root filesystem lives."""
    config = config or ImageConfig()
    return cache_dir(config.cache_dir) / "terminal" / f"rootfs-{image_key(config.suite, PACKAGES)}"


def build_command(config: ImageConfig | None = None) -> str:
    """The command that builds the base image for this user: `pivotrl sandbox build-image`, with
    sudo (and this user's cache, since root's default is another) when not root."""
    if os.geteuid() == 0:
        return "pivotrl sandbox build-image"
    cache = rootfs_path(config).parent.parent
    return f"sudo env PIVOT_ENVS_CACHE={cache} pivotrl sandbox build-image"


def base_rootfs(build: bool = True, config: ImageConfig | None = None) -> Path:
    """The complete base root filesystem, built now (logged: about 2 minutes, once) when it is
    missing, `build` allows it and this process can; otherwise SandboxError naming the command."""
    config = config or ImageConfig()
    target = rootfs_path(config)
    if rootfs_ready(target):
        return target
    reason = cannot_build() if build else "building it on first use is off (build_image=False)"
    if reason:
        raise SandboxError(
            f"the terminal sandbox's base root filesystem {target} is not built and {reason}: "
            f"run `{build_command(config)}` once"
        )
    logger.warning(
        "building the terminal sandbox's base root filesystem %s with debootstrap "
        "(once; about 2 minutes, a download of about 100 MB)",
        target,
    )
    start = time.monotonic()
    build_rootfs(config, log=logger.info)
    logger.warning("built %s in %.0f s", target, time.monotonic() - start)
    return target


def build_rootfs(config: ImageConfig | None = None, log=print) -> Path:
    """Build the root filesystem with debootstrap unless a complete one exists; returns its path."""
    config = config or ImageConfig()
    return build_debian_rootfs(
        rootfs_path(config), config.suite, PACKAGES, config.mirror, config.rebuild, build_command(config), log
    )


def build_image(config: ImageConfig | None = None, log=print) -> tuple[Path, str | None]:
    """Build (idempotently) the root filesystem and, when Docker answers, the image; returns both."""
    config = config or ImageConfig()
    rootfs = build_rootfs(config, log=log)
    tag = None
    if config.docker and docker_available():
        tag = import_image(rootfs, image_tag(config.suite))
        log(f"docker image {tag} ready")
    return rootfs, tag
