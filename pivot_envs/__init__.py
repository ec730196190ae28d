"""pivot-envs: PivotRL made practical.

`import pivot_envs` registers `pivot/<domain>-v0` with gymnasium for every installed domain
plugin (lazily: a domain's module is imported by `gym.make`). It imports no heavy dependency.

    import gymnasium as gym
    import pivot_envs
    gym.register_envs(pivot_envs)
    env = gym.make("pivot/tool-use-v0")
"""

import importlib

from pivot_envs.env import InfrastructureError, Outcome, ParsedAction, PivotEnv
from pivot_envs.pivot import (
    Pivot,
    PivotFormatError,
    PivotWriter,
    Profile,
    iter_pivots,
    read_pivots,
    write_pivots,
)
from pivot_envs.registry import DomainSpec, register_domains
from pivot_envs.verifiers import StrictVerifier, Verdict, Verifier

__version__ = "0.1.0"

__all__ = [
    "DomainSpec",
    "InfrastructureError",
    "Outcome",
    "ParsedAction",
    "Pivot",
    "PivotEnv",
    "PivotFormatError",
    "PivotWriter",
    "Profile",
    "StrictVerifier",
    "Verdict",
    "Verifier",
    "check_pivot_env",
    "iter_pivots",
    "read_pivots",
    "register_domains",
    "write_pivots",
]

ENV_IDS = register_domains()

# Imported on first use, so `import pivot_envs` loads no more than before.
_LAZY = {"check_pivot_env": "pivot_envs.checker"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
