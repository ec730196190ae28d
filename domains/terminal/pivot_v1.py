"""Pivot-v1 terminal rows replayed in the terminal domain's base image (opt-in): those whose prefix replays as
recorded become executable pivots (`pivotrl sandbox replay-pivot-v1`, or `extract_pivot_v1(replay=...)`).

The rows come from pivot_envs.formats.nemotron_pivot_v1, which marks every terminal row unexecutable:
the task files and images do not ship. Replaying is this domain's business, so it lives here.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Iterator
from typing import Any

from pivot_envs.formats.nemotron_pivot_v1 import SETS
from pivot_envs.pivot import Pivot

# -- replaying terminal rows in the base image ---------------------------------------------------------

REPLAY_ROW_TIMEOUT = 30.0  # seconds one row's replay may take, all its commands together
MISSING_PROGRAM = (126, 127)  # bash's exit status for a program that is not there or cannot run


def replay_terminal_prefix(pivot: Pivot, backend: Any, row_timeout: float = REPLAY_ROW_TIMEOUT) -> str:
    """Replay a terminal pivot's prefix in a fresh sandbox of the base image: "" when every prefix
    command (as the terminal domain extracts them) exits as recorded (`context["prefix_exit_codes"]`,
    else 0) within `row_timeout` seconds in all, and the expert's own command then finds its program
    (no exit 126/127) and ends in time; otherwise why not.

    `backend` is a sandbox backend (bubblewrap or Docker) on the terminal domain's base image; each
    command gets at most the backend's own per-command timeout, the one the env replays with.
    """
    return _replay(pivot, backend, row_timeout)[0]


def _replay(pivot: Pivot, backend: Any, row_timeout: float) -> tuple[str, int | None]:
    """`replay_terminal_prefix`'s reason, and the index of the prefix command that failed (None: none did)."""
    from pivot_envs.domains.terminal.parse import parse_command
    from pivot_envs.domains.terminal.prefix import BASE_IMAGE, pivot_image, prefix_commands, setup_commands
    from pivot_envs.sandboxes import SandboxError

    commands, reason = prefix_commands(pivot)
    if reason:
        return reason, None
    if pivot_image(pivot).split(":")[0] != BASE_IMAGE or setup_commands(pivot.context):
        return "the row names its own image or setup, which the replay does not have", None
    expert = parse_command(pivot.expert)
    workdir = str(pivot.context.get("workdir", "/app"))
    expected = pivot.context.get("prefix_exit_codes")
    deadline = time.monotonic() + row_timeout
    per_command = float(getattr(getattr(backend, "limits", None), "timeout", None) or row_timeout)
    sandbox = None
    try:
        sandbox = backend.create(BASE_IMAGE, workdir) if backend.name == "docker" else backend.create(workdir)
        steps = [(f"prefix command {i}", c) for i, c in enumerate(commands)]
        if expert.command is not None and not expert.keys:
            steps.append(("the expert's command", expert.command))
        for index, (what, command) in enumerate(steps):
            left = deadline - time.monotonic()
            if left <= 0:
                return f"the replay ran past its {row_timeout:g}s bound before {what}", None
            result = sandbox.run(command, timeout=min(left, per_command))
            shown = f"{what} {command.strip()[:120]!r}"
            if result.timed_out:
                return f"{shown} timed out on replay in the base image", None
            if index == len(commands):  # the expert's: it may exit otherwise, not miss its program
                if result.exit_code in MISSING_PROGRAM:
                    return (
                        f"{shown} needs a program the base image lacks: {result.output[-160:].strip()}",
                        None,
                    )
                continue
            want = expected[index] if isinstance(expected, list) and index < len(expected) else 0
            if result.exit_code != want:
                return (
                    f"{shown} exited {result.exit_code} on replay in the base image, recorded {want}: "
                    f"{result.output[-160:].strip()}",
                    index,
                )
    except SandboxError as error:
        return f"the replay's sandbox failed: {error}", None
    finally:
        if sandbox is not None:
            sandbox.close()
    return "", None


def replay_backend(command_timeout: float | None = None) -> Any:
    """A bubblewrap backend on the terminal domain's base image for `mark_replayable` (close it after);
    raises SandboxError saying what to install or build when bubblewrap or the image is missing."""
    from pivot_envs.domains.terminal.image import base_rootfs
    from pivot_envs.sandboxes import SandboxLimits
    from pivot_envs.sandboxes.backends import resolve_sandbox
    from pivot_envs.sandboxes.bwrap_backend import BwrapBackend

    resolve_sandbox("bwrap")
    limits = SandboxLimits() if command_timeout is None else SandboxLimits(timeout=command_timeout)
    return BwrapBackend(base_rootfs(build=False), limits, warm_pool=0)


def _prefix_digests(pivot: Pivot) -> list[str]:
    """A digest of each leading run of the pivot's prefix commands (the workdir first): rows of one
    trajectory share them, so a failed replay settles every row that starts with its commands."""
    from pivot_envs.domains.terminal.prefix import prefix_commands

    commands, _ = prefix_commands(pivot)
    digest = hashlib.sha256(json.dumps([pivot.context.get("workdir", "/app")]).encode())
    out = []
    for command in commands:
        digest.update(json.dumps(command).encode())
        out.append(digest.copy().hexdigest()[:24])
    return out


def replayable_candidate(pivot: Pivot) -> bool:
    """A Pivot-v1 terminal pivot still marked unexecuted: what `mark_replayable` replays."""
    return pivot.context.get("pivot_v1_set") == "terminal" and pivot.context.get("executable") is False


def mark_replayable(
    pivots: Iterable[Pivot],
    backend: Any,
    *,
    row_timeout: float = REPLAY_ROW_TIMEOUT,
    max_rows: int | None = None,
    progress: bool = True,
) -> Iterator[Pivot]:
    """Yield `pivots`, each Pivot-v1 terminal pivot (the first `max_rows` of them) replayed by
    `replay_terminal_prefix` on `backend`: `context["executable"] = True` where it replays, else it
    keeps its reason with what failed in the replay added. Other pivots pass unchanged.

    A prefix whose commands failed on replay settles, without a sandbox, every later row that
    starts with the same commands up to the failing one (the rows of one trajectory do).
    """
    from pivot_envs.config import progress_bar

    failed: dict[str, str] = {}
    bar = progress_bar(desc="replaying terminal rows", unit=" rows", total=max_rows, enabled=progress)
    replayed = 0
    try:
        for pivot in pivots:
            if not replayable_candidate(pivot) or (max_rows is not None and replayed >= max_rows):
                yield pivot
                continue
            replayed += 1
            digests = _prefix_digests(pivot)
            reason = next((failed[d] for d in digests if d in failed), None)
            if reason is None:
                reason, index = _replay(pivot, backend, row_timeout)
                if index is not None and index < len(digests):  # exits differ: not a timing matter
                    failed[digests[index]] = reason
            if reason:
                base = pivot.context.get("not_executable_reason") or SETS["terminal"].not_executable_reason
                pivot.context["not_executable_reason"] = f"{base}; replayed in the base image: {reason}"
                pivot.context["replay_failed"] = reason
            else:
                pivot.context["executable"] = True
                pivot.context.pop("not_executable_reason", None)
                pivot.context["replayed"] = "base image"
            bar.update(1)
            yield pivot
    finally:
        bar.close()
