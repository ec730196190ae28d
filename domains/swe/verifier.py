"""The SWE domain's verifiers, by level: is the sampled tool call locally acceptable at the pivot?

- `name` (the paper's, appendix "SWE-Bench"): the call's tool name equals the expert's
  (harness aliases resolved: `execute_bash` is `bash`). For a bash-only agent it says nothing:
  every call is `bash`.
- `kind`: the call's kind equals the expert's (search / view / edit / run / test / submit /
  other, from the tool and its arguments: `tools.action_kind`).
- `nemo`: NeMo-Gym's swe_pivot verifier (resources_servers/swe_pivot in NVIDIA-NeMo/Gym, its
  README "Verification Levels"), binary mode with its defaults: level 0, the tool's category
  (edit / bash / search / read / finish / think / planning, by tool name) matches; level 1, the
  target matches (editor: same sub-command, same last two path components, a view_range covering
  >= 80% of the expert's; bash: same first word, a shared path among the last three components of
  the paths in the command, and command similarity >= 0.3); level 2, argument similarity
  (difflib ratio over at most 2,000 characters; str_replace: the minimum of old_str's and
  new_str's) >= 0.8. Re-implemented from that description, not copied.
- `effect` (the default): the sampled and the expert call run from the same fork of the pivot's
  state, and what they did is compared, by the expert call's kind:
    * a call the tool refused (`ToolResult.error`: invalid_arguments, old_str_not_found,
      outside_repo, timeout, ...)                                             -> 0, that category;
    * edit: the resulting files are the same (content digests)                -> 1, "same_files";
      otherwise nothing may have been written outside the workspace (`system_writes()`, Docker:
      the probes below run the system's python3 and git); every changed file is the same set and
      each changed .py file has the same AST                                  -> 1, "equivalent_edit";
      the edit touches one of the expert's hunks (old-side line ranges overlapping or bordering),
      changes no test file the expert's does not (`effects.is_test_file`), and every FAIL_TO_PASS /
      PASS_TO_PASS test that passes after the expert's edit passes after it, in the verifier's own
      clean test run in the sample's fork (`effects.run_tests`: a secret-tagged report, the
      repository after the standard library, a skip or a changed unittest is no pass)
                                                                              -> 1, "overlapping_edit";
      otherwise -> 0, "no_edit", "different_edit", "edits_tests", "system_writes" or
      "changed_during_check" (a file the call left changed again while the verifier checked);
    * test run: the sample is a plain test run (`testruns.plain_test_run`: one runner on named tests,
      nothing else), with a runner the sandbox has, of the expert's tests (the same ids, or ids the
      verifier's runner lists as the same test methods), changing what the expert's run changed,
      and, unless piped, exiting as running those tests does (0 when they succeed, 1 when one
      fails: measured once per pivot by the verifier's own run, never read from the output)
                                                                              -> 1, "same_tests"
      ("not_a_test_run", "not_only_tests", "runner_missing", "different_tests", "different_outcome");
    * submit: only a submit, and only where the pivot's FAIL_TO_PASS tests pass -> 1, "submitted_fixed"
      ("submitted_unfixed", "not_submitted"); a submit where the expert does not -> 0, "premature_submit";
    * look-around (search, view, run, other): the sample changes no file the expert's call did
      not, its output covers at least `overlap` (default 0.8) of the expert's output lines
      (lines normalised: `cat -n` numbers, `path:line:` prefixes, a leading `./` or the workdir
      dropped; at most `max_lines` lines of each compared) and holds at most `output_ratio` (3)
      times the expert's lines plus `output_slack` (50), both outputs counted whole
                                                                              -> 1, "covers_expert_output"
      ("changed_files", "too_much_output", "different_output");
      where the expert's look-around shows nothing (no output line as compared, no changed file),
      matching "nothing" would reward any silent call (`true`): there a call that also shows
      nothing scores only as the expert's call (bash: the same tokens, `terminal.verifier`'s
      `command_tokens`; the editor: the same arguments, the path normalised) -> 1, "same_call", or a
      near copy of its bash command (token similarity >= `SILENT_SIMILARITY`, 0.95, as the terminal
      domain's `similarity_threshold`)                                     -> 1, "similar_call";
      any other silent call                                                -> 0, "expert_shows_nothing".
  A pivot that was not executed (an external trace without its repository image) is scored at
  the `nemo` level instead, and the verdict says so (extra["level"] = "nemo").
  Before all of these, the text the turn says beside its call (`call_text`, on by default: a message's
  content beside its tool call, or the completion text outside its `<tool_call>` block; `parse.text_beside`,
  reasoning in `<think>` not counted) may be at most `call_text_extra_chars` (300) characters longer
  than the expert's, whitespace runs counted as one (`pivot_envs.verifiers.text_beside_calls_too_long`,
  search's and the terminal's rule)                                     -> else 0, "call_text_too_long".
  The call decides; the text beside it is bounded, not read for meaning: "Let me look at the tests."
  passes, 60 KB of report beside the expert's call does not, and a short false claim ("Done. All 57
  tests pass.") does (docs/swe.md, "What this verifier cannot tell apart"). The `name`, `kind` and
  `nemo` levels (the paper's and NeMo-Gym's scorers) read the call only.

The reward is binary (as in the paper); `extra` holds the comparisons.
"""

