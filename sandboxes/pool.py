"""The contract both sandbox backends keep for their life-cycle, and the code they share for it.

A backend (`SandboxBackend`) makes sandboxes on one base (a root filesystem, a Docker daemon) and
owns everything it makes:

- `new_sandbox(workdir, image=None)` makes a fresh sandbox with an empty workspace at `workdir`, on the
  backend's base (bubblewrap: its root filesystem; Docker: its `base_image`) or, on Docker, on another
  local `image`; bubblewrap refuses any image (it runs its root filesystem alone);
- `fork(snapshot)` hands out a new sandbox of the snapshot: a warm one when the pool has one, else
  one made now; `prewarm(snapshot, setup)` fills the snapshot's pool ahead (each warm sandbox runs
  `setup` before it is handed out), `wait_warm` waits until it is full, `release(snapshot)` drops
  the snapshot with its warm sandboxes at once;
- `close()` removes every sandbox and snapshot the backend made and nothing of another backend's;
  closing twice does nothing more, and a backend never closed is cleaned up when it is collected
  or when its process exits;
- a backend belongs to the process that made it. A process forked from it (`os.fork`,
  multiprocessing's fork) finds no inherited pool, background worker or cleanup: its first use of
  the backend starts its own, with a new owner, so the child's sandboxes are its own, its close
  and its exit leave the parent's alone, and it never shares a warm sandbox with the parent.

`PooledBackend` keeps that contract for a backend that says how to make a fresh sandbox (`_create`)
and one sandbox of a snapshot (`_make`), hand it out (`_hand_out`), remove it (`_discard`), drop a
snapshot (`_drop_snapshot`) and set up and close what its process owns (`_own_resources`,
`_close_resources`). The pool's
work (making warm sandboxes, removals) runs in worker threads in the quiet gaps between commands
(`background.QuietGate`). `PooledSandbox` is what both backends' sandboxes share.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from contextlib import nullcontext
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from .background import QuietGate
from .channel import DiskFloor
from .protocol import CommandResult, Sandbox, SandboxError, SandboxLimits, Snapshot
from .runner import stop_processes

Warm = TypeVar("Warm", bound="PooledSandbox")


class ImageUnavailableError(SandboxError):
    """A backend cannot run the image asked of it (bubblewrap runs its base root filesystem alone)."""


@runtime_checkable
class SandboxBackend(Protocol):
    """What makes and owns sandboxes (see the module docstring): both backends implement it."""

    name: str
    limits: SandboxLimits
    warm_pool: int

    def new_sandbox(self, workdir: str = "/app", image: str | None = None) -> Sandbox: ...

    def fork(self, snapshot: Snapshot) -> Sandbox: ...

    def prewarm(self, snapshot: Snapshot, setup: str = "") -> None: ...

    def wait_warm(self, snapshot: Snapshot, timeout: float = 30.0) -> bool: ...

    def release(self, snapshot: Snapshot) -> None: ...

    def close(self) -> None: ...


def only_in_process(pid: int, cleanup: Callable[..., None], *args: Any) -> None:
    """Run `cleanup(*args)` in the process `pid` only: a forked child's exit leaves its parent's things alone."""
    if os.getpid() == pid:
        cleanup(*args)


class PooledBackend(Generic[Warm]):
    """A backend's warm pools, background work, release, close and fork safety (see the module docstring).

    A subclass calls `__init__` once its own settings are made, and implements the hooks below;
    `limits`, `warm_pool` and `closed` are public, the rest is the subclass's.
    """

    name = ""
    # Threads making warm sandboxes and removing old ones (per backend); their names' prefix.
    workers = 2
    thread_name = "pivot-sandbox"

    def __init__(self, limits: SandboxLimits | None, warm_pool: int) -> None:
        self.limits = limits or SandboxLimits()
        self.warm_pool = warm_pool
        self.closed = False
        self._finalizer: weakref.finalize | None = None
        self._start_in_process()

    # -- hooks ------------------------------------------------------------------------------------

    def _own_resources(self) -> None:
        """Make what this process owns (a directory, a client, the finalizer by `_on_collect`)."""
        raise NotImplementedError

    def _create(self, workdir: str, image: str | None) -> Warm:
        """A fresh sandbox with an empty workspace at `workdir`, on `image` (None: the backend's base)."""
        raise NotImplementedError

    def _make(self, snapshot: Snapshot) -> Warm:
        """A sandbox of `snapshot` made now, not yet handed out (`foreground` False)."""
        raise NotImplementedError

    def _hand_out(self, sandbox: Warm) -> None:
        """Ready a sandbox for its first command (its workspace's known digests sealed)."""

    def _discard(self, sandbox: Warm) -> None:
        """Remove a sandbox nobody will use (a warm one, or one whose snapshot went meanwhile), now."""
        raise NotImplementedError

    def _drop_snapshot(self, snapshot: Snapshot) -> None:
        """Remove the snapshot itself (its warm sandboxes are gone)."""
        raise NotImplementedError

    def _close_resources(self) -> None:
        """Remove every sandbox and snapshot this backend made in this process, and what it owns."""
        raise NotImplementedError

    # -- the process -------------------------------------------------------------------------------

    def _start_in_process(self) -> None:
        self._pid = os.getpid()
        # Per snapshot: its warm sandboxes, the command each runs before it is handed out (`prewarm`),
        # and what the backend computes once for every fork (its workspace's digests).
        self._pools: dict[str, queue.SimpleQueue] = {}
        self._setups: dict[str, str] = {}
        self._digests: dict[str, Any] = {}
        self._lock = threading.Lock()
        # The commands running in this backend's sandboxes; the pool's work waits for a gap.
        self._gate = QuietGate()
        self._workers = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=self.thread_name)
        self._pending: set[Future] = set()
        self._own_resources()

    def _on_collect(self, cleanup: Callable[..., None], *args: Any) -> None:
        """Run `cleanup(*args)` when the backend is collected or at exit, in this process only."""
        self._finalizer = weakref.finalize(self, only_in_process, os.getpid(), cleanup, *args)

    def _here(self) -> None:
        """After os.fork, start this process's own pools, workers and resources (the parent's stay its own)."""
        if os.getpid() != self._pid and not self.closed:
            if self._finalizer is not None:
                self._finalizer.detach()
            self._start_in_process()

    # -- the contract ------------------------------------------------------------------------------

    def new_sandbox(self, workdir: str = "/app", image: str | None = None) -> Warm:
        """A fresh sandbox with an empty workspace at `workdir` on `image`, None for the backend's base;
        raises ImageUnavailableError for an image the backend cannot run, SandboxError when it fails."""
        self._here()
        return self._create(workdir, image)

    def fork(self, snapshot: Snapshot) -> Warm:
        """A new sandbox from the snapshot: a warm one when ready, else one made now."""
        pool = self._pool(snapshot)
        try:
            sandbox = pool.get_nowait()
        except queue.Empty:
            sandbox = self._make(snapshot)
        # From here on commands may write the workspace.
        self._hand_out(sandbox)
        sandbox.foreground = True
        self._gate.touch()  # a command follows: the refill waits for the gap after it
        self._refill(snapshot, pool)
        return sandbox

    def prewarm(self, snapshot: Snapshot, setup: str = "") -> None:
        """Start making the snapshot's warm sandboxes in the background; each runs `setup` (a command,
        when given) before it is handed out, e.g. to start a process its first command will talk to."""
        pool = self._pool(snapshot)
        if setup:
            with self._lock:
                self._setups[snapshot.ref] = setup
        self._refill(snapshot, pool)

    def wait_warm(self, snapshot: Snapshot, timeout: float = 30.0) -> bool:
        """Block until the snapshot's warm pool is full (benchmarks use this); returns whether it is."""
        self._here()
        deadline = time.monotonic() + timeout
        pool = self._pools.get(snapshot.ref)
        while pool is not None and pool.qsize() < self.warm_pool and time.monotonic() < deadline:
            time.sleep(0.01)
        return pool is not None and pool.qsize() >= self.warm_pool

    def release(self, snapshot: Snapshot) -> None:
        """Drop a snapshot: its warm sandboxes, then the snapshot itself."""
        self._here()
        with self._lock:
            pool = self._pools.pop(snapshot.ref, None)
            self._setups.pop(snapshot.ref, None)
            self._digests.pop(snapshot.ref, None)
        while pool is not None and not pool.empty():
            self._discard(pool.get_nowait())
        self._drop_snapshot(snapshot)

    def running(self) -> QuietGate:
        """A context for one command in a sandbox of this backend: the pool's work waits until it ends."""
        return self._gate

    def close(self) -> None:
        """Remove every sandbox and snapshot this backend made (a second call does nothing)."""
        self._here()
        if self.closed:
            return
        self.closed = True
        self._gate.close()
        # A bwrap dies with the thread that started it (bubblewrap's parent-death signal follows the
        # thread): the workers outlive the sandboxes they started. Finish the work in flight, remove
        # everything, then end them.
        wait_for(list(self._pending))
        with self._lock:
            self._pools.clear()
        self._close_resources()
        self._workers.shutdown(wait=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the pool's work ---------------------------------------------------------------------------

    def _pool(self, snapshot: Snapshot) -> queue.SimpleQueue:
        self._here()
        with self._lock:
            return self._pools.setdefault(snapshot.ref, queue.SimpleQueue())

    def _once(self, snapshot: Snapshot, compute: Callable[[], Any]) -> Any:
        """What `compute()` says of the snapshot, computed on first use: a snapshot never changes."""
        with self._lock:
            value = self._digests.get(snapshot.ref)
        if value is None:
            value = compute()
            with self._lock:
                self._digests[snapshot.ref] = value
        return value

    def _submit(self, work: Callable[[], None]) -> None:
        future = self._workers.submit(work)
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)

    def _refill(self, snapshot: Snapshot, pool: queue.SimpleQueue) -> None:
        if self.closed:
            return

        def make_one() -> None:
            self._gate.wait_quiet()
            if self.closed or pool.qsize() >= self.warm_pool or snapshot.ref not in self._pools:
                return
            try:
                sandbox = self._make(snapshot)
            except Exception:  # a failed warm start only costs the next fork a start of its own
                return
            setup = self._setups.get(snapshot.ref)
            if setup:
                # Its exit status is not checked: a set-up that did not work (no python3 in an image)
                # leaves a sandbox that works without it (the editor falls back).
                self._gate.wait_quiet()
                try:
                    sandbox.run(setup)
                except Exception:  # the sandbox failed: the next fork makes one of its own
                    self._discard(sandbox)
                    return
            with self._lock:
                # The snapshot may have been released (or the backend closed) while this sandbox was
                # made: a pool nobody reads would keep it, and its snapshot, until close().
                handed = not self.closed and self._pools.get(snapshot.ref) is pool
                if handed:
                    pool.put(sandbox)
            if not handed:
                self._discard(sandbox)

        for _ in range(max(self.warm_pool - pool.qsize(), 0)):
            self._submit(make_one)


