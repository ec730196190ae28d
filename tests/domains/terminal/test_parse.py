"""Reading the next command out of an action, in every accepted form, into one canonical form."""

from __future__ import annotations

import json

import pytest
from pivot_envs.domains.terminal.parse import canonical_message, parse_action, parse_command

from pivot_envs.chat import canonical_action


def call(name: str, arguments: dict) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        ],
    }


@pytest.mark.parametrize(
    "action",
    [
        "```bash\nls -la /app\n```",
        "Let me look.\n```sh\nls -la /app\n```",
        '{"keystrokes": "ls -la /app\\n", "duration": 0.1}',
        '{"analysis": "", "plan": "", "commands": [{"keystrokes": "ls -la /app\\n"}], "task_complete": false}',
        '<tool_call>{"name": "bash", "arguments": {"command": "ls -la /app"}}</tool_call>',
        call("bash", {"command": "ls -la /app"}),
        call("execute_bash", {"command": "ls -la /app"}),
        call("terminal", {"command": "ls -la /app"}),
        {"type": "function_call", "name": "terminal", "arguments": json.dumps({"command": "ls -la /app"})},
    ],
)
def test_every_accepted_form_parses_to_the_same_canonical_action(action):
    parsed = parse_action(action)
    assert parsed.category == "ok", parsed.detail
    assert canonical_action(parsed.message) == canonical_action(canonical_message("ls -la /app"))


@pytest.mark.parametrize(
    ("action", "category"),
    [
        ("I would list the files.", "no_command"),
        ("", "no_command"),
        ("```bash\nls\n```\n```bash\npwd\n```", "multiple_commands"),
        ("```bash\nif then fi (\n```", "malformed_command"),
        ("```bash\n   \n```", "empty_command"),
        ('{"keystrokes": "ls -la"}', "incomplete_command"),
        (call("patch", {"path": "a", "old_string": "x"}), "unsupported_tool"),
        (
            {"role": "assistant", "tool_calls": [call("bash", {"command": "ls"})["tool_calls"][0]] * 2},
            "multiple_commands",
        ),
        (call("bash", {"cmd_wrong": "ls"}), "malformed_arguments"),
        (42, "unparseable"),
    ],
)
def test_a_malformed_action_parses_to_no_command_with_a_category(action, category):
    parsed = parse_action(action)
    assert parsed.message is None
    assert parsed.category == category


def test_the_rollout_agents_file_tools_become_the_commands_they_stand_for():
    assert parse_command(call("read_file", {"path": "/app/a b.txt"})).command == "cat -- '/app/a b.txt'"
    assert parse_command(call("execute_code", {"code": "print(1)"})).command == "python3 -c 'print(1)'"
    assert (
        parse_command(call("write_file", {"path": "x", "content": "it's"})).command
        == "printf '%s' 'it'\"'\"'s' > x"
    )


def test_terminus_keystrokes_of_several_lines_join_into_one_script():
    action = json.dumps({"commands": [{"keystrokes": "cd /app\n"}, {"keystrokes": "ls\n"}]})
    assert parse_command(action).command == "cd /app\nls\n"


def test_a_lone_control_key_is_an_interactive_keystroke():
    found = parse_command('{"keystrokes": "C-c"}')
    assert found.command == "C-c" and found.keys
