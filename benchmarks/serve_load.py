"""Serve load: `pivotrl serve` under N concurrent clients for T seconds against 1 and 2 servers
(loopback only, bounded), the tool-use env at its bundled pivots with each pivot's expert turn.

    .venv/bin/python benchmarks/serve_load.py [--seconds 8] [--clients 1,8,32] [--servers 1,2]

1. In-process baseline: `gym.make("pivot/tool-use-v0")` reset + step at every bundled pivot,
   one thread: wall-clock p50/p99 and CPU per action.
2. Overhead: one client, one server, one action at a time: round trip of reset + step (two
   requests) and of a batch of 8 (`/steps`, one request), against the in-process time; and the
   server's CPU per action (its process's CPU time over the actions it served) against the
   in-process CPU per action: the server-side overhead per step (target <= 5 ms).
3. Load: for each server count and client count, the clients spread round-robin over the
   servers, each a session looping reset + step for T seconds: actions/s, p50/p99 latency per
   action, errors, and lost or doubled actions (the actions the clients were answered for
   against the steps the servers' /metrics counted; target 0). Servers are `pivotrl serve`
   subprocesses on 127.0.0.1, so two servers can use two cores. The clients are threads of this
   process, each with its own keep-alive connection through stdlib http.client, which costs
   little CPU per request (httpx's async pool cost ~28 ms of client CPU per action at 32
   connections on the loaded VM and made the client the bottleneck); the table says how much
   CPU each side used.

Prints a table, writes benchmarks/out/serve_load.json.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
from percentiles import machine, percentile, print_table, write_results

import pivot_envs

OUT = Path(__file__).resolve().parent / "out" / "serve_load.json"
ENV = "pivot/tool-use-v0"
BATCH = 8
TICKS = os.sysconf("SC_CLK_TCK")


def latency(seconds: list[float]) -> dict:
    """n, p50 and p99 in ms."""
    return {
        "n": len(seconds),
        "p50_ms": 1000 * statistics.median(seconds),
        "p99_ms": 1000 * percentile(seconds, 0.99),
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def jobs() -> list[tuple[str, dict]]:
    """(pivot id, expert turn) at every bundled tool-use pivot."""
    env = gym.make(ENV).unwrapped
    return [(pivot.id, pivot.expert) for pivot in env.pivots]


def in_process(work: list[tuple[str, dict]], passes: int = 3) -> dict:
    """Reset + step at each pivot in this process (after one warm pass): wall-clock and CPU per action."""
    env = gym.make(ENV)
    for pivot_id, action in work:  # warm: parsers, backends and caches as a running server has them
        env.reset(options={"pivot": pivot_id})
        env.step(action)
    seconds, cpu_started = [], time.process_time()
    for _ in range(passes):
        for pivot_id, action in work:
            started = time.perf_counter()
            env.reset(options={"pivot": pivot_id})
            env.step(action)
            seconds.append(time.perf_counter() - started)
    cpu = (time.process_time() - cpu_started) / len(seconds)
    env.close()
    return {**latency(seconds), "cpu_ms_per_action": 1000 * cpu}


class Server:
    """A `pivotrl serve` subprocess on a free loopback port."""

    def __init__(self, max_sessions: int) -> None:
        pivotrl = Path(sys.executable).with_name("pivotrl")
        command = [
            str(pivotrl),
            "serve",
            "--env",
            ENV,
            "--port",
            "0",
            "--max-sessions",
            str(max_sessions),
            "-q",
        ]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, text=True, env={**os.environ, "PIVOT_ENVS_SERVE_TOKEN": ""}
        )
        line = self.process.stdout.readline()
        match = re.search(r"listening on (http://\S+)", line)
        if not match:
            self.process.kill()
            raise RuntimeError(f"pivotrl serve did not start: {line!r}")
        self.url = match.group(1)

    def steps_counted(self) -> int:
        connection = Connection(self.url)
        connection.http.request("GET", "/metrics")
        text = connection.http.getresponse().read().decode()
        connection.close()
        return int(re.search(r"^pivot_serve_step_seconds_count (\d+)$", text, re.MULTILINE).group(1))

    def cpu(self) -> float:
        return cpu_seconds(self.process.pid)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


class Connection:
    """One keep-alive HTTP/1.1 connection (stdlib http.client: a client that costs little CPU per
    request, so the servers, not the client, are what the load measures)."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.http = http.client.HTTPConnection(host, int(port), timeout=60)

    def call(self, method: str, path: str, body: object = None) -> tuple[int, dict | None]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        self.http.request(method, path, body=data, headers=headers)
        response = self.http.getresponse()
        content = response.read()
        return response.status, json.loads(content) if content else None

    def close(self) -> None:
        self.http.close()


def overhead(server: Server, work: list[tuple[str, dict]], passes: int = 2) -> dict:
    """One client, one action (or one batch) at a time: round-trip latency and server CPU per action."""
    client = Connection(server.url)
    session = client.call("POST", "/v1/sessions", {})[1]["session"]
    for pivot_id, action in work:  # warm
        client.call("POST", f"/v1/sessions/{session}/reset", {"pivot": pivot_id})
        client.call("POST", f"/v1/sessions/{session}/step", {"action": action})
    single, cpu_before, steps_before = [], server.cpu(), server.steps_counted()
    for _ in range(passes):
        for pivot_id, action in work:
            started = time.perf_counter()
            assert client.call("POST", f"/v1/sessions/{session}/reset", {"pivot": pivot_id})[0] == 200
            assert client.call("POST", f"/v1/sessions/{session}/step", {"action": action})[0] == 200
            single.append(time.perf_counter() - started)
    single_cpu = (server.cpu() - cpu_before) / (server.steps_counted() - steps_before)
    batched, cpu_before, steps_before = [], server.cpu(), server.steps_counted()
    for pivot_id, action in work:
        started = time.perf_counter()
        client.call("POST", f"/v1/sessions/{session}/reset", {"pivot": pivot_id})
        status, _ = client.call("POST", f"/v1/sessions/{session}/steps", {"actions": [action] * BATCH})
        assert status == 200
        batched.append((time.perf_counter() - started) / BATCH)
    batch_cpu = (server.cpu() - cpu_before) / (server.steps_counted() - steps_before)
    client.call("DELETE", f"/v1/sessions/{session}")
    client.close()
    return {
        "reset_step": {**latency(single), "server_cpu_ms_per_action": 1000 * single_cpu},
        f"steps_batch_{BATCH}": {**latency(batched), "server_cpu_ms_per_action": 1000 * batch_cpu},
    }


