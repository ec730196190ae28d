"""`pivotrl train` and `pivotrl run` with `--policy vllm:smollm2`, end to end on the CPU: the vLLM
engine samples, the trainer updates the transformers copy of the weights, and after each update
the engine serves the new weights (`VLLMPolicy.update_weights`).

The pivots are greetings (the run trains at every candidate, `--filter.mode cand`: the warm-up
leaves none unsolved), where SmolLM2-135M as it ships answers like the expert (its own greedy
answer to "Hi") about one sample in four at temperature 1, as the tool-use domain's functional
verifier judges messages (token overlap): groups of 8 are mostly mixed, so the step updates the
weights. Engines run unpinned to cores (VLLM_CPU_OMP_THREADS_BIND=nobind): the test machine's
cores are shared.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pivot_envs.pivot import Pivot, read_pivots, write_pivots

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (make setup)"),
]

GREETINGS = ["Hi", "Hello there", "Good morning", "hey"]
EXPERT = "Hello there! How can I assist you today?"
# The engine's sampling logprobs and the trainer's recomputation on the same weights differ by ~2e-5
# in float32 (tests/adapters/test_policy_vllm.py); one step at learning rate 1e-4 moves them by more
# than 1e-2.
SAME, MOVED = 1e-3, 1e-2

# Runs the command's own main() in this interpreter, then samples one completion from the engine
# the command built (its logprobs are the engine's weights as they are after the command's training).
AFTERWARDS = """
import json, sys
from pivot_envs.adapters.policies import vllm
from pivot_envs.cli import main
from pivot_envs.policy import SamplingParams

engines, built = [], vllm.VLLMPolicy.__init__
def keep(self, *args, **kwargs):
    built(self, *args, **kwargs)
    engines.append(self)
vllm.VLLMPolicy.__init__ = keep
code = main(sys.argv[2:])
chat = {"messages": [{"role": "user", "content": "Hi"}], "tools": []}
sample = engines[0].generate([chat], 1, SamplingParams(temperature=1.0, max_new_tokens=8, seed=5))[0][0]
json.dump({"code": code, "engines": len(engines), "prompt": sample.prompt_token_ids, "tokens": sample.token_ids,
           "logprobs": sample.logprobs}, open(sys.argv[1], "w"))
"""


def greeting_pivots(path: Path) -> Path:
    pivots = [
        Pivot(
            f"greeting/{index}/t0",
            "tool-use",
            [
                {"role": "system", "content": "You are a helpful airline agent."},
                {"role": "user", "content": text},
            ],
            {"role": "assistant", "content": EXPERT},
        )
        for index, text in enumerate(GREETINGS)
    ]
    write_pivots(pivots, path)
    return path


def environment() -> dict[str, str]:
    return os.environ | {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "TQDM_DISABLE": "1"}


def trainer_logprobs(checkpoint: str | Path, prompt: list[int], tokens: list[int]) -> list[float]:
    """The logprobs of `tokens` after `prompt` under a checkpoint, as the GRPO trainer computes them."""
    import torch
    from transformers import AutoModelForCausalLM

    from pivot_envs.adapters.grpo.shared_prefix import groups_logprobs

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        logprobs, mask, _ = groups_logprobs(model, [(prompt, [tokens])])
    return logprobs[0][mask[0]].tolist()


def distance(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_train_with_vllm_hands_each_update_to_the_engine(tmp_path: Path) -> None:
    from pivot_envs.adapters import smollm2

    out, sampled = tmp_path / "train", tmp_path / "engine.json"
    pivots = greeting_pivots(tmp_path / "pivots.jsonl")
    options = (
        "--steps 1 --batch-pivots 4 --group-size 8 --max-new-tokens 12 --learning-rate 1e-4 --num-envs 1"
    )
    argv = ["train", "--policy", "vllm:smollm2", "--pivots", str(pivots), *options.split(), "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-c", AFTERWARDS, str(sampled), *argv],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    engine = json.loads(sampled.read_text())
    assert (engine["code"], engine["engines"]) == (0, 1)
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(history) == 1 and history[0]["groups_trained"] >= 1, history

    # The engine's logprobs are those of the trained weights (train/final), not of the checkpoint it loaded.
    trained = trainer_logprobs(out / "final", engine["prompt"], engine["tokens"])
    initial = trainer_logprobs(smollm2.checkpoint(), engine["prompt"], engine["tokens"])
    assert distance(engine["logprobs"], trained) < SAME
    assert distance(engine["logprobs"], initial) > MOVED


def test_run_with_vllm_warms_up_profiles_trains_and_evaluates_through_the_engine(tmp_path: Path) -> None:
    out = tmp_path / "run"
    pivots = greeting_pivots(tmp_path / "pivots.jsonl")
    options = (
        "--split.heldout 0.25 --candidates 0 --profile.k 4 --eval-pivots 1 --sft-epochs 1 --sft-examples 0 "
        "--filter.mode cand --train.steps 1 --train.batch-pivots 3 --train.group-size 4 --max-new-tokens 12"
    )
    command = [str(Path(sys.executable).parent / "pivotrl"), "run", "--policy", "vllm:smollm2"]
    argv = [*command, "--input", str(pivots), "--out", str(out), *options.split()]
    done = subprocess.run(argv, env=environment(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith(f"report: {out / 'report.md'}")
    figures = json.loads((out / "report.json").read_text())
    assert (figures["extracted"], figures["profiled"]) == (4, 3)
    assert figures["sft"]["examples"] == 3 and figures["sft"]["epochs"] == 1
    assert figures["before"]["policy"].startswith("vllm:") and len(figures["history"]) == 1
    profiled = read_pivots(out / "profiled.jsonl")
    for pivot in profiled:
        assert pivot.profile.n_valid == 4 and set(pivot.profile.rewards) <= {0.0, 1.0}
        assert pivot.profile.settings["reference"].startswith("vllm:smollm2 after SFT warm-up ")
    # The engine profiled with the warmed-up weights: one epoch on these greetings makes the model
    # answer like the expert (12 samples of 12 measured), where the checkpoint does one time in four.
    rewards = [r for pivot in profiled for r in pivot.profile.rewards]
    assert sum(rewards) >= len(rewards) / 2, rewards
    # GRPO trained the warmed-up module (pi_0), not the checkpoint loaded afresh: its final weights
    # are the warm-up's plus at most one step.
    final = weights(out / "train" / "final")
    assert (
        squared_distance(final, weights(out / "sft" / "weights.pt"))
        < squared_distance(final, weights(None)) / 4
    )


def weights(path: Path | None) -> dict:
    """A state dict: the warm-up's file, a checkpoint directory, or (None) the embedded checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM

    from pivot_envs.adapters import smollm2

    if path is not None and path.suffix == ".pt":
        return torch.load(path)
    model = AutoModelForCausalLM.from_pretrained(path or smollm2.checkpoint(), dtype=torch.float32)
    return model.state_dict()


def squared_distance(a: dict, b: dict) -> float:
    return sum(float(((a[name] - b[name]) ** 2).sum()) for name in a)
