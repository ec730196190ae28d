"""What the serve app's handlers share (ServerState), and their refusals (HTTPError): imported by
both protocols' routes (server, nemo_gym). No web framework here."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium as gym

import pivot_envs
from pivot_envs.env import json_safe
from pivot_envs.errors import PivotEnvsError, did_you_mean
from pivot_envs.scoring import resolve_env
from pivot_envs.serve.config import ServeConfig
from pivot_envs.serve.metrics import Metrics
from pivot_envs.serve.sessions import SessionPool


class HTTPError(PivotEnvsError):
    """A request the server refuses: `status` and the message naming what was wrong."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


class ServerState:
    """The config, the env factory, the pool, the pivots and the counters of one server.

    The first env is made here, before the server listens: a bad env id, env argument or pivot
    file fails at start, not at the first request. It joins the pool as an idle env.
    """

    def __init__(self, config: ServeConfig) -> None:
        from pivot_envs.cli import version

        if not config.env:
            raise PivotEnvsError("ServeConfig.env is required: the env id to serve (--env pivot/terminal-v0)")
        self.config = config
        gym.register_envs(pivot_envs)
        self.env_kwargs = {key: value for key, value in config.env_kwargs.items() if key != "pivots"}
        pivots = config.pivots or config.env_kwargs.get("pivots")
        first = gym.make(
            config.env, disable_env_checker=True, **self.env_kwargs, **({"pivots": pivots} if pivots else {})
        )
        inner = first.unwrapped
        self.domain = str(inner.domain)
        self.pivots = list(inner.pivots)
        self.pivot_ids = [pivot.id for pivot in self.pivots]
        self.row_index: dict[str | None, str] | None = None  # NeMo-Gym row digest -> pivot id (nemo_gym)
        self.pivot_index = {pivot_id: i for i, pivot_id in enumerate(self.pivot_ids)}
        self.version = version()
        self.token = config.effective_token()
        self.metrics = Metrics()
        self.executor = ThreadPoolExecutor(max_workers=config.max_sessions, thread_name_prefix="pivot-serve")
        # Later envs share the first one's pivots (read once, held once).
        self.make_env = self.make_env_for(self.pivots)
        self.pool = SessionPool(
            self.make_env, self.executor, config.max_sessions, config.queue_timeout, config.session_ttl
        )
        self.pool.adopt(_share_observations(first))

    def make_env_for(self, pivots: list[Any]) -> Callable[[], Any]:
        """A factory of envs holding `pivots` instead of the server's (for a request's own pivot)."""
        return _sharing(resolve_env(self.config.env, pivots, **self.env_kwargs))

    def reset_options(self, pivot: str | None, index: int | None) -> dict[str, Any]:
        """gym reset options for a pivot id or an index (or neither: a seeded draw); raises
        HTTPError 422 naming an unknown pivot or an index out of range."""
        if pivot is not None:
            if pivot not in self.pivot_index:
                raise HTTPError(
                    422,
                    f"pivot: unknown pivot id {pivot!r} in {self.config.env}"
                    f"{did_you_mean(pivot, [str(p) for p in self.pivot_ids])}",
                )
            return {"pivot": pivot}
        if index is not None:
            if not 0 <= index < len(self.pivot_ids):
                raise HTTPError(422, f"index: {index} is out of range [0, {len(self.pivot_ids)})")
            return {"index": index}
        return {}

    def observe(self, seconds: list[float]) -> None:
        """Count env steps that took `seconds` each."""
        for value in seconds:
            self.metrics.observe_step(value)


def _share_observations(env: Any) -> Any:
    """`env` with observation copies off: the server makes each result JSON-safe (a new
    structure) before anything could edit it, so the env's own copy would be a second one."""
    if hasattr(env.unwrapped, "copy_observations"):
        env.unwrapped.copy_observations = False
    return env


def _sharing(make_env: Callable[[], Any]) -> Callable[[], Any]:
    """`make_env` whose envs share their observations (see _share_observations)."""
    return lambda: _share_observations(make_env())


def json_bytes(content: Any) -> bytes:
    """`content` as compact UTF-8 JSON. Env results are plain JSON already (PivotEnv makes them
    so) and go straight to the encoder; one that is not (a domain's own info value, a lone
    surrogate) goes through json_safe first."""
    try:
        return json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode()
    except (TypeError, ValueError, UnicodeEncodeError):
        return json.dumps(json_safe(content), ensure_ascii=False, separators=(",", ":")).encode()


def raw_json(body: bytes, status: int = 200) -> Any:
    """A JSON response (a starlette Response) of an encoded body."""
    from starlette.responses import Response

    return Response(body, status_code=status, media_type="application/json")


def json_response(content: Any, status: int = 200) -> Any:
    """`content` as a JSON response (see json_bytes)."""
    return raw_json(json_bytes(content), status)


def step_result(observation: Any, reward: float, terminated: bool, truncated: bool, info: dict) -> dict:
    """A step's return as the protocol's object; info always carries the verdict's fields."""
    info = dict(info)
    for key, default in (("category", ""), ("valid", True), ("strict_reward", 0.0), ("detail", "")):
        info.setdefault(key, default)
    return {
        "observation": observation,
        "reward": float(reward),
        "terminated": bool(terminated),
        "truncated": bool(truncated),
        "info": info,
    }
