"""Hypothesis strategies and assertions the property-based tests of the core and the domains share.

Each fuzz test module builds its own `plain_json` and `odd_values` (what counts as odd differs by
domain) and takes from here the parts that are the same everywhere: odd text, malformed chat
messages, Hermes blocks with random JSON, and the contract every step keeps.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

SYNTAX = '\x00\n\t{}[]"<>/'


def odd_text_with(syntax: str) -> SearchStrategy[str]:
    """Any text, text holding a lone surrogate (what a broken decoder hands over), and `syntax` characters."""
    return (
        st.text(max_size=40)
        | st.builds(
            lambda a, s, b: a + s + b,
            st.text(max_size=10),
            st.characters(categories=["Cs"]),
            st.text(max_size=10),
        )
        | st.text(st.sampled_from(syntax), max_size=20)
    )


odd_text = odd_text_with(SYNTAX)


def json_strategy(text: SearchStrategy[str], *, key_size: int, size: int, leaves: int) -> SearchStrategy:
    """JSON values: null, booleans, integers, floats but NaN, `text`, and lists and objects of at most
    `size` items (keys of at most `key_size` characters), `leaves` scalars in all."""
    return st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text,
        lambda inner: (
            st.lists(inner, max_size=size) | st.dictionaries(st.text(max_size=key_size), inner, max_size=size)
        ),
        max_leaves=leaves,
    )


def content_parts(text: SearchStrategy, values: SearchStrategy) -> SearchStrategy[list]:
    """Lists of "text" content parts whose text is any text or any value."""
    return st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text | values}), max_size=3)


def malformed_messages(text: SearchStrategy, values: SearchStrategy) -> SearchStrategy[dict]:
    """Chat messages with any role, content parts or odd values, and tool calls of any shape."""
    odd_calls = st.lists(
        st.fixed_dictionaries({}, optional={"id": values, "function": values, "name": values}),
        max_size=2,
    )
    return st.fixed_dictionaries(
        {},
        optional={
            "role": text,
            "content": content_parts(text, values) | values,
            "tool_calls": odd_calls | values,
        },
    )


def hermes_blocks(body: SearchStrategy, tail: SearchStrategy) -> SearchStrategy[str]:
    """A `<tool_call>` block holding any JSON `body`, followed by `tail`."""
    return st.builds(lambda b, t: f"<tool_call>{json.dumps(b)}</tool_call>{t}", body, tail)


def assert_verdict(reward: float, category: object) -> None:
    """A verdict: a reward in [0, 1] and a named category."""
    assert 0.0 <= reward <= 1.0
    assert isinstance(category, str) and category


def assert_step_contract(step: tuple) -> None:
    """What every single-turn step returns, whatever the action: a verdict, done, JSON-safe, no env_error."""
    observation, reward, terminated, truncated, info = step
    assert_verdict(reward, info["category"])
    assert (terminated, truncated) == (True, False) and isinstance(info["valid"], bool)
    assert info["category"] != "env_error", info["detail"]
    json.dumps(info, ensure_ascii=False).encode("utf-8")
    json.dumps(observation, ensure_ascii=False).encode("utf-8")
