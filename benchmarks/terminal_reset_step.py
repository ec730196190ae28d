"""Latency of reset + step at one terminal pivot with a 5-command prefix, G samples, per backend,
against the naive way (a fresh `docker run` plus a replay of the prefix for every sample).

    .venv/bin/python benchmarks/terminal_reset_step.py [--group 8] [--rounds 5] [--seconds 20]

Prints a table, writes benchmarks/out/terminal_reset_step.json. Targets: bubblewrap p50 <= 20 ms,
Docker p50 <= 100 ms, Docker >= 5x faster than naive. Also sustained samples/s with 2 workers.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import time
from pathlib import Path

from percentiles import machine, percentile, print_table, sandbox_kinds, warm_latencies, write_results

from pivot_envs.domains.terminal import TerminalEnv, canonical_message
from pivot_envs.pivot import Pivot

PREFIX = ["mkdir -p data", "cd data", "seq 1 1000 > nums.txt", "export LIMIT=500", "git init -q"]
SAMPLE = "```bash\nawk -v l=$LIMIT '$1 <= l' nums.txt | wc -l\n```"
EXPERT = "awk -v l=$LIMIT '$1 <= l' nums.txt | wc -l"
OUT = Path(__file__).resolve().parent / "out" / "terminal_reset_step.json"


def bench_pivot() -> Pivot:
    """A pivot whose prefix is 5 expert commands (files, cwd and an exported variable)."""
    messages: list[dict] = [{"role": "user", "content": "count the numbers up to LIMIT"}]
    for turn, command in enumerate(PREFIX):
        message = canonical_message(command)
        message["tool_calls"][0]["id"] = f"call_{turn}"
        messages += [message, {"role": "tool", "tool_call_id": f"call_{turn}", "content": "[exit code 0]"}]
    return Pivot(
        "bench/prefix5/t5",
        "terminal",
        messages,
        canonical_message(EXPERT),
        context={"workdir": "/app", "setup": ""},
    )


def bench_env(kind: str, group: int, rounds: int) -> dict:
    """reset + step latency of G samples per round, prefix built once (build time reported apart)."""
    env = TerminalEnv([bench_pivot()], sandbox=kind, warm_pool=group)
    start = time.perf_counter()
    env.reset(options={"index": 0})
    build = time.perf_counter() - start
    _, reward, _, _, info = env.step(SAMPLE)
    assert reward == 1.0 and info["output"]["output"] == "500\n", info
    # The warm pool: started containers, or bwrap sandboxes with their command server.
    latencies = warm_latencies(env, SAMPLE, group, rounds)
    builds = env.prefixes.builds
    env.close()
    return {
        "build_s": build,
        "builds": builds,
        "samples": len(latencies),
        "latencies_s": latencies,
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * percentile(latencies, 0.95),
    }


def bench_naive_docker(samples: int) -> dict:
    """Per sample: docker run of the base image, replay the 5 prefix commands, run the command, remove."""
    from pivot_envs.domains.terminal.image import image_tag
    from pivot_envs.sandboxes.docker_backend import DockerBackend

    backend = DockerBackend(warm_pool=0)
    latencies = []
    for _ in range(samples):
        start = time.perf_counter()
        sandbox = backend.create(image_tag(), "/app")
        for command in PREFIX:
            sandbox.run(command)
        result = sandbox.run(EXPERT, files=True)
        sandbox.container.remove(force=True)
        latencies.append(time.perf_counter() - start)
        assert result.output == "500\n", result
    backend.close()
    return {
        "samples": samples,
        "latencies_s": latencies,
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * percentile(latencies, 0.95),
    }


def bench_bwrap_floor(samples: int = 30) -> dict:
    """The floor under any bubblewrap sample: starting `bwrap --unshare-all ... true` on the root filesystem."""
    from pivot_envs.domains.terminal.image import rootfs_path
    from pivot_envs.sandboxes.bwrap_backend import BwrapBackend

    backend = BwrapBackend(rootfs_path(), warm_pool=0)
    sandbox = backend.create("/app")
    argv = [*backend._drop, *backend.argv(sandbox.directory, "/app", ["true"])]
    latencies = []
    for _ in range(samples):
        start = time.perf_counter()
        subprocess.run(argv, check=True)
        latencies.append(time.perf_counter() - start)
    backend.close()
    return {"p50_ms": 1000 * statistics.median(latencies), "p95_ms": 1000 * percentile(latencies, 0.95)}


def _worker(kind: str, seconds: float, queue) -> None:
    env = TerminalEnv([bench_pivot()], sandbox=kind, warm_pool=4)
    env.reset(options={"index": 0})
    env.step(SAMPLE)
    count, deadline = 0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        env.reset(options={"index": 0})
        reward = env.step(SAMPLE)[1]
        count += reward == 1.0
    env.close()
    queue.put(count)


def bench_throughput(kind: str, seconds: float, workers: int = 2) -> float:
    """Sustained correct samples per second with `workers` processes, each with its own env."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_worker, args=(kind, seconds, queue)) for _ in range(workers)]
    for process in processes:
        process.start()
    total = sum(queue.get(timeout=seconds + 300) for _ in processes)
    for process in processes:
        process.join()
    return total / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", type=int, default=8, help="samples per pivot (G)")
    parser.add_argument("--rounds", type=int, default=5, help="groups measured per backend")
    parser.add_argument("--seconds", type=float, default=20.0, help="duration of the 2-worker throughput run")
    parser.add_argument("--naive-samples", type=int, default=8)
    args = parser.parse_args()

    results: dict = {
        "group": args.group,
        "rounds": args.rounds,
        "prefix_commands": len(PREFIX),
        "machine": machine(),
    }
    kinds = sandbox_kinds()
    for kind in kinds:
        results[kind] = bench_env(kind, args.group, args.rounds)
    if "bwrap" in kinds:
        results["bwrap_floor"] = bench_bwrap_floor()
    if "docker" in kinds:
        results["naive_docker"] = bench_naive_docker(args.naive_samples)
        results["docker_speedup_vs_naive"] = results["naive_docker"]["p50_ms"] / results["docker"]["p50_ms"]
    for kind in kinds:
        results[kind]["samples_per_s_2_workers"] = bench_throughput(kind, args.seconds)
    results["machine"]["load_after"] = os.getloadavg()

    rows = [("backend", "p50 ms", "p95 ms", "build s", "builds", "samples/s (2 workers)")]
    for kind in kinds:
        r = results[kind]
        rows.append(
            (
                kind,
                f"{r['p50_ms']:.1f}",
                f"{r['p95_ms']:.1f}",
                f"{r['build_s']:.2f}",
                str(r["builds"]),
                f"{r['samples_per_s_2_workers']:.1f}",
            )
        )
    if "naive_docker" in results:
        r = results["naive_docker"]
        rows.append(
            (
                "naive docker (run + replay)",
                f"{r['p50_ms']:.1f}",
                f"{r['p95_ms']:.1f}",
                "-",
                str(r["samples"]),
                "-",
            )
        )
    if "bwrap_floor" in results:
        r = results["bwrap_floor"]
        rows.append(("floor: bare `bwrap true`", f"{r['p50_ms']:.1f}", f"{r['p95_ms']:.1f}", "-", "-", "-"))
    print_table(rows)
    if "docker_speedup_vs_naive" in results:
        print(f"docker speed-up vs naive (p50): {results['docker_speedup_vs_naive']:.1f}x")
    write_results(results, OUT)


if __name__ == "__main__":
    main()
