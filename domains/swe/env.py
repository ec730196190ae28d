"""SweEnv: `pivot/swe-v0`, the next coding-agent tool call at a pivot, run in a real repository.

reset() restores the pivot's prefix state: the task's repository (bug applied, committed) plus the
expert's earlier tool calls, built once per pivot, checked against the tree hash the pivot records
and snapshotted (prefix.PrefixCache), then forked for this sample. step() parses the one tool call
(bash, str_replace_editor, submit), runs it in the fork with the sandbox's limits, and scores it
(default: the `effect` verifier, which compares with the expert's call run from the same state).

A pivot whose context says `"executable": false` (an external trace whose repository image is not
here, see external.py) runs nothing: its step is scored without execution (`effect` falls back to
the `nemo` level) and `info["executed"]` is False, with `info["output"]["reason"]`. A stale pivot
(its tree hash differs from the rebuilt prefix's) is not scored: valid=False, the reason in
info["detail"].

Making the env is cheap: the sandbox backend is chosen, and the base image built when missing, on
the first reset that needs a sandbox. Closing the env removes every sandbox and snapshot it made.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from importlib import resources
from typing import Any

from pivot_envs.config import option
from pivot_envs.env import InfrastructureError, Outcome, ParsedAction, PivotEnv, PivotSource
from pivot_envs.errors import UnknownNameError
from pivot_envs.pivot import Pivot, read_pivots
from pivot_envs.sandboxes import SandboxError, SandboxLimits
from pivot_envs.sandboxes.backends import SANDBOXES, SandboxConfig, SandboxedEnv
from pivot_envs.verifiers import StrictVerifier, Verifier

from .parse import call_of, canonical_call, parse_action, text_beside
from .prefix import repo_of
from .tools import HARNESSES, default_tools, execute_call
from .verifier import EffectVerifier, KindVerifier, NameVerifier, NemoVerifier

# A test run of the bundled repository takes seconds; the terminal domain's 10 s is too tight.
DEFAULT_LIMITS = {"timeout": 30.0}


@dataclass
class SweConfig(SandboxConfig):
    """Options of `pivot/swe-v0` (keyword arguments of gym.make, besides pivots, verifier and limits):
    the sandbox options, with fewer forks made ahead, and the shell harness."""

    warm_pool: int = option(2, "forks made ahead per snapshot")
    harness: str | None = option(
        None,
        "shell harness: persistent (one session, OpenHands) or fresh (bash -c per call, "
        "mini-swe-agent); default: each pivot's context['harness'], else persistent",
    )


def bundled_pivots() -> list[Pivot]:
    """The domain's bundled pivots (more-itertools tasks; data/pivots.jsonl.gz, made by `pivotrl swe build`)."""
    path = resources.files("pivot_envs.domains.swe") / "data" / "pivots.jsonl.gz"
    with resources.as_file(path) as file:
        return read_pivots(file)


def executable(pivot: Pivot) -> bool:
    """Whether the pivot's actions can run (False for external traces without their repository)."""
    return pivot.context.get("executable", True) is not False


