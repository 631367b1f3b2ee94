"""Loss terms of ``rllib_dph.losses`` against hand-computed values and their defining properties."""

import math

import pytest
import torch

from rllib_dph.losses.advantages import group_advantages, has_reward_variance, overlong_penalty
from rllib_dph.losses.divergences import (
    MAX_TERM,
    f_divergence,
    js_mixture_policy_term,
    kl_estimate,
    pef_loss_weight,
)
from rllib_dph.losses.tokens import (
    AGGREGATIONS,
    aggregate_parts,
    masked_aggregate,
    masked_mean,
    token_entropy,
    token_logprobs,
    token_stats,
)
from rllib_dph.losses.trust_regions import (
    TRUST_REGIONS,
    bad_update_fraction,
    dual_clip_mask,
    policy_gradient_loss,
    sequence_mean_log_ratio,
    trust_region_divergence,
    trust_region_mask,
)

#: The trust regions with a divergence (the DPPO ones and IPO's |π − μ|).
DIVERGENCE_TRUST_REGIONS = [kind for kind, spec in TRUST_REGIONS.items() if spec.divergence is not None]
#: The entries that mask nothing ("none", and TIS and CISPO, which truncate the weight instead).
MASKLESS_TRUST_REGIONS = [kind for kind, spec in TRUST_REGIONS.items() if spec.keep is TRUST_REGIONS["none"].keep]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
LN2 = math.log(2.0)


def t(values, **kwargs):
    return torch.tensor(values, **kwargs)


def random_categoricals(shape, vocab, seed, dtype=torch.float64):
    """(*shape, V) two random, rather different probability tables."""
    g = torch.Generator().manual_seed(seed)
    mu = torch.softmax(2 * torch.randn(*shape, vocab, generator=g, dtype=dtype), -1)
    pi = torch.softmax(2 * torch.randn(*shape, vocab, generator=g, dtype=dtype), -1)
    return mu, pi


# ------------------------------------------------------------------------- group advantages
S3 = math.sqrt(1 / 3)  # unbiased std of (1, 0, 0)


@pytest.mark.parametrize(
    "rewards,group_ids,normalize_std,expected",
    [
        # groups 10 (three members), 3 (equal rewards), 42 (single member)
        ([1, 0, 0, 1, 1, 5], [10, 10, 10, 3, 3, 42], True, [2 / 3 / S3, -1 / 3 / S3, -1 / 3 / S3, 0, 0, 0]),
        ([1, 0, 0, 1, 1, 5], [10, 10, 10, 3, 3, 42], False, [2 / 3, -1 / 3, -1 / 3, 0, 0, 0]),
        # interleaved, non-contiguous, negative ids
        ([1, 4, 3, 0], [-7, 1000, -7, 1000], True, [-(0.5**0.5), 0.5**0.5, 0.5**0.5, -(0.5**0.5)]),
        ([1, 4, 3, 0], [-7, 1000, -7, 1000], False, [-1, 2, 1, -2]),
        ([2.5], [0], True, [0]),
    ],
)
def test_group_advantages_by_hand(rewards, group_ids, normalize_std, expected):
    adv = group_advantages(t(rewards, dtype=torch.float32), t(group_ids), normalize_std=normalize_std)
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv, t(expected, dtype=torch.float32), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("normalize_std", [True, False])
def test_group_advantages_match_a_per_group_loop(normalize_std):
    g = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 3, (64,), generator=g).float()
    group_ids = torch.randint(0, 12, (64,), generator=g) * 17  # sparse ids, some groups of one
    expected = torch.zeros(64)
    for gid in group_ids.unique():
        rows = group_ids == gid
        if rows.sum() > 1:
            centered = rewards[rows] - rewards[rows].mean()
            expected[rows] = centered / (rewards[rows].std() + 1e-6) if normalize_std else centered
    adv = group_advantages(rewards, group_ids, normalize_std=normalize_std)
    torch.testing.assert_close(adv, expected)


def test_has_reward_variance_by_hand():
    rewards = t([1.0, 1.0, 0.0, 1.0, 1.0, 3.0, 0.5])
    group_ids = t([4, 4, 4, 9, 9, 2, 2]) * 3
    assert has_reward_variance(rewards, group_ids).tolist() == [True, True, True, False, False, True, True]
    assert has_reward_variance(t([1.0]), t([0])).tolist() == [False]


@pytest.mark.parametrize(
    "length,expected", [(0, 0.0), (10, 0.0), (15, 0.0), (16, -0.2), (18, -0.6), (20, -1.0), (25, -1.0)]
)
def test_overlong_penalty_by_hand(length, expected):
    out = overlong_penalty(t([length]), max_length=20, cache_length=5)
    torch.testing.assert_close(out, t([expected]))


@pytest.mark.parametrize("cache_length", [0, 21])
def test_overlong_penalty_rejects_bad_buffer(cache_length):
    with pytest.raises(ValueError, match=f"cache_length={cache_length}"):
        overlong_penalty(t([3]), max_length=20, cache_length=cache_length)


# ------------------------------------------------------------------------------ KL estimators
@pytest.mark.parametrize(
    "kind,expected",
    [
        ("k1", [0.0, LN2, -LN2]),
        ("k2", [0.0, LN2**2 / 2, LN2**2 / 2]),
        ("k3", [0.0, 0.5 + LN2 - 1, 2 - LN2 - 1]),
    ],
)
def test_kl_estimate_by_hand(kind, expected):
    ref = t([-1.0, -1.0, -1.0])
    logp = ref + t([0.0, LN2, -LN2])
    torch.testing.assert_close(kl_estimate(logp, ref, kind=kind), t(expected))


