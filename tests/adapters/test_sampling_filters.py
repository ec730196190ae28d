"""SamplingParams' top_k, min_p and stop: checked on construction, honoured by the hf backend's sampler.

No model: `HFPolicy._sample` on fixed logits (the distribution 0.5, 0.25, 0.15, 0.1) and the stop
string cut on a stand-in tokenizer that decodes ids to letters.
"""

from __future__ import annotations

import pytest

from pivot_envs.adapters.policies.hf import HFPolicy
from pivot_envs.policy import SamplingParams

PROBS = [0.5, 0.25, 0.15, 0.1]


def sampled(sampling: SamplingParams, rows: int = 2000) -> set[int]:
    """The tokens `_sample` picks from PROBS over `rows` evenly spread uniform draws."""
    import torch

    logits = torch.tensor(PROBS).log().expand(rows, -1)
    draws = (torch.arange(rows) + 0.5) / rows
    return set(HFPolicy._sample(logits, sampling, draws).tolist())


def test_without_filters_every_token_is_sampled():
    assert sampled(SamplingParams()) == {0, 1, 2, 3}


def test_top_k_keeps_the_k_most_likely_tokens():
    assert sampled(SamplingParams(top_k=2)) == {0, 1}
    assert sampled(SamplingParams(top_k=1)) == {0}


def test_min_p_keeps_the_tokens_at_least_that_fraction_of_the_most_likely():
    assert sampled(SamplingParams(min_p=0.3)) == {0, 1, 2}  # 0.15 >= 0.3 * 0.5; 0.1 is not
    assert sampled(SamplingParams(min_p=1.0)) == {0}


def test_top_p_applies_to_the_mass_the_other_filters_leave():
    # After top_k=3 the mass is 0.5, 0.25, 0.15 of 0.9: top_p=0.8 of it (0.72) needs the first two.
    assert sampled(SamplingParams(top_k=3, top_p=0.8)) == {0, 1}
    assert sampled(SamplingParams(top_p=0.8)) == {0, 1, 2}


def test_sampling_params_refuse_filters_that_mean_nothing():
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=-1)
    with pytest.raises(ValueError, match="min_p"):
        SamplingParams(min_p=1.5)
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop="</tool_call>")
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=[""])


class Letters:
    """A stand-in tokenizer: id i decodes to the i-th lowercase letter."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(ord("a") + i) for i in ids)


def test_a_stop_string_ends_the_completion_at_the_token_that_completes_it():
    policy = HFPolicy.__new__(HFPolicy)
    policy.tokenizer = Letters()
    # "abcde": "cd" is complete after the 4th token; "x" never appears.
    assert policy._stop_string_end([0, 1, 2, 3, 4], "abcde", ["x", "cd"]) == 4
    assert policy._stop_string_end([0, 1, 2, 3, 4], "abcde", ["x"]) is None
    assert policy._stop_string_end([0, 1, 2, 3, 4], "abcde", []) is None
