"""Toy verifiers and the shared-CPU `vllm serve` settings, in one place for the tests and the benchmarks.

    from toys import HasLetterVerifier, ParityVerifier, cpu_server_options

The toy verifiers reward something a random or a 135M model does about half the time, so GRPO groups are
mixed and every step updates: the trainer's mechanics are tested without a model that can call tools.
"""

from __future__ import annotations

import zlib
from typing import Any

from pivot_envs.verifiers import Verdict


def action_text(action: Any) -> str:
    """The text of an action: a message's content, or the action itself when it is a string."""
    if isinstance(action, dict):
        return str(action.get("content") or "")
    return str(action or "")


class HasLetterVerifier:
    """1 when the action's text holds the letter 'a', in either case. A random model's 6-token actions pass
    about 9 in 10 times (2-token ones about 7 in 10), SmolLM2-135M's about half: some groups are mixed."""

    name = "has-letter"

    def verify(self, pivot, action, outcome=None) -> Verdict:
        hit = "a" in action_text(action).lower()
        return Verdict(1.0 if hit else 0.0, "has_letter" if hit else "no_letter")


class ParityVerifier:
    """1 when the CRC-32 of the action's text is even. Groups stay mixed at any length (64 random tokens
    nearly always hold an 'a', so has-letter groups would all score 1 and nothing update)."""

    name = "parity"

    def verify(self, pivot, action, outcome=None) -> Verdict:
        even = zlib.crc32(action_text(action).encode()) % 2 == 0
        return Verdict(1.0 if even else 0.0, "even" if even else "odd")


def cpu_server_options(**overrides: Any) -> dict[str, Any]:
    """`load_policy("vllm-server:...", **options)` settings for a `vllm serve` on a shared CPU: one unbound
    OpenMP thread (the machine's 2 cores are shared, and a thread pinned to a busy core, or waiting at a
    barrier for one, stalls), 0.3 of the memory, and a start timeout for a loaded machine (~50 s idle)."""
    return {
        "gpu_memory_utilization": 0.3,
        "start_timeout": 600,
        "environment": {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"},
        **overrides,
    }