@pytest.mark.parametrize("kind", ["k1", "k3"])
def test_unbiased_kl_estimators_average_to_the_kl_under_pi(kind):
    ref, pi = random_categoricals((), 9, seed=1)
    kl = (pi * (pi.log() - ref.log())).sum()
    torch.testing.assert_close((pi * kl_estimate(pi.log(), ref.log(), kind=kind)).sum(), kl)


def test_kl_estimate_rejects_unknown_kind():
    with pytest.raises(ValueError, match="kind='k4'.*'k1', 'k2', 'k3'"):
        kl_estimate(t([0.0]), t([0.0]), kind="k4")


# -------------------------------------------------------------------------------- aggregation
VALUES = t([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [7.0, 7.0, 7.0]])
MASK = t([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # the last row has no valid token


@pytest.mark.parametrize(
    "mode,norm_length,expected",
    [
        ("token-mean", None, 10 / 4),
        ("seq-mean-token-mean", None, (6 / 3 + 4 / 1) / 2),
        ("seq-mean-token-sum-norm", None, (6 / 3 + 4 / 3) / 2),
        ("seq-mean-token-sum-norm", 8, (6 / 8 + 4 / 8) / 2),
    ],
)
def test_masked_aggregate_by_hand(mode, norm_length, expected):
    out = masked_aggregate(VALUES, MASK, mode=mode, norm_length=norm_length)
    torch.testing.assert_close(out, t(expected))


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_masked_aggregate_ignores_masked_nan_and_keeps_graph_on_empty_mask(mode):
    values = VALUES.clone().requires_grad_(True)
    poisoned = torch.where(MASK.bool(), values, t(float("nan")))
    masked_aggregate(poisoned, MASK, mode=mode).backward()
    assert torch.isfinite(values.grad).all() and (values.grad[~MASK.bool()] == 0).all()

    values.grad = None
    empty = masked_aggregate(values, torch.zeros_like(MASK), mode=mode)
    empty.backward()
    assert empty.item() == 0.0 and (values.grad == 0).all()


def test_masked_aggregate_rejects_unknown_mode():
    with pytest.raises(ValueError, match="mode='sum'"):
        masked_aggregate(VALUES, MASK, mode="sum")


def test_masked_mean_by_hand():
    assert masked_mean(VALUES, MASK).item() == 10 / 4
    assert masked_mean(VALUES, torch.zeros_like(MASK)).item() == 0.0


# ---------------------------------------------------------------------------- f-divergences
@pytest.mark.parametrize(
    "kind,alpha,log_u,expected",
    [
        ("forward_kl", 0.5, LN2, 2 - 1 - LN2),
        ("forward_kl", 0.5, -LN2, 0.5 - 1 + LN2),
        ("js", 0.5, LN2, 0.5 * (2 * LN2 - 3 * math.log(1.5))),
        ("js", 0.5, -LN2, 0.5 * (0.5 * -LN2 - 1.5 * math.log(0.75))),
        ("alpha", 0.5, LN2, (math.sqrt(2) - 1 - 0.5) / (0.5 * -0.5)),
        ("alpha", 0.2, -LN2, (0.5**0.8 - 0.8 * 0.5 - 0.2) / (0.2 * -0.8)),
        ("js_definition", 0.5, LN2, 1.5 - 1 - math.log(1.5)),  # w = (1 + u) / 2 = 1.5
    ],
)
def test_f_divergence_by_hand(kind, alpha, log_u, expected):
    ref = t([-2.0])
    out = f_divergence(ref + log_u, ref, kind=kind, alpha=alpha)
    torch.testing.assert_close(out, t([expected]))


# Each per-token term with its expectation under the sampling distribution, as a function of
# (π_θ, π_ref) probability tables: (term, sampled from, closed-form divergence).
def _kl(p, q):
    return (p * (p.log() - q.log())).sum(-1)


def _alpha_div(p, q, a=0.3):
    return ((p ** (1 - a) * q**a).sum(-1) - 1) / (a * (a - 1))


DIVERGENCE_TERMS = {
    "forward_kl": (lambda lp, lr, **kw: f_divergence(lp, lr, kind="forward_kl", **kw), "ref", lambda p, q: _kl(q, p)),
    "js": (
        lambda lp, lr, **kw: f_divergence(lp, lr, kind="js", **kw),
        "ref",
        lambda p, q: 0.5 * (_kl(p, (p + q) / 2) + _kl(q, (p + q) / 2)),
    ),
    "alpha": (lambda lp, lr, **kw: f_divergence(lp, lr, kind="alpha", alpha=0.3, **kw), "ref", _alpha_div),
    "js_mixture_ref": (lambda lp, lr, **kw: f_divergence(lp, lr, kind="js_definition", **kw), "ref", lambda p, q: _kl(q, (p + q) / 2)),
    "js_mixture_policy": (js_mixture_policy_term, "policy", lambda p, q: _kl(p, (p + q) / 2)),
}


@pytest.mark.parametrize("name", sorted(DIVERGENCE_TERMS))
def test_divergence_term_is_zero_with_zero_gradient_at_the_reference(name):
    term = DIVERGENCE_TERMS[name][0]
    ref = torch.log_softmax(torch.randn(4, 6), -1)
    logp = ref.clone().requires_grad_(True)
    out = term(logp, ref)
    out.sum().backward()
    assert (out.abs() < 1e-7).all() and (logp.grad.abs() < 1e-6).all()


@pytest.mark.parametrize("name", sorted(DIVERGENCE_TERMS))
def test_divergence_term_is_positive_elsewhere(name):
    term = DIVERGENCE_TERMS[name][0]
    ref = torch.log_softmax(torch.randn(4, 6), -1)
    shift = torch.randn(4, 6).clamp(-3, 3)
    logp = ref + torch.where(shift.abs() > 1e-2, shift, 0.5)
    assert (term(logp, ref) > 0).all()


@pytest.mark.parametrize("name", sorted(DIVERGENCE_TERMS))
def test_divergence_term_expectation_is_the_divergence(name):
    term, sampled_from, closed_form = DIVERGENCE_TERMS[name]
    pi, ref = random_categoricals((3,), 8, seed=2)
    weights = ref if sampled_from == "ref" else pi
    # Unbounded terms: the MAX_TERM clamp is a numerical guard, not part of the estimator.
    expectation = (weights * term(pi.log(), ref.log(), max_term=math.inf)).sum(-1)  # (3,)
    torch.testing.assert_close(expectation, closed_form(pi, ref))


@pytest.mark.parametrize("name", sorted(DIVERGENCE_TERMS))
@pytest.mark.parametrize("pi, ref", [(0.5, 1e-6), (1e-6, 0.5), (0.999, 1e-9)])
def test_divergence_term_is_bounded_with_no_gradient_beyond_the_bound(name, pi, ref):
    """π_ref = 1e-6, π_θ = 0.5 gave a forward-KL term and gradient of ~5e5 before the clamp."""
    term = DIVERGENCE_TERMS[name][0]
    logp = torch.tensor([[math.log(pi)]], requires_grad=True)
    value = term(logp, torch.tensor([[math.log(ref)]]))
    value.sum().backward()
    assert 0 <= value.item() <= MAX_TERM
    if value.item() == MAX_TERM:
        assert logp.grad.abs().item() == 0
    assert logp.grad.abs().item() <= 2 * MAX_TERM  # never the ~5e5 of the unclamped term


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_estimate_is_bounded(kind):
    logp = torch.tensor([[0.0, -30.0, -1.0]], requires_grad=True)
    value = kl_estimate(logp, torch.tensor([[-30.0, 0.0, -1.0]]), kind=kind)
    assert value.abs().max() <= MAX_TERM and value[0, 2] == 0


def test_js_generator_is_the_sum_of_the_two_mixture_halves():
    pi, ref = random_categoricals((3,), 8, seed=3)
    unbounded = dict(max_term=math.inf)
    generator = (ref * f_divergence(pi.log(), ref.log(), kind="js", **unbounded)).sum(-1)
    halves = 0.5 * (ref * f_divergence(pi.log(), ref.log(), kind="js_definition", **unbounded)).sum(-1) + 0.5 * (
        pi * js_mixture_policy_term(pi.log(), ref.log(), **unbounded)
    ).sum(-1)
    torch.testing.assert_close(generator, halves)


@pytest.mark.parametrize("name", ["forward_kl", "js", "alpha", "js_mixture_ref"])
def test_ref_sampled_gradient_is_the_exact_divergence_gradient(name):
    term, _, closed_form = DIVERGENCE_TERMS[name]
    ref = torch.softmax(torch.randn(8, dtype=torch.float64), -1)
    logits = torch.randn(8, dtype=torch.float64, requires_grad=True)
    terms = term(logits.log_softmax(-1), ref.log(), max_term=math.inf)  # unbounded: exact estimator
    (estimate_grad,) = torch.autograd.grad((ref * terms).sum(), logits)
    (exact_grad,) = torch.autograd.grad(closed_form(logits.softmax(-1), ref), logits)
    torch.testing.assert_close(estimate_grad, exact_grad)


def test_policy_sampled_mixture_term_gradient_is_documented_divergence():
    """Samples held fixed: E_π[∇term] = ∇[½ KL(π_ref‖π_θ) − KL(π_ref‖M)] (see its docstring)."""
    ref = torch.softmax(torch.randn(8, dtype=torch.float64), -1)
    logits = torch.randn(8, dtype=torch.float64, requires_grad=True)
    pi = logits.softmax(-1)
    samples_fixed = (pi.detach() * js_mixture_policy_term(pi.log(), ref.log(), max_term=math.inf)).sum()
    (estimate_grad,) = torch.autograd.grad(samples_fixed, logits, retain_graph=True)
    (exact_grad,) = torch.autograd.grad(0.5 * _kl(ref, pi) - _kl(ref, (pi + ref) / 2), logits)
    torch.testing.assert_close(estimate_grad, exact_grad)


@pytest.mark.parametrize("name", sorted(DIVERGENCE_TERMS))
def test_gradient_descent_on_the_term_moves_policy_toward_reference(name):
    term, sampled_from, _ = DIVERGENCE_TERMS[name]
    ref = torch.softmax(torch.randn(10, generator=torch.Generator().manual_seed(4)), -1)
    logits = torch.zeros(10).index_fill(0, t([0]), 4.0).requires_grad_(True)  # far from ref
    opt = torch.optim.SGD([logits], lr=1.0)
    start = _kl(ref, logits.softmax(-1)).item()
    for _ in range(200):
        pi = logits.softmax(-1)
        weights = ref if sampled_from == "ref" else pi.detach()
        loss = (weights * term(logits.log_softmax(-1), ref.log())).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert _kl(ref, logits.softmax(-1)).item() < 0.05 * start


def test_nll_term_by_hand_and_its_gradient_is_plain_nll():
    """The NLL control: log π_ref − log π_θ per token, gradient −∇ log π_θ at any u (also u = 1)."""
    ref = torch.log_softmax(torch.randn(3, 5, generator=torch.Generator().manual_seed(5)), -1)
    for shift in (0.0, 0.7, -1.3):
        logp = (ref + shift).requires_grad_(True)
        out = f_divergence(logp, ref, kind="nll")
        torch.testing.assert_close(out, torch.full_like(ref, -shift))
        out.sum().backward()
        torch.testing.assert_close(logp.grad, torch.full_like(ref, -1.0))
    assert pef_loss_weight(10.0, normalization="original", divergence="nll", num_pef_rows=1, num_exp_rows=8) == 1.25


def test_nll_term_mean_under_the_reference_is_forward_kl_and_so_is_its_gradient():
    ref = torch.softmax(torch.randn(8, dtype=torch.float64), -1)
    logits = torch.randn(8, dtype=torch.float64, requires_grad=True)
    nll = (ref * f_divergence(logits.log_softmax(-1), ref.log(), kind="nll", max_term=math.inf)).sum()
    torch.testing.assert_close(nll, _kl(ref, logits.softmax(-1)))
    (nll_grad,) = torch.autograd.grad(nll, logits)
    fkl = (ref * f_divergence(logits.log_softmax(-1), ref.log(), kind="forward_kl", max_term=math.inf)).sum()
    (fkl_grad,) = torch.autograd.grad(fkl, logits)
    torch.testing.assert_close(nll_grad, fkl_grad)
    # One sampled token: forward KL pulls it down where π_θ > π_ref, NLL always up.
    logp = torch.tensor([-0.5], requires_grad=True)
    f_divergence(logp, torch.tensor([-1.0]), kind="forward_kl").sum().backward()
    assert logp.grad.item() > 0
    logp.grad = None
    f_divergence(logp, torch.tensor([-1.0]), kind="nll").sum().backward()
    assert logp.grad.item() == -1.0


def test_f_divergence_clamps_the_log_ratio():
    out = f_divergence(t([0.0, -200.0]), t([-200.0, 0.0]), kind="forward_kl", clamp=20.0, max_term=math.inf)
    torch.testing.assert_close(out, t([math.exp(20) - 1 - 20, math.exp(-20) - 1 + 20]))
    bounded = f_divergence(t([0.0, -200.0]), t([-200.0, 0.0]), kind="forward_kl", clamp=20.0)
    torch.testing.assert_close(bounded, t([MAX_TERM, MAX_TERM]))


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.5, 1.5])
def test_f_divergence_rejects_alpha_outside_unit_interval(alpha):
    with pytest.raises(ValueError, match=f"alpha={alpha}"):
        f_divergence(t([0.0]), t([0.0]), kind="alpha", alpha=alpha)


