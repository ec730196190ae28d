"""The paper's Theorems 3.2 and 3.3 checked numerically, through the library's own objective.

A state's action space is N one-token actions with a free softmax policy over them. Expectations
are exact: every action is a row of `clipped_loss` and a float mask weights the rows by
pi_old(a), so the loss is E_{a ~ pi_old}[...] and its gradient the population gradient. Pure torch
on CPU, float64.
"""

import math

import pytest

torch = pytest.importorskip("torch")

from pivot_envs.adapters.grpo import clipped_loss, group_advantages  # noqa: E402

EPS = 0.2
# pi_0 over six actions; M (r_func = 1) holds actions 0 and 3
LOGITS_0 = [1.0, 0.2, -0.5, 0.7, -1.0, 0.1]
REWARD = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]


def tensors():
    logp0 = torch.log_softmax(torch.tensor(LOGITS_0, dtype=torch.float64), 0)
    return logp0, torch.tensor(REWARD, dtype=torch.float64)


def population_advantage(p, r, scale: bool = True):
    """Eq. 1 in population: (r - E_p r) / sqrt(Var_p r), or unscaled (r - E_p r)."""
    mean = (p * r).sum()
    centred = r - mean
    return centred / (p * centred**2).sum().sqrt() if scale else centred


def expected_loss(logp, old, advantages, weights, beta: float = 0.0, ref=None, level: str = "token"):
    """The library's Eq. 7 loss as E_{a ~ pi_old}: one row per action, weighted by pi_old(a)."""
    ref = None if ref is None else ref[:, None]
    loss, _ = clipped_loss(
        logp[:, None], old[:, None], advantages, weights[:, None], EPS, EPS, beta, ref, level
    )
    return loss


def kl_path(logp0, r, beta):
    """log pi_beta = log(pi_0 e^{r/beta} / Z), Theorem 3.2's KL path."""
    return torch.log_softmax(logp0 + r / beta, 0)


# -- Theorem 3.2: the GRPO score along the KL path is sqrt(Var) / beta^2 -----------------------------------------


@pytest.mark.parametrize("beta", [0.3, 1.0, 4.0])
def test_the_grpo_score_along_the_kl_path_is_the_reward_std_over_beta_squared(beta):
    logp0, r = tensors()
    p = kl_path(logp0, r, beta).exp()
    advantage = population_advantage(p, r)
    std = float((p * (r - (p * r).sum()) ** 2).sum().sqrt())
    # Eq. 9 by central finite differences of log pi_beta in beta
    h = 1e-5
    d_logp = (kl_path(logp0, r, beta + h) - kl_path(logp0, r, beta - h)) / (2 * h)
    by_differences = float(-(p * advantage * d_logp).sum())
    # the same score as the derivative in beta of the library's loss at pi_old = pi_beta (w = 1 there)
    b = torch.tensor(beta, dtype=torch.float64, requires_grad=True)
    loss = expected_loss(kl_path(logp0, r, b), kl_path(logp0, r, beta).detach(), advantage, p)
    (by_loss,) = torch.autograd.grad(loss, b)
    assert by_differences == pytest.approx(std / beta**2, rel=1e-6)
    assert float(by_loss) == pytest.approx(std / beta**2, rel=1e-9)


def natural_rates(rewards, scale_by_std: bool):
    """At a uniform policy over G actions (the group enumerates it exactly): the Fisher norm of the update
    the library's group advantages and loss give, and the rate at which it raises J = E[r]."""
    group = len(rewards)
    theta = torch.zeros(group, dtype=torch.float64, requires_grad=True)
    logp = torch.log_softmax(theta, 0)
    advantages = group_advantages(rewards, [True] * group, std_epsilon=0.0, scale_by_std=scale_by_std)
    mask = torch.ones(group, 1, dtype=torch.bool)
    loss, _ = clipped_loss(
        logp[:, None], logp.detach()[:, None], torch.tensor(advantages, dtype=torch.float64), mask, EPS, EPS
    )
    (gradient,) = torch.autograd.grad(loss / group, theta)
    p = logp.detach().exp()
    fisher_inverse = torch.linalg.pinv(torch.diag(p) - torch.outer(p, p))
    direction = -fisher_inverse @ gradient  # the natural-gradient step on the logits
    r = torch.tensor(rewards, dtype=torch.float64)
    grad_j = p * (r - (p * r).sum())
    return float(gradient @ fisher_inverse @ gradient) ** 0.5, float(grad_j @ direction)


