"""`pivotrl serve`'s own protocol: real uvicorn on 127.0.0.1 (in a thread), a real httpx client,
the real tool-use env; the rewards and infos the server returns are the local env's."""

from __future__ import annotations

import json
import re
import threading
import time

import gymnasium as gym
import httpx
import numpy as np
import pytest

import pivot_envs
from pivot_envs.env import PivotEnv
from pivot_envs.errors import PivotEnvsError
from pivot_envs.pivot import Pivot
from pivot_envs.serve.config import ServeConfig, is_loopback, parse_env_args
from pivot_envs.serve.server import start_server

gym.register_envs(pivot_envs)
ENV = "pivot/tool-use-v0"
PIVOT = "tau-airline/task1/trial1/t0"


@pytest.fixture(scope="module")
def server():
    running = start_server(ServeConfig(env=ENV, port=0, max_sessions=8, queue_timeout=1.0, max_batch=8))
    yield running
    running.stop()


OPENED: list[str] = []  # sessions the test opened, closed after it (the module's server has 8 envs)


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as made:
        yield made
        while OPENED:
            made.delete(f"/v1/sessions/{OPENED.pop()}")


@pytest.fixture(scope="module")
def local():
    env = gym.make(ENV).unwrapped
    yield env
    env.close()


def expert_of(local, pivot_id: str) -> dict:
    return local.pivots[local._by_id[pivot_id]].expert


def local_step(local, pivot_id: str, action) -> tuple:
    local.reset(options={"pivot": pivot_id})
    observation, reward, terminated, truncated, info = local.step(action)
    return json.loads(json.dumps(observation)), reward, terminated, truncated, info


def open_session(client, **body) -> dict:
    answer = client.post("/v1/sessions", json=body)
    assert answer.status_code == 200, answer.text
    OPENED.append(answer.json()["session"])
    return answer.json()


# -- sessions, steps, batches --------------------------------------------------------------------


def test_a_session_opens_at_the_pivot_asked_for_and_its_step_is_the_local_envs(client, local):
    created = open_session(client, pivot=PIVOT, index=None, seed=None)
    local_observation, local_info = local.reset(options={"pivot": PIVOT})
    assert created["info"] == local_info and created["observation"] == json.loads(
        json.dumps(local_observation)
    )
    for action in (expert_of(local, PIVOT), "I cannot help with that."):
        if action != expert_of(local, PIVOT):
            client.post(f"/v1/sessions/{created['session']}/reset", json={"pivot": PIVOT}).raise_for_status()
        answer = client.post(f"/v1/sessions/{created['session']}/step", json={"action": action})
        assert answer.status_code == 200, answer.text
        result = answer.json()
        observation, reward, terminated, truncated, info = local_step(local, PIVOT, action)
        assert (result["reward"], result["terminated"], result["truncated"]) == (
            reward,
            terminated,
            truncated,
        )
        assert result["observation"] == observation
        assert result["info"] == json.loads(json.dumps(info))
    assert result["reward"] == 0.0 and result["info"]["category"] == "message_content_different"


def test_a_reset_answer_carries_the_pivot_record_unless_the_client_says_it_holds_it(client, local):
    created = open_session(client, pivot=PIVOT)
    assert Pivot.from_dict(created["pivot"]) == local.pivots[local._by_id[PIVOT]]
    again = client.post(f"/v1/sessions/{created['session']}/reset", json={"pivot": PIVOT, "record": False})
    assert again.status_code == 200, again.text
    assert "pivot" not in again.json() and again.json()["info"]["pivot_id"] == PIVOT


def test_a_step_info_always_carries_category_valid_strict_reward_and_detail(client):
    session = open_session(client, pivot=PIVOT)["session"]
    info = client.post(f"/v1/sessions/{session}/step", json={"action": {"content": 7}}).json()["info"]
    assert {"category", "valid", "strict_reward", "detail"} <= set(info)
    assert (info["category"], info["valid"], info["strict_reward"]) == ("unparseable", True, 0.0)
    assert "content must be text" in info["detail"]


def test_a_batch_scores_each_action_from_the_same_pivot_state_as_a_group(client, local):
    session = open_session(client, pivot=PIVOT)["session"]
    expert = expert_of(local, PIVOT)
    actions = [expert, "Let me check.", expert, {"role": "assistant", "content": "Goodbye"}]
    answer = client.post(f"/v1/sessions/{session}/steps", json={"actions": actions})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert (
        [r["reward"] for r in results]
        == [local_step(local, PIVOT, a)[1] for a in actions]
        == [1.0, 0.0, 1.0, 0.0]
    )
    prefix = len(local.pivots[local._by_id[PIVOT]].messages)
    assert all(
        r["observation"]["messages"][:prefix] == results[0]["observation"]["messages"][:prefix]
        for r in results
    )
    # a second batch on the same session starts from the pivot again
    again = client.post(f"/v1/sessions/{session}/steps", json={"actions": [expert]}).json()["results"]
    assert again[0]["reward"] == 1.0


