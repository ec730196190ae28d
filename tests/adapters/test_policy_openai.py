"""OpenAIPolicy against a real local OpenAI-compatible server (stdlib http.server serving HFPolicy)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pivot_envs.adapters.policies.openai import EndpointError, OpenAIPolicy, chat_completions_url
from pivot_envs.exchange import send_json
from pivot_envs.policy import Completion, Policy, SamplingParams, load_policy

CHAT = {"messages": [{"role": "user", "content": "Name a color."}], "tools": []}
TOOL_CHAT = {
    "messages": [{"role": "user", "content": "What is the status of flight HAT069?"}],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_flight_status",
                "description": "Status of a flight",
                "parameters": {"type": "object", "properties": {"flight_number": {"type": "string"}}},
            },
        }
    ],
}


class Server:
    """A chat completions server over an HFPolicy.

    Model 'echo' answers with the last user message (so a test controls the output), and
    'slow', 'fail500', 'flaky' misbehave. Like a server run with a Hermes tool parser, answers
    holding `<tool_call>` blocks come back as structured `tool_calls`.
    """

    def __init__(self, policy) -> None:
        self.policy = policy
        self.requests: Counter = Counter()
        self.bodies: list[dict] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                model = body["model"]
                with server.lock:
                    server.requests[model] += 1
                    count = server.requests[model]
                    server.bodies.append(body)
                if self.path != "/v1/chat/completions":
                    return self.answer(404, {"error": f"no route {self.path}"})
                if model == "fail500" or (model == "flaky" and count == 1):
                    return self.answer(500, {"error": "engine crashed"})
                if model == "slow":
                    time.sleep(1.5)
                with server.lock:  # one generation at a time on the shared model
                    answer = server.complete(body)
                self.answer(200, answer)

            def answer(self, status, payload):
                send_json(self, status, payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def complete(self, body: dict) -> dict:
        from pivot_envs.domains.tool_use.parser import parse_action

        sampling = SamplingParams(body["temperature"], body["top_p"], body["max_tokens"], body.get("seed"))
        chat = {"messages": body["messages"], "tools": body.get("tools", [])}
        if body["model"] == "echo":
            group = [Completion(body["messages"][-1]["content"], finish_reason="stop")] * body["n"]
        else:
            (group,) = self.policy.generate([chat], body["n"], sampling)
        choices = []
        for index, completion in enumerate(group):
            message = {"role": "assistant", "content": completion.text}
            parsed = parse_action(completion.text).message
            if parsed and parsed.get("tool_calls"):  # like a server with a Hermes tool parser
                message = {"role": "assistant", "content": None, "tool_calls": parsed["tool_calls"]}
            tokens = [self.policy.tokenizer.decode([t]) for t in completion.token_ids]
            choices.append(
                {
                    "index": index,
                    "message": message,
                    "finish_reason": completion.finish_reason,
                    "logprobs": {
                        "content": [{"token": t, "logprob": lp} for t, lp in zip(tokens, completion.logprobs)]
                    },
                }
            )
        return {"id": "cmpl-test", "object": "chat.completion", "model": body["model"], "choices": choices}

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def hf_policy():
    import torch

    from pivot_envs.adapters.policies.hf import HFPolicy

    torch.set_num_threads(1)  # the test machine's cores are shared: one thread is much faster there
    return HFPolicy.from_pretrained("smollm2", device="cpu")


@pytest.fixture(scope="module")
def server(hf_policy):
    running = Server(hf_policy)
    yield running
    running.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_n_samples_come_back_with_text_logprobs_and_finish_reasons_equal_to_the_local_backend(
    server, hf_policy
):
    policy = OpenAIPolicy(server.url, "smollm2", timeout=60)
    assert isinstance(policy, Policy)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=4)
    (remote,) = policy.generate([CHAT], n=3, sampling=sampling)
    (local,) = hf_policy.generate([CHAT], n=3, sampling=sampling)
    assert [c.text for c in remote] == [c.text for c in local]
    assert [c.finish_reason for c in remote] == [c.finish_reason for c in local]
    for r, lo in zip(remote, local):
        assert r.logprobs == pytest.approx(lo.logprobs, abs=1e-6) and len(r.logprobs) == len(lo.token_ids)
    body = server.bodies[-1]
    assert (body["n"], body["max_tokens"], body["temperature"], body["seed"], body["logprobs"]) == (
        3,
        8,
        1.0,
        4,
        True,
    )


def test_tools_are_sent_and_parsed_tool_calls_come_back_as_the_message(server):
    policy = OpenAIPolicy(server.url, "echo")
    call = (
        '<tool_call>\n{"name": "get_flight_status", "arguments": {"flight_number": "HAT069"}}\n</tool_call>'
    )
    chat = {**TOOL_CHAT, "messages": [{"role": "user", "content": call}]}
    (group,) = policy.generate([chat], n=2, sampling=SamplingParams(temperature=0.0, max_new_tokens=40))
    assert server.bodies[-1]["tools"] == TOOL_CHAT["tools"]
    for completion in group:
        assert completion.action is completion.message and completion.text == ""
        (tool_call,) = completion.message["tool_calls"]
        assert tool_call["function"]["name"] == "get_flight_status"
        assert json.loads(tool_call["function"]["arguments"]) == {"flight_number": "HAT069"}


def test_a_plain_answer_is_stepped_as_text(server):
    policy = OpenAIPolicy(server.url, "echo")
    (group,) = policy.generate([CHAT], n=1, sampling=SamplingParams())
    assert group[0].message is None and group[0].action == "Name a color."


def test_each_chat_is_requested_with_its_own_seed(server):
    policy = OpenAIPolicy(server.url, "echo", concurrency=2)
    chats = [{**CHAT, "messages": [{"role": "user", "content": f"chat {i}"}]} for i in range(3)]
    groups = policy.generate(chats, n=2, sampling=SamplingParams(seed=1, seeds=[21, 22, 23]))
    assert [group[0].text for group in groups] == ["chat 0", "chat 1", "chat 2"]
    sent = {body["messages"][-1]["content"]: body["seed"] for body in server.bodies[-3:]}
    assert sent == {"chat 0": 21, "chat 1": 22, "chat 2": 23}
    policy.generate(
        chats[:2], n=1, sampling=SamplingParams(seed=4)
    )  # without per-chat seeds, the call's seed
    assert [body["seed"] for body in server.bodies[-2:]] == [4, 4]
    with pytest.raises(ValueError, match="holds 2 seeds for 3 chats"):
        policy.generate(chats, n=1, sampling=SamplingParams(seeds=[1, 2]))


def test_several_base_urls_are_used_round_robin(server):
    server.requests.clear()
    second = Server(server.policy)
    try:
        policy = OpenAIPolicy([server.url, second.url], "smollm2", concurrency=1)
        policy.generate([CHAT] * 4, n=1, sampling=SamplingParams(temperature=0.0, max_new_tokens=2))
        assert server.requests["smollm2"] == 2 and second.requests["smollm2"] == 2
    finally:
        second.close()


def test_a_500_answer_is_retried_then_a_clear_error_names_the_endpoint_and_status(server):
    server.requests.clear()
    policy = OpenAIPolicy(server.url, "fail500", max_retries=2, backoff=0.01)
    with pytest.raises(
        EndpointError, match=r"POST http://127\.0\.0\.1:\d+/v1/chat/completions: HTTP 500.*after 3 attempts"
    ) as info:
        policy.generate([CHAT], n=1, sampling=SamplingParams(max_new_tokens=2))
    assert info.value.status == 500 and server.requests["fail500"] == 3


def test_a_transient_500_is_retried_and_succeeds(server):
    server.requests.clear()
    policy = OpenAIPolicy(server.url, "flaky", max_retries=2, backoff=0.01)
    (group,) = policy.generate([CHAT], n=2, sampling=SamplingParams(temperature=0.0, max_new_tokens=3))
    assert len(group) == 2 and server.requests["flaky"] == 2


def test_a_request_past_its_timeout_fails_naming_the_timeout(server):
    policy = OpenAIPolicy(server.url, "slow", timeout=0.3, max_retries=1, backoff=0.01)
    started = time.perf_counter()
    with pytest.raises(EndpointError, match=r"no answer within 0\.3s after 2 attempts"):
        policy.generate([CHAT], n=1, sampling=SamplingParams(max_new_tokens=2))
    assert time.perf_counter() - started < 1.4  # two 0.3 s timeouts, not the server's 1.5 s


def test_an_unreachable_endpoint_is_a_clear_error():
    url = f"http://127.0.0.1:{free_port()}"
    policy = OpenAIPolicy(url, "m", max_retries=1, backoff=0.01, timeout=2)
    with pytest.raises(EndpointError, match=rf"POST {url}/v1/chat/completions: connection failed"):
        policy.generate([CHAT], n=1, sampling=SamplingParams())


def test_base_urls_with_or_without_v1_reach_the_chat_completions_route():
    assert chat_completions_url("http://h:8000") == "http://h:8000/v1/chat/completions"
    assert chat_completions_url("http://h:8000/v1/") == "http://h:8000/v1/chat/completions"
    with pytest.raises(ValueError, match="must start with http"):
        chat_completions_url("h:8000")


def test_the_openai_spec_builds_a_policy_over_several_urls():
    policy = load_policy("openai:http://a:1/v1,http://b:2#served-model")
    assert policy.endpoints == ["http://a:1/v1/chat/completions", "http://b:2/v1/chat/completions"]
    assert policy.model == "served-model" and policy.name == "openai:served-model"


def test_a_prompt_budget_for_a_server_policy_is_refused_naming_why():
    from pivot_envs.policy import PolicySpecError

    with pytest.raises(
        PolicySpecError, match=r"openai:http://h:1#m'.*prompt budget.*own template and tokenizer"
    ):
        load_policy("openai:http://h:1#m", max_prompt_tokens=1024)
    assert isinstance(load_policy("openai:http://h:1#m", max_prompt_tokens=0), OpenAIPolicy)


def test_a_dtype_for_a_server_policy_is_refused_naming_it():
    from pivot_envs.policy import PolicySpecError

    with pytest.raises(PolicySpecError, match=r"openai:http://h:1#m'.*--dtype bfloat16.*own precision"):
        load_policy("openai:http://h:1#m", dtype="bfloat16")
    assert isinstance(load_policy("openai:http://h:1#m", dtype=None), OpenAIPolicy)


def test_pivotrl_profile_runs_against_the_server_and_an_unreachable_endpoint_writes_nothing_twice(
    server, tmp_path: Path
):
    from dataclasses import replace

    from pivot_envs.cli import main
    from pivot_envs.domains.tool_use.env import bundled_pivots
    from pivot_envs.pivot import read_pivots, write_pivots

    pivots = [
        replace(
            p,
            messages=[{"role": "user", "content": "Hi, I need help with my reservation."}],
            tools=p.tools[:1],
        )
        for p in bundled_pivots()[:3]
    ]
    candidates, out = tmp_path / "candidates.jsonl", tmp_path / "profiled.jsonl"
    write_pivots(pivots[:2], candidates)
    args = [
        "--k",
        "2",
        "--max-new-tokens",
        "6",
        "--temperature",
        "0.7",
        "--out",
        str(out),
        "--progress",
        "false",
    ]
    assert main(["profile", str(candidates), "--policy", f"openai:{server.url}#smollm2", *args]) == 0
    first = out.read_bytes()
    assert [p.id for p in read_pivots(out)] == [p.id for p in pivots[:2]]

    write_pivots(pivots, candidates)  # one more candidate; the endpoint is now down
    dead = f"openai:http://127.0.0.1:{free_port()}#smollm2"
    assert main(["profile", str(candidates), "--policy", dead, *args]) == 1
    assert out.read_bytes() == first
    assert main(["profile", str(candidates), "--policy", f"openai:{server.url}#smollm2", *args]) == 0
    assert [p.id for p in read_pivots(out)] == [p.id for p in pivots]
    assert out.read_bytes().startswith(first)
