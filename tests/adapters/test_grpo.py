"""The GRPO trainer at pivots: Eq. 1 advantages, the Eq. 7 loss, token faithfulness, checkpoints and resume."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from echo_domain import EchoEnv, real_pivots  # noqa: E402  (the core tests' env over real NeMo-Gym pivot rows)
from tiny_model import smollm2_tokenizer, tiny_config, tiny_policy  # noqa: E402,F401  (other test files import them from here)
from toys import HasLetterVerifier  # noqa: E402,F401  (as are these)

from pivot_envs.adapters.grpo import (  # noqa: E402
    Group,
    GRPOConfig,
    NoPivotsError,
    PivotRLConfig,
    TrainablePolicy,
    UntrainablePolicyError,
    action_logprobs,
    build_group,
    clipped_loss,
    group_advantages,
    latest_checkpoint,
    pack_groups,
    padded_tokens,
    pass_budget,
    pivotrl,
    plot_metrics,
    select_pivots,
    train,
    update,
)
from pivot_envs.adapters.policies.hf import HFPolicy  # noqa: E402
from pivot_envs.pivot import read_pivots  # noqa: E402
from pivot_envs.verifiers import Verdict  # noqa: E402


def make_env():
    return EchoEnv(real_pivots(), verifier=HasLetterVerifier())


@pytest.fixture(scope="module")
def tokenizer():
    return smollm2_tokenizer()


# -- Eq. 1 ----------------------------------------------------------------------------------------


def test_advantages_are_rewards_normalised_within_the_group():
    advantages = group_advantages([1.0, 0.0, 0.0, 1.0], [True] * 4, std_epsilon=0.0)
    assert advantages == pytest.approx([1.0, -1.0, -1.0, 1.0])


def test_invalid_samples_are_left_out_of_the_group_mean_and_std():
    advantages = group_advantages([1.0, 0.0, 0.0, 1.0], [True, True, True, False], std_epsilon=0.0)
    mean, std = 1 / 3, math.sqrt(2 / 9)
    assert advantages == pytest.approx([(1 - mean) / std, -mean / std, -mean / std, 0.0])


def test_a_group_with_equal_valid_rewards_carries_no_signal():
    assert group_advantages([1.0, 1.0, 0.0], [True, True, False]) is None
    assert group_advantages([0.0, 0.0, 0.0, 0.0], [True] * 4) is None
    assert group_advantages([1.0, 0.0], [True, False]) is None


def test_leave_one_out_baseline_is_the_mean_of_the_other_rewards():
    advantages = group_advantages([1.0, 0.0, 0.0, 0.0], [True] * 4, leave_one_out=True, scale_by_std=False)
    assert advantages == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])


# -- Eq. 6 ----------------------------------------------------------------------------------------


def test_clipped_loss_stops_the_gradient_of_tokens_outside_the_clip_range():
    old = torch.zeros(1, 3)
    logprobs = torch.tensor([[0.0, math.log(1.5), math.log(0.5)]], requires_grad=True)
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, stats = clipped_loss(logprobs, old, torch.tensor([1.0]), mask, 0.2, 0.2)
    loss.backward()
    # w = 1 (inside), 1.5 (above 1.2 with A > 0: clipped, no gradient), 0.5 (below: min keeps w A, gradient flows)
    assert loss.item() == pytest.approx(-(1.0 + 1.2 + 0.5))
    assert logprobs.grad.tolist()[0] == pytest.approx([-1.0, 0.0, -0.5])
    assert stats["clipped"] == 1


def test_k3_kl_is_zero_at_the_reference_and_positive_away_from_it():
    logprobs = torch.tensor([[-1.0, -2.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    _, same = clipped_loss(
        logprobs, logprobs, torch.zeros(1), mask, 0.2, 0.2, beta=0.1, ref_logprobs=logprobs
    )
    _, away = clipped_loss(
        logprobs, logprobs, torch.zeros(1), mask, 0.2, 0.2, beta=0.1, ref_logprobs=logprobs - 0.5
    )
    assert same["kl"] == 0.0
    assert away["kl"] == pytest.approx(2 * (math.exp(-0.5) + 0.5 - 1))


# -- token faithfulness ------------------------------------------------------------------------------


def test_the_trainer_scores_exactly_the_tokens_the_policy_sampled(tokenizer):
    from pivot_envs.policy import SamplingParams

    policy = tiny_policy(tokenizer)
    pivot = real_pivots()[0]
    completions = policy.generate(
        [pivot.observation], 3, SamplingParams(temperature=1.0, max_new_tokens=8, seed=5)
    )[0]
    group = build_group(pivot.id, completions, [1.0, -1.0, 0.0], [True, True, True])
    for completion, action in zip(completions, group.actions):
        assert group.prefix + action == completion.prompt_token_ids + completion.token_ids
    with torch.no_grad():
        logprobs, mask, _ = action_logprobs(policy.model, group.prefix, group.actions)
    for row, completion in enumerate(completions):
        # the sampler's logprobs of its own tokens equal the trainer's: same ids, same context
        assert logprobs[row][mask[row]].tolist() == pytest.approx(completion.logprobs, abs=1e-4)


def test_completions_without_prompt_ids_are_refused_with_the_pivot_named():
    from pivot_envs.policy import Completion

    with pytest.raises(ValueError, match="pivot p/1.*prompt_token_ids"):
        build_group("p/1", [Completion("hi", token_ids=[1, 2])], [1.0], [True])


def test_invalid_samples_are_dropped_from_the_update():
    from pivot_envs.policy import Completion

    completions = [
        Completion("a", token_ids=[1], prompt_token_ids=[9]),
        Completion("b", token_ids=[2], prompt_token_ids=[9]),
    ]
    group = build_group("p/1", completions, [0.5, 0.0], [True, False])
    assert group.actions == [[1]] and group.advantages == [0.5]


# -- passes of several groups ----------------------------------------------------------------------


def _groups(seed: int, shapes) -> list[Group]:
    """Groups of random ids: shapes is [(prefix length, [action lengths])]."""
    generator = torch.Generator().manual_seed(seed)

    def ids(n):
        return torch.randint(0, 500, (n,), generator=generator).tolist()

    return [
        Group(f"p/{i}", ids(prefix), [ids(n) for n in actions], [(-1.0) ** j for j in range(len(actions))])
        for i, (prefix, actions) in enumerate(shapes)
    ]


def test_groups_are_packed_into_passes_within_the_token_budget():
    groups = _groups(0, [(100, [10, 4]), (30, [5]), (80, [8, 8, 2]), (20, [1, 3])])
    # longest prefix first; 100 and 80 together pad to 2 x 100 + 5 actions x 10 = 250 tokens
    assert [[len(g.prefix) for g in chunk] for chunk in pack_groups(groups, 250)] == [[100, 80], [30, 20]]
    passes = pack_groups(groups, 249)
    assert sorted(id(g) for chunk in passes for g in chunk) == sorted(id(g) for g in groups)
    assert [[len(g.prefix) for g in chunk] for chunk in passes] == [[100], [80, 30], [20]]
    assert [padded_tokens(chunk) for chunk in passes] == [120, 192, 26]  # 80 joining 100 would make 250
    assert [[len(g.prefix) for g in chunk] for chunk in pack_groups(groups, 100)] == [
        [100],
        [80],
        [30, 20],
    ]  # over: alone
    assert pack_groups(groups, 0) == [[g] for g in sorted(groups, key=lambda g: -len(g.prefix))]
    assert pack_groups(groups, 10**6) == [sorted(groups, key=lambda g: -len(g.prefix))]


def test_the_pass_budget_defaults_to_one_group_per_pass_on_a_cpu(tokenizer):
    model = tiny_policy(tokenizer).model
    assert pass_budget(GRPOConfig(), model) == 0  # compute-bound there: packing only costs memory
    assert pass_budget(GRPOConfig(tokens_per_pass=4096), model) == 4096
    assert pass_budget(GRPOConfig(tokens_per_pass=0), model) == 0


@pytest.mark.parametrize(("beta", "level"), [(0.0, "token"), (0.1, "token"), (0.1, "action")])
def test_packing_groups_into_one_pass_makes_the_same_update_as_one_group_per_pass(tokenizer, beta, level):
    groups = _groups(1, [(40, [6, 1, 3]), (9, [4]), (25, [1, 7])])
    initial = tiny_policy(tokenizer).model.state_dict()
    results = []
    for tokens_per_pass in (0, 10**6):
        model = tiny_policy(tokenizer).model
        reference = tiny_policy(tokenizer, seed=1).model if beta else None  # another model: KL > 0
        optimizer = torch.optim.SGD(
            model.parameters(), lr=1.0
        )  # linear in the gradients, unlike Adam's first step
        config = GRPOConfig(tokens_per_pass=tokens_per_pass, iterations=2, beta=beta, loss_level=level)
        stats = update(model, reference, optimizer, groups, config)
        results.append((stats, {k: v - initial[k] for k, v in model.state_dict().items()}))
    (one, one_steps), (packed, packed_steps) = results
    assert packed == pytest.approx(one, rel=1e-4, abs=1e-7)
    assert packed["grad_norm"] > 0 and (packed["kl"] > 0) == (beta > 0)
    difference = torch.sqrt(sum(((packed_steps[k] - one_steps[k]) ** 2).sum() for k in one_steps))
    norm = torch.sqrt(sum((step**2).sum() for step in one_steps.values()))
    assert norm > 0 and difference / norm < 1e-5


def test_the_sampled_denominator_scales_the_step_by_the_share_of_units_trained(tokenizer):
    groups = _groups(2, [(12, [3, 5]), (8, [4, 2])])
    steps = []
    for denominator in (None, 28):  # 14 action tokens trained; twice as many sampled
        model = tiny_policy(tokenizer).model
        initial = {k: v.clone() for k, v in model.state_dict().items()}
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        update(model, None, optimizer, groups, GRPOConfig(max_grad_norm=0), denominator)
        steps.append(torch.cat([(v - initial[k]).flatten() for k, v in model.state_dict().items()]))
    full, halved = steps
    assert full.norm() > 0 and torch.allclose(halved, full / 2, atol=1e-7)


# -- the loop -----------------------------------------------------------------------------------------


def test_training_logs_metrics_and_moves_the_weights(tokenizer, tmp_path):
    policy = tiny_policy(tokenizer)
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    result = train(
        tiny_config(tmp_path, steps=2, eval_every=2),
        real_pivots(),
        policy=policy,
        env_id=make_env,
        heldout=real_pivots()[:2],
    )
    records = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for key in (
        "reward_mean",
        "reward_std",
        "frac_zero_variance",
        "kl",
        "clip_fraction",
        "entropy",
        "tokens_per_s",
        "loss",
    ):
        assert key in records[0]
    assert "eval_turn_accuracy" in records[1] and "eval_turn_accuracy" not in records[0]
    assert sum(r["groups_trained"] for r in records) > 0
    assert all(r["entropy"] > 0 for r in records if r["groups_trained"])
    changed = [k for k, v in policy.model.state_dict().items() if not torch.equal(v, before[k])]
    assert "model.embed_tokens.weight" in changed
    assert (result.final / "config.json").is_file() and (result.final / "trainer_state.pt").is_file()
    png = plot_metrics(result.metrics_path, tmp_path / "rewards.png")
    assert png.stat().st_size > 1000


def test_resuming_from_a_checkpoint_continues_the_run_as_if_it_had_not_stopped(tokenizer, tmp_path):
    # Two iterations per batch: the second scores with weights one AdamW step away from pi_old, so
    # its w_i != 1 and the loss depends on the restored weights and optimizer moments (at w_i = 1 the
    # loss is -sum_i A_i |a_i| / tokens: zero for equal-length actions). Two-token actions make
    # has-letter's groups mixed at every step, so every step, after the resume too, trains.
    # Seed 6: rounding noise between two runs moves AdamW's near-zero-gradient weights, and with the
    # per-pivot sampling seeds (grpo.distributed) seed 3 put a step-4 draw near a token boundary, so
    # the runs sampled differently in about half of the tries; seed 6 passed 9 of 9.
    def config(out, **overrides):
        return tiny_config(out, iterations=2, max_new_tokens=2, **({"seed": 6} | overrides))

    straight_policy = tiny_policy(tokenizer)
    straight = train(config(tmp_path / "straight"), real_pivots(), policy=straight_policy, env_id=make_env)
    first = train(
        config(tmp_path / "split", steps=2), real_pivots(), policy=tiny_policy(tokenizer), env_id=make_env
    )
    assert latest_checkpoint(first.out).name == "step-2"
    # a fresh process would start from the initial weights again: a different seed proves they are restored
    resumed_policy = tiny_policy(tokenizer, seed=99)
    resumed = train(
        config(tmp_path / "split", resume=True), real_pivots(), policy=resumed_policy, env_id=make_env
    )
    assert [r["step"] for r in resumed.history] == [3, 4]
    assert all(r["groups_trained"] > 0 and r["loss"] != 0.0 for r in straight.history)
    # Equal up to float32 rounding (two identical runs differ by ~1e-7: the loss sums terms of size
    # |A_i| ~ 1 that nearly cancel); a resume without the optimizer's moments moves ~1e-3 per step.
    for key in ("loss", "grad_norm", "kl", "clip_fraction", "entropy"):
        assert [r[key] for r in first.history + resumed.history] == pytest.approx(
            [r[key] for r in straight.history], rel=1e-5, abs=1e-6
        ), key
    assert [r["reward_mean"] for r in first.history + resumed.history] == [
        r["reward_mean"] for r in straight.history
    ]
    # The weights end where the straight run's do, to a thousandth of how far its four steps moved them
    # (elementwise equality is too strict: AdamW turns rounding noise in a near-zero gradient into a full step).
    initial, straight_weights = tiny_policy(tokenizer).model.state_dict(), straight_policy.model.state_dict()
    resumed_weights = resumed_policy.model.state_dict()
    moved = math.sqrt(sum(float(((straight_weights[k] - initial[k]) ** 2).sum()) for k in initial))
    apart = math.sqrt(sum(float(((resumed_weights[k] - straight_weights[k]) ** 2).sum()) for k in initial))
    assert moved > 0 and apart < 1e-3 * moved, (apart, moved)
    assert [json.loads(line)["step"] for line in resumed.metrics_path.read_text().splitlines()] == [
        1,
        2,
        3,
        4,
    ]


def test_a_fresh_run_into_an_output_holding_an_earlier_run_is_refused_and_changes_nothing(
    tokenizer, tmp_path
):
    train(tiny_config(tmp_path, steps=2), real_pivots(), policy=tiny_policy(tokenizer), env_id=make_env)
    before = {path: path.stat().st_mtime_ns for path in tmp_path.rglob("*")}
    with pytest.raises(
        ValueError, match=r"holds an earlier run \(checkpoint step-2, 2 steps in metrics.jsonl\).*--resume"
    ):
        train(tiny_config(tmp_path, steps=4), real_pivots(), policy=tiny_policy(tokenizer), env_id=make_env)
    assert {path: path.stat().st_mtime_ns for path in tmp_path.rglob("*")} == before
    # A resume continues the run: its method's settings cannot change, its length and layout can.
    with pytest.raises(
        ValueError,
        match=r"step-2 with other settings \(group_size: 4 there, 2 now; "
        r"learning_rate: 0.001 there, 0.01 now\)",
    ):
        train(
            tiny_config(tmp_path, steps=3, resume=True, learning_rate=1e-2, group_size=2),
            real_pivots(),
            policy=tiny_policy(tokenizer),
            env_id=make_env,
        )
    resumed = train(
        tiny_config(tmp_path, steps=3, resume=True, checkpoint_every=1, tokens_per_pass=0),
        real_pivots(),
        policy=tiny_policy(tokenizer),
        env_id=make_env,
    )
    assert [r["step"] for r in resumed.history] == [3]
    # A run that saved no checkpoint cannot be resumed, and its metrics are not overwritten either.
    unsaved = tmp_path / "unsaved"
    train(
        tiny_config(unsaved, steps=1, checkpoint_every=0),
        real_pivots(),
        policy=tiny_policy(tokenizer),
        env_id=make_env,
    )
    with pytest.raises(ValueError, match=r"\(1 step in metrics.jsonl\) but no checkpoint to resume from"):
        train(
            tiny_config(unsaved, steps=2, checkpoint_every=0, resume=True),
            real_pivots(),
            policy=tiny_policy(tokenizer),
            env_id=make_env,
        )


def test_a_policy_that_would_never_sample_from_the_trained_weights_is_refused_before_the_first_step(
    tokenizer, tmp_path
):
    policy = tiny_policy(tokenizer)
    assert isinstance(policy, TrainablePolicy)
    # The module trained is not the one the hf policy generates with, and hf takes no new weights.
    with pytest.raises(
        UntrainablePolicyError,
        match="policy 'hf:tiny' neither shares the trained module nor has update_weights",
    ):
        train(
            tiny_config(tmp_path),
            real_pivots(),
            policy=policy,
            model=tiny_policy(tokenizer, seed=1).model,
            env_id=make_env,
        )
    assert not (tmp_path / "metrics.jsonl").exists()


def test_a_policy_without_a_model_trains_the_module_its_trainable_model_loads(tokenizer):
    from pivot_envs.adapters.grpo.policy import trainable_module

    class EngineBacked:  # as the vllm backend: generation elsewhere, weights pushed with update_weights
        name = "engine:tiny"

        def __init__(self) -> None:
            self.loaded = tiny_policy(tokenizer).model

        def trainable_model(self):
            return self.loaded

        def update_weights(self, state_dict) -> None:
            raise AssertionError("not called here")

    policy = EngineBacked()
    assert trainable_module(policy) is policy.loaded
    del EngineBacked.trainable_model
    with pytest.raises(UntrainablePolicyError, match="policy 'engine:tiny' has no trainable .model"):
        trainable_module(policy)


def test_beta_above_zero_measures_the_kl_to_the_frozen_reference(tokenizer, tmp_path):
    config = tiny_config(tmp_path, steps=3, beta=0.1, iterations=2, learning_rate=2e-3, checkpoint_every=0)
    result = train(config, real_pivots(), policy=tiny_policy(tokenizer), env_id=make_env)
    trained = [r for r in result.history if r["groups_trained"]]
    assert trained, "no group had mixed rewards"
    # the second iteration of each batch moved away from the reference and from pi_old
    assert any(r["kl"] > 0 for r in trained)


def test_lora_trains_only_the_adapters_and_the_policy_generates_with_them(tokenizer, tmp_path):
    pytest.importorskip("peft")
    policy = tiny_policy(tokenizer)
    base = {k: v.clone() for k, v in policy.model.state_dict().items()}
    probe = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        logits_before = policy.model(probe).logits
    result = train(
        tiny_config(tmp_path, steps=2, lora=True, lora_rank=4, learning_rate=5e-3, checkpoint_every=0),
        real_pivots(),
        policy=policy,
        env_id=make_env,
    )
    state = policy.model.state_dict()
    assert any("lora_" in k for k in state)  # the policy's own module carries the adapters
    assert all(torch.equal(state[k], v) for k, v in state.items() if "lora_" not in k and k in base)
    assert (result.final / "adapter_model.safetensors").is_file()
    with torch.no_grad():
        assert not torch.allclose(
            policy.model(probe).logits, logits_before
        )  # what the policy generates with moved


@pytest.fixture(scope="module")
def has_letter_env_id():
    """An env id whose env holds the pivots it is given and scores with the has-letter verifier."""
    import gymnasium as gym

    name = "test/echo-has-letter-v0"
    if name not in gym.registry:
        gym.register(name, entry_point=lambda pivots=None: EchoEnv(pivots, verifier=HasLetterVerifier()))
    return name


@pytest.fixture(scope="module")
def verifier_env_id():
    """An env id whose default verifier passes every action, and whose verifier="never" passes none."""
    import gymnasium as gym

    name = "test/echo-verifier-choice-v0"
    if name not in gym.registry:
        gym.register(
            name,
            entry_point=lambda pivots=None, verifier=None: EchoEnv(
                pivots, verifier=NeverVerifier() if verifier == "never" else AlwaysVerifier()
            ),
        )
    return name


def test_held_out_accuracy_is_graded_by_the_default_verifier_whatever_the_training_verifier(
    tokenizer, tmp_path, verifier_env_id
):
    pivots = real_pivots()
    result = train(
        tiny_config(tmp_path, steps=1, eval_every=1),
        pivots[2:],
        policy=tiny_policy(tokenizer),
        env_id=verifier_env_id,
        heldout=pivots[:2],
        verifier="never",
    )
    record = result.history[0]
    assert record["reward_mean"] == 0.0  # training scored with the verifier asked for
    assert record["eval_turn_accuracy"] == 1.0  # graded by the env's default verifier


def test_pivotrl_extracts_profiles_under_the_reference_filters_then_trains_at_the_pivots(
    tokenizer, tmp_path, has_letter_env_id
):
    from pivot_envs.extract import ExtractConfig, FilterConfig
    from pivot_envs.profile import ProfileConfig, profile
    from pivot_envs.trajectory import Trajectory

    experts = real_pivots()[:8]
    trajectories = [
        Trajectory(id=f"expert-{i}", messages=[*p.messages, p.expert], tools=p.tools)
        for i, p in enumerate(experts)
    ]
    profiling = ProfileConfig(k=4, max_new_tokens=2, seed=0, batch_pivots=4, env_workers=2, progress=False)
    config = PivotRLConfig(
        out=str(tmp_path / "run"),
        extract=ExtractConfig(domain="echo"),
        profile=profiling,
        filter=FilterConfig(lambda_diff=0.6),
        train=tiny_config(tmp_path / "ignored", steps=2, max_new_tokens=2, checkpoint_every=0),
    )
    result = pivotrl(trajectories, tiny_policy(tokenizer), config, env_id=has_letter_env_id)
    selection = result.selection

    # line 2: one candidate per assistant turn after a prefix; each expert turn is the last of its trajectory
    turns = [sum(m["role"] == "assistant" for m in t.messages) for t in trajectories]
    assert {f"expert-{i}/t{n - 1}" for i, n in enumerate(turns)} <= {p.id for p in selection.candidates}
    # line 3: every candidate profiled with K samples of pi_0, before any update: a fresh copy of the
    # initial model profiles them the same
    assert [p.id for p in selection.profiled] == [p.id for p in selection.candidates]
    assert all(p.profile.k == 4 and len(p.profile.rewards) == 4 for p in selection.profiled)
    profile(
        selection.candidates,
        tiny_policy(tokenizer),
        tmp_path / "again.jsonl",
        ProfileConfig(**{**vars(profiling), "env": has_letter_env_id}),
    )
    again = {p.id: p.profile.rewards for p in read_pivots(tmp_path / "again.jsonl")}
    assert {p.id: p.profile.rewards for p in selection.profiled} == again
    # line 4: D_pivot is D_adv (var > 0, mean < lambda_diff): here the candidates with mean 0.75 go
    kept = [p.id for p in selection.profiled if p.profile.var > 0 and p.profile.mean < 0.6]
    assert [p.id for p in selection.pivots] == kept and 0 < len(kept) < len(selection.profiled)
    assert [p.id for p in read_pivots(tmp_path / "run" / "pivots.jsonl")] == kept
    # lines 5-14: the GRPO run at those pivots, in OUT/train
    assert result.training.out == tmp_path / "run" / "train" and [
        r["step"] for r in result.training.history
    ] == [1, 2]
    assert not (tmp_path / "ignored").exists()

    # A threshold nothing is under keeps no pivot: refused with the profiles' figures (reused, not redone).
    with pytest.raises(
        NoPivotsError,
        match=rf"of {len(selection.profiled)} profiled candidates \(K=4\), "
        rf"{sum(p.profile.var > 0 for p in selection.profiled)} had mixed",
    ):
        select_pivots(
            selection.candidates,
            tiny_policy(tokenizer, seed=5),
            PivotRLConfig(out=config.out, profile=profiling, filter=FilterConfig(lambda_diff=0.0)),
            env_id=has_letter_env_id,
            reference_name="hf:tiny",
        )


class OwnWeightsPolicy:
    """As the vllm backend: generates with a copy of the weights of its own, and takes the trained ones
    through `update_weights` (it has no `.model`, so the module to train is passed as `model=`)."""

    name = "own-weights:tiny"

    def __init__(self, policy: HFPolicy) -> None:
        self.engine, self.tokenizer = policy, policy.tokenizer

    def generate(self, chats, n, sampling):
        return self.engine.generate(chats, n, sampling)

    def update_weights(self, state_dict) -> None:
        self.engine.model.load_state_dict(state_dict)


def test_pivotrl_trains_the_module_given_as_model_as_it_trains_the_policys_own(
    tokenizer, tmp_path, has_letter_env_id
):
    from pivot_envs.extract import ExtractConfig, FilterConfig
    from pivot_envs.profile import ProfileConfig
    from pivot_envs.trajectory import Trajectory

    trajectories = [
        Trajectory(id=f"expert-{i}", messages=[*p.messages, p.expert], tools=p.tools)
        for i, p in enumerate(real_pivots()[:8])
    ]

    def run(policy, out, model=None):
        config = PivotRLConfig(
            out=str(out),
            extract=ExtractConfig(domain="echo"),
            profile=ProfileConfig(
                k=4, max_new_tokens=2, seed=0, batch_pivots=4, env_workers=2, progress=False
            ),
            filter=FilterConfig(lambda_diff=0.8),
            train=tiny_config(out, steps=2, max_new_tokens=4, checkpoint_every=0),
        )
        return pivotrl(trajectories, policy, config, env_id=has_letter_env_id, model=model)

    shared = tiny_policy(tokenizer)  # generates with the module it trains (hf)
    first = run(shared, tmp_path / "shared")
    engine, trained = OwnWeightsPolicy(tiny_policy(tokenizer)), tiny_policy(tokenizer).model
    before = {k: v.clone() for k, v in trained.state_dict().items()}
    second = run(engine, tmp_path / "own", model=trained)

    assert sum(r["groups_trained"] for r in second.training.history) > 0
    assert any(not torch.equal(v, before[k]) for k, v in trained.state_dict().items())
    # the module given is the one trained, the engine got its weights after each update, and the run is
    # the one the policy sharing its module makes: same pivots, same records, the same weights bit for bit
    for key, value in trained.state_dict().items():
        assert torch.equal(value, engine.engine.model.state_dict()[key])
        assert torch.equal(value, shared.model.state_dict()[key])
    assert [p.id for p in second.selection.pivots] == [p.id for p in first.selection.pivots]
    assert [r["loss"] for r in second.training.history] == [r["loss"] for r in first.training.history]


class AlwaysVerifier:
    """A verifier every action passes (the default of `verifier_env_id`)."""

    name = "always"

    def verify(self, pivot, action, outcome=None):
        return Verdict(1.0, "always")


class NeverVerifier:
    """A verifier no action passes: every profiled candidate is uniformly failed and D_adv is empty."""

    name = "never"

    def verify(self, pivot, action, outcome=None):
        return Verdict(0.0, "never")


def test_an_empty_d_adv_stops_pivotrl_before_training_unless_the_filter_falls_back_to_the_unsolved(
    tokenizer, tmp_path
):
    import gymnasium as gym

    from pivot_envs.extract import FilterConfig
    from pivot_envs.profile import ProfileConfig

    name = "test/echo-never-v0"
    if name not in gym.registry:
        gym.register(name, entry_point=lambda pivots=None: EchoEnv(pivots, verifier=NeverVerifier()))
    candidates = real_pivots()[:3]
    profiling = ProfileConfig(k=2, max_new_tokens=2, seed=0, batch_pivots=3, env_workers=1, progress=False)
    train = tiny_config(tmp_path / "ignored", steps=1, max_new_tokens=2, checkpoint_every=0)

    strict = PivotRLConfig(
        out=str(tmp_path / "adv"), profile=profiling, filter=FilterConfig(lambda_diff=0.6), train=train
    )
    with pytest.raises(NoPivotsError, match="of 3 profiled candidates \\(K=2\\), 0 had mixed rewards"):
        pivotrl(candidates, tiny_policy(tokenizer), strict, env_id=name)
    assert not (tmp_path / "adv" / "train").exists()

    falling_back = PivotRLConfig(
        out=str(tmp_path / "fallback"),
        profile=profiling,
        filter=FilterConfig(lambda_diff=0.6, mode="adv-or-unsolved"),
        train=train,
    )
    result = pivotrl(candidates, tiny_policy(tokenizer), falling_back, env_id=name)
    # Every candidate failed all its samples: all are kept, and the groups at them carry no signal.
    assert [p.id for p in result.selection.pivots] == [p.id for p in candidates]
    assert [r["groups_trained"] for r in result.training.history] == [0]
    assert result.training.seconds > 0


@pytest.fixture(scope="module")
def tiny_checkpoint(tokenizer, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-model")
    policy = tiny_policy(tokenizer)
    policy.model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_pivotrl_train_runs_on_the_bundled_tool_use_pivots(tiny_checkpoint, tmp_path):
    import gymnasium as gym

    import pivot_envs
    from pivot_envs import write_pivots
    from pivot_envs.cli import main

    gym.register_envs(pivot_envs)
    bundled = gym.make("pivot/tool-use-v0").unwrapped.pivots
    write_pivots(bundled[:3], tmp_path / "train.jsonl")
    write_pivots(bundled[3:5], tmp_path / "heldout.jsonl")
    code = main(
        [
            "train",
            "--pivots",
            str(tmp_path / "train.jsonl"),
            "--heldout",
            str(tmp_path / "heldout.jsonl"),
            "--policy",
            f"hf:{tiny_checkpoint}",
            "--steps",
            "2",
            "--batch-pivots",
            "2",
            "--group-size",
            "2",
            "--max-new-tokens",
            "4",
            "--eval-every",
            "2",
            "--checkpoint-every",
            "1",
            "--out",
            str(tmp_path / "run"),
            "--plot",
        ]
    )
    assert code == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert records[1]["eval_turn_accuracy"] == 0.0  # a random model does not call airline tools
    assert (tmp_path / "run" / "checkpoints" / "step-2" / "trainer_state.pt").is_file()
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    assert (tmp_path / "run" / "rewards.png").is_file()
