"""The tool-use action parser: raw completions and message dicts -> canonical assistant messages."""

from __future__ import annotations

import json

from fuzz_common import json_strategy
from hypothesis import given, settings
from hypothesis import strategies as st

from pivot_envs.domains.tool_use.parser import parse_action


def calls(message):
    return [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in message.get("tool_calls") or []
    ]


def test_a_hermes_block_becomes_one_canonical_tool_call():
    parsed = parse_action(
        '<tool_call>\n{"name": "get_user_details", "arguments": {"user_id": "mia_li_3668"}}\n</tool_call>'
    )
    assert parsed.category == "ok"
    assert calls(parsed.message) == [("get_user_details", {"user_id": "mia_li_3668"})]
    assert parsed.message["content"] is None
    call = parsed.message["tool_calls"][0]
    assert call["type"] == "function" and isinstance(call["function"]["arguments"], str)


def test_several_blocks_and_surrounding_text_are_all_kept():
    text = (
        'Let me look. <tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    )
    message = parse_action(text).message
    assert calls(message) == [("a", {"x": 1}), ("b", {})]
    assert message["content"] == "Let me look."


def test_a_json_list_inside_one_block_is_several_calls_as_smollm2_writes_them():
    text = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {"city": "Tokyo"}}]</tool_call>'
    assert calls(parse_action(text).message) == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Tokyo"}),
    ]


def test_think_blocks_are_removed_before_parsing():
    text = '<think>The user wants {"name": "x"} maybe</think>\n<tool_call>{"name": "think", "arguments": {"thought": "t"}}</tool_call>'
    message = parse_action(text).message
    assert calls(message) == [("think", {"thought": "t"})]
    assert message["content"] is None


def test_a_lone_closing_think_tag_drops_the_reasoning_before_it():
    assert parse_action("reasoning here</think>\n\nHello!").message == {
        "role": "assistant",
        "content": "Hello!",
    }


def test_an_unfinished_think_block_is_not_an_action():
    parsed = parse_action("<think>still thinking about the booking")
    assert parsed.message is None and parsed.category == "unparseable"


def test_a_bare_json_tool_call_and_a_fenced_one_are_tool_calls():
    bare = parse_action('{"name": "calculate", "arguments": {"expression": "2 + 2"}}')
    fenced = parse_action('```json\n{"name": "calculate", "parameters": {"expression": "2 + 2"}}\n```')
    assert calls(bare.message) == calls(fenced.message) == [("calculate", {"expression": "2 + 2"})]


def test_plain_text_and_json_that_is_not_a_call_are_messages():
    assert parse_action("  Sure, I can help.  ").message == {
        "role": "assistant",
        "content": "Sure, I can help.",
    }
    assert parse_action('{"answer": 42}').message == {"role": "assistant", "content": '{"answer": 42}'}


def test_arguments_given_as_a_json_string_are_decoded():
    text = '<tool_call>{"name": "f", "arguments": "{\\"a\\": [1, 2]}"}</tool_call>'
    assert calls(parse_action(text).message) == [("f", {"a": [1, 2]})]


def test_an_unclosed_last_block_with_complete_json_is_accepted():
    assert calls(parse_action('<tool_call>{"name": "f", "arguments": {}}').message) == [("f", {})]


def test_an_openai_message_dict_with_string_arguments_is_canonicalized():
    raw = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "srv-1", "type": "function", "function": {"name": "f", "arguments": '{"b": 2, "a": 1}'}}
        ],
    }
    message = parse_action(raw).message
    assert calls(message) == [("f", {"a": 1, "b": 2})]
    assert message["content"] is None
    # Server ids are random; ours depend only on the call.
    assert message["tool_calls"][0]["id"] == parse_action(dict(raw)).message["tool_calls"][0]["id"] != "srv-1"


def test_call_ids_are_deterministic_and_distinct_within_a_turn():
    text = '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call><tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
    ids = [c["id"] for c in parse_action(text).message["tool_calls"]]
    assert ids == [c["id"] for c in parse_action(text).message["tool_calls"]]
    assert len(set(ids)) == 2


def test_malformed_output_is_unparseable_with_a_reason():
    cases = {
        "": "empty",
        "   ": "empty",
        '<tool_call>{"name": "f", "arguments": {</tool_call>': "not valid JSON",
        '<tool_call>{"arguments": {}}</tool_call>': "no name",
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>': "JSON object",
        '<tool_call>{"name": "f", "arguments": "{broken"}</tool_call>': "not valid JSON",
    }
    for text, reason in cases.items():
        parsed = parse_action(text)
        assert parsed.message is None and parsed.category == "unparseable", text
        assert reason in parsed.detail, (text, parsed.detail)


def test_a_dict_that_is_not_an_assistant_message_is_unparseable():
    assert parse_action({"role": "user", "content": "hi"}).category == "unparseable"
    assert parse_action({"role": "assistant", "content": None}).category == "unparseable"
    assert parse_action(42).category == "unparseable"


json_values = json_strategy(st.text(max_size=20), key_size=8, size=4, leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_never_raises(text):
    parsed = parse_action(text)
    assert parsed.message is not None or parsed.category == "unparseable"


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_arbitrary_json_in_a_tool_call_block_or_as_a_message_dict_never_raises(value):
    for action in (
        f"<tool_call>{json.dumps(value)}</tool_call>",
        json.dumps(value),
        {"role": "assistant", "tool_calls": value},
    ):
        parsed = parse_action(action)
        assert parsed.message is not None or parsed.category == "unparseable"


def _cycle():
    arguments: dict = {}
    arguments["self"] = arguments
    return arguments


def test_dict_arguments_json_cannot_hold_are_unparseable_not_an_error():
    """A message dict's arguments that JSON cannot encode (an int past Python's digit limit, a set, bytes, a
    cycle) are the action's fault: unparseable, scored 0. They once raised, which the env reports as its own
    failure (env_error, valid=False)."""
    for value in (10**5000, {1}, b"a", object(), _cycle()):
        message = {
            "role": "assistant",
            "tool_calls": [{"function": {"name": "search", "arguments": {"x": value}}}],
        }
        parsed = parse_action(message)
        assert (parsed.message, parsed.category) == (None, "unparseable"), value
        assert "not JSON" in parsed.detail
