"""A scripted OpenAI-compatible chat server on 127.0.0.1, for end-to-end tests of `pivotrl profile` and
`pivotrl eval` through the real HTTP policy without a language model (which would take minutes).

`ChatCompletionsStub(reply)` answers POST /v1/chat/completions with `n` choices, choice j being the
assistant message `reply(body, j)`; `url` is the base URL an `openai:URL#MODEL` policy takes.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pivot_envs.exchange import send_json

Reply = Callable[[dict, int], dict]


class ChatCompletionsStub:
    """A real HTTP server whose "model" is `reply` (see the module docstring); close() stops it."""

    def __init__(self, reply: Reply) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                choices = [
                    {"index": j, "message": reply(body, j), "finish_reason": "stop"}
                    for j in range(body.get("n", 1))
                ]
                answer = {
                    "id": "scripted",
                    "object": "chat.completion",
                    "model": body["model"],
                    "choices": choices,
                }
                send_json(self, 200, answer)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
