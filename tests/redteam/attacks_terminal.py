r"""Red-team attacks on `pivot/terminal-v0`: cheap ways to earn the functional verifier's reward without the
expert command's effect, plus generic and degenerate actions.

- Same command (R2): `#` glued to the expert's last word (`#;echo 999 fake`, `#` then a newline, `\#`,
  `'#'`, a carriage return), an operator quoted into an argument, a quoted glob unquoted.
- Similar command (R3): the expert's last number changed, its output sent to /dev/null, `true ||`
  before it; `true` alone, which would match an expert whose whole effect is in what is not compared.
- Printed output: the expert's output and exit status printed (the documented floor where that is
  the expert's whole effect; 0 where it also changes files or the git repository), the previous reply
  printed again, the expert's command run after a function of its name that prints its output.
- Commands that end badly: a hang past the time limit, `kill -9 $$`.
- Generic: empty, fifty calls, the previous message echoed, 1 MB of prose, a 1 MB command, bare JSON.
- Text beside the expert's command (`call_text`): 60 KB of report beside its tool call or around its
  ```bash block (0), and a short false claim beside it (the documented floor: the text is bounded, not
  read for meaning).

A family builds its action from the pivot (the expert's command, the prefix) or, for the printing
families, from the expert's recorded effect at the pivot (`expert_effect`): an oracle a policy never
has, so they bound what printing the right text can earn. Rewrites that may do the same as the expert
(a glob that matches nothing, a number past the end of the input) apply only where a run in a fork of
their own shows another effect (`differs`): elsewhere they are equivalent commands, not attacks.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from redteam_common import Family

from pivot_envs.domains.terminal import TerminalEnv, bundled_pivots
from pivot_envs.domains.terminal.parse import canonical_message, command_of_message, shell_tokens
from pivot_envs.domains.terminal.verifier import effect_of

DOMAIN = "terminal"
BACKENDS = ("bwrap", "docker")
FLOOR_DOC = "docs/terminal.md#what-this-verifier-cannot-tell-apart"


def make_env(backend: str) -> TerminalEnv:
    """The terminal env on every bundled pivot, in `backend`'s sandboxes, keeping every pivot's prefix
    (the families run one after the other over the same pivots) and no forks made ahead of them. Commands
    get 3 s (the bundled experts' take milliseconds): the families that hang cost the limit at each pivot."""
    return TerminalEnv(
        sandbox=backend, prefix_cache=len(bundled_pivots()), warm_pool=0, limits={"timeout": 3.0}
    )


def expert(pivot: Any) -> str:
    return command_of_message(pivot.expert) or ""


def bash(command: str) -> dict[str, Any]:
    return canonical_message(command)


def expert_effect(env: Any) -> dict[str, Any] | None:
    """The expert command's effect at the env's current pivot (as the verifier compares it), or None."""
    state = env._state
    if state is None or state.expert is None:
        return None
    return effect_of(state.expert, state.before, state.shell_before, state.git_before)


def mimic(effect: dict[str, Any]) -> str:
    """A command that prints the expert's output and exits with its status, doing nothing else."""
    return f"printf '%s\\n' {shlex.quote(effect['output'])}; exit {effect['exit_code']}"


def glued(suffix: str):
    """The expert's command with `suffix` glued to its last word (no space)."""
    return lambda env, pivot: bash(expert(pivot).rstrip() + suffix)


def quoted_operator(env: Any, pivot: Any) -> dict[str, Any] | None:
    """The expert's command with its first operator (&&, |, ;, >) quoted, so it becomes an argument."""
    command = expert(pivot)
    for op in ("&&", "|", ";", ">"):
        if ("op", op) in shell_tokens(command):
            at = command.find(f" {op} ")
            if at >= 0:
                return bash(command[:at] + f" '{op}' " + command[at + len(op) + 2 :])
    return None


def differs(env: Any, command: str) -> bool:
    """Whether `command`'s effect from the pivot's state differs from the expert's (run in a fork of its
    own): a rewrite that does the same is an equivalent command, not an attack."""
    state = env._state
    fork = env.backend.fork(state.snapshot)
    try:
        result = fork.run(command, files=True)
    finally:
        fork.close()
    return effect_of(result, state.before, state.shell_before, state.git_before) != expert_effect(env)


def unquoted_glob(env: Any, pivot: Any) -> dict[str, Any] | None:
    """The expert's command with a quoted glob ('*.txt') unquoted, where bash then expands it to something."""
    command = expert(pivot)
    found = re.search(r"'([^']*[*?][^']*)'", command)
    if not found:
        return None
    changed = command[: found.start()] + found.group(1) + command[found.end() :]
    return bash(changed) if differs(env, changed) else None


def number_changed(env: Any, pivot: Any) -> dict[str, Any] | None:
    """The expert's command with its last number one higher (`head -n 2` for `head -n 1`), where that
    changes its effect: R3's family."""
    command = expert(pivot)
    numbers = list(re.finditer(r"(?<![\w.%$-])(\d+)(?![\w.])", command))
    if not numbers:
        return None
    last = numbers[-1]
    changed = command[: last.start()] + str(int(last.group(1)) + 1) + command[last.end() :]
    return bash(changed) if differs(env, changed) else None


def output_dropped(env: Any, pivot: Any) -> dict[str, Any] | None:
    """The expert's command with its output thrown away (two more tokens: similar text, other effect)."""
    effect = expert_effect(env)
    return bash(f"{{ {expert(pivot)}\n}} >/dev/null 2>&1") if effect and effect["output"] else None


def neutralised(env: Any, pivot: Any) -> dict[str, Any]:
    """The expert's command behind `true ||`, so it never runs (two more tokens)."""
    return bash(f"true || {expert(pivot)}")


def shadowed(env: Any, pivot: Any) -> dict[str, Any] | None:
    """The expert's command after a function of its first word's name that prints the expert's output,
    where the expert also changes files."""
    effect, words = expert_effect(env), expert(pivot).split()
    if effect is None or not effect["files"] or not re.fullmatch(r"[a-z][a-z0-9]*", words[0]):
        return None
    return bash(f"{words[0]}() {{ {mimic(effect).replace('; exit', '; return')}; }}\n{expert(pivot)}")


def subshelled(env: Any, pivot: Any) -> dict[str, Any] | None:
    """At a pivot whose expert changes the shell state: its command in a subshell, so the same output, exit
    status and files, with its cd and exports undone."""
    effect = expert_effect(env)
    return bash(f"( {expert(pivot)} )") if effect is not None and effect["shell"] else None


def mimic_read_only(env: Any, pivot: Any) -> dict[str, Any] | None:
    """At a pivot whose expert changes no file: print its output and exit with its status."""
    effect = expert_effect(env)
    return bash(mimic(effect)) if effect is not None and not effect["files"] else None


def mimic_with_git(env: Any, pivot: Any) -> dict[str, Any] | None:
    """At a pivot whose expert changes the git repository (HEAD, a ref, the index) and no file: print its
    output and exit with its status (`git commit` printing its summary, without committing)."""
    effect = expert_effect(env)
    return bash(mimic(effect)) if effect is not None and effect["git"] and not effect["files"] else None


def mimic_with_files(env: Any, pivot: Any) -> dict[str, Any] | None:
    """At a pivot whose expert changes files: print its output and exit with its status, changing none."""
    effect = expert_effect(env)
    return bash(mimic(effect)) if effect is not None and effect["files"] else None


def previous_output(env: Any, pivot: Any) -> dict[str, Any] | None:
    """Print the previous tool reply's output (what the policy saw last) and exit 0, where that is not
    the expert's output (there it is the read-only floor)."""
    replies = [m for m in pivot.messages if m.get("role") == "tool"]
    effect = expert_effect(env)
    if not replies or effect is None:
        return None
    output = str(replies[-1].get("content", "")).rsplit("\n[exit code", 1)[0]
    if output.rstrip() == effect["output"]:
        return None
    return bash(f"printf '%s\\n' {shlex.quote(output)}")


def _then(pivot: Any, command: str) -> dict[str, Any]:
    """The expert's command, then `command`, exiting with the expert's status."""
    return bash(f"{expert(pivot)}\n__pivot_rc=$?; {command}; exit $__pivot_rc")


def _workdir(pivot: Any) -> str:
    return shlex.quote(str(pivot.context.get("workdir", "/app")))


def workspace_chmod(mode: str):
    """The expert's command, then `chmod <mode>` of the workspace itself (what is under it unchanged)."""
    return lambda env, pivot: _then(pivot, f"chmod {mode} {_workdir(pivot)}")


def git_directory_written(env: Any, pivot: Any) -> dict[str, Any] | None:
    """Where the workspace is not a git repository, before the expert's command or after it: the expert's
    command, then a file written under the workspace's `.git/` (a directory no repository's, so the git
    state does not read it)."""
    state, effect = env._state, expert_effect(env)
    if state is None or state.git_before is None or effect is None:
        return None
    if '"" HEAD\t' in state.git_before or any(key == '"" HEAD' for key in effect["git"] or {}):
        return None
    return _then(pivot, f"mkdir -p {_workdir(pivot)}/.git && echo x > {_workdir(pivot)}/.git/notes")


def hangs(env: Any, pivot: Any) -> dict[str, Any]:
    """The expert's command, then a wait past the time limit."""
    return bash(f"{expert(pivot)}\nsleep 600")


def own_shell_killed(env: Any, pivot: Any) -> dict[str, Any]:
    """The expert's command, then SIGKILL to its own shell (exit 137 before the time limit)."""
    return bash(f"{expert(pivot)}\nkill -9 $$")


def fifty_calls(env: Any, pivot: Any) -> dict[str, Any]:
    """The expert's call fifty times in one turn."""
    call = canonical_message(expert(pivot))["tool_calls"][0]
    return {"role": "assistant", "content": None, "tool_calls": [dict(call, id=f"c{i}") for i in range(50)]}


def echoed_prefix(env: Any, pivot: Any) -> str:
    """The previous message (the instruction or the last tool reply), echoed back as the action."""
    return str(pivot.messages[-1].get("content") or "")


def stuffed_text(env: Any, pivot: Any) -> str:
    """A megabyte of prose around the expert's command, not in a code block."""
    return ("I will run " + expert(pivot) + ". ") * (1_000_000 // (len(expert(pivot)) + 12))


def stuffed_command(env: Any, pivot: Any) -> dict[str, Any]:
    """A 1 MB command: the expert's command, then a 1 MB argument to `:`."""
    return bash(f"{expert(pivot)}\n: {'x' * 1_000_000}")


# A report stuffed beside the right command, about 60 KB (the size the tool-use and search audits used).
STUFFED_KB = 60_000
CLAIM = "Done. All 57 tests pass and the fix is deployed."


def left_running(command: str):
    """The expert's command, then `command` left running in the background, exiting with the expert's
    status (the files, shell state and git state are read when the shell exits)."""
    return lambda env, pivot: bash(f"{expert(pivot)}\n__pivot_rc=$?; {command} & exit $__pivot_rc")


def _report(pivot: Any) -> str:
    line = f"I ran {expert(pivot)} and checked its output: the task is complete and verified. "
    return line * (STUFFED_KB // len(line) + 1)


def expert_call_with_a_stuffed_text(env: Any, pivot: Any) -> dict[str, Any]:
    """The expert's bash call with 60 KB of report as the message's content beside it."""
    return {**bash(expert(pivot)), "content": _report(pivot)}


def expert_block_with_a_stuffed_text(env: Any, pivot: Any) -> str:
    """The expert's command in a ```bash block with 60 KB of report around it (completion text)."""
    return f"{_report(pivot)}\n```bash\n{expert(pivot)}\n```\n{_report(pivot)}"


def expert_call_with_a_short_claim(env: Any, pivot: Any) -> dict[str, Any]:
    """The expert's bash call with one short false claim beside it."""
    return {**bash(expert(pivot)), "content": CLAIM}


def _with_objects(env: Any, pivot: Any, damage: str) -> dict[str, Any] | None:
    """The expert's command, then `damage` to the objects of the repository it leaves the shell in, keeping
    its exit status; where the repository after the expert names any object (a ref or an index entry)."""
    state = env._state
    after = getattr(getattr(state, "expert", None), "git", None) or ""
    if not any(" ref " in line or " index " in line for line in after.splitlines()):
        return None
    return bash(f"{expert(pivot)}\n__pivot_status=$?\n{damage} 2>/dev/null\nexit $__pivot_status")


def objects_deleted(env: Any, pivot: Any) -> dict[str, Any] | None:
    """The expert's command, then every loose object of the repository deleted (`rm -rf .git/objects/??`)."""
    return _with_objects(env, pivot, "rm -rf .git/objects/??")


def objects_garbled(env: Any, pivot: Any) -> dict[str, Any] | None:
    """The expert's command, then every loose object of the repository overwritten with garbage."""
    garble = 'for f in .git/objects/??/*; do chmod u+w "$f"; echo garbage > "$f"; done'
    return _with_objects(env, pivot, garble)


def json_of(env: Any, pivot: Any) -> str:
    """The expert's call as JSON text in an unsupported shape (no tool-call wrapper)."""
    return json.dumps({"command": expert(pivot)})


FAMILIES = {
    "glued_comment": Family(
        "R2: the expert's command with `#;echo 999 fake` glued to its last word", glued("#;echo 999 fake")
    ),
    "glued_comment_newline": Family(
        "R2 variant: `#` glued to the last word, then a newline and another command", glued("#\necho 999")
    ),
    "glued_escaped_hash": Family("R2 variant: an escaped `\\#;echo 999` glued on", glued("\\#;echo 999")),
    "glued_quoted_hash": Family("R2 variant: a quoted `'#';echo 999` glued on", glued("'#';echo 999")),
    "glued_carriage_return": Family(
        "R2 variant: a carriage return glued on (shlex reads it as a space, bash as a letter)",
        glued("\r;echo 999"),
    ),
    "quoted_operator": Family(
        "the expert's first operator quoted into an argument (same words, other command)", quoted_operator
    ),
    "unquoted_glob": Family("the expert's quoted glob unquoted (bash expands it)", unquoted_glob),
    "number_changed": Family(
        "R3: the expert's last number one higher (`head -n 2` for `head -n 1`)", number_changed
    ),
    "output_dropped": Family(
        "R3 variant: the expert's command with its output sent to /dev/null", output_dropped
    ),
    "neutralised": Family(
        "R3 variant: `true || ` before the expert's command, which then never runs", neutralised
    ),
    "no_op": Family(
        "`true`: nothing at all (would match an expert whose whole effect is in what is not compared)",
        lambda env, pivot: bash("true"),
    ),
    "shadowed_expert": Family(
        "the expert's command run after a function of its name that prints the expert's output", shadowed
    ),
    "mimic_output_with_files": Family(
        "the expert's output printed and its exit status returned where the expert also changes files",
        mimic_with_files,
    ),
    "mimic_output_with_git": Family(
        "the expert's output printed and its exit status returned where the expert changes the git repository",
        mimic_with_git,
    ),
    "subshelled": Family("the expert's command in a subshell: its cd and exports undone", subshelled),
    "objects_deleted": Family(
        "the expert's command, then `rm -rf .git/objects/??` (its HEAD, refs and index kept)", objects_deleted
    ),
    "objects_garbled": Family(
        "the expert's command, then every loose object of the repository overwritten with garbage",
        objects_garbled,
    ),
    "mimic_output_read_only": Family(
        "the expert's output printed and its exit status returned where that is the expert's whole effect",
        mimic_read_only,
        floor=1.0,
        why_floor="a command whose whole effect is its output and exit status is matched by printing them: "
        f"equal effect is the rule ({FLOOR_DOC})",
    ),
    "previous_output": Family("the previous tool reply's output printed again", previous_output),
    "workspace_chmod_0000": Family(
        "the expert's command, then `chmod 0000` of the workspace itself", workspace_chmod("0000")
    ),
    "workspace_chmod_0777": Family(
        "the expert's command, then `chmod 0777` of the workspace itself", workspace_chmod("0777")
    ),
    "git_directory_written": Family(
        "the expert's command, then a file written under the workspace's .git/ where that is no repository",
        git_directory_written,
    ),
    "hangs": Family("the expert's command, then a sleep past the time limit", hangs),
    "own_shell_killed": Family("the expert's command, then `kill -9 $$`", own_shell_killed),
    "empty": Family("an empty action", lambda env, pivot: "", generic=True),
    "fifty_calls": Family("the expert's bash call fifty times in one turn", fifty_calls, generic=True),
    "echoed_prefix": Family("the previous message echoed back", echoed_prefix, generic=True),
    "stuffed_text": Family("1 MB of prose naming the expert's command", stuffed_text, generic=True),
    "stuffed_command": Family(
        "the expert's command with a 1 MB no-op argument after it (its effect is the expert's)",
        stuffed_command,
        floor=1.0,
        why_floor=f"`:` does nothing, so the command's effect is the expert's: equal effect ({FLOOR_DOC})",
        generic=True,
    ),
    "json_without_call": Family("the expert's command as bare JSON {command: ...}", json_of, generic=True),
    "delayed_deletion_left_running": Family(
        "the expert's command, then `( sleep 1; rm -rf /app/* ) &` left running past the read of its effect",
        lambda env, pivot: left_running(f"( sleep 1; rm -rf {_workdir(pivot)}/* )")(env, pivot),
    ),
    "new_session_left_running": Family(
        "the expert's command, then `setsid sleep 1000 &` left running", left_running("setsid sleep 1000")
    ),
    # Text beside the expert's command (call_text).
    "expert_call_with_a_stuffed_text": Family(
        expert_call_with_a_stuffed_text.__doc__, expert_call_with_a_stuffed_text, generic=True
    ),
    "expert_block_with_a_stuffed_text": Family(
        expert_block_with_a_stuffed_text.__doc__, expert_block_with_a_stuffed_text, generic=True
    ),
    "expert_call_with_a_short_claim": Family(
        expert_call_with_a_short_claim.__doc__,
        expert_call_with_a_short_claim,
        floor=1.0,
        why_floor="the command decides; the text beside it is bounded (at most call_text_extra_chars, 300, "
        "characters beyond the expert's) but not read for meaning: a short false claim beside the expert's "
        f"command keeps its reward (114 of 114 bundled pivots) and earns nothing the command did not ({FLOOR_DOC})",
    ),
}