def test_f_divergence_rejects_unknown_kind():
    with pytest.raises(ValueError, match="kind='reverse_kl'"):
        f_divergence(t([0.0]), t([0.0]), kind="reverse_kl")


# -------------------------------------------------------------------- log-probs and entropy
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_and_entropy_match_direct_computation(device, dtype, temperature):
    logits = (3 * torch.randn(2, 5, 11)).to(device=device, dtype=dtype)
    tokens = torch.randint(0, 11, (2, 5), device=device)
    reference = torch.log_softmax(logits.float() / temperature, -1)  # (2, 5, 11)
    logp = token_logprobs(logits, tokens, temperature=temperature)
    assert logp.dtype == torch.float32 and logp.shape == (2, 5)
    torch.testing.assert_close(logp, reference.gather(-1, tokens[..., None]).squeeze(-1))
    entropy = torch.distributions.Categorical(logits=logits.float() / temperature).entropy()
    torch.testing.assert_close(token_entropy(logits, temperature=temperature), entropy)


def test_token_logprobs_gradient_reaches_bf16_logits():
    logits = torch.randn(1, 3, 4).bfloat16().requires_grad_(True)
    token_logprobs(logits, t([[0, 1, 2]])).sum().backward()
    assert logits.grad.dtype == torch.bfloat16 and logits.grad.abs().sum() > 0


