"""Asynchronous rollouts (`max_staleness`, grpo.rollouts): s = 0 is the synchronous loop, s >= 1 samples ahead
from weights at most s versions old, records every batch's version, and resumes without losing a batch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the GRPO trainer trains torch modules")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from echo_domain import real_pivots  # noqa: E402
from test_grpo import make_env  # noqa: E402
from tiny_model import smollm2_tokenizer, tiny_config, tiny_policy  # noqa: E402

from pivot_envs.adapters.grpo import GRPOConfig, latest_checkpoint, train  # noqa: E402
from pivot_envs.adapters.grpo.groups import Group  # noqa: E402
from pivot_envs.adapters.grpo.rollouts import LOG, StaleGroup, behaviour_tensor  # noqa: E402
from pivot_envs.adapters.grpo.shared_prefix import groups_logprobs  # noqa: E402
from pivot_envs.adapters.policies.hf import HFPolicy  # noqa: E402
from pivot_envs.config import ConfigError  # noqa: E402

TIMES = ("tokens_per_s", "time_generate_s", "time_score_s", "time_update_s")


@pytest.fixture(scope="module")
def tokenizer():
    return smollm2_tokenizer()


def _records(result) -> list[dict]:
    return [json.loads(line) for line in result.metrics_path.read_text().splitlines()]


def _rollouts(out: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(out) / LOG).read_text().splitlines()]


def test_max_staleness_zero_is_the_synchronous_run_bit_for_bit(tokenizer, tmp_path):
    default, explicit = tiny_policy(tokenizer), tiny_policy(tokenizer)
    plain = train(tiny_config(tmp_path / "plain"), real_pivots(), policy=default, env_id=make_env)
    zero = train(
        tiny_config(tmp_path / "zero", max_staleness=0), real_pivots(), policy=explicit, env_id=make_env
    )
    strip = [{k: v for k, v in r.items() if k not in TIMES} for r in _records(plain)]
    assert strip == [{k: v for k, v in r.items() if k not in TIMES} for r in _records(zero)]
    assert sum(r["groups_trained"] for r in strip) > 0
    for key, value in default.model.state_dict().items():
        assert torch.equal(value, explicit.model.state_dict()[key]), key
    # left out of config.json at its default: a synchronous run records what it recorded before the option
    assert "max_staleness" not in json.loads((plain.out / "config.json").read_text())
    assert not (plain.out / LOG).exists()


def test_one_step_of_staleness_trains_and_records_each_batchs_version(tokenizer, tmp_path):
    policy = tiny_policy(tokenizer)
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    result = train(
        tiny_config(tmp_path, max_staleness=1, max_new_tokens=2),
        real_pivots(),
        policy=policy,
        env_id=make_env,
    )
    records = _records(result)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(0 <= r["staleness_max"] <= 1 and r["staleness_mean"] <= r["staleness_max"] for r in records)
    assert records[0]["policy_version"] == 0  # nothing is published before the first update
    assert sum(r["groups_trained"] for r in records) > 0 and any(r["reward_mean"] > 0 for r in records)
    rollouts = _rollouts(result.out)
    assert [r["step"] for r in rollouts] == [1, 2, 3, 4]
    assert all(r["step"] - 1 - r["version"] == r["staleness"] <= 1 for r in rollouts)
    assert all(len(r["pivots"]) == 2 and r["samples"] == 8 for r in rollouts)
    assert json.loads((result.out / "config.json").read_text())["max_staleness"] == 1
    assert any(not torch.equal(v, before[k]) for k, v in policy.model.state_dict().items())


class Killed(Exception):
    """Stands for the process being killed while the next batch is sampled."""


class KilledPolicy(HFPolicy):
    """An HFPolicy whose `kill_at`-th generate raises (its copies share the count)."""

    calls: list[int]
    kill_at = 0

    def generate(self, chats, n, sampling):
        self.calls.append(1)
        if len(self.calls) == self.kill_at:
            raise Killed(f"generate call {self.kill_at}")
        return super().generate(chats, n, sampling)


def test_a_run_killed_while_sampling_ahead_resumes_without_losing_or_doubling_a_batch(tokenizer, tmp_path):
    def config(out, **overrides):
        return tiny_config(out, max_staleness=1, max_new_tokens=2, steps=6, checkpoint_every=2, **overrides)

    straight = train(
        config(tmp_path / "straight"), real_pivots(), policy=tiny_policy(tokenizer), env_id=make_env
    )
    base = tiny_policy(tokenizer)
    killed = KilledPolicy(base.model, base.tokenizer, name="hf:tiny")
    killed.calls, killed.kill_at = [], 6  # batch 6 fails while step 5 trains: batches 5 and 6 were ahead
    with pytest.raises(Killed):
        train(config(tmp_path / "split"), real_pivots(), policy=killed, env_id=make_env)
    assert latest_checkpoint(tmp_path / "split").name == "step-4"
    assert [r["step"] for r in _rollouts(tmp_path / "split")] == [1, 2, 3, 4, 5]
    resumed = train(
        config(tmp_path / "split", resume=True), real_pivots(), policy=tiny_policy(tokenizer), env_id=make_env
    )
    assert [r["step"] for r in resumed.history] == [5, 6]
    # batch i's pivots come from the sampler's position after batch i - 1, whatever was prefetched
    consumed = [(r["step"], r["pivots"]) for r in _rollouts(tmp_path / "split")]
    assert consumed == [(r["step"], r["pivots"]) for r in _rollouts(straight.out)]
    assert [r["step"] for r in _records(resumed)] == [1, 2, 3, 4, 5, 6]


def test_the_update_takes_log_pi_old_from_the_behaviour_logprobs_laid_out_as_its_own(tokenizer):
    model = tiny_policy(tokenizer).model
    groups = [Group("a", [1, 2, 3], [[4, 5], [6]], [1.0, -1.0]), Group("b", [7, 8], [[9, 10, 11]], [0.5])]
    logprobs, mask, _ = groups_logprobs(model, [(g.prefix, g.actions) for g in groups])
    rows = [logprobs[i][mask[i]].tolist() for i in range(3)]
    stale = [
        StaleGroup(g.pivot_id, g.prefix, g.actions, g.advantages, rows[i : i + len(g.actions)], 0)
        for g, i in zip(groups, (0, 2))
    ]
    assert torch.equal(behaviour_tensor(stale, logprobs.detach()) * mask, logprobs.detach() * mask)
    assert behaviour_tensor(groups, logprobs) is None  # plain groups: the update's own forward is pi_old


@pytest.mark.parametrize("other", [{"reprofile_every": 2}, {"fsdp": True}, {"max_staleness": -1}])
def test_settings_sampling_ahead_cannot_serve_are_refused_with_a_one_line_error(other):
    with pytest.raises(ConfigError) as error:
        GRPOConfig(**({"max_staleness": 1} | other))
    assert "\n" not in str(error.value)


OPENMP_CHECK = """
import ctypes, glob, os, sys
import numpy as np
import torch
from pivot_envs.adapters.grpo.rollouts import Prefetcher

