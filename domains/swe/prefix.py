"""Prefix states of SWE pivots: the repository after the task's start state and the expert's earlier
tool calls, built once per pivot, verified by its tree hash and snapshotted.

Two levels, each built once and kept in a bounded LRU cache:

- the task's start state (repo.start_sandbox: the repository with the bug applied and committed,
  the pinned test environment exported in the shell; plus the editor installed), per (repository,
  bug): every pivot of a task forks it;
- the pivot's prefix state: a fork of the start state where the prefix's tool calls are replayed
  with the same tools and harness (bash, str_replace_editor), then checked against the pivot's
  `context["tree_hash"]`. A mismatch means the pivot is stale (its repository or tools changed
  since it was recorded): the state is marked not replayable, and every step there is
  valid=False with the reason, never scored against the wrong files.

With the prefix, the expert's own next call is run once from a fork (the reference the effect
verifier compares samples against): its ToolResult and, for an edit, its hunks, AST digests and
the task's test results after it; at a submit, whether the FAIL_TO_PASS tests pass; for a test
run, the outcome of the tests its command names. Every test result is the verifier's own clean
run (`effects.run_tests`), never read from what a command printed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from pivot_envs.pivot import Pivot
from pivot_envs.sandboxes import SandboxError, Snapshot, snapshot_cache
from pivot_envs.sandboxes.snapshot_cache import SnapshotCache, freeze

from .effects import EditEffect, TestReport, edit_effect, run_tests
from .parse import call_of
from .testruns import named_tests
from .tools import EDITOR_WARM_UP, ToolResult, execute_call, install_editor, tree_hash

SETUP_TIMEOUT = 120.0


@dataclass
class PrefixState(snapshot_cache.PrefixState):
    """A built prefix: its snapshot, manifest and tree hash, and the expert call's effect there."""

    tree_hash: str = ""
    expert: ToolResult | None = None
    expert_edit: EditEffect | None = None
    expert_tests: dict[str, bool] = field(default_factory=dict)
    expert_run: TestReport | None = None
    expert_done: bool = False


def task_of(pivot: Pivot) -> dict[str, Any]:
    """The pivot's task record (`context["task"]`, an empty dict when there is none)."""
    task = pivot.context.get("task")
    return task if isinstance(task, dict) else {}


def task_tests(pivot: Pivot) -> tuple[list[str], list[str]]:
    """The task's FAIL_TO_PASS and PASS_TO_PASS test ids."""
    task = task_of(pivot)
    return [str(t) for t in task.get("fail_to_pass") or []], [str(t) for t in task.get("pass_to_pass") or []]


def repo_of(pivot: Pivot) -> Any:
    """The pivot's RepoSpec: an external trace's Docker image (`context["image"]`, the repository at
    `context["workdir"]`), else the repository the context names (see repo.resolve_repo)."""
    from .repo import RepoSpec, resolve_repo

    image = pivot.context.get("image")
    if image:
        return RepoSpec(
            name=str(image), archive="", workdir=str(pivot.context.get("workdir") or "/testbed"), env={}
        )
    return resolve_repo(pivot.context)


def prefix_calls(pivot: Pivot) -> list[tuple[str, Any]]:
    """The (name, arguments) of every tool call of the prefix's assistant turns, in order."""
    calls = []
    for message in pivot.messages:
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                function = call.get("function", call) if isinstance(call, dict) else {}
                calls.append(call_of({"tool_calls": [{"function": function}]}))
    return calls


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


