"""`pivotrl serve` hosting the sandboxed terminal env (bubblewrap): a fork bomb sent as an action
scores 0 or comes back invalid, and the server goes on serving the same and other sessions."""

from __future__ import annotations

import httpx
from sandbox_fixtures import has_bwrap, rootfs

from pivot_envs.serve.config import ServeConfig
from pivot_envs.serve.server import start_server

__all__ = ["has_bwrap", "rootfs"]  # the fixtures this module uses

PIVOT = "terminal/sed-config-port/t1"
EXPERT = "```bash\nsed -i 's/8080/9090/' server.conf\n```"
FORK_BOMB = "```bash\n:(){ :|:& };:\n```"


def test_a_fork_bomb_scores_zero_or_invalid_and_the_server_keeps_serving(has_bwrap):
    config = ServeConfig(
        env="pivot/terminal-v0",
        port=0,
        max_sessions=2,
        env_kwargs={"sandbox": "bwrap", "warm_pool": 0, "limits": {"timeout": 3.0}},
    )
    with start_server(config) as running, httpx.Client(base_url=running.url, timeout=120) as client:
        session = client.post("/v1/sessions", json={"pivot": PIVOT}).json()["session"]
        bombed = client.post(f"/v1/sessions/{session}/step", json={"action": FORK_BOMB})
        assert bombed.status_code == 200, bombed.text
        result = bombed.json()
        assert result["reward"] == 0.0 or result["info"]["valid"] is False, result["info"]
        # the same session, reset, scores the expert; the batch scores each action from the prefix state
        client.post(f"/v1/sessions/{session}/reset", json={"pivot": PIVOT}).raise_for_status()
        after = client.post(f"/v1/sessions/{session}/step", json={"action": EXPERT}).json()
        assert (after["reward"], after["info"]["valid"]) == (1.0, True)
        group = client.post(
            f"/v1/sessions/{session}/steps",
            json={"actions": [EXPERT, "```bash\nrm server.conf\n```", EXPERT]},
        )
        assert [r["reward"] for r in group.json()["results"]] == [1.0, 0.0, 1.0]
        other = client.post("/v1/sessions", json={"pivot": PIVOT}).json()["session"]
        assert client.post(f"/v1/sessions/{other}/step", json={"action": EXPERT}).json()["reward"] == 1.0
        assert client.get("/health").json()["status"] == "ok"