@pytest.mark.parametrize("successes", [1, 2, 4, 6])
def test_the_natural_signal_of_an_exact_group_scales_with_the_reward_std(successes):
    rewards = [1.0] * successes + [0.0] * (8 - successes)
    share = successes / 8
    std = math.sqrt(share * (1 - share))
    # Dr. GRPO's unscaled advantage: the natural-gradient norm is the std itself
    norm, _ = natural_rates(rewards, scale_by_std=False)
    assert norm == pytest.approx(std, rel=1e-9)
    # Eq. 1's scaled advantage: unit norm, and J rises along it at rate std (Theorem 3.2's gamma * beta^2)
    norm, rate = natural_rates(rewards, scale_by_std=True)
    assert norm == pytest.approx(1.0, rel=1e-9) and rate == pytest.approx(std, rel=1e-9)


def test_a_uniform_group_carries_no_natural_signal():
    assert group_advantages([1.0] * 8, [True] * 8) is None


# -- Theorem 3.3: the KL-regularised optimum reweights pi_0, keeping its ordering within M and M^c ---------------


def q_beta(rho: float, beta: float) -> float:
    """Eq. 12: the mass the minimiser puts on M."""
    return rho * math.exp(1 / beta) / ((1 - rho) + rho * math.exp(1 / beta))


def test_the_exact_kl_objective_is_minimised_by_pi_0_reweighted_to_mass_q_beta():
    logp0, r = tensors()
    beta = 0.5
    theta = logp0.clone().requires_grad_(True)
    optimizer = torch.optim.LBFGS([theta], max_iter=100, line_search_fn="strong_wolfe", tolerance_grad=1e-12)

    def objective():
        optimizer.zero_grad()
        logp = torch.log_softmax(theta, 0)
        value = -(logp.exp() * r).sum() + beta * (logp.exp() * (logp - logp0)).sum()  # Eq. 11
        value.backward()
        return value

    optimizer.step(objective)
    p = torch.softmax(theta.detach(), 0)
    ratio = p / logp0.exp()
    rho = float(logp0.exp()[r == 1].sum())
    assert float(p[r == 1].sum()) == pytest.approx(q_beta(rho, beta), rel=1e-6)
    assert float(ratio[r == 1].std()) < 1e-4 and float(ratio[r == 0].std()) < 1e-4


def train_on_policy(beta: float, scale: bool, steps: int, lr: float = 1.0):
    """Gradient descent on free logits with the library's loss, on-policy: pi_old is the current policy at every
    step (Algorithm 1 with iterations=1), Eq. 1's advantage in population, the k3 KL to pi_0 when beta > 0."""
    logp0, r = tensors()
    theta = logp0.clone().requires_grad_(True)
    for _ in range(steps):
        logp = torch.log_softmax(theta, 0)
        p = logp.detach().exp()
        loss = expected_loss(logp, logp.detach(), population_advantage(p, r, scale), p, beta, logp0)
        (gradient,) = torch.autograd.grad(loss, theta)
        with torch.no_grad():
            theta -= lr * gradient
    return torch.softmax(theta.detach(), 0), logp0.exp(), r


@pytest.mark.parametrize("scale", [False, True])
def test_with_beta_above_zero_the_update_keeps_pi_0s_ordering_within_m_and_its_complement(scale):
    p, p0, r = train_on_policy(beta=0.5, scale=scale, steps=1500)
    ratio = p / p0
    rho = float(p0[r == 1].sum())
    assert float(ratio[r == 1].std()) < 1e-6 and float(ratio[r == 0].std()) < 1e-6
    assert float(p[r == 1].sum()) > rho  # mass moved toward M (Eq. 13)
    if not scale:
        # The fixed point of k3 as a loss, sampled on-policy: its gradient is that of KL(pi_0 || pi), so the
        # stationary point is pi = pi_0 / (1 - A / beta), not the theorem's pi_0 e^{r/beta} / Z: the ordering
        # within M and M^c is the theorem's, the mass on M is lower than q_beta.
        advantage = population_advantage(p, r, scale=False)
        assert torch.allclose(p, p0 / (1 - advantage / 0.5), atol=1e-8)
        assert rho < float(p[r == 1].sum()) < q_beta(rho, 0.5)


def test_without_kl_the_update_reorders_the_actions_outside_m():
    p, p0, r = train_on_policy(beta=0.0, scale=False, steps=300)
    ratio = p / p0
    # Euclidean steps on logits favour the likelier actions: ratios within M^c drift apart
    assert float(ratio[r == 0].max() / ratio[r == 0].min()) > 1.5
