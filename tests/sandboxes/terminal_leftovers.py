"""What a closed terminal env or backend left behind: the check the ownership tests share."""

from __future__ import annotations

import time
from pathlib import Path

from pivot_envs.sandboxes.cleanup import OWNER_LABEL


def left_behind(owner: str | None, roots: list[Path], within: float = 5.0) -> list[str]:
    """What a closed backend left: containers and images labelled with its `owner`, its directories
    (`roots`) and processes naming them. Killed processes exit asynchronously: waits up to `within` s."""
    found: list[str] = []
    if owner is not None:
        import docker

        client = docker.from_env()
        mine = {"label": [f"{OWNER_LABEL}={owner}"]}
        found += [f"container {c['Id'][:12]}" for c in client.api.containers(all=True, filters=mine)]
        found += [f"image {i['Id'][:19]}" for i in client.api.images(filters=mine)]
        client.close()
    found += [f"directory {root}" for root in roots if root.exists()]
    deadline = time.monotonic() + within
    while (running := _processes_naming(roots)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found + [f"process {pid}" for pid in running]


def _processes_naming(roots: list[Path]) -> list[int]:
    names = [str(root).encode() for root in roots]
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and any(name in (entry / "cmdline").read_bytes() for name in names):
                found.append(int(entry.name))
        except OSError:
            continue
    return found
