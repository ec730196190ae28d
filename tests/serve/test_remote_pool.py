"""The server pool's retry policy against scripted servers on 127.0.0.1 (real sockets, answers
chosen by the test): 5xx and dropped connections are retried with backoff, a 503 after its
Retry-After, a 4xx never; a server that fails its retries is left for its cool-down and probed back;
sessions go to the least-loaded server; with every server gone reset raises and step is invalid."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("httpx", reason="the serve extra is not installed")
pytest.importorskip("tenacity", reason="the serve extra is not installed")

from pivot_envs.serve.pool import RemoteRequestError, ServerPool, ServersUnavailableError  # noqa: E402
from pivot_envs.serve.remote import RemoteEnv  # noqa: E402

PIVOTS = ["p0", "p1", "p2"]
OBSERVATION = {"messages": [{"role": "user", "content": "hi"}], "tools": []}
Answer = tuple[int, dict[str, str], Any]


def record(body: dict[str, Any]) -> dict[str, Any]:
    """The pivot record part of a reset answer, as the real server gives it (unless told not to)."""
    if not body.get("record", True):
        return {}
    return {
        "pivot": {"id": body["pivot"], "messages": OBSERVATION["messages"], "expert": {"role": "assistant"}}
    }


class ScriptedServer:
    """Speaks the session protocol for PIVOTS; `fail(path_part, answers)` queues answers (status,
    headers, body) that requests whose path holds `path_part` get first. `requests` logs (method, path)."""

    def __init__(self, env_id: str = "pivot/tool-use-v0") -> None:
        self.env_id = env_id
        self.requests: list[tuple[str, str]] = []
        self.failures: list[tuple[str, Answer]] = []
        self.sessions = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def reply(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                status, headers, data = server.answer(method, self.path, body)
                raw = b"" if data is None else json.dumps(data).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                self.reply("GET")

            def do_POST(self) -> None:
                self.reply("POST")

            def do_DELETE(self) -> None:
                self.reply("DELETE")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def fail(self, path_part: str, *answers: Answer) -> None:
        self.failures += [(path_part, answer) for answer in answers]

    def count(self, path_part: str) -> int:
        return sum(1 for _, path in self.requests if path_part in path)

    def opened(self) -> int:
        """Sessions opened here (POST /v1/sessions)."""
        return self.requests.count(("POST", "/v1/sessions"))

    def answer(self, method: str, path: str, body: Any) -> Answer:
        with self.lock:
            self.requests.append((method, path))
            for index, (part, answer) in enumerate(self.failures):
                if part in path:
                    del self.failures[index]
                    return answer
        if path == "/health":
            return 200, {}, {"status": "ok"}
        if path == "/v1/info":
            return 200, {}, {"env_id": self.env_id, "pivots": PIVOTS, "domain": "tool-use", "max_sessions": 8}
        if method == "DELETE":
            return 204, {}, None
        if path == "/v1/sessions":
            with self.lock:
                self.sessions += 1
                return (
                    200,
                    {},
                    {
                        "session": f"s{self.sessions}",
                        "observation": OBSERVATION,
                        "info": {"pivot_id": body["pivot"], "index": PIVOTS.index(body["pivot"])},
                        **record(body),
                    },
                )
        if path.endswith("/reset"):
            return (
                200,
                {},
                {
                    "session": path.split("/")[3],
                    "observation": OBSERVATION,
                    "info": {"pivot_id": body["pivot"], "index": PIVOTS.index(body["pivot"])},
                    **record(body),
                },
            )
        if path.endswith("/step"):
            return (
                200,
                {},
                {
                    "observation": OBSERVATION,
                    "reward": 1.0,
                    "terminated": True,
                    "truncated": False,
                    "info": {"category": "ok", "valid": True, "strict_reward": 1.0, "detail": self.url},
                },
            )
        return 404, {}, {"detail": f"no route {path}"}

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers() -> Any:
    started = [ScriptedServer(), ScriptedServer()]
    yield started
    for server in started:
        server.close()


def free_url() -> str:
    """The URL of a port on 127.0.0.1 nothing listens on (connections are refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def make_env(urls: list[str], **kwargs: Any) -> RemoteEnv:
    return RemoteEnv(urls, **{"retries": 2, "cooldown": 30.0, **kwargs})


def with_its_holder_closed(servers: list[ScriptedServer], pivot: str) -> tuple[RemoteEnv, ScriptedServer]:
    """An env over `servers` with a session at `pivot` whose server has closed since; the env and the other
    server."""
    env = make_env([server.url for server in servers])
    env.reset(options={"pivot": pivot})
    holder = next(server for server in servers if server.url == env.server)
    holder.close()
    return env, next(server for server in servers if server is not holder)


def step_answered(server: ScriptedServer, pivot: str, failure: tuple) -> tuple[float, dict]:
    """One step of an env on `server` at `pivot` whose first /step request is answered `failure`; its reward
    and info."""
    env = make_env([server.url])
    env.reset(options={"pivot": pivot})
    server.fail("/step", failure)
    _, reward, _, _, info = env.step("x")
    env.close()
    return reward, info


def test_a_5xx_is_retried_on_the_same_server_until_it_answers(servers: list[ScriptedServer]) -> None:
    one = servers[0]
    env = make_env([one.url])
    env.reset(options={"pivot": "p1"})
    one.fail("/step", (500, {}, {"detail": "boom"}), (502, {}, None))
    _, reward, _, _, info = env.step("x")
    env.close()
    assert (reward, info["valid"], one.count("/step")) == (1.0, True, 3)


def test_a_503_waits_the_retry_after_it_names(servers: list[ScriptedServer]) -> None:
    one = servers[0]
    env = make_env([one.url])
    one.fail("/v1/sessions", (503, {"Retry-After": "1"}, {"detail": "queue full"}))
    began = time.monotonic()
    env.reset(options={"pivot": "p0"})
    waited = time.monotonic() - began
    env.close()
    assert one.opened() == 2 and 1.0 <= waited < 3.0


def test_a_4xx_is_never_retried(servers: list[ScriptedServer]) -> None:
    one, other = servers
    env = make_env([one.url, other.url])
    env.reset(options={"pivot": "p0"})
    holder = next(server for server in servers if server.url == env.server)
    holder.fail("/step", (422, {}, {"detail": "action: too long"}))
    _, reward, _, _, info = env.step("x")
    env.close()
    assert holder.count("/step") == 1 and (reward, info["valid"]) == (0.0, False)
    assert "HTTP 422" in info["detail"] and "action: too long" in info["detail"]


def test_a_wrong_token_fails_at_make_naming_the_server(servers: list[ScriptedServer]) -> None:
    one = servers[0]
    one.fail("/v1/info", (401, {}, {"detail": "a bearer token is required"}))
    with pytest.raises(RemoteRequestError, match=f"GET {one.url}/v1/info: HTTP 401"):
        make_env([one.url], token="wrong")
    assert one.count("/v1/info") == 1


def test_sessions_spread_over_the_servers(servers: list[ScriptedServer]) -> None:
    envs = [make_env([server.url for server in servers]) for _ in range(4)]
    for env in envs:
        env.reset(options={"pivot": "p0"})
    held = sorted(env.server for env in envs)
    for env in envs:
        env.close()
    assert held == sorted([servers[0].url, servers[1].url] * 2)
    assert [server.opened() for server in servers] == [2, 2]
    assert [sum(method == "DELETE" for method, _ in server.requests) for server in servers] == [2, 2]


def test_a_step_on_a_dead_server_moves_its_session_to_another_at_the_same_pivot(
    servers: list[ScriptedServer],
) -> None:
    env, spare = with_its_holder_closed(servers, "p2")
    _, reward, _, _, info = env.step("x")
    env.close()
    assert (reward, info["valid"], info["detail"]) == (1.0, True, spare.url)
    assert spare.opened() == 1 and spare.count("/step") == 1


def test_a_forgotten_session_is_opened_again(servers: list[ScriptedServer]) -> None:
    one = servers[0]
    reward, info = step_answered(one, "p1", (404, {}, {"detail": "session is not open"}))
    assert (reward, info["valid"], one.opened()) == (1.0, True, 2)


def test_with_every_server_down_reset_raises_and_step_is_invalid_naming_the_urls(
    servers: list[ScriptedServer],
) -> None:
    one, other = servers
    env = make_env([one.url, other.url], retries=1)
    env.reset(options={"pivot": "p0"})
    one.close()
    other.close()
    _, reward, terminated, _, info = env.step("do it")
    assert (reward, terminated, info["valid"], info["category"]) == (0.0, True, False, "infrastructure_error")
    assert one.url in info["detail"] and other.url in info["detail"]
    with pytest.raises(ServersUnavailableError, match="no server of pivot/tool-use-v0 answered") as raised:
        env.reset(options={"pivot": "p1"})
    assert one.url in str(raised.value) and other.url in str(raised.value)
    env.close()


def test_a_server_marked_down_is_probed_back_after_its_cooldown(servers: list[ScriptedServer]) -> None:
    one = servers[0]
    pool = ServerPool([one.url], retries=0, cooldown=0.3, backoff=0.0)
    try:
        pool.info()
        one.fail("/v1/sessions", (500, {}, None))
        with pytest.raises(ServersUnavailableError):
            pool.open("p0")
        with pytest.raises(ServersUnavailableError, match="HTTP 500"):
            pool.open("p0")  # within the cool-down: not even asked
        assert one.opened() == 1
        time.sleep(0.35)
        session, answer = pool.open("p0")
        assert answer["observation"] == OBSERVATION and one.count("/health") == 1
    finally:
        pool.release()


def test_a_refused_connection_fails_over_at_make(servers: list[ScriptedServer]) -> None:
    dead = free_url()
    env = make_env([dead, servers[0].url], retries=0)
    env.reset(options={"index": 2})
    assert env.server == servers[0].url and env.pool.servers[0].down_until > 0
    env.close()


def test_pivots_the_servers_do_not_host_are_named_at_make(servers: list[ScriptedServer]) -> None:
    with pytest.raises(ValueError, match=r"1 pivots are not hosted by pivot/tool-use-v0 .* \['nope'\]"):
        make_env([servers[0].url], pivots=["p1", "nope"])


def test_a_server_of_another_env_is_refused(servers: list[ScriptedServer]) -> None:
    other = ScriptedServer(env_id="pivot/terminal-v0")
    try:
        with pytest.raises(
            ValueError, match=f"{other.url} hosts 'pivot/terminal-v0', not 'pivot/tool-use-v0'"
        ):
            make_env([other.url], env_id="pivot/tool-use-v0")
    finally:
        other.close()


def test_reset_picks_the_pivot_a_local_env_with_the_same_seed_picks(servers: list[ScriptedServer]) -> None:
    import numpy as np

    env = make_env([servers[0].url])
    picked = [env.reset(seed=seed)[1]["pivot_id"] for seed in range(8)]
    env.close()
    expected = [PIVOTS[int(np.random.default_rng(seed).integers(len(PIVOTS)))] for seed in range(8)]
    assert picked == expected


def test_after_every_server_failed_the_next_reset_opens_a_session_once_one_is_back(
    servers: list[ScriptedServer],
) -> None:
    one = servers[0]
    env = make_env([one.url], retries=1, cooldown=0.2)
    env.reset(options={"pivot": "p0"})
    one.fail("/step", (500, {}, None), (500, {}, None))
    assert env.step("x")[4]["valid"] is False
    time.sleep(0.25)
    env.reset(options={"pivot": "p1"})
    _, reward, _, _, info = env.step("x")
    sessions = env.unwrapped.pool.servers[0].sessions
    env.close()
    assert (reward, info["valid"], one.opened(), sessions) == (1.0, True, 2, 1)


def test_a_step_answered_409_after_a_lost_answer_is_taken_on_a_session_opened_again(
    servers: list[ScriptedServer],
) -> None:
    one = servers[0]
    reward, info = step_answered(one, "p2", (409, {}, {"detail": "its episode ended"}))
    assert (reward, info["valid"], one.opened(), one.count("/step")) == (1.0, True, 2, 2)


def test_a_reset_on_a_dead_server_opens_the_session_at_the_new_pivot_on_another(
    servers: list[ScriptedServer],
) -> None:
    env, spare = with_its_holder_closed(servers, "p0")
    _, info = env.reset(options={"pivot": "p1"})
    env.close()
    assert (info["pivot_id"], info["index"], env.server) == ("p1", 1, spare.url)
    assert spare.opened() == 1 and spare.count("/reset") == 0


def test_an_env_without_urls_says_how_to_give_them() -> None:
    with pytest.raises(ValueError, match=r"pivot/remote-v0 needs the servers' URLs: .*--env-kwargs"):
        RemoteEnv()
