"""Sandboxes for the sandboxed domains (terminal, SWE): an isolated filesystem plus shell state that
runs commands, on bubblewrap or Docker.

One module per job:

- `protocol`: the Sandbox protocol, SandboxLimits, CommandResult, Snapshot, FileChange, the errors
  and `file_changes` (re-exported here);
- `runner`: the bash runner every command goes through and the command server that runs it inside
  a sandbox (`runner_argv`, `parse_runner_output`, `result_from_files`);
- `output`, `manifest`, `gitstate`: command output cleaned and cut; the workspace's files and disk
  use read from the host; its git repositories' state (HEAD, refs, index entries) read from the host;
- `channel`: the host's end of the FIFO channel to a command server (`Channel`);
- `pool`: the contract both backends keep (`SandboxBackend`: fork, prewarm, release, close, one
  process's own) and the warm pools, close and fork safety they share (`PooledBackend`);
- `bwrap_backend`, `processes`, `cgroups`: the bubblewrap backend, its host processes, its cgroups;
- `docker_backend`: the Docker backend;
- `backends`: choosing and making a backend; `SandboxedEnv`, what a sandboxed domain's env does with it;
- `available`: which backends this machine has; `cleanup`: ownership labels and `gc`;
- `image`: a Debian root filesystem (debootstrap) and its Docker image;
- `shell`: an interactive bash inside a sandbox (pexpect);
- `snapshot_cache`: a least-recently-used cache of snapshot-holding states, and `PrefixCache`, the
  prefix-state cache both sandboxed domains build on.

Importing this package is light: nothing here imports docker or pexpect until a backend needs it.
"""

from .protocol import (
    CommandRejected,
    CommandResult,
    FileChange,
    Sandbox,
    SandboxError,
    SandboxLimits,
    Snapshot,
    file_changes,
)

__all__ = [
    "CommandRejected",
    "CommandResult",
    "FileChange",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "Snapshot",
    "file_changes",
]
