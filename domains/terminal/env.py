"""TerminalEnv: `pivot/terminal-v0`, the next bash command at a pivot of a terminal trajectory.

reset() restores the pivot's prefix state (filesystem and shell state after the expert's earlier
commands): built once per pivot and snapshotted (PrefixCache), then forked for this sample.
step() runs the sampled command in the fork, with the hard timeout and limits, and scores it with
the functional verifier against the expert command's effect from the same state.

A pivot whose context says `"executable": false` (a Pivot-v1 terminal row whose task image does not
ship) runs nothing: no sandbox is made, its step is scored without execution (the verifier's
string level: bash reads the command as the expert's) and `info["executed"]` is False, with
`info["output"]["reason"]`. An executed step has `info["executed"]` True.

Making the env is cheap: the sandbox backend is chosen, and the base image built when missing, on
the first reset. Each env owns its sandboxes, snapshots and directories; closing it removes
those and nothing of another env's, in this process or any other.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from pivot_envs.env import InfrastructureError, Outcome, ParsedAction, PivotEnv, PivotSource
from pivot_envs.errors import UnknownNameError
from pivot_envs.pivot import Pivot, read_pivots
from pivot_envs.sandboxes import CommandResult, SandboxError, SandboxLimits, file_changes
from pivot_envs.sandboxes.backends import SANDBOXES, SandboxConfig, SandboxedEnv
from pivot_envs.verifiers import StrictVerifier, Verifier

from .parse import canonical_message, command_of_message, parse_action, parse_command, text_beside
from .verifier import TerminalVerifier


@dataclass
class TerminalConfig(SandboxConfig):
    """Options of `pivot/terminal-v0` (keyword arguments of gym.make): the sandbox options alone."""


def bundled_pivots() -> list[Pivot]:
    """The domain's bundled pivots (generated from data/tasks.toml)."""
    path = resources.files("pivot_envs.domains.terminal") / "data" / "pivots.jsonl"
    with resources.as_file(path) as file:
        return read_pivots(file)


def executable(pivot: Pivot) -> bool:
    """Whether the pivot's commands can run here (False for rows whose task image does not ship)."""
    return pivot.context.get("executable", True) is not False


