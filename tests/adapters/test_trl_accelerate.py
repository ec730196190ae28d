"""The TRL adapter under `accelerate launch`: the real trl.GRPOTrainer on 2 CPU processes, rewarded by a pivot env.

This module is also the program each process runs (`accelerate launch ... THIS_FILE OUT`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("accelerate")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from echo_domain import real_pivots  # noqa: E402  (the core tests' env over real NeMo-Gym pivot rows)
from test_grpo_distributed import launch  # noqa: E402  (a launcher's job, ended whole on a timeout)
from test_trl import letter_env  # noqa: E402  (the echo env scored by has-letter: SmolLM2 passes about half)
from trl_cpu import cpu_grpo_trainer  # noqa: E402

from pivot_envs.adapters.trl import reward_function  # noqa: E402

PROCESSES = 2
STEPS = 2


def process_program(out: Path) -> None:
    """What each process runs: GRPOTrainer for STEPS steps; each process records the env's rewards it computed
    (OUT/rewards-R.jsonl), and the main one TRL's log (OUT/log.json)."""
    import torch
    from accelerate import PartialState

    from pivot_envs.adapters import smollm2

    torch.set_num_threads(1)
    state = PartialState()
    pivots = real_pivots()[:4]
    env_reward = reward_function(letter_env, num_envs=1)

    def pivot_reward(completions, pivot_id, **kwargs):
        rewards = env_reward(completions=completions, pivot_id=pivot_id, **kwargs)
        with (out / f"rewards-{state.process_index}.jsonl").open("a") as handle:
            handle.write(json.dumps({"pivot_id": list(pivot_id), "rewards": rewards}) + "\n")
        return rewards

    model, tokenizer = smollm2.load()
    trainer = cpu_grpo_trainer(model, tokenizer, pivot_reward, pivots, out / "trl", max_steps=STEPS)
    trainer.train()
    if state.is_main_process:
        (out / "log.json").write_text(json.dumps(trainer.state.log_history))


@pytest.mark.slow
def test_trl_grpo_trainer_under_accelerate_on_two_cpu_processes_logs_both_processes_env_rewards(tmp_path):
    # `--multi_gpu` is accelerate's torchrun launcher; `--cpu` would start one process. GRPOConfig(use_cpu=True) in
    # each process then makes the group a gloo one on the CPU (accelerate's MULTI_CPU).
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        f"--num_processes={PROCESSES}",
        "--num_machines=1",
        "--mixed_precision=no",
        "--dynamo_backend=no",
        "--main_process_port=0",
        str(Path(__file__).resolve()),
        str(tmp_path),
    ]
    launch(command, timeout=600)

    calls = [
        [json.loads(line) for line in (tmp_path / f"rewards-{rank}.jsonl").read_text().splitlines()]
        for rank in range(PROCESSES)
    ]
    assert [len(mine) for mine in calls] == [
        STEPS
    ] * PROCESSES  # each process scored its own completions each step
    logged = [
        entry["reward"] for entry in json.loads((tmp_path / "log.json").read_text()) if "reward" in entry
    ]
    assert len(logged) == STEPS
    for step, reward in enumerate(logged):
        rewards = [r for mine in calls for r in mine[step]["rewards"]]
        assert len(rewards) == PROCESSES * 2 and set(rewards) <= {0.0, 1.0}
        # TRL's logged reward is the mean over both processes' completions of what the env gave them
        assert reward == pytest.approx(sum(rewards) / len(rewards))


if __name__ == "__main__":
    process_program(Path(sys.argv[1]))
