"""The bundled GRPO trainer sharded with FSDP2 (`--fsdp`): 2 ranks on the CPU (gloo), launched by torchrun.

This module is also the program each rank runs (`python -m torch.distributed.run ... THIS_FILE MODE OUT`):
`update` runs Eq. 7's update on fixed groups, unequal per rank; `train` runs the trainer end to end.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tiny_model, when run as a rank's program
from echo_domain import real_pivots  # noqa: E402  (the core tests' env over real NeMo-Gym pivot rows)
from test_grpo import make_env  # noqa: E402  (the has-letter env)
from test_grpo_distributed import metrics, torchrun  # noqa: E402
from tiny_model import smollm2_tokenizer, tiny_config, tiny_model, tiny_policy  # noqa: E402

from pivot_envs.adapters.grpo import GRPOConfig, train  # noqa: E402
from pivot_envs.adapters.grpo.groups import Group, loss_units  # noqa: E402
from pivot_envs.adapters.grpo.trainer import update  # noqa: E402

THIS = str(Path(__file__).resolve())


def fixed_groups() -> list[Group]:
    """Four groups of random tokens: three with actions of several tokens (two forwards per pass), one whose
    actions are one token each (one forward). Rank 0 takes the first, rank 1 the other three."""
    generator = torch.Generator().manual_seed(7)

    def tokens(n: int) -> list[int]:
        return torch.randint(0, 1000, (n,), generator=generator).tolist()

    shapes = [(9, [3, 5, 2]), (12, [4, 4]), (7, [1, 1, 1]), (5, [6, 2, 3, 1])]
    advantages = [[1.0, -0.5, -0.5], [0.7, -0.7], [-1.0, 0.5, 0.5], [0.3, -0.3, 0.9, -0.9]]
    return [
        Group(f"g{i}", tokens(prefix), [tokens(n) for n in actions], advantages[i])
        for i, (prefix, actions) in enumerate(shapes)
    ]


def update_config(out: Path) -> GRPOConfig:
    """Two AdamW steps per batch with the k3 KL to a reference, one group per pass."""
    return tiny_config(out, iterations=2, beta=0.04, tokens_per_pass=0, fsdp=True)


def local_numel(model, optimizer) -> int:
    """Elements this process holds of the weights and of AdamW's state (its shards when sharded)."""

    def count(tensor) -> int:
        return (tensor.to_local() if hasattr(tensor, "to_local") else tensor).numel()

    weights = sum(count(p) for p in model.parameters())
    state = sum(count(t) for s in optimizer.state.values() for t in s.values() if t.dim() > 0)
    return weights + state


def update_program(out: Path) -> None:
    """Each rank: the tiny model sharded, Eq. 7's update on its groups (rank 0: one pass, rank 1: three), then the
    gathered weights (rank 0 writes them) and the elements each rank holds."""
    from pivot_envs.adapters.grpo import fsdp
    from pivot_envs.adapters.grpo.distributed import setup

    ranks = setup()
    model = tiny_model(seed=0)
    reference = copy.deepcopy(model).requires_grad_(False)
    fsdp.shard(model, reference)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    groups = fixed_groups()
    mine = groups[:1] if ranks.rank == 0 else groups[1:]
    config = update_config(out)
    stats = update(model, reference, optimizer, mine, config, loss_units(groups, "token"), ranks)
    held = local_numel(model, optimizer)
    weights, _ = fsdp.full_state(model, optimizer)
    (out / f"rank-{ranks.rank}.json").write_text(json.dumps({"stats": stats, "numel": held}))
    if ranks.main:
        torch.save(weights, out / "weights.pt")


def train_config(out: Path, steps: int, resume: bool = False, lora: bool = False) -> GRPOConfig:
    """B = 4 pivots x G = 4 actions per step, a checkpoint and a held-out evaluation every step."""
    return tiny_config(
        out,
        batch_pivots=4,
        steps=steps,
        checkpoint_every=1,
        eval_every=1,
        eval_pivots=2,
        resume=resume,
        fsdp=True,
        lora=lora,
        lora_rank=4,
    )


def train_program(out: Path, steps: int, resume: bool, lora: bool) -> None:
    """Each rank: the trainer on the tiny policy (rank 1 starts from other weights: rank 0's are broadcast)."""
    policy = tiny_policy(smollm2_tokenizer(), seed=int(os.environ["RANK"]))
    train(
        train_config(out, steps, resume, lora),
        real_pivots(),
        policy=policy,
        env_id=make_env,
        heldout=real_pivots()[:2],
    )


def saved_weights(path: Path) -> dict:
    """A checkpoint's weights as saved: the model's, or with LoRA the adapters alone."""
    from safetensors.torch import load_file

    name = "adapter_model" if (path / "adapter_model.safetensors").is_file() else "model"
    return load_file(str(path / f"{name}.safetensors"))