def test_token_logprobs_rejects_non_positive_temperature():
    with pytest.raises(ValueError, match="temperature=0"):
        token_logprobs(torch.zeros(1, 1, 2), t([[0]]), temperature=0)


# ------------------------------------------------------------------- trust-region masks
PAPER_LOW = (1e-4, 1e-2, 1.0)  # (μ, π, Â): low-probability token pushed up
PAPER_HIGH = (0.99, 0.80, -1.0)  # high-probability token pushed down


@pytest.mark.parametrize(
    "kind,low,high,token,keep",
    [
        ("ppo", 0.2, 0.28, PAPER_LOW, False),  # ratio 100 > 1.28
        ("dppo_binary_tv", 0.15, 0.15, PAPER_LOW, True),  # |π − μ| = 0.0099
        ("dppo_binary_kl", 0.05, 0.05, PAPER_LOW, True),  # D ≈ 0.0095
        ("ppo", 0.2, 0.28, PAPER_HIGH, True),  # ratio 0.808 > 0.8
        ("dppo_binary_tv", 0.15, 0.15, PAPER_HIGH, False),  # |π − μ| = 0.19
        ("dppo_binary_kl", 0.05, 0.05, PAPER_HIGH, False),  # D ≈ 0.181
        ("none", 0.0, 0.0, PAPER_LOW, True),
        ("none", 0.0, 0.0, PAPER_HIGH, True),
    ],
)
def test_paper_tokens(kind, low, high, token, keep):
    mu, pi, adv = token
    mask = trust_region_mask(t([[math.log(pi)]]), t([[math.log(mu)]]), t([[adv]]), kind=kind, low=low, high=high)
    assert mask.dtype == torch.bool and mask.item() is keep


@pytest.mark.parametrize(
    "mu,pi,adv,keep",
    [
        (0.5, 0.50, 1.0, True),
        (0.5, 0.63, 1.0, True),  # ratio 1.26 ≤ 1.28
        (0.5, 0.65, 1.0, False),  # ratio 1.30
        (0.5, 0.41, -1.0, True),  # ratio 0.82
        (0.5, 0.39, -1.0, False),  # ratio 0.78
        (0.5, 0.10, 1.0, True),  # ratio far below 1 but Â > 0: moving back, kept
        (0.1, 0.90, -1.0, True),  # ratio 9 but Â < 0: moving back, kept
        (0.1, 0.90, 0.0, True),  # no advantage, never dropped
    ],
)
def test_ppo_ratio_mask_truth_table(mu, pi, adv, keep):
    mask = trust_region_mask(t([[math.log(pi)]]), t([[math.log(mu)]]), t([[adv]]), kind="ppo", low=0.2, high=0.28)
    assert mask.item() is keep


