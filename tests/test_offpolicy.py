"""Off-policy correction: truncated importance sampling of the rollout/trainer gap
(LossConfig.is_cap), GSPO's sequence-level ratio (ratio_level="sequence") and the
`mismatch_kl` metric, checked against the formulas on hand-computed cases and in a real
GRPO step whose rollout log-probs come from the sampler."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose

from numerics import assert_adam_step_close, assert_tree_close, tree_diff, tree_norm
from test_steps import (CFG, CTX, GT, HP, LOSS_CFG, R, TP, TX, _grpo_fn, grpo_reference,
                        new_state, np_params)

from jaxrl_scale.rl import losses
from jaxrl_scale.rl.batch import rollout_batch
from jaxrl_scale.rl.config import LossConfig
from jaxrl_scale.rl.state import create_train_state
from jaxrl_scale.rl.value import init_critic_from_actor
from jaxrl_scale.rl import steps
from jaxrl_scale.sampling import generate


@pytest.fixture
def strict_ranks():
    """The hand-computed loss cases run without implicit rank promotion (as test_losses)."""
    with jax.numpy_rank_promotion("raise"):
        yield


def _a(x):
    return jnp.asarray(np.asarray(x, np.float32))


# Two rows of three tokens; row 1's last token is padding. Rollout = sampler, trainer = the
# trainer's pre-update log-probs of the same tokens.
LOGP = [[-1.0, -2.0, -0.5], [-1.5, -0.3, -2.0]]
ROLLOUT = [[-1.2, -2.0, -1.5], [-1.4, -0.3, -2.0]]
TRAINER = [[-1.1, -1.9, -0.4], [-1.5, -0.2, -2.0]]    # token (0, 2): w = e^1.1 = 3.004 > cap
ADV = [[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]


@pytest.mark.usefixtures("strict_ranks")
def test_truncated_is_weights_loss_and_grad_by_hand():
    """w = min(exp(trainer - rollout), C); L = token-mean of w * max(-A r, -A clip(r)), with
    r = pi / pi_trainer; dL/dlogp = -A r w / N where r is inside the clip range, else 0."""
    lp, ro, tr, adv, m = (np.asarray(x, np.float64) for x in (LOGP, ROLLOUT, TRAINER, ADV, MASK))
    cap, lo, hi = 2.0, 0.2, 0.28
    w = np.minimum(np.exp(tr - ro), cap)
    assert w[0, 2] == cap                                       # one token capped
    r = np.exp(lp - tr)
    terms = np.maximum(-adv * r, -adv * np.clip(r, 1 - lo, 1 + hi)) * w
    n = m.sum()
    want = (terms * m).sum() / n
    inside = (r >= 1 - lo) & (r <= 1 + hi)
    want_grad = np.where(inside, -adv * r * w, 0.0) * m / n

    def f(logp):
        return losses.policy_loss(logp, _a(ro), _a(adv), _a(m), clip_low=lo, clip_high=hi,
                                  prox_logp_BT=_a(tr), is_cap=cap)
    loss, met = f(_a(lp))
    assert_allclose(float(loss), want, rtol=2e-6)
    assert_allclose(np.asarray(jax.grad(lambda x: f(x)[0])(_a(lp))), want_grad, rtol=2e-6,
                    atol=1e-7)
    assert_allclose(float(met["is_weight_mean"]), (w * m).sum() / n, rtol=2e-6)
    assert float(met["is_clipped_frac"]) == pytest.approx(1 / 5)
    assert_allclose(np.asarray(losses.importance_weights(_a(tr), _a(ro), cap)), w, rtol=2e-6)
    with pytest.raises(ValueError, match="is_cap"):
        losses.policy_loss(_a(lp), _a(ro), _a(adv), _a(m), is_cap=2.0)   # no trainer log-probs
    with pytest.raises(ValueError, match="is_cap"):
        losses.policy_loss(_a(lp), _a(ro), _a(adv), _a(m), prox_logp_BT=_a(tr), is_cap=-1.0)


@pytest.mark.usefixtures("strict_ranks")
def test_gspo_sequence_ratio_objective_and_grad_by_hand():
    """s_i = exp(mean over row i's valid tokens of logp - old) (padding excluded: its huge
    log-ratio would dominate), broadcast to the row's tokens and clipped; the gradient goes
    through the mean: dL/dlogp_t = -A_i s_i / N on an unclipped row's valid tokens."""
    lp = np.array([[-1.0, -2.0, -0.5, 5.0], [-1.5, -0.3, -2.0, -1.0]])
    old = np.array([[-1.1, -1.9, -0.6, -3.0], [-0.8, -0.3, -2.0, -1.2]])
    adv = np.array([[1.0] * 4, [-1.0] * 4])
    m = np.array([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    lo, hi = 0.1, 0.1
    n_i = m.sum(1)
    s = np.exp(((lp - old) * m).sum(1) / n_i)                  # [e^(0.1 / 3), e^-0.125]
    assert 1 - lo < s[0] < 1 + hi and s[1] < 1 - lo            # row 1 clipped (A < 0)
    terms = np.maximum(-adv * s[:, None], -adv * np.clip(s, 1 - lo, 1 + hi)[:, None])
    N = m.sum()
    want = (terms * m).sum() / N
    want_grad = np.where(np.array([True, False])[:, None], -adv * s[:, None], 0.0) * m / N

    def f(logp, agg="token-mean"):
        return losses.policy_loss(logp, _a(old), _a(adv), _a(m), clip_low=lo, clip_high=hi,
                                  ratio_level="sequence", agg=agg)
    loss, met = f(_a(lp))
    assert_allclose(float(loss), want, rtol=2e-6)
    assert_allclose(np.asarray(jax.grad(lambda x: f(x)[0])(_a(lp))), want_grad, rtol=2e-6,
                    atol=1e-7)
    assert_allclose(float(met["ratio_mean"]), (s[:, None] * m).sum() / N, rtol=2e-6)
    assert float(met["clipfrac"]) == pytest.approx(4 / 7)     # row 1's four tokens
    # GSPO's own aggregation, the mean over sequences of the sequence objective
    assert_allclose(float(f(_a(lp), "seq-mean-token-mean")[0]), terms[:, 0].mean(), rtol=2e-6)
    # central finite differences of the float64 hand formula agree with jax.grad
    def hand(x):
        si = np.exp(((x - old) * m).sum(1) / n_i)
        t = np.maximum(-adv * si[:, None], -adv * np.clip(si, 1 - lo, 1 + hi)[:, None])
        return (t * m).sum() / N
    h, fd = 1e-6, np.zeros_like(lp)
    for idx in np.ndindex(lp.shape):
        e = np.zeros_like(lp)
        e[idx] = h
        fd[idx] = (hand(lp + e) - hand(lp - e)) / (2 * h)
    assert_allclose(fd, want_grad, atol=1e-8)
    assert_allclose(np.asarray(losses.sequence_log_ratio(_a(lp - old), _a(m))),
                    np.log(s)[:, None] * np.ones_like(lp), rtol=1e-6)
    with pytest.raises(ValueError, match="ratio_level"):
        losses.policy_loss(_a(lp), _a(old), _a(adv), _a(m), ratio_level="seq")


@pytest.mark.usefixtures("strict_ranks")
def test_defaults_are_todays_loss_bit_for_bit():
    """is_cap off and ratio_level="token" are today's loss and gradients exactly; with the
    trainer's log-probs equal to the sampler's (exact arithmetic) the capped weights are
    exactly 1, so is_cap=2 gives the same bits too."""
    rng = np.random.default_rng(0)
    logp = _a(-1.0 + 0.3 * rng.normal(size=(4, 6)))
    old = _a(np.asarray(logp) + 0.2 * rng.normal(size=(4, 6)))
    adv = _a(rng.normal(size=(4, 6)))
    m = _a(rng.integers(0, 2, (4, 6)))
    kw = dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0)

    def run(**extra):
        f = jax.jit(lambda x: losses.policy_loss(x, old, adv, m, **kw, **extra))
        (loss, met), g = f(logp), jax.grad(lambda x: f(x)[0])(logp)
        return np.asarray(loss), {k: np.asarray(v) for k, v in met.items()}, np.asarray(g)
    base = run()
    for extra in (dict(ratio_level="token"), dict(prox_logp_BT=old, is_cap=2.0)):
        got = run(**extra)
        assert np.array_equal(got[0], base[0]) and np.array_equal(got[2], base[2]), extra
        assert all(np.array_equal(got[1][k], v) for k, v in base[1].items())
    assert float(run(prox_logp_BT=old, is_cap=2.0)[1]["is_weight_mean"]) == 1.0
    # LossConfig defaults keep the step's program as it was
    assert LossConfig().is_cap == 0.0 and LossConfig().ratio_level == "token"


@pytest.mark.usefixtures("strict_ranks")
def test_mismatch_kl_is_k3_by_hand():
    tr, ro, m = (np.asarray(x, np.float64) for x in (TRAINER, ROLLOUT, MASK))
    x = tr - ro
    want = ((np.exp(x) - x - 1) * m).sum() / m.sum()
    assert_allclose(float(losses.mismatch_kl(_a(tr), _a(ro), _a(m))), want, rtol=1e-5)
    assert float(losses.mismatch_kl(_a(ro), _a(ro), _a(m))) == 0.0


@pytest.mark.parametrize("cap, why", [(-1.0, "> 0"), (0.5, "below 1"), (float("inf"), "finite"),
                                      (float("nan"), "finite")])
def test_loss_config_refuses_bad_caps(cap, why):
    with pytest.raises(ValueError, match=why):
        LossConfig(is_cap=cap)
    with pytest.raises(ValueError, match="ratio_level"):
        LossConfig(ratio_level="seq")
    assert LossConfig(is_cap=1.0).is_cap == 1.0


def _sampled_batch(params, seed=0, rows=16):
    """A GRPO batch whose old_logp_BT are the sampler's own log-probs (generate, KV cache)."""
    rng = np.random.default_rng(seed)
    prompts = [list(rng.integers(0, CFG.vocab_size, n)) for n in rng.integers(1, TP + 1, rows)]
    out = generate(CFG, params, prompts, max_new_tokens=R, temperature=LOSS_CFG.temperature,
                   eos_id=None, pad_id=0, seed=seed)
    batch, _ = rollout_batch(prompts, np.asarray(out.tokens), np.asarray(out.logprobs),
                             np.asarray(out.lengths), rng.normal(size=rows), prompt_len=TP,
                             pad_id=0, group_size=GT)
    return jax.tree.map(jnp.asarray, batch)


def test_grpo_step_with_is_cap_on_sampled_rollout():
    """On CPU the sampler and the trainer agree to float rounding, so mismatch_kl ~ 0 and every
    weight w = exp(delta), |delta| ~ 1e-6, is far inside the cap and the clip range (0.2): the
    is_cap=2 update (clip centred on the trainer's log-probs, weighted by w) and the plain one
    (centred on the sampler's) are the same function, w exp(logp - trainer) = exp(logp - old),
    and differ by float32 rounding only: the gradients within the reordering floor, the params
    within the derived one-step Adam bound of the gradients' difference
    (numerics.assert_adam_step_close)."""
    params = np_params(CFG, 0)
    batch = _sampled_batch(params)
    plain_cfg = dataclasses.replace(LOSS_CFG, kl_coef=0.0)
    cap_cfg = dataclasses.replace(plain_cfg, is_cap=2.0)
    s0, m0 = _grpo_fn(1, plain_cfg)(new_state(params), batch)
    s2, m2 = _grpo_fn(1, cap_cfg)(new_state(params), batch)
    for m in (m0, m2):
        assert abs(float(m["mismatch_kl"])) < 1e-5
    assert float(m2["is_clipped_frac"]) == 0.0 and abs(float(m2["is_weight_mean"]) - 1) < 1e-5
    assert float(m2["ratio_mean"]) == 1.0 and float(m2["clipfrac"]) == 0.0
    _, _, floor = grpo_reference(params, [batch], loss_cfg=cap_cfg)
    g0, g2 = m0["actor_grads"], m2["actor_grads"]
    assert_tree_close(g2, g0, floor["grads"], tree_norm(g0))
    assert_adam_step_close(s2, s0, new_state(params), g2, g0, HP)
    # Trainer log-probs given equal to the sampler's: the weights are exactly 1 and the loss
    # the plain one (bit for bit in policy_loss, test_defaults_are_todays_loss_bit_for_bit;
    # here another compiled graph, so to its rounding).
    same = batch.replace(prox_logp_BT=batch.old_logp_BT)
    s_same, m_same = _grpo_fn(1, cap_cfg)(new_state(params), same)
    assert float(m_same["mismatch_kl"]) == 0.0 and float(m_same["is_weight_mean"]) == 1.0
    assert_tree_close(m_same["actor_grads"], g0, floor["grads"], tree_norm(g0))
    assert_adam_step_close(s_same, s0, new_state(params), m_same["actor_grads"], g0, HP)


def test_mismatch_kl_in_ppo_metrics_and_multi_update_guard():
    params = np_params(CFG, 0)
    batch = _sampled_batch(params, rows=8)
    cfg = dataclasses.replace(LOSS_CFG, kl_coef=0.0, is_cap=2.0)
    o = steps.StepOptions(cfg=CFG, tx=TX, critic_tx=CTX, loss_cfg=cfg)
    st = create_train_state(params, TX, 0)
    critic = create_train_state(init_critic_from_actor(params, jax.random.PRNGKey(1)), CTX, 0)
    out = jax.eval_shape(lambda a, c, b: steps.ppo_step(a, c, b, o), st, critic, batch)
    assert {"mismatch_kl", "is_weight_mean", "is_clipped_frac"} <= set(out[2])
    with pytest.raises(ValueError, match="prox_logp_BT"):
        jax.eval_shape(lambda a, b: steps.grpo_step(a, b, dataclasses.replace(
            o, num_minibatches=2, group_size=GT)), st, batch)


def test_gspo_step_is_micro_batch_invariant():
    """A row's sequence ratio needs the whole row, and micro-batches hold whole rows (whole
    groups): the GSPO update does not depend on their count, and differs from the token one."""
    from test_steps import make_grpo_batch
    params = np_params(CFG, 0)
    batch = make_grpo_batch(0)
    seq_cfg = dataclasses.replace(LOSS_CFG, ratio_level="sequence")
    _, (m1,), floor = grpo_reference(params, [batch], loss_cfg=seq_cfg)
    _, m4 = _grpo_fn(4, seq_cfg)(new_state(params), batch)
    g1 = m1["actor_grads"]
    assert_tree_close(m4["actor_grads"], g1, floor["grads"], tree_norm(g1))
    tok = _grpo_fn(1)(new_state(params), batch)[1]
    assert tree_diff(tok["actor_grads"], g1) > 1e-3 * tree_norm(g1)
    assert float(m1["ratio_mean"]) != float(tok["ratio_mean"])
