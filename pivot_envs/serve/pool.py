"""The client side of `pivotrl serve`: a pool of servers that host one pivot env.

`ServerPool` opens sessions on the least-loaded server that is up (ties taken in turn), sends
every request through httpx with a timeout and retries what retrying can cure with tenacity:
connection errors and 5xx answers with exponential backoff and jitter, 503 (the server's session
queue is full) after the Retry-After it names. A 4xx is never retried: it is the request's fault
(`RemoteRequestError` names the server, the request and the answer), except a 404 for a session
(the server forgot it: a restart) or a 409 (its one step was taken: a step whose answer was lost
on the way and is sent again): the session is opened again at its pivot.

Failover: a server that fails a request after its retries is marked down for `cooldown` seconds
(then a /health probe lets it back); each session on it is opened again at the same pivot on
another server and the request is sent there. A pivot episode is one step from the restored
pivot state, so a step sent twice gives one result from the same state: nothing is lost or
doubled. When no server is left, `ServersUnavailableError` (an InfrastructureError) names each
URL and why it failed.

Pools are shared: `ServerPool.shared(...)` hands every env built with the same settings in a
process the same pool, so sessions spread over the servers across envs (an EnvPool's threads).
"""

from __future__ import annotations

import email.utils
import itertools
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pivot_envs.config import ConfigError
from pivot_envs.env import InfrastructureError
from pivot_envs.errors import MissingExtraError, PivotEnvsError
from pivot_envs.pivot import Pivot

logger = logging.getLogger(__name__)

PROBE_TIMEOUT = 2.0  # seconds: a /health probe of a server coming back, and a session's DELETE


class ServersUnavailableError(InfrastructureError):
    """Every server of a pool failed a request after its retries (down, or its queue full); the
    message names each URL and its last failure."""


class RemoteRequestError(PivotEnvsError, ValueError):
    """A server refused a request with a 4xx answer (a wrong token, a bad field): retrying cannot cure it."""


class ServerMismatchError(PivotEnvsError, ValueError):
    """The servers of a pool do not host the env asked for, or not the same pivots."""


@dataclass(eq=False)
class Server:
    """One server of a pool: its URL, the pool's sessions open on it, and whether it is down."""

    url: str
    sessions: int = 0
    down_until: float = 0.0  # time.monotonic() before which it is not chosen; 0: up
    failure: str = ""  # why it was last marked down
    info: dict[str, Any] | None = None  # its /v1/info, read before its first session


@dataclass(eq=False)
class Session:
    """A session the pool opened: the server holding it, its id there, its pivot and seed, and
    whether the pool closed it (a closed session is opened anew, never sent a request)."""

    server: Server
    id: str
    pivot: str
    seed: int | None = None
    closed: bool = False


class _ServerDown(Exception):
    """A server failed a request after its retries (internal: the pool fails over)."""

    def __init__(self, server: Server, reason: str, busy: bool = False) -> None:
        super().__init__(reason)
        self.server, self.reason, self.busy = server, reason, busy


class _SessionLost(Exception):
    """A server answered 404 (it forgot the session) or 409 (its episode was used) for a session of
    ours (internal: the pool opens it again at its pivot)."""


class _ServerError(Exception):
    """A 5xx answer (internal: retried), with the Retry-After it named."""

    def __init__(self, status: int, text: str, retry_after: float | None) -> None:
        super().__init__(f"HTTP {status}: {text[:300]}")
        self.status, self.retry_after = status, retry_after


