"""The terminal domain's functional verifier (paper Eq. 6): is the sampled command locally acceptable?

Rules, applied in order to a parsed command (an unparseable action already scored 0 with its
category before reaching here):

0. The command exited 2 and `bash -n` rejects it                    -> 0, "malformed_command".
1. The sampled command hit the hard timeout                         -> 0, "timed_out".
2. Normalized command equal to the expert's (shell tokens, spacing)  -> 1, "same_command".
3. Effect equivalence: run from the same forked prefix state, the sampled command and the
   expert's command end with the same exit status, the same normalized output (ANSI stripped,
   trailing spaces and blank lines dropped) and the same file changes in the workspace (same
   paths added/removed/modified, with the same resulting type, mode and content) -> 1, "equivalent_effect".
4. Normalized token similarity to the expert's command >= `similarity_threshold` and the same
   exit status (covers commands whose output is not deterministic, e.g. timestamps) -> 1, "similar_command".
5. An LLM judge, when given: a callable (pivot, action, outcome) -> reward in [0, 1] or bool -> its reward, "judge".
6. Otherwise                                                         -> 0, "different_effect"
   (the detail says what differed: exit status, output, files).

The reward is binary (as in the paper); `extra` holds the similarity and the comparisons.
"""

from __future__ import annotations

import difflib
import functools
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pivot_envs.sandboxes import CommandResult, file_changes

from pivot_envs.config import option
from pivot_envs.env import Outcome
from pivot_envs.pivot import Pivot
from pivot_envs.verifiers import Verdict

from .parse import command_of_message, syntax_error

Judge = Callable[[Pivot, dict[str, Any], Any], "float | bool"]


@dataclass
class TerminalVerifierConfig:
    """Options of the functional verifier (`verifier_config=` of the env)."""

    similarity_threshold: float = option(
        0.95,
        "token similarity to the expert's command above which a command with the same exit status is accepted",
    )
    compare_files: bool = option(True, "require the same workspace file changes for effect equivalence")


def command_tokens(command: str) -> list[str]:
    """Shell tokens of a command (whitespace-split when it does not tokenize), trailing ';' dropped."""
    return list(_tokens(command))


@functools.lru_cache(maxsize=4096)
def _tokens(command: str) -> tuple[str, ...]:
    # Cached: the expert's command is tokenized for every sample at its pivot.
    try:
        tokens = shlex.split(command, comments=True)
    except ValueError:
        tokens = command.split()
    while tokens and tokens[-1] == ";":
        tokens.pop()
    return tuple(tokens)


def command_similarity(a: str, b: str) -> float:
    """Similarity in [0, 1] of two commands' token sequences."""
    ta, tb = command_tokens(a), command_tokens(b)
    if not ta and not tb:
        return 1.0
    return difflib.SequenceMatcher(a=ta, b=tb, autojunk=False).ratio()


def normalize_output(text: str) -> str:
    """Output as compared for effect equivalence: trailing spaces per line and trailing blank lines dropped."""
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


def effect_of(result: CommandResult, before: dict[str, str]) -> dict[str, Any]:
    """What a command did, in comparable form: exit status, normalized output, changed files."""
    after = result.files or {}
    return {
        "exit_code": result.exit_code,
        "output": normalize_output(result.output),
        "files": {change.path: after.get(change.path) for change in file_changes(before, after)},
    }


class TerminalVerifier:
    """Functional reward for one bash command (see the module docstring for the rules)."""

    name = "functional"

    def __init__(
        self, similarity_threshold: float = 0.95, compare_files: bool = True, judge: Judge | None = None
    ) -> None:
        self.similarity_threshold = similarity_threshold
        self.compare_files = compare_files
        self.judge = judge

    def verify(self, pivot: Pivot, action: dict[str, Any], outcome: Outcome | None = None) -> Verdict:
        command = command_of_message(action) or ""
        expert = command_of_message(pivot.expert) or ""
        data = outcome.data if isinstance(outcome, Outcome) else {}
        sample: CommandResult | None = data.get("result")
        reference: CommandResult | None = data.get("expert")
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
                1.0, "same_command", "the command is the expert's up to spacing and quoting", extra=extra
            )
        differences: list[str] = []
        if sample is not None and reference is not None and not reference.timed_out:
            mine, theirs = (
                effect_of(sample, data.get("before", {})),
                effect_of(reference, data.get("before", {})),
            )
            differences = [
                key
                for key in ("exit_code", "output", "files")
                if mine[key] != theirs[key] and (key != "files" or self.compare_files)
            ]
            extra["differences"] = differences
            if not differences:
                return Verdict(
                    1.0,
                    "equivalent_effect",
                    "same exit status, output and file changes as the expert's command",
                    extra=extra,
                )
        same_exit = sample is not None and reference is not None and sample.exit_code == reference.exit_code
        if similarity >= self.similarity_threshold and same_exit:
            return Verdict(
                1.0, "similar_command", f"similarity {similarity:.2f} and the same exit status", extra=extra
            )
        if self.judge is not None:
            judged = self.judge(pivot, action, outcome)
            return Verdict(float(judged), "judge", "decided by the LLM judge", extra=extra)
        if sample is None or reference is None:
            detail = (
                "no effect to compare (the expert's command could not be run); similarity below threshold"
            )
        else:
            detail = "differs from the expert's command in " + ", ".join(differences or ["effect"])
        return Verdict(0.0, "different_effect", f"{detail} (similarity {similarity:.2f})", extra=extra)
