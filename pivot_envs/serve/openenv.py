"""OpenEnv's protocol on the serve app: `add_routes(app)` registers the routes of the installed
`openenv` package's own `HTTPEnvServer` (WebSocket `/ws`, `/reset`, `/step`, `/state`, `/schema`,
`/metadata`) around `PivotEnvironment`, an OpenEnv `Environment` over the server's pooled pivot envs.
OpenEnv's `GenericEnvClient` (or `PivotEnvClient` here) drives it; see docs/openenv.md.

Each OpenEnv session (one WebSocket) is one episode per reset:
    reset(seed=, episode_id=, pivot=, index=, group=)   restore a pivot (by id, index or seeded draw)
    step(PivotAction(action=completion text | assistant message))  -> reward, done=True, info

Members of a group (the same `group` key in reset) share one env restored at one pivot; each
member's step runs from the pivot state in its own fork (the env resets to the pivot, from its
cached snapshot, before every step but the group's first), as `/steps` scores a group.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hmac
import time
from collections.abc import Callable
from typing import Any

from pivot_envs.env import json_safe
from pivot_envs.errors import MissingExtraError

try:
    from openenv.core import EnvClient, HTTPEnvServer
    from openenv.core.client_types import StepResult
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State
except ImportError as error:
    raise MissingExtraError("pivotrl serve --openenv", error.name or "openenv", "openenv") from None
from pydantic import Field

from pivot_envs.serve.sessions import Session
from pivot_envs.serve.state import HTTPError, ServerState, step_result

RESET_ARGUMENTS = ("seed", "episode_id", "pivot", "index", "group")


class PivotAction(Action):
    """One sampled assistant turn: completion text (parsed by the domain) or an assistant message."""

    # a plain union, no custom validator: OpenEnv's WebSocket handler cannot serialize the
    # exception a validator's ValueError leaves in pydantic's errors (it ends the session)
    action: str | dict[str, Any] = Field(description="completion text or an assistant message object")


class PivotObservation(Observation):
    """The env's observation, its info (category, valid, strict_reward, detail, pivot_id, ...) and,
    after a reset, the pivot's record (expert included)."""

    messages: list[dict[str, Any]] = Field(default_factory=list, description="the chat s_t")
    tools: list[dict[str, Any]] = Field(default_factory=list, description="OpenAI function tool schemas")
    info: dict[str, Any] = Field(default_factory=dict, description="the env's reset or step info")
    pivot: dict[str, Any] | None = Field(None, description="the pivot's record (after a reset)")


class PivotState(State):
    """Where the session is: its pivot, its group, the env id."""

    pivot_id: str | None = None
    group: str | None = None
    env_id: str | None = None


@dataclasses.dataclass
class Group:
    """A pooled env restored at one pivot, shared by the members of a group."""

    key: str
    session: Session
    options: dict[str, Any]
    reset_answer: tuple[dict, dict]  # the (observation, info) every member's reset returns
    members: int = 0
    fresh: bool = True  # the env is at the pivot state, not stepped since its reset
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)


