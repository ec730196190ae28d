"""`pivot/remote-v0`: a pivot env whose steps run on `pivotrl serve` servers.

    env = gym.make("pivot/remote-v0", urls=["http://cpu1:8700", "http://cpu2:8700"],
                   env_id="pivot/terminal-v0", token=None, timeout=60.0, retries=3)

It behaves like the env it serves (reset to a pivot, one step, the same spaces, observations and
infos as the server returns them); the sessions of every env built with the same settings spread
over the servers, and a server that dies mid-run has its sessions moved to another one (see
`pivot_envs.serve.pool`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import gymnasium as gym
from gymnasium.error import ResetNeeded
from gymnasium.vector import AutoresetMode

from pivot_envs.config import ConfigError
from pivot_envs.env import PivotSource, action_text, json_safe, load_pivot_file, pick_index
from pivot_envs.errors import PivotSetError
from pivot_envs.pivot import Pivot, PivotFormatError
from pivot_envs.registry import DomainSpec
from pivot_envs.serve.config import TOKEN_VARIABLE
from pivot_envs.serve.pool import RemoteRequestError, ServerPool, ServersUnavailableError, Session
from pivot_envs.spaces import Chat, Completion

Result = tuple[dict[str, Any], float, bool, bool, dict[str, Any]]


class RemoteEnv(gym.Env):
    """A pivot env served over HTTP by one or more `pivotrl serve` servers.

    urls:     the servers (a list, or one string of comma-separated URLs), all hosting `env_id`
              with the same pivots.
    env_id:   the env the servers must host (None: whatever they host).
    pivots:   the pivots this env resets to (Pivot objects, dicts, ids, or a pivot file): a subset
              of the servers' (checked), in this order; None: all of the servers' pivots.
    token:    the servers' bearer token (default: $PIVOT_ENVS_SERVE_TOKEN, as the servers read
              it; None there too: send none). timeout: seconds per request. retries: retries of a
              failed request on one server before it is marked down. cooldown: seconds before a
              server marked down is tried again.
    verifier: must be None: the servers' env verifies (start them with `--env-arg verifier=NAME`).

    reset(seed, options) picks a pivot as the local env does (`options={"pivot": id}`,
    `{"index": i}`, or a draw from `self.np_random` over this env's pivots, so a seed picks the
    same pivot here and there), then resets this env's session to it (opening one on the
    least-loaded server first). info["index"] is the pivot's index in this env's pivots.
    `self.pivot` is then that pivot's `Pivot`, as the servers hold it (expert included), as in
    every pivot env; the servers send each record once per pool (see ServerPool.records).

    step(action) steps the session: the server's (observation, reward, terminated, truncated,
    info). step never raises on an action: when no server is left after the retries, the step
    is `valid=False` with category "infrastructure_error" and the detail naming each server (an
    infrastructure failure is masked, never counted as reward 0); a server's 4xx is one too.
    reset raises ServersUnavailableError (an InfrastructureError) then, as a local env whose
    restore failed does. `step_group(actions)` scores several actions from the same pivot state
    in one request. close() deletes the session.
    """

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.SAME_STEP}
    domain = "remote"
    verifiers: dict[str, Any] = {}  # the servers' env verifies

    def __init__(
        self,
        urls: Sequence[str] | str | None = None,
        env_id: str | None = None,
        pivots: PivotSource | Iterable[str] = None,
        token: str | None = None,
        timeout: float = 60.0,
        retries: int = 3,
        cooldown: float = 30.0,
        verifier: str | None = None,
    ) -> None:
        if verifier is not None:
            raise ConfigError(
                f"pivot/remote-v0 takes no verifier (got {verifier!r}): the servers' env verifies; "
                "start the servers with the verifier to use (pivotrl serve --env-arg verifier=NAME)"
            )
        if isinstance(urls, str):
            urls = [url.strip() for url in urls.split(",") if url.strip()]
        if not urls:
            raise ConfigError(
                "pivot/remote-v0 needs the servers' URLs: gym.make('pivot/remote-v0', urls=[...]), "
                """or --env-kwargs '{"urls": ["http://HOST:PORT", ...]}'"""
            )
        self.pool = ServerPool.shared(
            urls,
            env_id=env_id,
            token=token or os.environ.get(TOKEN_VARIABLE) or None,
            timeout=timeout,
            retries=retries,
            cooldown=cooldown,
        )
        self._session: Session | None = None
        try:
            info = self.pool.info()
            self.env_id: str = info["env_id"]
            self.pivot_ids = self._select(pivots, [str(pivot) for pivot in info.get("pivots", [])])
        except BaseException:
            self.pool.release()
            raise
        self._by_id = {pivot: index for index, pivot in enumerate(self.pivot_ids)}
        self.observation_space = Chat()
        self.action_space = Completion()
        self.pivot: Pivot | None = None
        self._prefix: dict[str, Any] | None = None
        self._stepped = False
        self._closed = False

    def _select(self, pivots: PivotSource | Iterable[str], hosted: list[str]) -> list[str]:
        """The ids of `pivots` (all of `hosted` when None), each checked to be among `hosted`."""
        if pivots is None:
            chosen = hosted
        else:
            if isinstance(pivots, (str, bytes)) or hasattr(pivots, "__fspath__"):
                pivots = load_pivot_file(pivots)
            chosen = [_pivot_id(pivot) for pivot in pivots]
        if not chosen:
            raise PivotSetError(f"{self.env_id} at {self._urls()}: the pivot set is empty")
        known = set(hosted)
        missing = [pivot for pivot in chosen if pivot not in known]
        if missing:
            raise PivotSetError(
                f"{len(missing)} pivots are not hosted by {self.env_id} at {self._urls()} "
                f"(first: {missing[:3]}); start the servers with these pivots"
            )
        return chosen

    def _urls(self) -> str:
        return ", ".join(server.url for server in self.pool.servers)

    @property
    def server(self) -> str | None:
        """The URL of the server holding this env's session (None before the first reset)."""
        return self._session.server.url if self._session is not None else None

    # -- gymnasium API --------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        index = pick_index(options, self._by_id, len(self.pivot_ids), self.np_random)
        pivot_id = self.pivot_ids[index]
        self.pivot, self._prefix, self._stepped = None, None, False
        if self._session is None or self._session.closed:
            self._session, answer = self.pool.open(pivot_id, seed)
        else:
            self._session.pivot, self._session.seed = pivot_id, seed
            body = {
                "pivot": pivot_id,
                "index": None,
                "seed": seed,
                "record": pivot_id not in self.pool.records,
            }
            self._session, answer = self.pool.call(self._session, "reset", body)
        self.pivot = self._record(pivot_id, answer)
        self._prefix = answer["observation"]
        return answer["observation"], {**answer.get("info", {}), "index": index}

    def step(self, action: Any) -> Result:
        if self._session is None or self._prefix is None or self._stepped:
            raise ResetNeeded("call reset() before step(): a pivot episode is one step long")
        self._stepped = True
        # The local env's verdict on such an action, without a request the server would refuse (422).
        if not isinstance(action, (str, dict)):
            detail = f"an action must be text or a message dict, got {type(action).__name__}"
            return self._refused(action, "unparseable", detail, valid=True)
        try:
            self._session, answer = self.pool.call(self._session, "step", {"action": json_safe(action)})
        except (ServersUnavailableError, RemoteRequestError) as error:
            return self._refused(action, "infrastructure_error", str(error), valid=False)
        return self._result(answer)

    def step_group(self, actions: Sequence[Any]) -> list[Result]:
        """Score `actions` from the current pivot's state in one request (a GRPO group): a result
        per action as `step` returns it. The episode is not used up: step may follow."""
        if self._session is None or self._prefix is None:
            raise ResetNeeded("call reset() before step_group(): the actions are scored at the reset pivot")
        try:
            self._session, answer = self.pool.call(
                self._session, "steps", {"actions": [json_safe(action) for action in actions]}
            )
        except (ServersUnavailableError, RemoteRequestError) as error:
            return [
                self._refused(action, "infrastructure_error", str(error), valid=False) for action in actions
            ]
        return [self._result(result) for result in answer["results"]]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._session is not None:
            self.pool.close(self._session)
        self.pool.release()

    # -- helpers ----------------------------------------------------------------------------------

    def _record(self, pivot_id: str, answer: dict[str, Any]) -> Pivot:
        """The Pivot `pivot_id`: from the server's reset `answer` when it sent the record (kept in
        the pool), else the pool's copy; raises PivotFormatError when a server sends neither."""
        record = answer.get("pivot")
        if record is not None:
            self.pool.records[pivot_id] = Pivot.from_dict(record)
        pivot = self.pool.records.get(pivot_id)
        if pivot is None:
            raise PivotFormatError(
                f"{self.env_id} at {self.server}: the reset answer for {pivot_id!r} has no pivot record; "
                "start the servers with this version of pivot-envs"
            )
        return pivot

    @staticmethod
    def _result(answer: dict[str, Any]) -> Result:
        return (
            answer["observation"],
            float(answer["reward"]),
            bool(answer["terminated"]),
            bool(answer["truncated"]),
            answer["info"],
        )

    def _refused(self, action: Any, category: str, detail: str, valid: bool) -> Result:
        """The result of a step no server took: the prefix and the action, reward 0, `category`, `valid`."""
        prefix = self._prefix or {"messages": [], "tools": []}
        shown = {
            "role": "assistant",
            "content": json_safe(action) if isinstance(action, str) else action_text(action),
        }
        info = {
            "pivot_id": self.pivot.id if self.pivot is not None else None,
            "category": category,
            "detail": detail,
            "parsed": None,
            "valid": valid,
            "strict_reward": 0.0,
            "output": None,
        }
        return {"messages": [*prefix["messages"], shown], "tools": prefix["tools"]}, 0.0, True, False, info


def _pivot_id(pivot: Pivot | dict[str, Any] | str) -> str:
    """The id of a Pivot, a pivot record or an id."""
    if isinstance(pivot, Pivot):
        return pivot.id
    return str(pivot["id"]) if isinstance(pivot, dict) else str(pivot)


DOMAIN = DomainSpec(
    name="remote",
    env_class=RemoteEnv,
    description="any pivot env served by `pivotrl serve` servers: sessions spread over them, retries, failover",
    verifiers=(),
)
