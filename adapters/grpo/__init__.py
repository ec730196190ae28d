"""The bundled GRPO trainer: PivotRL's Algorithm 1 in `trainer`, read top to bottom (`pivotrl` runs it all).

Beside it, each with one job: `groups` (a pivot's group as trained on, and packing groups into
passes), `shared_prefix` (log pi(a_i | s) of a group's actions with the prefix run once),
`reference` (LoRA and the frozen reference pi_0), `checkpoints` (checkpoints, resume and
metrics.jsonl), `plot` (the reward curve) and `policy` (`TrainablePolicy`: what the trainer needs
from a policy backend).

`from pivot_envs.adapters.grpo import GRPOConfig, train, ...` keeps working: the public names of
the package's modules are re-exported here.
"""

from pivot_envs.adapters.grpo.checkpoints import (
    RESUME_MAY_CHANGE,
    MetricsLog,
    check_resumable,
    latest_checkpoint,
    load_checkpoint,
    refuse_earlier_run,
    save_checkpoint,
)
from pivot_envs.adapters.grpo.groups import Group, build_group, pack_groups, padded_tokens, pass_budget
from pivot_envs.adapters.grpo.plot import plot_metrics
from pivot_envs.adapters.grpo.policy import (
    TrainablePolicy,
    UntrainablePolicyError,
    sync_weights,
    trainable_module,
)
from pivot_envs.adapters.grpo.shared_prefix import (
    action_logprobs,
    groups_logprobs,
    right_pad,
    sequence_logprobs,
    token_entropy,
    token_logprobs,
)
from pivot_envs.adapters.grpo.trainer import (
    GRPOConfig,
    NoPivotsError,
    PivotRLConfig,
    PivotRLResult,
    Selection,
    TrainResult,
    clipped_loss,
    group_advantages,
    loss_units,
    pivotrl,
    select_pivots,
    train,
    update,
)

__all__ = [
    "RESUME_MAY_CHANGE",
    "GRPOConfig",
    "Group",
    "MetricsLog",
    "NoPivotsError",
    "PivotRLConfig",
    "PivotRLResult",
    "Selection",
    "TrainResult",
    "TrainablePolicy",
    "UntrainablePolicyError",
    "action_logprobs",
    "build_group",
    "check_resumable",
    "clipped_loss",
    "group_advantages",
    "groups_logprobs",
    "latest_checkpoint",
    "load_checkpoint",
    "loss_units",
    "pack_groups",
    "padded_tokens",
    "pass_budget",
    "pivotrl",
    "plot_metrics",
    "refuse_earlier_run",
    "right_pad",
    "save_checkpoint",
    "select_pivots",
    "sequence_logprobs",
    "sync_weights",
    "token_entropy",
    "token_logprobs",
    "trainable_module",
    "train",
    "update",
]