@pytest.mark.parametrize(
    "mu,pi,adv,keep",
    [
        (0.3, 0.50, 1.0, True),  # D = 0.2 ≤ high = 0.3
        (0.3, 0.70, 1.0, False),  # D = 0.4 > high
        (0.5, 0.30, -1.0, False),  # D = 0.2 > low = 0.1
        (0.5, 0.45, -1.0, True),  # D = 0.05 ≤ low
        (0.9, 0.10, 1.0, True),  # π < μ with Â > 0: moving back, kept
        (0.1, 0.90, -1.0, True),  # π > μ with Â < 0: moving back, kept
        (0.1, 0.90, 0.0, True),
    ],
)
def test_divergence_mask_truth_table_uses_low_for_negative_and_high_for_positive(mu, pi, adv, keep):
    mask = trust_region_mask(t([[math.log(pi)]]), t([[math.log(mu)]]), t([[adv]]), kind="dppo_binary_tv", low=0.1, high=0.3)
    assert mask.item() is keep


def test_mask_broadcasts_sequence_advantages_and_has_no_gradient():
    logp = torch.log(t([[0.9, 0.2], [0.9, 0.2]])).requires_grad_(True)
    behavior = torch.log(t([[0.5, 0.5], [0.5, 0.5]]))
    adv = t([[1.0], [-1.0]])  # (B, 1)
    for kind in TRUST_REGIONS:
        topk = dict(topk_logp=logp[..., None], topk_behavior_logp=behavior[..., None])
        response = torch.ones(2, 2, dtype=torch.bool)
        mask = trust_region_mask(logp, behavior, adv, kind=kind, low=0.2, high=0.2, response_mask=response, **topk)
        assert mask.shape == (2, 2) and not mask.requires_grad
    mask = trust_region_mask(logp, behavior, adv, kind="dppo_binary_tv", low=0.2, high=0.2)
    assert mask.tolist() == [[False, True], [True, False]]


@pytest.mark.parametrize(
    "kind,expected",
    [
        ("dppo_binary_tv", 0.1),
        ("dppo_binary_kl", 0.5 * math.log(0.5 / 0.4) + 0.5 * math.log(0.5 / 0.6)),
        # μ top-2 masses (0.5, 0.3), other 0.2; π at those ids (0.4, 0.4), other 0.2
        ("dppo_topk_tv", 0.5 * (0.1 + 0.1 + 0.0)),
        ("dppo_topk_kl", 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.4)),
    ],
)
def test_trust_region_divergence_by_hand(kind, expected):
    out = trust_region_divergence(
        torch.log(t([[0.4]])),
        torch.log(t([[0.5]])),
        kind=kind,
        topk_logp=torch.log(t([[[0.4, 0.4]]])),
        topk_behavior_logp=torch.log(t([[[0.5, 0.3]]])),
    )
    torch.testing.assert_close(out, t([[expected]]))


def _full_and_approximate_divergences(mu, pi, k, seed):
    """Full-vocabulary, binary and top-K TV/KL of μ(·|s_t)‖π(·|s_t) at sampled tokens."""
    sampled = torch.multinomial(mu.reshape(-1, mu.shape[-1]), 1, generator=torch.Generator().manual_seed(seed))
    sampled = sampled.reshape(*mu.shape[:-1], 1)  # (B, T, 1)
    top = mu.topk(k, -1).indices  # (B, T, K)
    topk = dict(topk_logp=pi.gather(-1, top).log(), topk_behavior_logp=mu.gather(-1, top).log())
    logp, behavior = pi.gather(-1, sampled).squeeze(-1).log(), mu.gather(-1, sampled).squeeze(-1).log()
    full = {"tv": 0.5 * (mu - pi).abs().sum(-1), "kl": _kl(mu, pi)}
    approx = {kind: trust_region_divergence(logp, behavior, kind=kind, **topk) for kind in DIVERGENCE_TRUST_REGIONS}
    return full, approx


@pytest.mark.parametrize("seed", range(3))
def test_approximate_divergences_lower_bound_the_full_ones(seed):
    mu, pi = random_categoricals((4, 6), 30, seed=seed)
    full, approx = _full_and_approximate_divergences(mu, pi, k=5, seed=seed)
    for kind, value in approx.items():
        measure = {"TV": "tv", "KL": "kl"}[TRUST_REGIONS[kind].measure.split()[0]]
        assert (value <= full[measure] + 1e-9).all(), kind
        assert (value >= 0).all(), kind


def test_topk_divergences_are_exact_when_k_covers_the_vocabulary():
    mu, pi = random_categoricals((4, 6), 12, seed=5)
    full, approx = _full_and_approximate_divergences(mu, pi, k=12, seed=5)
    torch.testing.assert_close(approx["dppo_topk_tv"], full["tv"])
    torch.testing.assert_close(approx["dppo_topk_kl"], full["kl"])


def test_divergences_are_finite_on_degenerate_probabilities():
    # padding-like rows: log μ = 0 (μ = 1), π = 1, zero top-K log-probs summing above 1
    logp, behavior = t([[0.0, -30.0]]), t([[0.0, 0.0]])
    zeros = torch.zeros(1, 2, 3)
    for kind in DIVERGENCE_TRUST_REGIONS:
        out = trust_region_divergence(logp, behavior, kind=kind, topk_logp=zeros, topk_behavior_logp=zeros)
        assert torch.isfinite(out).all(), kind


