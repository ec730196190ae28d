"""Reading the next bash command out of an action, and the canonical action form.

Canonical form (what StrictVerifier compares, for the expert and for parsed actions alike): an
assistant message with no text and exactly one tool call `bash` whose arguments are
`{"command": "<command>"}`.

Accepted inputs:
- a tool call named bash / execute_bash / terminal / shell / run_command with a `command` (or
  `cmd`) argument, as a chat message, a Responses API `function_call` item, or Hermes
  `<tool_call>{"name": ..., "arguments": ...}</tool_call>` text;
- the NeMo-Gym Terminal-Bench agent's other tools, turned into the command they stand for:
  read_file {path} -> `cat -- PATH`, write_file {path, content} -> a printf into PATH,
  execute_code {code} -> `python3 -c CODE`;
- Terminus-style JSON text: `{"keystrokes": "ls\\n"}` or `{"commands": [{"keystrokes": ...}, ...]}`
  (complete lines, joined into one script);
- exactly one fenced ```bash (or sh, shell, console, or unlabelled) code block.
Anything else parses to no command, with a category: "no_command", "multiple_commands",
"unsupported_tool", "empty_command", "malformed_command" (bash -n rejects it), "invalid_command"
(a NUL byte or a lone surrogate: it cannot cross into the sandbox intact, see
`pivot_envs.sandboxes.protocol.command_problem`).

`text_beside` is what an action says beside its command (prose around the block, a message's
content): not part of the canonical form, it is handed to the verifier apart (`call_text`).

`shell_tokens` splits a command into tokens as bash reads it, for comparing commands by text.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pivot_envs.chat import assistant_message, parse_arguments, text_of, tool_call
from pivot_envs.env import ParsedAction
from pivot_envs.sandboxes.protocol import command_problem

COMMAND_TOOLS = ("bash", "execute_bash", "terminal", "shell", "run_command", "run_shell_command")
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run one bash command in the task's sandbox and return its output and exit code.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the bash command to run"}},
            "required": ["command"],
        },
    },
}
_FENCE = re.compile(r"```[ \t]*(bash|sh|shell|console|zsh)?[ \t]*\n(.*?)```", re.S)
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
# tmux-style keys a Terminus agent may send; a keystroke string made only of these is interactive.
SPECIAL_KEYS = re.compile(r"^(C-[a-z\\\]]|M-[a-z]|Enter|Escape|Tab|BSpace|Up|Down|Left|Right)$")


@dataclass
class Command:
    """A parsed command, or the reason there is none; `keys` marks interactive keystrokes (C-c ...)."""

    command: str | None
    category: str = "ok"
    detail: str = ""
    keys: bool = False


def canonical_message(command: str) -> dict[str, Any]:
    """The canonical assistant message for one bash command."""
    return assistant_message(None, [tool_call("bash", {"command": command}, "call_0")])


def command_of_message(message: dict[str, Any]) -> str | None:
    """The command of a canonical (or any parseable) assistant message, or None."""
    return parse_command(message).command


def parse_action(action: Any, check_syntax: bool = True) -> ParsedAction:
    """Parse a raw completion or message into the canonical form (a ParsedAction)."""
    found = parse_command(action)
    if found.command is None:
        return ParsedAction(None, found.category, found.detail)
    command = found.command.strip("\n")
    if not command.strip():
        return ParsedAction(None, "empty_command", "the action's command is empty")
    if check_syntax and not found.keys:
        problem = syntax_error(command)
        if problem:
            return ParsedAction(None, "malformed_command", f"bash -n rejects the command: {problem}")
    message = canonical_message(command)
    if found.keys:
        message["tool_calls"][0]["function"]["arguments"] = json.dumps({"command": command, "keys": True})
    return ParsedAction(message)


def syntax_error(command: str) -> str:
    """bash's syntax complaint about `command` ("" when it parses)."""
    try:
        result = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"could not check syntax: {error}"
    return result.stderr.strip().replace("bash: -c: ", "") if result.returncode else ""


def parse_command(action: Any) -> Command:
    """Find the one command in an action (see the module docstring for the accepted forms)."""
    found = _find_command(action)
    problem = command_problem(found.command) if found.command is not None else ""
    return Command(None, "invalid_command", problem) if problem else found