def test_a_second_step_needs_a_reset_and_the_reset_starts_a_new_episode(client, local):
    session = open_session(client, index=3)["session"]
    pivot_id = local.pivots[3].id
    assert client.post(f"/v1/sessions/{session}/step", json={"action": "hi"}).status_code == 200
    refused = client.post(f"/v1/sessions/{session}/step", json={"action": "hi"})
    assert (
        refused.status_code == 409
        and session in refused.json()["detail"]
        and "reset" in refused.json()["detail"]
    )
    reset = client.post(f"/v1/sessions/{session}/reset", json={"pivot": pivot_id})
    assert reset.status_code == 200 and reset.json()["info"] == {"pivot_id": pivot_id, "index": 3}
    stepped = client.post(f"/v1/sessions/{session}/step", json={"action": expert_of(local, pivot_id)})
    assert stepped.json()["reward"] == 1.0


def test_sessions_opened_with_the_same_seed_start_at_the_same_pivot(client):
    first = open_session(client, seed=123)["info"]["pivot_id"]
    assert open_session(client, seed=123)["info"]["pivot_id"] == first
    drawn = {open_session(client, seed=seed)["info"]["pivot_id"] for seed in range(6)}
    assert len(drawn) > 1


def test_a_deleted_session_is_gone_and_an_unknown_one_is_a_404_naming_it(client):
    session = open_session(client)["session"]
    assert client.delete(f"/v1/sessions/{session}").status_code == 204
    for method, path, body in (
        ("POST", "step", {"action": "hi"}),
        ("POST", "steps", {"actions": ["hi"]}),
        ("POST", "reset", {}),
        ("DELETE", "", None),
    ):
        answer = client.request(method, f"/v1/sessions/{session}/{path}".rstrip("/"), json=body)
        assert answer.status_code == 404, (path, answer.text)
        assert session in answer.json()["detail"]


@pytest.mark.parametrize(
    ("path", "body", "named"),
    [
        ("step", {}, "action: Field required"),
        (
            "step",
            {"action": 5},
            "action: Value error, must be completion text or an assistant message object, got int",
        ),
        ("step", {"action": "hi", "actoin": "x"}, "actoin: Extra inputs are not permitted"),
        ("steps", {"actions": "hi"}, "actions: Input should be a valid array"),
        ("steps", {"actions": ["hi", None]}, "action 1 must be completion text"),
        ("reset", {"pivot": PIVOT, "index": 2}, "give at most one of 'pivot' and 'index'"),
        (
            "reset",
            {"pivot": "tau-airline/task1/trial1/t99"},
            "pivot: unknown pivot id 'tau-airline/task1/trial1/t99'",
        ),
        ("reset", {"index": 10**6}, "index: 1000000 is out of range"),
        ("reset", {"seed": "x"}, "seed: Input should be a valid integer"),
        ("reset", b"{seed", "body: Invalid JSON"),
    ],
)
def test_a_bad_body_is_a_422_naming_the_field(client, path, body, named):
    session = open_session(client)["session"]
    sent = {"content": body} if isinstance(body, bytes) else {"json": body}
    answer = client.post(f"/v1/sessions/{session}/{path}", **sent)
    assert answer.status_code == 422 and named in answer.json()["detail"], answer.text


def test_an_unknown_pivot_on_create_says_which_id_was_meant(client):
    answer = client.post("/v1/sessions", json={"pivot": "tau-airline/task1/trial1/t"})
    assert answer.status_code == 422 and "did you mean 'tau-airline/task1/trial1/t" in answer.json()["detail"]


def test_a_batch_over_the_limit_is_a_413_naming_the_limit(client):
    session = open_session(client)["session"]
    answer = client.post(f"/v1/sessions/{session}/steps", json={"actions": ["hi"] * 9})
    assert (
        answer.status_code == 413
        and "9 actions" in answer.json()["detail"]
        and "at most 8" in answer.json()["detail"]
    )


def test_info_names_the_env_its_pivots_and_limits(client, local):
    info = client.get("/v1/info").json()
    assert info == {
        "env_id": ENV,
        "pivots": [pivot.id for pivot in local.pivots],
        "domain": "tool-use",
        "max_sessions": 8,
        "version": pivot_envs.cli.version(),
    }


