"""Kernel-enforced memory and process limits for bubblewrap sandboxes: one cgroup per sandbox.

bubblewrap itself sets no cgroup, and rlimits are per process (RLIMIT_AS) or per host user
(RLIMIT_NPROC, shared by every sandbox running as `nobody`), so a fork bomb of processes that each
stay under the address-space limit could together take the host's memory for a whole timeout.
When the host process runs as root and can write a cgroup hierarchy, the launcher creates one
cgroup per sandbox with a memory limit (`SandboxLimits.memory_mb`, the whole sandbox, as Docker's
container limit) and a process limit (`SandboxLimits.processes`), and starts the sandbox inside
it before any of its processes exist (`launch_prefix`). cgroup v2 (a unified hierarchy whose
memory and pids controllers can be enabled for our subtree) is used where available, else the v1
memory and pids hierarchies; where neither can be written the rlimits remain the only limits, and
`available()` says why.

Every cgroup lives under one directory per host process, `pivot-envs-<pid>`, beside the process's
own cgroup; `remove_stale()` deletes those of processes that are gone.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)
ROOT = Path("/sys/fs/cgroup")
PREFIX = "pivot-envs-"
# What a sandbox's cgroup also holds besides the commands: bwrap's init, the command server and
# the runner's shells. The process limit counts them on top of `processes`.
INFRASTRUCTURE_PROCESSES = 8
# Set when the process exits (remove_parent): a sandbox cgroup removed after that (by a backend's
# finalizer, which may run after the atexit hook) removes its parent too once that is empty.
_exiting = False


@dataclass(frozen=True)
class Hierarchy:
    """Where this process's sandbox cgroups go: v2 (one directory) or v1 (memory and pids)."""

    version: int
    parents: tuple[Path, ...]  # v2: (parent,); v1: (memory parent, pids parent)


def _own_path(controller: str) -> str:
    """This process's cgroup path in a hierarchy ('' for v2's unified line)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers.split(",") == ([controller] if controller else [""]):
            return path.lstrip("/")
    raise OSError(f"no {controller or 'unified'} cgroup line in /proc/self/cgroup")


def _v2_parent() -> Path | None:
    """A v2 directory of ours whose children get the memory and pids controllers, or None."""
    if not (ROOT / "cgroup.controllers").is_file():
        return None
    own = ROOT / _own_path("")
    if not {"memory", "pids"} <= set((own / "cgroup.controllers").read_text().split()):
        return None
    # No process may live in a v2 cgroup whose children have controllers (except the root), so the
    # controllers are enabled on our own directory only where that is allowed; then one level down.
    parent = own / f"{PREFIX}{os.getpid()}"
    parent.mkdir(exist_ok=True)
    (own / "cgroup.subtree_control").write_text("+memory +pids")
    (parent / "cgroup.subtree_control").write_text("+memory +pids")
    return parent


def _v1_parents() -> tuple[Path, Path] | None:
    """This process's v1 memory and pids directories for sandbox cgroups, or None."""
    parents = []
    for controller in ("memory", "pids"):
        base = ROOT / controller
        if not (base / "cgroup.procs").is_file():
            return None
        parent = base / _own_path(controller) / f"{PREFIX}{os.getpid()}"
        parent.mkdir(exist_ok=True)
        parents.append(parent)
    return parents[0], parents[1]


@functools.lru_cache(maxsize=1)
def hierarchy() -> Hierarchy | str:
    """The hierarchy sandbox cgroups are made in, or why there is none (probed, and a missing one
    logged, once per process)."""
    found = _probe()
    if isinstance(found, str):
        logger.info("bubblewrap sandboxes without a cgroup: %s", found)
    return found


def _probe() -> Hierarchy | str:
    if os.geteuid() != 0:
        return "not running as root: limits are rlimits only (per process memory, per user processes)"
    try:
        parent = _v2_parent()
        if parent is not None:
            atexit.register(remove_parent)
            return Hierarchy(2, (parent,))
    except OSError:
        pass  # a v2 tree we may not delegate: try v1
    try:
        parents = _v1_parents()
    except OSError as error:
        return f"the cgroup hierarchy cannot be written ({error}): limits are rlimits only"
    if parents is None:
        return "no cgroup hierarchy with the memory and pids controllers: limits are rlimits only"
    atexit.register(remove_parent)
    return Hierarchy(1, parents)


