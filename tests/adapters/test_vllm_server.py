"""VLLMServerPolicy against a real `vllm serve` on 127.0.0.1 (CPU here): samples, weight sync, GRPO through it.

One server for the module (`vllm-server:smollm2`: SmolLM2-135M in float32, ~50 s to start on
CPU). Its samples carry the prompt ids the trainer scores and logprobs the trainer's
recomputation matches within LOGPROB_TOLERANCE; two GRPO steps of the bundled trainer push their
weights into it, after which it scores a fixed completion as transformers does on the trained
weights and not as before; so do three steps sampled one version ahead (max_staleness=1), with one
sync per published version, the last one reaching the server; a sync to a server that is down, or
that does not answer within the timeout, raises WeightSyncError in time.
"""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from pivot_envs.policy import SamplingParams, load_policy

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (make setup)"),
]

# As tests/adapters/test_policy_vllm.py: float32 on CPU, ~4e-5 measured between the server and transformers.
LOGPROB_TOLERANCE = 1e-3

CHAT = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "tools": []}


@pytest.fixture(scope="module")
def policy():
    from toys import cpu_server_options  # one unbound OpenMP thread: the machine's 2 cores are shared

    policy = load_policy("vllm-server:smollm2", **cpu_server_options(max_model_len=2048))
    yield policy
    policy.close()
    assert policy.server.process.poll() is not None  # close() stopped the server


def trainer_logprobs(model, prompt_token_ids, completions_token_ids):
    """The trainer's recomputed logprobs of each completion after the prompt (the GRPO update's kernel)."""
    import torch

    from pivot_envs.adapters.grpo.shared_prefix import groups_logprobs

    with torch.no_grad():
        logprobs, mask, _ = groups_logprobs(model, [(prompt_token_ids, completions_token_ids)])
    return [row[keep].tolist() for row, keep in zip(logprobs, mask)]


def max_difference(rows, others) -> float:
    return max(abs(a - b) for row, other in zip(rows, others) for a, b in zip(row, other))


def test_served_samples_carry_the_trainers_prompt_ids_and_logprobs_the_trainer_recomputes(policy):
    from pivot_envs.adapters.chat_template import encode_prompt

    model = policy.trainable_model()
    (group,) = policy.generate(
        [CHAT], n=4, sampling=SamplingParams(temperature=1.0, max_new_tokens=12, seed=5)
    )
    assert len(group) == 4 and len({tuple(c.token_ids) for c in group}) > 1
    for completion in group:
        assert completion.prompt_token_ids == encode_prompt(policy.tokenizer, CHAT["messages"], [])
        assert 0 < len(completion.token_ids) == len(completion.logprobs) <= 12
        shown = completion.token_ids[:-1] if completion.finish_reason == "stop" else completion.token_ids
        assert policy.tokenizer.decode(shown) == completion.text
    recomputed = trainer_logprobs(model, group[0].prompt_token_ids, [c.token_ids for c in group])
    difference = max_difference([c.logprobs for c in group], recomputed)
    print(f"max |server logprob - trainer logprob| = {difference:.2e}")
    assert difference < LOGPROB_TOLERANCE  # the importance ratio at step 0 is exp(difference) from 1