def test_metrics_count_sessions_requests_and_steps(client):
    def value(text: str, name: str) -> float:
        match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
        return float(match.group(1)) if match else 0.0

    before = client.get("/metrics").text
    session = open_session(client, pivot=PIVOT)["session"]
    client.post(f"/v1/sessions/{session}/steps", json={"actions": ["a", "b", "c"]}).raise_for_status()
    client.post(f"/v1/sessions/{session}/step", json={"action": "again"})  # 409: the episode ended
    after = client.get("/metrics").text
    step_route = (
        'pivot_serve_requests_total{method="POST",route="/v1/sessions/{session_id}/step",status="409"}'
    )
    create_route = 'pivot_serve_requests_total{method="POST",route="/v1/sessions",status="200"}'
    assert value(after, step_route) == value(before, step_route) + 1
    assert value(after, create_route) == value(before, create_route) + 1
    assert (
        value(after, "pivot_serve_step_seconds_count") == value(before, "pivot_serve_step_seconds_count") + 3
    )
    assert value(after, "pivot_serve_sessions_open") == value(before, "pivot_serve_sessions_open") + 1
    assert value(after, "pivot_serve_max_sessions") == 8
    assert 'pivot_serve_step_latency_seconds{quantile="0.99"}' in after
    assert 'pivot_serve_step_seconds_bucket{le="+Inf"}' in after
    assert client.get("/health").json()["status"] == "ok"


# -- the queue, the TTL, a failing env -------------------------------------------------------------


def test_with_one_env_a_second_create_waits_in_the_queue_then_gets_503_with_retry_after():
    with start_server(ServeConfig(env=ENV, port=0, max_sessions=1, queue_timeout=0.5)) as running:
        with httpx.Client(base_url=running.url, timeout=30) as client:
            first = open_session(client)["session"]
            started = time.monotonic()
            refused = client.post("/v1/sessions", json={})
            waited = time.monotonic() - started
            assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
            assert "all 1 envs are busy" in refused.json()["detail"] and 0.45 <= waited < 5
            assert "pivot_serve_queue_timeouts_total 1" in client.get("/metrics").text
            # a create that waits while the first session closes gets its env
            answers = []
            waiter = threading.Thread(target=lambda: answers.append(client.post("/v1/sessions", json={})))
            waiter.start()
            time.sleep(0.1)
            assert client.delete(f"/v1/sessions/{first}").status_code == 204
            waiter.join()
            assert answers[0].status_code == 200
            assert client.get("/health").json()["envs_alive"] == 1


def test_a_session_unused_for_longer_than_the_ttl_is_closed():
    with start_server(ServeConfig(env=ENV, port=0, max_sessions=1, session_ttl=0.2)) as running:
        with httpx.Client(base_url=running.url, timeout=30) as client:
            session = open_session(client)["session"]
            time.sleep(1.0)
            answer = client.post(f"/v1/sessions/{session}/step", json={"action": "hi"})
            assert answer.status_code == 404 and session in answer.json()["detail"]
            assert open_session(client)["session"] != session  # its env came back to the pool


class RaisingEnv(PivotEnv):
    """A pivot env whose step raises on the action "raise" (an env bug the server must survive)."""

    domain = "raising"

    def default_pivots(self) -> list[Pivot]:
        return [
            Pivot(
                id="p",
                domain="raising",
                messages=[{"role": "user", "content": "hi"}],
                expert={"role": "assistant", "content": "ok"},
            )
        ]

    def reset(self, *, seed=None, options=None):
        if seed == 666:
            raise RuntimeError("the restore broke")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if action == "raise":
            raise RuntimeError("the env broke")
        if action == "slow":
            time.sleep(1.5)
        observation, reward, terminated, truncated, info = super().step(action)
        if action == "odd info":  # values JSON cannot hold, as a domain's info might carry
            info.update(score=np.float32(0.5), tags={"x"}, text="lone \ud800 surrogate", blob=object())
        return observation, reward, terminated, truncated, info


@pytest.fixture(scope="module")
def raising():
    gym.register("test-serve/raising-v0", entry_point=RaisingEnv)
    with start_server(ServeConfig(env="test-serve/raising-v0", port=0, max_sessions=1)) as running:
        with httpx.Client(base_url=running.url, timeout=30) as client:
            yield client


def test_info_values_json_cannot_hold_come_back_as_plain_json(raising):
    session = open_session(raising)["session"]
    info = raising.post(f"/v1/sessions/{session}/step", json={"action": "odd info"}).json()["info"]
    assert (info["score"], info["tags"], info["text"]) == (0.5, ["x"], "lone \ufffd surrogate")
    assert info["blob"].startswith("<object object at")
    raising.delete(f"/v1/sessions/{session}")