class PrefixCache(snapshot_cache.PrefixCache[PrefixState]):
    """Builds start and prefix states on demand; keeps at most `capacity` of each (LRU).

    `builds` counts prefix builds (G resets at one pivot: one build, G forks); `starts` start-state builds.
    """

    def __init__(self, backend: Any, harness: str | None, capacity: int = 16) -> None:
        super().__init__(backend, capacity)
        self.harness = harness
        self.starts = 0
        self._starts: SnapshotCache[Snapshot] = SnapshotCache(backend, capacity, lambda snapshot: snapshot)

    def harness_of(self, pivot: Pivot) -> str:
        """The pivot's shell harness: the env's choice, else the pivot's `context["harness"]`, else persistent."""
        return self.harness or str(pivot.context.get("harness") or "persistent")

    def prefix_key(self, pivot: Pivot) -> str:
        """What identifies a prefix state: repository, bug, harness, the prefix's calls and the expert's."""
        return _digest(
            [
                repo_of(pivot).to_dict(),
                task_of(pivot).get("bug_patch"),
                self.harness_of(pivot),
                prefix_calls(pivot),
                pivot.expert.get("tool_calls"),
                pivot.context.get("tree_hash"),
            ]
        )

    def _start(self, pivot: Pivot) -> Snapshot:
        """The task's start state (built once per repository and bug)."""
        from .repo import start_sandbox

        repo = repo_of(pivot)
        bug = task_of(pivot).get("bug_patch")

        def build() -> Snapshot:
            self.starts += 1
            if pivot.context.get("image"):
                # bubblewrap runs its base alone: it refuses an image (ImageUnavailableError, a SandboxError).
                sandbox = self.backend.new_sandbox(repo.workdir, repo.name)
            else:
                sandbox = start_sandbox(self.backend, repo, bug)
            try:
                install_editor(sandbox)
                return sandbox.snapshot()
            finally:
                sandbox.close()

        return self._starts.get(_digest([repo.to_dict(), bug]), build)

    def build(self, pivot: Pivot, key: str) -> PrefixState:
        from .repo import RepoError

        harness = self.harness_of(pivot)
        sandbox = None
        try:
            repo = repo_of(pivot)
            workdir = repo.workdir
            sandbox = self.backend.fork(self._start(pivot))
            for index, (name, arguments) in enumerate(prefix_calls(pivot)):
                result = execute_call(sandbox, name, arguments, harness=harness, workdir=workdir, files=False)
                if result.error == "timeout":
                    return PrefixState(
                        key, False, f"pivot {pivot.id}: prefix call {index} ({name}) timed out"
                    )
            digest = tree_hash(sandbox, workdir)
            recorded = pivot.context.get("tree_hash")
            if recorded and recorded != digest:
                return PrefixState(
                    key,
                    False,
                    f"pivot {pivot.id} is stale: its prefix leaves the repository at tree "
                    f"{digest[:12]}, the pivot recorded {str(recorded)[:12]}",
                )
            before, snapshot = freeze(sandbox)
        except (SandboxError, RepoError) as error:
            return PrefixState(key, False, f"pivot {pivot.id}: {error}")
        finally:
            if sandbox is not None:
                sandbox.close()
        state = PrefixState(key, True, snapshot=snapshot, before=before, tree_hash=digest)
        # Each warm fork starts the editor ahead: an editor call there starts no Python.
        self.backend.prewarm(snapshot, setup=EDITOR_WARM_UP)
        return state

    def expert_effect(self, pivot: Pivot, state: PrefixState) -> None:
        """Run the expert's call once from a fork of `state` and keep what the effect verifier compares
        against (done on the first sample that needs it; later calls do nothing)."""
        if state.expert_done or not state.replayable or not pivot.expert.get("tool_calls"):
            return
        state.expert_done = True
        repo, harness = repo_of(pivot), self.harness_of(pivot)
        name, arguments = call_of(pivot.expert)
        fail_to_pass, pass_to_pass = task_tests(pivot)
        limits = self.backend.limits
        fork = self.backend.fork(state.snapshot)
        try:
            state.expert = execute_call(fork, name, arguments, harness=harness, workdir=repo.workdir)
            if state.expert.kind == "edit":
                state.expert_edit = edit_effect(fork, repo.workdir, state.tree_hash, limits.timeout)
                state.expert_tests = run_tests(fork, repo, fail_to_pass + pass_to_pass, limits.timeout).passed
            elif state.expert.kind == "submit":
                state.expert_tests = run_tests(fork, repo, fail_to_pass, limits.timeout).passed
            elif state.expert.kind == "test" and isinstance(arguments, dict):
                # The outcome of the tests the expert's command names, measured the verifier's way
                # (not for a run of every test: the whole suite can outlast a call's timeout).
                named = named_tests(str(arguments.get("command", "")))
                if named != {"*"}:
                    state.expert_run = run_tests(fork, repo, sorted(named), limits.timeout)
        except SandboxError:
            state.expert = None  # the verifier then says it has no reference effect
        finally:
            fork.close()

    def clear(self) -> None:
        """Release every cached snapshot (prefix and start states)."""
        super().clear()
        self._starts.clear()
