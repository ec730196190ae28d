"""The terminal domain's functional verifier (paper Eq. 6): is the sampled command locally acceptable?

Rules, applied in order to a parsed command (an unparseable action already scored 0 with its
category before reaching here):

T. The text the action says beside its command (`call_text`, on by default: a message's content beside
   its tool call, the completion text outside its ```bash or `<tool_call>` block, a Terminus JSON's
   analysis and plan; `parse.text_beside`, reasoning in `<think>` not counted) is more than
   `call_text_extra_chars` (300) characters longer than the expert's, whitespace runs counted as one
   (`pivot_envs.verifiers.text_beside_calls_too_long`, search's rule) -> 0, "call_text_too_long". The
   command decides; the text beside it is bounded, not read for meaning: "Let me list the files." passes,
   60 KB of report beside the expert's command does not, and a short false claim ("Done, all tests
   pass.") does (docs/terminal.md, "What this verifier cannot tell apart").
0. The command exited 2 and `bash -n` rejects it                    -> 0, "malformed_command".
1. The sampled command hit the hard timeout                         -> 0, "timed_out".
2. The same bash tokens as the expert's command (`shell_tokens`: spacing, quoting that cannot change
   a word's meaning, comments where bash reads comments)              -> 1, "same_command".
L. The sampled command left more processes running after its shell exited than the expert's command did
   from the same state (`CommandResult.left_running`, counted by the sandbox before the files are read;
   the expert's run that left more of the two when it was run twice) -> 0, "processes_left_running":
   what is still running when the effect is read is not measured (`EXPERT; ( sleep 1; rm -rf /app/* ) &`
   would otherwise match the expert's effect). Where either count is unknown (Docker without the command
   channel, keystrokes), the rule does not apply. Leftovers are counted, not killed: an episode's next
   turn may use a server a command started.
3. Effect equivalence: run from the same forked prefix state, the sampled command and the
   expert's command end with the same exit status, the same normalized output (ANSI stripped,
   trailing spaces and blank lines dropped), the same file changes in the workspace (same
   paths added/removed/modified, with the same resulting type, mode and content), the same
   changes to the shell state (working directory, exported variables) and the same changes to the
   workspace's git repository (HEAD, refs, index entries; where the sandbox reads it from the host)
   -> 1, "equivalent_effect"; only where the expert's command shows an effect: one that exits 0
   silently and changes nothing compared would be matched by any silent command.
4. Token similarity to the expert's command >= `similarity_threshold` -> 1, "similar_command", only
   where the effect differs in nothing the expert's command repeats: the outcome's `expert_repeat` is
   the expert's command run a second time from the same state, and a part of the effect that came
   out the same both times (the exit status, each output line when both outputs have as many lines,
   each changed file, each changed shell variable) is measured and must match. Text never overrides a measured difference;
   without a repeat, the whole effect counts as measured.
5. An LLM judge, when given: a callable (pivot, action, outcome) -> reward in [0, 1] or bool -> its reward, "judge".
6. Otherwise                                                         -> 0, "different_effect"
   (the detail says what differed: exit status, output, files, shell).

A pivot that was not executed (`outcome.data["executed"]` False: a row whose task image does not
ship) is scored at the string level, as NeMo-Gym's terminal_pivot server scores such rows (the
keystrokes equal the expert's): rule 2, then rule 0 by `bash -n` alone, then the judge when given, else
0, "different_command"; the verdict says so (extra["level"] = "string", extra["executed"] = False).

The reward is binary (as in the paper); `extra` holds the similarity and the comparisons.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pivot_envs.config import ConfigError, option
from pivot_envs.env import Outcome
from pivot_envs.pivot import Pivot
from pivot_envs.sandboxes import CommandResult, file_changes
from pivot_envs.verifiers import (
    CALL_TEXT_EXTRA_CHARS,
    Verdict,
    check_call_text_extra_chars,
    text_beside_calls_too_long,
)

from .parse import Token, command_of_message, shell_tokens, syntax_error, text_beside

Judge = Callable[[Pivot, dict[str, Any], Any], "float | bool"]


@dataclass
class TerminalVerifierConfig:
    """Options of the functional verifier (`verifier_config=` of the env)."""

    similarity_threshold: float = option(
        0.95,
        "token similarity to the expert's command above which a command is accepted where its effect differs "
        "only in what the expert's command does not repeat",
    )
    compare_files: bool = option(True, "require the same workspace file changes for effect equivalence")
    call_text: bool = option(
        True, "bound the text beside the command by the expert's text beside its command (rule T)"
    )
    call_text_extra_chars: int = option(
        CALL_TEXT_EXTRA_CHARS, "characters the text beside the command may say beyond the expert's"
    )


def command_tokens(command: str) -> list[Token]:
    """The command's bash tokens (`parse.shell_tokens`), as the verifier compares them."""
    return shell_tokens(command)


