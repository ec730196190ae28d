"""A minimal domain for core tests: pivots from real NeMo-Gym pivot rows, scored by the strict verifier.

The tool-use domain lives in its own folder; the core is tested without it.
"""

from __future__ import annotations

import json
from pathlib import Path

from pivot_envs.chat import tool_call, tool_to_chat
from pivot_envs.env import PivotEnv
from pivot_envs.pivot import Pivot
from pivot_envs.registry import DomainSpec

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "nemo_gym"


def _message(item: dict) -> dict:
    content = item.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content)
    return {"role": item.get("role", "assistant"), "content": content}


def real_pivots() -> list[Pivot]:
    """Pivots from the NeMo-Gym single-step rows whose prefix is plain messages."""
    pivots = []
    for path in sorted(SHARED.glob("single_step_tool_use*_pivots.jsonl")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            row = json.loads(line)
            items = row["responses_create_params"]["input"]
            if any(item.get("type", "message") != "message" for item in items):
                continue
            expected = row["expected_action"]
            calls = expected["calls"] if expected["type"] == "function_call_batch" else [expected]
            expert = {"role": "assistant", "content": None}
            if expected["type"] == "message":
                expert["content"] = _message(expected)["content"]
            else:
                expert["tool_calls"] = [
                    tool_call(c["name"], c["arguments"], f"call_{i}") for i, c in enumerate(calls)
                ]
            pivots.append(
                Pivot(
                    id=f"{path.stem}/{number}",
                    domain="echo",
                    messages=[_message(item) for item in items],
                    expert=expert,
                    tools=[tool_to_chat(t) for t in row["responses_create_params"].get("tools", [])],
                )
            )
    return pivots


class EchoEnv(PivotEnv):
    domain = "echo"

    def default_pivots(self) -> list[Pivot]:
        return real_pivots()


DOMAIN = DomainSpec(name="echo", env_class=EchoEnv, description="core test domain")
