"""Property-based tests of PivotEnv.step and json_safe: any action keeps the contract.

Deterministic (derandomized, fixed example budgets) so CI runs the same examples each time.
"""

from __future__ import annotations

import json
import math

import numpy as np
from echo_domain import EchoEnv
from fuzz_common import assert_step_contract, content_parts, hermes_blocks, odd_text
from hypothesis import given, settings
from hypothesis import strategies as st

from pivot_envs.env import json_safe

FUZZ = settings(max_examples=300, deadline=None, derandomize=True)

odd_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    odd_text,
    st.binary(max_size=20),
    st.sampled_from(
        [object(), np.int64(3), np.float32(0.5), np.bool_(True), np.arange(3), float("nan"), ...]
    ),
    st.text(max_size=1).map(lambda c: c * 200_000),  # a huge string
)
odd_values = st.recursive(
    odd_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(odd_text | st.integers() | st.tuples(st.integers()), inner, max_size=4)
    ),
    max_leaves=20,
)
plain_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
tool_calls = st.lists(
    st.fixed_dictionaries(
        {
            "function": st.fixed_dictionaries(
                {"name": odd_text | odd_scalars, "arguments": odd_text | odd_values}
            )
        },
        optional={"id": odd_text, "type": st.just("function")},
    ),
    max_size=3,
)
messages = st.fixed_dictionaries(
    {},
    optional={
        "role": odd_text,
        "content": odd_text | content_parts(odd_text, odd_values) | odd_values,
        "tool_calls": tool_calls | odd_values,
    },
)
hermes = hermes_blocks(
    st.fixed_dictionaries({"name": st.text(max_size=20), "arguments": plain_json}), odd_text
)
actions = odd_text | odd_values | messages | hermes


@FUZZ
@given(odd_values)
def test_json_safe_always_gives_utf8_encodable_json(value: object) -> None:
    json.dumps(json_safe(value), ensure_ascii=False).encode("utf-8")


@FUZZ
@given(plain_json)
def test_json_safe_leaves_plain_json_as_it_is(value: object) -> None:
    assert json_safe(value) == value


def containers(value: object) -> list[object]:
    """Every dict and list inside `value`, itself included."""
    if isinstance(value, dict):
        return [value, *(c for item in value.values() for c in containers(item))]
    if isinstance(value, (list, tuple)):
        return ([value] if isinstance(value, list) else []) + [c for item in value for c in containers(item)]
    return []


@FUZZ
@given(plain_json | odd_values)
def test_json_safe_shares_no_dict_or_list_with_its_input(value: object) -> None:
    made = json_safe(value)
    assert not {id(c) for c in containers(made)} & {id(c) for c in containers(value)}


def test_json_safe_keeps_non_finite_floats_that_json_dumps_accepts() -> None:
    assert math.isnan(json_safe(float("nan"))) and json_safe([float("inf")]) == [float("inf")]


ENV = EchoEnv()


@FUZZ
@given(actions, st.integers(min_value=0, max_value=len(ENV.pivots) - 1))
def test_any_action_keeps_the_step_contract(action: object, index: int) -> None:
    ENV.reset(options={"index": index})
    step = ENV.step(action)
    assert isinstance(step[1], float)
    assert_step_contract(step)
