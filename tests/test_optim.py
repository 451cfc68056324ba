"""Batch-scaling rules (docs/science.md, Batch-size invariance and the lr rules) and the
optimizer builder."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from numpy.testing import assert_allclose

from jaxrl_scale import optim
from jaxrl_scale.optim import AdamHParams


def test_scaled_lr_rules():
    assert_allclose(optim.scaled_lr(1e-6, 2048, 1024, "sqrt"), 1e-6 * math.sqrt(2), rtol=1e-12)
    assert_allclose(optim.scaled_lr(1e-6, 2048, 1024, "linear"), 2e-6, rtol=1e-12)
    assert optim.scaled_lr(1e-6, 2048, 1024, "fixed") == 1e-6
    assert_allclose(optim.scaled_lr(1e-6, 256, 1024, "sqrt"), 0.5e-6, rtol=1e-12)


@pytest.mark.parametrize("args,match", [
    ((1e-6, 2048, 1024, "cubic"), "rule"),
    ((0.0, 2048, 1024, "sqrt"), "base_lr"),
    ((1e-6, 0, 1024, "sqrt"), "batch"),
    ((1e-6, 2048, -1, "linear"), "batch"),
])
def test_scaled_lr_errors(args, match):
    with pytest.raises(ValueError, match=match):
        optim.scaled_lr(*args)


def test_malladi_rule_matches_science_formulas():
    base = AdamHParams(lr=1e-6, b1=0.9, b2=0.999, eps=1e-8)
    kappa = 4.0
    got = optim.scaled_adam_hparams(base, 4096, 1024, "malladi")
    assert isinstance(got, AdamHParams)
    assert_allclose(got.lr, math.sqrt(kappa) * 1e-6, rtol=1e-12)
    assert_allclose(got.b1, 1 - kappa * (1 - 0.9), rtol=1e-12)       # 0.6
    assert_allclose(got.b2, 1 - kappa * (1 - 0.999), rtol=1e-12)     # 0.996
    assert_allclose(got.eps, 1e-8 / math.sqrt(kappa), rtol=1e-12)
    sqrt_only = optim.scaled_adam_hparams(base, 4096, 1024, "sqrt")
    assert sqrt_only == AdamHParams(lr=2e-6, b1=0.9, b2=0.999, eps=1e-8)
    for batch in (1024 * 10, 1024 * 16):                               # b1 -> 0, b1 < 0
        with pytest.raises(ValueError, match="b1"):
            optim.scaled_adam_hparams(base, batch, 1024, "malladi")
    with pytest.raises(ValueError, match="b2"):
        optim.scaled_adam_hparams(AdamHParams(lr=1e-6, b1=0.99, b2=0.98), 1024 * 60, 1024,
                                  "malladi")
    with pytest.raises(ValueError, match="rule"):
        optim.scaled_adam_hparams(base, 2048, 1024, "adam")


def _params():
    return {"w": jnp.array([1.0, -2.0]), "b": jnp.array(0.5)}


def test_nonfinite_gradient_is_skipped_and_counted():
    tx = optim.make_optimizer(AdamHParams(lr=0.1), warmup_steps=0)
    params = _params()
    state = tx.init(params)
    assert int(optim.nonfinite_count(state)) == 0
    step = jax.jit(lambda g, s, p: tx.update(g, s, p))

    bad = {"w": jnp.array([jnp.nan, 1.0]), "b": jnp.array(1.0)}
    upd, state2 = step(bad, state, params)
    new_params = optax.apply_updates(params, upd)
    for k in params:
        np.testing.assert_array_equal(new_params[k], params[k])
    assert int(optim.nonfinite_count(state2)) == 1
    inf = {"w": jnp.array([1.0, 1.0]), "b": jnp.array(jnp.inf)}
    _, state3 = step(inf, state2, params)
    assert int(optim.nonfinite_count(state3)) == 2

    good = {"w": jnp.array([1.0, -1.0]), "b": jnp.array(0.0)}
    upd, state4 = step(good, state3, params)
    new_params = optax.apply_updates(params, upd)
    # First Adam step moves each coordinate with nonzero grad by ~lr against its sign; the
    # skipped steps must not have advanced the bias-correction count.
    assert_allclose(new_params["w"], [0.9, -1.9], rtol=1e-5)
    assert_allclose(new_params["b"], 0.5, atol=1e-7)
    assert int(optim.nonfinite_count(state4)) == 2


def test_matches_reference_chain_with_clipping():
    # Clipping is visible from step 2 on, when gradients of different norms mix in Adam's moments.
    hp = AdamHParams(lr=0.1, b1=0.8, b2=0.9, eps=1e-6)
    ref = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(0.1, b1=0.8, b2=0.9, eps=1e-6))
    for tx, plain in ((optim.make_optimizer(hp, max_grad_norm=1.0), ref),
                      (optim.make_optimizer(hp, max_grad_norm=None, skip_nonfinite=False),
                       optax.adam(0.1, b1=0.8, b2=0.9, eps=1e-6))):
        params = _params()
        s, s_ref = tx.init(params), plain.init(params)
        for g in ({"w": jnp.array([300.0, 400.0]), "b": jnp.array(0.0)},
                  {"w": jnp.array([0.1, -0.2]), "b": jnp.array(0.3)}):
            u, s = tx.update(g, s, params)
            u_ref, s_ref = plain.update(g, s_ref, params)
            for k in params:
                assert_allclose(u[k], u_ref[k], rtol=1e-5, atol=1e-8)
    assert int(optim.nonfinite_count(s)) == 0    # no counter without skipping: 0


def test_weight_decay_and_nested_state_counter():
    tx = optim.make_optimizer(AdamHParams(lr=0.1), weight_decay=0.1)
    params = _params()
    state = tx.init(params)
    zero = jax.tree_util.tree_map(jnp.zeros_like, params)
    upd, state = tx.update(zero, state, params)
    # Zero gradient: only decoupled weight decay acts: p -> p - lr * wd * p.
    assert_allclose(optax.apply_updates(params, upd)["w"], [1.0 * 0.99, -2.0 * 0.99], rtol=1e-6)
    nested = {"opt": (state, optax.EmptyState())}
    assert int(optim.nonfinite_count(nested)) == 0


def test_warmup_schedule():
    hp = AdamHParams(lr=1e-3)
    lrs = [optim.current_lr(hp, s, 4) for s in range(6)]
    assert_allclose(lrs, [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3], rtol=1e-12)
    assert optim.current_lr(hp, 7, 0) == 1e-3
    assert_allclose(optim.current_lr(hp, jnp.array(1), 4), 5e-4, rtol=1e-6)

    # The optimizer uses the same ramp: with SGD-like sign steps of Adam on a constant gradient,
    # step k moves the parameter by ~lr_k.
    tx = optim.make_optimizer(hp, warmup_steps=4, max_grad_norm=None)
    params = {"w": jnp.array(0.0)}
    state = tx.init(params)
    g = {"w": jnp.array(1.0)}
    moves = []
    for _ in range(5):
        upd, state = tx.update(g, state, params)
        moves.append(-float(upd["w"]))
    assert_allclose(moves, [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3], rtol=1e-4)
