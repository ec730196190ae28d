"""The coding agent's tools, executed for real in a sandbox: `bash`, `str_replace_editor`, `submit`.

The schemas follow the OpenHands / SWE-agent contract (`default_tools()`); `execute_call` runs one
call in a sandbox and returns a ToolResult: the tool message the agent sees, the action's kind,
an error category when the call was bad, the exit code, and the workspace manifest after it.

- `bash(command)`: under the `persistent` harness (OpenHands) one shell session across calls, so
  the working directory and exported variables persist (the sandbox runner keeps them); under
  `fresh` (mini-swe-agent) every call is a new `bash -c` started in the repository, so nothing a
  call changes in the shell outlives it.
- `str_replace_editor(command, path, ...)`: view / create / str_replace / insert / undo_edit, run
  inside the sandbox by a small Python program (editor_script.py), so it obeys the sandbox's
  limits on both backends. The program is installed in the sandbox once (`install_editor`; a
  sandbox without it gets it on its first editor call) and each call sends only its arguments;
  the editor writes the file in place and prints only the text the agent sees. Its history, for
  undo_edit, is kept outside the repository and forks with the sandbox. Paths outside the
  repository are refused ("outside_repo").
- `submit()`: ends the episode; the tool message is the repository's diff.

A bad call is never an exception: it is a ToolResult with `error` set ("invalid_arguments",
"unknown_tool", "unknown_command", "old_str_not_found", "old_str_not_unique", "outside_repo",
"too_large", "timeout", ...). Only a sandbox that fails raises (SandboxError).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pivot_envs.chat import parse_arguments
from pivot_envs.errors import UnknownNameError
from pivot_envs.sandboxes import SandboxError
from pivot_envs.sandboxes.protocol import command_problem

HARNESSES = ("persistent", "fresh")
KINDS = ("search", "view", "edit", "run", "test", "submit", "other")
# Arguments larger than this are refused ("too_large"): a call crosses into the sandbox as one
# command, and a single argument of a process may not exceed 128 KiB (Linux MAX_ARG_STRLEN).
MAX_ARGUMENT_BYTES = 80_000
# Tool names other harnesses use for the same tools.
ALIASES = {
    "execute_bash": "bash",
    "run_bash": "bash",
    "shell": "bash",
    "terminal": "bash",
    "run_command": "bash",
    "file_editor": "str_replace_editor",
    "text_editor": "str_replace_editor",
    "edit_file": "str_replace_editor",
    "finish": "submit",
}
EDITOR_SOURCE = (Path(__file__).parent / "editor_script.py").read_text()
# Where `install_editor` puts the editor in a sandbox, so its bytecode is compiled once per start
# state instead of on every call (~10 ms of a ~40 ms call).
EDITOR_HOME = "/.pivot/editor-module"
_RUN_INSTALLED = f"import sys; sys.path[:0] = [{EDITOR_HOME!r}]; import swe_editor; swe_editor.main()"
# What an editor call prints, with exit status EDITOR_MISSING_STATUS, in a sandbox without the editor.
EDITOR_MISSING = "PIVOT_EDITOR_MISSING"
EDITOR_MISSING_STATUS = 97
# Where a warm editor (see `EDITOR_WARM_UP`) waits for its one request: FIFOs `in` and `done`, its PID.
EDITOR_WARM = "/.pivot/editor-warm"
_SERVE = f"import sys; sys.path[:0] = [{EDITOR_HOME!r}]; import swe_editor; swe_editor.serve({EDITOR_WARM!r})"
# Run in a fork made ahead (the backend's warm pool) where the editor is installed: starts the
# editor and leaves it waiting, so the fork's editor call skips Python's start-up (~15-30 ms).
EDITOR_WARM_UP = (
    f"[ -f {EDITOR_HOME}/swe_editor.py ] && rm -rf {EDITOR_WARM} && mkdir -p {EDITOR_WARM}"
    f" && mkfifo {EDITOR_WARM}/in {EDITOR_WARM}/done"
    f" && {{ python3 -I -S -c {shlex.quote(_SERVE)} </dev/null >/dev/null 2>&1 & echo $! > {EDITOR_WARM}/pid; }}"
)

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command in the repository's sandbox (no network) and return its output and exit code.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the bash command to run"}},
            "required": ["command"],
        },
    },
}
EDITOR_TOOL = {
    "type": "function",
    "function": {
        "name": "str_replace_editor",
        "description": (
            "View, create and edit files. `view` shows a file with line numbers (`cat -n`), or a directory two "
            "levels deep; `create` writes a new file (never an existing one); `str_replace` replaces old_str, which "
            "must occur exactly once, with new_str; `insert` adds new_str after line insert_line; `undo_edit` reverts "
            "the last edit of the file. Paths are absolute."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "command": {
                    "type": "string",
                    "enum": ["view", "create", "str_replace", "insert", "undo_edit"],
                    "description": "the editor command",
                },
                "path": {
                    "type": "string",
                    "description": "absolute path of a file or directory in the repository",
                },
                "file_text": {"type": "string", "description": "content of the file to create (create)"},
                "old_str": {"type": "string", "description": "the exact text to replace (str_replace)"},
                "new_str": {
                    "type": "string",
                    "description": "the replacement (str_replace) or the text to insert (insert)",
                },
                "insert_line": {
                    "type": "integer",
                    "description": "insert new_str after this line; 0 inserts at the top",
                },
                "view_range": {
                    "type": "array",
                    "items": {"type": "integer"},
                    "description": "[first, last] lines to view; last -1 means to the end",
                },
            },
            "required": ["command", "path"],
        },
    },
}
SUBMIT_TOOL = {
    "type": "function",
    "function": {
        "name": "submit",
        "description": "Submit the repository's current changes as the fix and end the task.",
        "parameters": {"type": "object", "properties": {}},
    },
}


def default_tools() -> list[dict]:
    """The OpenAI function schemas of bash, str_replace_editor and submit (a new list each call)."""
    return json.loads(json.dumps([BASH_TOOL, EDITOR_TOOL, SUBMIT_TOOL]))


@dataclass(frozen=True)
class ToolResult:
    """What one tool call produced.

    text:      the tool message the agent sees (OpenHands' texts for editor misuse).
    kind:      "search" | "view" | "edit" | "run" | "test" | "submit" | "other" (see `action_kind`).
    error:     a category when the call was bad (None when it ran); a command that exits non-zero
               is not an error, a command that hits the time limit is ("timeout").
    exit_code: the command's exit status (bash and submit; 0 or 1 for the editor).
    files:     the workspace manifest after the call ({path: "type mode digest"}), when asked; None
               for an editor view (it writes nothing: reading the manifest would cost ~40% of the call).
    output:    the raw output (bash: stdout and stderr; editor: the text), for effect comparison.
    """

    text: str
    kind: str
    error: str | None = None
    exit_code: int | None = None
    files: dict[str, str] | None = None
    output: str = ""


def canonical_name(name: str) -> str:
    """The tool's name in this harness (`execute_bash` -> `bash`, `finish` -> `submit`, ...)."""
    return ALIASES.get(name, name)


# -- kinds ---------------------------------------------------------------------------------------

_QUOTED = re.compile(r"'[^']*'|\"(?:\\.|[^\"\\])*\"")
_SEGMENTS = re.compile(r"&&|\|\||[;|\n]")
_REDIRECT = re.compile(r"(?:^|[^0-9&>])>>?\s*([^\s&>;|]+)")
_TEST = re.compile(
    r"^(?:python[0-9.]*\s+(?:-\S+\s+)*-m\s+(?:unittest|pytest)|pytest|py\.test|tox|nox"
    r"|python[0-9.]*\s+\S*(?:runtests|run_tests)\S*|make\s+(?:test|check))\b"
)
_SEARCH = {"grep", "egrep", "fgrep", "rg", "ag", "ack", "find", "ls", "tree", "locate", "fd", "rgrep"}
_VIEW = {"cat", "head", "tail", "less", "more", "nl", "wc", "diff", "file", "stat", "bat"}
_EDIT = {"patch", "tee", "mv", "cp", "rm", "touch", "mkdir", "rmdir", "chmod", "ln", "truncate", "dd"}
_RUN = {"python", "python3", "node", "bash", "sh", "make", "pip", "pip3"}


def bash_kind(command: str) -> str:
    """The kind of a bash command, from its words (quoted strings left out).

    test: `python -m unittest|pytest`, `pytest`, `tox`, `make test`, ...; edit: `sed -i`,
    `perl -i`, `git apply|checkout|stash`, `patch`, `mv`/`cp`/`rm`/..., or output redirected into
    a file; search: `grep`, `rg`, `find`, `ls`, `git grep|ls-files`, ...; view: `cat`, `head`,
    `tail`, `sed -n`, `awk`, `git diff|show|log|status`, ...; run: other `python`, `bash`, `make`
    runs; anything else "other". A compound command takes the first of test, edit, search, view,
    run that any of its parts is (`cd` and variable assignments are skipped).
    """
    bare = _QUOTED.sub("''", command)
    found = set()
    for match in _REDIRECT.finditer(bare):
        if not match.group(1).startswith("/dev/"):
            found.add("edit")
    for segment in _SEGMENTS.split(bare):
        words = segment.strip().split()
        while words and (
            "=" in words[0] and not words[0].startswith("-") or words[0] in ("sudo", "time", "env", "nohup")
        ):
            words = words[1:]
        if not words or words[0] == "cd":
            continue
        word, rest = words[0].rsplit("/", 1)[-1], words[1:]
        text = " ".join([word, *rest])
        if _TEST.match(text):
            found.add("test")
        elif word in ("sed", "perl") and any(
            w.startswith("-i") or (w.startswith("-") and "i" in w[1:] and word == "perl") for w in rest
        ):
            found.add("edit")
        elif word == "git" and rest:
            sub = rest[0]
            found.add(
                "search"
                if sub in ("grep", "ls-files")
                else "view"
                if sub in ("diff", "show", "log", "status", "blame")
                else "edit"
                if sub in ("apply", "checkout", "restore", "stash", "reset", "am", "mv", "rm")
                else "other"
            )
        elif word in _SEARCH:
            found.add("search")
        elif word in _EDIT:
            found.add("edit")
        elif word in _VIEW or word in ("sed", "awk"):
            found.add("view")
        elif word in _RUN:
            found.add("run")
    for kind in ("test", "edit", "search", "view", "run"):
        if kind in found:
            return kind
    return "other"


def action_kind(name: str, arguments: Any) -> str:
    """The kind of one tool call, from its tool and arguments (no execution).

    bash: `bash_kind` of its command; str_replace_editor: view -> "view", create / str_replace /
    insert / undo_edit -> "edit"; submit -> "submit"; anything else "other".
    """
    name = canonical_name(name)
    args = arguments if isinstance(arguments, dict) else {}
    if name == "bash":
        command = args.get("command", args.get("cmd"))
        return bash_kind(command) if isinstance(command, str) else "other"
    if name == "str_replace_editor":
        command = args.get("command")
        return (
            "view"
            if command == "view"
            else "edit"
            if command in ("create", "str_replace", "insert", "undo_edit")
            else "other"
        )
    return "submit" if name == "submit" else "other"


# -- execution -----------------------------------------------------------------------------------

# The workspace as git sees it (every file, tracked or not, .gitignore obeyed), staged into a
# temporary index so the repository's own index, and what `git diff` shows, stay as they were.
_STAGED = (
    "cd -- {workdir} && cp .git/index /tmp/.pivot-index 2>/dev/null;"
    " GIT_INDEX_FILE=/tmp/.pivot-index git add -A >/dev/null 2>&1 && GIT_INDEX_FILE=/tmp/.pivot-index"
)


def tree_hash_command(workdir: str = "/repo") -> str:
    """The bash command that prints the workspace's git tree hash (see `tree_hash`)."""
    return f"({_STAGED.format(workdir=shlex.quote(workdir))} git write-tree; rc=$?; rm -f /tmp/.pivot-index; exit $rc)"


def diff_command(workdir: str = "/repo", base: str = "HEAD", context: int = 3) -> str:
    """The bash command that prints the workspace's diff against `base` (a commit or tree), new files included."""
    diff = f"git -c core.quotepath=off diff --cached --no-color --no-ext-diff -U{int(context)} {shlex.quote(base)}"
    return (
        f"({_STAGED.format(workdir=shlex.quote(workdir))} {diff}; rc=$?; rm -f /tmp/.pivot-index; exit $rc)"
    )


def tree_hash(sandbox: Any, workdir: str = "/repo") -> str:
    """The git tree hash of the workspace as it is, which a pivot records as `context["tree_hash"]`;
    raises SandboxError when the workspace is not a git repository."""
    result = sandbox.run(tree_hash_command(workdir))
    digest = result.output.strip()
    if not result.ok or not re.fullmatch(r"[0-9a-f]{40,64}", digest):
        raise SandboxError(
            f"could not hash the tree of {workdir} (exit {result.exit_code}): {result.output[-300:]}"
        )
    return digest


def _refused(kind: str, error: str, text: str) -> ToolResult:
    return ToolResult(text=text, kind=kind, error=error, output=text)


def _too_large(arguments: dict[str, Any]) -> str:
    size = len(json.dumps(arguments, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if size > MAX_ARGUMENT_BYTES:
        return f"The call's arguments are {size} bytes; at most {MAX_ARGUMENT_BYTES} bytes can be sent to a tool."
    return ""


def execute_call(
    sandbox: Any,
    name: str,
    arguments: Any,
    *,
    harness: str = "persistent",
    workdir: str = "/repo",
    timeout: float | None = None,
    files: bool = True,
) -> ToolResult:
    """Run one tool call in `sandbox` and return its ToolResult (see the module docstring).

    arguments: a dict or its JSON text (invalid JSON -> error "invalid_arguments").
    harness:   "persistent" or "fresh" (how bash runs, see the module docstring).
    timeout:   seconds for the call (the sandbox's limit when None).
    files:     return the workspace manifest after the call.
    Raises SandboxError only when the sandbox itself fails.
    """
    if harness not in HARNESSES:
        raise UnknownNameError("harness", harness, HARNESSES)
    tool = canonical_name(str(name))
    args, ok = parse_arguments(arguments)
    kind = action_kind(tool, args if ok else {})
    if not ok or not isinstance(args, dict):
        return _refused(
            kind,
            "invalid_arguments",
            f"The arguments of {name} are not a JSON object: {str(arguments)[:200]}",
        )
    too_large = _too_large(args)
    if too_large:
        return _refused(kind, "too_large", too_large)
    if tool == "bash":
        return _bash(sandbox, args, harness, workdir, timeout, files, kind)
    if tool == "str_replace_editor":
        return _editor(sandbox, args, workdir, timeout, files, kind)
    if tool == "submit":
        return _submit(sandbox, workdir, timeout, files)
    return _refused(
        "other", "unknown_tool", f"Unknown tool {name!r}: the tools are bash, str_replace_editor and submit."
    )


def _bash(
    sandbox: Any,
    args: dict[str, Any],
    harness: str,
    workdir: str,
    timeout: float | None,
    files: bool,
    kind: str,
) -> ToolResult:
    command = args.get("command", args.get("cmd"))
    if not isinstance(command, str) or not command.strip():
        return _refused(
            kind, "invalid_arguments", "Parameter `command` is required for bash: a non-empty string."
        )
    problem = command_problem(command)
    if problem:
        return _refused(kind, "invalid_arguments", f"The command cannot be run: {problem}.")
    # fresh: a child shell per call, started in the repository; the session's own state never changes.
    line = (
        command
        if harness == "persistent"
        else f"cd -- {shlex.quote(workdir)} && bash -c {shlex.quote(command)}"
    )
    result = sandbox.run(line, timeout=timeout, files=files)
    output = result.output
    if harness == "persistent":
        note = (
            f"[The command timed out after {result.seconds:.0f} seconds and was killed.]"
            if result.timed_out
            else f"[The command completed with exit code {result.exit_code}.]"
        )
        separator = "" if not output or output.endswith("\n") else "\n"
        text = output + separator + note
    elif result.timed_out:
        text = (
            f"The last command <command>{command[:500]}</command> timed out and has been killed.\n"
            f"The output of the command was:\n<output>\n{output}</output>\nPlease try another command."
        )
    else:
        text = f"<returncode>{result.exit_code}</returncode>\n<output>\n{output}</output>"
    return ToolResult(
        text=text,
        kind=kind,
        error="timeout" if result.timed_out else None,
        exit_code=result.exit_code,
        files=result.files,
        output=output,
    )


def install_editor(sandbox: Any) -> None:
    """Put the editor into the sandbox (outside the workspace) with its bytecode compiled, so later
    calls skip compiling it; forks of the sandbox inherit it. Raises SandboxError when that fails."""
    # A quoted heredoc: the source crosses as it is; importing it once writes its .pyc beside it.
    line = (
        f"mkdir -p {EDITOR_HOME} && cat > {EDITOR_HOME}/swe_editor.py <<'PIVOT_EDITOR_SOURCE'\n{EDITOR_SOURCE}"
        f"PIVOT_EDITOR_SOURCE\npython3 -I -S -c {shlex.quote(f'import sys; sys.path[:0] = [{EDITOR_HOME!r}]; import swe_editor')}"
    )
    result = sandbox.run(line)
    if not result.ok:
        raise SandboxError(
            f"installing the editor in the sandbox failed (exit {result.exit_code}): {result.output[-300:]}"
        )


# True when the process $__pivot_pid can still answer: it runs or sleeps (not stopped, not a
# zombie, not gone: no status file counts nothing) and no signal is pending for it. The last
# matters: kill returns once a signal is queued, and a killed editor keeps its fds and its state
# until it runs again to exit; for that while, only its pending signal (SIGKILL, or any fatal one,
# queued for the whole process until it is reaped) tells it will never read. Builtins only.
_WARM_EDITOR_LIVE = (
    "{ __pivot_live=0; while read -r __pivot_key __pivot_value __pivot_rest;"
    ' do case "$__pivot_key$__pivot_value" in'
    " State:S|State:R|SigPnd:0000000000000000|ShdPnd:0000000000000000) __pivot_live=$((__pivot_live + 1));;"
    ' esac; done 2>/dev/null < "/proc/$__pivot_pid/status"; [ "$__pivot_live" = 3 ]; }'
)


def _output_limit(sandbox: Any) -> int:
    """Bytes of text the editor may print: under the sandbox's output limit, so nothing is cut."""
    limits = getattr(getattr(sandbox, "owner", None), "limits", None)
    return max(1024, limits.output_bytes - 512) if limits is not None else 15_000


def _editor(
    sandbox: Any, args: dict[str, Any], workdir: str, timeout: float | None, files: bool, kind: str
) -> ToolResult:
    limit = _output_limit(sandbox)
    # A Python literal the editor evaluates (see editor_script.py); repr escapes every control character.
    request = repr({"arguments": args, "workdir": workdir, "max_bytes": limit})
    # A warm editor when one waits (see EDITOR_WARM_UP), else the installed editor (see
    # install_editor); the call carries no editor source. A sandbox without the editor says so and
    # gets it installed, then the call runs again (once per sandbox). The warm editor is used only
    # when it is alive and will read: builtins only, no process started, so its FIFO is never
    # opened for one that would not (the call would wait out its timeout). See _WARM_EDITOR_LIVE.
    line = (
        f"if [ -p {EDITOR_WARM}/in ] && read -r __pivot_pid 2>/dev/null < {EDITOR_WARM}/pid"
        f" && {_WARM_EDITOR_LIVE}; then IFS= read -r -d '' __pivot_request;"
        f' printf \'%s\\n%s\' "$BASHPID" "$__pivot_request" > {EDITOR_WARM}/in'
        f' && read -r __pivot_status < {EDITOR_WARM}/done && [ "$__pivot_status" = 0 ];'
        f" elif [ -f {EDITOR_HOME}/swe_editor.py ]; then python3 -I -S -c {shlex.quote(_RUN_INSTALLED)};"
        f" else echo {EDITOR_MISSING}; (exit {EDITOR_MISSING_STATUS}); fi <<'PIVOT_EDITOR_ARGS'\n{request}\nPIVOT_EDITOR_ARGS"
    )
    files = files and args.get("command") != "view"
    result = sandbox.run(line, timeout=timeout, files=files)
    if result.exit_code == EDITOR_MISSING_STATUS and result.output == f"{EDITOR_MISSING}\n":
        try:
            install_editor(sandbox)
        except SandboxError:  # e.g. its directory made unwritable: the source crosses with the call
            line = f"python3 -I -S -c {shlex.quote(EDITOR_SOURCE)} <<'PIVOT_EDITOR_ARGS'\n{request}\nPIVOT_EDITOR_ARGS"
        result = sandbox.run(line, timeout=timeout, files=files)
    if result.exit_code == 127 and "python3" in result.output:
        raise SandboxError("the sandbox has no python3: str_replace_editor runs in it")
    category, _, text = result.output.partition("\n")
    if result.timed_out:
        return ToolResult(
            text="The editor timed out and was killed.",
            kind=kind,
            error="timeout",
            exit_code=result.exit_code,
            files=result.files,
            output="",
        )
    if result.exit_code != 0 or not re.fullmatch(r"[a-z_]+", category):
        # The editor itself died (memory limit, a process limit): the call's doing, shown as such.
        text = f"The editor failed (exit code {result.exit_code}): {result.output[-500:]}"
        return ToolResult(
            text=text,
            kind=kind,
            error="editor_failed",
            exit_code=result.exit_code,
            files=result.files,
            output=text,
        )
    return ToolResult(
        text=text,
        kind=kind,
        error=None if category == "ok" else category,
        exit_code=0 if category == "ok" else 1,
        files=result.files,
        output=text,
    )


def _submit(sandbox: Any, workdir: str, timeout: float | None, files: bool) -> ToolResult:
    result = sandbox.run(diff_command(workdir), timeout=timeout, files=files)
    text = (
        "Submitted. The changes:\n" + result.output
        if result.output.strip()
        else "Submitted, with no changes."
    )
    return ToolResult(
        text=text,
        kind="submit",
        error="timeout" if result.timed_out else None,
        exit_code=result.exit_code,
        files=result.files,
        output=result.output,
    )
