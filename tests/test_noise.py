"""Gradient noise scale (McCandlish et al. 2018) and the grad-norm slope helpers."""

import numpy as np
import pytest

from jaxrl_scale import scaling
from jaxrl_scale.scaling import noise

G2, TRACE = 2.0, 96.0  # B_simple = 48


def test_two_batch_estimators_exact_expectations():
    for b_small, b_big in [(8, 64), (16, 128), (32, 33), (1, 1024)]:
        sq_small = G2 + TRACE / b_small  # E|g_B|^2 = |G|^2 + tr(Sigma)/B
        sq_big = G2 + TRACE / b_big
        g2, tr = scaling.two_batch_estimates(sq_small, sq_big, b_small, b_big)
        assert g2 == pytest.approx(G2) and tr == pytest.approx(TRACE)
    g2, tr = scaling.two_batch_estimates(np.full(3, G2 + TRACE / 4), np.full(3, G2 + TRACE / 16),
                                         4, 16)
    np.testing.assert_allclose(g2, G2)
    np.testing.assert_allclose(tr, TRACE)
    with pytest.raises(ValueError):
        scaling.two_batch_estimates(1.0, 1.0, 8, 8)


def _simulate(n_updates=3000, dim=24, b_small=16, n_micro=8, seed=0):
    """Micro-batch mean grads ~ N(G, Sigma / b_small); full grad = their mean."""
    rng = np.random.default_rng(seed)
    g = rng.normal(size=dim)
    g *= np.sqrt(G2) / np.linalg.norm(g)
    var = rng.uniform(0.5, 1.5, size=dim)
    var *= TRACE / var.sum()
    micro = g + rng.normal(size=(n_updates, n_micro, dim)) * np.sqrt(var / b_small)
    sq_small = np.mean(np.sum(micro ** 2, -1), -1)
    sq_big = np.sum(micro.mean(1) ** 2, -1)
    return sq_small, sq_big, b_small, b_small * n_micro


def test_two_batch_estimators_on_simulated_gradients():
    sq_small, sq_big, bs, bb = _simulate()
    g2, tr = scaling.two_batch_estimates(sq_small, sq_big, bs, bb)
    # unbiased: sample means within a few standard errors of the truth
    assert abs(g2.mean() - G2) < 4 * g2.std() / np.sqrt(g2.size)
    assert abs(tr.mean() - TRACE) < 4 * tr.std() / np.sqrt(tr.size)
    assert g2.mean() == pytest.approx(G2, rel=0.05)
    assert tr.mean() == pytest.approx(TRACE, rel=0.05)


def test_noise_scale_ema_and_records():
    sq_small, sq_big, bs, bb = _simulate()
    ema = scaling.NoiseScaleEMA(beta=0.998)
    for a, b in zip(sq_small, sq_big):
        ema.update(a, b, bs, bb)
    assert ema.count == sq_small.size
    assert ema.b_simple == pytest.approx(TRACE / G2, rel=0.15)
    assert scaling.NoiseScaleEMA().b_simple is None
    # the same from logged records: micro batch = small, full batch = big
    rng = np.random.default_rng(1)
    recs = []
    for a, b in zip(sq_small, sq_big):
        # per-micro norms whose mean is a (spread does not change the estimate)
        spread = rng.normal(0, 0.1, 8)
        recs.append({"actor_grad_sqnorm_micro": list(a + spread - spread.mean()),
                     "actor_grad_sqnorm": b})
    out = scaling.noise_scale_from_records(recs, batch=bb, beta=0.998)
    assert out["b_small"] == bs and out["n_updates"] == len(recs)
    assert out["b_simple"] == pytest.approx(ema.b_simple, rel=1e-9)
    assert scaling.noise_scale_from_records([{"actor_grad_norm": 1.0}], batch=64) is None


def test_predicted_r_n():
    assert scaling.predicted_r_n(1024, 1024, 500.0) == pytest.approx(1.0)
    assert scaling.predicted_r_n(2048, 1024, 1024.0) == pytest.approx(1.5)
    np.testing.assert_allclose(scaling.predicted_r_n(np.array([512, 4096]), 512, 1e9), [1, 1],
                               rtol=1e-5)  # tiny batches vs B_crit: no sample cost


def test_loglog_slope_and_flattening():
    b = np.array([64, 128, 256, 512, 1024, 2048, 4096])
    assert scaling.loglog_slope(b, 3.0 / np.sqrt(b)) == pytest.approx(-0.5)
    # falls like B^-1/2 up to 1024, then flat
    norms = np.where(b <= 1024, 1 / np.sqrt(b), 1 / np.sqrt(1024.0))
    assert scaling.flattening_batch(b, norms) == 1024
    assert scaling.flattening_batch(b, 1 / np.sqrt(b)) is None
    assert scaling.loglog_slope([64], [1.0]) is None
    assert noise.b_simple(-1.0, 5.0) is None