from __future__ import annotations

import difflib
import posixpath
import re
from dataclasses import dataclass
from typing import Any

from pivot_envs.config import ConfigError, option
from pivot_envs.env import Outcome
from pivot_envs.pivot import Pivot
from pivot_envs.sandboxes import SandboxError, file_changes
from pivot_envs.verifiers import (
    CALL_TEXT_EXTRA_CHARS,
    Verdict,
    check_call_text_extra_chars,
    text_beside_calls_too_long,
)

from .effects import changed_test_files, edit_effect, run_tests
from .parse import call_of, text_beside
from .prefix import PrefixState, task_tests
from .testruns import named_tests, plain_test_run
from .tools import ToolResult, action_kind, canonical_name


def _calls(pivot: Pivot, action: dict[str, Any]) -> tuple[tuple[str, Any], tuple[str, Any]]:
    """(sampled call, expert call) as (canonical name, arguments)."""
    name, arguments = call_of(action)
    expert_name, expert_arguments = call_of(pivot.expert) if pivot.expert.get("tool_calls") else ("", {})
    return (canonical_name(name), arguments), (canonical_name(expert_name), expert_arguments)


class NameVerifier:
    """The paper's local verifier for SWE: reward 1 when the tool name is the expert's."""

    name = "name"

    def verify(self, pivot: Pivot, action: dict[str, Any], outcome: Any = None) -> Verdict:
        (name, _), (expert, _) = _calls(pivot, action)
        if name == expert:
            return Verdict(1.0, "same_tool", f"the call uses the expert's tool {name!r}")
        return Verdict(0.0, "different_tool", f"the call uses {name!r}, the expert {expert!r}")


class KindVerifier:
    """Reward 1 when the call is the same kind of operation as the expert's (see `tools.action_kind`)."""

    name = "kind"

    def verify(self, pivot: Pivot, action: dict[str, Any], outcome: Any = None) -> Verdict:
        (name, arguments), (expert, expert_arguments) = _calls(pivot, action)
        kind, expert_kind = action_kind(name, arguments), action_kind(expert, expert_arguments)
        extra = {"kind": kind, "expert_kind": expert_kind}
        if kind == expert_kind:
            return Verdict(1.0, "same_kind", f"both calls are {kind}", extra=extra)
        return Verdict(0.0, "different_kind", f"the call is {kind}, the expert's {expert_kind}", extra=extra)


