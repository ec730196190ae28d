"""Online re-profiling (GRPOConfig.reprofile_every): D_adv recomputed under the current policy during training."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from echo_domain import EchoEnv, real_pivots  # noqa: E402
from test_grpo import HasLetterVerifier, tiny_config, tiny_policy  # noqa: E402

from pivot_envs.adapters.grpo import GRPOConfig, train  # noqa: E402
from pivot_envs.adapters.grpo import reprofile as online  # noqa: E402
from pivot_envs.verifiers import Verdict  # noqa: E402

PIVOTS = real_pivots()


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from pivot_envs.adapters import smollm2

    return AutoTokenizer.from_pretrained(smollm2.checkpoint())


SOLVED, UNSOLVED = PIVOTS[0].id, PIVOTS[1].id  # whatever the policy does: always 1, always 0


class ByPivotVerifier(HasLetterVerifier):
    """Pivot 0 is always solved, pivot 1 never; every other pivot is has-letter (mixed for a random model)."""

    def verify(self, pivot, action, outcome=None):
        if pivot.id == SOLVED:
            return Verdict(1.0, "solved")
        if pivot.id == UNSOLVED:
            return Verdict(0.0, "unsolved")
        return super().verify(pivot, action, outcome)


def make_env():
    return EchoEnv(real_pivots(), verifier=ByPivotVerifier())


def config(out, **overrides):
    # two-token actions: has-letter is mixed at nearly every pivot (see test_grpo's resume test)
    values = dict(max_new_tokens=2, steps=3, checkpoint_every=1, reprofile_every=2, reprofile_k=6) | overrides
    return tiny_config(out, **values)


def test_due_every_n_steps_after_the_first():
    assert [step for step in range(1, 10) if online.due(step, 3)] == [4, 7]
    assert not any(online.due(step, 0) for step in range(1, 10))


def test_reprofiling_retires_the_solved_pivot_and_brings_back_mixed_candidates(tokenizer, tmp_path):
    # the offline profile (pretend) said pivots 0 and 2 were mixed; the pool holds five candidates
    in_play, candidates = [PIVOTS[0], PIVOTS[2]], PIVOTS[:5]
    result = train(
        config(tmp_path), in_play, policy=tiny_policy(tokenizer), env_id=make_env, candidates=candidates
    )
    records = [json.loads(line) for line in (tmp_path / "reprofiled.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [3]
    (record,) = records
    # pivot 0 always scores 1 and pivot 1 always 0: neither can be in D_adv; pivot 0 was in play and is retired
    assert SOLVED in record["retired"] and SOLVED not in record["pivots"] and UNSOLVED not in record["pivots"]
    assert record["revived"] and set(record["revived"]) <= {p.id for p in PIVOTS[2:5]} - {PIVOTS[2].id}
    assert record["samples"] == 5 * 6 and not record["kept"]
    steps = {r["step"]: r for r in result.history}
    assert steps[3]["pivots_in_play"] == len(record["pivots"]) and steps[3]["retired"] >= 1
    assert steps[1]["pivots_in_play"] == 2 and "retired" not in steps[1]


def test_an_empty_reprofiled_d_adv_keeps_the_pivots_in_play(tokenizer, tmp_path):
    # only the always-solved and never-solved pivots: nothing is mixed, so training goes on where it was
    in_play = [PIVOTS[0], PIVOTS[1]]
    result = train(config(tmp_path), in_play, policy=tiny_policy(tokenizer), env_id=make_env)
    (record,) = [json.loads(line) for line in (tmp_path / "reprofiled.jsonl").read_text().splitlines()]
    assert record["kept"] and record["pivots"] == [SOLVED, UNSOLVED] and record["retired"] == []
    assert [r["step"] for r in result.history] == [1, 2, 3]


def test_a_resumed_run_restores_the_pivots_in_play_and_drops_later_reprofiles(tokenizer, tmp_path):
    in_play, candidates = [PIVOTS[0], PIVOTS[2]], PIVOTS[:5]
    straight = train(
        config(tmp_path / "straight", steps=4),
        in_play,
        policy=tiny_policy(tokenizer),
        env_id=make_env,
        candidates=candidates,
    )
    split = tmp_path / "split"
    train(
        config(split, steps=3), in_play, policy=tiny_policy(tokenizer), env_id=make_env, candidates=candidates
    )
    # a line written after the checkpoint the run resumes from (a crash between them) is dropped
    with (split / "reprofiled.jsonl").open("a") as handle:
        handle.write(json.dumps({"step": 5, "pivots": [UNSOLVED]}) + "\n")
    resumed = train(
        config(split, steps=4, resume=True),
        in_play,
        policy=tiny_policy(tokenizer, seed=9),
        env_id=make_env,
        candidates=candidates,
    )
    assert [r["step"] for r in resumed.history] == [4]
    assert resumed.history[0]["pivots_in_play"] == straight.history[3]["pivots_in_play"]
    assert resumed.history[0]["reward_mean"] == straight.history[3]["reward_mean"]
    assert [json.loads(line)["step"] for line in (split / "reprofiled.jsonl").read_text().splitlines()] == [3]


def test_reprofiling_settings_are_checked():
    for bad in ({"reprofile_k": 1}, {"reprofile_every": -1}, {"reprofile_lambda_diff": 0.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            GRPOConfig(**bad)
