"""Fresh observation copies (pivot_envs.observations): new dicts and lists every time, made fast."""

from __future__ import annotations

import timeit

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from test_env_fuzz import containers, plain_json

import pivot_envs  # noqa: F401  (registers pivot/tool-use-v0)
from pivot_envs.observations import COMPILE_AFTER, ObservationCopies, compiled_copier, freeze


def shares_a_container(a: object, b: object) -> bool:
    return bool({id(c) for c in containers(a)} & {id(c) for c in containers(b)})


def bundled_pivots() -> list:
    return gym.make("pivot/tool-use-v0").unwrapped.pivots


def test_a_thawed_observation_makes_each_string_once_and_shares_no_container() -> None:
    pivot = bundled_pivots()[0]
    thaw, frozen = freeze(pivot.observation)
    thawed = thaw(frozen)
    assert thawed == pivot.observation and not shares_a_container(thawed, pivot.observation)
    types = [tool["function"]["parameters"]["type"] for tool in thawed["tools"]]
    assert len(types) > 1 and all(kind is types[0] for kind in types)  # "object", made once


@settings(max_examples=200, deadline=None, derandomize=True)
@given(plain_json)
def test_a_compiled_copier_builds_an_equal_value_sharing_no_dict_or_list(value: object) -> None:
    copier = compiled_copier(value)
    assert copier is not None
    first, second = copier(), copier()
    assert first == value and second == value
    assert not shares_a_container(first, value) and not shares_a_container(first, second)


def nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    "value",
    [{"a": (1, 2)}, {1: "int key"}, [np.int64(3)], {"a": b"bytes"}, nested(100)],
    ids=["tuple", "int key", "numpy", "bytes", "100 levels"],
)
def test_only_plain_json_is_compiled(value: object) -> None:
    assert compiled_copier(value) is None


def test_pivots_offering_the_same_tools_share_one_frozen_tool_list() -> None:
    first, second = bundled_pivots()[:2]
    assert first.tools == second.tools and first.tools is not second.tools
    copies = ObservationCopies()
    copies.copy(first)
    copies.copy(second)
    assert len(copies._tools) == 1 and len(copies._pivots) == 2


def test_a_tool_list_copied_often_is_compiled_and_every_copy_stays_fresh() -> None:
    pivot = bundled_pivots()[0]
    copies = ObservationCopies()
    thawed = [copies.copy(pivot) for _ in range(COMPILE_AFTER)]
    frozen_tools = copies._tools[next(iter(copies._tools))]
    assert frozen_tools.build is not None
    built = copies.copy(pivot)
    assert built == pivot.observation == thawed[-1]
    assert not shares_a_container(built, pivot.observation) and not shares_a_container(built, thawed[-1])
    built["tools"][0]["function"]["name"] = "edited"
    built["tools"].append({"injected": True})
    assert copies.copy(pivot) == pivot.observation


def test_a_compiled_copy_of_the_bundled_tools_costs_less_than_thawing_them() -> None:
    tools = bundled_pivots()[0].tools
    thaw, frozen = freeze(tools)
    copier = compiled_copier(tools)
    assert copier is not None
    thawing = min(timeit.repeat(lambda: thaw(frozen), number=200, repeat=7))
    building = min(timeit.repeat(copier, number=200, repeat=7))
    assert building < thawing, f"compiled {building / 200 * 1e6:.1f} us, thawed {thawing / 200 * 1e6:.1f} us"