def _find_command(action: Any) -> Command:
    if isinstance(action, dict):
        if action.get("type") == "function_call":
            return _from_call(str(action.get("name", "")), action.get("arguments"))
        calls = action.get("tool_calls") or []
        if calls:
            if not isinstance(calls, list):
                return Command(None, "unparseable", f"tool_calls must be a list, got {type(calls).__name__}")
            if len(calls) > 1:
                return Command(
                    None, "multiple_commands", f"{len(calls)} tool calls; the action must be one command"
                )
            function = calls[0].get("function", calls[0]) if isinstance(calls[0], dict) else None
            if not isinstance(function, dict):
                return Command(None, "unparseable", "a tool call must be an object with a 'function' object")
            return _from_call(str(function.get("name", "")), function.get("arguments"))
        content = action.get("content")
        if isinstance(content, list):
            content = "".join(
                part["text"]
                for part in content
                if isinstance(part, dict) and isinstance(part.get("text"), str)
            )
        return _from_text(content if isinstance(content, str) else "")
    if isinstance(action, str):
        return _from_text(action)
    return Command(
        None, "unparseable", f"an action must be text or a message dict, got {type(action).__name__}"
    )


def _from_call(name: str, arguments: Any) -> Command:
    args, ok = parse_arguments(arguments)
    if not ok or not isinstance(args, dict):
        return Command(None, "malformed_arguments", f"tool {name!r}: arguments are not a JSON object")
    if name in COMMAND_TOOLS:
        command = args.get("command", args.get("cmd"))
        if not isinstance(command, str):
            return Command(None, "malformed_arguments", f"tool {name!r}: no string 'command' argument")
        return Command(command, keys=bool(args.get("keys")))
    if name == "read_file" and isinstance(args.get("path"), str):
        return Command(f"cat -- {shlex.quote(args['path'])}")
    if name == "write_file" and isinstance(args.get("path"), str) and isinstance(args.get("content"), str):
        return Command(f"printf '%s' {shlex.quote(args['content'])} > {shlex.quote(args['path'])}")
    if name == "execute_code" and isinstance(args.get("code"), str):
        return Command(f"python3 -c {shlex.quote(args['code'])}")
    return Command(None, "unsupported_tool", f"tool {name!r} is not a shell command")


def _from_text(text: str) -> Command:
    stripped = text.strip()
    if not stripped:
        return Command(None, "no_command", "the action is empty")
    hermes = _HERMES.findall(stripped)
    if hermes:
        if len(hermes) > 1:
            return Command(
                None, "multiple_commands", f"{len(hermes)} <tool_call> blocks; the action must be one command"
            )
        try:
            call = json.loads(hermes[0])
        except json.JSONDecodeError as error:
            return Command(None, "malformed_arguments", f"<tool_call> is not JSON: {error}")
        if not isinstance(call, dict):
            return Command(None, "malformed_arguments", "<tool_call> must hold a JSON object")
        return _from_call(str(call.get("name", "")), call.get("arguments", {}))
    if stripped.startswith("{"):
        terminus = _from_terminus(stripped)
        if terminus is not None:
            return terminus
    blocks = _FENCE.findall(stripped)
    if len(blocks) > 1:
        return Command(
            None, "multiple_commands", f"{len(blocks)} code blocks; the action must be one command"
        )
    if blocks:
        return Command(blocks[0][1])
    return Command(None, "no_command", "no command found: answer with one ```bash block or a bash tool call")


def _from_terminus(text: str) -> Command | None:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    if "keystrokes" in data:
        strokes = [data]
    elif isinstance(data.get("commands"), list):
        strokes = data["commands"]
    else:
        return None
    keys = [s.get("keystrokes") for s in strokes if isinstance(s, dict)]
    if not keys or not all(isinstance(k, str) for k in keys):
        return Command(None, "no_command", "Terminus JSON without keystrokes")
    if len(keys) == 1 and SPECIAL_KEYS.match(keys[0].strip()):
        return Command(keys[0].strip(), keys=True)
    if not all(k.endswith("\n") for k in keys):
        return Command(
            None, "incomplete_command", "keystrokes that do not end with a newline do not run a command"
        )
    return Command("".join(keys))


# -- the text beside the command ----------------------------------------------------------------------

