"""Latency of reset + step at SWE pivots with a 12-call prefix in the bundled repository
(more-itertools), per action kind (view, grep, edit, test run) and backend, against the naive way
(a fresh sandbox per sample with the task's start state made and the prefix replayed).

    .venv/bin/python benchmarks/swe_reset_step.py [--group 8] [--rounds 3] [--naive-samples 4]

Prints a table, writes benchmarks/out/swe_reset_step.json. Targets (issue 16): non-test actions
p50 <= 30 ms on bubblewrap and <= 100 ms on Docker; >= 10x the naive baseline at pivots with 10+
prefix steps; test actions within 1.2x of running the same tests directly in the sandbox.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from percentiles import machine, percentile, print_table, sandbox_kinds, warm_latencies, write_results

from pivot_envs.domains.swe import SweEnv, canonical_call, execute_call
from pivot_envs.domains.swe.repo import bundled_repo, repo_context, start_sandbox
from pivot_envs.pivot import Pivot

MORE = "/repo/more_itertools/more.py"
FIRST_OLD = "    for item in iterable:\n        return item\n    if default is _marker:"
FIRST_NEW = "    for item in iterable:\n        return item  # the first one\n    if default is _marker:"
# 12 calls: searches, views, a note created and edited, a cd and back, an export, a run.
PREFIX = [
    ("bash", {"command": "grep -rn 'def first' more_itertools"}),
    ("str_replace_editor", {"command": "view", "path": MORE, "view_range": [240, 270]}),
    ("bash", {"command": "ls tests"}),
    ("str_replace_editor", {"command": "view", "path": "/repo/tests/test_more.py", "view_range": [100, 130]}),
    ("bash", {"command": "cd more_itertools"}),
    ("bash", {"command": "cd .."}),
    ("str_replace_editor", {"command": "create", "path": "/repo/NOTES.md", "file_text": "first() returns\n"}),
    (
        "str_replace_editor",
        {
            "command": "str_replace",
            "path": "/repo/NOTES.md",
            "old_str": "returns",
            "new_str": "returns the first item",
        },
    ),
    ("bash", {"command": "git status --short"}),
    ("bash", {"command": "export CHECK=1"}),
    (
        "str_replace_editor",
        {"command": "insert", "path": "/repo/NOTES.md", "insert_line": 1, "new_str": "checked"},
    ),
    ("bash", {"command": "python3 -c 'import more_itertools; print(more_itertools.__version__)'"}),
]
TEST = "python3 -m unittest tests.test_more.FirstTests"
ACTIONS = {
    "view": ("str_replace_editor", {"command": "view", "path": MORE, "view_range": [245, 270]}),
    "grep": ("bash", {"command": "grep -rn 'def first' more_itertools"}),
    "edit": (
        "str_replace_editor",
        {"command": "str_replace", "path": MORE, "old_str": FIRST_OLD, "new_str": FIRST_NEW},
    ),
    "test": ("bash", {"command": TEST}),
}
OUT = Path(__file__).resolve().parent / "out" / "swe_reset_step.json"


def bench_pivot(kind: str) -> Pivot:
    """The pivot after the 12 prefix calls whose expert (and every sample) is the `kind` action."""
    messages: list[dict] = [{"role": "user", "content": "Document first() and check its tests."}]
    for turn, (name, arguments) in enumerate(PREFIX):
        message = canonical_call(name, arguments)
        message["tool_calls"][0]["id"] = f"call_{turn}"
        messages += [message, {"role": "tool", "tool_call_id": f"call_{turn}", "content": "(output)"}]
    task = {
        "id": "bench",
        "bug_patch": None,
        "fail_to_pass": ["tests.test_more.FirstTests"],
        "pass_to_pass": [],
    }
    context = {**repo_context(bundled_repo()), "task": task, "harness": "persistent", "executable": True}
    return Pivot(f"bench/{kind}/t12", "swe", messages, canonical_call(*ACTIONS[kind]), context=context)


def summary(latencies: list[float]) -> dict:
    return {
        "samples": len(latencies),
        "latencies_s": latencies,
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * percentile(latencies, 0.95),
    }


def bench_env(kind: str, action: str, group: int, rounds: int) -> dict:
    """reset + step latency of G samples per round at one pivot (prefix built once, reported apart)."""
    env = SweEnv([bench_pivot(action)], sandbox=kind, warm_pool=group)
    start = time.perf_counter()
    env.reset(options={"index": 0})
    build = time.perf_counter() - start
    _, reward, _, _, info = env.step(env.pivot.expert)  # also runs the expert's reference call once
    assert reward == 1.0, info
    latencies = warm_latencies(env, env.pivot.expert, group, rounds)
    builds = env.prefixes.builds
    direct = []
    if action == "test":  # the same tests run directly in a fork of the same state, no env around them
        for _ in range(rounds * group):
            env.backend.wait_warm(env._state.snapshot, timeout=60)
            fork = env.backend.fork(env._state.snapshot)
            start = time.perf_counter()
            result = fork.run(TEST, files=True)
            direct.append(time.perf_counter() - start)
            fork.close()
            assert result.ok, result.output[-500:]
    env.close()
    return {
        "build_s": build,
        "builds": builds,
        **summary(latencies),
        **({"direct": summary(direct)} if direct else {}),
    }


def bench_naive(kind: str, action: str, samples: int) -> dict:
    """Per sample: a fresh sandbox with the task's start state, the 12 prefix calls replayed, the action."""
    from pivot_envs.domains.terminal.image import image_tag, rootfs_path
    from pivot_envs.sandboxes.bwrap_backend import BwrapBackend
    from pivot_envs.sandboxes.docker_backend import DockerBackend

    backend = (
        BwrapBackend(rootfs_path(), warm_pool=0)
        if kind == "bwrap"
        else DockerBackend(warm_pool=0, base_image=image_tag())
    )
    repo = bundled_repo()
    latencies = []
    for _ in range(samples):
        start = time.perf_counter()
        sandbox = start_sandbox(backend, repo)
        for name, arguments in PREFIX:
            execute_call(sandbox, name, arguments, files=False)
        result = execute_call(sandbox, *ACTIONS[action])
        sandbox.close()
        latencies.append(time.perf_counter() - start)
        assert result.error is None, result.text
    backend.close()
    return summary(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", type=int, default=8, help="samples per pivot (G)")
    parser.add_argument("--rounds", type=int, default=3, help="groups measured per pivot and backend")
    parser.add_argument("--naive-samples", type=int, default=4)
    parser.add_argument("--kinds", default="view,grep,edit,test", help="action kinds to measure")
    args = parser.parse_args()

    results: dict = {
        "group": args.group,
        "rounds": args.rounds,
        "prefix_calls": len(PREFIX),
        "machine": machine(),
    }
    backends = sandbox_kinds()
    actions = args.kinds.split(",")
    rows = [("backend", "action", "p50 ms", "p95 ms", "naive p50 ms", "speed-up", "direct p50 ms", "build s")]
    for backend in backends:
        for action in actions:
            measured = bench_env(backend, action, args.group, args.rounds)
            measured["naive"] = bench_naive(backend, action, args.naive_samples)
            measured["speedup_vs_naive"] = measured["naive"]["p50_ms"] / measured["p50_ms"]
            if "direct" in measured:
                measured["ratio_to_direct"] = measured["p50_ms"] / measured["direct"]["p50_ms"]
            results[f"{backend}/{action}"] = measured
            rows.append(
                (
                    backend,
                    action,
                    f"{measured['p50_ms']:.1f}",
                    f"{measured['p95_ms']:.1f}",
                    f"{measured['naive']['p50_ms']:.1f}",
                    f"{measured['speedup_vs_naive']:.1f}x",
                    f"{measured['direct']['p50_ms']:.1f}" if "direct" in measured else "-",
                    f"{measured['build_s']:.2f}",
                )
            )
    results["machine"]["load_after"] = os.getloadavg()
    print_table(rows)
    write_results(results, OUT)


if __name__ == "__main__":
    main()