class SweEnv(SandboxedEnv, PivotEnv):
    """The SWE domain's env (see the module docstring)."""

    domain = "swe"
    default_verifier = "effect"
    verifiers = {
        "strict": StrictVerifier,
        "name": NameVerifier,
        "kind": KindVerifier,
        "nemo": NemoVerifier,
        "effect": EffectVerifier,
    }
    # The canonical form keeps the call only: the env hands the text beside it to the verifier (`call_text`).
    call_text_of = staticmethod(text_beside)

    def __init__(
        self,
        pivots: PivotSource = None,
        verifier: str | Verifier | None = None,
        verifier_config: dict[str, Any] | None = None,
        render_mode: str | None = None,
        sandbox: str = "auto",
        harness: str | None = None,
        limits: SandboxLimits | dict[str, Any] | None = None,
        prefix_cache: int = 16,
        warm_pool: int = 2,
        build_image: bool = True,
    ) -> None:
        if sandbox not in SANDBOXES:
            raise UnknownNameError("sandbox", sandbox, SANDBOXES)
        if harness is not None and harness not in HARNESSES:
            raise UnknownNameError("harness", harness, HARNESSES)
        super().__init__(pivots, verifier, verifier_config, render_mode)
        # Expert and parsed actions share one canonical form; pivots without tools get the harness's.
        self.pivots = [self._canonical(pivot) for pivot in self.pivots]
        self.config = SweConfig(sandbox, prefix_cache, warm_pool, build_image, harness)
        if isinstance(limits, SandboxLimits):
            self.limits = limits
        else:
            self.limits = SandboxLimits(**{**DEFAULT_LIMITS, **(limits or {})})
        self._state: Any = None

    @staticmethod
    def _canonical(pivot: Pivot) -> Pivot:
        changes: dict[str, Any] = {}
        if not pivot.tools:
            changes["tools"] = default_tools()
        if pivot.expert.get("tool_calls") and len(pivot.expert["tool_calls"]) == 1:
            changes["expert"] = canonical_call(*call_of(pivot.expert))
        return dataclasses.replace(pivot, **changes) if changes else pivot

    # -- domain hooks ------------------------------------------------------------------------------

    def default_pivots(self) -> list[Pivot]:
        return bundled_pivots()

    def parse(self, action: Any) -> ParsedAction:
        return parse_action(action)

    def restore(self, pivot: Pivot) -> None:
        self._close_fork()
        self._state = None
        if not executable(pivot):
            return
        self._ensure_backend()
        self._state = self._fork_state(pivot.id, self.prefixes.get(pivot))

    def execute(self, pivot: Pivot, action: dict[str, Any]) -> Outcome:
        name, arguments = call_of(action)
        call_id = action["tool_calls"][0].get("id", "call_0")
        if not executable(pivot):
            reason = str(
                pivot.context.get("not_executable_reason") or "the pivot's repository is not available here"
            )
            text = f"[not executed: {reason}]"
            return Outcome(
                messages=[{"role": "tool", "tool_call_id": call_id, "content": text}],
                output={"executed": False, "reason": reason},
                data={"executed": False, "reason": reason},
            )
        state = self._state
        if state is None or not state.replayable or self.sandbox is None:
            raise InfrastructureError(
                state.reason if state is not None else f"pivot {pivot.id}: no prefix state"
            )
        repo = repo_of(pivot)
        harness = self.prefixes.harness_of(pivot)
        try:
            if isinstance(self.verifier, EffectVerifier):
                self.prefixes.expert_effect(pivot, state)
            result = execute_call(self.sandbox, name, arguments, harness=harness, workdir=repo.workdir)
        except SandboxError as error:
            raise InfrastructureError(f"pivot {pivot.id}: {error}") from error
        output = {
            "executed": True,
            "tool": name,
            "kind": result.kind,
            "error": result.error,
            "exit_code": result.exit_code,
            "text": result.text,
        }
        return Outcome(
            messages=[{"role": "tool", "tool_call_id": call_id, "content": result.text}],
            output=output,
            data={
                "executed": True,
                "result": result,
                "state": state,
                "sandbox": self.sandbox,
                "repo": repo,
                "workdir": repo.workdir,
                "timeout": self.limits.timeout,
            },
        )

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        try:
            observation, reward, terminated, truncated, info = super().step(action)
        finally:
            # One sample per fork: the verifier has read what it needs; drop it now, not at the next reset.
            self._close_fork()
        output = info.get("output")
        info["executed"] = bool(output.get("executed")) if isinstance(output, dict) else False
        return observation, reward, terminated, truncated, info

    # -- sandbox management ------------------------------------------------------------------------

    def base_image(self) -> tuple[Any, str]:
        # the terminal domain's base image: its package list serves the SWE tasks too
        from pivot_envs.domains.terminal.image import base_rootfs, image_tag

        return base_rootfs(build=self.config.build_image), image_tag()

    def make_prefixes(self, rootfs: Any, docker_base: str) -> Any:
        from .prefix import PrefixCache

        return PrefixCache(self.backend, self.config.harness, self.config.prefix_cache)

    def close(self) -> None:
        """Remove every sandbox, snapshot, container and image this env made (and nothing of another env's)."""
        self._close_sandboxes()
        super().close()
