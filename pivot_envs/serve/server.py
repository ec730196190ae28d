"""The HTTP server: a FastAPI app hosting one registered pivot env (`create_app`), and uvicorn
running it (`start_server` in a thread, `serve` in the foreground).

The library's own protocol (docs/serve.md has the reference):

    GET    /v1/info                        env id, pivot ids, domain, max_sessions, version
    POST   /v1/sessions                    {"pivot"|"index", "seed", "record"} -> a session reset there
                                           (its observation, info and, unless "record" is false, the
                                           pivot's record, expert included)
    POST   /v1/sessions/{session}/reset    the same body -> reset the session again
    POST   /v1/sessions/{session}/step     {"action"} -> observation, reward, terminated, truncated, info
    POST   /v1/sessions/{session}/steps    {"actions": [...]} -> each scored from the session's pivot
    DELETE /v1/sessions/{session}          close it (204)
    GET    /health, /metrics               liveness; Prometheus text

NeMo-Gym's resource-server protocol (`/seed_session`, `/verify`) is on the same app: see
pivot_envs.serve.nemo_gym. Env calls block, so they run in a thread pool of `max_sessions`
threads; the event loop only routes, waits and counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from starlette.requests import ClientDisconnect

from pivot_envs.env import json_safe
from pivot_envs.errors import PivotEnvsError
from pivot_envs.serve import nemo_gym
from pivot_envs.serve.config import ServeConfig
from pivot_envs.serve.sessions import QueueTimeout, Session, SessionPool, UnknownSession
from pivot_envs.serve.state import (
    HTTPError,
    ServerState,
    json_bytes,
    json_response,
    raw_json,
    step_result,
)

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 32 * 1024 * 1024  # a batch of 64 actions with long completions fits many times over
CLOSE = {"Connection": "close"}  # a refused body is not read on: the connection closes after the answer
CLIENT_CLOSED = 499  # the status a request is counted under when its client disconnected (nginx's)
SWITCH_INTERVAL_S = 0.0005  # the GIL switch interval of a `pivotrl serve` process (see serve)


# -- request bodies ------------------------------------------------------------------------------


class ResetBody(BaseModel):
    """Where to reset: a pivot id, or an index into the server's pivots, or neither (a seeded draw)."""

    model_config = ConfigDict(extra="forbid")
    pivot: str | None = None
    index: int | None = None
    seed: int | None = Field(None, ge=0)  # gymnasium seeds are non-negative integers
    record: bool = True  # answer with the pivot's record too (false: the client holds it already)

    @model_validator(mode="after")
    def _one_place(self) -> ResetBody:
        if self.pivot is not None and self.index is not None:
            raise ValueError("give at most one of 'pivot' and 'index'")
        return self


def _action(value: Any) -> Any:
    if not isinstance(value, (str, dict)):
        raise ValueError(
            f"must be completion text or an assistant message object, got {type(value).__name__}"
        )
    return value


class StepBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: Any

    _check = field_validator("action")(_action)


class StepsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    actions: list[Any]

    @field_validator("actions")
    @classmethod
    def _each(cls, actions: list[Any]) -> list[Any]:
        for index, action in enumerate(actions):
            try:
                _action(action)
            except ValueError as error:
                raise ValueError(f"action {index} {error}") from None
        return actions


# -- env calls (on the thread pool) --------------------------------------------------------------


def _timed_step(env: Any, action: Any) -> tuple[dict, float]:
    """One step as the protocol's result, and the seconds it took."""
    started = time.perf_counter()
    observation, reward, terminated, truncated, info = env.step(action)
    seconds = time.perf_counter() - started
    return step_result(observation, reward, terminated, truncated, info), seconds


def _step_body(env: Any, action: Any) -> tuple[bytes, float]:
    """One step's response body (JSON) and the seconds the step took."""
    result, seconds = _timed_step(env, action)
    return json_bytes(result), seconds


def _steps_body(env: Any, options: dict, actions: list[Any], fresh: bool) -> tuple[bytes, list[float]]:
    """Each action stepped from the same pivot state (reset there before each but a fresh first):
    the response body (JSON) and the seconds each reset + step took."""
    results, seconds = [], []
    for action in actions:
        started = time.perf_counter()
        if not fresh:
            env.reset(options=options)
        fresh = False
        results.append(_timed_step(env, action)[0])
        seconds.append(time.perf_counter() - started)
    return json_bytes({"results": results}), seconds


