"""Helpers of the tool-use domain tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import json


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
