"""Sampling rules: pure functions on float32 logits (gemma-sampler style).

Shapes: B batch, V vocab.

Every rule is static in its hyper-parameters (Python floats / ints), so a change of
temperature or top-k is a new jit-cache key rather than a traced value; within one setting
nothing recompiles. Masked logits use -inf, so the masked tokens get probability exactly 0
and `log_softmax` of the masked logits is the log-prob under the distribution sampled from.
"""
from __future__ import annotations

import dataclasses
import numbers

import jax
import jax.numpy as jnp

_MASKED = -jnp.inf


def validate_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """Host-side checks with ValueErrors naming the bad setting."""
    if not (isinstance(temperature, numbers.Real) and temperature >= 0.0):
        raise ValueError(f"temperature must be a float >= 0 (0 means greedy), got {temperature!r}.")
    if not (isinstance(top_k, numbers.Integral) and top_k >= 0):
        raise ValueError(f"top_k must be an int >= 0 (0 disables top-k), got {top_k!r}.")
    if not (isinstance(top_p, numbers.Real) and 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must lie in (0, 1] (1 disables nucleus sampling), got {top_p!r}.")


def apply_temperature(logits_BV: jax.Array, temperature: float) -> jax.Array:
    """logits / temperature in float32 (temperature > 0; 0 is greedy, see `sample_next`)."""
    if temperature <= 0:
        raise ValueError(f"apply_temperature needs temperature > 0, got {temperature}.")
    logits_BV = logits_BV.astype(jnp.float32)
    return logits_BV if temperature == 1.0 else logits_BV / jnp.float32(temperature)


def top_k_mask(logits_BV: jax.Array, top_k: int) -> jax.Array:
    """Keep the `top_k` largest logits per row (0 or >= V keeps all), others -> -inf.

    Ties with the k-th largest value are all kept (threshold rule), so a row can keep more
    than k tokens only when logits are exactly equal.
    """
    V = logits_BV.shape[-1]
    if top_k <= 0 or top_k >= V:
        return logits_BV
    kth_B1 = jax.lax.top_k(logits_BV, top_k)[0][..., -1:]
    return jnp.where(logits_BV >= kth_B1, logits_BV, _MASKED)


def top_p_mask(logits_BV: jax.Array, top_p: float) -> jax.Array:
    """Nucleus sampling (Holtzman et al. 2020): keep the smallest set of most likely tokens
    whose cumulative probability is >= top_p; the most likely token is always kept.

    A sorted token is kept when the probability mass strictly before it is < top_p. Ties with
    the smallest kept logit are kept too (threshold rule). Works on already-masked logits.
    """
    if top_p >= 1.0:
        return logits_BV
    sorted_BV = jnp.sort(logits_BV, axis=-1)[..., ::-1]
    probs_BV = jax.nn.softmax(sorted_BV, axis=-1)
    mass_before_BV = jnp.cumsum(probs_BV, axis=-1) - probs_BV
    keep_BV = mass_before_BV < top_p
    keep_BV = keep_BV.at[..., 0].set(True)
    # smallest kept logit = the threshold (kept entries form a prefix of the sorted row)
    thresh_B1 = jnp.min(jnp.where(keep_BV, sorted_BV, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits_BV >= thresh_B1, logits_BV, _MASKED)


def masked_logits(logits_BV: jax.Array, temperature: float, top_k: int = 0,
                  top_p: float = 1.0) -> jax.Array:
    """The logits of the distribution `sample_next` draws from (temperature > 0).

    Order as in HF transformers: temperature, then top-k, then top-p on the tempered,
    top-k-masked distribution.
    """
    x_BV = apply_temperature(logits_BV, temperature)
    x_BV = top_k_mask(x_BV, top_k)
    return top_p_mask(x_BV, top_p)


def sample_next(logits_BV: jax.Array, rng: jax.Array, temperature: float = 1.0,
                top_k: int = 0, top_p: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """Draw one token per row -> (token_B int32, logprob_B float32).

    logprob is the log-probability of the token under the distribution it was drawn from:
    log_softmax(masked_logits(logits / temperature)). Greedy (temperature == 0) ignores
    top_k / top_p and takes the argmax; its logprob is log_softmax(logits) at temperature 1
    (the limit distribution is a point mass with logprob 0, which carries no information; the
    temperature-1 value is what an RL trainer recomputes from the same policy).
    """
    logits_BV = logits_BV.astype(jnp.float32)
    if temperature == 0.0:
        token_B = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
        logp_BV = jax.nn.log_softmax(logits_BV, axis=-1)
    else:
        x_BV = masked_logits(logits_BV, temperature, top_k, top_p)
        token_B = jax.random.categorical(rng, x_BV, axis=-1).astype(jnp.int32)
        logp_BV = jax.nn.log_softmax(x_BV, axis=-1)
    logprob_B = jnp.take_along_axis(logp_BV, token_B[:, None], axis=-1)[:, 0]
    return token_B, logprob_B


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """A sampling strategy as a tiny frozen (hashable) dataclass: a jit-cache key."""
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        validate_sampling(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def get_next_tokens(self, logits_BV: jax.Array, rng: jax.Array):
        """-> (token_B, logprob_B); see `sample_next`."""
        return sample_next(logits_BV, rng, self.temperature, self.top_k, self.top_p)
