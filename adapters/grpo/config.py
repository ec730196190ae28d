"""The settings of Algorithm 1: `GRPOConfig` (lines 5-14, the GRPO run) and `PivotRLConfig` (lines 1-14).

As TRL's `grpo_config.py`: one dataclass field per setting, with its default and a help text that
says what it does (and which line or equation of the paper it sets), grouped by section. The
command line is generated from these fields (`pivotrl train --help`); why each default is what it
is, with the measurements behind it, is in docs/training.md ("Where the defaults come from").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pivot_envs.cli.options import policy_help
from pivot_envs.config import ConfigError, at_least, between, one_of, option
from pivot_envs.extract import ExtractConfig, FilterConfig
from pivot_envs.profile import ProfileConfig

LOSS_LEVELS = ("token", "action")
LOSS_DENOMINATORS = ("trained", "sampled")


@dataclass
class GRPOConfig:
    """Hyperparameters of the GRPO update at pivots (paper Eq. 1, 7 and Algorithm 1)."""

    # -- the policy trained ------------------------------------------------------------------------
    policy: str = option("hf:smollm2", policy_help("policy"))
    lora: bool = option(
        False, "train LoRA adapters (peft) instead of all weights; the reference is the base model"
    )
    lora_rank: int = option(16, "LoRA rank r")
    lora_alpha: int = option(32, "LoRA alpha")

    # -- Algorithm 1's sizes -----------------------------------------------------------------------
    steps: int = option(100, "training steps K_train (Algorithm 1, line 5)")
    batch_pivots: int = option(4, "B: pivots sampled per step (Algorithm 1, line 6)")
    group_size: int = option(8, "G: actions sampled per pivot, the group of Eq. 1 (Algorithm 1, line 8)")

    # -- sampling the G actions (line 8) -----------------------------------------------------------
    temperature: float = option(
        1.0, "sampling temperature of the G actions; logprobs are taken at the same temperature"
    )
    top_p: float = option(1.0, "nucleus sampling threshold of the G actions")
    max_new_tokens: int = option(256, "longest action sampled, in tokens")

    # -- the advantage (Eq. 1, line 11) ------------------------------------------------------------
    leave_one_out: bool = option(
        False, "baseline r_i minus the mean of the other G-1 rewards instead of the group mean (Eq. 1)"
    )
    std_epsilon: float = option(1e-4, "epsilon_std added to the group's reward std (Eq. 1)")
    scale_by_std: bool = option(
        True, "divide by the group's reward std (Eq. 1); off gives Dr. GRPO's unscaled advantage"
    )

    # -- the objective (Eq. 7 and 8, line 13) ------------------------------------------------------
    epsilon_low: float = option(
        0.2, "lower clip range of the importance weight w_i: clip(w, 1 - eps_low, ...) (Eq. 7)"
    )
    epsilon_high: float = option(0.2, "upper clip range of w_i: clip(w, ..., 1 + eps_high) (Eq. 7)")
    beta: float = option(
        0.0, "coefficient of the k3 KL to the frozen reference pi_0 (Eq. 7); 0 loads no reference"
    )
    loss_level: str = option(
        "token",
        "what Eq. 7's ratio, clip, k3 and average are taken over: 'token', each action token; 'action' "
        "(the paper's Eq. 7-8), each action, w_i = exp(sum_t (log pi_theta - log pi_old))",
    )
    loss_denominator: str = option(
        "trained",
        "what the summed loss is divided by: 'trained', the tokens (or actions, see loss_level) of the "
        "groups trained on; 'sampled', those of every valid sample of the batch, zero-variance groups included",
    )

    # -- the optimizer and the update's passes (line 13) -------------------------------------------
    learning_rate: float = option(1e-6, "AdamW learning rate")
    weight_decay: float = option(0.0, "AdamW weight decay")
    max_grad_norm: float = option(1.0, "clip the gradient's global norm to this (0 disables)")
    iterations: int = option(1, "optimizer steps per sampled batch (mu); >1 makes w_i differ from 1")
    tokens_per_pass: int | None = option(
        None,
        "padded tokens per forward/backward of the update: groups share a pass while groups x longest "
        "prefix + actions x longest action stays within it (a larger group runs alone); 0: one group per "
        "pass; default: 8192 on a GPU, 0 on a CPU",
    )
    fsdp: bool = option(
        False,
        "under torchrun, shard the policy over the ranks with FSDP2 (fully_shard: each decoder layer, then "
        "the model) instead of a whole copy per rank (grpo.fsdp); one process: no effect",
    )

    # -- online re-profiling (beyond the paper) ----------------------------------------------------
    reprofile_every: int = option(
        0,
        "every N steps, profile the candidates again with the current policy and train at the new D_adv "
        "(grpo.reprofile); 0: the offline profile throughout, as the paper",
    )
    reprofile_k: int = option(8, "samples per candidate when re-profiling (K of Eq. 4)")
    reprofile_lambda_diff: float = option(0.9, "lambda_diff of the re-profiled D_adv (Eq. 5)")

    # -- asynchronous rollouts (beyond the paper) --------------------------------------------------
    max_staleness: int = option(
        0,
        "s: sample (generate, run the envs, score) the next batches in a background thread while the current "
        "batch updates, from weights at most s updates old (grpo.rollouts); 0: the paper's synchronous loop",
    )

    # -- the run: seed, scoring, evaluation, checkpoints -------------------------------------------
    seed: int = option(0, "seed of pivot sampling, action sampling and torch")
    num_envs: int = option(4, "envs scoring actions concurrently (threads)")
    eval_every: int = option(25, "turn accuracy on the held-out pivots every N steps (greedy); 0 disables")
    eval_pivots: int = option(64, "at most this many held-out pivots per evaluation")
    checkpoint_every: int = option(
        50, "save a checkpoint every N steps (and at the end); 0 saves only at the end"
    )
    out: str = option("runs/grpo", "output directory: metrics.jsonl, checkpoints/, final/")
    resume: bool = option(False, "continue from the latest checkpoint in --out")

    def __post_init__(self) -> None:
        at_least(
            self,
            1,
            "batch_pivots",
            "iterations",
            "max_new_tokens",
            "steps",
            "eval_pivots",
            "num_envs",
            "lora_rank",
            "lora_alpha",
        )
        at_least(self, 2, "reprofile_k")  # one sample has no variance: no candidate could be mixed
        at_least(self, 0, "reprofile_every")
        between(self, "reprofile_lambda_diff", 0, 1, open_low=True)
        at_least(self, 2, "group_size")  # a group of one has no baseline (Eq. 1): no update, ever
        at_least(
            self,
            0,
            "weight_decay",
            "beta",
            "epsilon_high",
            "std_epsilon",
            "max_grad_norm",
            "tokens_per_pass",
            "checkpoint_every",
            "eval_every",
            "max_staleness",
        )
        if self.max_staleness and (self.reprofile_every or self.fsdp):
            # re-profiling samples with the policy of its step, FSDP gathers the weights with every rank
            # at once: neither is defined for a batch sampled ahead (grpo.rollouts)
            raise ConfigError(
                f"max_staleness={self.max_staleness} samples ahead, which "
                f"{'reprofile_every' if self.reprofile_every else 'fsdp'} does not support: set max_staleness=0"
            )
        between(self, "learning_rate", 0, 1, open_low=True)
        between(self, "epsilon_low", 0, 1)
        between(self, "top_p", 0, 1, open_low=True)
        between(self, "temperature", 0, float("inf"), open_low=True, open_high=True)  # logprobs divide by it
        one_of(self, "loss_level", LOSS_LEVELS)
        one_of(self, "loss_denominator", LOSS_DENOMINATORS)


@dataclass
class PivotRLConfig:
    """Algorithm 1's settings: one config per step, composed, never repeated (the Require line's G,
    lambda_diff, K and the rest live in them). The GRPO run writes to OUT/train, whatever `train.out` says."""

    out: str = option(
        "runs/pivotrl", "output directory: candidates.jsonl, profiled.jsonl, pivots.jsonl, train/"
    )
    extract: ExtractConfig = field(
        default_factory=ExtractConfig, metadata={"help": "line 2: D_cand from trajectories"}
    )
    profile: ProfileConfig = field(
        default_factory=ProfileConfig, metadata={"help": "line 3: profiling (Eq. 4)"}
    )
    filter: FilterConfig = field(
        default_factory=FilterConfig, metadata={"help": "line 4: D_pivot = D_adv (Eq. 5)"}
    )
    train: GRPOConfig = field(default_factory=GRPOConfig, metadata={"help": "lines 5-14: GRPO at the pivots"})