class Hub:
    """What the OpenEnv sessions of one server share: the server's state (env pool, pivots,
    metrics), the groups, and the event loop their pooled envs are used from."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.groups: dict[str, Group] = {}
        self.releases: set[asyncio.Task] = set()  # held until done: the loop keeps only weak references
        self.loop: asyncio.AbstractEventLoop | None = None


class PivotEnvironment(Environment):
    """An OpenEnv Environment over the server's pooled pivot envs (one per session, or a group's)."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session leases its own env, or a group's under its lock

    def __init__(self, hub: Hub) -> None:
        super().__init__()
        self.hub = hub
        self.session: Session | None = None  # the pooled env this session leased (no group)
        self.group: Group | None = None
        self.stepped = False
        self._state = PivotState(env_id=hub.state.config.env)

    # -- reset ------------------------------------------------------------------------------------

    async def reset_async(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        pivot: str | None = None,
        index: int | None = None,
        group: str | None = None,
        **unknown: Any,
    ) -> PivotObservation:
        """Restore a pivot: `pivot` (an id) or `index`, else a draw seeded by `seed`; with `group`,
        join (or start) the group's shared env at its pivot."""
        if unknown:
            raise HTTPError(
                422, f"reset: unknown argument(s) {sorted(unknown)}; known: {', '.join(RESET_ARGUMENTS)}"
            )
        if pivot is not None and index is not None:
            raise HTTPError(422, "reset: give at most one of 'pivot' and 'index'")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise HTTPError(422, f"reset: seed {seed!r} must be an integer >= 0")
        options = self.hub.state.reset_options(pivot, index)
        self.hub.loop = asyncio.get_running_loop()
        await self._release()
        if group is None:
            self.session = await self.hub.state.pool.open()
            observation, info = await self._run(_reset, self.session, seed, options)
        else:
            observation, info = await self._join(str(group), seed, options)
        self.stepped = False
        pivot_id = info.get("pivot_id")
        self._state = PivotState(
            episode_id=episode_id, pivot_id=pivot_id, group=group, env_id=self.hub.state.config.env
        )
        record = self.hub.state.pivots[self.hub.state.pivot_index[pivot_id]].to_dict()
        return PivotObservation(
            messages=observation.get("messages", []),
            tools=observation.get("tools", []),
            info=info,
            pivot=json_safe(record),
        )

    async def _join(self, key: str, seed: int | None, options: dict) -> tuple[dict, dict]:
        hub = self.hub
        group = hub.groups.get(key)
        if group is not None and group.session.closed:  # its env was closed unused (--session-ttl)
            del hub.groups[key]
            group = None
        if group is not None:
            wanted = options.get("pivot") or (
                hub.state.pivot_ids[options["index"]] if "index" in options else None
            )
            at = group.options["pivot"]
            if wanted is not None and wanted != at:
                raise HTTPError(
                    409, f"reset: group {key!r} is at pivot {at!r}, not {wanted!r}; use another group key"
                )
        else:
            session = await hub.state.pool.open()
            try:
                observation, info = await self._run(_reset, session, seed, options)
            except BaseException:
                await hub.state.pool.close(session.id, broken=True)
                raise
            group = Group(key, session, {"pivot": info.get("pivot_id")}, (observation, info))
            hub.groups[key] = group
        group.members += 1
        self.group = group
        return group.reset_answer

    # -- step -------------------------------------------------------------------------------------

    async def step_async(
        self, action: PivotAction, timeout_s: float | None = None, **kwargs: Any
    ) -> PivotObservation:
        """Score `action` at the session's pivot; the episode then ends (done=True)."""
        if self.session is None and self.group is None:
            raise HTTPError(
                409,
                "step: no pivot restored: reset first (over HTTP, /step runs on a fresh env each call; "
                "use the WebSocket session /ws, which OpenEnv's clients open)",
            )
        if self.stepped:
            raise HTTPError(409, "step: the episode ended (one step per reset): reset first")
        self.stepped = True
        if self.group is None:
            result, seconds = await self._run(_step, self.session, None, action.action)
        else:
            group = self.group
            async with group.lock:
                restore, group.fresh = (None if group.fresh else group.options), False
                result, seconds = await self._run(_step, group.session, restore, action.action)
        self.hub.state.observe([seconds])
        self._state.step_count += 1
        observation = result["observation"] or {}
        return PivotObservation(
            messages=observation.get("messages", []),
            tools=observation.get("tools", []),
            info=result["info"],
            reward=result["reward"],
            done=True,
        )

    # -- the rest of the Environment interface ------------------------------------------------------

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> PivotObservation:
        """reset_async from a thread other than the server's event loop."""
        return self._on_loop(self.reset_async(seed=seed, episode_id=episode_id, **kwargs))

    def step(self, action: PivotAction, timeout_s: float | None = None, **kwargs: Any) -> PivotObservation:
        """step_async from a thread other than the server's event loop."""
        return self._on_loop(self.step_async(action))

    @property
    def state(self) -> PivotState:
        return self._state

    def close(self) -> None:
        """Give the pooled env (or the group membership) back; called by OpenEnv when the session ends."""
        loop = self.hub.loop
        if loop is None or (self.session is None and self.group is None):
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            task = loop.create_task(self._release())
            self.hub.releases.add(task)
            task.add_done_callback(self.hub.releases.discard)
        else:
            asyncio.run_coroutine_threadsafe(self._release(), loop).result(timeout=60)

    # -- helpers ----------------------------------------------------------------------------------

    async def _run(self, function: Callable[..., Any], session: Session, *args: Any) -> Any:
        if session.closed:
            raise HTTPError(
                404,
                f"the session's env was closed after {self.hub.state.config.session_ttl:g} s unused "
                "(--session-ttl): reset again",
            )
        session.last_used = time.monotonic()
        return await self.hub.state.pool.run(function, session.env, *args)

    async def _release(self) -> None:
        session, group, self.session, self.group = self.session, self.group, None, None
        pool = self.hub.state.pool
        if session is not None and not session.closed:
            await pool.close(session.id)
        if group is not None:
            group.members -= 1
            if group.members == 0 and self.hub.groups.get(group.key) is group:
                del self.hub.groups[group.key]
                if not group.session.closed:
                    await pool.close(group.session.id)

    def _on_loop(self, coroutine: Any) -> Any:
        if self.hub.loop is None:
            coroutine.close()
            raise HTTPError(409, "no server event loop yet: use reset_async/step_async (the server does)")
        return asyncio.run_coroutine_threadsafe(coroutine, self.hub.loop).result()


