"""The bundled GRPO trainer data-parallel under torchrun: 2 ranks on the CPU (gloo), launched by torch's own launcher.

This module is also the program each rank runs (`python -m torch.distributed.run ... THIS_FILE OUT`):
the real launch, process group, per-rank generation and scoring, all-reduce and update.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tiny_model, when run as a rank's program
from echo_domain import real_pivots  # noqa: E402  (the core tests' env over real NeMo-Gym pivot rows)
from test_grpo import make_env, tiny_config  # noqa: E402  (the has-letter env)
from tiny_model import smollm2_tokenizer, tiny_policy  # noqa: E402

from pivot_envs.adapters.grpo import train  # noqa: E402
from pivot_envs.adapters.grpo.distributed import Ranks  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RANKS = 2


def one_step(out: Path):
    """One step of B = 4 pivots x G = 4 actions: one process trains all 4 groups, each of 2 ranks 2 of them."""
    return tiny_config(out, batch_pivots=4, steps=1, checkpoint_every=0)


def rank_program(out: Path) -> None:
    """What each rank runs: the one step on the tiny policy; it leaves its own weights in OUT/rank-R.pt."""
    policy = tiny_policy(smollm2_tokenizer(), seed=int(os.environ["RANK"]))  # rank 0's are broadcast
    train(one_step(out), real_pivots(), policy=policy, env_id=make_env)
    torch.save(policy.model.state_dict(), out / f"rank-{os.environ['RANK']}.pt")


def smollm2_program(out: Path, steps: int, resume: bool) -> None:
    """What each rank runs: SmolLM2 (hf) sampling 2 actions at its one pivot of 2 per step, scored by the has-letter
    env (mixed groups, so the update and its all-reduce run), checkpoints every step; OUT/rank-R-steps.json is the
    steps this rank trained."""
    from pivot_envs.adapters.grpo import GRPOConfig
    from pivot_envs.policy import load_policy

    config = GRPOConfig(
        batch_pivots=2,
        group_size=2,
        max_new_tokens=4,
        learning_rate=1e-5,
        steps=steps,
        resume=resume,
        checkpoint_every=1,
        eval_every=0,
        num_envs=1,
        out=str(out),
        seed=0,
    )
    result = train(config, real_pivots(), policy=load_policy("hf:smollm2"), env_id=make_env)
    (out / f"rank-{os.environ['RANK']}-steps.json").write_text(
        json.dumps([r["step"] for r in result.history])
    )


def launch(command: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run a launcher (torchrun, accelerate) and its processes in a session of their own, output captured; fail on
    an error, and on a timeout end the whole session (the launcher alone would leave its workers running)."""
    job = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True,
    )
    try:
        stdout, stderr = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        stdout, stderr = job.communicate()
        pytest.fail(f"{command[2]} ran past {timeout} s: {stderr[-5000:]}")
    assert job.returncode == 0, stdout[-3000:] + stderr[-5000:]
    return subprocess.CompletedProcess(command, job.returncode, stdout, stderr)


def torchrun(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc-per-node 2 ARGS` (torch.distributed.run), as `launch` runs it."""
    return launch(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}", *args],
        timeout,
    )


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_each_rank_takes_a_contiguous_share_of_the_steps_pivots():
    shares = [list(Ranks(rank, 2).share(5)) for rank in range(2)]
    assert shares == [[0, 1], [2, 3, 4]]
    assert [list(Ranks(rank, 3).share(7)) for rank in range(3)] == [[0, 1], [2, 3], [4, 5, 6]]
    assert list(Ranks().share(4)) == [0, 1, 2, 3]  # one process takes the whole batch


@pytest.mark.slow
def test_two_ranks_with_half_the_groups_each_make_the_step_one_process_makes_with_all(tmp_path):
    single_policy = tiny_policy(smollm2_tokenizer())
    initial = {k: v.clone() for k, v in single_policy.model.state_dict().items()}
    single = train(one_step(tmp_path / "single"), real_pivots(), policy=single_policy, env_id=make_env)
    torchrun(str(Path(__file__).resolve()), str(tmp_path / "ranks"), timeout=300)

    # The same groups in all: the same pivots drawn, each sampled with its own seed whichever rank drew it.
    (alone,), (together,) = single.history, metrics(tmp_path / "ranks")
    for key in ("reward_mean", "reward_std", "frac_zero_variance", "groups_trained", "action_tokens"):
        assert together[key] == alone[key], key
    assert together["groups_trained"] >= 2  # both ranks' groups are in the step (each rank holds 2 of the 4)
    for key in ("loss", "entropy", "clip_fraction", "grad_norm"):
        assert together[key] == pytest.approx(alone[key], rel=1e-5, abs=1e-7), key

    expected = single_policy.model.state_dict()
    moved = max(float((expected[k] - initial[k]).abs().max()) for k in initial)
    assert moved > 1e-4  # AdamW's first step moves a weight by about the learning rate, 1e-3
    for rank in range(RANKS):
        weights = torch.load(tmp_path / "ranks" / f"rank-{rank}.pt")
        # The gradients are summed in another order (per rank, then across): float32 rounding, which AdamW's
        # first step (g / (|g| + 1e-8)) magnifies where a gradient is near 1e-8. Measured: 4.9e-6 at most,
        # against steps of 1e-3; a rank trained on its own groups alone is whole steps off where its gradient
        # and the batch's differ in sign.
        assert max(float((weights[k] - expected[k]).abs().max()) for k in expected) <= 5e-5, rank
    # rank 0 alone wrote: one metrics line for the one step, one final checkpoint
    assert len(metrics(tmp_path / "ranks")) == 1
    assert (tmp_path / "ranks" / "final" / "trainer_state.pt").is_file()


@pytest.mark.slow
def test_smollm2_trains_on_two_ranks_and_both_resume_from_rank_0s_checkpoint(tmp_path):
    torchrun(str(Path(__file__).resolve()), "smollm2", str(tmp_path), "1", timeout=600)
    assert [r["step"] for r in metrics(tmp_path)] == [1]
    assert (tmp_path / "checkpoints" / "step-1" / "model.safetensors").is_file()
    assert not list(tmp_path.glob("**/*.tmp"))  # one writer: no save left half done

    torchrun(str(Path(__file__).resolve()), "smollm2", str(tmp_path), "2", "--resume", timeout=600)
    assert [r["step"] for r in metrics(tmp_path)] == [1, 2]  # rank 0 alone wrote: one line per step
    for rank in range(RANKS):  # each rank restored step 1 and trained step 2 only
        assert json.loads((tmp_path / f"rank-{rank}-steps.json").read_text()) == [2], rank
    assert (tmp_path / "checkpoints" / "step-2" / "trainer_state.pt").is_file()
    assert (tmp_path / "final" / "model.safetensors").is_file()


if __name__ == "__main__":
    if sys.argv[1] == "smollm2":
        smollm2_program(Path(sys.argv[2]), int(sys.argv[3]), resume="--resume" in sys.argv)
    else:
        rank_program(Path(sys.argv[1]))
