"""pivot/search-v0 as a domain like the others: the env contract (check_env, check_pivot_env with a
broken engine), make_vec, a JSON spec, the HTTP engine, and `pivotrl profile` / `pivotrl eval`
against a real OpenAI-compatible server on 127.0.0.1, and `pivotrl run --domain search` with the
embedded model on the smallest settings.

The server's "model" is scripted (a language model would take minutes here): at each pivot it
rewrites the expert's step in a form only the functional verifier accepts (a search query in
lower case, the answer as "the <ANSWER>."), and for every odd sample of a group answers "I do not
know". Everything between the HTTP request and the verdict is the library's real path.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from pathlib import Path

import gymnasium as gym
import pytest
from chat_completions_stub import ChatCompletionsStub
from gymnasium.envs.registration import EnvSpec
from gymnasium.utils.env_checker import check_env
from scripted_cli import eval_scripted, profile_scripted

from pivot_envs import PivotEnv, check_pivot_env
from pivot_envs.chat import calls_of, text_of
from pivot_envs.cli import main
from pivot_envs.domains.search.engine import open_engine
from pivot_envs.domains.search.env import bundled_pivots
from pivot_envs.domains.search.http_engine import HttpEngine, serve_engine
from pivot_envs.domains.search.verifier import turn_kind
from pivot_envs.pivot import Pivot, read_pivots, write_pivots


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def break_engine(env: PivotEnv) -> bool | None:
    """Point the env's engine at a port nothing listens on; an answer runs no call, so nothing breaks."""
    if not env.pivot.expert.get("tool_calls"):
        return False
    env.engine = HttpEngine(f"http://127.0.0.1:{free_port()}/search", retries=0, timeout_s=2)
    return None


def test_the_bundled_env_passes_check_env_and_check_pivot_env_with_a_broken_engine():
    env = gym.make("pivot/search-v0")
    try:
        check_env(env.unwrapped, skip_render_check=True)
        report = check_pivot_env(env, pivots=5, break_infrastructure=break_engine)
    finally:
        env.close()
    assert report.ok and {
        "gymnasium_check_env",
        "infrastructure_failure_invalid",
        "expert_scores_one",
    } <= set(report.passed), report


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_make_vec_scores_experts_one_and_junk_zero(search_pivots, mode):
    experts = {pivot.id: pivot.expert for pivot in search_pivots}
    envs = gym.make_vec("pivot/search-v0", num_envs=2, vectorization_mode=mode, pivots=search_pivots)
    try:
        _, infos = envs.reset(seed=7)
        _, rewards, terminated, _, infos = envs.step([experts[infos["pivot_id"][0]], "Answer: Parma"])
        scored = infos["final_info"]
        assert list(rewards) == [1.0, 0.0] and all(terminated), scored["category"]
        assert all(scored["valid"]) and set(scored["replay"]) == {"executed"}
    finally:
        envs.close()


def test_the_env_spec_round_trips_through_json(search_pivots, tmp_path):
    path = tmp_path / "pivots.jsonl"
    write_pivots(search_pivots, path)
    env = gym.make("pivot/search-v0", pivots=str(path), verifier="args", k=3, limits={"max_calls": 2})
    rebuilt = gym.make(EnvSpec.from_json(env.spec.to_json()))
    try:
        base = rebuilt.unwrapped
        assert (base.verifier.name, base.k, base.limits.max_calls) == ("args", 3, 2)
        assert [p.id for p in base.pivots] == [p.id for p in search_pivots]
    finally:
        env.close()
        rebuilt.close()