def largest_difference(saved: dict, expected: dict) -> float:
    """The largest difference of a weight saved from the one expected (tied weights are saved once)."""
    return max(float((saved[k] - expected[k]).abs().max()) for k in saved)


@pytest.mark.slow
def test_two_sharded_ranks_with_unequal_passes_make_one_process_update_with_half_the_memory_each(tmp_path):
    model = tiny_model(seed=0)
    reference = copy.deepcopy(model).requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    groups = fixed_groups()
    alone = update(model, reference, optimizer, groups, update_config(tmp_path))
    whole = local_numel(model, optimizer)

    # rank 0 runs one pass, rank 1 three (one of them a one-forward pass): a misaligned FSDP collective
    # would hang, so the launch has a timeout
    torchrun(THIS, "update", str(tmp_path), timeout=300)
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    for key in ("loss", "kl", "clip_fraction", "entropy", "grad_norm"):
        assert ranks[0]["stats"][key] == pytest.approx(alone[key], rel=1e-5, abs=1e-7), key
    # float32, two AdamW steps of about 1e-3: the gradients are summed in another order (per rank, then
    # reduce-scattered), rounding that AdamW's first step g / (|g| + 1e-8) magnifies. Measured: 7.4e-6.
    assert largest_difference(torch.load(tmp_path / "weights.pt"), model.state_dict()) <= 2e-5
    held = [r["numel"] for r in ranks]
    assert sum(held) == whole  # every element of the weights and of AdamW's state is held once
    assert max(held) <= 0.51 * whole, (held, whole)  # each rank about half (shards split dim 0 unevenly)


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full-weights", "lora"])
def test_a_sharded_run_saves_one_process_weights_and_resumes_to_the_straight_run(tmp_path, lora):
    single = train(
        replace(train_config(tmp_path / "single", steps=2, lora=lora), fsdp=False),
        real_pivots(),
        policy=tiny_policy(smollm2_tokenizer()),
        env_id=make_env,
        heldout=real_pivots()[:2],
    )
    sharded, flags = tmp_path / "sharded", ["--lora"] * lora
    torchrun(THIS, "train", str(sharded), "1", *flags, timeout=300)
    (together,) = metrics(sharded)
    alone = single.history[0]
    for key in ("reward_mean", "frac_zero_variance", "groups_trained", "action_tokens", "eval_turn_accuracy"):
        assert together[key] == alone[key], key
    for key in ("loss", "entropy", "grad_norm"):
        assert together[key] == pytest.approx(alone[key], rel=1e-5, abs=1e-7), key
    # the checkpoint holds the whole weights (or adapters) in the one-process format: float32 rounding as above
    step_1 = saved_weights(sharded / "checkpoints" / "step-1")
    assert step_1.keys() == saved_weights(tmp_path / "single" / "checkpoints" / "step-1").keys()
    assert largest_difference(step_1, saved_weights(tmp_path / "single" / "checkpoints" / "step-1")) <= 2e-5

    # one process resumes the sharded run's checkpoint as its own (the format is the one-process one)
    shutil.copytree(sharded, tmp_path / "moved")
    moved = replace(train_config(tmp_path / "moved", steps=2, resume=True, lora=lora), fsdp=False)
    train(
        moved,
        real_pivots(),
        policy=tiny_policy(smollm2_tokenizer()),
        env_id=make_env,
        heldout=real_pivots()[:2],
    )
    single_final = saved_weights(tmp_path / "single" / "final")
    assert largest_difference(saved_weights(tmp_path / "moved" / "final"), single_final) <= 2e-5

    torchrun(THIS, "train", str(sharded), "2", "--resume", *flags, timeout=300)  # as after a kill past step 1
    assert [r["step"] for r in metrics(sharded)] == [1, 2]
    assert metrics(sharded)[1]["reward_mean"] == single.history[1]["reward_mean"]
    assert largest_difference(saved_weights(sharded / "final"), single_final) <= 2e-5


def test_fsdp_in_one_process_shards_nothing_and_trains_as_without_it(tmp_path):
    runs = []
    for name, fsdp in (("plain", False), ("fsdp", True)):
        config = tiny_config(tmp_path / name, steps=1, checkpoint_every=0, fsdp=fsdp)
        policy = tiny_policy(smollm2_tokenizer())
        runs.append((train(config, real_pivots(), policy=policy, env_id=make_env), policy.model.state_dict()))
    (plain, plain_weights), (fsdp, fsdp_weights) = runs
    assert plain.history[0]["loss"] == fsdp.history[0]["loss"]
    assert all(torch.equal(plain_weights[k], fsdp_weights[k]) for k in plain_weights)


if __name__ == "__main__":
    if sys.argv[1] == "update":
        update_program(Path(sys.argv[2]))
    else:
        train_program(Path(sys.argv[2]), int(sys.argv[3]), "--resume" in sys.argv, "--lora" in sys.argv)
