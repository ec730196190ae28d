"""The terminal domain (`pivot/terminal-v0`): the next bash command at a pivot, run in a sandbox.

Backends: Docker (docker SDK) and bubblewrap; prefix states are built once per pivot and forked
per sample; the functional verifier compares the effect of the sampled command with the expert's.
"""

from pivot_envs.registry import DomainSpec

from .env import TerminalConfig, TerminalEnv, bundled_pivots
from .parse import BASH_TOOL, canonical_message, parse_action, parse_command
from .verifier import TerminalVerifier, TerminalVerifierConfig

DOMAIN = DomainSpec(
    name="terminal",
    env_class=TerminalEnv,
    description="next bash command in a Docker or bubblewrap sandbox restored to the expert's prefix state",
    verifiers=("functional", "strict"),
)

__all__ = [
    "BASH_TOOL",
    "DOMAIN",
    "TerminalConfig",
    "TerminalEnv",
    "TerminalVerifier",
    "TerminalVerifierConfig",
    "bundled_pivots",
    "canonical_message",
    "parse_action",
    "parse_command",
]
