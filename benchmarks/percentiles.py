"""Helpers the benchmarks share: nearest-rank percentiles, the machine a run was on, its table and JSON,
the sandbox backends to measure and the warm reset + step loop of the sandboxed domains."""

from __future__ import annotations


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile (0..1) of `values` by the nearest rank: a value that was measured, never interpolated."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def machine() -> dict:
    """What a benchmark's figures depend on: the CPUs, the platform and the load average before it ran
    (the caller adds `load_after` when it is done: these machines are shared and noisy)."""
    import os
    import platform

    return {"cpus": os.cpu_count(), "platform": platform.platform(), "load_before": os.getloadavg()}


def sandbox_kinds() -> list[str]:
    """The sandbox backends this machine can run, of "bwrap" and "docker"."""
    from pivot_envs.sandboxes.available import bwrap_available, docker_available

    return [kind for kind, ok in (("bwrap", bwrap_available()), ("docker", docker_available())) if ok]


def warm_latencies(env, action, group: int, rounds: int) -> list[float]:
    """Seconds of each reset to pivot 0 + step of `action` (each must score 1.0): `rounds` groups of `group`.

    Before each group the env's warm pool refills, as it does while the policy generates between groups."""
    import time

    latencies = []
    for _ in range(rounds):
        env.backend.wait_warm(env._state.snapshot, timeout=60)
        for _ in range(group):
            start = time.perf_counter()
            env.reset(options={"index": 0})
            _, reward, _, _, info = env.step(action)
            latencies.append(time.perf_counter() - start)
            assert reward == 1.0, info
    return latencies


def print_table(rows: list[tuple[str, ...]]) -> None:
    """`rows` (the first the header) as left-aligned columns."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)))


def write_results(results: dict, out) -> None:
    """Print the load average before and after (from `results["machine"]`) and write `results` as JSON to `out`."""
    import json

    print(
        f"load average before/after: {results['machine']['load_before']} / {results['machine']['load_after']}"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
