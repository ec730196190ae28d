"""The software-engineering domain (`pivot/swe-v0`): the next coding-agent tool call at a pivot,
run in a real repository with tests.

Tools (`bash`, `str_replace_editor`, `submit`) run in a bubblewrap or Docker sandbox restored to
the pivot's prefix state (built once per pivot, verified by its tree hash, forked per sample);
the default `effect` verifier compares what the sampled call did with what the expert's did from
the same state; `name` (the paper's), `kind` and `nemo` (NeMo-Gym's swe_pivot) are the other
levels. External traces (NeMo-Gym swe rows and rollouts, OpenHands chats) are read by `external`.
"""

from pivot_envs.registry import DomainSpec

from .env import SweConfig, SweEnv, bundled_pivots
from .parse import canonical_call, parse_action
from .tools import ToolResult, action_kind, default_tools, execute_call, tree_hash
from .verifier import EffectVerifier, KindVerifier, NameVerifier, NemoVerifier

DOMAIN = DomainSpec(
    name="swe",
    env_class=SweEnv,
    description="next coding-agent tool call (bash, str_replace_editor, submit) in a real repository with tests",
    verifiers=("effect", "name", "kind", "nemo", "strict"),
)

__all__ = [
    "DOMAIN",
    "EffectVerifier",
    "KindVerifier",
    "NameVerifier",
    "NemoVerifier",
    "SweConfig",
    "SweEnv",
    "ToolResult",
    "action_kind",
    "bundled_pivots",
    "canonical_call",
    "default_tools",
    "execute_call",
    "parse_action",
    "tree_hash",
]