_THINK = re.compile(r"<think>.*?</think>", re.S)


def text_beside(action: Any) -> str:
    """What an action says beside its command, which the canonical form drops and the functional verifier
    bounds (`call_text`): a message's content beside its tool call, or the completion text outside its
    `<tool_call>` block or ```bash block; in Terminus JSON, every string but the keystrokes (analysis,
    plan). Reasoning in `<think>...</think>` (or all before a lone `</think>`) is not counted; "" for a
    Responses API `function_call` item or an action of no text."""
    if isinstance(action, dict):
        if action.get("type") == "function_call":
            return ""
        content = text_of(action)
        if action.get("tool_calls"):
            return _without_think(content)
        action = content
    if not isinstance(action, str):
        return ""
    stripped = action.strip()
    if _HERMES.search(stripped):
        return _without_think(_HERMES.sub("", stripped))
    if stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict) and ("keystrokes" in data or isinstance(data.get("commands"), list)):
            return "\n".join(_strings_but_keystrokes(data))
    return _without_think(_FENCE.sub("", stripped, count=1))


def _without_think(text: str) -> str:
    text = _THINK.sub("", text)
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    return text.strip()


def _strings_but_keystrokes(value: Any) -> list[str]:
    """Every string in a JSON value but the values of "keystrokes" keys (walked without recursion)."""
    found, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            stack.extend(reversed([inner for key, inner in item.items() if key != "keystrokes"]))
    return found


# -- bash's tokens, for comparing commands by text -----------------------------------------------------

# Characters whose quoting never changes what a word means (quoting does change globs, $, ~, =, braces).
_PLAIN = frozenset("_./:,+@-")  # not %: a command word starting with % is a job
_METACHARACTERS = frozenset("|&;()<> \t\n")
# Longest first: bash reads the longest operator its characters spell.
_OPERATORS = (
    ";;&", "<<-", "<<<", "&>>",
    "&&", "||", ";;", ";&", "|&", "<<", ">>", "<&", ">&", "<>", ">|", "&>", "((", "))",
    "&", "|", ";", "(", ")", "<", ">", "\n",
)  # fmt: skip
_RESERVED = frozenset(
    "! [[ ]] { } case coproc do done elif else esac fi for function if in select then time until while".split()
)
_IO_NUMBER = re.compile(r"[0-9]+|\{[A-Za-z_][A-Za-z0-9_]*\}")
_SEPARATORS = (("op", ";"), ("op", "\n"))
# A process substitution is part of the word it is written in (`a<(ls)b` is one word).
_PROCESS_SUBSTITUTIONS = ("<(", ">(")
Token = tuple[str, str]


def shell_tokens(command: str) -> list[Token]:
    """`command` as bash splits it into tokens, for comparing commands by text.

    Tokens are ("op", operator), ("word", value), ("raw", text), ("io", fd) and ("rest", text). Two
    commands with equal tokens are read alike by bash. A word whose quoting cannot change its meaning
    (no unquoted $, `, glob, ~, =, brace, and not an unquoted reserved word) is ("word", its value
    without the quotes), so `'a.txt'` and `a.txt` are one token; any other word is ("raw", its text as
    written). `#` starts a comment only where bash starts one: unquoted, where a word would start
    (`a#b` is one word). The text after a here-document's `<<` is one "rest" token, the word after
    `=~` is raw, and a number or {name} directly before `<` or `>` is a redirection's fd ("io").
    Separators (`;`, newlines) at the start and the end are dropped.
    """
    return list(_shell_tokens(command))


@lru_cache(maxsize=4096)
def _shell_tokens(command: str) -> tuple[Token, ...]:
    # Cached: the expert's command is tokenized for every sample at its pivot.
    try:
        return _read_tokens(command)
    except RecursionError:  # expansions nested thousands deep: compare the command as written
        return (("rest", command),)