# NeMo-Gym swe_pivot's tool categories (level 0), by tool name; CamelCase forms match too.
NEMO_CATEGORIES = {
    "edit": (
        "str_replace_editor",
        "text_editor",
        "file_editor",
        "code_editor",
        "edit_file",
        "modify_file",
        "update_file",
        "file_edit",
        "edit",
        "modify",
        "apply_patch",
        "patch_file",
        "apply_diff",
        "apply_changes",
        "write",
        "write_file",
        "save_file",
        "create_file",
    ),
    "bash": (
        "execute_bash",
        "run_bash",
        "bash_exec",
        "shell_run",
        "shell",
        "bash",
        "terminal",
        "shell_command",
        "shell_cmd",
        "run_shell_cmd",
        "exec_command",
        "exec_cmd",
    ),
    "search": (
        "grep",
        "search_text",
        "find_pattern",
        "text_search",
        "glob",
        "find_files",
        "file_glob",
        "match_files",
        "grep_files",
        "search_files",
        "find_in_files",
        "code_search",
        "list_dir",
        "ls",
        "show_dir",
        "ls_dir",
        "list_directory",
    ),
    "read": (
        "read",
        "read_file",
        "view_file",
        "cat_file",
        "view",
        "file_view",
        "inspect",
        "show_file",
        "read_file_content",
    ),
    "finish": ("finish", "submit"),
    "think": ("think",),
    "planning": (
        "task_tracker",
        "todo_tracker",
        "plan_tracker",
        "todo_read",
        "todo_write",
        "update_plan",
        "list_tasks",
        "update_tasks",
        "read_todos",
        "write_todos",
        "edit_plan",
        "modify_plan",
    ),
}
_CATEGORY = {
    form: category
    for category, names in NEMO_CATEGORIES.items()
    for name in names
    for form in (name, name.replace("_", ""))
}
_PATH = re.compile(r"(?:^|[\s='\"(])((?:/[\w.-]+)+|\.\.?/[\w./-]+|[\w.-]+/[\w./-]+)")
SIMILARITY_CHARS = 2000


def nemo_category(name: str) -> str:
    """A tool name's NeMo-Gym swe_pivot category ("unknown" when it has none)."""
    return _CATEGORY.get(name.lower(), "unknown")


def _similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a[:SIMILARITY_CHARS], b[:SIMILARITY_CHARS], autojunk=False).ratio()


def _tail(path: str, parts: int) -> str:
    return "/".join(path.strip("/").split("/")[-parts:])