openmp = ctypes.CDLL(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp*"))[0])

class Published:
    def wait_for(self, version, stopped):
        return True

seen = []
for threads in (1, 2):
    torch.set_num_threads(threads)
    sample = lambda step, sampler: openmp.omp_get_max_threads()  # the sampler's first call: OpenMP's
    with Prefetcher(sample, Published(), np.random.default_rng(0), 0, 1, 1) as prefetch:
        seen.append(prefetch.next())
print(seen)
"""


def test_the_sampling_thread_runs_at_the_process_s_openmp_thread_count():
    """A new thread starts at OpenMP's default count until its first call into torch; vLLM's CPU attention
    reads OpenMP's count first and fails its check when it differs from torch's setting (seen in the suite:
    '(2 vs. 1)'). The sampler's first call is OpenMP's here: it must already see torch's setting. In a
    fresh process: once vLLM's CPU worker is loaded, torch.set_num_threads does nothing."""
    import glob
    import os
    import subprocess

    import torch

    if not glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp*")):
        pytest.skip("torch is not built with libgomp here")
    assert (os.cpu_count() or 1) >= 2, "needs 2 cores: a thread count other than OpenMP's default"
    found = subprocess.run(
        [sys.executable, "-c", OPENMP_CHECK],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": ""},
    )
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.strip().splitlines()[-1] == "[1, 2]"


class Engine(HFPolicy):
    """As the vllm backends: generates with weights of its own and takes the trained ones by `update_weights`,
    which must never come while it generates."""

    def generate(self, chats, n, sampling):
        self.busy = True
        try:
            return super().generate(chats, n, sampling)
        finally:
            self.busy = False

    def update_weights(self, state_dict) -> None:
        assert not self.busy, "weights written while generating"
        self.model.load_state_dict(state_dict)
        self.updates += 1


def test_an_engine_with_weights_of_its_own_takes_each_version_between_its_batches(tokenizer, tmp_path):
    engine = Engine(tiny_policy(tokenizer).model, tokenizer, name="engine:tiny")
    engine.busy, engine.updates = False, 0
    trained = tiny_policy(tokenizer).model
    result = train(
        tiny_config(tmp_path, max_staleness=1, max_new_tokens=2),
        real_pivots(),
        policy=engine,
        env_id=make_env,
        model=trained,
    )
    assert engine.updates == 4  # one published version per step
    assert all(r["staleness_max"] <= 1 for r in result.history)
    for key, value in trained.state_dict().items():
        assert torch.equal(value, engine.model.state_dict()[key]), key


def test_lora_samples_ahead_with_a_copy_of_the_adapters(tokenizer, tmp_path):
    pytest.importorskip("peft", reason="LoRA is peft's")
    policy = tiny_policy(tokenizer)
    result = train(
        tiny_config(tmp_path, max_staleness=1, max_new_tokens=2, lora=True, lora_rank=4, checkpoint_every=0),
        real_pivots(),
        policy=policy,
        env_id=make_env,
    )
    assert sum(r["groups_trained"] for r in result.history) > 0
    assert any("lora_" in k for k in policy.model.state_dict())
    assert (result.final / "adapter_model.safetensors").is_file()
