"""What a client cannot do to `pivotrl serve`: send a body over the limit in chunks, hold a request
open by sending its body slowly, fill the log with tracebacks by hanging up, or break a session
with a bad reset value. Real uvicorn on 127.0.0.1 (in a thread), raw sockets where httpx would
not send what a hostile client sends."""

from __future__ import annotations

import logging
import socket
import time

import gymnasium as gym
import httpx
import pytest

import pivot_envs
from pivot_envs.serve.config import ServeConfig
from pivot_envs.serve.server import MAX_BODY_BYTES, start_server

ENV = "pivot/tool-use-v0"
BODY_TIMEOUT = 1.0
MIB = 1 << 20


@pytest.fixture(scope="module")
def server():
    with start_server(ServeConfig(env=ENV, port=0, max_sessions=2, body_timeout=BODY_TIMEOUT)) as running:
        yield running


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as made:
        yield made


def connect(server) -> socket.socket:
    host, port = server.sock.getsockname()[:2]
    sock = socket.create_connection((host, port))
    sock.settimeout(10)
    return sock


def answer_of(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (or 10 s pass)."""
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return received


@pytest.mark.parametrize("path", ["/v1/sessions/{session}/step", "/verify"])
def test_a_chunked_body_over_the_limit_is_a_413_and_the_server_stops_reading_it(server, client, path):
    session = client.post("/v1/sessions", json={}).json()["session"]
    sock = connect(server)
    sock.sendall(
        f"POST {path.format(session=session)} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    )
    chunk = b"%x\r\n" % MIB + b"x" * MIB + b"\r\n"
    sent = 0
    try:
        for _ in range(300):  # the 300 MB body, which was read whole and answered
            sock.sendall(chunk)
            sent += 1
    except OSError:  # the server answered and closed: the rest cannot be sent
        pass
    answer = answer_of(sock)
    sock.close()
    client.delete(f"/v1/sessions/{session}")
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"connection: close" in answer.lower()
    assert f"at most {MAX_BODY_BYTES}".encode() in answer
    assert (
        sent < 300 and sent * MIB < MAX_BODY_BYTES + 64 * MIB
    )  # the limit plus what the socket buffers held


def test_a_body_that_does_not_arrive_within_the_body_timeout_is_a_408_and_the_connection_closes(server):
    sock = connect(server)
    sock.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    started = time.monotonic()
    answer = answer_of(sock)  # returns once the server closes the connection
    waited = time.monotonic() - started
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"--body-timeout" in answer and BODY_TIMEOUT * 0.9 <= waited < BODY_TIMEOUT + 5


def test_a_body_trickled_in_slowly_times_out_too(server):
    sock = connect(server)
    sock.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    started = time.monotonic()
    try:
        while time.monotonic() - started < BODY_TIMEOUT + 5:  # one byte every 0.1 s: never idle long
            sock.sendall(b"1\r\n \r\n")
            time.sleep(0.1)
    except OSError:
        pass
    answer = answer_of(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert time.monotonic() - started < BODY_TIMEOUT + 5


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_client_that_hangs_up_mid_body_is_one_log_line_without_a_traceback(server, client):
    records = Records()
    loggers = [logging.getLogger(name) for name in ("uvicorn", "uvicorn.error", "pivot_envs")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(records)
        logger.setLevel(logging.INFO)
    try:
        for _ in range(3):
            sock = connect(server)
            sock.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            time.sleep(0.1)
            sock.close()
        time.sleep(0.5)
    finally:
        for logger, level in zip(loggers, levels):
            logger.removeHandler(records)
            logger.setLevel(level)
    lines = [record.getMessage() for record in records.records]
    assert not any(record.exc_info for record in records.records), lines
    assert len([line for line in lines if "disconnected before its body arrived" in line]) == 3, lines
    assert 'status="499"' in client.get("/metrics").text
    assert client.get("/health").json()["status"] == "ok"


@pytest.mark.parametrize("seed", [-1, -(2**70)])
def test_a_negative_seed_is_a_422_naming_it_and_opens_no_session(client, seed):
    before = client.get("/health").json()
    refused = client.post("/v1/sessions", json={"seed": seed})
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"] == "seed: Input should be greater than or equal to 0"
    assert client.get("/health").json()["sessions"] == before["sessions"]
    session = client.post("/v1/sessions", json={"seed": 2**70}).json()["session"]  # any size >= 0 is a seed
    again = client.post(f"/v1/sessions/{session}/reset", json={"seed": seed})
    assert again.status_code == 422 and "seed" in again.json()["detail"]
    assert client.post(f"/v1/sessions/{session}/step", json={"action": "hi"}).status_code == 200
    client.delete(f"/v1/sessions/{session}")


def test_an_action_holding_a_lone_surrogate_escape_is_scored_as_in_process_not_refused(client):
    gym.register_envs(pivot_envs)
    local = gym.make(ENV).unwrapped
    session = client.post("/v1/sessions", json={"index": 0}).json()["session"]
    body = b'{"action": "I will book it \\ud800 now"}'  # valid JSON, not Unicode text
    answer = client.post(f"/v1/sessions/{session}/step", content=body)
    client.delete(f"/v1/sessions/{session}")
    local.reset(options={"index": 0})
    _, reward, *_, info = local.step("I will book it \ud800 now")
    local.close()
    assert answer.status_code == 200, answer.text
    assert answer.json()["reward"] == reward == 0.0
    assert answer.json()["info"]["category"] == info["category"]
