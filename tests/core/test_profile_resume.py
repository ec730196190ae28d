"""Profiling with a real policy: a seeded profile killed and resumed writes what an uninterrupted
one writes, and `pivotrl profile` stops with an error when the env fails on every sample.

The policy is a randomly initialised model of SmolLM2's architecture (tiny, so a CPU runs it in
seconds) behind the real HFPolicy, on the tool-use domain's bundled airline candidates.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest

from pivot_envs.env import InfrastructureError, PivotEnv
from pivot_envs.pivot import Pivot, read_pivots, write_pivots
from pivot_envs.policy import SamplingParams

torch = pytest.importorskip("torch")

CANDIDATES = 10

# Run in a subprocess, so the test can kill it. The real HFPolicy, paced so the kills land mid-run;
# the batch sizes differ between runs, so a resumed candidate lands in another batch than before.
RUNNER = """
import sys
import time

import torch

from pivot_envs.pivot import read_pivots
from pivot_envs.policy import load_policy
from pivot_envs.profile import ProfileConfig, profile

torch.set_num_threads(1)
model, pivots, out = sys.argv[1:4]
delay, batch_pivots, batch_size = float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])


class Paced:
    def __init__(self, policy):
        self.policy, self.name = policy, policy.name

    def generate(self, chats, n, sampling):
        time.sleep(delay)
        return self.policy.generate(chats, n, sampling)


policy = load_policy(f"hf:{model}", device="cpu", batch_size=batch_size)
config = ProfileConfig(k=2, temperature=1.0, max_new_tokens=8, seed=7, batch_pivots=batch_pivots, env_workers=1,
                       progress=False)