def command_similarity(a: str, b: str) -> float:
    """Similarity in [0, 1] of two commands' token sequences."""
    ta, tb = command_tokens(a), command_tokens(b)
    if not ta and not tb:
        return 1.0
    return difflib.SequenceMatcher(a=ta, b=tb, autojunk=False).ratio()


def normalize_output(text: str) -> str:
    """Output as compared for effect equivalence: trailing spaces per line and trailing blank lines dropped."""
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


# Where a new entry of the saved shell state starts: `export -p` prints one `declare -x` per variable
# (a value may hold newlines), then the runner's `cd -- DIR`.
_SHELL_ENTRY = re.compile(r"\n(?=declare -x |cd -- )")


def shell_entries(state: str) -> dict[str, str]:
    """The saved shell state (CommandResult.shell) as {name: entry}: each exported variable by its name, the
    working directory as "cwd". A name seen again (a value can hold a line that reads as an entry) is
    keyed "name#2", "name#3", ...: a forged entry is one more entry, never a replaced one."""
    entries: dict[str, str] = {}
    seen: dict[str, int] = {}
    for entry in _SHELL_ENTRY.split(state.strip("\n")):
        if not entry:
            continue
        if entry.startswith("cd -- "):
            name = "cwd"
        else:
            name = entry.removeprefix("declare -x ").split("\n", 1)[0].split("=", 1)[0]
        seen[name] = count = seen.get(name, 0) + 1
        entries[name if count == 1 else f"{name}#{count}"] = entry
    return entries


def changed_entries(old: dict[str, str], new: dict[str, str]) -> dict[str, str | None]:
    """The entries of `new` that differ from `old`'s, and None for each of `old`'s that `new` lacks."""
    changes: dict[str, str | None] = {key: value for key, value in new.items() if old.get(key) != value}
    changes.update({key: None for key in old if key not in new})
    return changes


def shell_changes(before: str, after: str) -> dict[str, str | None]:
    """The entries of the shell state `after` that differ from `before` (None: an entry removed)."""
    return changed_entries(shell_entries(before), shell_entries(after))


def git_entries(state: str) -> dict[str, str]:
    """The git state (CommandResult.git, `sandboxes.gitstate`) as {key: value}, a key per repository's
    HEAD, ref and index entry (`"site" HEAD`, `"site" ref "refs/heads/main"`, `"site" index "a.txt"`).
    Directories and names are JSON-quoted there, so no name forges another line."""
    entries: dict[str, str] = {}
    for line in state.split("\n"):
        key, _, value = line.partition("\t")
        if key:
            entries[key] = value
    return entries


def git_changes(before: str, after: str) -> dict[str, str | None]:
    """The entries of the git state `after` that differ from `before` (None: an entry removed)."""
    return changed_entries(git_entries(before), git_entries(after))


def effect_of(
    result: CommandResult,
    before: dict[str, str],
    shell_before: str | None = None,
    git_before: str | None = None,
) -> dict[str, Any]:
    """What a command did, in comparable form: exit status, normalized output, changed files, the
    changed shell state and the changed git state (each None when the result or the prefix carries none)."""
    after = result.files or {}
    shell = git = None
    if shell_before is not None and result.shell is not None:
        shell = shell_changes(shell_before, result.shell)
    if git_before is not None and result.git is not None:
        git = git_changes(git_before, result.git)
    return {
        "exit_code": result.exit_code,
        "output": normalize_output(result.output),
        "files": {change.path: after.get(change.path) for change in file_changes(before, after)},
        "shell": shell,
        "git": git,
    }


def measured_differences(
    mine: dict[str, Any], theirs: dict[str, Any], repeat: dict[str, Any] | None, keys: tuple[str, ...]
) -> list[str]:
    """The parts of `keys` where `mine` differs from what the expert's effect (`theirs`) repeats.

    `repeat` is the expert's effect from a second run from the same state (None: not measured, so every
    part counts as repeating). A part differs when: the exit status is neither run's; the output is
    neither run's and differs in a line both runs printed alike (both outputs with as many lines; a
    varying line count leaves the output unmeasured); a changed file that both runs left alike is
    missing or other, a file the runs left differently is not changed, or, where both runs changed the
    same paths, another path is changed; the shell state's and the git state's changed entries are
    measured as the files are.
    """
    if repeat is None:
        return [key for key in keys if mine[key] != theirs[key]]
    differences = []
    if "exit_code" in keys and mine["exit_code"] not in (theirs["exit_code"], repeat["exit_code"]):
        differences.append("exit_code")
    if "output" in keys and not _output_fits(mine["output"], theirs["output"], repeat["output"]):
        differences.append("output")
    if "files" in keys and not _changes_fit(mine["files"], theirs["files"], repeat["files"]):
        differences.append("files")
    for key in ("shell", "git"):
        if key in keys:
            again = repeat.get(key)
            if not _changes_fit(mine[key], theirs[key], theirs[key] if again is None else again):
                differences.append(key)
    return differences


