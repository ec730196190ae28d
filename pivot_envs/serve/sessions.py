"""The server's bounded pool of envs and the sessions that hold them.

At most `max_sessions` envs are alive at once: each open session holds one, each /verify call
holds one while it scores. A request that finds none free waits in a first-come queue for up to
`queue_timeout` seconds, then gets QueueTimeout (the server answers 503 with Retry-After). Envs
of closed sessions stay alive, idle, for the next session (a terminal env keeps its sandbox
backend and prefix snapshots warm), until they are unused for the session TTL.

Everything here runs on the server's event loop; the blocking env calls (make, reset, step,
close) go to the thread pool the caller gives.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from pivot_envs.errors import PivotEnvsError


class QueueTimeout(PivotEnvsError, RuntimeError):
    """No env came free within the queue timeout; `retry_after` is a suggested wait in seconds."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class UnknownSession(PivotEnvsError, KeyError):
    """A session id that is not open (never was, closed, or expired)."""

    def __str__(self) -> str:
        return str(self.args[0])


class SlotGate:
    """`slots` permits handed out first come, first served; a waiter gives up after a timeout.

    asyncio.Semaphore under wait_for can lose a permit when a timeout and a release meet; here a
    release hands its permit to the first waiter's future directly, and a waiter whose future was
    handed one keeps it even if its timeout fired in the same turn.
    """

    def __init__(self, slots: int) -> None:
        self.free = slots
        self._waiters: deque[asyncio.Future] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self, timeout: float) -> bool:
        """Take a permit, waiting up to `timeout` seconds; False when none came."""
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return True
        future = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            await asyncio.wait({future}, timeout=timeout)
        except BaseException:  # cancelled while waiting: a permit handed over meanwhile goes back
            if future.done():
                self.release()
            raise
        finally:
            if not future.done():
                self._waiters.remove(future)
                future.cancel()
        return not future.cancelled()

    def release(self) -> None:
        while self._waiters:
            future = self._waiters.popleft()
            if not future.done():
                future.set_result(None)
                return
        self.free += 1


@dataclass
class Session:
    """An open session: its env (reset to `pivot_id`), whether that episode was stepped, and a
    lock that keeps two requests from using the env at once."""

    id: str
    env: Any
    pivot_id: Any = None
    stepped: bool = False
    closed: bool = False
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class SessionPool:
    """Envs from `make_env`, at most `max_sessions` alive, lent to sessions and one-off calls.

    make_env:       () -> env (blocking; run on `executor`).
    queue_timeout:  seconds a lease waits for a free env before QueueTimeout.
    ttl:            seconds a session (or an idle env) may stay unused before `reap` closes it.
    """

    def __init__(
        self,
        make_env: Callable[[], Any],
        executor: Executor,
        max_sessions: int,
        queue_timeout: float,
        ttl: float,
    ) -> None:
        self.make_env = make_env
        self.executor = executor
        self.max_sessions = max_sessions
        self.queue_timeout = queue_timeout
        self.ttl = ttl
        self.sessions: dict[str, Session] = {}
        self._gate = SlotGate(max_sessions)
        self._idle: list[tuple[float, Any]] = []  # (when it went idle, env)
        self.alive = 0

    @property
    def queue_length(self) -> int:
        """Requests waiting for an env now."""
        return self._gate.waiting

    def adopt(self, env: Any) -> None:
        """Add an env made elsewhere (the server's first) to the idle pool."""
        self.alive += 1
        self._idle.append((time.monotonic(), env))

    async def run(self, function: Callable[..., Any], *args: Any) -> Any:
        """`function(*args)` on the thread pool (env calls block; the event loop must not)."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)

    async def _slot(self) -> None:
        if not await self._gate.acquire(self.queue_timeout):
            raise QueueTimeout(
                f"all {self.max_sessions} envs are busy and none came free within {self.queue_timeout:g} s "
                f"(--max-sessions, --queue-timeout)",
                retry_after=max(1, math.ceil(self.queue_timeout)),
            )

    async def lease(self) -> Any:
        """A pooled env (an idle one, else a new one), waiting in the queue for a free slot."""
        await self._slot()
        if self._idle:
            return self._idle.pop()[1]
        try:
            env = await self.run(self.make_env)
        except BaseException:
            self._gate.release()
            raise
        self.alive += 1
        return env

    async def give_back(self, env: Any, broken: bool = False) -> None:
        """Return a leased env to the idle pool, or close it when `broken` (its state is unknown)."""
        if broken:
            await self._close_env(env)
        else:
            self._idle.append((time.monotonic(), env))
        self._gate.release()

    async def lease_one_off(self, make: Callable[[], Any]) -> Any:
        """An env from `make` (not pooled: give it back with `close_one_off`), in a slot of its
        own; an idle pooled env is closed first so the alive count stays within max_sessions."""
        await self._slot()
        try:
            if self._idle:
                await self._close_env(self._idle.pop(0)[1])
            env = await self.run(make)
        except BaseException:
            self._gate.release()
            raise
        self.alive += 1
        return env

    async def close_one_off(self, env: Any) -> None:
        await self._close_env(env)
        self._gate.release()

    async def _close_env(self, env: Any) -> None:
        self.alive -= 1
        await self.run(env.close)

    # -- sessions ---------------------------------------------------------------------------------

    async def open(self) -> Session:
        """A new session holding a leased env (not yet reset)."""
        env = await self.lease()
        session = Session(id=secrets.token_urlsafe(12), env=env)
        self.sessions[session.id] = session
        return session

    def get(self, session_id: str) -> Session:
        """The open session `session_id`; raises UnknownSession naming it."""
        session = self.sessions.get(session_id)
        if session is None:
            raise UnknownSession(f"session {session_id!r} is not open (never opened, closed, or expired)")
        session.last_used = time.monotonic()
        return session

    async def close(self, session_id: str, broken: bool = False) -> None:
        """Close a session (after any request using it finishes); its env goes back to the pool."""
        session = self.sessions.get(session_id)
        if session is None:
            raise UnknownSession(f"session {session_id!r} is not open (never opened, closed, or expired)")
        session.closed = True  # a request already waiting on the lock sees it and answers 404
        async with session.lock:
            await self.discard(session, broken)

    async def discard(self, session: Session, broken: bool = False) -> None:
        """Close `session` now, its lock held by the caller (a request that found its env broken)."""
        session.closed = True
        if self.sessions.pop(session.id, None) is not None:
            await self.give_back(session.env, broken)

    async def reap(self) -> int:
        """Close the sessions and idle envs unused for longer than the TTL; returns the sessions closed."""
        cutoff = time.monotonic() - self.ttl
        stale = [s.id for s in self.sessions.values() if s.last_used < cutoff and not s.lock.locked()]
        for session_id in stale:
            if session_id in self.sessions:
                await self.close(session_id)
        old = [env for since, env in self._idle if since < cutoff]
        self._idle = [(since, env) for since, env in self._idle if since >= cutoff]
        for env in old:
            await self._close_env(env)
        return len(stale)

    async def shutdown(self) -> None:
        """Close every session and every env."""
        for session_id in list(self.sessions):
            await self.close(session_id)
        idle, self._idle = self._idle, []
        for _, env in idle:
            await self._close_env(env)
