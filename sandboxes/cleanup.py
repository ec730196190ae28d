"""What marks a sandbox's leftovers as ours, and removing them (`close()`, `pivotrl sandbox gc`).

Every container and image carries the label `pivot-envs`, with the owning backend in
`pivot-envs.owner` ("host:pid:instance"); bubblewrap and Docker backends keep their directories
in temporary directories named `pivot-envs-bwrap-<pid>-*` and `pivot-envs-docker-<pid>-*`. A
process that is gone (or, with `all_owners`, any) has its sandboxes removed by `gc`.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

from . import cgroups
from .available import docker_available
from .trees import remove_tree

LABEL = "pivot-envs"
OWNER_LABEL = "pivot-envs.owner"
BWRAP_PREFIX = "pivot-envs-bwrap-"
DOCKER_PREFIX = "pivot-envs-docker-"


def owner_id() -> str:
    """A new owner: "host:pid:instance", the label value that marks what one backend (one env) made.

    Closing a backend removes only its own owner's things, so envs in one process never touch
    each other's; the host and pid let `pivotrl sandbox gc` tell the leftovers of dead processes.
    """
    return f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def remove_owned(owner: str, root: Path | None) -> None:
    """Remove what the Docker backend of `owner` made, and its directory (its finalizer: the daemon may be gone)."""
    import docker

    try:
        client = docker.from_env()
        remove_labelled(client, owner=owner)
        client.close()
    except Exception:  # the daemon is gone: `pivotrl sandbox gc` removes them later
        pass
    if root is not None:
        remove_tree(root)


def remove_labelled(client, owner: str | None = None, include_base: bool = False) -> tuple[int, int]:
    """Remove containers and images labelled `pivot-envs` (only `owner`'s when given); returns the counts."""
    filters = {"label": [LABEL] if owner is None else [f"{OWNER_LABEL}={owner}"]}
    # The raw lists, not the models': those inspect each item, and one that another backend removes
    # meanwhile makes the inspection raise NotFound.
    removed_containers = 0
    for container in client.api.containers(all=True, filters=filters):
        try:
            client.api.remove_container(container["Id"], force=True)
            removed_containers += 1
        except Exception:  # removed concurrently
            continue
    removed_images = 0
    for image in client.api.images(filters=filters):
        if (image.get("Labels") or {}).get(LABEL) == "base" and not include_base:
            continue
        try:
            client.images.remove(image["Id"], force=True)
            removed_images += 1
        except Exception:  # a parent of another labelled image (removed with it), or removed concurrently
            continue
    return removed_containers, removed_images


def gc(include_base: bool = False, all_owners: bool = False) -> dict[str, int]:
    """Remove sandboxes left by processes that are gone (all of them with `all_owners`).

    Docker: labelled containers and snapshot images (and the base image with `include_base`);
    bubblewrap: the sandboxes still running, the temporary directories and the cgroups of dead
    processes. Returns what was removed.
    """
    removed = {"containers": 0, "images": 0, "directories": 0}
    if docker_available():
        import docker

        client = docker.from_env()
        labelled = {"label": [LABEL]}
        found = [*client.api.containers(all=True, filters=labelled), *client.api.images(filters=labelled)]
        owners = {(item.get("Labels") or {}).get(OWNER_LABEL) for item in found}
        for owner in owners:
            if owner is None:
                continue
            if all_owners or not owner_alive(owner):
                containers, images = remove_labelled(client, owner=owner)
                removed["containers"] += containers
                removed["images"] += images
        if include_base:
            _, images = remove_labelled(client, include_base=True)
            removed["images"] += images
        client.close()
    removed["processes"] = _kill_orphaned_bwrap(all_owners)
    for path in Path(tempfile.gettempdir()).glob("pivot-envs-*"):
        if not path.name.startswith((BWRAP_PREFIX, DOCKER_PREFIX)):
            continue
        pid = path.name.split("-")[3]
        if all_owners or not (pid.isdigit() and Path(f"/proc/{pid}").exists()):
            remove_tree(path)
            removed["directories"] += 1
    removed["cgroups"] = cgroups.remove_stale() if os.geteuid() == 0 else 0
    return removed


def _kill_orphaned_bwrap(all_owners: bool = False) -> int:
    """Kill the bubblewrap sandboxes whose owning process is gone (a crash while one was starting)."""
    prefix = str(Path(tempfile.gettempdir(), BWRAP_PREFIX)).encode()
    killed = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].endswith(b"bwrap"):
            continue
        roots = [arg[len(prefix) :].split(b"-")[0] for arg in argv if arg.startswith(prefix)]
        if roots and (all_owners or not Path(f"/proc/{roots[0].decode()}").exists()):
            try:
                os.kill(int(entry.name), 9)
                killed += 1
            except ProcessLookupError:
                continue
    return killed


def owner_alive(owner: str) -> bool:
    """Whether the process named by an owner label ("host:pid:instance", or an older "host:pid") runs."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != os.uname().nodename:
        return True  # another machine's sandboxes on a shared daemon: not ours to judge
    return pid.isdigit() and Path(f"/proc/{pid}").exists()
