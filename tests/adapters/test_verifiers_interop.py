"""Pivot envs as a verifiers 0.4.0 taskset, scored by verifiers' own Task.score on fixed completions."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

vf = pytest.importorskip("verifiers.v1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from echo_domain import EchoEnv, real_pivots  # noqa: E402  (the core tests' env over real NeMo-Gym pivot rows)

from pivot_envs.adapters.verifiers_interop import PivotTask, pivot_taskset  # noqa: E402
from pivot_envs.env import InfrastructureError  # noqa: E402
from pivot_envs.pivot import write_pivots  # noqa: E402


class BrokenBackendEnv(EchoEnv):
    def execute(self, pivot, action):
        if pivot.id.endswith("/2"):
            raise InfrastructureError("tool backend down")
        return super().execute(pivot, action)


def trace_of(task: PivotTask, reply: vf.AssistantMessage) -> vf.Trace:
    """The trace a rollout of `task` leaves: its prompt, then `reply` as the one sampled model turn."""
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.trace import AgentInfo, TraceTask

    prompt = [MessageNode(message=m, parent=i - 1 if i else None) for i, m in enumerate(task.data.prompt)]
    sampled = MessageNode(message=reply, parent=len(prompt) - 1, sampled=True)
    return vf.Trace(
        task=TraceTask(type=type(task).__name__, data=task.data),
        agent=AgentInfo(config=vf.AgentConfig()),
        nodes=[*prompt, sampled],
    )


def scored(task: PivotTask, reply: vf.AssistantMessage) -> vf.Trace:
    trace = trace_of(task, reply)
    asyncio.run(task.score(trace))
    return trace


def expert_reply(pivot) -> vf.AssistantMessage:
    """The pivot's expert turn as a verifiers assistant message (native tool calls, arguments as JSON text)."""
    from verifiers.v1.types import ToolCall

    calls = [
        ToolCall(
            id=c.get("id") or f"call_{i}",
            name=c["function"]["name"],
            arguments=c["function"]["arguments"]
            if isinstance(c["function"]["arguments"], str)
            else json.dumps(c["function"]["arguments"]),
        )
        for i, c in enumerate(pivot.expert.get("tool_calls") or [])
    ]
    return vf.AssistantMessage(content=pivot.expert.get("content"), tool_calls=calls or None)


def test_each_pivot_is_one_task_whose_prompt_is_the_pivots_messages_with_its_tools():
    pivots = real_pivots()
    taskset = pivot_taskset(lambda: EchoEnv(pivots), pivots=pivots, num_envs=1)
    tasks = list(taskset)
    assert [t.data.id for t in tasks] == [p.id for p in pivots]
    assert tasks[0].data.prompt[0].role == "system" and "<tools>" in tasks[0].data.prompt[0].content
    assert tasks[0].data.prompt[-1].content == pivots[0].messages[-1]["content"]
    taskset.close()


def test_verifiers_scoring_gives_the_envs_reward_for_the_rollouts_first_turn():
    pivots = real_pivots()
    # the strict verifier: only the expert's action scores 1
    taskset = pivot_taskset(lambda: EchoEnv(pivots), pivots=pivots, num_envs=2)
    tasks = list(taskset)
    rewards = [
        scored(task, expert_reply(pivot)).rewards["pivot_reward"].score for task, pivot in zip(tasks, pivots)
    ]
    assert rewards == [1.0] * len(pivots)
    wrong = scored(tasks[0], vf.AssistantMessage(content="I cannot help with that."))
    assert wrong.rewards["pivot_reward"].score == 0.0 and wrong.reward == 0.0
    taskset.close()


def test_the_registered_tool_use_domain_scores_hermes_text_from_a_pivots_jsonl(tmp_path):
    import gymnasium as gym

    import pivot_envs
    from pivot_envs.adapters.chat_template import prompt_messages

    gym.register_envs(pivot_envs)
    pivots = [p for p in gym.make("pivot/tool-use-v0").unwrapped.pivots if p.expert.get("tool_calls")][:2]
    path = tmp_path / "pivots.jsonl"
    write_pivots(pivots, path)
    taskset = pivot_taskset("pivot/tool-use-v0", pivots_path=str(path), num_envs=1)
    tasks = list(taskset)
    # the expert's calls as Hermes <tool_call> text, as a model without native tools writes them
    text = prompt_messages([pivots[0].expert], [])[0]["content"]
    assert scored(tasks[0], vf.AssistantMessage(content=text)).reward == 1.0
    assert scored(tasks[1], vf.AssistantMessage(content=text)).reward == 0.0  # another pivot's answer
    taskset.close()


def test_an_infrastructure_failure_is_a_sandbox_error_not_a_zero_reward():
    pivots = real_pivots()
    taskset = pivot_taskset(lambda: BrokenBackendEnv(pivots), pivots=pivots, num_envs=1)
    task = list(taskset)[1]  # .../2, whose backend is down
    with pytest.raises(vf.SandboxError, match="single_step_tool_use_parallel_pivots/2: .*tool backend down"):
        scored(task, expert_reply(pivots[1]))
    taskset.close()


def test_without_verifiers_the_import_names_the_extra_to_install():
    import subprocess

    code = (
        "import sys; sys.modules['verifiers'] = None\n"
        "try:\n    import pivot_envs.adapters.verifiers_interop\n"
        "except ImportError as error:\n    print(type(error).__name__, error)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert out.startswith("MissingExtraError") and "pip install 'pivot-envs[verifiers]'" in out
