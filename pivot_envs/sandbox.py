"""Deprecated: the sandbox protocol moved to `pivot_envs.sandboxes` (the core knows no sandbox).

This module only re-exports the old names from their new modules and warns on import:
`pivot_envs.sandboxes` (SandboxLimits, CommandResult, Snapshot, Sandbox, the errors,
file_changes), `.runner`, `.output` and `.manifest`.
"""

import warnings

from pivot_envs.sandboxes.manifest import disk_usage, manifest
from pivot_envs.sandboxes.output import cut_marker, new_marker, strip_ansi
from pivot_envs.sandboxes.protocol import (
    CommandRejected,
    CommandResult,
    FileChange,
    Sandbox,
    SandboxError,
    SandboxLimits,
    Snapshot,
    command_problem,
    file_changes,
)
from pivot_envs.sandboxes.runner import (
    CHANNEL_DIR,
    RUNNER,
    SAFE_ENV,
    SERVER,
    STATE_DIR,
    parse_runner_output,
    result_from_files,
    runner_argv,
    runner_env,
)

__all__ = [
    "CHANNEL_DIR",
    "RUNNER",
    "SAFE_ENV",
    "SERVER",
    "STATE_DIR",
    "CommandRejected",
    "CommandResult",
    "FileChange",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "Snapshot",
    "command_problem",
    "cut_marker",
    "disk_usage",
    "file_changes",
    "manifest",
    "new_marker",
    "parse_runner_output",
    "result_from_files",
    "runner_argv",
    "runner_env",
    "strip_ansi",
]

warnings.warn(
    "pivot_envs.sandbox is deprecated: import from pivot_envs.sandboxes (SandboxLimits, CommandResult, "
    "...), pivot_envs.sandboxes.runner, .output or .manifest",
    DeprecationWarning,
    stacklevel=2,
)
