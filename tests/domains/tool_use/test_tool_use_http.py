"""The HTTP tool backend against real servers on 127.0.0.1: answers, refusals, failures, and hostile
servers (a reply trickled a byte a second, 50 MB, JSON nested 100,000 deep, a reply cut short).

Each step must return within its deadline plus a small margin, with bounded memory, and say
honestly whether the server failed (valid=False) or answered (a result, maybe cut).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gymnasium as gym
import pytest
from tool_use_helpers import appended_tool_bytes, expert_call, first, hermes, measured, step

import pivot_envs  # noqa: F401
from pivot_envs.domains.tool_use.backends import HttpBackend
from pivot_envs.domains.tool_use.limits import ToolUseLimits

MB = 1 << 20
MARGIN_S = 1.0  # what a step may take past its deadline (thread wake-up, closing the socket)


def serve(handler: type[BaseHTTPRequestHandler]):
    """Start `handler` on a free port of 127.0.0.1 in a thread; returns (base URL, server)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


def http_env(url: str, limits: dict | None = None, **config):
    return gym.make(
        "pivot/tool-use-v0", backend="http", backend_config={"url": url, **config}, limits=limits
    ).unwrapped


def send_json(handler: BaseHTTPRequestHandler, body: bytes) -> None:
    """Answer 200 with `body`, a JSON document."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class _ToolServer(BaseHTTPRequestHandler):
    calls: list = []
    fail_next = 0

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append(body)
        if type(self).fail_next:
            type(self).fail_next -= 1
            self.send_response(503)
            self.end_headers()
            return
        if body["name"] == "nope":
            self.send_response(404)
            self.end_headers()
            self.wfile.write(b"no such tool")
            return
        send_json(
            self, json.dumps({"output": {"echo": body["arguments"], "pivot": body["pivot_id"]}}).encode()
        )

    def log_message(self, *args):
        pass


@pytest.fixture
def tool_server():
    _ToolServer.calls, _ToolServer.fail_next = [], 0
    url, server = serve(_ToolServer)
    yield f"{url}/call"
    server.shutdown()
    server.server_close()


class _HostileServer(BaseHTTPRequestHandler):
    """Answers by path: /trickle-body, /trickle-headers, /huge (50 MB), /nested, /short."""

    stop = threading.Event()
    requests = 0

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).requests += 1
        try:
            getattr(self, self.path.strip("/").replace("-", "_"))()
        except OSError:
            pass  # the client hung up, as it should

    def trickle(self, data: bytes) -> None:
        for byte in data:
            if self.stop.wait(1):
                return
            self.wfile.write(bytes([byte]))

    def trickle_body(self):
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        self.trickle(b" " * 1000)

    def trickle_headers(self):
        self.trickle(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}")

    def huge(self):
        chunk = b"x" * (1 << 16)
        self.send_response(200)
        self.send_header("Content-Length", str(50 * MB + 14))
        self.end_headers()
        self.wfile.write(b'{"output": "')
        for _ in range(50 * MB // len(chunk)):
            self.wfile.write(chunk)
        self.wfile.write(b'"}')

    def nested(self):
        send_json(self, b"[" * 100_000 + b"]" * 100_000)

    def short(self):
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        self.wfile.write(b'{"output": ')

    def log_message(self, *args):
        pass


@pytest.fixture
def hostile_server():
    _HostileServer.stop.clear()
    _HostileServer.requests = 0
    url, server = serve(_HostileServer)
    yield url
    _HostileServer.stop.set()
    server.shutdown()
    server.server_close()


# -- a server that works ------------------------------------------------------------------------


def test_the_http_backend_posts_each_call_and_returns_the_servers_output(tool_server, call_pivots):
    env = http_env(tool_server)
    pivot = call_pivots[0]
    reward, info, observation = step(env, pivot, pivot.expert)
    arguments = json.loads(pivot.expert["tool_calls"][0]["function"]["arguments"])
    assert reward == 1.0 and json.loads(info["output"]) == {"echo": arguments, "pivot": pivot.id}
    assert _ToolServer.calls[-1]["name"] == pivot.expert["tool_calls"][0]["function"]["name"]
    assert observation["messages"][-1]["content"] == info["output"]
    # A refusal (4xx) is the tool's answer, not an infrastructure failure.
    _, info, _ = step(env, pivot, hermes("nope", {}))
    assert info["valid"] and info["output"] == "Error: HTTP 404: no such tool"


def test_the_http_backend_retries_5xx_then_marks_the_sample_invalid(tool_server, call_pivots):
    env = http_env(tool_server, retries=2, backoff_s=0.01)
    _ToolServer.fail_next = 2
    reward, info, _ = step(env, call_pivots[0], call_pivots[0].expert)
    assert reward == 1.0 and info["valid"] and len(_ToolServer.calls) == 3
    _ToolServer.fail_next = 10
    reward, info, _ = step(env, call_pivots[0], call_pivots[0].expert)
    assert (info["valid"], info["category"]) == (False, "infrastructure_error")
    assert (
        tool_server in info["detail"] and "503" in info["detail"] and "after 3 attempt(s)" in info["detail"]
    )


def test_an_unreachable_tool_server_is_an_infrastructure_error_naming_the_url(call_pivots):
    url = "http://127.0.0.1:9/call"  # the discard port: nothing listens there
    env = http_env(url, retries=0, timeout_s=2)
    reward, info, _ = step(env, call_pivots[0], call_pivots[0].expert)
    assert (reward, info["valid"], info["category"]) == (0.0, False, "infrastructure_error")
    assert url in info["detail"] and "ConnectionRefusedError" in info["detail"]


def test_the_http_backend_needs_an_http_url():
    with pytest.raises(ValueError, match="needs a url"):
        HttpBackend()
    with pytest.raises(ValueError, match="must be http"):
        HttpBackend(url="ftp://127.0.0.1/call")


@pytest.mark.parametrize("depth", [100, 800, 100_000])
def test_arguments_nested_at_any_depth_score_without_raising(tool_server, pivots, depth):
    env = http_env(tool_server, retries=0)
    pivot = first(pivots, "book_reservation")
    name, arguments = expert_call(pivot)
    nested = json.dumps({"name": name, "arguments": {**arguments, "flights": "@"}}).replace(
        '"@"', "[" * depth + "]" * depth
    )
    reward, info, _ = step(env, pivot, nested)
    assert reward == 0.0 and info["valid"]
    # 800 levels still decode and travel to the server and back; 100,000 are past the decoder.
    assert info["category"] == ("unparseable" if depth == 100_000 else "argument_value_different")


def test_arguments_too_deep_to_encode_are_an_error_result_and_nothing_is_sent(tool_server, pivots):
    nested: list = []
    for _ in range(5000):
        nested = [nested]
    outputs = HttpBackend(url=tool_server).run(pivots[0], [("book_reservation", {"flights": nested})])
    assert outputs == ["Error: the arguments of book_reservation are nested too deeply to send"]
    assert _ToolServer.calls == []


# -- hostile servers ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["trickle-body", "trickle-headers"])
def test_a_server_trickling_a_byte_a_second_is_cut_off_at_the_attempts_deadline(
    hostile_server, call_pivots, path
):
    env = http_env(f"{hostile_server}/{path}", timeout_s=2, retries=0)
    (reward, info, _), seconds, peak = measured(step, env, call_pivots[0], call_pivots[0].expert)
    assert (reward, info["valid"], info["category"]) == (0.0, False, "infrastructure_error")
    assert "no complete reply within timeout_s=2" in info["detail"]
    assert 2 <= seconds < 2 + MARGIN_S and peak < 4 * MB


def test_the_steps_deadline_ends_the_retries_of_a_trickling_server(hostile_server, call_pivots):
    env = http_env(
        f"{hostile_server}/trickle-body", {"step_timeout_s": 3}, timeout_s=2, retries=5, backoff_s=0.05
    )
    (reward, info, _), seconds, _ = measured(step, env, call_pivots[0], call_pivots[0].expert)
    assert (info["valid"], info["category"]) == (False, "infrastructure_error")
    assert "after 2 attempt(s)" in info["detail"] and "step's tool deadline" in info["detail"]
    assert 3 <= seconds < 3 + MARGIN_S and _HostileServer.requests == 2


def test_a_50_mb_reply_is_read_up_to_the_cap_and_kept_as_a_cut_result(hostile_server, call_pivots):
    env = http_env(f"{hostile_server}/huge", retries=0)
    pivot = call_pivots[0]
    (reward, info, observation), seconds, peak = measured(step, env, pivot, pivot.expert)
    # The server answered: the call is judged as usual (1.0 for the expert's), its result is cut.
    assert (reward, info["valid"], info["category"]) == (1.0, True, "correct")
    assert info["output"].startswith('{"output": "xxx')
    assert info["output"].endswith(
        "[... the reply went on past max_response_bytes=1048576; reading stopped there ...]"
    )
    assert appended_tool_bytes(observation, pivot)[0] < ToolUseLimits().output_bytes + 64
    assert seconds < 5 and peak < 16 * MB


def test_json_nested_100000_deep_is_an_error_result_not_a_recursion_error(hostile_server, call_pivots):
    env = http_env(f"{hostile_server}/nested", retries=0)
    (reward, info, _), seconds, peak = measured(step, env, call_pivots[0], call_pivots[0].expert)
    assert (reward, info["valid"]) == (1.0, True)
    assert info["output"] == "Error: the tool server's reply is JSON nested too deeply to decode"
    assert seconds < 5 and peak < 16 * MB


def test_a_reply_shorter_than_its_length_is_retried_then_an_infrastructure_error(hostile_server, call_pivots):
    env = http_env(f"{hostile_server}/short", retries=1, backoff_s=0.01)
    reward, info, _ = step(env, call_pivots[0], call_pivots[0].expert)
    assert (reward, info["valid"], info["category"]) == (0.0, False, "infrastructure_error")
    assert "IncompleteRead" in info["detail"] and _HostileServer.requests == 2
