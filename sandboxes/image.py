"""Base images for sandboxes: a Debian root filesystem made by debootstrap, imported into Docker.

One root filesystem serves both backends: bubblewrap binds its system directories read-only,
and `docker import` turns it into the image the Docker backend runs. A domain chooses the suite
and the packages (as the terminal domain does for its base image). Both steps are idempotent: the
root filesystem is keyed by its suite and package list, built in a temporary directory and
renamed into place only when complete; the image is tagged with the same key.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from .cleanup import LABEL
from .protocol import SandboxError

logger = logging.getLogger(__name__)
# Envs of one process (threads) that all find a base missing build or import it once.
_BUILDING = threading.Lock()


def cache_dir(config_value: str = "") -> Path:
    """The pivot-envs cache directory (created): $PIVOT_ENVS_CACHE, else ~/.cache/pivot-envs.

    For root the default is /var/cache/pivot-envs instead: the bubblewrap sandbox drops to the
    `nobody` user, which must be able to reach the root filesystem (it cannot enter /root).
    """
    default = Path("/var/cache/pivot-envs") if os.geteuid() == 0 else Path.home() / ".cache" / "pivot-envs"
    path = Path(config_value or os.environ.get("PIVOT_ENVS_CACHE") or default)
    path.mkdir(parents=True, exist_ok=True)
    return path


def image_key(suite: str, packages: tuple[str, ...]) -> str:
    """A short hash of what goes into a root filesystem (changes when the package list does)."""
    return hashlib.sha256(f"{suite}:{','.join(sorted(packages))}:v1".encode()).hexdigest()[:12]


def rootfs_ready(path: Path) -> bool:
    """Whether `path` holds a complete root filesystem."""
    return (path / ".pivot-envs-complete").is_file()


def apt_mirror() -> str:
    """The Debian mirror apt uses on this machine, or deb.debian.org."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for source in sources:
        try:
            text = source.read_text()
        except OSError:
            continue
        for match in re.finditer(r"(?:^deb\s+(?:\[[^]]*\]\s+)?|^URIs:\s*)(\S+/debian)/?\s", text, re.M):
            return match.group(1)
    return "http://deb.debian.org/debian"


def cannot_build() -> str:
    """Why this process cannot build a root filesystem ("" when it can: root, with debootstrap)."""
    if os.geteuid() != 0:
        return "building it needs root (debootstrap)"
    if shutil.which("debootstrap") is None:
        return "debootstrap is not installed (apt-get install debootstrap)"
    return ""


def build_rootfs(
    target: Path,
    suite: str,
    packages: tuple[str, ...],
    mirror: str = "",
    rebuild: bool = False,
    command: str = "pivotrl sandbox build-image",
    log: Callable[[str], object] = print,
) -> Path:
    """Build the root filesystem `target` with debootstrap (minbase plus `packages` from `suite`,
    from `mirror` or the one apt uses here) unless a complete one exists or `rebuild`; returns it.

    Raises SandboxError when this process cannot build it (naming `command`, the one that can) or
    debootstrap fails.
    """
    with _BUILDING:
        if rootfs_ready(target) and not rebuild:
            return target
        reason = cannot_build()
        if reason:
            raise SandboxError(f"cannot build {target}: {reason}; run `{command}`")
        target.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        work.chmod(0o755)  # mkdtemp makes it private; the sandbox user must read it
        try:
            argv = [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(packages)}",
                suite,
                str(work),
                mirror or apt_mirror(),
            ]
            log(f"building {target} with: {' '.join(argv)}")
            result = subprocess.run(argv, capture_output=True, text=True)
            if result.returncode != 0:
                raise SandboxError(
                    f"debootstrap failed ({result.returncode}): {result.stderr[-2000:] or result.stdout[-2000:]}"
                )
            # Apt caches are not needed in a sandbox and double the image size.
            shutil.rmtree(work / "var" / "cache" / "apt" / "archives", ignore_errors=True)
            (work / "var" / "cache" / "apt" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
            (work / ".pivot-envs-complete").write_text(image_key(suite, packages) + "\n")
            if target.exists():
                shutil.rmtree(target)
            work.rename(target)
        finally:
            if work.exists():
                shutil.rmtree(work, ignore_errors=True)
    return target


def docker_image_exists(tag: str) -> bool:
    """Whether the Docker daemon has an image with this tag."""
    import docker

    client = docker.from_env()
    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False
    finally:
        client.close()


def import_image(rootfs: Path, tag: str) -> str:
    """`docker import` the root filesystem as `tag` (labelled, so `pivotrl sandbox gc --all` finds it)."""
    with _BUILDING:
        if docker_image_exists(tag):
            return tag
        logger.warning("importing %s into Docker as %s (once; about 15 seconds)", rootfs, tag)
        return _import(rootfs, tag)


def _import(rootfs: Path, tag: str) -> str:
    # tar streams the tree straight into the daemon; --numeric-owner keeps root ownership exact.
    tar = subprocess.Popen(
        ["tar", "--numeric-owner", "-C", str(rootfs), "--exclude=./.pivot-envs-complete", "-c", "."],
        stdout=subprocess.PIPE,
    )
    result = subprocess.run(
        ["docker", "import", "--change", f"LABEL {LABEL}=base", "--change", 'CMD ["bash"]', "-", tag],
        stdin=tar.stdout,
        capture_output=True,
        text=True,
    )
    tar.stdout.close()
    tar.wait()
    if result.returncode != 0 or tar.returncode != 0:
        raise SandboxError(f"docker import of {rootfs} failed: {result.stderr.strip()}")
    return tag
