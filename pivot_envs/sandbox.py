"""Deprecated: the sandbox protocol moved to `pivot_envs.sandboxes` (import from there).

This module re-exports the old names and warns once on import.
"""

import warnings

from pivot_envs.sandboxes.protocol import *  # noqa: F403
from pivot_envs.sandboxes.protocol import _join_cut, _parse_manifest  # noqa: F401

warnings.warn("pivot_envs.sandbox is deprecated: import from pivot_envs.sandboxes",
              DeprecationWarning, stacklevel=2)
