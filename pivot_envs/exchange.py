"""One HTTP exchange (connect, send, the whole reply) under one deadline, for the domains' HTTP backends;
and `send_json`, the JSON answer of their (and the tests') `http.server` handlers.

A socket timeout bounds each read, not the exchange: a server that trickles its reply never trips it.
`ExchangeDeadline` shuts the exchange's socket when its time is up, which wakes a read blocked in
another thread.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.parse
from typing import Any


def connection_to(parts: urllib.parse.SplitResult, timeout: float) -> http.client.HTTPConnection:
    """An unopened HTTP(S) connection to the URL's host[:port] as written ("[::1]:8000" keeps its
    brackets), without any user:password@."""
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return kind(parts.netloc.rpartition("@")[2], timeout=timeout)


class ExchangeDeadline:
    """A timer, started at creation, that shuts the sockets it holds after `seconds`; `expired` says it did.

    The caller holds the connection's socket once connected, reads, then calls `cancel()` (in a finally).
    """

    def __init__(self, seconds: float) -> None:
        self._expired = threading.Event()
        self._sockets: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    @property
    def expired(self) -> bool:
        """Whether the deadline has passed (and the held sockets were shut)."""
        return self._expired.is_set()

    def hold(self, sock: socket.socket) -> None:
        """Shut `sock` at the deadline (held here: getresponse() hands it on and may clear connection.sock)."""
        self._sockets.append(sock)

    def cancel(self) -> None:
        """Stop the timer: the exchange is over."""
        self._timer.cancel()

    def _expire(self) -> None:
        self._expired.set()
        for sock in self._sockets:
            # The plain socket's shutdown (also under TLS) wakes a read blocked in another thread.
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass


def send_json(handler: Any, status: int, payload: Any) -> None:
    """Answer an `http.server` request with `payload` as JSON (status, type and length headers, one body)."""
    data = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