def load(servers: list[Server], clients: int, seconds: float, work: list[tuple[str, dict]]) -> dict:
    """`clients` sessions (a thread and a connection each) looping reset + step for `seconds`,
    spread round-robin over `servers`."""
    before = [server.steps_counted() for server in servers]
    cpu_before = [server.cpu() for server in servers]
    own_cpu = time.process_time()
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []

    def client_loop(number: int, deadline: float) -> None:
        connection = Connection(servers[number % len(servers)].url)
        session = connection.call("POST", "/v1/sessions", {})[1]["session"]
        position = number
        while time.perf_counter() < deadline:
            pivot_id, action = work[position % len(work)]
            position += clients
            started = time.perf_counter()
            try:
                reset, _ = connection.call("POST", f"/v1/sessions/{session}/reset", {"pivot": pivot_id})
                step, answer = connection.call("POST", f"/v1/sessions/{session}/step", {"action": action})
            except (OSError, http.client.HTTPException) as error:
                errors.append(f"{type(error).__name__}: {error}")
                connection.close()
                connection = Connection(servers[number % len(servers)].url)
                continue
            if reset != 200 or step != 200:
                errors.append(f"{reset}/{step}: {str(answer)[:200]}")
                continue
            latencies[number].append(time.perf_counter() - started)
        connection.call("DELETE", f"/v1/sessions/{session}")
        connection.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=client_loop, args=(n, started + seconds)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    answered = [value for own in latencies for value in own]
    counted = sum(server.steps_counted() - was for server, was in zip(servers, before))
    return {
        "servers": len(servers),
        "clients": clients,
        "seconds": elapsed,
        "actions": len(answered),
        "actions_per_s": len(answered) / elapsed,
        **latency(answered or [0.0]),
        "errors": len(errors),
        "first_errors": errors[:3],
        "server_steps_counted": counted,
        "lost_or_doubled": counted - len(answered),
        "server_cpu_s": sum(server.cpu() - was for server, was in zip(servers, cpu_before)),
        "client_cpu_s": time.process_time() - own_cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each load run")
    parser.add_argument("--clients", default="1,8,32", help="client counts, comma-separated")
    parser.add_argument("--servers", default="1,2", help="server counts, comma-separated")
    args = parser.parse_args()
    client_counts = [int(n) for n in args.clients.split(",")]
    server_counts = [int(n) for n in args.servers.split(",")]
    gym.register_envs(pivot_envs)
    sys.setswitchinterval(0.0005)  # the client threads too, as the servers do (pivot_envs.serve.server)
    work = jobs()
    results: dict = {
        "machine": {**machine(), "python": platform.python_version()},
        "env": ENV,
        "pivots": len(work),
        "in_process": in_process(work),
    }
    servers = [Server(max_sessions=max(client_counts)) for _ in range(max(server_counts))]
    try:
        results["overhead"] = overhead(servers[0], work)
        results["load"] = [
            load(servers[:count], clients, args.seconds, work)
            for count in server_counts
            for clients in client_counts
        ]
    finally:
        for server in servers:
            server.stop()
    results["machine"]["load_after"] = os.getloadavg()
    report(results)
    write_results(results, OUT)


def report(results: dict) -> None:
    base, over = results["in_process"], results["overhead"]
    print(f"in-process reset+step: p50 {base['p50_ms']:.3f} ms, p99 {base['p99_ms']:.3f} ms, "
          f"CPU {base['cpu_ms_per_action']:.3f} ms per action ({base['n']} actions)")  # fmt: skip
    for name, r in over.items():
        added = r["server_cpu_ms_per_action"] - base["cpu_ms_per_action"]
        print(f"one client, {name}: round trip p50 {r['p50_ms']:.3f} ms (+{r['p50_ms'] - base['p50_ms']:.3f} "
              f"over in-process), p99 {r['p99_ms']:.3f} ms; server CPU {r['server_cpu_ms_per_action']:.3f} ms "
              f"per action, +{added:.3f} ms over in-process (target <= 5)")  # fmt: skip
    rows = [("servers", "clients", "actions/s", "p50 ms", "p99 ms", "errors", "lost/doubled",
             "server CPU s", "client CPU s", "seconds")]  # fmt: skip
    for r in results["load"]:
        rows.append((str(r["servers"]), str(r["clients"]), f"{r['actions_per_s']:.0f}", f"{r['p50_ms']:.2f}",
                     f"{r['p99_ms']:.2f}", str(r["errors"]), str(r["lost_or_doubled"]),
                     f"{r['server_cpu_s']:.1f}", f"{r['client_cpu_s']:.1f}", f"{r['seconds']:.1f}"))  # fmt: skip
    print_table(rows)


if __name__ == "__main__":
    main()