class PooledSandbox:
    """What both backends' sandboxes share: `run` refused once closed and, for a sandbox handed out,
    holding the pool's background work back while the command runs; `stop_processes`; `fork`."""

    def __init__(self, owner: PooledBackend, workdir: str, foreground: bool = True) -> None:
        self.owner = owner
        self.workdir = workdir
        # A foreground sandbox's commands hold the pool's background work back while they run.
        self.foreground = foreground
        self.closed = False
        # Its disk state across commands: what it may hold while one runs (see channel.DiskFloor).
        self._disk = DiskFloor()

    def run(
        self, command: str, timeout: float | None = None, files: bool = False, clean: bool = False
    ) -> CommandResult:
        """Run one command (see pivot_envs.sandboxes.protocol.Sandbox.run) through the sandbox's command server."""
        if self.closed:
            raise SandboxError("this sandbox is closed")
        with self.owner.running() if self.foreground else nullcontext():
            return self._run(command, timeout, files, clean)

    def _run(self, command: str, timeout: float | None, files: bool, clean: bool) -> CommandResult:
        raise NotImplementedError

    def stop_processes(self, timeout: float = 5.0) -> bool:
        """Kill every process earlier commands left running; whether none is left (runner.stop_processes)."""
        return stop_processes(self, timeout)

    def fork(self, snapshot: Snapshot) -> Any:
        """A new sandbox from `snapshot`."""
        return self.owner.fork(snapshot)
