"""The HTTP search engine against real servers on 127.0.0.1: the reference server in front of the FTS
index, and small misbehaving ones (down, slow, trickling, oversized, 5xx, not JSON)."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from pivot_envs.domains.search.engine import EngineError, QueryError, counted_terms, open_engine, query_terms
from pivot_envs.domains.search.http_engine import MAX_REQUEST_BYTES, HttpEngine, serve_engine

QUERIES = ["physicist who came up with relativity", "Jupiter", "the largest planet in the solar system",
           "NEAR(Einstein Bose)", "French painter pointillism Sunday afternoon island"]  # fmt: skip


@contextmanager
def serving(server: http.server.HTTPServer) -> Iterator[str]:
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def fts():
    return open_engine()


@pytest.fixture(scope="module")
def endpoint(fts) -> Iterator[str]:
    with serving(serve_engine(fts, "127.0.0.1", 0)) as url:
        yield url + "/wiki"


def misbehaving(
    respond: Callable[[http.server.BaseHTTPRequestHandler], None],
) -> http.server.ThreadingHTTPServer:
    """A server whose every request is answered by `respond(handler)`."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            respond(self)

        do_GET = do_POST

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    return server


def answer(handler: http.server.BaseHTTPRequestHandler, status: int, body: bytes) -> None:
    handler.send_response(status)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def test_the_http_engine_gives_the_fts_engines_results(fts, endpoint):
    remote = HttpEngine(endpoint)
    for query in QUERIES:
        assert remote.search(query, 5) == fts.search(query, 5), query
    assert remote.search("war", 50) == fts.search("war", 50)
    assert remote.get("Jupiter") == fts.get("Jupiter") and remote.get("jupiter") is None
    assert remote.lookup("https://en.wikipedia.org/wiki/Jupiter") == fts.get("Jupiter")
    assert remote.lookup("no such title") is None
    assert remote.corpus_id == fts.corpus_id
    assert open_engine(endpoint).search("Jupiter") == fts.search("Jupiter")
    assert open_engine({"engine": "http", "url": endpoint, "timeout_s": 5}).corpus_id == fts.corpus_id


def test_a_querys_counted_words_are_the_ftss_scored_ones_or_over_http_its_words_without_stopwords(
    fts, endpoint
):
    query = "who is the physicist Albert Einstein"
    assert counted_terms(fts, query) == tuple(fts.scored_terms(query_terms(query)))
    assert counted_terms(HttpEngine(endpoint), query) == ("physicist", "albert", "einstein")


def test_the_server_answers_concurrent_clients(fts, endpoint):
    remote = HttpEngine(endpoint)
    queries = QUERIES * 4
    with ThreadPoolExecutor(max_workers=8) as pool:
        assert list(pool.map(remote.search, queries)) == [fts.search(query) for query in queries]


def test_a_refused_query_keeps_its_category(endpoint):
    remote = HttpEngine(endpoint)
    for query, category in [("  ", "empty_query"), ("x" * (1 << 20), "query_too_long"), (3, "bad_argument")]:
        with pytest.raises(QueryError) as raised:
            remote.search(query)
        assert raised.value.category == category


def test_the_server_refuses_a_query_the_client_did_not_check(endpoint):
    request = json.dumps({"query": "***", "k": 5}).encode()
    with socket.create_connection(("127.0.0.1", urllib.parse.urlsplit(endpoint).port), timeout=5) as sock:
        sock.sendall(
            b"POST /wiki/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(request)}\r\nConnection: close\r\n\r\n".encode()
            + request
        )
        reply = b"".join(iter(lambda: sock.recv(65536), b""))
    assert reply.startswith(b"HTTP/1.1 400") and b'"category": "empty_query"' in reply


