"""TRL's asynchronous OpenEnv harness drives pivot envs through `PivotSessionFactory`.

The rollouts run through TRL's own rollout loop (`_HarnessRolloutLoop`: its generate loop, its
`_run_session` with OpenEnv's `MCPHarnessAdapter`, its `parse_response`, its group scoring). Only
the vLLM server is replaced: `_generate_one_turn` (a POST to `/v1/completions`) answers with the
tokens of scripted completions, so each verdict is known.
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import queue
import sys
import threading
from functools import partial
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="the openenv extra is not installed")
pytest.importorskip("trl.experimental.async_grpo.openenv_harness", reason="TRL >= 1.16 is not installed")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from openenv.core.harness import MCPHarnessAdapter  # noqa: E402
from sandbox_fixtures import has_bwrap, rootfs  # noqa: E402
from test_trl import tool_parsing_tokenizer  # noqa: E402  (SmolLM2's tokenizer with a template TRL parses)
from trl.experimental.async_grpo.openenv_harness import _HarnessRolloutLoop  # noqa: E402

from pivot_envs.adapters.trl_openenv import (  # noqa: E402
    HarnessTaskError,
    PivotSessionFactory,
    harness_dataset,
)
from pivot_envs.env import InfrastructureError  # noqa: E402

__all__ = ["has_bwrap", "rootfs"]  # the fixtures this module uses
ENV = "pivot/tool-use-v0"


class ScriptedLoop(_HarnessRolloutLoop):
    """TRL's harness loop whose policy answers with scripted completion texts, one per turn, in turn,
    over one pass of the dataset (TRL cycles it: later groups wait for the stop)."""

    def __init__(self, texts, groups, **kwargs):
        super().__init__(**kwargs)
        self._groups = groups
        self._texts = list(texts)
        self._next = 0
        self._texts_lock = threading.Lock()

    async def _generate_one(self, prompt, tool_dict, tools, group_id=0):
        if group_id >= self._groups:
            await self._stop_event.wait()
            return self._EMPTY_ROLLOUT
        return await super()._generate_one(prompt, tool_dict, tools, group_id)

    async def _generate_one_turn(self, prompt_ids):
        with self._texts_lock:
            text = self._texts[self._next % len(self._texts)]
            self._next += 1
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids, [-0.5] * len(ids)


def bundled_pivots(env_id=ENV, **env_kwargs):
    import gymnasium as gym

    import pivot_envs

    gym.register_envs(pivot_envs)
    env = gym.make(env_id, disable_env_checker=True, **env_kwargs)
    try:
        return list(env.unwrapped.pivots)
    finally:
        env.close()


def call_text(name, arguments):
    """A tool call as the model writes it under the Qwen3 template."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call><|im_end|>"


def expert_call_pivot(pivots):
    """A pivot whose expert makes exactly one tool call with arguments."""
    for pivot in pivots:
        calls = pivot.expert.get("tool_calls") or []
        if len(calls) == 1:
            function = calls[0].get("function", calls[0])
            arguments = function.get("arguments")
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
            if arguments:
                return pivot, function["name"], arguments
    raise AssertionError("no bundled tool-use pivot with a one-call expert turn")


def run_harness(factory, pivots, texts, num_generations):
    """Run TRL's harness loop over dataset rows until every row's group is scored; its RolloutSamples."""
    from accelerate import PartialState

    PartialState()  # what TRL's worker child process does first: its loggers need the accelerate state
    tokenizer = tool_parsing_tokenizer()
    buffer: queue.Queue = queue.Queue()
    loop = ScriptedLoop(
        texts,
        len(pivots),
        harness_session_factory=factory,
        harness_adapter=MCPHarnessAdapter(),
        model_name="smollm2",
        dataset=harness_dataset(pivots),
        reward_funcs=[],
        processing_class=tokenizer,
        eos_token_ids=[tokenizer.eos_token_id],
        rollout_buffer=buffer,
        model_version_value=multiprocessing.Value("i", 0),
        heartbeat_value=multiprocessing.Value("d", 0.0),
        failed_event=threading.Event(),
        exception_info_queue=queue.Queue(maxsize=1),
        metrics_queue=queue.Queue(),
        num_generations=num_generations,
        max_inflight_tasks=num_generations,
        max_tokens=256,
    )
    wanted = num_generations * len(pivots)

    async def main():
        stop = loop._stop_event

        async def stop_when_done():
            while buffer.qsize() < wanted:
                await asyncio.sleep(0.05)
            stop.set()

        await asyncio.wait_for(asyncio.gather(loop._run_loops(stop), stop_when_done()), timeout=240)

    asyncio.set_event_loop(loop._loop)
    try:
        loop._loop.run_until_complete(main())
    finally:
        loop._loop.close()
        asyncio.set_event_loop(None)
    samples = [buffer.get_nowait() for _ in range(buffer.qsize())]
    return loop, samples[:wanted]


def reward_of(sample):
    return sample.metrics["rewards/harness_reward"]


PIVOTS = bundled_pivots()


