"""`pivot_envs.exchange`: one deadline for a whole HTTP exchange, however the server trickles its reply."""

from __future__ import annotations

import socket
import time
import urllib.parse

from pivot_envs.exchange import ExchangeDeadline, connection_to


def test_the_deadline_wakes_a_read_blocked_on_a_server_that_never_replies() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        watchdog = ExchangeDeadline(0.2)
        watchdog.hold(client)
        started = time.monotonic()
        try:
            assert client.recv(1) == b""  # shut for reading: the blocked read returns, not hangs
        finally:
            watchdog.cancel()
            client.close()
            accepted.close()
        assert watchdog.expired and time.monotonic() - started < 5


def test_a_cancelled_deadline_never_expires() -> None:
    watchdog = ExchangeDeadline(0.05)
    watchdog.cancel()
    time.sleep(0.15)
    assert not watchdog.expired


def test_the_connection_goes_to_the_host_as_written_without_user_and_password() -> None:
    plain = connection_to(urllib.parse.urlsplit("http://user:secret@[::1]:8000/tools"), 3.0)
    secure = connection_to(urllib.parse.urlsplit("https://example.org/search"), 3.0)
    assert (type(plain).__name__, plain.host, plain.port, plain.timeout) == (
        "HTTPConnection",
        "::1",
        8000,
        3.0,
    )
    assert (type(secure).__name__, secure.host, secure.port) == ("HTTPSConnection", "example.org", 443)