def _reset(env: Any, seed: int | None, options: dict) -> tuple[dict, dict]:
    observation, info = env.reset(seed=seed, options=options)
    return json_safe(observation), json_safe(info)


def _step(env: Any, restore: dict | None, action: Any) -> tuple[dict, float]:
    """One step (after restoring the pivot when `restore`), as the protocol's result, and its seconds."""
    started = time.perf_counter()
    if restore is not None:
        env.reset(options=restore)
    result = json_safe(step_result(*env.step(action)))
    return result, time.perf_counter() - started


# -- the app ---------------------------------------------------------------------------------------


def add_routes(app: Any, state: ServerState | None = None) -> HTTPEnvServer:
    """Register OpenEnv's routes (its own HTTPEnvServer's) on the serve app; returns that server.
    Routes the app has already (`/health`) keep the app's answer."""
    state = state or app.state.serve
    config = state.config
    server = HTTPEnvServer(
        functools.partial(PivotEnvironment, Hub(state)),
        PivotAction,
        PivotObservation,
        # a WebSocket holds no env until its reset, and a group's members share one: the envs are
        # bounded by the pool (--max-sessions); the sockets by a group of --max-batch per env
        max_concurrent_envs=config.max_sessions * config.max_batch,
        env_name=config.env.replace("/", "-"),
        state_cls=PivotState,
    )
    server.register_routes(app)
    if state.token:
        app.add_middleware(WebSocketToken, token=state.token)
    return server


class WebSocketToken:
    """ASGI middleware: a WebSocket must carry `Authorization: Bearer <token>` (HTTP requests are
    checked by the serve app's own Guard); a missing or wrong one is closed with code 1008."""

    def __init__(self, app: Callable, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "websocket":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                await send(
                    {"type": "websocket.close", "code": 1008, "reason": "missing or wrong bearer token"}
                )
                return
        await self.app(scope, receive, send)


class PivotEnvClient(EnvClient[PivotAction, PivotObservation, PivotState]):
    """OpenEnv's EnvClient typed for pivot envs: `step` takes a PivotAction, results hold PivotObservations."""

    def _step_payload(self, action: PivotAction) -> dict[str, Any]:
        return action.model_dump()

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[PivotObservation]:
        observation = PivotObservation(
            **payload.get("observation", {}), reward=payload.get("reward"), done=payload.get("done", False)
        )
        return StepResult(
            observation=observation, reward=payload.get("reward"), done=payload.get("done", False)
        )

    def _parse_state(self, payload: dict[str, Any]) -> PivotState:
        return PivotState(**payload)