def _output_fits(mine: str, first: str, second: str) -> bool:
    if mine in (first, second):
        return True
    if first == second:
        return False
    lines, first_lines, second_lines = mine.split("\n"), first.split("\n"), second.split("\n")
    if len(first_lines) != len(second_lines):
        return True  # not even the line count repeats: nothing of the output is measured
    return len(lines) == len(first_lines) and all(
        line == a for line, a, b in zip(lines, first_lines, second_lines) if a == b
    )


_ABSENT = object()  # a path the sample did not change (None is a removed file)


def _changes_fit(mine: dict[str, Any], first: dict[str, Any], second: dict[str, Any]) -> bool:
    for path in first.keys() & second.keys():
        if first[path] == second[path] and mine.get(path, _ABSENT) != first[path]:
            return False
        if path not in mine:
            return False
    # Where both runs changed the same paths, the paths are measured; where not, only their shared part.
    return first.keys() != second.keys() or mine.keys() == first.keys()


class TerminalVerifier:
    """Functional reward for one bash command (see the module docstring for the rules)."""

    name = "functional"

    def __init__(
        self,
        similarity_threshold: float = 0.95,
        compare_files: bool = True,
        judge: Judge | None = None,
        call_text: bool = True,
        call_text_extra_chars: int = CALL_TEXT_EXTRA_CHARS,
    ) -> None:
        if not isinstance(call_text, bool):
            raise ConfigError(f"TerminalVerifier: call_text must be true or false, got {call_text!r}")
        self.similarity_threshold = similarity_threshold
        self.compare_files = compare_files
        self.judge = judge
        self.call_text = call_text
        self.call_text_extra_chars = check_call_text_extra_chars("TerminalVerifier", call_text_extra_chars)

    def verify(self, pivot: Pivot, action: dict[str, Any], outcome: Outcome | None = None) -> Verdict:
        command = command_of_message(action) or ""
        expert = command_of_message(pivot.expert) or ""
        data = outcome.data if isinstance(outcome, Outcome) else {}
        if self.call_text:
            # The env hands over the text its canonical form drops; a direct call's message holds its own.
            text = data.get("call_text")
            expert_text = data.get("expert_call_text")
            refused = text_beside_calls_too_long(
                text_beside(action) if text is None else text,
                text_beside(pivot.expert) if expert_text is None else expert_text,
                self.call_text_extra_chars,
            )
            if refused is not None:
                return refused
        if data.get("executed", True) is False:
            return self._unexecuted(pivot, action, outcome, command, expert, data)
        sample: CommandResult | None = data.get("result")
        reference: CommandResult | None = data.get("expert")
        again: CommandResult | None = data.get("expert_repeat")
        similarity = command_similarity(command, expert)
        extra: dict[str, Any] = {"similarity": round(similarity, 4)}
        if sample is not None and sample.exit_code == 2 and not sample.timed_out:
            problem = syntax_error(command)  # bash exits 2 on a syntax error (and on some usage errors)
            if problem:
                return Verdict(
                    0.0, "malformed_command", f"bash -n rejects the command: {problem}", extra=extra
                )
        if sample is not None and sample.timed_out:
            return Verdict(
                0.0, "timed_out", f"the command ran past its {sample.seconds:.1f}s limit", extra=extra
            )
        if command_tokens(command) == command_tokens(expert) and command_tokens(command):
            return Verdict(
                1.0, "same_command", "bash reads the command as the expert's (spacing, quoting)", extra=extra
            )
        left = self._left_running(sample, reference, again)
        if left is not None:
            extra["left_running"] = left
            if left[0] > left[1]:
                return Verdict(
                    0.0,
                    "processes_left_running",
                    f"the command left {left[0]} process{'es' if left[0] != 1 else ''} running after its shell "
                    f"exited, the expert's command {left[1]}: what still runs is not in the effect measured",
                    extra=extra,
                )
        if sample is None or reference is None or reference.timed_out:
            # No effect of the expert's to compare with: nothing is measured, so nothing text could decide.
            return self._reject(pivot, action, outcome, "no effect of the expert's command to compare", extra)
        before = data.get("before", {})
        states = data.get("shell_before"), data.get("git_before")
        keys: tuple[str, ...] = (
            ("exit_code", "output", "files") if self.compare_files else ("exit_code", "output")
        )
        mine, theirs = effect_of(sample, before, *states), effect_of(reference, before, *states)
        keys += tuple(key for key in ("shell", "git") if mine[key] is not None and theirs[key] is not None)
        differences = [key for key in keys if mine[key] != theirs[key]]
        extra["differences"] = differences
        # An expert command that exits 0 silently and changes nothing compared changed only what is not
        # compared: matching "nothing" would reward any silent command, so text decides.
        visible = theirs["exit_code"] != 0 or any(theirs[key] for key in keys if key != "exit_code")
        if not differences and visible:
            return Verdict(
                1.0,
                "equivalent_effect",
                "same exit status, output, file changes, shell state and git state changes as the expert's "
                "command",
                extra=extra,
            )
        repeat = effect_of(again, before, *states) if again is not None and not again.timed_out else None
        measured = measured_differences(mine, theirs, repeat, keys)
        extra["measured_differences"] = measured
        if not measured and similarity >= self.similarity_threshold:
            unmeasured = ", ".join(differences) if differences else "the expert's command shows no effect"
            return Verdict(
                1.0,
                "similar_command",
                f"similarity {similarity:.2f}; the effect differs only in what the expert's command does "
                f"not repeat or show ({unmeasured})",
                extra=extra,
            )
        if not differences:
            missing = [
                name for key, name in (("shell", "the shell state"), ("git", ".git/")) if key not in keys
            ]
            unseen = (
                f"{' or '.join(missing)}, which {'is' if len(missing) == 1 else 'are'}"
                if missing
                else "what is outside the workspace, which is"
            )
            return self._reject(
                pivot,
                action,
                outcome,
                f"the expert's command shows no effect here (exit 0, no output, nothing compared changed: its "
                f"change, if any, is in {unseen} not compared), so only the same or a similar command scores",
                extra,
            )
        return self._reject(
            pivot,
            action,
            outcome,
            "differs from the expert's command in " + ", ".join(measured or differences),
            extra,
        )

    @staticmethod
    def _left_running(
        sample: CommandResult | None, reference: CommandResult | None, again: CommandResult | None
    ) -> tuple[int, int] | None:
        """(processes the sampled command left running, the most the expert's runs left), or None where
        either is unknown (rule L)."""
        mine = sample.left_running if sample is not None else None
        expert = reference.left_running if reference is not None else None
        if mine is None or expert is None:
            return None
        if again is not None and again.left_running is not None:
            expert = max(expert, again.left_running)
        return mine, expert

    def _unexecuted(
        self,
        pivot: Pivot,
        action: dict[str, Any],
        outcome: Any,
        command: str,
        expert: str,
        data: dict[str, Any],
    ) -> Verdict:
        """The string level, for a pivot whose commands do not run here (module docstring)."""
        why = str(data.get("reason") or "the action was not executed")
        extra: dict[str, Any] = {
            "similarity": round(command_similarity(command, expert), 4),
            "level": "string",
            "executed": False,
        }
        tokens = command_tokens(command)
        if tokens and tokens == command_tokens(expert):
            verdict = Verdict(
                1.0, "same_command", "bash reads the command as the expert's (spacing, quoting)", extra=extra
            )
        # bash -n costs a process: only for a command that did not match; a failed check is no verdict.
        elif (problem := syntax_error(command)) and not problem.startswith("could not check"):
            verdict = Verdict(
                0.0, "malformed_command", f"bash -n rejects the command: {problem}", extra=extra
            )
        elif self.judge is not None:
            verdict = Verdict(
                float(self.judge(pivot, action, outcome)), "judge", "decided by the LLM judge", extra=extra
            )
        else:
            verdict = Verdict(
                0.0,
                "different_command",
                f"bash does not read the command as the expert's (similarity {extra['similarity']:.2f})",
                extra=extra,
            )
        verdict.detail = f"{verdict.detail} (scored without running: {why})"
        return verdict

    def _reject(
        self, pivot: Pivot, action: dict[str, Any], outcome: Any, detail: str, extra: dict[str, Any]
    ) -> Verdict:
        """The LLM judge's verdict when there is one, else 0 ("different_effect") with `detail`."""
        if self.judge is not None:
            judged = self.judge(pivot, action, outcome)
            return Verdict(float(judged), "judge", "decided by the LLM judge", extra=extra)
        return Verdict(
            0.0, "different_effect", f"{detail} (similarity {extra['similarity']:.2f})", extra=extra
        )