class TerminalEnv(SandboxedEnv, PivotEnv):
    """The terminal domain's env (see the module docstring); `sandbox="auto"|"docker"|"bwrap"`.

    Keystrokes that end the interactive shell (`{"keystrokes": "C-d"}`) are the action's doing:
    reward 0, valid, category "shell_exited".
    """

    domain = "terminal"
    default_verifier = "functional"
    verifiers = {"strict": StrictVerifier, "functional": TerminalVerifier}
    # The canonical form keeps the command only: the env hands the text beside it to the verifier (`call_text`).
    call_text_of = staticmethod(text_beside)

    def __init__(
        self,
        pivots: PivotSource = None,
        verifier: str | Verifier | None = None,
        verifier_config: dict[str, Any] | None = None,
        render_mode: str | None = None,
        sandbox: str = "auto",
        limits: SandboxLimits | dict[str, Any] | None = None,
        prefix_cache: int = 16,
        warm_pool: int = 4,
        build_image: bool = True,
    ) -> None:
        if sandbox not in SANDBOXES:
            raise UnknownNameError("sandbox", sandbox, SANDBOXES)
        super().__init__(pivots, verifier, verifier_config, render_mode)
        # Expert and parsed actions share one canonical form, so the strict verifier compares like with like.
        self.pivots = [self._canonical_expert(pivot) for pivot in self.pivots]
        self.config = TerminalConfig(sandbox, prefix_cache, warm_pool, build_image)
        self.limits = SandboxLimits(**limits) if isinstance(limits, dict) else (limits or SandboxLimits())
        self._state: Any = None
        self._shell_exited = False

    @staticmethod
    def _canonical_expert(pivot: Pivot) -> Pivot:
        found = parse_command(pivot.expert)
        if found.command is None or found.keys:
            return pivot
        return dataclasses.replace(pivot, expert=canonical_message(found.command.strip("\n")))

    # -- domain hooks ------------------------------------------------------------------------------

    def default_pivots(self) -> list[Pivot]:
        return bundled_pivots()

    def parse(self, action: Any) -> ParsedAction:
        # bash's syntax check costs a process: the verifier runs it only for commands that exit 2.
        return parse_action(action, check_syntax=False)

    def restore(self, pivot: Pivot) -> None:
        self._close_fork()
        self._state = None
        if not executable(pivot):
            return
        self._ensure_backend()
        self._state = self._fork_state(pivot.id, self.prefixes.get(pivot))

    def execute(self, pivot: Pivot, action: dict[str, Any]) -> Outcome:
        call_id = action["tool_calls"][0].get("id", "call_0") if action.get("tool_calls") else "call_0"
        if not executable(pivot):
            reason = str(
                pivot.context.get("not_executable_reason") or "the pivot's task is not available here"
            )
            return Outcome(
                messages=[{"role": "tool", "tool_call_id": call_id, "content": f"[not executed: {reason}]"}],
                output={"executed": False, "reason": reason},
                data={"executed": False, "reason": reason},
            )
        state = self._state
        if state is None or not state.replayable or self.sandbox is None:
            raise InfrastructureError(
                state.reason if state is not None else f"pivot {pivot.id}: no prefix state"
            )
        found = parse_command(action)
        try:
            if found.keys:
                result = self._send_keys(found.command or "")
            else:
                result = self.sandbox.run(found.command or "", files=True)
        except SandboxError as error:
            raise InfrastructureError(f"pivot {pivot.id}: {error}") from error
        finally:
            # One sample per fork: drop it now rather than at the next reset.
            self._close_fork()
        changes = file_changes(state.before, result.files) if result.files is not None else []
        reply = (
            result.output
            + ("\n[timed out]" if result.timed_out else "")
            + f"\n[exit code {result.exit_code}]"
        )
        # Undecodable bytes (lone surrogates) in paths and output become U+FFFD in PivotEnv.step.
        output = {
            "executed": True,
            **result.to_dict(),
            "files_changed": [{"path": change.path, "kind": change.kind} for change in changes],
        }
        return Outcome(
            messages=[{"role": "tool", "tool_call_id": call_id, "content": reply}],
            output=output,
            data={
                "executed": True,
                "result": result,
                "expert": state.expert,
                "expert_repeat": state.expert_repeat,
                "before": state.before,
                "shell_before": state.shell_before,
                "git_before": state.git_before,
            },
        )

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        self._shell_exited = False
        observation, reward, terminated, truncated, info = super().step(action)
        if self._shell_exited and info["valid"] and reward == 0.0:
            # The keys ended the shell (C-d): the action's doing, named as such, not an infrastructure failure.
            info.update(category="shell_exited", detail="the keystrokes ended the interactive shell")
            self._last["info"] = info
        output = info.get("output")
        info["executed"] = bool(output.get("executed")) if isinstance(output, dict) else False
        return observation, reward, terminated, truncated, info

    # -- sandbox management ------------------------------------------------------------------------

    def _send_keys(self, keys: str) -> CommandResult:
        from pivot_envs.sandboxes.channel import disk_check
        from pivot_envs.sandboxes.shell import InteractiveShell

        # The shell's output is cut to the output limit, and the keys' writes are held to the disk
        # limit by the check the sandbox's commands run under: the tree the host counts is the
        # container's upper layer (Docker; None where it cannot be read) or the sandbox's directory.
        root = getattr(self.sandbox, "upper", None) or getattr(self.sandbox, "directory", None)
        shell = InteractiveShell(
            self.sandbox.interactive_argv(),
            timeout=self.limits.timeout,
            limits=self.limits,
            check=disk_check(root, self.limits) if root is not None else None,
        )
        try:
            result = shell.send_keys(keys)
            self._shell_exited = shell.exited
            return result
        finally:
            shell.close()

    def base_image(self) -> tuple[Any, str]:
        from .image import base_rootfs, image_tag

        return base_rootfs(build=self.config.build_image), image_tag()

    def make_prefixes(self, rootfs: Any, docker_base: str) -> Any:
        from .prefix import PrefixCache

        return PrefixCache(self.backend, self.config.prefix_cache, rootfs=rootfs, docker_base=docker_base)

    def close(self) -> None:
        """Remove every sandbox, snapshot, container and image this env made (and nothing of another env's)."""
        self._close_sandboxes()
        super().close()

    def render(self) -> str | None:
        text = super().render()
        if text is not None and self._last is not None:
            command = command_of_message(self._last["action"]) or ""
            text += f"\n$ {command}\n{json.dumps(self._last['info'].get('output'))[:500]}"
        return text