def _arguments(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _command(arguments: dict[str, Any]) -> str:
    return str(arguments.get("command", arguments.get("cmd", ""))).strip()


def _path_of(arguments: dict[str, Any]) -> str:
    for key in ("path", "file", "file_path", "filename", "file_name"):
        if key in arguments:
            return str(arguments[key]).strip()
    return ""


def _target_matches(category: str, mine: dict[str, Any], theirs: dict[str, Any]) -> bool:
    """NeMo-Gym swe_pivot level 1."""
    if category == "edit":
        command, expert_command = str(mine.get("command", "")), str(theirs.get("command", ""))
        if command and expert_command and command != expert_command:
            return False
        path, expert_path = _path_of(mine), _path_of(theirs)
        if path and expert_path and _tail(path, 2) != _tail(expert_path, 2):
            return False
        ranges = [mine.get("view_range"), theirs.get("view_range")]
        if command == expert_command == "view" and all(isinstance(r, list) and len(r) == 2 for r in ranges):
            try:
                (start, end), (expert_start, expert_end) = [(int(a), int(b)) for a, b in ranges]
            except (TypeError, ValueError):
                return True
            overlap = max(0, min(end, expert_end) - max(start, expert_start))
            return overlap / max(1, expert_end - expert_start) >= 0.8
        return True
    if category == "bash":
        command, expert_command = _command(mine), _command(theirs)
        verb = command.split()[0].rsplit("/", 1)[-1] if command.split() else ""
        expert_verb = expert_command.split()[0].rsplit("/", 1)[-1] if expert_command.split() else ""
        if verb and expert_verb and verb != expert_verb:
            return False
        paths = {_tail(p.rstrip("/"), 3) for p in _PATH.findall(command) if len(p) > 2} - {""}
        expert_paths = {_tail(p.rstrip("/"), 3) for p in _PATH.findall(expert_command) if len(p) > 2} - {""}
        if paths and expert_paths and not paths & expert_paths:
            return False
        return not (command and expert_command) or _similarity(command, expert_command) >= 0.3
    if category in ("search", "read"):
        path, expert_path = _path_of(mine), _path_of(theirs)
        return not (path and expert_path) or _tail(path, 3) == _tail(expert_path, 3)
    return True


def _edit_content(arguments: dict[str, Any]) -> str:
    for key in ("patch", "diff", "content", "file_text"):
        if key in arguments:
            return str(arguments[key])
    return ""


def _argument_similarity(category: str, mine: dict[str, Any], theirs: dict[str, Any]) -> float:
    """NeMo-Gym swe_pivot level 2."""
    if category == "edit":
        old, new = str(mine.get("old_str", "")), str(mine.get("new_str", ""))
        expert_old, expert_new = str(theirs.get("old_str", "")), str(theirs.get("new_str", ""))
        if (old or new) and (expert_old or expert_new):
            return min(
                _similarity(old, expert_old) if old and expert_old else float(old == expert_old),
                _similarity(new, expert_new) if new and expert_new else float(new == expert_new),
            )
        content, expert_content = _edit_content(mine), _edit_content(theirs)
        if content and expert_content:
            return _similarity(content, expert_content)
        return float(bool(content) == bool(expert_content))
    if category == "bash":
        command, expert_command = _command(mine), _command(theirs)
        return _similarity(command, expert_command) if command and expert_command else 1.0
    return 1.0


class NemoVerifier:
    """NeMo-Gym's swe_pivot levels 0-2 in binary mode (see the module docstring)."""

    name = "nemo"

    def __init__(
        self, target_match: bool = True, argument_similarity: bool = True, full_credit: float = 0.8
    ) -> None:
        self.target_match = target_match
        self.argument_similarity = argument_similarity
        self.full_credit = full_credit

    def verify(self, pivot: Pivot, action: dict[str, Any], outcome: Any = None) -> Verdict:
        # NeMo-Gym compares the names as written (an alias is in the same category anyway).
        name, arguments = call_of(action)
        expert, expert_arguments = call_of(pivot.expert) if pivot.expert.get("tool_calls") else ("", {})
        category, expert_category = nemo_category(name), nemo_category(expert)
        extra: dict[str, Any] = {"category": category, "expert_category": expert_category}
        if name.lower() != expert.lower() and (category != expert_category or category == "unknown"):
            return Verdict(
                0.0,
                "tool_name_mismatch",
                f"{name!r} is {category}, the expert's {expert!r} {expert_category}",
                extra=extra,
            )
        mine, theirs = _arguments(arguments), _arguments(expert_arguments)
        if self.target_match and not _target_matches(category, mine, theirs):
            return Verdict(
                0.0, "target_mismatch", "the call targets another file, sub-command or command", extra=extra
            )
        if self.argument_similarity:
            similarity = _argument_similarity(category, mine, theirs)
            extra["similarity"] = round(similarity, 4)
            if similarity < self.full_credit:
                return Verdict(
                    0.0,
                    "similarity_below_threshold",
                    f"argument similarity {similarity:.2f} < {self.full_credit}",
                    extra=extra,
                )
        return Verdict(1.0, "nemo_match", "same tool category, target and arguments", extra=extra)


# -- effect --------------------------------------------------------------------------------------------

_NUMBERED = re.compile(r"^\s*\d+\t")
_GREP_LINE = re.compile(r"^([^\s:]+):\d+[:-]")


@dataclass
class EffectConfig:
    """Options of the effect verifier (`verifier_config=` of the env)."""

    overlap: float = option(
        0.8, "share of the expert's output lines a look-around call's output must contain"
    )
    max_lines: int = option(
        2000, "output lines compared per call (the sandbox already cuts output at its limit)"
    )
    run_tests: bool = option(
        True, "run the task's tests after an edit that touches the expert's hunks but is not equivalent"
    )
    output_ratio: float = option(
        3.0, "a look-around's output may hold at most this many times the expert's lines (plus output_slack)"
    )
    output_slack: int = option(
        50, "lines a look-around's output may hold beyond output_ratio times the expert's"
    )
    call_text: bool = option(True, "bound the text beside the call by the expert's text beside its call")
    call_text_extra_chars: int = option(
        CALL_TEXT_EXTRA_CHARS, "characters the text beside the call may say beyond the expert's"
    )


def output_lines(text: str, workdir: str, max_lines: int | None) -> list[str]:
    """Output lines as compared for coverage (see the module docstring); None: every line."""
    lines = []
    prefix = workdir.rstrip("/") + "/"
    for line in text.splitlines()[:max_lines]:
        line = _NUMBERED.sub("", line).rstrip()
        if not line.strip() or line.startswith("Here's the result of running"):
            continue
        line = line.removeprefix(prefix).removeprefix("./")
        line = _GREP_LINE.sub(r"\1:", line)
        lines.append(line.strip())
    return lines


def coverage(expert: list[str], sample: list[str]) -> float:
    """Share of the expert's lines (as a multiset) that the sample's lines contain (1.0 when the expert's are empty)."""
    if not expert:
        return 1.0 if not sample else 0.0
    remaining: dict[str, int] = {}
    for line in sample:
        remaining[line] = remaining.get(line, 0) + 1
    found = 0
    for line in expert:
        if remaining.get(line, 0) > 0:
            remaining[line] -= 1
            found += 1
    return found / len(expert)


# Where the expert's look-around shows nothing, the token similarity to its bash command at which a
# silent call is a near copy (the terminal domain's default `similarity_threshold`).
SILENT_SIMILARITY = 0.95


def _look_arguments(arguments: dict[str, Any], workdir: str) -> dict[str, Any]:
    """A non-bash call's arguments as compared with the expert's: the path normalised (`./a`, `a/`, `/repo/a`)."""
    path = _path_of(arguments)
    if not path:
        return arguments
    return {**arguments, "path": posixpath.normpath(posixpath.join(workdir, path))}


def call_similarity(call: tuple[str, Any], expert: tuple[str, Any], workdir: str) -> float:
    """How close a call is to the expert's, by text: 1.0 for the expert's call (bash: the same tokens,
    spacing and quoting that cannot change a word's meaning aside; another tool: the same arguments,
    the path normalised), the token similarity of two bash commands, else 0.0."""
    (name, arguments), (expert_name, expert_arguments) = call, expert
    if name != expert_name:
        return 0.0
    mine, theirs = _arguments(arguments), _arguments(expert_arguments)
    if name == "bash":
        # the terminal domain's tokenizer: bash's reading of a command (domains/swe already imports
        # domains/terminal, which imports nothing of domains/swe)
        from pivot_envs.domains.terminal.verifier import command_similarity

        return command_similarity(_command(mine), _command(theirs))
    return float(_look_arguments(mine, workdir) == _look_arguments(theirs, workdir))


def files_after(result: ToolResult, state: PrefixState) -> dict[str, str]:
    """The workspace manifest after a call (the pivot's own where the call read none: an editor view)."""
    return result.files if result.files is not None else state.before


def same_changes(result: ToolResult, expert: ToolResult, state: PrefixState) -> bool:
    """Whether two calls changed the same workspace paths in the same way (added, removed, modified)."""
    return file_changes(state.before, files_after(result, state)) == file_changes(
        state.before, files_after(expert, state)
    )


class EffectVerifier:
    """Compares what the sampled call and the expert's did from the same state (module docstring)."""

    name = "effect"

    def __init__(
        self,
        overlap: float = 0.8,
        max_lines: int = 2000,
        run_tests: bool = True,
        output_ratio: float = 3.0,
        output_slack: int = 50,
        call_text: bool = True,
        call_text_extra_chars: int = CALL_TEXT_EXTRA_CHARS,
    ) -> None:
        if not isinstance(call_text, bool):
            raise ConfigError(f"EffectVerifier: call_text must be true or false, got {call_text!r}")
        extra_chars = check_call_text_extra_chars("EffectVerifier", call_text_extra_chars)
        self.config = EffectConfig(
            overlap, max_lines, run_tests, output_ratio, output_slack, call_text, extra_chars
        )
        self.fallback = NemoVerifier()

    def verify(self, pivot: Pivot, action: dict[str, Any], outcome: Any = None) -> Verdict:
        data = outcome.data if isinstance(outcome, Outcome) else {}
        if self.config.call_text:
            # The env hands over the text its canonical form drops; a direct call's message holds its own.
            text, expert_text = data.get("call_text"), data.get("expert_call_text")
            refused = text_beside_calls_too_long(
                text_beside(action) if text is None else text,
                text_beside(pivot.expert) if expert_text is None else expert_text,
                self.config.call_text_extra_chars,
            )
            if refused is not None:
                return refused
        if not data.get("executed", False):
            verdict = self.fallback.verify(pivot, action)
            why = data.get("reason", "the action was not executed")
            verdict.extra.update(level="nemo", executed=False)
            verdict.detail = f"{verdict.detail} (scored at the nemo level: {why})"
            return verdict
        result: ToolResult = data["result"]
        state: PrefixState = data["state"]
        expert = state.expert
        extra: dict[str, Any] = {"kind": result.kind, "expert_kind": expert.kind if expert else None}
        if result.error is not None:
            return Verdict(0.0, result.error, result.text[:300], extra=extra)
        if expert is None or expert.error is not None:
            return Verdict(
                0.0, "no_reference", "the expert's call could not be run at this pivot", extra=extra
            )
        if expert.kind == "submit" or result.kind == "submit":
            return self._submit(pivot, result, state, extra)
        if expert.kind == "edit":
            return self._edit(pivot, result, state, data, extra)
        if expert.kind == "test":
            (_, arguments), (_, expert_arguments) = _calls(pivot, action)
            commands = (_command(_arguments(arguments)), _command(_arguments(expert_arguments)))
            return self._test(pivot, result, state, commands, data, extra)
        calls = _calls(pivot, action)
        return self._look_around(result, expert, state, calls, data.get("workdir", "/repo"), extra)

    def _submit(self, pivot: Pivot, result: ToolResult, state: PrefixState, extra: dict[str, Any]) -> Verdict:
        if state.expert.kind != "submit":
            return Verdict(
                0.0, "premature_submit", "the call submits where the expert goes on working", extra=extra
            )
        if result.kind != "submit":
            return Verdict(0.0, "not_submitted", "the expert submits here", extra=extra)
        fail_to_pass, _ = task_tests(pivot)
        extra["fail_to_pass"] = state.expert_tests
        if fail_to_pass and all(state.expert_tests.get(test) for test in fail_to_pass):
            return Verdict(
                1.0, "submitted_fixed", "submitted with every FAIL_TO_PASS test passing", extra=extra
            )
        return Verdict(0.0, "submitted_unfixed", "submitted while a FAIL_TO_PASS test fails", extra=extra)

    def _edit(
        self,
        pivot: Pivot,
        result: ToolResult,
        state: PrefixState,
        data: dict[str, Any],
        extra: dict[str, Any],
    ) -> Verdict:
        after, expert_after = files_after(result, state), files_after(state.expert, state)
        changed = {c.path: after.get(c.path) for c in file_changes(state.before, after)}
        expert_changed = {c.path: expert_after.get(c.path) for c in file_changes(state.before, expert_after)}
        extra["files"] = sorted(changed)
        if not changed:
            return Verdict(0.0, "no_edit", "the expert edits here; the call changed no file", extra=extra)
        if changed == expert_changed:
            return Verdict(1.0, "same_files", "the resulting files are the expert's", extra=extra)
        sandbox, repo = data["sandbox"], data["repo"]
        timeout = data["timeout"]
        try:
            # Nothing of the call's may run beside the probes and tests below (a background loop
            # rewriting files, a process answering for a tool), and what they run (python3, git,
            # unittest) must be the system's own.
            if not sandbox.stop_processes():
                detail = "the processes the call left running could not be stopped before the checks"
                return Verdict(0.0, "processes_not_stopped", detail, extra=extra)
            written = sandbox.system_writes()
            if written:
                detail = f"the call wrote outside the workspace, so no probe there is evidence: {written[:5]}"
                return Verdict(0.0, "system_writes", detail, extra=extra)
            mine = edit_effect(sandbox, repo.workdir, state.tree_hash, timeout)
        except SandboxError as error:
            return Verdict(0.0, "different_edit", f"the edit could not be read back: {error}", extra=extra)
        theirs = state.expert_edit
        if theirs is None:
            return Verdict(0.0, "no_reference", "the expert's edit could not be read back", extra=extra)
        same_python = all(path.endswith(".py") for path in changed) and set(mine.ast) == set(theirs.ast)
        if (
            same_python
            and set(changed) == set(expert_changed)
            and mine.ast == theirs.ast
            and "syntax_error" not in mine.ast.values()
        ):
            return Verdict(
                1.0, "equivalent_edit", "every changed Python file has the expert's AST", extra=extra
            )
        if not mine.touches(theirs):
            return Verdict(0.0, "different_edit", "the edit touches none of the expert's hunks", extra=extra)
        if not self.config.run_tests:
            return Verdict(
                0.0,
                "different_edit",
                "touches the expert's hunks; tests not run (run_tests=False)",
                extra=extra,
            )
        fail_to_pass, pass_to_pass = task_tests(pivot)
        tests = fail_to_pass + pass_to_pass
        edited = changed_test_files(state.before, after, expert_after, tests)
        if edited:
            return Verdict(
                0.0, "edits_tests", f"the edit changes the task's tests: {edited[:5]}", extra=extra
            )
        try:
            report = run_tests(sandbox, repo, tests, timeout, files=True)
        except SandboxError as error:
            detail = f"pivot {pivot.id}: the verifier's test run failed: {error}"
            return Verdict(0.0, "infrastructure_error", detail, valid=False, extra=extra)
        extra["tests"], extra["expert_tests"] = report.passed, state.expert_tests
        if report.tampered:
            detail = "the code under test changed unittest, the import hooks or tracing while the tests ran"
            return Verdict(0.0, "different_edit", detail, extra=extra)
        moved = sorted(path for path in after if (report.files or {}).get(path) != after[path])
        if report.files is not None and moved:
            detail = f"files changed after the call, while the verifier's checks ran: {moved[:5]}"
            return Verdict(0.0, "changed_during_check", detail, extra=extra)
        passed = report.passed
        worse = sorted(test for test, ok in state.expert_tests.items() if ok and not passed.get(test))
        if worse or not state.expert_tests:
            detail = f"touches the expert's hunks but {len(worse)} test(s) pass only after the expert's edit: {worse[:5]}"
            return Verdict(
                0.0, "different_edit", detail if worse else "no task tests to compare", extra=extra
            )
        return Verdict(
            1.0,
            "overlapping_edit",
            "touches the expert's hunks and the tests are at least as good",
            extra=extra,
        )

    def _test(
        self,
        pivot: Pivot,
        result: ToolResult,
        state: PrefixState,
        commands: tuple[str, str],
        data: dict[str, Any],
        extra: dict[str, Any],
    ) -> Verdict:
        expert = state.expert
        if result.kind != "test":
            return Verdict(
                0.0, "not_a_test_run", f"the expert runs tests here; the call is {result.kind}", extra=extra
            )
        if not same_changes(result, expert, state):
            return Verdict(
                0.0, "changed_files", "the test run changed other files than the expert's", extra=extra
            )
        repo = data["repo"]
        run = plain_test_run(commands[0], repo.workdir, repo.env)
        if isinstance(run, str):
            return Verdict(0.0, "not_only_tests", f"not a plain test run: {run}", extra=extra)
        expert_ids = named_tests(commands[1])
        extra.update(tests=sorted(run.ids), expert_tests=sorted(expert_ids))
        measured = state.expert_run
        if measured is None:
            # The expert runs every test: no measurement (the suite can outlast a call), its exit status decides.
            if run.ids != expert_ids:
                return Verdict(0.0, "different_tests", "other tests than the expert's run", extra=extra)
            if not run.piped and result.exit_code != expert.exit_code:
                detail = f"exit status {result.exit_code}, the expert's run {expert.exit_code}"
                return Verdict(0.0, "different_outcome", detail, extra=extra)
            return Verdict(1.0, "same_tests", "the expert's test run, the same exit status", extra=extra)
        if not measured.complete:
            return Verdict(
                0.0, "no_reference", "the tests the expert runs could not be measured here", extra=extra
            )
        missing = [need for need in run.needs if need not in measured.runners]
        if missing:
            detail = f"the sandbox has no {missing[0]}: the command cannot run the tests it names"
            return Verdict(0.0, "runner_missing", detail, extra=extra)
        if run.ids != expert_ids:
            if "*" in run.ids | expert_ids:
                return Verdict(0.0, "different_tests", "other tests than the expert's run", extra=extra)
            try:
                listed = run_tests(data["sandbox"], repo, sorted(run.ids), data["timeout"], mode="list")
            except SandboxError as error:
                detail = f"pivot {pivot.id}: listing the call's tests failed: {error}"
                return Verdict(0.0, "infrastructure_error", detail, valid=False, extra=extra)
            if not listed.methods or (listed.methods, listed.digest) != (measured.methods, measured.digest):
                detail = f"names {listed.methods} test(s), not the {measured.methods} of the expert's run"
                return Verdict(0.0, "different_tests", detail, extra=extra)
        # The tests' outcome here is measured (the call changed what the expert's did, nothing else):
        # a run that completed exits 0 exactly when they succeed, 1 when one fails.
        extra["outcome"] = "success" if measured.successful else "failure"
        expected = 0 if measured.successful else 1
        if not run.piped and result.exit_code != expected:
            detail = f"exit status {result.exit_code}, where running these tests exits {expected}"
            return Verdict(0.0, "different_outcome", detail, extra=extra)
        return Verdict(
            1.0, "same_tests", "a plain run of the expert's tests, which ran to their outcome", extra=extra
        )

    def _look_around(
        self,
        result: ToolResult,
        expert: ToolResult,
        state: PrefixState,
        calls: tuple[tuple[str, Any], tuple[str, Any]],
        workdir: str,
        extra: dict[str, Any],
    ) -> Verdict:
        if not same_changes(result, expert, state):
            return Verdict(
                0.0, "changed_files", "the call changed files; the expert's only looked", extra=extra
            )
        limit = self.config.max_lines
        theirs, mine = (
            output_lines(expert.output, workdir, limit),
            output_lines(result.output, workdir, limit),
        )
        share = coverage(theirs, mine)
        extra["coverage"] = round(share, 4)
        # Printing everything would contain any expert's output: the extra lines are bounded, counted
        # over the whole outputs (lines past max_lines are not compared, but they are shown).
        shown, expert_shown = (
            len(output_lines(result.output, workdir, None)),
            len(output_lines(expert.output, workdir, None)),
        )
        most = self.config.output_ratio * expert_shown + self.config.output_slack
        if shown > most:
            detail = f"shows {shown} lines where the expert's output has {expert_shown} (at most {most:.0f})"
            return Verdict(0.0, "too_much_output", detail, extra=extra)
        if not expert_shown and not shown and not file_changes(state.before, files_after(expert, state)):
            return self._shows_nothing(calls, workdir, extra)
        if share >= self.config.overlap:
            return Verdict(
                1.0, "covers_expert_output", f"shows {share:.0%} of the expert's output", extra=extra
            )
        return Verdict(
            0.0,
            "different_output",
            f"shows {share:.0%} of the expert's output (< {self.config.overlap:.0%})",
            extra=extra,
        )

    def _shows_nothing(
        self, calls: tuple[tuple[str, Any], tuple[str, Any]], workdir: str, extra: dict[str, Any]
    ) -> Verdict:
        """Neither the expert's look-around nor the call shows anything (no output line as compared, no
        changed file): matching "nothing" would reward any silent call, so the call's text decides."""
        similarity = call_similarity(*calls, workdir)
        extra["similarity"] = round(similarity, 4)
        if similarity == 1.0:
            return Verdict(
                1.0, "same_call", "the expert's call, which shows nothing here, as the call does", extra=extra
            )
        if similarity >= SILENT_SIMILARITY:
            detail = (
                f"a near copy (similarity {similarity:.2f}) of the expert's call, which shows nothing here"
            )
            return Verdict(1.0, "similar_call", detail, extra=extra)
        detail = (
            "the expert's look-around shows nothing here (no output, no changed file), so only its call or "
            f"a near copy scores (similarity {similarity:.2f} < {SILENT_SIMILARITY})"
        )
        return Verdict(0.0, "expert_shows_nothing", detail, extra=extra)