@pytest.mark.parametrize("kind", ["dppo_topk_tv", "dppo_topk_kl"])
def test_topk_kinds_require_topk_logprobs(kind):
    with pytest.raises(ValueError, match=f"kind='{kind}' needs topk_logp"):
        trust_region_mask(t([[0.0]]), t([[0.0]]), t([[1.0]]), kind=kind, low=0.1, high=0.1)


@pytest.mark.parametrize("kind", sorted(TRUST_REGIONS))
def test_mask_returns_the_divergence_it_used(kind):
    g = torch.Generator().manual_seed(1)
    behavior = torch.log_softmax(torch.randn(3, 5, 4, generator=g), -1)  # (B, T, V)
    logp_all = behavior + 0.5 * torch.randn(3, 5, 4, generator=g)
    topk = dict(topk_logp=logp_all[..., :2], topk_behavior_logp=behavior[..., :2])
    adv = torch.randn(3, 1, generator=g)
    args = (logp_all[..., 0], behavior[..., 0], adv)
    kw = dict(kind=kind, low=0.1, high=0.1, response_mask=torch.ones(3, 5), **topk)
    keep, divergence = trust_region_mask(*args, return_divergence=True, **kw)
    assert torch.equal(keep, trust_region_mask(*args, **kw))
    if TRUST_REGIONS[kind].divergence is None:
        assert divergence is None
    else:
        assert torch.equal(divergence, trust_region_divergence(*args[:2], kind=kind, **topk))


def test_trust_region_functions_reject_unknown_kind():
    with pytest.raises(ValueError, match="kind='clip'"):
        trust_region_mask(t([[0.0]]), t([[0.0]]), t([[1.0]]), kind="clip", low=0.1, high=0.1)
    with pytest.raises(ValueError, match="kind='ppo'"):
        trust_region_divergence(t([[0.0]]), t([[0.0]]), kind="ppo")


# --------------------------------------------------------------- off-policy corrections on μ
@pytest.mark.parametrize(
    "mu,pi,adv,keep",
    [
        (0.5, 0.20, 1.0, False),  # r = 0.4 < a = 0.5
        (0.5, 0.20, -1.0, False),  # whatever the advantage's sign
        (0.5, 0.30, -1.0, True),  # r = 0.6
        (0.1, 0.45, 1.0, True),  # r = 4.5 ≤ b = 5
        (0.1, 0.60, -1.0, False),  # r = 6 > b
        (0.1, 0.60, 1.0, False),
    ],
)
def test_icepop_masks_ratios_outside_the_band(mu, pi, adv, keep):
    mask = trust_region_mask(t([[math.log(pi)]]), t([[math.log(mu)]]), t([[adv]]), kind="icepop", low=0.5, high=5.0)
    assert mask.item() is keep


def test_icepop_keeps_the_ratio_weight_of_kept_tokens():
    logp = torch.log(t([[0.2, 0.3, 0.45]])).requires_grad_(True)
    behavior = torch.log(t([[0.5, 0.5, 0.1]]))  # r = 0.4, 0.6, 4.5
    mask = trust_region_mask(logp, behavior, t([[1.0]]), kind="icepop", low=0.5, high=5.0)
    (grad,) = torch.autograd.grad(policy_gradient_loss(logp, behavior, t([[1.0]]), mask).sum(), logp)
    torch.testing.assert_close(grad, t([[0.0, -0.6, -4.5]]))  # −M·r·Â


@pytest.mark.parametrize(
    "mu,pi,adv,low,high,keep",
    [
        (0.5, 0.85, 1.0, 0.3, 0.3, False),  # π − μ = 0.35 > ε
        (0.5, 0.85, -1.0, 0.3, 0.3, False),  # whatever the advantage's sign
        (0.5, 0.75, -1.0, 0.3, 0.3, True),  # 0.25 ≤ ε
        (0.6, 0.25, 1.0, 0.3, 0.3, False),  # μ − π = 0.35 > ε
        (1e-4, 0.2, 1.0, 0.3, 0.3, True),  # ratio 2000, but |π − μ| = 0.1999: a difference, not a ratio
        (0.5, 0.35, 1.0, 0.1, 0.3, False),  # μ − π = 0.15 > low
        (0.5, 0.70, -1.0, 0.1, 0.3, True),  # π − μ = 0.2 ≤ high
    ],
)
def test_ipo_masks_probability_differences_whatever_the_advantage(mu, pi, adv, low, high, keep):
    mask = trust_region_mask(t([[math.log(pi)]]), t([[math.log(mu)]]), t([[adv]]), kind="ipo", low=low, high=high)
    assert mask.item() is keep


def test_ipo_divergence_is_the_probability_difference():
    out = trust_region_divergence(torch.log(t([[0.4, 0.9]])), torch.log(t([[0.5, 0.2]])), kind="ipo")
    torch.testing.assert_close(out, t([[0.1, 0.7]]))


def _opsm_rows():
    """Three rows of two response tokens and one padding position (wild values there)."""
    behavior = torch.log(t([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]))
    shift = t([[-LN2, 0.0, 5.0], [-LN2, 0.0, 5.0], [-0.1, 0.05, -30.0]])  # log π − log μ
    response = t([[True, True, False], [True, True, False], [True, True, False]])
    return behavior + shift, behavior, response


def test_sequence_mean_log_ratio_by_hand():
    logp, behavior, response = _opsm_rows()
    out = sequence_mean_log_ratio(logp, behavior, response)
    torch.testing.assert_close(out, t([-LN2 / 2, -LN2 / 2, -0.025]))
    torch.testing.assert_close(out[0].exp(), t(math.sqrt(0.5)))  # geometric mean of ratios 0.5 and 1


