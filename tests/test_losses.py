"""Hand-worked checks of advantages and losses (docs/science.md, Losses and advantages)."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose

import numerics

from jaxrl_scale import losses
from jaxrl_scale.rl import losses as rl_losses


@pytest.fixture(autouse=True)
def _strict_ranks():
    with jax.numpy_rank_promotion("raise"):
        yield


def test_reexport_is_same_object():
    assert losses.policy_loss is rl_losses.policy_loss
    assert losses.aggregate is rl_losses.aggregate


# ----------------------------------------------------------------------------- advantages

REWARDS_N = jnp.array([1.0, 0.0, 0.0, 1.0,    # mean .5, unbiased std sqrt(1/3)
                       0.0, 0.0, 1.0, 2.0,    # mean .75, unbiased std sqrt(11/12)
                       0.3, 0.3, 0.3, 0.3])   # constant group


def test_grpo_advantages():
    adv = losses.group_advantages(REWARDS_N, 4, estimator="grpo", eps=1e-6)
    s1, s2 = math.sqrt(1 / 3), math.sqrt(11 / 12)
    want = [0.5 / (s1 + 1e-6), -0.5 / (s1 + 1e-6), -0.5 / (s1 + 1e-6), 0.5 / (s1 + 1e-6),
            -0.75 / (s2 + 1e-6), -0.75 / (s2 + 1e-6), 0.25 / (s2 + 1e-6), 1.25 / (s2 + 1e-6),
            0, 0, 0, 0]
    assert_allclose(adv, want, rtol=1e-5, atol=1e-6)


def test_drgrpo_advantages():
    adv = losses.group_advantages(REWARDS_N, 4, estimator="drgrpo")
    assert_allclose(adv, [0.5, -0.5, -0.5, 0.5, -0.75, -0.75, 0.25, 1.25, 0, 0, 0, 0], atol=1e-6)


def test_rloo_advantages():
    adv = losses.group_advantages(REWARDS_N, 4, estimator="rloo")
    # r_i - mean of the other three
    want = [1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3,
            0 - 1.0, 0 - 1.0, 1 - 2 / 3, 2 - 1 / 3, 0, 0, 0, 0]
    assert_allclose(adv, want, atol=1e-6)


@pytest.mark.parametrize("estimator", ["grpo", "drgrpo", "rloo"])
def test_zero_variance_group_is_exactly_zero(estimator):
    adv = losses.group_advantages(jnp.full([6], 0.1), 3, estimator=estimator)
    assert np.all(np.asarray(adv) == 0.0)


@pytest.mark.parametrize("estimator", ["grpo", "drgrpo", "rloo"])
@pytest.mark.parametrize("scale", [1e30, 1e-30, 3e38])
def test_advantages_safe_at_any_finite_reward_scale(estimator, scale):
    """Rewards near the float32 limit: the group is rescaled by a power of two before the
    mean and std (1e30^2 overflows float32, so the std became inf and every advantage 0).
    Reference: the same formula in float64 on the float32-rounded rewards. Each advantage is a
    few G-term sums of terms <= max|x|, so it may differ by gamma(4 G) of the largest one
    (eps, 1e-6 of an O(1) std at scale 1, is below that and is 0 at the large scales)."""
    base = np.array([1.0, 0.0, 0.0, 0.0, 0.5, -0.25, 1.0, 0.75], np.float64)
    r32 = (base * scale).astype(np.float32)
    adv = np.asarray(losses.group_advantages(jnp.asarray(r32), 4, estimator=estimator))
    r_PG = r32.astype(np.float64).reshape(2, 4)
    c_PG = r_PG - r_PG.mean(1, keepdims=True)
    want = {"grpo": c_PG / (r_PG.std(1, ddof=1, keepdims=True) + (1e-6 if scale < 1e3 else 0)),
            "drgrpo": c_PG, "rloo": c_PG * 4 / 3}[estimator].reshape(-1)
    finite_f32 = np.abs(want) <= np.finfo(np.float32).max
    # an advantage beyond float32 (none here) must be inf of its sign, never 0 or NaN
    assert np.all(np.isinf(adv[~finite_f32]) & (np.sign(adv[~finite_f32]) ==
                                                np.sign(want[~finite_f32])))
    assert np.all(np.isfinite(adv[finite_f32]))
    tol = numerics.gamma(4 * 4) * np.max(np.abs(want[finite_f32]))
    assert_allclose(adv[finite_f32], want[finite_f32], rtol=0, atol=tol)
    if estimator == "grpo" and scale > 1:   # scale-free above eps: the O(1) advantages
        unit = np.asarray(losses.group_advantages(jnp.asarray(base, jnp.float32), 4))
        assert_allclose(adv, unit, rtol=0, atol=numerics.gamma(16) * np.max(np.abs(unit)) + 1e-5)


@pytest.mark.parametrize("estimator", ["grpo", "drgrpo", "rloo"])
def test_rescaling_leaves_unit_rewards_bit_identical(estimator):
    """|r| <= 1 (the 0/1 rewards of every built-in task): the scale is 1, so the advantages are
    bit for bit those of the unscaled formula (recorded sweeps stay reproducible)."""
    r_PG = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (16, 8)), jnp.float32)
    c_PG = r_PG - jnp.mean(r_PG, axis=1, keepdims=True)
    old = {"grpo": lambda: c_PG / (jnp.std(r_PG, axis=1, keepdims=True, ddof=1) + 1e-6),
           "drgrpo": lambda: c_PG, "rloo": lambda: c_PG * (8 / 7)}[estimator]()
    new = losses.group_advantages(r_PG.reshape(-1), 8, estimator=estimator)
    assert np.array_equal(np.asarray(new), np.asarray(old).reshape(-1))


def test_group_advantages_errors():
    with pytest.raises(ValueError, match="group_size"):
        losses.group_advantages(jnp.zeros([6]), 4)
    with pytest.raises(ValueError, match="group_size"):
        losses.group_advantages(jnp.zeros([6]), 1, estimator="rloo")
    with pytest.raises(ValueError, match="estimator"):
        losses.group_advantages(jnp.zeros([6]), 2, estimator="ppo")
    assert_allclose(losses.group_advantages(jnp.ones([3]), 1, estimator="drgrpo"), [0, 0, 0])


# ----------------------------------------------------------------------------- GAE / whitening


def _gae_reference(r, v, m, gamma, lam):
    """Plain loop: skip masked positions, value after the last valid token is 0."""
    adv = np.zeros_like(r)
    for b in range(r.shape[0]):
        next_v, next_a = 0.0, 0.0
        for t in reversed(range(r.shape[1])):
            if not m[b, t]:
                continue
            delta = r[b, t] + gamma * next_v - v[b, t]
            next_a = delta + gamma * lam * next_a
            next_v = v[b, t]
            adv[b, t] = next_a
    return adv, (adv + v) * m


def test_gae_matches_reference_loop_with_masked_tail():
    r = np.array([[0.0, 0.5, 1.0, 9.0, 9.0], [0.1, -0.2, 0.3, 0.4, 1.0]], np.float32)
    v = np.array([[0.2, 0.4, 0.6, 7.0, 7.0], [0.5, 0.1, -0.3, 0.2, 0.9]], np.float32)
    m = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.float32)
    adv, ret = losses.gae(r, v, m, gamma=0.9, lam=0.8)
    want_adv, want_ret = _gae_reference(r, v, m, 0.9, 0.8)
    assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-6)
    assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-6)
    # Last valid token of row 0: the next value is 0 (not 7), so A = r - V = 1.0 - 0.6.
    assert_allclose(adv[0, 2], 0.4, atol=1e-6)
    assert np.all(np.asarray(adv)[0, 3:] == 0)


def test_gae_gamma1_lam1_is_reward_to_go_minus_value():
    r = np.array([[0.0, 0.0, 1.0, 0.0]], np.float32)
    v = np.array([[0.3, 0.2, 0.1, 5.0]], np.float32)
    m = np.array([[1, 1, 1, 0]], np.float32)
    adv, ret = losses.gae(r, v, m, gamma=1.0, lam=1.0)
    assert_allclose(adv, [[0.7, 0.8, 0.9, 0.0]], atol=1e-6)
    assert_allclose(ret, [[1.0, 1.0, 1.0, 0.0]], atol=1e-6)


def test_masked_whiten_ignores_masked_entries():
    x = jnp.array([[1.0, 2.0, 100.0], [3.0, -50.0, 4.0]])
    m = jnp.array([[1, 1, 0], [1, 0, 1]], jnp.float32)
    out = losses.masked_whiten(x, m)
    vals = np.array([1.0, 2.0, 3.0, 4.0])
    want = (vals - vals.mean()) / np.sqrt(vals.var(ddof=1) + 1e-8)
    assert_allclose(np.asarray(out)[np.asarray(m) > 0], want, rtol=1e-5)
    assert np.all(np.asarray(out)[np.asarray(m) == 0] == 0)
    kept = losses.masked_whiten(x, m, shift_mean=False)
    assert_allclose(np.asarray(kept)[np.asarray(m) > 0], want + vals.mean(), rtol=1e-5)


# ----------------------------------------------------------------------------- aggregation

X_BT = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
M_BT = jnp.array([[1, 1, 0], [0, 0, 0]], jnp.float32)   # second row all masked


@pytest.mark.parametrize("mode,want", [
    ("token-mean", 1.5),                  # (1 + 2) / 2
    ("seq-mean-token-mean", 1.5),         # only row 0 has tokens: its mean 1.5
    ("seq-mean-token-sum", 1.5),          # (3 + 0) / 2 rows
    ("seq-mean-token-sum-norm", 1.0),     # 3 / T=3
])
def test_aggregate_modes(mode, want):
    out = losses.aggregate(X_BT, M_BT, mode)
    assert np.isfinite(out)
    assert_allclose(out, want, atol=1e-6)


def test_aggregate_mixed_rows_and_all_masked():
    m = jnp.array([[1, 1, 0], [1, 1, 1]], jnp.float32)
    assert_allclose(losses.aggregate(X_BT, m, "token-mean"), 18 / 5, atol=1e-6)
    assert_allclose(losses.aggregate(X_BT, m, "seq-mean-token-mean"), (1.5 + 5) / 2, atol=1e-6)
    assert_allclose(losses.aggregate(X_BT, m, "seq-mean-token-sum"), (3 + 15) / 2, atol=1e-6)
    assert_allclose(losses.aggregate(X_BT, m, "seq-mean-token-sum-norm"), 18 / 3, atol=1e-6)
    for mode in losses.AGG_MODES:
        out = losses.aggregate(X_BT, jnp.zeros_like(X_BT), mode)
        assert out == 0.0, mode
        g = jax.grad(lambda x: losses.aggregate(x, jnp.zeros_like(x), mode))(X_BT)
        assert np.all(np.isfinite(g))
    with pytest.raises(ValueError, match="token-mean"):
        losses.aggregate(X_BT, M_BT, "mean")


# ----------------------------------------------------------------------------- policy loss


def _row(*xs):
    return jnp.array([xs], jnp.float32)


def test_policy_loss_clip_high_active():
    # A > 0, ratio 1.5 > 1 + 0.28: loss = -A * 1.28, clipped above.
    logp, old = _row(math.log(1.5), 0.0), _row(0.0, 0.0)
    adv, m = _row(2.0, 1.0), _row(1.0, 1.0)
    loss, met = losses.policy_loss(logp, old, adv, m, clip_low=0.2, clip_high=0.28)
    assert_allclose(loss, (-2.0 * 1.28 + -1.0 * 1.0) / 2, rtol=1e-6)
    assert_allclose(met["clipfrac"], 0.5)
    assert_allclose(met["clipfrac_upper"], 0.5)
    assert_allclose(met["clipfrac_lower"], 0.0)
    assert_allclose(met["ratio_mean"], 1.25, rtol=1e-6)
    # k3 with x = old - logp
    x = -math.log(1.5)
    assert_allclose(met["approx_kl"], (math.exp(x) - x - 1) / 2, rtol=1e-5)


def test_policy_loss_clip_low_active_and_masking():
    # A < 0, ratio 0.5 < 0.8: loss = -A * 0.8 = 0.8; second token masked out.
    logp, old = _row(math.log(0.5), 3.0), _row(0.0, 0.0)
    adv, m = _row(-1.0, 5.0), _row(1.0, 0.0)
    loss, met = losses.policy_loss(logp, old, adv, m)
    assert_allclose(loss, 0.8, rtol=1e-6)
    assert_allclose(met["clipfrac"], 1.0)
    assert_allclose(met["clipfrac_lower"], 1.0)
    assert_allclose(met["clipfrac_upper"], 0.0)
    # Inside the trust region: plain -A r and gradient -A r d(logp).
    g = jax.grad(lambda lp: losses.policy_loss(lp, old, _row(-1.0, 1.0), _row(1.0, 1.0))[0])(
        _row(math.log(1.1), 0.0))
    assert_allclose(g, [[0.5 * 1.1, -0.5]], rtol=1e-5)


def test_policy_loss_dual_clip_active():
    # A = -1, ratio 5: standard L = max(5, 1.2) = 5; dual clip c=3 caps it at 3.
    logp, old, adv, m = _row(math.log(5.0), math.log(2.0)), _row(0.0, 0.0), _row(-1.0, -1.0), \
        _row(1.0, 1.0)
    loss, met = losses.policy_loss(logp, old, adv, m, dual_clip=3.0)
    assert_allclose(loss, (3.0 + 2.0) / 2, rtol=1e-6)
    assert_allclose(met["dual_clipfrac"], 0.5)
    assert_allclose(met["clipfrac"], 0.0)
    loss_nodual, met_nodual = losses.policy_loss(logp, old, adv, m)
    assert_allclose(loss_nodual, (5.0 + 2.0) / 2, rtol=1e-6)
    assert_allclose(met_nodual["dual_clipfrac"], 0.0)
    with pytest.raises(ValueError, match="dual_clip"):
        losses.policy_loss(logp, old, adv, m, dual_clip=1.0)


def test_policy_loss_extreme_log_ratio_is_finite():
    loss, met = losses.policy_loss(_row(100.0), _row(0.0), _row(-1.0), _row(1.0))
    assert np.isfinite(loss) and np.isfinite(met["ratio_mean"])
    assert_allclose(met["ratio_mean"], math.exp(20.0), rtol=1e-5)


def test_decoupled_policy_loss():
    logp = jnp.array([[0.1, -0.3, 0.5]])
    behav = jnp.array([[0.0, 0.0, 0.2]])
    adv = jnp.array([[1.0, -2.0, 0.5]])
    m = jnp.ones([1, 3])
    plain, plain_met = losses.policy_loss(logp, behav, adv, m)
    same, same_met = losses.policy_loss(logp, behav, adv, m, prox_logp_BT=behav)
    assert_allclose(same, plain, rtol=1e-6)
    assert_allclose(same_met["clipfrac"], plain_met["clipfrac"])
    # prox != behav: weight pi_prox/pi_behav, clip centred on prox.
    prox = jnp.array([[0.05, 0.1, 0.2]])
    got, _ = losses.policy_loss(logp, behav, adv, m, prox_logp_BT=prox)
    r = np.exp(np.asarray(logp - prox))
    w = np.exp(np.asarray(prox - behav))
    a = np.asarray(adv)
    per_tok = w * np.maximum(-a * r, -a * np.clip(r, 0.8, 1.2))
    assert_allclose(got, per_tok.mean(), rtol=1e-5)
    # The importance weight carries no gradient with respect to prox.
    g_prox = jax.grad(lambda p: losses.policy_loss(logp, behav, adv, m, prox_logp_BT=p)[0])(prox)
    want = -w * (-a * r) / 3     # only the ratio term depends on prox (unclipped tokens)
    clipped = (-a * np.clip(r, 0.8, 1.2)) > (-a * r)
    assert_allclose(np.where(clipped, 0.0, np.asarray(g_prox)), np.where(clipped, 0.0, want),
                    rtol=1e-5)


# ----------------------------------------------------------------------------- KL, value, logits


def test_kl_estimators():
    logp, ref = jnp.array([[-1.0, -2.0]]), jnp.array([[-1.5, -1.0]])
    x = np.array([[-0.5, 1.0]])
    assert_allclose(losses.kl_penalty(logp, ref, "k1"), -x, rtol=1e-6)
    assert_allclose(losses.kl_penalty(logp, ref, "k2"), x ** 2 / 2, rtol=1e-6)
    assert_allclose(losses.kl_penalty(logp, ref), np.exp(x) - x - 1, rtol=1e-6)
    with pytest.raises(ValueError, match="k3"):
        losses.kl_penalty(logp, ref, "k4")


def test_value_loss_clipping():
    v, old, ret = _row(1.0, 0.5, 0.0), _row(0.5, 0.5, 0.0), _row(2.0, 0.0, 1.0)
    m = _row(1.0, 1.0, 0.0)
    loss, met = losses.value_loss(v, old, ret, m, clip=0.2)
    # tok 0: unclipped (1-2)^2=1, clipped (0.7-2)^2=1.69 -> 1.69; tok 1: both 0.25.
    assert_allclose(loss, 0.5 * (1.69 + 0.25) / 2, rtol=1e-6)
    assert_allclose(met["vf_clipfrac"], 0.5)
    assert_allclose(met["vpred_mean"], 0.75)
    loss_none, met_none = losses.value_loss(v, old, ret, m, clip=None)
    assert_allclose(loss_none, 0.5 * (1.0 + 0.25) / 2, rtol=1e-6)
    assert met_none["vf_clipfrac"] == 0.0


def test_token_logprobs_and_entropy():
    logits = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 5)) * 3
    tokens = jnp.array([[0, 4, 2], [1, 1, 3]])
    got = losses.token_logprobs(logits, tokens, temperature=0.7)
    ref = jnp.take_along_axis(jax.nn.log_softmax(logits / 0.7, -1), tokens[..., None], -1)[..., 0]
    assert got.dtype == jnp.float32
    assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    for t in (0.0, 1.0):
        ref1 = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), tokens[..., None], -1)[..., 0]
        assert_allclose(losses.token_logprobs(logits, tokens, t), ref1, rtol=1e-5, atol=1e-6)
    p = jax.nn.softmax(logits, -1)
    assert losses.entropy_from_logits(logits.astype(jnp.bfloat16)).dtype == jnp.float32
    assert_allclose(losses.entropy_from_logits(logits), -jnp.sum(p * jnp.log(p), -1),
                    rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- jit


def test_losses_under_jit():
    key = jax.random.PRNGKey(1)
    logp = jax.random.normal(key, (2, 4)) * 0.1
    old = jnp.zeros((2, 4))
    m = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0]], jnp.float32)
    adv = losses.masked_whiten(jnp.arange(8.0).reshape(2, 4), m)

    @jax.jit
    def everything(logp, old, adv, m, rewards):
        pl, pm = losses.policy_loss(logp, old, adv, m, dual_clip=3.0, agg="seq-mean-token-mean",
                                    prox_logp_BT=old)
        vl, vm = losses.value_loss(logp, old, adv, m)
        a, ret = losses.gae(adv, logp, m, gamma=0.99)
        g = losses.group_advantages(rewards, 2)
        return pl, pm, vl, vm, a, ret, g, losses.kl_penalty(logp, old, "k2"), \
            losses.masked_whiten(a, m)

    out = everything(logp, old, adv, m, jnp.array([0.0, 1.0, 1.0, 1.0]))
    eager = losses.policy_loss(logp, old, adv, m, dual_clip=3.0, agg="seq-mean-token-mean")
    assert_allclose(out[0], eager[0], rtol=1e-6)
    assert all(np.all(np.isfinite(x)) for x in jax.tree_util.tree_leaves(out))
    tl = jax.jit(losses.token_logprobs)(jnp.zeros((1, 2, 4)), jnp.zeros((1, 2), jnp.int32), 0.5)
    assert_allclose(tl, np.full((1, 2), -math.log(4)), rtol=1e-6)