def available() -> bool:
    """Whether sandboxes get a cgroup of their own here."""
    return isinstance(hierarchy(), Hierarchy)


class SandboxCgroup:
    """One sandbox's cgroup(s): memory limit `memory_bytes` and at most `pids` processes in all."""

    def __init__(self, memory_bytes: int, pids: int) -> None:
        found = hierarchy()
        if not isinstance(found, Hierarchy):
            raise OSError(found)
        name = uuid.uuid4().hex[:12]
        self.parents = found.parents
        self.paths = tuple(parent / name for parent in found.parents)
        for path in self.paths:
            path.mkdir()
        try:
            if found.version == 2:
                path = self.paths[0]
                (path / "memory.max").write_text(str(memory_bytes))
                if (path / "memory.swap.max").exists():  # no swap to escape into
                    (path / "memory.swap.max").write_text("0")
                (path / "pids.max").write_text(str(pids))
            else:
                memory, pid_dir = self.paths
                (memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
                if (memory / "memory.memsw.limit_in_bytes").exists():
                    (memory / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                (pid_dir / "pids.max").write_text(str(pids))
        except OSError:
            self.remove()
            raise

    @property
    def procs(self) -> list[str]:
        """The `cgroup.procs` files a process writes its pid into to join."""
        return [str(path / "cgroup.procs") for path in self.paths]

    def launch_prefix(self) -> list[str]:
        """An argv prefix that joins this cgroup, then execs the rest (run it as root)."""
        # The shell joins before exec, so every process the sandbox ever has starts inside.
        join = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
        return ["sh", "-c", join, "pivot-cgroup", *self.procs, "--"]

    def pids(self) -> list[int]:
        """The processes in the cgroup now."""
        found: set[int] = set()
        for procs in self.procs:
            try:
                found.update(int(pid) for pid in Path(procs).read_text().split())
            except OSError:
                continue
        return sorted(found)

    def remove(self, wait: float = 2.0) -> None:
        """Kill what is left inside and delete the cgroup (retried while exiting processes leave)."""
        deadline = time.monotonic() + wait
        for path in self.paths:
            while True:
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    for pid in self.pids():
                        try:
                            os.kill(pid, 9)
                        except ProcessLookupError:
                            pass
                    if time.monotonic() > deadline:
                        break  # left for remove_stale: a zombie nobody reaps can hold it
                    time.sleep(0.01)
        if _exiting:
            _remove_empty(self.parents)


def remove_parent() -> None:
    """Delete this process's parent directories when empty (at exit). Sandboxes whose backends
    close later (their finalizers may run after this atexit hook) delete them with their own
    cgroup then."""
    global _exiting
    _exiting = True
    found = hierarchy()
    if isinstance(found, Hierarchy):
        _remove_empty(found.parents)
        hierarchy.cache_clear()


def _remove_empty(parents: tuple[Path, ...]) -> None:
    for parent in parents:
        try:
            parent.rmdir()
        except OSError:  # gone already, or a sandbox cgroup still in it (that removes it later)
            continue


def remove_stale() -> int:
    """Delete the sandbox cgroups of host processes that are gone; returns how many were removed."""
    removed = 0
    bases = [ROOT] if (ROOT / "cgroup.controllers").is_file() else [ROOT / "memory", ROOT / "pids"]
    for base in bases:
        if not base.is_dir():
            continue
        for parent in _find_parents(base):
            pid = parent.name[len(PREFIX) :]
            if pid.isdigit() and Path(f"/proc/{pid}").exists():
                continue
            for child in [entry for entry in parent.iterdir() if entry.is_dir()]:
                try:
                    child.rmdir()
                    removed += 1
                except OSError:
                    continue
            try:
                parent.rmdir()
            except OSError:
                continue
    return removed


def _find_parents(base: Path, depth: int = 4) -> list[Path]:
    """`pivot-envs-<pid>` directories up to `depth` levels under a hierarchy's root."""
    found, level = [], [base]
    for _ in range(depth):
        below = []
        for directory in level:
            try:
                entries = [entry for entry in directory.iterdir() if entry.is_dir()]
            except OSError:
                continue
            for entry in entries:
                (found if entry.name.startswith(PREFIX) else below).append(entry)
        level = below
    return found
