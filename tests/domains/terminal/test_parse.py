"""Reading the next command out of an action, in every accepted form, into one canonical form."""

from __future__ import annotations

import json
import subprocess

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pivot_envs.chat import canonical_action
from pivot_envs.domains.terminal.parse import (
    canonical_message,
    parse_action,
    parse_command,
    shell_tokens,
    syntax_error,
)


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


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("sort list.txt", "sort   'list.txt'"),
        ("sort list.txt", 'sort "list.txt";'),
        ("sort list.txt", "sort list.txt # a comment"),
        ("sort list.txt", "sort list.txt;#a comment"),
        ("sort list.txt", "# a comment\nsort li\\\nst.txt"),
        ("find out -name '*.txt'", 'find out -name "*.txt"'),
        ("find out -name '*.txt'", "find out -name \\*.txt"),
        ("ls\nls", "ls\n\n# nothing\nls"),
    ],
)
def test_commands_bash_reads_alike_have_the_same_tokens(a, b):
    assert shell_tokens(a) == shell_tokens(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("cat unique.txt", "cat unique.txt#;echo 999 fake"),  # `#` inside a word is not a comment
        ("cat unique.txt", "cat unique.txt\\#;echo 999"),
        ("cat unique.txt", "cat unique.txt'#';echo 999"),
        ("cat unique.txt", 'cat unique.txt"#"x;echo 999'),
        ("find out -name '*.txt'", "find out -name *.txt"),  # a glob
        ("echo $HOME", "echo '$HOME'"),  # an expansion
        ("echo ${x/a  b/c}", "echo ${x/a b/c}"),  # spaces inside ${...} are the pattern's
        ("echo ~", "echo '~'"),
        ("a=1 env", "'a=1' env"),  # an assignment, then a command named a=1
        ("if true; then ls; fi", "'if' true; then ls; fi"),  # a reserved word
        ("ls && pwd", "ls '&&' pwd"),
        ("echo a 2>&1", "echo a 2 >&1"),  # a redirection's fd, then an argument
        ("ls &> f", "ls & > f"),
        ("((x = 1))", "( (x = 1) )"),
        ("[[ $a =~ a.c ]]", "[[ $a =~ 'a.c' ]]"),  # quoted, the regex's dot is literal
        ("cat <<EOF\n$HOME\nEOF", "cat <<'EOF'\n$HOME\nEOF"),  # a quoted delimiter: no expansion
    ],
)
def test_commands_bash_reads_differently_have_different_tokens(a, b):
    assert shell_tokens(a) != shell_tokens(b)


def render(tokens: list[tuple[str, str]]) -> str:
    """A command with `tokens`, written anew: words quoted, everything else as written."""
    command, glue = "", ""
    for kind, text in tokens:
        command += glue + ("'" + text.replace("'", "'\\''") + "'" if kind == "word" else text)
        glue = "" if kind == "io" or text in ("<<", "<<-") else " "
    return command


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.text(alphabet="ab1.*~=${},;#'\"\\ \n", max_size=16))
def test_a_command_written_anew_from_its_tokens_prints_what_it_printed(tmp_path_factory, soup):
    # printf shows every argument bash makes of the soup: equal tokens must mean equal arguments
    command = "printf '[%s]' " + soup
    # $$ (the process id) differs from run to run
    assume("$$" not in soup.replace("\\\n", "") and not syntax_error(command))
    if shell_tokens(render(shell_tokens(command))) != shell_tokens(command):
        pytest.fail(f"{command!r} rewritten reads differently: {render(shell_tokens(command))!r}")
    folder = tmp_path_factory.mktemp("soup")
    (folder / "a.txt").write_text("")
    outputs = [
        subprocess.run(
            ["bash", "--norc", "--noprofile", "-c", text],
            cwd=folder,
            capture_output=True,
            env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "b": "x y"},
            timeout=10,
        )
        for text in (command, render(shell_tokens(command)))
    ]
    assert (outputs[0].returncode, outputs[0].stdout) == (outputs[1].returncode, outputs[1].stdout), command


def test_expansions_nested_thousands_deep_are_compared_as_written():
    deep = "echo " + "$(" * 5000
    assert shell_tokens(deep) == [("rest", deep)]
    assert shell_tokens(deep + "x") != shell_tokens(deep)