def test_opsm_masks_whole_negative_rows_whose_geometric_mean_ratio_fell():
    logp, behavior, response = _opsm_rows()
    adv = t([[-1.0], [1.0], [-1.0]])
    mask = trust_region_mask(logp, behavior, adv, kind="opsm", low=0.1, high=None, response_mask=response)
    # row 0: s = −0.347 < −δ with Â < 0, masked; row 1: same s, Â > 0, kept (negative advantages
    # only, as in slime); row 2: s = −0.025 ≥ −δ, kept (−10 if the padding counted)
    assert mask.tolist() == [[False] * 3, [True] * 3, [True] * 3]


def test_opsm_needs_the_response_mask():
    with pytest.raises(ValueError, match="kind='opsm' reduces log π/μ over each row's response tokens"):
        trust_region_mask(t([[0.0]]), t([[0.0]]), t([[-1.0]]), kind="opsm", low=0.1, high=None)


@pytest.mark.parametrize(
    "kind,truncation,mu,pi,grad",
    [
        ("tis", 2.0, (0.3, 0.5, 0.4), (0.9, 0.5, 0.1), (-2.0, -1.0, -0.25)),  # r = 3, 1, 0.25
        ("cispo", 3.0, (0.1, 0.5, 0.4), (0.9, 0.5, 0.1), (-3.0, -1.0, -0.25)),  # r = 9, 1, 0.25
    ],
)
def test_truncating_corrections_keep_every_token_and_cap_the_weight(kind, truncation, mu, pi, grad):
    assert TRUST_REGIONS[kind].truncation == truncation  # TIS: verl/slime's 2; CISPO: DPPO App. D's 3
    logp = torch.log(t([pi])).requires_grad_(True)
    behavior = torch.log(t([mu]))
    mask = trust_region_mask(logp, behavior, t([[1.0]]), kind=kind, low=None, high=None)
    assert mask.all()
    loss = policy_gradient_loss(logp, behavior, t([[1.0]]), mask, truncation=TRUST_REGIONS[kind].truncation)
    (out,) = torch.autograd.grad(loss.sum(), logp)
    torch.testing.assert_close(out, t([grad]))


# ------------------------------------------------------------------------- policy gradient
def test_policy_gradient_loss_by_hand():
    logp = torch.log(t([[0.5, 0.5, 0.2]])).requires_grad_(True)
    behavior = torch.log(t([[0.25, 0.25, 0.4]]))  # ratios 2, 2, 0.5
    mask = t([[True, True, False]])
    out = policy_gradient_loss(logp, behavior, t([[1.0]]), mask, truncation=1.5)
    torch.testing.assert_close(out.detach(), t([[-1.5 * math.log(0.5), -1.5 * math.log(0.5), 0.0]]))
    out.sum().backward()
    torch.testing.assert_close(logp.grad, t([[-1.5, -1.5, 0.0]]))


@pytest.mark.parametrize("kind", sorted(TRUST_REGIONS))
def test_gradient_is_exactly_zero_on_masked_tokens_and_nonzero_elsewhere(kind):
    g = torch.Generator().manual_seed(6)
    behavior = torch.log_softmax(torch.randn(6, 8, 5, generator=g), -1)  # (B, T, V)
    logits = behavior + 0.8 * torch.randn(6, 8, 5, generator=g)
    logits.requires_grad_(True)
    logp_all = logits.log_softmax(-1)
    logp, mu = logp_all[..., 0], behavior[..., 0]  # sampled token: id 0
    adv = torch.randn(6, 1, generator=g)
    topk = dict(topk_logp=logp_all[..., :3], topk_behavior_logp=behavior[..., :3], response_mask=torch.ones(6, 8))
    low, high = (0.5, 2.0) if kind == "icepop" else (0.1, 0.1)  # a ratio band [low, high]
    mask = trust_region_mask(logp, mu, adv, kind=kind, low=low, high=high, **topk)
    (grad,) = torch.autograd.grad(policy_gradient_loss(logp, mu, adv, mask).sum(), logits)
    token_grad = grad.abs().sum(-1)  # (B, T)
    assert (token_grad[~mask] == 0).all()
    assert (token_grad[mask] > 0).all()
    if kind not in MASKLESS_TRUST_REGIONS:
        assert (~mask).any() and mask.any()


def test_ppo_mask_gradient_equals_clipped_surrogate_gradient():
    g = torch.Generator().manual_seed(7)
    behavior = torch.log(torch.rand(16, 12, generator=g, dtype=torch.float64))
    logp = (behavior + 0.5 * torch.randn(16, 12, generator=g, dtype=torch.float64)).clamp_max(0)
    logp.requires_grad_(True)
    adv = torch.randn(16, 12, generator=g, dtype=torch.float64)
    low, high = 0.2, 0.28
    mask = trust_region_mask(logp, behavior, adv, kind="ppo", low=low, high=high)
    (ours,) = torch.autograd.grad(policy_gradient_loss(logp, behavior, adv, mask).sum(), logp)
    ratio = torch.exp(logp - behavior)
    surrogate = -torch.min(ratio * adv, ratio.clamp(1 - low, 1 + high) * adv)
    (classic,) = torch.autograd.grad(surrogate.sum(), logp)
    assert 0 < (~mask).sum() < mask.numel()
    torch.testing.assert_close(ours, classic)


