"""The OpenAI-compatible HTTP backend: `OpenAIPolicy` (vLLM `serve`, SGLang, TGI, OpenAI, ...).

One `POST /v1/chat/completions` per chat, asking for all n samples at once (`n`), with the
pivot's tools, sampling options, the chat's seed and `logprobs`. Several base URLs are used round-robin, which is
how profiling scales past one machine (a fleet of `vllm serve` replicas). Timeouts, retries and
their backoff are explicit; connection errors, timeouts, 5xx and 429 answers are retried on the
next base URL, and the final error names the endpoint and the HTTP status.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from pivot_envs.chat import tool_to_chat
from pivot_envs.errors import PivotEnvsError
from pivot_envs.policy import Completion, PolicySpecError, SamplingParams

RETRIED_STATUS = {429, 500, 502, 503, 504}


class EndpointError(PivotEnvsError, RuntimeError):
    """An OpenAI-compatible endpoint failed (after retries); the message names it and the status."""

    def __init__(self, message: str, url: str = "", status: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status


def sampling_fields(sampling: SamplingParams) -> dict[str, Any]:
    """The request fields of `sampling`: temperature, top_p, max_tokens, and seed, top_k, min_p and
    stop when set (top_k and min_p are vLLM's and SGLang's extensions of the OpenAI API)."""
    fields: dict[str, Any] = {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_tokens": sampling.max_new_tokens,
    }
    if sampling.seed is not None:
        fields["seed"] = sampling.seed
    if sampling.top_k:
        fields["top_k"] = sampling.top_k
    if sampling.min_p:
        fields["min_p"] = sampling.min_p
    if sampling.stop:
        fields["stop"] = list(sampling.stop)
    return fields


def chat_completions_url(base_url: str) -> str:
    """`http://host:8000` or `http://host:8000/v1` -> `http://host:8000/v1/chat/completions`."""
    base = base_url.strip().rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise PolicySpecError(f"base URL {base_url!r} must start with http:// or https://")
    return base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")


class OpenAIPolicy:
    """A model behind OpenAI-compatible chat completions endpoints, as a Policy.

    base_urls:    one base URL or several (round-robin), e.g. "http://gpu1:8000/v1".
    model:        the served model name.
    timeout:      seconds allowed for one request (connect and read).
    max_retries:  retries of a request after a connection error, timeout, 5xx or 429.
    backoff:      the first retry waits `backoff` seconds, doubling each time.
    concurrency:  chats requested in parallel.
    api_key:      sent as a Bearer token; default $OPENAI_API_KEY, none if unset.
    logprobs:     ask for the sampled tokens' logprobs.
    extra_body:   extra request fields (e.g. vLLM's {"top_k": 20}).

    A completion's `text` is the message content; `message` is the assistant message when the
    server parsed tool calls (so envs step the structured calls), else None (envs parse the
    text). `token_ids` stay empty: the chat API does not return them.
    """

    def __init__(
        self,
        base_urls: str | Sequence[str],
        model: str,
        timeout: float = 120.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        concurrency: int = 8,
        api_key: str | None = None,
        logprobs: bool = True,
        extra_body: dict[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        import requests

        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        urls = [u for part in urls for u in part.split(",") if u.strip()]
        if not urls:
            raise PolicySpecError("OpenAIPolicy needs at least one base URL (openai:BASE_URL#MODEL)")
        if not model:
            raise PolicySpecError(f"OpenAIPolicy at {urls[0]} needs a model name (openai:BASE_URL#MODEL)")
        self.endpoints = [chat_completions_url(u) for u in urls]
        self.model = model
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.concurrency = max(1, concurrency)
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.logprobs = logprobs
        self.extra_body = dict(extra_body or {})
        self.name = name or f"openai:{model}"
        self._next = itertools.count()
        self._lock = threading.Lock()
        self._session = requests.Session()

    def _endpoint(self) -> str:
        with self._lock:
            return self.endpoints[next(self._next) % len(self.endpoints)]

    def request_body(self, chat: dict[str, Any], n: int, sampling: SamplingParams) -> dict[str, Any]:
        """The JSON body of one chat completions request."""
        body: dict[str, Any] = {"model": self.model, "messages": list(chat["messages"]), "n": n}
        body.update(sampling_fields(sampling))
        if chat.get("tools"):
            body["tools"] = [tool_to_chat(tool) for tool in chat["tools"]]
        if self.logprobs:
            body["logprobs"] = True
        body.update(self.extra_body)
        return body

    def post(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST a body with retries; returns the parsed JSON answer or raises EndpointError."""
        import requests

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        failure = ""
        url, status = "", None
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            url = self._endpoint()
            try:
                answer = self._session.post(url, json=body, headers=headers, timeout=self.timeout)
            except requests.Timeout:
                failure, status = f"no answer within {self.timeout}s", None
                continue
            except requests.ConnectionError as error:
                failure, status = f"connection failed ({type(error).__name__}: {_reason(error)})", None
                continue
            status = answer.status_code
            if status == 200:
                try:
                    return answer.json()
                except ValueError:
                    raise EndpointError(
                        f"POST {url}: HTTP 200 but the body is not JSON: {answer.text[:200]!r}", url, status
                    ) from None
            failure = f"HTTP {status}: {answer.text[:300]}"
            if status not in RETRIED_STATUS:
                break
        attempts = (
            f"after {self.max_retries + 1} attempts" if status in RETRIED_STATUS or status is None else ""
        )
        raise EndpointError(f"POST {url}: {failure} {attempts}".rstrip(), url, status)

    def _generate_one(self, chat: dict[str, Any], n: int, sampling: SamplingParams) -> list[Completion]:
        answer = self.post(self.request_body(chat, n, sampling))
        choices = sorted(answer.get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != n:
            raise EndpointError(
                f"{self.endpoints[0]}: asked for n={n} choices, got {len(choices)} (does the server support n?)"
            )
        return [_completion(choice) for choice in choices]

    def generate(
        self, chats: Sequence[dict[str, Any]], n: int, sampling: SamplingParams
    ) -> list[list[Completion]]:
        """n completions per chat, requested concurrently (one request per chat, carrying the
        chat's seed from `sampling.seeds`, else `sampling.seed`)."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        jobs = [
            (chat, replace(sampling, seed=seed, seeds=None))
            for chat, seed in zip(chats, sampling.chat_seeds(len(chats)))
        ]
        if len(jobs) <= 1 or self.concurrency == 1:
            return [self._generate_one(chat, n, chat_sampling) for chat, chat_sampling in jobs]
        with ThreadPoolExecutor(min(self.concurrency, len(jobs))) as pool:
            return list(pool.map(lambda job: self._generate_one(job[0], n, job[1]), jobs))


def _reason(error: Exception) -> str:
    text = str(error)
    return text if len(text) < 200 else text[:200] + "..."


def _completion(choice: dict[str, Any]) -> Completion:
    message = choice.get("message") or {}
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    entries = ((choice.get("logprobs") or {}).get("content")) or []
    parsed = None
    if message.get("tool_calls"):
        parsed = {"role": "assistant", "content": content, "tool_calls": message["tool_calls"]}
    return Completion(
        text=text,
        logprobs=[float(entry.get("logprob", 0.0)) for entry in entries],
        message=parsed,
        finish_reason=str(choice.get("finish_reason") or ""),
    )


def from_spec(rest: str, **options: Any) -> OpenAIPolicy:
    """`openai:BASE_URL[,BASE_URL...]#MODEL`; options are OpenAIPolicy's keyword arguments."""
    urls, sep, model = rest.rpartition("#")
    if not sep or not urls or not model:
        raise PolicySpecError(f"policy spec 'openai:{rest}' must be openai:BASE_URL[,BASE_URL...]#MODEL")
    options.pop("device", None)  # a remote server has no local device
    dtype = options.pop("dtype", None)
    if dtype is not None:
        raise PolicySpecError(
            f"policy spec 'openai:{rest}': a dtype (--dtype {dtype}) cannot apply, since the server "
            "loads its weights in its own precision; leave it unset, or use hf:/vllm:"
        )
    if options.pop("max_prompt_tokens", None):
        raise PolicySpecError(
            f"policy spec 'openai:{rest}': a prompt budget (--max-prompt-tokens) cannot apply, since the "
            "server renders prompts with its own template and tokenizer; leave it 0, or use hf:/vllm: "
            "(pivotrl run, which sets one, trains only those)"
        )
    return OpenAIPolicy(urls.split(","), model, **options)
