"""Prefix states: the sandbox after a task's setup and the expert's first t commands, built once.

A pivot's state is the filesystem and the shell state (working directory, exported variables,
kept by the runner in the sandbox) after the expert's earlier commands. PrefixCache builds it
once per distinct prefix, snapshots it, runs the expert's own next command twice, each from a
fresh fork (the reference effect the functional verifier compares against, and what of it
repeats), and keeps the snapshots in a bounded LRU cache; every sample then forks from the
snapshot. A setup command that fails, a prefix command that times out or exits differently from
the recorded trajectory, or an image that is not available marks the pivot not replayable, with
the reason.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pivot_envs.pivot import Pivot
from pivot_envs.sandboxes import CommandResult, SandboxError, Snapshot, snapshot_cache

from .parse import parse_command

BASE_IMAGE = "pivot-envs/terminal-base"
SETUP_TIMEOUT = 120.0


@dataclass
class PrefixState(snapshot_cache.PrefixState):
    """A built prefix: its snapshot, the workspace manifest there, and the expert command's effect."""

    expert: CommandResult | None = None
    expert_repeat: CommandResult | None = None  # the expert's command run again from the same state
    shell_before: str | None = None  # the saved shell state there (CommandResult.shell)
    git_before: str | None = None  # the workspace's git repository state there (CommandResult.git)


def prefix_commands(pivot: Pivot) -> tuple[list[str], str]:
    """The expert's commands before the pivot, and "" or why they cannot be replayed."""
    commands = []
    for turn, message in enumerate(pivot.messages):
        if message.get("role") != "assistant":
            continue
        found = parse_command(message)
        if found.command is not None and not found.keys:
            commands.append(found.command)
        elif found.category in (
            "unsupported_tool",
            "multiple_commands",
            "malformed_arguments",
            "incomplete_command",
            "invalid_command",
        ):
            return commands, f"prefix message {turn} cannot be replayed: {found.detail}"
    return commands, ""


def setup_commands(context: dict[str, Any]) -> list[str]:
    """A task's setup commands (`context["setup"]`: a script or a list of commands)."""
    setup = context.get("setup") or []
    return [setup] if isinstance(setup, str) else [str(command) for command in setup]


def pivot_image(pivot: Pivot) -> str:
    """The image a pivot's task runs in: `context["image"]`, or NeMo-Gym's `docker_image`, or the base image."""
    return str(pivot.context.get("image") or pivot.context.get("docker_image") or BASE_IMAGE)


def prefix_key(pivot: Pivot) -> str:
    """What identifies a prefix state: image, workdir, setup and the expert's earlier commands."""
    commands, _ = prefix_commands(pivot)
    expert = parse_command(pivot.expert).command
    data = [
        pivot_image(pivot),
        pivot.context.get("workdir", "/app"),
        setup_commands(pivot.context),
        commands,
        expert,
    ]
    return hashlib.sha256(json.dumps(data).encode()).hexdigest()[:16]


class PrefixCache(snapshot_cache.PrefixCache[PrefixState]):
    """Builds terminal prefix states on demand (see `snapshot_cache.PrefixCache`: LRU, `builds`)."""

    def __init__(
        self, backend: Any, capacity: int = 16, rootfs: Path | None = None, docker_base: str = ""
    ) -> None:
        super().__init__(backend, capacity)
        self.rootfs = rootfs
        self.docker_base = docker_base

    def prefix_key(self, pivot: Pivot) -> str:
        return prefix_key(pivot)

    def _image(self, pivot: Pivot) -> str | None:
        """The image the pivot's sandbox starts from; the base image: `docker_base` when given, else None."""
        image = pivot_image(pivot)
        docker_only = pivot.context.get(
            "docker_only"
        )  # why the set-up needs Docker (a Harbor task's Dockerfile)
        if docker_only and self.backend.name != "docker":
            raise SandboxError(f"the pivot replays on Docker only: {docker_only}")
        if image.split(":")[0] == BASE_IMAGE:
            return self.docker_base or None
        return image

    def build(self, pivot: Pivot, key: str) -> PrefixState:
        commands, reason = prefix_commands(pivot)
        if reason:
            return PrefixState(key, False, f"pivot {pivot.id}: {reason}")
        expert = parse_command(pivot.expert).command
        workdir = str(pivot.context.get("workdir", "/app"))
        sandbox = None
        try:
            sandbox = self.backend.new_sandbox(workdir, self._image(pivot))
            for command in setup_commands(pivot.context):
                result = sandbox.run(command, timeout=SETUP_TIMEOUT)
                if not result.ok:
                    return PrefixState(
                        key,
                        False,
                        f"pivot {pivot.id}: setup command failed "
                        f"(exit {result.exit_code}): {command[:200]!r}: {result.output[-300:]}",
                    )
            expected = pivot.context.get("prefix_exit_codes")
            for index, command in enumerate(commands):
                result = sandbox.run(command)
                want = expected[index] if isinstance(expected, list) and index < len(expected) else 0
                if result.timed_out or result.exit_code != want:
                    return PrefixState(
                        key,
                        False,
                        f"pivot {pivot.id}: prefix command {index} {command[:200]!r} "
                        f"{'timed out' if result.timed_out else f'exited {result.exit_code}, expected {want}'}",
                    )
            probe = sandbox.run(
                ":", files=True
            )  # the manifest, shell state and git state the expert's command starts from
            before, snapshot = probe.files or {}, sandbox.snapshot()
        except SandboxError as error:
            return PrefixState(key, False, f"pivot {pivot.id}: {error}")
        finally:
            if sandbox is not None:
                sandbox.close()
        state = PrefixState(
            key, True, snapshot=snapshot, before=before, shell_before=probe.shell, git_before=probe.git
        )
        if expert is not None:
            # Twice: what of the effect differs between the two runs is what the verifier cannot measure.
            state.expert = self._run_expert(snapshot, expert)
            state.expert_repeat = self._run_expert(snapshot, expert) if state.expert is not None else None
        self.backend.prewarm(snapshot)
        return state

    def _run_expert(self, snapshot: Snapshot, expert: str) -> CommandResult | None:
        """The expert's command run in a fresh fork of `snapshot`; None when the sandbox fails (the
        verifier then has no effect of the expert's to compare with)."""
        fork = self.backend.fork(snapshot)
        try:
            return fork.run(expert, files=True)
        except SandboxError:
            return None
        finally:
            fork.close()
