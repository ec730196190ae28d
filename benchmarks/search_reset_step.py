"""Search domain speed: index build, engine search, tool calls, and env reset + step on the bundled
pivots, against the naive way in the same run (re-running every prefix call at each reset, and
building the index per env).

    .venv/bin/python benchmarks/search_reset_step.py [--passes 3] [--builds 3]

1. Index build: reading the bundled corpus and writing its FTS5 index (best of --builds), and
   opening the cached index (what every later env does).
2. Engine search and `run_call` latency over every search query and tool call of the bundled
   pivots' expert turns (engine warm, as in a running env); the same searches through HttpEngine
   and the reference server (`serve_engine`, in a thread of this process: CPU time is both ends).
   Wall-clock figures move with the machine's load; CPU time (time.process_time) does not.
3. `reset` + `step` through `gym.make("pivot/search-v0")` at every bundled pivot with its expert
   turn as the action (one process, one thread): latency p50/p95 per kind of step (search,
   get_document, answer) and steps/s per core (CPU time, best of --passes after a first pass that
   fills the env's replay cache). The naive baseline replays every prefix call at each reset, with
   no cache, then runs the same step.
4. Memory: RSS added per env with 16 more envs open on one index in one process, each reset and
   stepped at every bundled pivot (its replay cache full).

Targets (issue 15): p50 <= 5 ms for a search step, >= 200 steps/s/core, index build <= 2 s, an
env's added memory <= 5 MB with 16 envs open on one index. Prints a table, writes
benchmarks/out/search_reset_step.json.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

import gymnasium as gym
from percentiles import machine, percentile, print_table, write_results

import pivot_envs  # noqa: F401  (registers pivot/search-v0)
from pivot_envs.chat import calls_of
from pivot_envs.domains.search.corpus import read_corpus
from pivot_envs.domains.search.engine import FtsEngine, build_index, index_for_corpus, open_engine
from pivot_envs.domains.search.env import bundled_pivots
from pivot_envs.domains.search.http_engine import HttpEngine, serve_engine
from pivot_envs.domains.search.tools import BrowseState, run_call

OUT = Path(__file__).resolve().parent / "out" / "search_reset_step.json"
ENVS = 16


def summary(seconds: list[float], cpu: list[float] | None = None) -> dict:
    """n, p50 and p95 in ms of wall-clock `seconds` (and of CPU seconds `cpu`, when given)."""
    result = {
        "n": len(seconds),
        "p50_ms": 1000 * statistics.median(seconds),
        "p95_ms": 1000 * percentile(seconds, 0.95),
    }
    if cpu is not None:
        result |= {"cpu_p50_ms": 1000 * statistics.median(cpu), "cpu_p95_ms": 1000 * percentile(cpu, 0.95)}
    return result


def kind_of(message: dict) -> str:
    calls = calls_of(message)
    return calls[0][0] if calls else "answer"


def bench_build(builds: int) -> dict:
    """Best-of-`builds` time to read the bundled corpus and write its index; opening the cached one."""
    times, cpu_times = [], []
    with tempfile.TemporaryDirectory() as directory:
        for number in range(builds):
            start, cpu = time.perf_counter(), time.process_time()
            build_index(read_corpus(), Path(directory) / f"index{number}.sqlite")
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu)
    index_for_corpus()  # the cached index exists from here on
    start = time.perf_counter()
    FtsEngine(index_for_corpus()).search("Jupiter")
    return {"build_s": min(times), "build_cpu_s": min(cpu_times), "builds_s": times,
            "open_cached_s": time.perf_counter() - start}  # fmt: skip


def bench_engine(pivots) -> dict:
    """Latency of the expert turns' searches on the engine and through the HTTP engine (the
    reference server in a thread of this process), and of their calls through run_call."""
    engine = open_engine()
    calls = [call for pivot in pivots for call in calls_of(pivot.expert)]
    queries = [arguments["query"] for name, arguments in calls if name == "search"]
    for query in queries:  # warm: the engine memoises each word's document count
        engine.search(query)
    server = serve_engine(engine, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    remote = HttpEngine(f"http://127.0.0.1:{server.server_address[1]}")
    runs = [("engine: search", partial(engine.search, query)) for query in queries]
    runs += [
        ("http engine: search (server in this process)", partial(remote.search, query)) for query in queries
    ]
    runs += [
        (f"run_call {name}", partial(run_call, engine, name, arguments, BrowseState()))
        for name, arguments in calls
    ]
    timed: dict[str, tuple[list[float], list[float]]] = {}
    for name, run in runs:
        start, cpu = time.perf_counter(), time.process_time()
        run()
        wall_times, cpu_times = timed.setdefault(name, ([], []))
        wall_times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu)
    server.shutdown()
    server.server_close()
    return {name: summary(*times) for name, times in timed.items()}


def step_pass(env, pivots) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """reset + step at every pivot with its expert turn: wall and CPU seconds of each, by kind."""
    wall: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for index, pivot in enumerate(pivots):
        start, start_cpu = time.perf_counter(), time.process_time()
        env.reset(options={"index": index})
        _, reward, _, _, info = env.step(pivot.expert)
        wall.setdefault(kind_of(pivot.expert), []).append(time.perf_counter() - start)
        cpu.setdefault(kind_of(pivot.expert), []).append(time.process_time() - start_cpu)
        assert reward == 1.0 and info["valid"], (pivot.id, info.get("category"), info.get("detail"))
    return wall, cpu


def by_kind(wall: dict[str, list[float]], cpu: dict[str, list[float]]) -> dict:
    """Summaries per kind of step and over all, with steps per CPU second."""
    every, every_cpu = sum(wall.values(), []), sum(cpu.values(), [])
    return {"all": summary(every, every_cpu), **{kind: summary(wall[kind], cpu[kind]) for kind in wall},
            "steps_per_s_per_core": len(every_cpu) / sum(every_cpu)}  # fmt: skip


def bench_env(pivots, passes: int) -> dict:
    env = gym.make("pivot/search-v0").unwrapped
    first = by_kind(*step_pass(env, pivots))  # fills the replay cache
    best = max(
        (by_kind(*step_pass(env, pivots)) for _ in range(passes)), key=lambda r: r["steps_per_s_per_core"]
    )
    env.close()
    return {"first_pass": first, **best}


def bench_naive(pivots) -> dict:
    """Per pivot: replay every prefix call on the engine (no cache) and check it, then run the step."""
    engine = open_engine()
    wall: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for pivot in pivots:
        start, start_cpu = time.perf_counter(), time.process_time()
        state = BrowseState()
        recorded = [message["content"] for message in pivot.messages if message["role"] == "tool"]
        replayed = [run_call(engine, name, arguments, state).text
                    for message in pivot.messages for name, arguments in calls_of(message)]  # fmt: skip
        assert replayed == recorded, pivot.id
        for name, arguments in calls_of(pivot.expert):
            run_call(engine, name, arguments, state)
        wall.setdefault(kind_of(pivot.expert), []).append(time.perf_counter() - start)
        cpu.setdefault(kind_of(pivot.expert), []).append(time.process_time() - start_cpu)
    return by_kind(wall, cpu)


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def _memory_child(queue) -> None:
    pivots = bundled_pivots()

    def warm(env) -> None:
        for index, pivot in enumerate(pivots):
            env.reset(options={"index": index})
            env.step(pivot.expert)

    first = gym.make("pivot/search-v0")
    warm(first)
    before = rss_mb()
    envs = [gym.make("pivot/search-v0") for _ in range(ENVS)]
    for env in envs:
        warm(env)
    after = rss_mb()
    engines = {id(env.unwrapped.engine) for env in envs}
    queue.put({"rss_one_env_mb": before, "rss_with_16_more_mb": after, "per_env_mb": (after - before) / ENVS,
               "engines_shared": len(engines) == 1})  # fmt: skip


def bench_memory() -> dict:
    """In a fresh process: RSS with one warm env, then with 16 more, each stepped at every pivot."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_memory_child, args=(queue,))
    child.start()
    result = queue.get(timeout=1200)
    child.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--passes", type=int, default=3, help="timed passes over the pivots (best CPU time kept)"
    )
    parser.add_argument("--builds", type=int, default=3, help="index builds timed (best kept)")
    args = parser.parse_args()
    results: dict = {"machine": machine()}
    results["index"] = bench_build(args.builds)
    pivots = bundled_pivots()
    results["pivots"] = len(pivots)
    results["engine"] = bench_engine(pivots)
    results["env"] = bench_env(pivots, args.passes)
    results["naive_replay"] = bench_naive(pivots)
    results["memory"] = bench_memory()
    results["machine"]["load_after"] = os.getloadavg()

    env, naive = results["env"], results["naive_replay"]
    rows = [("measure", "p50 ms", "p95 ms", "CPU p50 ms", "CPU p95 ms", "n", "target")]

    def row(name: str, r: dict, target: str = "-") -> None:
        cpu = [f"{r['cpu_p50_ms']:.2f}", f"{r['cpu_p95_ms']:.2f}"] if "cpu_p50_ms" in r else ["-", "-"]
        rows.append((name, f"{r['p50_ms']:.2f}", f"{r['p95_ms']:.2f}", *cpu, str(r["n"]), target))

    index = results["index"]
    rows.append(("index build (read + write, bundled)", f"{1000 * index['build_s']:.0f}", "-",
                 f"{1000 * index['build_cpu_s']:.0f}", "-", "1", "<= 2000"))  # fmt: skip
    rows.append(
        (
            "open the cached index + first search",
            f"{1000 * index['open_cached_s']:.1f}",
            "-",
            "-",
            "-",
            "1",
            "-",
        )
    )
    for name, r in results["engine"].items():
        row(name, r)
    for kind in ("search", "get_document", "answer", "all"):
        row(f"env reset+step: {kind}", env[kind], "<= 5" if kind == "search" else "-")
    row("env, first pass (replays the prefixes): all", env["first_pass"]["all"])
    for kind in ("search", "all"):
        row(f"naive (replays every prefix call): {kind}", naive[kind])
    print_table(rows)
    memory = results["memory"]
    print(f"steps/s/core: env {env['steps_per_s_per_core']:.0f} (target >= 200), naive {naive['steps_per_s_per_core']:.0f}; "
          f"speed-up {env['steps_per_s_per_core'] / naive['steps_per_s_per_core']:.1f}x")  # fmt: skip
    print(f"naive with the index built per env: + {results['index']['build_s']:.2f} s per env")
    print(f"memory: {memory['per_env_mb']:.2f} MB per env with {ENVS} more envs on one index (target <= 5); "
          f"one engine shared: {memory['engines_shared']}")  # fmt: skip
    write_results(results, OUT)


if __name__ == "__main__":
    main()