def test_top_k_min_p_stop_and_seed_reach_the_server_through_both_clients(policy):
    from pivot_envs.adapters.policies.openai import OpenAIPolicy

    chat_client = OpenAIPolicy(
        policy.server.base_url, policy.model
    )  # the chat API: the server renders the prompt
    for client in (policy, chat_client):
        ((greedy,),) = client.generate(
            [CHAT], n=1, sampling=SamplingParams(temperature=0.0, max_new_tokens=8)
        )
        for filtered in (
            SamplingParams(temperature=1.0, max_new_tokens=8, seed=1, top_k=1),
            SamplingParams(temperature=1.0, max_new_tokens=8, seed=1, min_p=1.0),
        ):
            (group,) = client.generate([CHAT], n=3, sampling=filtered)
            assert [c.text for c in group] == [greedy.text] * 3
        stop = greedy.text.split()[2]
        ((stopped,),) = client.generate(
            [CHAT], n=1, sampling=SamplingParams(temperature=0.0, max_new_tokens=8, stop=[stop])
        )
        assert (stopped.text, stopped.finish_reason) == (greedy.text[: greedy.text.index(stop)], "stop")
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=7)
    first, again = (policy.generate([CHAT], n=3, sampling=sampling)[0] for _ in range(2))
    other = policy.generate([CHAT], n=3, sampling=SamplingParams(temperature=1.0, max_new_tokens=8, seed=8))[
        0
    ]
    assert [c.token_ids for c in first] == [c.token_ids for c in again] != [c.token_ids for c in other]


@contextlib.contextmanager
def training_on(policy, seed: int):
    """The server's weights as a trainable model, a completion sampled before training with its logprobs, and
    the weight syncs counted (each one's time); afterwards the server's original weights are put back (the
    module's tests share it) and score that completion as before."""
    model = policy.trainable_model()
    original = {name: value.clone() for name, value in model.state_dict().items()}
    ((fixed,),) = policy.generate(
        [CHAT], n=1, sampling=SamplingParams(temperature=1.0, max_new_tokens=12, seed=seed)
    )
    prompt, tokens = fixed.prompt_token_ids, fixed.token_ids
    before = policy.sequence_logprobs(prompt, tokens)
    syncs = []
    update_weights = policy.update_weights
    policy.update_weights = lambda state: (update_weights(state), syncs.append(policy.last_sync_s))
    try:
        yield SimpleNamespace(model=model, prompt=prompt, tokens=tokens, before=before, syncs=syncs)
    finally:
        del policy.update_weights
        policy.update_weights(original)
    assert max_difference([policy.sequence_logprobs(prompt, tokens)], [before]) < LOGPROB_TOLERANCE


def train_echo(policy, model, config):
    """The bundled trainer through the server on the core tests' env over real NeMo-Gym tool-use pivots."""
    from pivot_envs.adapters.grpo import train

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
    from echo_domain import EchoEnv, real_pivots
    from toys import HasLetterVerifier

    return train(
        config,
        real_pivots(),
        policy=policy,
        model=model,
        env_id=lambda: EchoEnv(real_pivots(), verifier=HasLetterVerifier()),
    )


def test_two_grpo_steps_against_the_server_leave_it_serving_the_trained_weights(policy, tmp_path):
    from tiny_model import tiny_config

    with training_on(policy, seed=2) as run:
        prompt, tokens, before = run.prompt, run.tokens, run.before
        assert max_difference([before], trainer_logprobs(run.model, prompt, [tokens])) < LOGPROB_TOLERANCE
        config = tiny_config(tmp_path, learning_rate=1e-4, steps=2, checkpoint_every=0)
        result = train_echo(policy, run.model, config)
        assert [record["groups_trained"] > 0 for record in result.history] == [True, True]
        assert len(run.syncs) == 2  # one weight sync per update, each timed
        after = policy.sequence_logprobs(prompt, tokens)
        expected = trainer_logprobs(run.model, prompt, [tokens])[0]
        print(
            f"after 2 steps: max |server - trainer| = {max_difference([after], [expected]):.2e}, "
            f"moved by {max_difference([after], [before]):.2e}; sync {policy.last_sync_s:.1f} s"
        )
        assert max_difference([after], [expected]) < LOGPROB_TOLERANCE
        assert max_difference([after], [before]) > 10 * LOGPROB_TOLERANCE