def _retry_after(value: str | None) -> float | None:
    """Seconds a Retry-After header asks for (delta-seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class ServerPool:
    """Sessions of one pivot env spread over `pivotrl serve` servers, with retries and failover.

    urls:      the servers (`http://host:port`), all hosting `env_id` with the same pivots.
    env_id:    the env the servers must host (None: whatever the first one hosts, the others alike).
    token:     the servers' bearer token (None: send none).
    timeout:   seconds each request may take (connecting: at most 5 of them).
    retries:   retries of a failed request on one server before it is marked down.
    cooldown:  seconds a server marked down is left alone before a /health probe may let it back.
    backoff:   the first retry's wait in seconds (doubling, plus up to as much jitter, at most 2 s).
    max_retry_after: the longest Retry-After honoured, in seconds (a longer one waits this long).
    """

    _shared: ClassVar[dict[tuple, ServerPool]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        urls: Sequence[str],
        env_id: str | None = None,
        token: str | None = None,
        timeout: float = 60.0,
        retries: int = 3,
        cooldown: float = 30.0,
        backoff: float = 0.1,
        max_retry_after: float = 10.0,
    ) -> None:
        try:
            import httpx
            import tenacity
        except ImportError as error:
            raise MissingExtraError("pivot/remote-v0", error.name or "httpx", "serve") from None
        urls = [str(url).rstrip("/") for url in urls]
        if not urls:
            raise ConfigError("a server pool needs at least one URL")
        bad = [url for url in urls if not url.startswith(("http://", "https://"))]
        if bad:
            raise ConfigError(f"server URLs must start with http:// or https://, got {bad}")
        if len(set(urls)) != len(urls):
            raise ConfigError(f"a server URL is listed twice: {urls}")
        if timeout <= 0 or retries < 0 or cooldown < 0 or backoff < 0:
            raise ConfigError(
                f"timeout must be > 0 and retries, cooldown, backoff >= 0; got timeout={timeout}, "
                f"retries={retries}, cooldown={cooldown}, backoff={backoff}"
            )
        self.servers = [Server(url) for url in urls]
        self.env_id = env_id
        self.retries, self.cooldown, self.max_retry_after = retries, cooldown, max_retry_after
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(
            timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)), headers=headers
        )
        self._transport_errors = httpx.TransportError
        self._retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(retries + 1),
            wait=self._wait,
            retry=tenacity.retry_if_exception(self._retryable),
            reraise=True,
        )
        self._backoff = tenacity.wait_exponential_jitter(initial=backoff, max=2.0, jitter=backoff)
        self._lock = threading.Lock()
        self._turn = itertools.count()
        self._users = 0
        self._key: tuple | None = None
        # The pivot records the servers sent, by id: every server holds the same pivots, so one each.
        self.records: dict[str, Pivot] = {}

    @classmethod
    def shared(cls, urls: Sequence[str], **settings: Any) -> ServerPool:
        """The pool of these URLs and settings in this process (made on first use); `release` it when done."""
        key = (tuple(str(url).rstrip("/") for url in urls), tuple(sorted(settings.items())))
        with cls._shared_lock:
            pool = cls._shared.get(key)
            if pool is None:
                pool = cls._shared[key] = cls(urls, **settings)
                pool._key = key
            pool._users += 1
            return pool

    def release(self) -> None:
        """One user of a shared pool is done; the last one closes it. A pool not shared is closed."""
        with self._shared_lock:
            self._users -= 1
            if self._key is not None and self._users > 0:
                return
            if self._key is not None:
                self._shared.pop(self._key, None)
        self._client.close()

    # -- one request to one server ------------------------------------------------------------------

    def request(self, server: Server, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """Send `method path` with the JSON `body` to `server`, retrying connection errors and 5xx.

        Returns the decoded JSON answer (None for an empty one). Raises RemoteRequestError on a
        4xx, _SessionLost on a 404 or 409 for a session, _ServerDown after the retries.
        """
        try:
            return self._retrying(self._send, server, method, path, body)
        except self._transport_errors as error:
            raise _ServerDown(server, f"{type(error).__name__}: {error or 'no answer'}") from error
        except _ServerError as error:
            raise _ServerDown(server, str(error), busy=error.status == 503) from error

    def _send(self, server: Server, method: str, path: str, body: dict[str, Any] | None) -> Any:
        response = self._client.request(method, server.url + path, json=body)
        status = response.status_code
        if status >= 500:
            raise _ServerError(status, response.text, _retry_after(response.headers.get("retry-after")))
        if status in (404, 409) and path.startswith("/v1/sessions/"):
            # 404: the server forgot the session (a restart); 409: its episode was stepped (a step whose answer was lost)
            raise _SessionLost(f"{server.url} answered {status} to {path}: {response.text[:300]}")
        if status >= 400:
            raise RemoteRequestError(f"{method} {server.url}{path}: HTTP {status}: {response.text[:500]}")
        return response.json() if response.content else None

    @staticmethod
    def _retryable(error: BaseException) -> bool:
        import httpx

        return isinstance(error, (httpx.TransportError, _ServerError))

    def _wait(self, state: Any) -> float:
        """The wait before a retry: the Retry-After a 503 named (at most `max_retry_after`), else the backoff."""
        error = state.outcome.exception() if state.outcome else None
        if isinstance(error, _ServerError) and error.retry_after is not None:
            return min(error.retry_after, self.max_retry_after)
        return self._backoff(state)

    # -- servers up and down ------------------------------------------------------------------------

    def _mark_down(self, server: Server, reason: str) -> None:
        with self._lock:
            server.down_until = time.monotonic() + self.cooldown
            server.failure = reason
        logger.warning("pivot/remote-v0: %s is down for %.0f s: %s", server.url, self.cooldown, reason)

    def _is_up(self, server: Server) -> bool:
        """Whether `server` may be chosen: never marked down, or back after its cool-down and a /health probe."""
        if server.down_until == 0.0:
            return True
        if time.monotonic() < server.down_until:
            return False
        try:
            answer = self._client.get(server.url + "/health", timeout=PROBE_TIMEOUT)
            healthy = answer.status_code == 200
        except self._transport_errors:
            healthy = False
        if not healthy:
            self._mark_down(server, f"{server.failure} (still failing its /health probe)")
            return False
        with self._lock:
            server.down_until = 0.0
        logger.info("pivot/remote-v0: %s is back", server.url)
        return True

    def _choose(self, failed: dict[str, str]) -> Server | None:
        """The up server with the fewest of the pool's sessions (ties in turn), none of `failed`; None if none."""
        candidates = [server for server in self.servers if server.url not in failed and self._is_up(server)]
        if not candidates:
            return None
        turn = next(self._turn)
        with self._lock:
            return min(
                candidates,
                key=lambda server: (server.sessions, (self.servers.index(server) - turn) % len(self.servers)),
            )

    def _unavailable(self, failed: dict[str, str]) -> ServersUnavailableError:
        reasons = [
            f"{server.url} ({failed.get(server.url) or server.failure or 'down'})" for server in self.servers
        ]
        return ServersUnavailableError(
            f"no server of {self.env_id or 'the remote env'} answered after {self.retries} retries each: "
            + "; ".join(reasons)
        )

    def _check(self, server: Server) -> None:
        """Read `server`'s /v1/info once and check it hosts the pool's env and the same pivots as the others."""
        if server.info is not None:
            return
        info = self.request(server, "GET", "/v1/info")
        with self._lock:
            known = next((other.info for other in self.servers if other.info is not None), None)
            if self.env_id is None:
                self.env_id = info.get("env_id")
            if info.get("env_id") != self.env_id:
                raise ServerMismatchError(f"{server.url} hosts {info.get('env_id')!r}, not {self.env_id!r}")
            if known is not None and list(known.get("pivots", [])) != list(info.get("pivots", [])):
                raise ServerMismatchError(
                    f"{server.url} hosts other pivots of {self.env_id} than the pool's other servers "
                    f"({len(info.get('pivots', []))} against {len(known.get('pivots', []))}): start every "
                    "server with the same pivot set, or failover could not re-create a session"
                )
            server.info = info

    def info(self) -> dict[str, Any]:
        """The /v1/info of the first server that answers (checked against `env_id`); raises
        ServersUnavailableError when none does, ServerMismatchError when it hosts another env."""
        failed: dict[str, str] = {}
        while True:
            known = next((server.info for server in self.servers if server.info is not None), None)
            if known is not None:
                return known
            server = self._choose(failed)
            if server is None:
                raise self._unavailable(failed)
            try:
                self._check(server)
            except _ServerDown as down:
                failed[server.url] = down.reason
                if not down.busy:
                    self._mark_down(server, down.reason)

    # -- sessions -----------------------------------------------------------------------------------

    def open(
        self, pivot: str, seed: int | None = None, failed: dict[str, str] | None = None
    ) -> tuple[Session, Any]:
        """Open a session at `pivot` on the least-loaded server that is up (none of `failed`, which
        gathers the servers that fail here): (the session, the server's answer {"session",
        "observation", "info"}). Raises ServersUnavailableError when every server failed."""
        failed = {} if failed is None else failed
        while True:
            server = self._choose(failed)
            if server is None:
                raise self._unavailable(failed)
            try:
                self._check(server)
                answer = self.request(
                    server, "POST", "/v1/sessions", {"pivot": pivot, "index": None, "seed": seed}
                )
            except _ServerDown as down:
                failed[server.url] = down.reason
                if not down.busy:
                    self._mark_down(server, down.reason)
                continue
            with self._lock:
                server.sessions += 1
            return Session(server, str(answer["session"]), pivot, seed), answer

    def call(self, session: Session, endpoint: str, body: dict[str, Any]) -> tuple[Session, Any]:
        """POST `body` to the session's `endpoint` (reset, step, steps): (the session, the answer).

        When the session's server fails after its retries, is marked down, or forgot the session,
        the session is opened again at its pivot on another server and the request sent there;
        the returned session is the one that answered. Raises ServersUnavailableError when every
        server failed (the session is closed then), RemoteRequestError on a 4xx.
        """
        failed: dict[str, str] = {}
        forgot: set[str] = set()  # servers that forgot a session once here: a second time, they are left out
        while True:
            server = session.server
            if session.closed:
                pass  # closed by an earlier failure: opened anew below
            elif not self._is_up(server):
                failed.setdefault(server.url, server.failure)
                self.close(session, delete=False)
            else:
                try:
                    return session, self.request(
                        server, "POST", f"/v1/sessions/{session.id}/{endpoint}", body
                    )
                except _ServerDown as down:
                    failed[server.url] = down.reason
                    if not down.busy:
                        self._mark_down(server, down.reason)
                    self.close(session, delete=down.busy)
                except _SessionLost as lost:
                    if server.url in forgot:
                        failed[server.url] = str(lost)
                    forgot.add(server.url)
                    self.close(session)
            logger.info(
                "pivot/remote-v0: session %s at pivot %s moves off %s", session.id, session.pivot, server.url
            )
            session, answer = self.open(session.pivot, session.seed, failed)
            if endpoint == "reset":  # opening it reset it to its pivot
                return session, answer

    def close(self, session: Session, delete: bool = True) -> None:
        """Forget `session` (once); with `delete`, ask its server to delete it (one try, a short
        timeout: a server that cannot answer forgets it with its own state)."""
        with self._lock:
            if session.closed:
                return
            session.closed = True
            session.server.sessions -= 1
        if not delete or session.server.down_until:
            return
        try:
            self._client.delete(f"{session.server.url}/v1/sessions/{session.id}", timeout=PROBE_TIMEOUT)
        except self._transport_errors as error:
            logger.info(
                "pivot/remote-v0: could not delete session %s on %s: %s",
                session.id,
                session.server.url,
                error,
            )
