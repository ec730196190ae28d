"""Engines and trainers (installed as `pivot_envs.adapters`): policies, the GRPO trainer, TRL."""