def test_trls_harness_scores_each_group_member_by_the_verifier_at_the_rows_pivot():
    pivot, name, arguments = expert_call_pivot(PIVOTS)
    wrong = {key: "no-such-value" for key in arguments}
    texts = [call_text(name, arguments), call_text(name, wrong), "I cannot help with that.<|im_end|>"]
    factory = partial(PivotSessionFactory, ENV)
    _, samples = run_harness(factory, [pivot], texts * 2, num_generations=6)

    assert len(samples) == 6
    by_turn = {}
    for sample in samples:
        assistant = sample.completion[len(pivot.messages)]
        assert assistant["role"] == "assistant"
        calls = assistant.get("tool_calls") or []
        key = json.loads(calls[0]["function"]["arguments"]) if calls else assistant["content"]
        by_turn.setdefault(json.dumps(key, sort_keys=True), []).append(reward_of(sample))
    # every member restored the same pivot; the expert's call scores 1 in each fork, the others 0
    assert by_turn[json.dumps(arguments, sort_keys=True)] == [1.0, 1.0]
    assert by_turn[json.dumps(wrong, sort_keys=True)] == [0.0, 0.0]
    assert by_turn[json.dumps("I cannot help with that.")] == [0.0, 0.0]
    advantages = sorted(round(s.advantage, 3) for s in samples)
    assert advantages[0] < 0 < advantages[-1]
    assert all(s.completion_mask.sum() > 0 for s in samples)


def test_the_session_exposes_the_pivots_messages_and_tools_and_ends_the_rollout_at_the_first_call():
    pivot, name, arguments = expert_call_pivot(PIVOTS)
    factory = PivotSessionFactory(ENV)
    session = factory.create(pivot.id, seed=0, episode_id="e0")
    try:
        messages = session.initial_messages()
        assert [m["role"] for m in messages] == [m["role"] for m in pivot.messages]
        assert sorted(t.name for t in session.list_tools()) == sorted(
            t["function"]["name"] for t in pivot.tools
        )
        result = session.call_tool(name, arguments)
        assert result.done and result.error is None
        assert session.call_tool("no_such_tool", {}).error == "unknown tool 'no_such_tool'"
        turn = {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c0",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
            ],
        }
        verdict = session.verify([*messages, turn])
        assert (
            verdict.env_reward == 1.0
            and verdict.metrics["valid"]
            and verdict.metrics["category"] == "correct"
        )
        assert session.verify([*messages, {"role": "assistant", "content": "x"}]) is verdict  # one step
    finally:
        session.close()
        factory.close()


def test_a_restore_whose_infrastructure_fails_is_unscored_not_reward_zero():
    import gymnasium as gym

    import pivot_envs

    gym.register_envs(pivot_envs)

    def broken_env():
        env = gym.make(ENV, disable_env_checker=True)

        def restore(pivot):
            raise InfrastructureError("tool backend down")

        env.unwrapped.restore = restore
        return env

    pivot, name, arguments = expert_call_pivot(PIVOTS)
    factory = partial(PivotSessionFactory, broken_env)
    _, samples = run_harness(factory, [pivot], [call_text(name, arguments)], num_generations=2)

    assert len(samples) == 2
    assert all(math.isnan(reward_of(s)) and s.advantage == 0.0 for s in samples)

    session = PivotSessionFactory(broken_env).create(pivot.id, seed=1)
    verdict = session.verify([*pivot.messages, {"role": "assistant", "content": "hello"}])
    assert verdict.env_reward is None and verdict.metrics["valid"] is False
    assert "tool backend down" in verdict.artifacts["detail"]
    session.close()


def test_a_task_that_names_no_pivot_is_refused_with_the_closest_id():
    factory = PivotSessionFactory(ENV)
    try:
        with pytest.raises(HarnessTaskError, match="did you mean 'tau-airline/task6/trial0/t1'"):
            factory.create("tau-airline/task6/trial0/t1x", seed=0)
        with pytest.raises(HarnessTaskError, match="must be a pivot id"):
            factory.create([{"role": "user", "content": "hi"}], seed=0)
    finally:
        factory.close()


TERMINAL_PIVOT = "terminal/sed-config-port/t1"
SED = "```bash\nsed -i 's/8080/9090/' server.conf\n```"
RM = "```bash\nrm server.conf\n```"


def terminal_factory():
    return partial(
        PivotSessionFactory,
        "pivot/terminal-v0",
        sandbox="bwrap",
        warm_pool=0,
        limits={"timeout": 3.0},
    )


def test_members_of_a_terminal_group_each_step_their_own_fork_of_one_restored_sandbox(has_bwrap):
    factory = terminal_factory()()
    sessions = [factory.create(TERMINAL_PIVOT, seed=7, episode_id=f"e{i}") for i in range(3)]
    try:
        assert sessions[0].list_tools() == [] or all(t.name for t in sessions[0].list_tools())
        start = len(sessions[0].initial_messages())
        # the first deletes the file the expert edits; the others still find it in their forks
        rewards = [
            session.verify([*session.initial_messages(), {"role": "assistant", "content": text}]).env_reward
            for session, text in zip(sessions, (RM, SED, SED))
        ]
        assert rewards == [0.0, 1.0, 1.0]
        assert start == len(sessions[1].initial_messages())
        assert len(factory._envs) == 1  # one env (one restored sandbox) served the group
    finally:
        for session in sessions:
            session.close()
        factory.close()


def test_trls_harness_drives_a_terminal_pivot_whose_action_is_the_turns_text(has_bwrap):
    _, samples = run_harness(
        terminal_factory(),
        [p for p in bundled_pivots("pivot/terminal-v0", sandbox="bwrap") if p.id == TERMINAL_PIVOT],
        [RM + "<|im_end|>", SED + "<|im_end|>"],
        num_generations=4,
    )
    rewards = sorted((sample.completion[-1]["content"].split()[1], reward_of(sample)) for sample in samples)
    assert rewards == [("rm", 0.0), ("rm", 0.0), ("sed", 1.0), ("sed", 1.0)]
