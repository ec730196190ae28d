"""Helpers of the tool-use domain tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import json
import time
import tracemalloc


def hermes(name: str, arguments: dict) -> str:
    """A Hermes-style completion calling one tool."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def expert_call(pivot) -> tuple[str, dict]:
    """The (name, arguments) of a pivot's first expert call."""
    function = pivot.expert["tool_calls"][0]["function"]
    return function["name"], json.loads(function["arguments"])


def first(pivots, name: str):
    """The first pivot whose expert calls `name`."""
    return next(p for p in pivots if p.expert.get("tool_calls") and expert_call(p)[0] == name)


def step(env, pivot, action):
    """Reset `env` at `pivot` and take one action; returns (reward, info, observation)."""
    env.reset(options={"pivot": pivot.id})
    observation, reward, terminated, truncated, info = env.step(action)
    assert terminated and not truncated
    return reward, info, observation


def hermes_turn(calls: list[tuple[str, dict]]) -> str:
    """A Hermes-style completion making several calls, one block each."""
    return "".join(hermes(name, arguments) for name, arguments in calls)


def measured(function, *args):
    """(result, wall seconds, peak memory traced by tracemalloc in bytes) of one call."""
    tracing = tracemalloc.is_tracing()
    if tracing:
        tracemalloc.reset_peak()
    else:
        tracemalloc.start()
    start = time.perf_counter()
    try:
        result = function(*args)
    finally:
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        if not tracing:
            tracemalloc.stop()
    return result, seconds, peak


def appended_tool_bytes(observation, pivot) -> list[int]:
    """The UTF-8 size of each tool result a step appended after the pivot's messages and the action."""
    appended = observation["messages"][len(pivot.messages) + 1 :]
    assert all(m["role"] == "tool" for m in appended)
    return [len(m["content"].encode()) for m in appended]
