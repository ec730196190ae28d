"""The bundled GRPO trainer: PivotRL's Algorithm 1 in `trainer`, read top to bottom (`pivotrl` runs it all).

Beside it, each with one job: `config` (the settings: `GRPOConfig`, `PivotRLConfig`), `run` (a
run's set-up, and `RunLog`: its metrics, evaluation and checkpoints), `results` (what a run
returns), `groups` (a pivot's group as trained on, and packing groups into passes),
`shared_prefix` (log pi(a_i | s) of a group's actions with the prefix run once), `reference` (LoRA
and the frozen reference pi_0), `checkpoints` (checkpoints, resume and metrics.jsonl), `reprofile`
(online re-profiling), `distributed` (torchrun), `episodes` (E2E RL, the baseline), `plot` (the
reward curve) and `policy` (`TrainablePolicy`: what the trainer needs from a policy backend).

`from pivot_envs.adapters.grpo import GRPOConfig, train, ...`: the public names of the package's
modules are re-exported here.
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
from pivot_envs.adapters.grpo.config import GRPOConfig, PivotRLConfig
from pivot_envs.adapters.grpo.groups import (
    Group,
    build_group,
    loss_units,
    pack_groups,
    padded_tokens,
    pass_budget,
)
from pivot_envs.adapters.grpo.plot import plot_metrics
from pivot_envs.adapters.grpo.policy import (
    TrainablePolicy,
    UntrainablePolicyError,
    sync_weights,
    trainable_module,
)
from pivot_envs.adapters.grpo.results import NoPivotsError, PivotRLResult, Selection, TrainResult
from pivot_envs.adapters.grpo.run import Run, RunLog, prepare_run
from pivot_envs.adapters.grpo.shared_prefix import (
    action_logprobs,
    groups_logprobs,
    right_pad,
    sequence_logprobs,
    token_entropy,
    token_logprobs,
)
from pivot_envs.adapters.grpo.trainer import (
    clipped_loss,
    group_advantages,
    learn,
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
    "Run",
    "RunLog",
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
    "learn",
    "load_checkpoint",
    "loss_units",
    "pack_groups",
    "padded_tokens",
    "pass_budget",
    "pivotrl",
    "plot_metrics",
    "prepare_run",
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
