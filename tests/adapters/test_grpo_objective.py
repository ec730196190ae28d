"""Eq. 7 at the two levels `GRPOConfig.loss_level` offers: per token (the default) and per action (the paper's).

Pure torch on hand-built tensors: an action is a row of token logprobs, padding masked out.
"""

import math

import pytest

torch = pytest.importorskip("torch")

from pivot_envs.adapters.grpo import Group, GRPOConfig, clipped_loss, loss_units  # noqa: E402
from pivot_envs.config import UnknownOptionError  # noqa: E402

EPS = 0.2


def rows():
    """Two actions of 3 and 2 tokens (the second padded), their old logprobs, and garbage in the padding."""
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.2, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    new = old + torch.tensor([[0.05, 0.1, -0.02], [-0.03, 0.01, 9.0]], dtype=torch.float64)
    return new, old, mask


def test_the_action_level_weight_is_the_product_of_the_token_ratios():
    new, old, mask = rows()
    advantages = torch.tensor([1.0, -1.0], dtype=torch.float64)
    loss, _ = clipped_loss(new, old, advantages, mask, EPS, EPS, level="action")
    # w_1 = exp(0.05 + 0.1 - 0.02), w_2 = exp(-0.03 + 0.01): the padding's 9.0 never counts
    w1, w2 = math.exp(0.13), math.exp(-0.02)
    assert float(loss) == pytest.approx(-(w1 * 1.0) - (w2 * -1.0))


def test_an_action_whose_weight_leaves_the_clip_range_gives_none_of_its_tokens_a_gradient():
    old = torch.zeros(1, 3, dtype=torch.float64)
    # the summed log ratio 0.3 is past log(1.2) although each token's 0.1 is inside it
    new = torch.full((1, 3), 0.1, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(1, 3, dtype=torch.bool)
    advantages = torch.tensor([1.0], dtype=torch.float64)
    loss, stats = clipped_loss(new, old, advantages, mask, EPS, EPS, level="action")
    loss.backward()
    assert torch.all(new.grad == 0) and stats["clipped"] == 1
    new.grad = None
    loss, stats = clipped_loss(new, old, advantages, mask, EPS, EPS, level="token")
    loss.backward()
    assert torch.all(new.grad < 0) and stats["clipped"] == 0


def test_the_action_level_kl_is_k3_of_the_summed_logprobs():
    new, old, mask = rows()
    ref = old - 0.1  # pi_0 below pi_theta at every token
    zero = torch.zeros(2, dtype=torch.float64)
    loss, stats = clipped_loss(new, new, zero, mask, EPS, EPS, beta=0.5, ref_logprobs=ref, level="action")
    deltas = [((ref - new) * mask)[i].sum().item() for i in range(2)]
    expected = sum(math.exp(d) - d - 1 for d in deltas)
    assert stats["kl"] == pytest.approx(expected) and float(loss) == pytest.approx(0.5 * expected)


def test_token_and_action_levels_agree_on_one_token_actions():
    old = torch.tensor([[-1.0], [-2.0], [-0.3]], dtype=torch.float64)
    new = old + torch.tensor([[0.3], [-0.1], [0.02]], dtype=torch.float64)
    mask = torch.ones(3, 1, dtype=torch.bool)
    advantages = torch.tensor([1.0, -0.5, 0.7], dtype=torch.float64)
    ref = old + 0.2
    by_token, _ = clipped_loss(new, old, advantages, mask, EPS, 0.28, 0.1, ref, level="token")
    by_action, _ = clipped_loss(new, old, advantages, mask, EPS, 0.28, 0.1, ref, level="action")
    assert float(by_token) == pytest.approx(float(by_action))


def test_the_units_averaged_over_are_tokens_or_actions():
    groups = [Group("a", [1], [[1, 2, 3], [4]], [1.0, -1.0]), Group("b", [1], [[5, 6]], [0.0])]
    assert loss_units(groups, "token") == 6 and loss_units(groups, "action") == 3


def test_an_unknown_loss_level_or_denominator_is_refused_with_the_choices():
    with pytest.raises(UnknownOptionError, match="action"):
        GRPOConfig(loss_level="actions")
    with pytest.raises(UnknownOptionError, match="sampled"):
        GRPOConfig(loss_denominator="sample")
