"""A search engine behind HTTP: the backend a user picks at scale (their own index, served anywhere).

`HttpEngine(url)` speaks this JSON protocol to the endpoint at `url` (paths below are appended to
it, so `http://host:8000/wiki` serves `http://host:8000/wiki/search`):

- `POST {url}/search` with `{"query": str, "k": int}` answers 200 with
  `{"hits": [{"docid": str, "title": str, "url": str, "snippet": str, "score": float}, ...]}`,
  best first, at most k; or 400 with `{"error": str, "category": str}` for a query the engine
  refuses (category "empty_query", "query_too_long" or "bad_argument").
- `POST {url}/document` with `{"docid": str}` (that id exactly) or `{"ref": str}` (a docid, a url
  or an exact title) answers 200 with `{"docid", "title", "url", "text"}`, or 404 when no document
  matches.
- `GET {url}/info` answers 200 with `{"name": str, "corpus_id": str}`. The corpus_id tells a pivot
  recorded on this corpus from one recorded elsewhere; an endpoint without /info (404) gets
  `http:<url>` as its corpus_id, so pivots recorded on another engine run on their recorded outputs.

What counts as the endpoint's failure (EngineError: the sample is invalid, never scored 0): no
connection, no complete reply within `timeout_s` (connecting, sending and the whole reply: a server
trickling bytes is cut off), a 5xx answer, after `retries` more attempts; also, at once, a reply
larger than `max_response_bytes`, a body that is not the JSON above, or another status. Queries are
checked here first by the same rules as the FTS engine's (so a 1 MB query is never sent).

`serve_engine(engine, host, port)` is a reference server for any SearchEngine (the bundled FTS
index or a user's corpus) on `http.server.ThreadingHTTPServer`, speaking the same protocol.
"""

from __future__ import annotations

import http.client
import http.server
import json
import logging
import time
import urllib.parse
from dataclasses import asdict
from typing import Any

from pivot_envs.config import ConfigError
from pivot_envs.domains.search.corpus import Document
from pivot_envs.domains.search.engine import (
    QUERY_CATEGORIES,
    EngineError,
    Hit,
    QueryError,
    SearchEngine,
    check_k,
    query_terms,
)
from pivot_envs.exchange import ExchangeDeadline, connection_to, send_json

logger = logging.getLogger(__name__)
MAX_REQUEST_BYTES = 1 << 16


class _Retry(Exception):
    """An attempt failed in a way another attempt may not (connection, timeout, 5xx)."""