def _read_tokens(command: str) -> tuple[Token, ...]:
    tokens: list[Token] = []
    i, n = 0, len(command)
    while i < n:
        c = command[i]
        if c in " \t":
            i += 1
        elif command.startswith("\\\n", i):  # a line continuation joins the lines
            i += 2
        elif c == "#":  # where a word would start, bash reads a comment to the end of the line
            end = command.find("\n", i)
            i = n if end < 0 else end
        elif c in _METACHARACTERS and not command.startswith(_PROCESS_SUBSTITUTIONS, i):
            op = next(op for op in _OPERATORS if command.startswith(op, i))
            i += len(op)
            tokens.append(("op", op))
            if op in ("<<", "<<-"):  # a here-document's body is not read as words: compare it as written
                tokens.append(("rest", command[i:]))
                break
        else:
            start = i
            i, value, plain = _word(command, i)
            raw = command[start:i]
            if _IO_NUMBER.fullmatch(raw) and command[i : i + 1] in ("<", ">"):
                tokens.append(("io", raw))
            elif plain and raw not in _RESERVED and tokens[-1:] != [("raw", "=~")]:
                tokens.append(("word", value))
            else:
                tokens.append(("raw", raw))
    # Blank and comment lines are empty commands: a run of newlines reads as one.
    tokens = [t for k, t in enumerate(tokens) if t != ("op", "\n") or tokens[k - 1 : k] != [t]]
    while tokens and tokens[-1] in _SEPARATORS:
        tokens.pop()
    while tokens and tokens[0] in _SEPARATORS:
        tokens.pop(0)
    return tuple(tokens)


def _word(command: str, i: int) -> tuple[int, str, bool]:
    """The word starting at `i`: (where it ends, its value without quotes, whether quoting cannot change it)."""
    value: list[str] = []
    plain = True
    n = len(command)
    while i < n and (command[i] not in _METACHARACTERS or command.startswith(_PROCESS_SUBSTITUTIONS, i)):
        c = command[i]
        if command.startswith("\\\n", i):
            i += 2
        elif c == "\\":
            value.append(command[i + 1 : i + 2] or "\\")
            i += 2
        elif c == "'":
            end = command.find("'", i + 1)
            if end < 0:  # unterminated: bash rejects it; compare the rest as written
                return n, command[i:], False
            value.append(command[i + 1 : end])
            i = end + 1
        elif c == '"':
            i, text, active = _double_quoted(command, i)
            value.append(text)
            plain = plain and not active
        elif c in "$`<>":
            i = _expansion_end(command, i)
            plain = False
        else:
            plain = plain and (c.isalnum() or c in _PLAIN)
            value.append(c)
            i += 1
    return i, "".join(value), plain


def _double_quoted(command: str, i: int) -> tuple[int, str, bool]:
    """The "..." at `i`: (where it ends, its value, whether it holds an expansion)."""
    value: list[str] = []
    active = False
    i += 1
    n = len(command)
    while i < n and command[i] != '"':
        c = command[i]
        if c == "\\" and command[i + 1 : i + 2] in ("$", "`", '"', "\\", "\n"):
            value.append(command[i + 1] if command[i + 1] != "\n" else "")
            i += 2
        elif c in "$`":
            i = _expansion_end(command, i)
            active = True
        else:
            value.append(c)
            i += 1
    return (i + 1, "".join(value), active) if i < n else (n, "".join(value), True)


def _expansion_end(command: str, i: int) -> int:
    """Where the expansion at `i` ends: `...`, $(...), $((...)), ${...}, $'...', <(...), >(...) or a lone $."""
    n = len(command)
    if command[i] == "`":
        j = i + 1
        while j < n and command[j] != "`":
            j += 2 if command[j] == "\\" else 1
        return min(j + 1, n)
    follow = command[i + 1 : i + 2]
    if follow == "'":  # ANSI-C quoting: backslash escapes inside
        j = i + 2
        while j < n and command[j] != "'":
            j += 2 if command[j] == "\\" else 1
        return min(j + 1, n)
    if follow not in ("(", "{"):
        return i + 1
    close = ")" if follow == "(" else "}"
    depth, j = 0, i + 1
    while j < n:
        c = command[j]
        if c == "\\":
            j += 2
            continue
        if c == "'" and follow == "(":
            end = command.find("'", j + 1)
            j = n if end < 0 else end + 1
            continue
        if c == '"':
            j = _double_quoted(command, j)[0]
            continue
        if c in "$`" and j > i + 1:
            j = _expansion_end(command, j)
            continue
        depth += c == follow
        depth -= c == close
        j += 1
        if depth == 0:
            return j
    return n