def test_grpo_sampling_one_version_ahead_on_the_server_syncs_every_version_and_ends_on_the_last(
    policy, tmp_path
):
    from tiny_model import tiny_config

    with training_on(policy, seed=3) as run:
        config = tiny_config(tmp_path, learning_rate=1e-4, steps=3, checkpoint_every=0, max_staleness=1)
        records = train_echo(policy, run.model, config).history
        print("staleness per step:", [r["staleness_max"] for r in records], "syncs (s):", run.syncs)
        assert [r["step"] for r in records] == [1, 2, 3]
        assert all(0 <= r["staleness_max"] <= 1 for r in records)
        assert records[0]["policy_version"] == 0  # nothing is published before the first update
        assert sum(r["groups_trained"] for r in records) > 0
        assert len(run.syncs) == 3  # one weight sync per published version (1, 2, 3), each timed
        after = policy.sequence_logprobs(run.prompt, run.tokens)
        expected = trainer_logprobs(run.model, run.prompt, [run.tokens])[0]
        print(f"after 3 steps at s=1: max |server - trainer| = {max_difference([after], [expected]):.2e}")
        assert max_difference([after], [expected]) < LOGPROB_TOLERANCE  # the last version reached the server
        assert max_difference([after], [run.before]) > 10 * LOGPROB_TOLERANCE


def test_a_sync_to_a_server_that_is_down_raises_weight_sync_error_naming_it():
    import torch

    from pivot_envs.adapters.policies.vllm_server import VLLMServerPolicy, WeightSyncError, free_port

    url = f"http://127.0.0.1:{free_port()}"
    policy = VLLMServerPolicy(url, "smollm2", sync_timeout=5)
    began = time.monotonic()
    with pytest.raises(
        WeightSyncError, match=rf"vLLM server {url}: reload_weights failed, the server is unreachable"
    ):
        policy.update_weights({"model.norm.weight": torch.ones(576)})
    assert time.monotonic() - began < 5
    policy.close()


def test_a_sync_the_server_does_not_answer_in_time_raises_weight_sync_error_within_the_timeout():
    import torch

    from pivot_envs.adapters.policies.vllm_server import VLLMServerPolicy, WeightSyncError

    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        policy = VLLMServerPolicy(url, "smollm2", sync_timeout=1)
        began = time.monotonic()
        with pytest.raises(
            WeightSyncError, match=rf"vLLM server {url}: reload_weights did not answer within \d+s"
        ):
            policy.update_weights({"model.norm.weight": torch.ones(576)})
        assert time.monotonic() - began < 1 + policy.sync_margin + 2
        policy.close()


def test_a_server_that_cannot_start_is_a_clear_error_with_its_log(tmp_path):
    from pivot_envs.adapters.policies.vllm_server import ServerStartError, VLLMServer

    with pytest.raises(
        ServerStartError, match=r"vllm serve .*missing exited with code \d+ before it was healthy"
    ):
        VLLMServer(str(tmp_path / "missing"), start_timeout=120)


def test_a_server_without_its_development_endpoints_raises_weight_sync_error_saying_how_to_start_it():
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import torch

    from pivot_envs.adapters.policies.vllm_server import VLLMServerPolicy, WeightSyncError

    class NotFound(
        BaseHTTPRequestHandler
    ):  # as vllm serve without VLLM_SERVER_DEV_MODE=1 answers /collective_rpc
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    policy = VLLMServerPolicy(url + "/v1", "smollm2", sync_timeout=5)
    try:
        with pytest.raises(
            WeightSyncError,
            match=rf"vLLM server {url}: reload_weights failed: POST /collective_rpc is 404; "
            r"start the server with VLLM_SERVER_DEV_MODE=1",
        ):
            policy.update_weights({"model.norm.weight": torch.ones(576)})
    finally:
        policy.close()
        httpd.shutdown()
        httpd.server_close()


def test_a_server_spec_without_a_model_is_refused_naming_the_form():
    from pivot_envs.policy import PolicySpecError

    with pytest.raises(PolicySpecError, match=r"must be vllm-server:BASE_URL\[,BASE_URL\.\.\.\]#MODEL"):
        load_policy("vllm-server:http://127.0.0.1:8000")