def test_the_server_refuses_an_oversized_request(endpoint):
    with socket.create_connection(("127.0.0.1", urllib.parse.urlsplit(endpoint).port), timeout=5) as sock:
        sock.sendall(
            f"POST /wiki/search HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_REQUEST_BYTES + 1}\r\n\r\n".encode()
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 413")


def test_an_engine_object_passes_through_open_engine_without_a_request():
    requests = []
    with serving(
        misbehaving(lambda handler: requests.append(handler.path) or answer(handler, 404, b""))
    ) as url:
        remote = HttpEngine(url)
        assert open_engine(remote) is remote
    assert requests == []


def test_a_server_that_is_down_is_an_engine_error():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(EngineError, match=r"failed after 2 attempt\(s\): ConnectionRefusedError"):
        HttpEngine(f"http://127.0.0.1:{port}", retries=1, backoff_s=0.01).search("Jupiter")


@pytest.mark.parametrize("behaviour", ["silent", "trickling"])
def test_a_slow_server_is_cut_off_at_the_timeout(behaviour):
    stop = threading.Event()

    def respond(handler):
        if behaviour == "silent":
            stop.wait(10)
            return
        handler.send_response(200)
        handler.send_header("Content-Length", "1000")
        handler.end_headers()
        for _ in range(1000):  # one byte every 20 ms: each read is quick, the whole reply is not
            if stop.wait(0.02):
                return
            handler.wfile.write(b" ")

    with serving(misbehaving(respond)) as url:
        start = time.monotonic()
        with pytest.raises(EngineError, match=r"no complete reply within timeout_s=0.5 s"):
            HttpEngine(url, timeout_s=0.5, retries=0).search("Jupiter")
        elapsed = time.monotonic() - start
        stop.set()
    assert elapsed < 2.0


def test_an_oversized_reply_is_an_engine_error_and_is_not_read_whole():
    sent = []

    def respond(handler):
        handler.send_response(200)
        handler.send_header("Content-Length", str(50 << 20))
        handler.end_headers()
        try:
            for _ in range(50 << 4):
                handler.wfile.write(b"x" * 65536)
                sent.append(65536)
        except OSError:
            pass  # the client hung up

    with serving(misbehaving(respond)) as url:
        with pytest.raises(EngineError, match="over max_response_bytes=1000"):
            HttpEngine(url, max_response_bytes=1000).search("Jupiter")
        time.sleep(0.2)
    assert sum(sent) < 50 << 20


def test_a_server_error_is_retried_then_an_engine_error():
    attempts = []

    def respond(handler):
        attempts.append(handler.path)
        answer(handler, 503, b"overloaded")

    with serving(misbehaving(respond)) as url:
        with pytest.raises(EngineError, match="after 3 attempt.*HTTP 503"):
            HttpEngine(url, retries=2, backoff_s=0.01).search("Jupiter")
    assert attempts == ["/search"] * 3


@pytest.mark.parametrize(
    "body",
    [b"not json", b'{"hits": "none"}', b'{"hits": [{"docid": "x"}]}', b"[]", b'{"hits": [1]}',
     json.dumps({"hits": [{"docid": "a", "title": "t", "url": "u", "snippet": "s", "score": "high"}]}).encode(),
     json.dumps({"hits": [{"docid": "a", "title": "t", "url": "u", "snippet": "s", "score": 1}] * 6}).encode()],
)  # fmt: skip
def test_a_malformed_reply_is_an_engine_error(body):
    with serving(misbehaving(lambda handler: answer(handler, 200, body))) as url:
        with pytest.raises(EngineError, match="search endpoint"):
            HttpEngine(url, retries=0).search("Jupiter")


def test_an_unexpected_status_is_an_engine_error_and_404_is_no_document():
    with serving(
        misbehaving(lambda handler: answer(handler, 404 if "document" in handler.path else 418, b"{}"))
    ) as url:
        remote = HttpEngine(url, retries=0)
        assert remote.get("Jupiter") is None
        with pytest.raises(EngineError, match="HTTP 418"):
            remote.search("Jupiter")


def test_an_endpoint_without_info_has_a_corpus_id_of_its_own():
    with serving(misbehaving(lambda handler: answer(handler, 404, b""))) as url:
        assert HttpEngine(url + "/").corpus_id == f"http:{url}"
