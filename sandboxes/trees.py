"""Removing a directory tree a sandbox's commands may have filled, however deep (a module of its own,
below both the runner and cleanup)."""

from __future__ import annotations

import os
import shutil


def remove_tree(
    path: str | os.PathLike,
    background: tuple[str, ...] = (),
    pass_fds: tuple[int, ...] = (),
    timeout: float | None = None,
) -> None:
    """Remove a directory a sandbox's commands may have filled, however deep: `rm -rf` in a process of its
    own (shutil.rmtree recurses once per level and raises RecursionError past about a thousand; in this
    process it would also hold the GIL), prefixed by `background` (e.g. `nice -n 19`), given the
    descriptors `pass_fds` (a path through /proc/self/fd/N reaches a directory without resolving a
    component a command could swap for a link) and stopped after `timeout` seconds; shutil.rmtree only
    where `rm` fails to start, and never raising."""
    import subprocess

    try:
        done = (
            subprocess.run(
                [*background, "rm", "-rf", "--one-file-system", "--", str(path)],
                capture_output=True,
                pass_fds=pass_fds,
                timeout=timeout,
            ).returncode
            == 0
        )
    except subprocess.TimeoutExpired:
        return
    except OSError:
        done = False
    if not done and os.path.lexists(path):
        try:
            shutil.rmtree(path, ignore_errors=True)
        except RecursionError:
            pass
