"""`pivotrl serve` on the command line: a free port printed and served, a public host refused
without a token, and `import pivot_envs` (and the command's module) loading no web framework."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from pivot_envs.cli import main

ROOT = Path(__file__).resolve().parents[2]
PIVOTRL = Path(sys.executable).with_name("pivotrl")


def test_importing_pivot_envs_and_the_serve_command_loads_no_web_framework():
    code = (
        "import sys, pivot_envs, pivot_envs.serve, pivot_envs.serve.cli, pivot_envs.serve.config\n"
        "print(sorted(m for m in ('fastapi', 'uvicorn', 'starlette', 'httpx') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_serve_on_port_0_prints_the_url_it_listens_on_and_serves_there(shared_data):
    rows = shared_data / "nemo_gym" / "single_step_tool_use_pivots.jsonl"
    process = subprocess.Popen(
        [
            str(PIVOTRL),
            "serve",
            "--env",
            "pivot/tool-use-v0",
            "--port",
            "0",
            "--max-sessions",
            "1",
            "--env-arg",
            f"pivots={rows}",
            "--env-arg",
            "verifier=strict",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PIVOT_ENVS_SERVE_TOKEN": ""},
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("pivotrl serve: listening on http://127.0.0.1:"), (line, process.stderr.read())
        url = line.split()[4]
        with httpx.Client(base_url=url, timeout=30) as client:
            info = client.get("/v1/info").json()
            # the --env-arg pivots reached gym.make
            assert (info["max_sessions"], len(info["pivots"])) == (1, 5)
            session = client.post("/v1/sessions", json={"index": 0}).json()["session"]
            assert (
                client.post(f"/v1/sessions/{session}/step", json={"action": "Sure."}).json()["reward"] == 0.0
            )
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    # uvicorn shuts down cleanly, then passes the interrupt on: `pivotrl: interrupted`, status 130
    assert process.returncode == 130 and "Traceback" not in stderr, stderr


def test_serve_refuses_a_public_host_without_a_token_before_building_the_env(capsys, monkeypatch):
    monkeypatch.delenv("PIVOT_ENVS_SERVE_TOKEN", raising=False)
    assert main(["serve", "--env", "pivot/tool-use-v0", "--host", "0.0.0.0"]) == 2
    error = capsys.readouterr().err
    assert "pivotrl serve: error: ServeConfig.host = '0.0.0.0' is not a loopback address" in error
    assert "--token" in error


def test_serve_names_an_unknown_env_and_a_missing_one(capsys):
    assert main(["serve", "--env", "pivot/tool-usee-v0"]) == 1
    assert "unknown env id 'pivot/tool-usee-v0'; did you mean 'pivot/tool-use-v0'?" in capsys.readouterr().err
    assert main(["serve"]) == 2
    assert "--env is required" in capsys.readouterr().err
