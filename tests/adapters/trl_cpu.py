"""The real `trl.GRPOTrainer` as the TRL tests run it: on the CPU, small, logging every step, saving nothing."""

from __future__ import annotations

from typing import Any

CPU_ARGS = dict(
    max_steps=2,
    per_device_train_batch_size=2,
    num_generations=2,
    max_completion_length=8,
    learning_rate=1e-5,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    use_cpu=True,
    seed=0,
    dataloader_num_workers=0,
    gradient_checkpointing=False,  # on by default in TRL; these runs are too small to need it
    bf16=False,
)


def cpu_grpo_trainer(
    model: Any, tokenizer: Any, reward: Any, pivots: list, output_dir: Any, trainer_kwargs=None, **args: Any
) -> Any:
    """A `GRPOTrainer` of `model` rewarded by `reward` on the pivots' prompts (`to_dataset`); `args` override
    `CPU_ARGS` in its `GRPOConfig`, `trainer_kwargs` go to the trainer (e.g. `environment_factory`)."""
    from trl import GRPOConfig, GRPOTrainer

    from pivot_envs.adapters.trl import to_dataset

    return GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=GRPOConfig(output_dir=str(output_dir), **{**CPU_ARGS, **args}),
        train_dataset=to_dataset(pivots),
        processing_class=tokenizer,
        **(trainer_kwargs or {}),
    )
