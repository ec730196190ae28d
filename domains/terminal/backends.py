"""Deprecated: the sandbox backends moved to `pivot_envs.sandboxes` (the SWE domain shares them).

This module only re-exports the old names from their new modules and warns on import:
`pivot_envs.sandboxes.bwrap_backend`, `.docker_backend`, `.available`, `.channel`, `.cleanup`
and `.processes`.
"""

import warnings

from pivot_envs.sandboxes.available import INSTALL_HELP, bwrap_available, docker_available
from pivot_envs.sandboxes.bwrap_backend import BwrapBackend, BwrapSandbox
from pivot_envs.sandboxes.channel import CHECK_EVERY, Channel, LimitExceeded, ServerDown, ServerTimeout
from pivot_envs.sandboxes.cleanup import (
    BWRAP_PREFIX,
    DOCKER_PREFIX,
    LABEL,
    OWNER_LABEL,
    gc,
    owner_id,
    remove_labelled,
)
from pivot_envs.sandboxes.docker_backend import KEEPALIVE, DockerBackend, DockerSandbox
from pivot_envs.sandboxes.processes import NOBODY, hard_limits, kill_children

__all__ = [
    "BWRAP_PREFIX",
    "CHECK_EVERY",
    "DOCKER_PREFIX",
    "INSTALL_HELP",
    "KEEPALIVE",
    "LABEL",
    "NOBODY",
    "OWNER_LABEL",
    "BwrapBackend",
    "BwrapSandbox",
    "DockerBackend",
    "DockerSandbox",
    "LimitExceeded",
    "ServerDown",
    "ServerTimeout",
    "bwrap_available",
    "Channel",
    "docker_available",
    "gc",
    "hard_limits",
    "kill_children",
    "owner_id",
    "remove_labelled",
]

warnings.warn(
    "pivot_envs.domains.terminal.backends is deprecated: import from pivot_envs.sandboxes.bwrap_backend, "
    ".docker_backend, .available or .cleanup",
    DeprecationWarning,
    stacklevel=2,
)