def _reset_body(
    env: Any, session_id: str, seed: int | None, options: dict, record: bool
) -> tuple[bytes, Any]:
    """Reset `env`: the response body (JSON; with the pivot's record under "pivot" when `record`)
    and the pivot id it is at."""
    observation, info = env.reset(seed=seed, options=options)
    answer = {"session": session_id, "observation": observation, "info": info}
    if record:
        answer["pivot"] = env.unwrapped.pivot.to_dict()
    return json_bytes(answer), info.get("pivot_id")


# -- the app ---------------------------------------------------------------------------------------


def create_app(config: ServeConfig) -> FastAPI:
    """The FastAPI app serving `config.env` (its first env is made now; see ServerState)."""
    state = ServerState(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        reaper = asyncio.create_task(_reap(state))
        try:
            yield
        finally:
            reaper.cancel()
            await state.pool.shutdown()
            state.executor.shutdown(wait=False)

    app = FastAPI(title=f"pivot-envs: {config.env}", version=state.version, lifespan=lifespan)
    app.state.serve = state
    _add_error_handlers(app, state)
    _add_routes(app, state)
    nemo_gym.add_routes(app, state)
    if config.openenv:
        from pivot_envs.serve import openenv  # optional; importing openenv takes about 5 s (gradio)

        openenv.add_routes(app, state)
    app.add_middleware(Guard, state=state)
    return app


async def _reap(state: ServerState) -> None:
    """Close expired sessions and idle envs every quarter TTL (at most every 15 s)."""
    interval = max(0.05, min(state.config.session_ttl / 4, 15.0))
    while True:
        await asyncio.sleep(interval)
        try:
            closed = await state.pool.reap()
        except Exception:  # one env that fails to close must not stop the reaper
            log.exception("closing expired sessions failed")
            continue
        if closed:
            log.info("closed %d sessions unused for %g s", closed, state.config.session_ttl)


def _add_error_handlers(app: FastAPI, state: ServerState) -> None:
    @app.exception_handler(HTTPError)
    async def refused(request: Request, error: HTTPError) -> Response:
        return JSONResponse({"detail": str(error)}, status_code=error.status, headers=error.headers)

    @app.exception_handler(UnknownSession)
    async def unknown(request: Request, error: UnknownSession) -> Response:
        return JSONResponse({"detail": str(error)}, status_code=404)

    @app.exception_handler(QueueTimeout)
    async def busy(request: Request, error: QueueTimeout) -> Response:
        state.metrics.queue_timeouts += 1
        return JSONResponse(
            {"detail": str(error)}, status_code=503, headers={"Retry-After": str(error.retry_after)}
        )


async def parsed(request: Request, model: type[BaseModel]) -> Any:
    """The request's JSON body as `model` (no body: the model's defaults); raises HTTPError 422
    naming each bad field. Read here, not by FastAPI's body parameters: their per-request
    dependency solving took about a sixth of the event loop's time on a tool-use step (profiled)."""
    body = await request.body()
    try:
        return model.model_validate_json(body) if body else model()
    except ValidationError as error:
        errors = error.errors()
    if all(error["type"] == "json_invalid" for error in errors):
        # pydantic's parser refuses a lone surrogate escape ("\ud800"), which JSON allows; the
        # stdlib's takes it, so such an action is scored (0, with its category) as in process.
        try:
            return model.model_validate(json.loads(body))
        except ValueError:  # not JSON for the stdlib either (pydantic's message says where)
            pass
        except ValidationError as error:
            errors = error.errors()
    raise HTTPError(422, validation_message(errors))


def validation_message(errors: list[dict]) -> str:
    """pydantic's errors as one line naming each field: 'action: Value error, must be ...'."""
    parts = []
    for error in errors:
        location = [str(part) for part in error.get("loc", ())]
        if location and location[0] == "body":
            location = location[1:]
        parts.append(f"{'.'.join(location) or 'body'}: {error.get('msg', 'invalid')}")
    return "; ".join(parts)


def _add_routes(app: FastAPI, state: ServerState) -> None:
    pool = state.pool

    @app.get("/health")
    async def health() -> dict:
        return {
            "status": "ok",
            "env_id": state.config.env,
            "sessions": len(pool.sessions),
            "envs_alive": pool.alive,
            "queue": pool.queue_length,
        }

    @app.get("/metrics")
    async def metrics() -> Response:
        text = state.metrics.render(len(pool.sessions), pool.alive, pool.queue_length, pool.max_sessions)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/v1/info")
    async def info() -> Response:
        return json_response(
            {
                "env_id": state.config.env,
                "pivots": json_safe(state.pivot_ids),
                "domain": state.domain,
                "max_sessions": state.config.max_sessions,
                "version": state.version,
            }
        )

    async def reset(session: Session, body: ResetBody) -> Response:
        options = state.reset_options(body.pivot, body.index)
        try:
            body_bytes, pivot_id = await pool.run(
                _reset_body, session.env, session.id, body.seed, options, body.record
            )
        except Exception as error:
            await pool.discard(session, broken=True)
            log.warning("session %s: reset failed", session.id, exc_info=error)
            raise HTTPError(
                500,
                f"session {session.id}: reset failed ({type(error).__name__}: {error}); the session is closed",
            ) from error
        session.pivot_id = pivot_id
        session.stepped = False
        return raw_json(body_bytes)

    @app.post("/v1/sessions")
    async def create(request: Request) -> Response:
        body = await parsed(request, ResetBody)
        state.reset_options(body.pivot, body.index)  # a bad pivot or index is refused before an env is taken
        session = await pool.open()
        async with session.lock:
            return await reset(session, body)

    @app.post("/v1/sessions/{session_id}/reset")
    async def reset_again(session_id: str, request: Request) -> Response:
        body = await parsed(request, ResetBody)
        async with _held(pool, session_id) as session:
            return await reset(session, body)

    @app.post("/v1/sessions/{session_id}/step")
    async def step(session_id: str, request: Request) -> Response:
        body = await parsed(request, StepBody)
        async with _held(pool, session_id) as session:
            if session.pivot_id is None or session.stepped:
                raise HTTPError(
                    409,
                    f"session {session_id}: its episode ended (one step per reset); "
                    f"POST /v1/sessions/{session_id}/reset first, or score a group with /steps",
                )
            session.stepped = True
            try:
                result, seconds = await pool.run(_step_body, session.env, body.action)
            except Exception as error:
                raise _env_failure(session_id, "step", error) from error
            session.last_used = time.monotonic()
        state.observe([seconds])
        return raw_json(result)

    @app.post("/v1/sessions/{session_id}/steps")
    async def steps(session_id: str, request: Request) -> Response:
        body = await parsed(request, StepsBody)
        if len(body.actions) > state.config.max_batch:
            raise HTTPError(
                413,
                f"actions: {len(body.actions)} actions in one request; at most {state.config.max_batch} "
                f"(--max-batch): split the group",
            )
        async with _held(pool, session_id) as session:
            if session.pivot_id is None:
                raise HTTPError(409, f"session {session_id}: never reset")
            options = {"pivot": session.pivot_id}
            fresh = not session.stepped
            session.stepped = bool(body.actions) or session.stepped
            try:
                results, seconds = await pool.run(_steps_body, session.env, options, body.actions, fresh)
            except Exception as error:
                raise _env_failure(session_id, "steps", error) from error
            session.last_used = time.monotonic()
        state.observe(seconds)
        return raw_json(results)

    @app.delete("/v1/sessions/{session_id}", status_code=204)
    async def close(session_id: str) -> Response:
        await pool.close(session_id)
        return Response(status_code=204)


@contextlib.asynccontextmanager
async def _held(pool: SessionPool, session_id: str) -> AsyncIterator[Session]:
    """The session, its lock held; refused (404) if it was closed while the request waited for the lock."""
    session = pool.get(session_id)
    async with session.lock:
        if session.closed:
            raise UnknownSession(f"session {session.id!r} was closed while this request waited for it")
        yield session


def _env_failure(session_id: str, what: str, error: Exception) -> HTTPError:
    """A 500 naming the session for an exception out of the env (step itself never raises on an action)."""
    log.warning("session %s: %s raised", session_id, what, exc_info=error)
    return HTTPError(500, f"session {session_id}: the env's {what} raised {type(error).__name__}: {error}")


class Guard:
    """ASGI middleware: the bearer token (everything but /health), the body's size and time bounds,
    and the request counts by route and status."""

    def __init__(self, app: Callable, state: ServerState) -> None:
        self.app = app
        self.state = state
        self.expected = f"Bearer {state.token}".encode() if state.token else None
        self.body_timeout = state.config.body_timeout

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        status = [500]

        async def counted(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        refusal = self._refusal(scope["path"], headers)
        if refusal is not None:
            await refusal(scope, receive, counted)
        else:
            body = BoundedBody(receive, MAX_BODY_BYTES, self.body_timeout)
            try:
                await self.app(scope, body.receive, counted)
            except ClientDisconnect:
                # A client that gave up (its own timeout, a killed trainer) is routine: one line, no traceback.
                status[0] = CLIENT_CLOSED
                client = scope.get("client") or ("?", 0)
                log.info(
                    "%s %s: the client %s:%s disconnected before its body arrived",
                    scope["method"],
                    scope["path"],
                    *client[:2],
                )
        route = scope.get("route")
        self.state.metrics.count_request(scope["method"], getattr(route, "path", "unmatched"), status[0])

    def _refusal(self, path: str, headers: dict[bytes, bytes]) -> Response | None:
        if self.expected is not None and path != "/health":
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                reason = "missing" if not given else "wrong"
                return JSONResponse(
                    {"detail": f"the bearer token is {reason}: send 'Authorization: Bearer <token>'"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            return JSONResponse(
                {"detail": f"body: {length.decode(errors='replace')} bytes; at most {MAX_BODY_BYTES}"},
                status_code=413,
                headers=CLOSE,
            )
        return None


class BoundedBody:
    """A request's ASGI `receive`, bounded: the body may hold at most `limit` bytes however it is
    sent (Content-Length or chunked), and must arrive within `timeout` seconds of the request's
    start. Past either bound, reading the body raises HTTPError 413 or 408 (the connection is
    then closed); once the body is complete, `receive` passes through unbounded (a disconnect)."""

    def __init__(self, receive: Callable, limit: int, timeout: float) -> None:
        self._receive = receive
        self.limit = limit
        self.timeout = timeout
        self.deadline = asyncio.get_running_loop().time() + timeout
        self.size = 0
        self.complete = False
        self.late = False

    async def receive(self) -> dict:
        if self.complete:
            return await self._receive()
        loop = asyncio.get_running_loop()
        # A timer that cancels this task, not asyncio.wait_for: that wraps each read in a task of its own.
        timer = loop.call_at(self.deadline, self._too_late, asyncio.current_task())
        try:
            message = await self._receive()
        except asyncio.CancelledError:
            if not self.late:
                raise
            task = asyncio.current_task()
            if hasattr(task, "uncancel"):  # Python >= 3.11: this cancellation is handled here
                task.uncancel()
            raise HTTPError(
                408,
                f"body: not received within {self.timeout:g} s of the request (--body-timeout)",
                CLOSE,
            ) from None
        finally:
            timer.cancel()
        if message["type"] != "http.request":
            self.complete = True
            return message
        self.size += len(message.get("body", b""))
        if self.size > self.limit:
            raise HTTPError(413, f"body: more than {self.limit} bytes (at most {self.limit})", CLOSE)
        self.complete = not message.get("more_body", False)
        return message

    def _too_late(self, task: asyncio.Task | None) -> None:
        self.late = True
        if task is not None:
            task.cancel()


# -- running it --------------------------------------------------------------------------------------


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(2048)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


class RunningServer:
    """A server listening in a thread of this process (tests, benchmarks); `stop()` ends it."""

    def __init__(self, config: ServeConfig) -> None:
        import uvicorn

        config.check_exposure()
        app = create_app(config)
        self.sock = bind(config.host, config.port)
        self.url = url_of(self.sock)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise PivotEnvsError(f"the server at {self.url} did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server(config: ServeConfig) -> RunningServer:
    """Serve `config.env` from a thread of this process; returns once it accepts requests."""
    return RunningServer(config)


def serve(config: ServeConfig, announce: Callable[[str], None] = print) -> None:
    """Serve `config.env` in the foreground until interrupted; `announce` gets the URL line
    ('pivotrl serve: listening on http://HOST:PORT') once the server accepts requests."""
    import uvicorn

    config.check_exposure()
    # The process is the server's own: its event loop must not wait CPython's default 5 ms for
    # the GIL behind env-stepping threads (that convoy cut the throughput at 8-32 clients about
    # 3x in benchmarks/serve_load.py).
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    app = create_app(config)
    sock = bind(config.host, config.port)
    url = url_of(sock)

    class Announcing(uvicorn.Server):
        interrupted = False  # a SIGINT arrived: the command ends as interrupted (130) whatever uvicorn does

        async def startup(self, sockets: list | None = None) -> None:
            await super().startup(sockets)
            announce(
                f"pivotrl serve: listening on {url} ({config.env}, {len(app.state.serve.pivot_ids)} pivots)"
            )

        def handle_exit(self, sig: int, frame: Any) -> None:
            self.interrupted = self.interrupted or sig == signal.SIGINT
            super().handle_exit(sig, frame)

    server = Announcing(uvicorn.Config(app, log_level="warning", lifespan="on"))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    # uvicorn re-raises a captured SIGINT after its graceful shutdown, but the KeyboardInterrupt that
    # makes can be lost in asyncio's own shutdown (a flaky exit status in the CLI test): raise it here
    if server.interrupted:
        raise KeyboardInterrupt
