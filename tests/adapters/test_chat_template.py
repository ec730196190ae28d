"""The chat template renders real pivots (tool schemas, tool calls, tool replies) for SmolLM2."""

from __future__ import annotations

import copy
import json
import re

import pytest

from pivot_envs.adapters.chat_template import (
    encode_prompt,
    prompt_messages,
    render_prompt,
    template_speaks_tools,
)
from pivot_envs.chat import tool_call, tool_to_chat


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from pivot_envs.adapters import smollm2

    return AutoTokenizer.from_pretrained(smollm2.checkpoint())


def nemo_gym_chats(shared_data) -> list[dict]:
    """NeMo-Gym pivot rows (Responses API items) converted by hand into chat form."""
    chats = []
    for line in (shared_data / "nemo_gym" / "single_step_tool_use_pivots.jsonl").read_text().splitlines():
        params = json.loads(line)["responses_create_params"]
        messages: list[dict] = []
        for item in params["input"]:
            kind = item.get("type", "message")
            if kind == "message":
                content = item["content"]
                if isinstance(content, list):
                    content = "".join(part.get("text", "") for part in content)
                messages.append({"role": item["role"], "content": content})
            elif kind == "function_call":
                call = tool_call(item["name"], item["arguments"], item["call_id"])
                if messages and messages[-1]["role"] == "assistant" and messages[-1].get("tool_calls"):
                    messages[-1]["tool_calls"].append(call)
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif kind == "function_call_output":
                messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
        chats.append({"messages": messages, "tools": [tool_to_chat(t) for t in params["tools"]]})
    return chats


def tau_bench_prefix(shared_data) -> list[dict]:
    """A real tau-bench airline prefix (content None + tool_calls, role tool), up to a tool reply."""
    episode = json.loads((shared_data / "tau_bench" / "airline" / "gpt4o_trajectories.json").read_text())[0]
    traj = episode["traj"]
    last_tool = max(i for i, m in enumerate(traj) if m["role"] == "tool")
    return traj[: last_tool + 1]


def turns(text: str) -> list[tuple[str, str]]:
    return re.findall(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>", text, flags=re.S)


def test_smollm2_template_does_not_speak_tools_so_messages_are_normalised(tokenizer):
    assert not template_speaks_tools(tokenizer)
    import jinja2

    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [tool_call("lookup", {"q": "x"}, "c1")]},
    ]
    # The raw template fails on content=None; the normalised form renders.
    with pytest.raises((TypeError, jinja2.exceptions.TemplateError)):
        tokenizer.apply_chat_template(messages, tokenize=False)
    assert '<tool_call>\n{"name": "lookup", "arguments": {"q": "x"}}\n</tool_call>' in render_prompt(
        tokenizer, messages
    )


def test_every_real_nemo_gym_pivot_renders_with_its_tools_in_the_one_system_turn(tokenizer, shared_data):
    for chat in nemo_gym_chats(shared_data):
        text = render_prompt(tokenizer, chat["messages"], chat["tools"])
        assert text.endswith("<|im_start|>assistant\n")
        rendered = turns(text)
        assert [role for role, _ in rendered].count("system") == 1
        system = rendered[0][1]
        listed = re.search(r"<tools>\n(.*?)\n</tools>", system, flags=re.S).group(1).splitlines()
        assert [json.loads(line)["function"]["name"] for line in listed] == [
            t["function"]["name"] for t in chat["tools"]
        ]
        assert system.startswith(chat["messages"][0]["content"].strip()[:40])
        assert "<tool_call>" in system  # the instruction shows the answer format


def test_assistant_tool_calls_become_tool_call_blocks_with_parsed_arguments(tokenizer, shared_data):
    prefix = tau_bench_prefix(shared_data)
    text = render_prompt(tokenizer, prefix, [])
    blocks = [json.loads(b) for b in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, flags=re.S)]
    expected = [
        {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
        for m in prefix
        if m["role"] == "assistant"
        for c in m.get("tool_calls") or []
    ]
    assert blocks == expected and expected
    assert "None" not in [body for role, body in turns(text) if role == "assistant"]


def test_tool_replies_are_tool_response_blocks_in_user_turns_merged_when_consecutive(tokenizer):
    messages = [
        {"role": "user", "content": "status of flights HAT1 and HAT2?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                tool_call("get_flight_status", {"flight": "HAT1"}, "c1"),
                tool_call("get_flight_status", {"flight": "HAT2"}, "c2"),
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "on time"},
        {"role": "tool", "tool_call_id": "c2", "content": "delayed"},
    ]
    normalised = prompt_messages(messages, None)
    assert [m["role"] for m in normalised] == ["user", "assistant", "user"]
    assert (
        normalised[2]["content"]
        == "<tool_response>\non time\n</tool_response>\n<tool_response>\ndelayed\n</tool_response>"
    )
    assert normalised[1]["content"].count("<tool_call>") == 2
    # The input is not modified.
    assert messages[1]["content"] is None and messages[2]["role"] == "tool"


def test_tools_without_a_system_message_become_the_system_turn(tokenizer):
    tools = [
        tool_to_chat(
            {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}
        )
    ]
    text = render_prompt(tokenizer, [{"role": "user", "content": "hi"}], tools)
    rendered = turns(text)
    assert rendered[0][0] == "system" and rendered[0][1].startswith("# Tools")
    assert "SmolLM" not in text  # the template's default system prompt is replaced, not added


def test_encode_prompt_is_the_token_ids_of_the_rendered_prompt(tokenizer, shared_data):
    chat = nemo_gym_chats(shared_data)[0]
    ids = encode_prompt(tokenizer, chat["messages"], chat["tools"])
    assert tokenizer.decode(ids) == render_prompt(tokenizer, chat["messages"], chat["tools"])
    header = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert ids[-len(header) :] == header
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == len(chat["messages"]) + 1 - sum(
        1
        for i, m in enumerate(chat["messages"])
        if m["role"] == "tool" and chat["messages"][i - 1]["role"] == "tool"
    )


def test_a_template_that_speaks_tools_gets_the_tools_and_structured_calls_natively(tokenizer):
    native = copy.deepcopy(tokenizer)
    # transformers renders with trim_blocks: the newlines after block tags disappear.
    native.chat_template = (
        "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
        "{% for c in m.tool_calls or [] %}[{{ c.function.name }}({{ c.function.arguments.flight }})]{% endfor %}"
        "\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    messages = [
        {"role": "user", "content": "status?"},
        {"role": "assistant", "content": None, "tool_calls": [tool_call("status", {"flight": "HAT1"}, "c1")]},
        {"role": "tool", "tool_call_id": "c1", "content": "on time"},
    ]
    tools = [{"type": "function", "name": "status", "parameters": {"type": "object", "properties": {}}}]
    assert template_speaks_tools(native)
    assert render_prompt(native, messages, tools) == (
        "TOOLS:status;<user>status?<assistant>[status(HAT1)]<tool>on time<assistant>"
    )


def test_a_tokenizer_without_a_chat_template_is_a_clear_error(tokenizer):
    bare = copy.deepcopy(tokenizer)
    bare.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        render_prompt(bare, [{"role": "user", "content": "hi"}], [])
