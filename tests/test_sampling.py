"""Sampling rules on small hand-made logit vectors; empirical frequencies vs the masked softmax."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_scale.sampling import (
    SamplingConfig, apply_temperature, masked_logits, sample_next, top_k_mask, top_p_mask)


@pytest.fixture(autouse=True)
def _strict_rank_promotion():
    with jax.numpy_rank_promotion("raise"):
        yield


PROBS = np.array([0.25, 0.5, 0.03, 0.15, 0.07])      # sorted: 1, 0, 3, 4, 2
LOGITS = jnp.asarray(np.log(PROBS)[None], jnp.float32)


def _kept(x_BV):
    return np.flatnonzero(np.isfinite(np.asarray(x_BV)[0])).tolist()


def test_temperature_scales_logits():
    x = jnp.array([[1.0, -2.0, 3.0]])
    np.testing.assert_allclose(apply_temperature(x, 0.5), [[2.0, -4.0, 6.0]])
    assert apply_temperature(x, 1.0) is not None
    with pytest.raises(ValueError):
        apply_temperature(x, 0.0)


def test_top_k_mask():
    x = jnp.array([[1.0, 5.0, 3.0, 2.0, 4.0]])
    assert _kept(top_k_mask(x, 2)) == [1, 4]
    assert _kept(top_k_mask(x, 1)) == [1]
    assert _kept(top_k_mask(x, 0)) == [0, 1, 2, 3, 4]   # 0 disables
    assert _kept(top_k_mask(x, 99)) == [0, 1, 2, 3, 4]  # >= V keeps all
    np.testing.assert_array_equal(top_k_mask(x, 2)[0, [1, 4]], [5.0, 4.0])  # values untouched


def test_top_p_mask_smallest_set_reaching_p():
    assert _kept(top_p_mask(LOGITS, 0.01)) == [1]          # the top token is always kept
    assert _kept(top_p_mask(LOGITS, 0.6)) == [0, 1]        # 0.5 < 0.6 <= 0.75
    assert _kept(top_p_mask(LOGITS, 0.8)) == [0, 1, 3]     # 0.75 < 0.8 <= 0.9
    assert _kept(top_p_mask(LOGITS, 0.95)) == [0, 1, 3, 4]
    assert _kept(top_p_mask(LOGITS, 1.0)) == [0, 1, 2, 3, 4]


def test_masks_compose_temperature_then_top_k_then_top_p():
    # top-k first renormalises {1: 2/3, 0: 1/3}, so p = 0.6 keeps only the top token;
    # top-p alone at 0.6 would keep two.
    assert _kept(masked_logits(LOGITS, 1.0, top_k=2, top_p=0.6)) == [1]
    # a high temperature flattens the distribution: the same p needs more tokens
    assert _kept(masked_logits(LOGITS, 1.0, top_p=0.88)) == [0, 1, 3]
    assert _kept(masked_logits(LOGITS, 5.0, top_p=0.88)) == [0, 1, 2, 3, 4]
    # a low one sharpens it
    assert _kept(masked_logits(LOGITS, 0.2, top_p=0.8)) == [1]
    x = masked_logits(LOGITS, 0.5, top_k=3, top_p=0.99)
    assert not np.any(np.isnan(np.asarray(x)))
    np.testing.assert_allclose(np.asarray(x)[0, [0, 1, 3]], np.log(PROBS[[0, 1, 3]]) / 0.5,
                               rtol=1e-6)


def test_greedy_and_its_logprob():
    logits = jnp.array([[0.1, 2.0, -1.0], [3.0, 0.0, 2.5]])
    tok, lp = sample_next(logits, jax.random.PRNGKey(0), temperature=0.0, top_k=1, top_p=0.1)
    np.testing.assert_array_equal(tok, [1, 0])
    assert tok.dtype == jnp.int32 and lp.dtype == jnp.float32
    # documented choice: greedy reports log_softmax at temperature 1
    ref = jax.nn.log_softmax(logits, axis=-1)[jnp.arange(2), tok]
    np.testing.assert_allclose(lp, ref, rtol=1e-6)


SETTINGS = [(1.0, 0, 1.0), (0.5, 0, 1.0), (2.0, 4, 1.0), (1.0, 0, 0.7), (0.8, 5, 0.9)]


def test_logprob_is_under_the_sampled_distribution():
    logits = jax.random.normal(jax.random.PRNGKey(3), (64, 11)) * 2.0

    @jax.jit
    def draws(logits):
        out = []
        for i, (t, k, p) in enumerate(SETTINGS):
            tok, lp = sample_next(logits, jax.random.PRNGKey(i), t, k, p)
            ref = jax.nn.log_softmax(masked_logits(logits, t, k, p), axis=-1)
            out.append((tok, lp, jnp.take_along_axis(ref, tok[:, None], axis=-1)[:, 0]))
        return out

    for tok, lp, ref in draws(logits):
        assert np.all(np.isfinite(ref))  # never samples a masked token
        np.testing.assert_allclose(lp, ref, rtol=1e-5, atol=1e-6)


def test_empirical_frequencies_match_masked_softmax():
    n = 20_000
    logits_V = jnp.array([1.2, 0.3, -0.5, 2.0, 0.0, -1.5])

    @jax.jit
    def freqs(key):
        out = []
        for i, (t, k, p) in enumerate(SETTINGS):
            tok = sample_next(jnp.broadcast_to(logits_V, (n, 6)), jax.random.fold_in(key, i),
                              t, k, p)[0]
            want = jax.nn.softmax(masked_logits(logits_V[None], t, k, p))[0]
            out.append((jnp.bincount(tok, length=6) / n, want))
        return out

    for setting, (freq, want) in zip(SETTINGS, freqs(jax.random.PRNGKey(7))):
        freq, want = np.asarray(freq), np.asarray(want)
        assert np.max(np.abs(freq - want)) < 0.02, (setting, freq, want)
        assert np.all(freq[want == 0] == 0), setting  # masked tokens are never drawn
        assert np.sum(want > 0) < 6 or setting[1:] == (0, 1.0)  # the masks do bite


def test_sampling_config_validates_and_is_a_static_key():
    a, b = SamplingConfig(0.7, 3, 0.9), SamplingConfig(0.7, 3, 0.9)
    assert a == b and hash(a) == hash(b) and not a.greedy and SamplingConfig(0.0).greedy
    for kw, word in [(dict(temperature=-1.0), "temperature"), (dict(top_k=-2), "top_k"),
                     (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p")]:
        with pytest.raises(ValueError, match=word):
            SamplingConfig(**kw)
    tok, lp = a.get_next_tokens(LOGITS, jax.random.PRNGKey(0))
    assert tok.shape == (1,) and lp.shape == (1,)
