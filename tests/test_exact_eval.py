"""The exact eval (rl/exact_eval.py) against brute force: every response a sampler can draw
within max_new_tokens = 2, its probability from the uncached forward and its reward from the
task's own reward function. The exact score equals the mass of the answer then EOS or a
newline, is a lower bound of the expected reward, and the sampler's empirical reward rate
agrees with the enumerated expectation (so the probabilities are the sampler's)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numerics import assert_tree_close, permute_mlp, reorder_floor, tree_norm

from jaxrl_scale.data.rewards import exact_match
from jaxrl_scale.models import forward, get_config, init_params
from jaxrl_scale.models.tokenizer import CharTokenizer, decode_response
from jaxrl_scale.rl.exact_eval import answer_probability, answer_rows, end_tokens
from jaxrl_scale.rl.rollout import SamplingSettings, generate_rollout
from jaxrl_scale.sampling import SamplingConfig

PROMPTS = ("3+4=", "12-5=", "9+9=")
T = 0.2   # a sharp sampler: the answers the test model likes carry real mass


@pytest.fixture(scope="module")
def model():
    cfg = get_config("tiny")
    # larger init: peaked next-token distributions
    params = jax.tree.map(lambda a: a * 3.0 if a.ndim >= 2 else a, init_params(cfg, 1))
    return cfg, params


def _next_logp(cfg, params, prefixes):
    """log softmax(logits / T) of the next token after each prefix (equal lengths, unpadded)."""
    tok = jnp.asarray(prefixes, jnp.int32)
    return np.asarray(_last_logp(cfg, params, tok), np.float64)


@functools.partial(jax.jit, static_argnums=0)
def _last_logp(cfg, params, tok):
    logits = forward(cfg, params, tok, jnp.ones_like(tok, bool))[:, -1]
    return jax.nn.log_softmax(logits.astype(jnp.float32) / T)


@pytest.fixture(scope="module")
def examples(model):
    """Answers the test model likes (so they carry real mass): the first prompt's answer is
    its most likely printable character, the others' its most likely two characters."""
    cfg, params = model
    tok = CharTokenizer()
    ok = np.array([3 <= i < tok.vocab_size and not tok.decode([i]).isspace()
                   for i in range(cfg.vocab_size)])
    out = []
    for i, q in enumerate(PROMPTS):
        p = tok.encode(q)
        a = [int(np.argmax(np.where(ok, _next_logp(cfg, params, [p])[0], -np.inf)))]
        if i:
            a.append(int(np.argmax(np.where(ok, _next_logp(cfg, params, [p + a])[0],
                                            -np.inf))))
        out.append({"prompt": q, "answer": tok.decode(a)})
    return out


def _enumerate(cfg, params, tok, ex, M=2):
    """{response tuple: probability} over every response of <= M tokens (EOS ends one)."""
    p = tok.encode(ex["prompt"])
    V = cfg.vocab_size
    first = _next_logp(cfg, params, [p])[0]
    second = _next_logp(cfg, params, [p + [t] for t in range(V)])   # one batch of V rows
    probs = {}
    for t1 in range(V):
        if t1 == tok.eos_id:
            probs[(t1,)] = np.exp(first[t1])
            continue
        for t2 in range(V):
            probs[(t1, t2)] = np.exp(first[t1] + second[t1, t2])
    return probs


def _exact(cfg, params, tok, examples, M=2):
    return answer_probability(cfg, params, tok, examples, prompt_len=8, max_new_tokens=M,
                              temperature=T)


def test_exact_eval_equals_the_enumerated_answer_mass_and_bounds_the_expected_reward(
        model, examples):
    cfg, params = model
    tok = CharTokenizer()
    got = _exact(cfg, params, tok, examples)
    # rounding floor: the same forward with the MLP units permuted (the same model)
    floor = reorder_floor(got, _exact(cfg, permute_mlp(params), tok, examples))
    want, expected = [], []
    for ex in examples:
        probs = _enumerate(cfg, params, tok, ex)
        a = tok.encode(ex["answer"])
        if len(a) == 2:       # fills the cap: the bare answer (a truncated response) counts
            want.append(probs[tuple(a)])
        else:
            want.append(probs[(a[0], tok.eos_id)] + probs[(a[0], tok.encode("\n")[0])])
        expected.append(sum(pr * exact_match(decode_response(tok, r), ex)
                            for r, pr in probs.items()))
        assert abs(sum(probs.values()) - 1) < 1e-9 * len(probs)
    want, expected = np.array(want), np.array(expected)
    assert want[1:].min() > 0.01, want        # the two-character answers carry real mass
    assert_tree_close(got, want, floor, tree_norm(want))
    # a lower bound: " 7", "7 ", a pad before the answer are accepted and not counted
    assert np.all(got <= expected * (1 + 1e-5)), (got, expected)


def test_sampled_reward_rate_agrees_with_the_enumerated_expectation(model, examples):
    """The sampler's reward rate over many samples sits within 4 binomial SE of the
    enumerated expected reward, and the exact eval within 4 SE plus the uncounted mass."""
    cfg, params = model
    tok = CharTokenizer()
    ex = examples[1]
    probs = _enumerate(cfg, params, tok, ex)
    expected = sum(pr * exact_match(decode_response(tok, r), ex) for r, pr in probs.items())
    n = 16384
    r = generate_rollout(cfg, params, [ex], n, tok.encode, SamplingSettings(
        SamplingConfig(temperature=T, top_k=0, top_p=1.0), max_new_tokens=2, eos_id=tok.eos_id,
        pad_id=tok.pad_id, chunk=4096), seed=3)
    texts = [decode_response(tok, row[:int(k)]) for row, k in zip(r.tokens_BM, r.lengths_B)]
    rate = np.mean([exact_match(t, ex) for t in texts])
    se = np.sqrt(expected * (1 - expected) / n)
    assert abs(rate - expected) <= 4 * se, (rate, expected, se)
    assert expected > 0.01   # enough hits for the check to mean something
    got = _exact(cfg, params, tok, [ex])[0]
    assert got <= rate + 4 * se and got > 0.5 * expected, (got, rate, expected)


def test_answer_rows_layout():
    tok = CharTokenizer()
    ex = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "50+50=", "answer": "100"},
          {"prompt": "9+1=", "answer": " 10 "}, {"prompt": "500+500=", "answer": "1000"}]
    r = answer_rows(tok, ex, max_new_tokens=3)
    # "2": answer then EOS; "100" fills the cap: bare; " 10 " strips to "10"; "1000": no row
    assert r["owner_B"].tolist() == [0, 1, 2]
    assert r["answer_len_B"].tolist() == [1, 3, 2]
    assert r["terminated_B"].tolist() == [True, False, True]
    assert r["responses_BM"][0].tolist() == tok.encode("2") + [tok.eos_id, tok.pad_id]
    assert r["responses_BM"][1].tolist() == tok.encode("100")
    assert end_tokens(tok) == (tok.eos_id, tok.encode("\n")[0])
    cfg = get_config("tiny")
    p = answer_probability(cfg, init_params(cfg, 0), tok, ex, prompt_len=10,
                           max_new_tokens=3, temperature=1.0, chunk=2)   # 2 chunks, padded
    assert p[3] == 0.0 and np.all(p[:3] > 0)
    with pytest.raises(ValueError, match="temperature > 0"):
        answer_probability(cfg, None, tok, ex, prompt_len=10, max_new_tokens=3,
                           temperature=0.0)