def test_an_exception_inside_env_step_is_a_500_naming_the_session_and_the_server_keeps_serving(raising):
    session = open_session(raising)["session"]
    failed = raising.post(f"/v1/sessions/{session}/step", json={"action": "raise"})
    assert failed.status_code == 500
    assert session in failed.json()["detail"] and "RuntimeError: the env broke" in failed.json()["detail"]
    raising.post(f"/v1/sessions/{session}/reset", json={}).raise_for_status()
    assert raising.post(f"/v1/sessions/{session}/step", json={"action": "ok"}).json()["reward"] == 1.0
    raising.delete(f"/v1/sessions/{session}")


def test_a_slow_step_blocks_neither_health_nor_other_requests(raising):
    session = open_session(raising)["session"]
    answers = []
    stepping = threading.Thread(
        target=lambda: answers.append(raising.post(f"/v1/sessions/{session}/step", json={"action": "slow"}))
    )
    stepping.start()
    time.sleep(0.3)
    started = time.monotonic()
    assert raising.get("/health").json()["sessions"] == 1
    assert raising.get("/v1/info").status_code == 200
    assert time.monotonic() - started < 0.5  # answered while the step still runs in its thread
    stepping.join()
    assert answers[0].json()["reward"] == 0.0
    raising.delete(f"/v1/sessions/{session}")


def test_a_reset_that_raises_is_a_500_that_closes_the_session_and_frees_its_env(raising):
    for _ in range(2):  # twice with one env: the first failure gave its slot back
        session = open_session(raising)["session"]
        failed = raising.post(f"/v1/sessions/{session}/reset", json={"seed": 666})
        assert failed.status_code == 500, failed.text
        assert (
            session in failed.json()["detail"]
            and "RuntimeError: the restore broke" in failed.json()["detail"]
        )
        assert raising.post(f"/v1/sessions/{session}/step", json={"action": "ok"}).status_code == 404
    refused = raising.post("/v1/sessions", json={"seed": 666})
    assert refused.status_code == 500 and "the session is closed" in refused.json()["detail"]
    assert raising.get("/health").json() == {
        "status": "ok",
        "env_id": "test-serve/raising-v0",
        "sessions": 0,
        "envs_alive": 0,
        "queue": 0,
    }


# -- the token -------------------------------------------------------------------------------------


def test_with_a_token_everything_but_health_needs_it():
    with start_server(ServeConfig(env=ENV, port=0, max_sessions=1, token="s3cret")) as running:
        with httpx.Client(base_url=running.url, timeout=30) as client:
            assert client.get("/health").status_code == 200
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
                for method, path in (
                    ("GET", "/v1/info"),
                    ("POST", "/v1/sessions"),
                    ("GET", "/metrics"),
                    ("POST", "/verify"),
                ):
                    answer = client.request(method, path, headers=headers)
                    assert answer.status_code == 401, (path, headers)
                    assert answer.headers["WWW-Authenticate"] == "Bearer"
            good = {"Authorization": "Bearer s3cret"}
            assert client.get("/v1/info", headers=good).status_code == 200
            assert client.post("/v1/sessions", json={}, headers=good).status_code == 200


def test_the_server_refuses_to_listen_beyond_loopback_without_a_token(monkeypatch):
    monkeypatch.delenv("PIVOT_ENVS_SERVE_TOKEN", raising=False)
    with pytest.raises(PivotEnvsError, match="'0.0.0.0' is not a loopback address.*--token"):
        start_server(ServeConfig(env=ENV, host="0.0.0.0", port=0))
    ServeConfig(env=ENV, host="0.0.0.0", token="t").check_exposure()
    monkeypatch.setenv("PIVOT_ENVS_SERVE_TOKEN", "from-the-environment")
    ServeConfig(env=ENV, host="0.0.0.0").check_exposure()
    assert [is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost")] == [True] * 5
    assert [is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "example.com", "")] == [False] * 5


def test_env_args_read_json_values_and_keep_other_text():
    assert parse_env_args(["sandbox=bwrap", "warm_pool=0", 'limits={"timeout": 5}', "verifier=strict"]) == {
        "sandbox": "bwrap",
        "warm_pool": 0,
        "limits": {"timeout": 5},
        "verifier": "strict",
    }
    with pytest.raises(PivotEnvsError, match="--env-arg 'sandbox': must be KEY=VALUE"):
        parse_env_args(["sandbox"])