run = profile(read_pivots(pivots), Paced(policy), out, config)
print("profiled", run.profiled, "skipped", run.skipped)
"""


@pytest.fixture(scope="module")
def tokenizer():
    from tiny_model import smollm2_tokenizer

    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def tiny_model(tokenizer):
    from tiny_model import tiny_model as build

    return build(tokenizer)


@pytest.fixture(scope="module")
def tiny_checkpoint(tiny_model, tokenizer, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny-model")
    tiny_model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def airline_pivots(count: int) -> list[Pivot]:
    from pivot_envs.domains.tool_use.env import bundled_pivots

    return list(bundled_pivots()[:count])


def start(
    directory: Path, model: Path, pivots: Path, out: Path, delay: float, batch_pivots: int, batch_size: int
) -> subprocess.Popen:
    script = directory / "runner.py"
    if not script.exists():
        script.write_text(RUNNER)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    arguments = [str(model), str(pivots), str(out), str(delay), str(batch_pivots), str(batch_size)]
    return subprocess.Popen(
        [sys.executable, str(script), *arguments], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )


def rows(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def kill_after(process: subprocess.Popen, out: Path, count: int) -> int:
    """SIGKILL the run once `out` holds `count` rows; returns how many it holds then."""
    deadline = time.time() + 120
    while rows(out) < count and process.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, process.stderr.read().decode()[-2000:]
    return rows(out)


def test_a_seeded_profile_killed_twice_and_resumed_equals_the_uninterrupted_run(tiny_checkpoint, tmp_path):
    pivots_path = tmp_path / "candidates.jsonl"
    write_pivots(airline_pivots(CANDIDATES), pivots_path)
    uninterrupted, resumed = tmp_path / "uninterrupted.jsonl", tmp_path / "resumed.jsonl"

    reference = start(
        tmp_path, tiny_checkpoint, pivots_path, uninterrupted, delay=0.0, batch_pivots=3, batch_size=4
    )
    first = kill_after(
        start(tmp_path, tiny_checkpoint, pivots_path, resumed, 0.3, batch_pivots=3, batch_size=2), resumed, 2
    )
    assert 2 <= first < CANDIDATES - 4, (
        f"the first kill should land early, {first} of {CANDIDATES} were written"
    )
    second = kill_after(
        start(tmp_path, tiny_checkpoint, pivots_path, resumed, 0.3, batch_pivots=2, batch_size=1),
        resumed,
        first + 2,
    )
    assert first < second < CANDIDATES, (
        f"the second kill should land mid-run, {second} of {CANDIDATES} were written"
    )
    finisher = start(tmp_path, tiny_checkpoint, pivots_path, resumed, 0.0, batch_pivots=4, batch_size=3)
    out, err = finisher.communicate(timeout=300)
    assert finisher.returncode == 0, err.decode()[-2000:]
    assert out.decode().split() == ["profiled", str(CANDIDATES - second), "skipped", str(second)]
    _, err = reference.communicate(timeout=300)
    assert reference.returncode == 0, err.decode()[-2000:]

    assert resumed.read_bytes() == uninterrupted.read_bytes()
    records = read_pivots(resumed)
    assert [p.id for p in records] == [p.id for p in read_pivots(pivots_path)]
    # The samples are random draws (not a greedy repeat), so equal files mean equal seeds.
    assert all(len(set(p.profile.actions)) == 2 for p in records)
    assert len({p.profile.actions[0] for p in records}) == CANDIDATES


def test_a_chats_seeded_samples_do_not_depend_on_the_batch_it_is_generated_in(tiny_model, tokenizer):
    from pivot_envs.adapters.policies.hf import HFPolicy

    chats = [pivot.observation for pivot in airline_pivots(3)]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6, seeds=[11, 12, 13])
    together = HFPolicy(tiny_model, tokenizer, batch_size=3).generate(chats, 3, sampling)
    apart = HFPolicy(tiny_model, tokenizer, batch_size=1).generate(
        [chats[2], chats[0]], 3, SamplingParams(1.0, max_new_tokens=6, seeds=[13, 11])
    )
    ids = [[c.token_ids for c in group] for group in together]
    assert [[c.token_ids for c in group] for group in apart] == [ids[2], ids[0]]
    assert len({tuple(sample) for sample in ids[0]}) == 3  # the n samples of a chat differ
    other = HFPolicy(tiny_model, tokenizer).generate(
        chats[:1], 3, SamplingParams(1.0, max_new_tokens=6, seeds=[99])
    )
    assert [c.token_ids for c in other[0]] != ids[0]


def test_seeds_must_be_one_per_chat(tiny_model, tokenizer):
    from pivot_envs.adapters.policies.hf import HFPolicy

    chats = [pivot.observation for pivot in airline_pivots(2)]
    with pytest.raises(ValueError, match="holds 1 seeds for 2 chats"):
        HFPolicy(tiny_model, tokenizer).generate(chats, 2, SamplingParams(max_new_tokens=2, seeds=[1]))


class DownBackendEnv(PivotEnv):
    """Real pivots whose tool backend is down: every action is an infrastructure failure."""

    domain = "down"

    def execute(self, pivot, action):
        raise InfrastructureError("tool backend unreachable: connection refused")


gym.register("test/backend-down-v0", entry_point=DownBackendEnv, disable_env_checker=True)


def test_pivotrl_profile_exits_non_zero_naming_the_cause_when_the_env_fails_on_every_sample(
    tiny_checkpoint, tmp_path, capsys
):
    from pivot_envs.cli import main

    candidates, out = tmp_path / "candidates.jsonl", tmp_path / "profiled.jsonl"
    write_pivots(airline_pivots(3), candidates)
    flags = "--k 2 --max-new-tokens 2 --env test/backend-down-v0".split()
    argv = ["profile", str(candidates), "--policy", f"hf:{tiny_checkpoint}", "--out", str(out), *flags]
    assert main(argv) == 1
    error = capsys.readouterr().err
    assert "every one of the run's 6 samples failed in the env" in error
    assert "infrastructure_error: tool backend unreachable: connection refused" in error
    assert len(out.read_text().splitlines()) == 3  # written, with their errors, and profiled again on a rerun