class HttpEngine:
    """A SearchEngine on an HTTP endpoint speaking the protocol in this module's docstring."""

    name = "http"

    def __init__(
        self,
        url: str,
        timeout_s: float = 10.0,
        retries: int = 1,
        backoff_s: float = 0.2,
        max_response_bytes: int = 4 << 20,
    ) -> None:
        """`url`: the endpoint's base (http or https); `timeout_s`: seconds one attempt may take in
        all; `retries`: extra attempts after a connection error, a timeout or a 5xx answer, the
        n-th after `backoff_s * 2**(n-1)` seconds; `max_response_bytes`: a longer reply is an error."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"the http search engine's url must be http(s)://host[:port]/path, got {url!r}")
        if not timeout_s > 0 or retries < 0 or backoff_s < 0 or max_response_bytes < 1:
            raise ConfigError(
                f"http search engine {url}: timeout_s must be > 0, retries and backoff_s >= 0, "
                f"max_response_bytes >= 1 (got {timeout_s}, {retries}, {backoff_s}, {max_response_bytes})"
            )
        self.url, self.timeout_s, self.retries, self.backoff_s = (
            url.rstrip("/"),
            timeout_s,
            retries,
            backoff_s,
        )
        self.max_response_bytes = max_response_bytes
        self._parts = parts
        self._corpus_id: str | None = None

    @property
    def corpus_id(self) -> str:
        """The endpoint's corpus_id from GET /info (asked once), or `http:<url>` when it has none."""
        if self._corpus_id is None:
            status, body = self._request("GET", "info", None)
            if status == 404:
                self._corpus_id = f"http:{self.url}"
            else:
                info = self._json(status, body, "info")
                if not isinstance(info, dict) or not isinstance(info.get("corpus_id"), str):
                    raise EngineError(
                        f"search endpoint {self.url}/info: expected {{'corpus_id': str}}, got {body[:200]!r}"
                    )
                self._corpus_id = info["corpus_id"]
        return self._corpus_id

    def search(self, query: str, k: int = 5) -> list[Hit]:
        """The endpoint's top `k` hits for `query`; QueryError for a refused query (here or by the
        endpoint), EngineError when the endpoint fails."""
        query_terms(query)
        check_k(k)
        status, body = self._request("POST", "search", {"query": query, "k": k})
        if status == 400:
            refusal = self._json(status, body, "search")
            category = refusal.get("category") if isinstance(refusal, dict) else None
            message = refusal.get("error") if isinstance(refusal, dict) else None
            raise QueryError(
                category if category in QUERY_CATEGORIES else "bad_argument", str(message or body[:200])
            )
        reply = self._json(status, body, "search")
        hits = reply.get("hits") if isinstance(reply, dict) else None
        if not isinstance(hits, list) or len(hits) > k:
            raise EngineError(
                f"search endpoint {self.url}/search: expected {{'hits': [at most {k}]}}, got {body[:200]!r}"
            )
        return [_hit(self.url, hit) for hit in hits]

    def get(self, docid: str) -> Document | None:
        """The document with id `docid` (None when the endpoint answers 404, or for a non-string)."""
        return self._document({"docid": docid}) if isinstance(docid, str) else None

    def lookup(self, ref: str) -> Document | None:
        """The document a docid, url or exact title names (None when the endpoint answers 404)."""
        return self._document({"ref": ref}) if isinstance(ref, str) and ref.strip() else None

    def _document(self, request: dict[str, str]) -> Document | None:
        status, body = self._request("POST", "document", request)
        if status == 404:
            return None
        reply = self._json(status, body, "document")
        fields = ("docid", "title", "text", "url")
        if not isinstance(reply, dict) or not all(isinstance(reply.get(field), str) for field in fields):
            raise EngineError(
                f"search endpoint {self.url}/document: expected {{{', '.join(fields)}}}, got {body[:200]!r}"
            )
        return Document(*(reply[field] for field in fields))

    def _json(self, status: int, body: bytes, path: str) -> Any:
        if status not in (200, 400):
            raise EngineError(f"search endpoint {self.url}/{path}: HTTP {status}: {body[:200]!r}")
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            raise EngineError(
                f"search endpoint {self.url}/{path}: the reply is not JSON: {body[:200]!r}"
            ) from None

    def _request(self, method: str, path: str, payload: Any) -> tuple[int, bytes]:
        """(status, body) of one exchange, retried after a connection error, timeout or 5xx."""
        body = None if payload is None else json.dumps(payload).encode()
        problem = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                return self._exchange(method, path, body)
            except _Retry as error:
                problem = str(error)
        raise EngineError(
            f"search endpoint {self.url}/{path} failed after {self.retries + 1} attempt(s): {problem}"
        )

    def _exchange(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        parts = self._parts
        connection = connection_to(parts, self.timeout_s)
        watchdog = ExchangeDeadline(self.timeout_s)
        try:
            connection.connect()
            watchdog.hold(connection.sock)
            if watchdog.expired:
                raise _Retry(f"no reply within timeout_s={self.timeout_s} s")
            headers = {"Content-Type": "application/json"} if body is not None else {}
            connection.request(method, f"{parts.path.rstrip('/')}/{path}", body=body, headers=headers)
            response = connection.getresponse()
            data = response.read(self.max_response_bytes + 1)
        except (OSError, http.client.HTTPException) as error:
            if watchdog.expired or isinstance(error, TimeoutError):  # the socket's own timeout may come first
                raise _Retry(f"no complete reply within timeout_s={self.timeout_s} s") from None
            raise _Retry(f"{type(error).__name__}: {error}") from None
        finally:
            watchdog.cancel()
            connection.close()
        if watchdog.expired:
            raise _Retry(f"no complete reply within timeout_s={self.timeout_s} s")
        if len(data) > self.max_response_bytes:
            raise EngineError(
                f"search endpoint {self.url}/{path}: the reply is over max_response_bytes={self.max_response_bytes}"
            )
        if response.status >= 500:
            raise _Retry(f"HTTP {response.status}: {data[:200]!r}")
        return response.status, data


def _hit(url: str, hit: Any) -> Hit:
    fields = ("docid", "title", "url", "snippet")
    if not isinstance(hit, dict) or not all(isinstance(hit.get(field), str) for field in fields):
        raise EngineError(
            f"search endpoint {url}/search: a hit needs string {', '.join(fields)}, got {hit!r:.200}"
        )
    score = hit.get("score", 0.0)
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        raise EngineError(f"search endpoint {url}/search: a hit's score must be a number, got {score!r:.50}")
    return Hit(hit["docid"], hit["title"], hit["url"], hit["snippet"], float(score))


class _Handler(http.server.BaseHTTPRequestHandler):
    engine: SearchEngine
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = (
        True  # headers and body go in two writes: without it a reply waits for a delayed ACK
    )

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("search server: " + format, *args)

    def _reply(self, status: int, payload: Any) -> None:
        send_json(self, status, payload)

    def do_GET(self) -> None:
        if self.path.rstrip("/").rsplit("/", 1)[-1] == "info":
            self._reply(200, {"name": self.engine.name, "corpus_id": self.engine.corpus_id})
        else:
            self._reply(404, {"error": f"no such endpoint {self.path!r}"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_REQUEST_BYTES:
            self.close_connection = True
            self._reply(413, {"error": f"a request body of 1 to {MAX_REQUEST_BYTES} bytes is expected"})
            return
        try:
            request = json.loads(self.rfile.read(length))
        except (ValueError, RecursionError):
            request = None
        endpoint = self.path.rstrip("/").rsplit("/", 1)[-1]
        if not isinstance(request, dict):
            self._reply(400, {"error": "the body must be a JSON object", "category": "bad_argument"})
        elif endpoint == "search":
            self._search(request)
        elif endpoint == "document":
            self._document(request)
        else:
            self._reply(404, {"error": f"no such endpoint {self.path!r}"})

    def _search(self, request: dict[str, Any]) -> None:
        try:
            hits = self.engine.search(request.get("query"), request.get("k", 5))
        except QueryError as error:
            self._reply(400, {"error": str(error), "category": error.category})
        except EngineError as error:
            self._reply(503, {"error": str(error)})
        else:
            self._reply(200, {"hits": [asdict(hit) for hit in hits]})

    def _document(self, request: dict[str, Any]) -> None:
        try:
            if "docid" in request:
                document = self.engine.get(request["docid"])
            else:
                document = self.engine.lookup(request.get("ref"))
        except EngineError as error:
            self._reply(503, {"error": str(error)})
            return
        if document is None:
            self._reply(404, {"error": "no such document"})
        else:
            self._reply(200, asdict(document))


def serve_engine(
    engine: SearchEngine, host: str = "127.0.0.1", port: int = 8000
) -> http.server.ThreadingHTTPServer:
    """A server (bound, not yet serving: call `serve_forever()`) answering the protocol of this
    module for `engine` on host:port (port 0: a free one, see `server_address`)."""
    handler = type("SearchHandler", (_Handler,), {"engine": engine})
    server = http.server.ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server
