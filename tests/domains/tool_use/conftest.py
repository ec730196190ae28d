"""Fixtures of the tool-use domain tests."""

from __future__ import annotations

import gymnasium as gym
import pytest

import pivot_envs  # noqa: F401  (registers pivot/tool-use-v0)
from pivot_envs.domains.tool_use.env import bundled_pivots


@pytest.fixture(scope="session")
def pivots():
    return list(bundled_pivots())


@pytest.fixture(scope="session")
def call_pivots(pivots):
    return [p for p in pivots if p.expert.get("tool_calls")]


@pytest.fixture(scope="session")
def message_pivots(pivots):
    return [p for p in pivots if not p.expert.get("tool_calls")]


@pytest.fixture
def airline_env():
    return gym.make("pivot/tool-use-v0", backend="tau-airline").unwrapped


@pytest.fixture
def recorded_env():
    return gym.make("pivot/tool-use-v0", backend="recorded").unwrapped