def test_cispo_truncation_caps_the_importance_weight():
    logp = torch.log(t([[0.9, 0.5, 0.1]])).requires_grad_(True)
    behavior = torch.log(t([[0.1, 0.5, 0.4]]))  # ratios 9, 1, 0.25
    keep_all = torch.ones(1, 3, dtype=torch.bool)
    adv = t([[-2.0]])
    (grad,) = torch.autograd.grad(policy_gradient_loss(logp, behavior, adv, keep_all, truncation=3.0).sum(), logp)
    torch.testing.assert_close(grad, t([[3.0 * 2, 1.0 * 2, 0.25 * 2]]))
    (grad,) = torch.autograd.grad(policy_gradient_loss(logp, behavior, adv, keep_all).sum(), logp)
    torch.testing.assert_close(grad, t([[9.0 * 2, 1.0 * 2, 0.25 * 2]]))


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_inputs_give_float32_terms_and_gradients(device):
    logp32 = torch.log_softmax(torch.randn(3, 4, 6, device=device), -1)[..., 0]
    behavior = (logp32 + 0.3 * torch.randn(3, 4, device=device)).clamp_max(0).bfloat16()
    logp = logp32.bfloat16().requires_grad_(True)
    adv = torch.randn(3, 1, device=device).bfloat16()
    mask = trust_region_mask(logp, behavior, adv, kind="dppo_binary_kl", low=0.05, high=0.05)
    terms = {
        "pg": policy_gradient_loss(logp, behavior, adv, mask),
        "kl": kl_estimate(logp, behavior),
        "f": f_divergence(logp, behavior, kind="js"),
        "js_ref": f_divergence(logp, behavior, kind="js_definition"),
    }
    for name, term in terms.items():
        assert term.dtype == torch.float32, name
        expected = {
            "pg": policy_gradient_loss(logp.float(), behavior.float(), adv.float(), mask),
            "kl": kl_estimate(logp.float(), behavior.float()),
            "f": f_divergence(logp.float(), behavior.float(), kind="js"),
            "js_ref": f_divergence(logp.float(), behavior.float(), kind="js_definition"),
        }[name]
        torch.testing.assert_close(term, expected)
    loss = sum(masked_aggregate(term, torch.ones(3, 4, device=device), mode="token-mean") for term in terms.values())
    loss.backward()
    assert logp.grad.dtype == torch.bfloat16 and torch.isfinite(logp.grad.float()).all()


# ------------------------------------------------------------------------------ diagnostics
def test_bad_update_fraction_by_hand():
    mu = t([[0.9, 0.9, 0.6, 0.9]])
    pi = t([[0.3, 0.3, 0.3, 0.1]])
    adv = t([[-1.0, 1.0, -1.0, -1.0]])
    valid = t([[True, True, True, False]])  # the last (bad) token is padding
    # bad: token 0 only (Â < 0 and μ − π = 0.6 > 0.5); token 2 drops by 0.3 only
    out = bad_update_fraction(pi.log(), mu.log(), adv, valid)
    torch.testing.assert_close(out, t(1 / 3))
    assert bad_update_fraction(pi.log(), mu.log(), adv, torch.zeros_like(valid)).item() == 0.0



@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_aggregate_parts_of_shards_sum_to_the_whole(mode):
    """Σ numerators / Σ denominators over row shards (learners, micro-batches) is the whole's loss."""
    g = torch.Generator().manual_seed(0)
    values = torch.randn(6, 9, generator=g)
    mask = torch.rand(6, 9, generator=g) > 0.4
    mask[2] = False  # a row without tokens counts as no sequence
    whole = masked_aggregate(values, mask, mode=mode, norm_length=16)
    parts = [aggregate_parts(values[rows], mask[rows], mode=mode, norm_length=16) for rows in ([0, 1], [2, 3, 4], [5])]
    total = sum(n for n, _ in parts) / sum(d for _, d in parts)
    torch.testing.assert_close(total, whole)


@pytest.mark.parametrize(
    "log_ratio, advantage, c, keep",
    [
        (math.log(4.0), -1.0, 3.0, False),  # negative advantage, ratio above c: dropped
        (math.log(2.0), -1.0, 3.0, True),  # below c: kept
        (math.log(4.0), 1.0, 3.0, True),  # positive advantage: dual clip never acts
        (math.log(100.0), -1.0, None, True),  # None: off
    ],
)
def test_dual_clip_mask(log_ratio, advantage, c, keep):
    logp = torch.tensor([[log_ratio - 1.0]])
    mask = dual_clip_mask(logp, torch.tensor([[-1.0]]), torch.tensor([[advantage]]), clip_ratio_c=c)
    assert mask.item() is keep


def test_dual_clip_needs_c_above_one():
    with pytest.raises(ValueError, match="clip_ratio_c=0.5 must be > 1"):
        dual_clip_mask(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), clip_ratio_c=0.5)


@pytest.mark.parametrize(
    "normalization, divergence, expected",
    [
        ("token_mean", "js", 0.2),
        ("original", "js", 0.2 * 2 * 16 / 128),  # the original's js_low_var is 2 × JS
        ("original", "forward_kl", 0.2 * 16 / 128),
        ("original", "alpha", 0.2 * 16 / 128),
        ("original", "js_definition", 0.2 * 16 / 128),
    ],
)
def test_pef_loss_weight(normalization, divergence, expected):
    weight = pef_loss_weight(0.2, normalization=normalization, divergence=divergence, num_pef_rows=16, num_exp_rows=128)
    assert weight == pytest.approx(expected)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_stats_match_the_separate_functions(temperature):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(10, 17, generator=g)
    tokens = torch.randint(0, 17, (10,), generator=g)
    topk_ids = torch.randint(0, 17, (10, 3), generator=g)
    logp, entropy, topk = token_stats(logits, tokens, temperature=temperature, topk_ids=topk_ids)
    torch.testing.assert_close(logp, token_logprobs(logits, tokens, temperature=temperature))
    torch.testing.assert_close(entropy, token_entropy(logits, temperature=temperature))
    expected_topk = torch.log_softmax(logits / temperature, -1).gather(-1, topk_ids)
    torch.testing.assert_close(topk, expected_topk)
