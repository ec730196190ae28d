"""The terminal domain's base image: a Debian root filesystem made by debootstrap, imported into Docker.

One root filesystem serves both backends: bubblewrap binds its system directories read-only,
and `docker import` turns it into the image the Docker backend runs. Both steps are idempotent:
the root filesystem is keyed by its suite and package list, built in a temporary directory and
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
import time
from dataclasses import dataclass
from pathlib import Path

from pivot_envs.sandboxes.protocol import SandboxError

from pivot_envs.config import option

logger = logging.getLogger(__name__)

# What the bundled tasks use beyond the minbase essentials (coreutils, grep, sed, tar, gzip, findutils...).
PACKAGES = (
    "python3", "git", "gawk", "bzip2", "xz-utils", "zip", "unzip", "procps", "file", "jq", "patch", "bc",
)
LABEL = "pivot-envs"
DEFAULT_IMAGE = "pivot-envs/terminal-base"
# Envs of one process (threads) that all find the base missing build or import it once.
_BUILDING = threading.Lock()


@dataclass
class ImageConfig:
    """How the base image is built (`pivotrl sandbox build-image`)."""

    suite: str = option("bookworm", "Debian suite debootstrap installs")
    mirror: str = option("", "Debian mirror URL (default: the first one apt uses here, else deb.debian.org)")
    cache_dir: str = option("", "where the root filesystem is kept (default: $PIVOT_ENVS_CACHE, ~/.cache/pivot-envs, root: /var/cache/pivot-envs)")
    docker: bool = option(True, "also import the root filesystem as a Docker image when a daemon answers")
    rebuild: bool = option(False, "build again even when a complete root filesystem exists")


def cache_dir(config_value: str = "") -> Path:
    """The pivot-envs cache directory (created): $PIVOT_ENVS_CACHE, else ~/.cache/pivot-envs.

    For root the default is /var/cache/pivot-envs instead: the bubblewrap sandbox drops to the
    `nobody` user, which must be able to reach the root filesystem (it cannot enter /root).
    """
    default = Path("/var/cache/pivot-envs") if os.geteuid() == 0 else Path.home() / ".cache" / "pivot-envs"
    path = Path(config_value or os.environ.get("PIVOT_ENVS_CACHE") or default)
    path.mkdir(parents=True, exist_ok=True)
    return path


def image_key(suite: str = "bookworm", packages: tuple[str, ...] = PACKAGES) -> str:
    """A short hash of what goes into the root filesystem (changes when the package list does)."""
    return hashlib.sha256(f"{suite}:{','.join(sorted(packages))}:v1".encode()).hexdigest()[:12]


def image_tag(suite: str = "bookworm") -> str:
    """The Docker tag of the base image built from this package list."""
    return f"{DEFAULT_IMAGE}:{image_key(suite)}"


def rootfs_path(config: ImageConfig | None = None) -> Path:
    """Where the (complete or not yet built) root filesystem lives."""
    config = config or ImageConfig()
    return cache_dir(config.cache_dir) / "terminal" / f"rootfs-{image_key(config.suite)}"


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


def build_command(config: ImageConfig | None = None) -> str:
    """The command that builds the base image for this user: `pivotrl sandbox build-image`, with
    sudo (and this user's cache, since root's default is another) when not root."""
    if os.geteuid() == 0:
        return "pivotrl sandbox build-image"
    cache = rootfs_path(config).parent.parent
    return f"sudo env PIVOT_ENVS_CACHE={cache} pivotrl sandbox build-image"


def cannot_build() -> str:
    """Why this process cannot build the root filesystem ("" when it can: root, with debootstrap)."""
    if os.geteuid() != 0:
        return "building it needs root (debootstrap)"
    if shutil.which("debootstrap") is None:
        return "debootstrap is not installed (apt-get install debootstrap)"
    return ""


def base_rootfs(build: bool = True, config: ImageConfig | None = None) -> Path:
    """The complete base root filesystem, built now (logged: about 2 minutes, once) when it is
    missing, `build` allows it and this process can; otherwise SandboxError naming the command."""
    config = config or ImageConfig()
    target = rootfs_path(config)
    if rootfs_ready(target):
        return target
    reason = cannot_build() if build else "building it on first use is off (build_image=False)"
    if reason:
        raise SandboxError(f"the terminal sandbox's base root filesystem {target} is not built and {reason}: "
                           f"run `{build_command(config)}` once")
    logger.warning("building the terminal sandbox's base root filesystem %s with debootstrap "
                   "(once; about 2 minutes, a download of about 100 MB)", target)
    start = time.monotonic()
    build_rootfs(config, log=logger.info)
    logger.warning("built %s in %.0f s", target, time.monotonic() - start)
    return target


def build_rootfs(config: ImageConfig | None = None, log=print) -> Path:
    """Build the root filesystem with debootstrap unless a complete one exists; returns its path."""
    with _BUILDING:
        return _build_rootfs(config or ImageConfig(), log)


def _build_rootfs(config: ImageConfig, log) -> Path:
    target = rootfs_path(config)
    if rootfs_ready(target) and not config.rebuild:
        return target
    reason = cannot_build()
    if reason:
        raise SandboxError(f"cannot build {target}: {reason}; run `{build_command(config)}`")
    mirror = config.mirror or apt_mirror()
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    work.chmod(0o755)  # mkdtemp makes it private; the sandbox user must read it
    try:
        command = [
            "debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", config.suite, str(work), mirror,
        ]
        log(f"building {target} with: {' '.join(command)}")
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise SandboxError(f"debootstrap failed ({result.returncode}): {result.stderr[-2000:] or result.stdout[-2000:]}")
        # Apt caches are not needed in a sandbox and double the image size.
        shutil.rmtree(work / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        (work / "var" / "cache" / "apt" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        (work / ".pivot-envs-complete").write_text(image_key(config.suite) + "\n")
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
        ["docker", "import", "--change", f"LABEL {LABEL}=base", "--change", "CMD [\"bash\"]", "-", tag],
        stdin=tar.stdout, capture_output=True, text=True,
    )
    tar.stdout.close()
    tar.wait()
    if result.returncode != 0 or tar.returncode != 0:
        raise SandboxError(f"docker import of {rootfs} failed: {result.stderr.strip()}")
    return tag


def build_image(config: ImageConfig | None = None, log=print) -> tuple[Path, str | None]:
    """Build (idempotently) the root filesystem and, when Docker answers, the image; returns both."""
    from pivot_envs.sandboxes.backends import docker_available

    config = config or ImageConfig()
    rootfs = build_rootfs(config, log=log)
    tag = None
    if config.docker and docker_available():
        tag = import_image(rootfs, image_tag(config.suite))
        log(f"docker image {tag} ready")
    return rootfs, tag