def test_the_env_runs_on_the_http_engine_and_a_dead_endpoint_makes_steps_invalid(search_pivots):
    server = serve_engine(open_engine("bundled"), port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    env = gym.make(
        "pivot/search-v0", pivots=search_pivots, engine={"engine": "http", "url": url, "retries": 0}
    )
    try:
        for pivot in search_pivots:  # the same corpus behind HTTP: every prefix replays exactly
            _, info = env.reset(options={"pivot": pivot.id})
            assert info["replay"] == "executed"
            assert env.step(pivot.expert)[1] == 1.0
        env.reset(options={"pivot": "verdi/t0"})
        server.shutdown()
        server.server_close()
        _, reward, *_, info = env.step(search_pivots[0].expert)
        assert (reward, info["valid"], info["category"]) == (0.0, False, "infrastructure_error")
        assert url in info["detail"]
    finally:
        env.close()


# -- pivotrl profile and eval against a scripted OpenAI-compatible server ----------------------------


def rewritten(expert: dict, pivot: Pivot) -> dict:
    """The expert's step in a form only the functional verifier accepts."""
    if not expert.get("tool_calls"):
        return {"role": "assistant", "content": f"Answer: the {pivot.context['task']['answer'].upper()}."}
    calls = []
    for index, (name, arguments) in enumerate(calls_of(expert)):
        if "query" in arguments:
            arguments = {**arguments, "query": arguments["query"].lower()}
        calls.append(
            {
                "id": f"call_{index}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        )
    return {"role": "assistant", "content": None, "tool_calls": calls}


def question_and_length(messages: list[dict]) -> tuple[str, int]:
    """A pivot by its question and the length of its prefix."""
    question = next(text_of(m) for m in messages if m["role"] == "user")
    return question, len(messages)


@pytest.fixture
def scripted(search_pivots):
    """The chat server's "model": sample j is the rewritten expert step (j even) or "I do not know"."""
    steps = {question_and_length(pivot.messages): rewritten(pivot.expert, pivot) for pivot in search_pivots}
    wrong = {"role": "assistant", "content": "I do not know."}
    server = ChatCompletionsStub(
        lambda body, j: steps[question_and_length(body["messages"])] if j % 2 == 0 else wrong
    )
    yield server
    server.close()


def test_pivotrl_profile_scores_every_sample_through_the_search_env(scripted, search_pivots, tmp_path: Path):
    # A get_document step is not rewritten: only there does the strict verifier agree.
    profile_scripted(scripted, search_pivots, tmp_path, lambda pivot: turn_kind(pivot.expert) == "open")


def test_pivotrl_eval_reports_the_search_domains_accuracy(scripted, search_pivots, tmp_path: Path, capsys):
    rows = eval_scripted(scripted, search_pivots, tmp_path)
    assert "search" in capsys.readouterr().out
    search = rows[("search", "greedy")]
    assert search["pivots"] == len(search_pivots) and search["invalid"] == 0
    opens = sum(1 for pivot in search_pivots if turn_kind(pivot.expert) == "open")
    assert search["functional"]["mean"] == 1.0 and search["strict"]["mean"] == opens / len(search_pivots) < 1


@pytest.mark.slow
def test_pivotrl_run_goes_end_to_end_on_the_bundled_search_pivots(tmp_path: Path, capsys):
    """The whole method on CPU with the embedded model at its smallest (about 3 CPU-minutes): the
    plumbing, not learning (8 new tokens cannot write a tool call)."""
    out = tmp_path / "run"
    flags = (
        "--candidates 2 --profile.k 2 --eval-pivots 1 --train.steps 1 --train.batch-pivots 1"
        " --train.group-size 2 --max-new-tokens 8 --max-prompt-tokens 384 --sft-epochs 0"
    )
    assert main(["run", "--domain", "search", "--out", str(out), *flags.split()]) == 0
    printed = capsys.readouterr().out
    assert all(f"[{stage}/6]" in printed for stage in range(1, 7))
    figures = json.loads((out / "report.json").read_text())
    assert (figures["extracted"], figures["profiled"]) == (len(bundled_pivots()), 2)
    for pivot in read_pivots(out / "profiled.jsonl"):
        assert pivot.domain == "search" and len(pivot.profile.rewards) == 2 and all(pivot.profile.valid)
        assert "env_error" not in pivot.profile.categories
    # The held-out accuracy row, before and after training.
    assert len(re.findall(r"^search +greedy +1 ", (out / "report.md").read_text(), re.M)) == 2
