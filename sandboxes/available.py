"""Which sandbox backends this machine has: the Docker SDK with a daemon that answers, bubblewrap
that can create its namespaces; and what to install when neither is there."""

from __future__ import annotations

import functools
import shutil
import subprocess

from pivot_envs.errors import MissingExtraError

from .processes import drop_privileges

INSTALL_HELP = (
    "no sandbox backend is available. Install either one:\n"
    "  Docker:      apt-get install docker.io (or Docker Engine), start the daemon (`dockerd` or "
    "`systemctl start docker`) and make sure `docker info` answers for this user;\n"
    "  bubblewrap:  apt-get install bubblewrap (dnf install bubblewrap; brew has none: use Docker on macOS).\n"
    "Then build the base image once: `sudo pivotrl sandbox build-image` (needs debootstrap)."
)


def docker_sdk(what: str):
    """The `docker` module; MissingExtraError naming the extra when the SDK is not installed."""
    try:
        import docker
    except ImportError as error:
        raise MissingExtraError(what, "docker", "docker") from error
    return docker


def docker_available(timeout: float = 3.0) -> bool:
    """Whether the docker SDK is installed and a daemon answers a ping."""
    try:
        import docker
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # any failure to reach the daemon means "not available"
        return False


@functools.lru_cache(maxsize=1)
def bwrap_available() -> bool:
    """Whether bubblewrap is installed and can create its namespaces here (probed once per process)."""
    if shutil.which("bwrap") is None:
        return False
    # --as-pid-1: `true` is bwrap's own child, so bwrap reaps it. With bwrap's init in between,
    # bwrap exits as soon as `true` does and leaves its init to the host's PID 1 (a zombie for
    # good where PID 1 does not reap, as in many containers).
    result = subprocess.run(
        [
            *drop_privileges(),
            "bwrap",
            "--unshare-all",
            "--die-with-parent",
            "--as-pid-1",
            "--ro-bind",
            "/",
            "/",
            "true",
        ],
        capture_output=True,
        timeout=10,
    )
    return result.returncode == 0
