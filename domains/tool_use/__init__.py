"""Conversational tool use (the paper's tau2-Bench domain): `pivot/tool-use-v0`.

The action is a whole assistant turn (tool calls, a message, or both), parsed from raw text or a
message dict; calls run on a tool backend (recorded outputs, the tau-bench airline tools over a
copy-on-write database, or an HTTP tool server); the functional verifier compares the turn with
the expert's by tool schema, execution equivalence and message content.
"""

from pivot_envs.domains.tool_use.env import ToolUseEnv
from pivot_envs.domains.tool_use.verifier import FunctionalConfig, FunctionalVerifier
from pivot_envs.registry import DomainSpec

DOMAIN = DomainSpec(
    name="tool-use",
    env_class=ToolUseEnv,
    description="conversational tool use: tool calls or a message per turn, tau-bench airline backend, functional verifier",
    verifiers=("functional", "strict"),
)

__all__ = ["DOMAIN", "FunctionalConfig", "FunctionalVerifier", "ToolUseEnv"]
