"""Deprecated: the sandbox backends moved to `pivot_envs.sandboxes` (import from there).

This module re-exports the old names and warns once on import.
"""

import warnings

from pivot_envs.sandboxes.backends import *  # noqa: F403

warnings.warn("pivot_envs.domains.terminal.backends is deprecated: import from pivot_envs.sandboxes",
              DeprecationWarning, stacklevel=2)
