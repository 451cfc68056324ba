"""GRPO / PPO update steps: micro-batch invariance, noise-scale inputs, skipping, PPO critic."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numerics import (EPS32, assert_adam_step_close, assert_sqnorm_close, assert_sum_close,
                      assert_tree_close, reorder_floor, sqnorm_bound, tree_diff, tree_norm,
                      tree_tol)

from jaxrl_scale import optim
from jaxrl_scale.models import get_config, param_shapes
from jaxrl_scale.rl import losses, steps
from jaxrl_scale.rl.batch import check_shared_prompts, rollout_batch
from jaxrl_scale.rl.state import create_train_state
from jaxrl_scale.rl.value import critic_values, init_critic_from_actor

CFG = get_config("tiny")
B, TP, R = 16, 4, 8
LOSS_CFG = steps.LossConfig(temperature=0.7, clip_low=0.2, clip_high=0.28, dual_clip=3.0,
                            kl_coef=0.1, entropy_coef=0.01, agg="token-mean")


# XLA's CPU backend optimisations and fusion emitters dominate compile time for these tiny
# graphs (about 5x); the numbers checked here do not depend on them.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


def _copy(tree):
    """A fresh device copy (via the host: no per-shape eager compiles)."""
    return jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), tree)


def np_params(cfg, seed=0):
    """init_params' distribution (N(0, 0.02), unit norms, zero biases) drawn with numpy: the
    jitted threefry init alone takes longer to compile than these tests take to run."""
    rng = np.random.default_rng(seed)

    def make(path, shape):
        name = str(path[-1].key)
        if "norm" in name:
            return jnp.ones(shape, jnp.float32)
        if name.startswith("b"):
            return jnp.zeros(shape, jnp.float32)
        return jnp.asarray(0.02 * rng.normal(size=shape), jnp.float32)

    return jax.tree_util.tree_map_with_path(
        make, param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple))


GT = 2          # group size of the test batches: 16 rows = 8 groups, so M = 1, 2, 4, 8 work


def make_grpo_batch(seed=0, rows=B, shared_group=0):
    """Left-padded prompts of 1..TP tokens, responses of 1..R tokens (so rows differ in their
    valid-token counts), behaviour log-probs near the tiny model's uniform -log V, continuous
    rewards (no group has zero variance) and reference log-probs near the behaviour's.
    shared_group = G > 0: the G rows of each group share one prompt (a real rollout's layout)."""
    rng = np.random.default_rng(seed)
    plen = rng.integers(1, TP + 1, rows)
    rlen = rng.integers(1, R + 1, rows)
    rlen[0] = R
    prompts = [list(rng.integers(0, CFG.vocab_size, n)) for n in plen]
    if shared_group:
        prompts = [prompts[i - i % shared_group] for i in range(rows)]
    resp = rng.integers(0, CFG.vocab_size, (rows, R)).astype(np.int32)
    logp = -np.log(CFG.vocab_size) + 0.2 * rng.normal(size=(rows, R))
    batch, _ = rollout_batch(prompts, resp, logp, rlen, rng.normal(size=rows), prompt_len=TP,
                             pad_id=0, group_size=GT)
    ref = batch.old_logp_BT + 0.1 * rng.normal(size=(rows, TP + R))
    batch = batch.replace(ref_logp_BT=np.where(batch.loss_mask_BT, ref, 0.0).astype(np.float32))
    return jax.tree.map(jnp.asarray, batch)


def make_ppo_batch(seed=0, rows=B):
    rng = np.random.default_rng(seed + 1000)
    return make_grpo_batch(seed, rows).replace(
        rewards_B=jnp.asarray(rng.integers(0, 2, rows), jnp.float32))


def reordered(batch, group_size=GT, seed=1):
    """The batch with its prompt groups in another order: the same sums (every loss here is a
    token or sequence mean, advantages are per group), summed in another order."""
    n = batch.tokens_BT.shape[0]
    perm = np.random.default_rng(seed).permutation(n // group_size)
    rows = (perm[:, None] * group_size + np.arange(group_size)).reshape(-1)
    return jax.tree.map(lambda x: x[rows], batch)


def term_bounds(batch, group_size=GT, loss_cfg=LOSS_CFG, vocab=CFG.vocab_size):
    """Upper bounds on one token's term in each token-mean metric, for numerics.sum_bound:
    the clipped surrogate is at most max(1 + clip_high, dual_clip) |A|, an entropy at most
    log V, a clip indicator 1; KL terms of these near-uniform test policies stay below 1."""
    if group_size > 1:
        adv = np.abs(np.asarray(losses.group_advantages(batch.rewards_B, group_size,
                                                        estimator=loss_cfg.advantage))).max()
    else:        # PPO: GAE of rewards in {0, 1} against values below 1 in magnitude
        adv = 2.0
    pg = max(1 + loss_cfg.clip_high, loss_cfg.dual_clip or 0.0) * adv
    ent = float(np.log(vocab))
    return dict(pg_loss=pg, entropy=ent, kl=1.0, approx_kl=1.0, clipfrac=1.0, ratio_mean=2.0,
                actor_loss=pg + loss_cfg.kl_coef + loss_cfg.entropy_coef * ent, tokens=0.0)


def assert_metrics_close(got, want, batch, keys, group_size=GT, loss_cfg=LOSS_CFG,
                         vocab=CFG.vocab_size):
    """Token-mean metrics of two summation orders agree to Higham's bound over the batch's
    loss tokens (a dropped row moves them by about 1/16 of a term: far above it). A
    seq-mean-token-sum loss adds up to R tokens' terms per row before its mean."""
    n = int(np.asarray(batch.loss_mask_BT).sum())
    bounds = term_bounds(batch, group_size, loss_cfg, vocab)
    per_row = R if loss_cfg.agg == "seq-mean-token-sum" else 1
    for k in keys:
        assert_sum_close(got[k], want[k], n, bounds[k] * per_row)


def assert_norm_consistent(m, prefix, grads):
    """The step's squared gradient norm and its norm squared: two float32 sums of the same
    squares (or one, rounded twice) agree to twice the probabilistic bound."""
    n = sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(grads))
    sq = float(m[f"{prefix}_grad_sqnorm"])
    tol = 2 * sqnorm_bound(n, sq, 0.0) + 4 * EPS32 * sq
    assert abs(float(m[f"{prefix}_grad_norm"]) ** 2 - sq) <= tol


HP = optim.AdamHParams(lr=1e-3)
TX = optim.make_optimizer(HP, max_grad_norm=1.0)
CRITIC_LR = 1e-4
CRITIC_HP = optim.AdamHParams(lr=CRITIC_LR)
CTX = optim.make_optimizer(CRITIC_HP)  # the critic's own optimizer
LR_FN = functools.partial(optim.current_lr, HP, warmup_steps=0)


def ppo_reference(params, critic, batch):
    """ppo_fn(1) on the batch, and the rounding floors of its gradients over two reorderings
    of the batch's rows."""
    def run(b):
        return ppo_fn(1)(new_state(params), new_state(critic, CTX), b)
    a1, c1, m1 = run(batch)
    alts = [run(reordered(batch, 1, seed)) for seed in (1, 2)]
    floor = {k: reorder_floor(m1[k], *[m[k] for _, _, m in alts])
             for k in ("actor_grads", "critic_grads")}
    return a1, c1, m1, floor


def assert_ppo_step_close(got, want, params, critic):
    """Two PPO steps (actor, critic, metrics) from fresh states of params and critic: each
    network's params and Adam moments within the derived one-step bound of its gradients."""
    (a, c, m), (a_ref, c_ref, m_ref) = got, want
    assert_adam_step_close(a, a_ref, new_state(params), m["actor_grads"], m_ref["actor_grads"],
                           HP)
    assert_adam_step_close(c, c_ref, new_state(critic, CTX), m["critic_grads"],
                           m_ref["critic_grads"], CRITIC_HP)


def ppo_fn(M, states=None, mesh=None):
    if mesh is None:
        return _ppo_fn_cached(M)
    return steps.make_train_step(steps.ppo_step, states, mesh=mesh,
                                 compiler_options=FAST_COMPILE, cfg=CFG, actor_tx=TX,
                                 critic_tx=CTX, loss_cfg=LOSS_CFG, micro_batches=M,
                                 with_grads=True)


@functools.lru_cache(maxsize=None)
def _ppo_fn_cached(M):
    return steps.make_train_step(steps.ppo_step, donate=False, compiler_options=FAST_COMPILE,
                                 cfg=CFG, actor_tx=TX, critic_tx=CTX, loss_cfg=LOSS_CFG,
                                 micro_batches=M, with_grads=True)


@functools.lru_cache(maxsize=None)
def _grpo_fn(M, loss_cfg=LOSS_CFG, **kw):
    kw.setdefault("group_size", GT)
    return steps.make_train_step(steps.grpo_step, donate=False, compiler_options=FAST_COMPILE,
                                 cfg=CFG, tx=TX, loss_cfg=loss_cfg, micro_batches=M,
                                 lr_fn=LR_FN, with_grads=True, **kw)


def new_state(params, tx=None):
    """create_train_state, jitted once per optimizer (tx.init eagerly compiles per leaf)."""
    return _state_fn(TX if tx is None else tx)(_copy(params))


@functools.lru_cache(maxsize=None)
def _state_fn(tx):
    return jax.jit(lambda p: create_train_state(p, tx, 0), compiler_options=FAST_COMPILE)


def trace_grpo(params, batch, **kw):
    """Trace grpo_step without compiling it (its errors are raised while tracing)."""
    kw.setdefault("group_size", GT)
    return jax.eval_shape(lambda p, b: steps.grpo_step(create_train_state(p, TX, 0), b,
                                                       steps.StepOptions(cfg=CFG, tx=TX,
                                                                         loss_cfg=LOSS_CFG, **kw)),
                          params, batch)


def run_grpo(params, batches, M, **kw):
    state = new_state(params)
    fn = _grpo_fn(M, **kw)
    metrics = []
    for batch in batches:
        state, m = fn(state, batch)
        metrics.append(m)
    return state, metrics


def grpo_reference(params, batches, group_size=GT, **kw):
    """The M = 1 reference run and its rounding floors: the spread of the first step's
    gradients and of the final params over two reorderings of every batch's groups."""
    state, metrics = run_grpo(params, batches, 1, group_size=group_size, **kw)
    alts = [run_grpo(params, [reordered(b, group_size, seed) for b in batches], 1,
                     group_size=group_size, **kw) for seed in (1, 2)]
    floors = dict(grads=reorder_floor(metrics[0]["actor_grads"],
                                      *[m[0]["actor_grads"] for _, m in alts]),
                  params=reorder_floor(state.params, *[st.params for st, _ in alts]))
    return state, metrics, floors


def assert_grpo_steps_match(fn, state, batches, group_size=GT, **kw):
    """Runs `fn`, the GRPO step under test, over `batches` from `state`, and checks every
    step against the 1-device M = 1 reference taken from the same input state: gradients
    within that step's reordering floor (its groups in two other orders), params and Adam
    moments within the derived one-step bound (numerics.assert_adam_step_close). Returns
    the final state and the metrics of each step."""
    ref = _grpo_fn(1, group_size=group_size, **kw)
    metrics = []
    for batch in batches:
        prev = jax.device_get(state)                         # fn may donate `state`
        state, m = fn(state, batch)
        want_state, w = ref(prev, batch)
        g, g_want = m["actor_grads"], w["actor_grads"]
        floor = reorder_floor(g_want, *[ref(prev, reordered(batch, group_size, s))[1]["actor_grads"]
                                        for s in (1, 2)])
        assert_tree_close(g, g_want, floor, tree_norm(g_want))
        assert_adam_step_close(state, want_state, prev, g, g_want, HP)
        metrics.append((m, w))
    return state, metrics


@pytest.fixture(scope="module")
def params():
    return np_params(CFG, 0)


# ----------------------------------------------------------------------------- pure pieces


@pytest.mark.parametrize("agg", losses.AGG_MODES)
def test_token_weights_reproduce_aggregate(agg):
    rng = np.random.default_rng(1)
    mask = jnp.asarray(rng.random((6, 7)) < 0.5).at[2].set(False)   # an all-masked row
    x = jnp.asarray(rng.normal(size=(6, 7)), jnp.float32)
    w = steps.token_weights(mask, agg)
    assert_sum_close(jnp.sum(x * w), losses.aggregate(x, mask, agg), x.size,
                     float(jnp.sum(jnp.abs(x * w))))


def test_final_token_rewards():
    mask = jnp.array([[0, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]], jnp.float32)
    r = steps.final_token_rewards(jnp.array([2.0, 5.0, -1.0]), mask)
    np.testing.assert_array_equal(r, [[0, 0, 2, 0], [0, 0, 0, 0], [0, 0, 0, -1]])


def test_rollout_batch_layout_and_accounting():
    """Left-padded prompts, right-padded responses, behaviour log-probs on response tokens;
    a zero-variance group is kept in the arrays with an empty loss mask when filtered."""
    prompts = [[7], [3, 4], [7], [3, 4]]
    resp = np.array([[5, 6, 9], [8, 9, 9], [5, 6, 9], [8, 9, 9]])
    batch, acc = rollout_batch(prompts, resp, np.full((4, 3), -1.0), np.array([2, 1, 2, 1]),
                               np.array([1.0, 1.0, 0.0, 1.0]), prompt_len=2, pad_id=0,
                               group_size=2)
    np.testing.assert_array_equal(batch.tokens_BT[:2], [[0, 7, 5, 6, 0], [3, 4, 8, 0, 0]])
    np.testing.assert_array_equal(batch.valid_BT[:2], [[0, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    np.testing.assert_array_equal(batch.loss_mask_BT[:2], [[0, 0, 1, 1, 0], [0, 0, 1, 0, 0]])
    np.testing.assert_array_equal(batch.old_logp_BT[:2], [[0, 0, -1, -1, 0], [0, 0, -1, 0, 0]])
    assert acc == {"retained": 4, "generated": 4, "zero_var_groups": 1}
    filt, acc = rollout_batch(prompts, resp, np.full((4, 3), -1.0), np.array([2, 1, 2, 1]),
                              np.array([1.0, 1.0, 0.0, 1.0]), prompt_len=2, pad_id=0,
                              group_size=2, filter_zero_variance=True)
    assert acc == {"retained": 2, "generated": 4, "zero_var_groups": 1}
    assert not filt.loss_mask_BT[:2].any()
    np.testing.assert_array_equal(filt.loss_mask_BT[2:], batch.loss_mask_BT[2:])
    np.testing.assert_array_equal(filt.tokens_BT, batch.tokens_BT)
    with pytest.raises(ValueError, match="group_size=3"):
        rollout_batch(prompts, resp, np.zeros((4, 3)), np.ones(4, int), np.zeros(4),
                      prompt_len=2, pad_id=0, group_size=3)


def test_grpo_step_computes_group_advantages(params):
    """The step's advantages are losses.group_advantages of the rewards: scaling the rewards
    of one group (grpo's per-group standardisation) leaves the update unchanged, while the
    mean-only drgrpo estimator scales that group's share."""
    batch = make_grpo_batch(0)
    scaled = batch.replace(rewards_B=batch.rewards_B.at[:2].multiply(5.0))
    _, (m,), floor = grpo_reference(params, [batch])
    _, (m_s,) = run_grpo(params, [scaled], 1)
    # A = (r - mean) / (std + 1e-6): scaling the group's std by 5 moves its advantages by
    # 0.8e-6 / std relative, and the gradient (linear in A) by at most that fraction of |g|
    std = float(np.std(np.asarray(batch.rewards_B[:2]), ddof=1))
    g = m["actor_grads"]
    assert_tree_close(m_s["actor_grads"], g,
                      floor["grads"] + 0.8e-6 / std * tree_norm(g) / 8, tree_norm(g))
    dr = dataclasses.replace(LOSS_CFG, advantage="drgrpo")
    _, (d,) = run_grpo(params, [batch], 1, loss_cfg=dr)
    _, (d_s,) = run_grpo(params, [scaled], 1, loss_cfg=dr)
    assert tree_diff(d_s["actor_grads"], d["actor_grads"]) > 1e-3 * tree_norm(d["actor_grads"])
    with pytest.raises(ValueError, match="advantage"):
        steps.LossConfig(advantage="foo")


def test_critic_copies_trunk(params):
    critic = init_critic_from_actor(params, jax.random.PRNGKey(1))
    assert set(critic) == {"embed", "layers", "final_norm", "value_w", "value_b"}
    np.testing.assert_array_equal(critic["layers"]["wq"], params["layers"]["wq"])
    assert critic["embed"].unsafe_buffer_pointer() != params["embed"].unsafe_buffer_pointer()
    assert critic["value_w"].shape == (CFG.hidden_size,) and critic["value_b"].shape == ()


# ----------------------------------------------------------------------------- micro-batches


def test_micro_batch_count_does_not_change_update(params):
    batches = [make_grpo_batch(s) for s in range(3)]
    for M in (2, 4, 8):
        state, steps_m = assert_grpo_steps_match(_grpo_fn(M), new_state(params), batches)
        m, m1 = steps_m[0]
        assert m["actor_grad_sqnorm_micro"].shape == (M,)
        assert_metrics_close(m, m1, batches[0],
                             ("actor_loss", "pg_loss", "clipfrac", "approx_kl", "entropy", "kl"))
        assert int(state.step) == 3
    # The ratio differs from 1 and the clips are active, so the test exercises them.
    assert float(m1["clipfrac"]) > 0
    np.testing.assert_allclose(m1["lr"], HP.lr)
    assert_norm_consistent(m1, "actor", m1["actor_grads"])


def test_micro_batch_sqnorm_is_its_own_loss_gradient(params):
    """grad_sqnorm_micro[m] = |grad of the loss micro-batch m would give on its own|^2."""
    batch = make_grpo_batch(0)
    _, (m4,) = run_grpo(params, [batch], 4)
    # Micro-batch 1 holds groups 1 and 5 (rows 2, 3, 10, 11). Tiling them 4x keeps the
    # token-mean loss (and its gradient) of that micro-batch alone, its groups and so their
    # advantages, at the full batch shape (no new compile).
    rows = np.array([2, 3, 10, 11])
    sub = jax.tree.map(lambda x: jnp.tile(x[rows], (4,) + (1,) * (x.ndim - 1)), batch)
    _, (m_sub,), floor = grpo_reference(params, [sub])
    assert_sqnorm_close(m4["actor_grad_sqnorm_micro"][1], m_sub["actor_grads"], floor["grads"])
    assert_norm_consistent(m4, "actor", m_sub["actor_grads"])


def test_micro_batches_hold_whole_groups(params):
    """With group_size G, micro-batch m holds prompt groups m, m + M, ... whole: its squared
    gradient norm equals that of those groups' loss computed alone, and the summed update
    still equals the full-batch one."""
    G, M = 4, 2                                    # 16 rows = 4 groups of 4; 2 micro-batches
    batch = make_grpo_batch(0)
    _, (m2,) = run_grpo(params, [batch], M, group_size=G)
    _, (m1,), floor = grpo_reference(params, [batch], group_size=G)
    g1 = m1["actor_grads"]
    assert_tree_close(m2["actor_grads"], g1, floor["grads"], tree_norm(g1))
    groups = np.arange(B).reshape(-1, G)            # row indices of each group
    for m in range(M):
        rows = groups[m::M].reshape(-1)             # micro-batch m: groups m, m + M
        assert len(set(rows // G)) == B // G // M   # whole groups, no row of another group
        # Tiling the groups M times keeps their token-mean loss at the full batch shape.
        sub = jax.tree.map(lambda x: jnp.tile(x[rows], (M,) + (1,) * (x.ndim - 1)), batch)
        _, (alone,), floor = grpo_reference(params, [sub], group_size=G)
        assert_sqnorm_close(m2["actor_grad_sqnorm_micro"][m], alone["actor_grads"],
                            floor["grads"])
    with pytest.raises(ValueError, match="micro_batches=3"):
        trace_grpo(params, batch, micro_batches=3, group_size=G)


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "seq-mean-token-sum"])
def test_seq_mean_modes_micro_batch_invariant(params, agg):
    loss_cfg = dataclasses.replace(LOSS_CFG, agg=agg)
    batch = make_grpo_batch(0)
    batch = batch.replace(loss_mask_BT=batch.loss_mask_BT.at[5].set(False))   # an empty row

    _, (m1,), floor = grpo_reference(params, [batch], loss_cfg=loss_cfg)
    _, (m4,) = run_grpo(params, [batch], 4, loss_cfg=loss_cfg)
    g1 = m1["actor_grads"]
    assert_tree_close(m4["actor_grads"], g1, floor["grads"], tree_norm(g1))
    # the loss is a cancelling sum (|loss| ~ 3e-3 of O(1) terms): Higham's bound over its terms
    assert_metrics_close(m4, m1, batch, ("actor_loss",), loss_cfg=loss_cfg)
    # Tiling micro-batch 1's groups keeps its seq-mean loss: its own gradient at full shape.
    rows = np.array([2, 3, 10, 11])
    sub = jax.tree.map(lambda x: jnp.tile(x[rows], (4,) + (1,) * (x.ndim - 1)), batch)
    _, (m_sub,), floor = grpo_reference(params, [sub], loss_cfg=loss_cfg)
    assert_sqnorm_close(m4["actor_grad_sqnorm_micro"][1], m_sub["actor_grads"], floor["grads"])


def test_nonfinite_gradient_skips_update(params):
    batch = make_grpo_batch(0)
    batch = batch.replace(rewards_B=batch.rewards_B.at[3].set(jnp.nan))
    state, (m,) = run_grpo(params, [batch], 1)
    assert int(m["actor_nonfinite_count"]) == 1
    assert not np.isfinite(float(m["actor_grad_norm"]))
    for a, b in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(params)):
        np.testing.assert_array_equal(a, b)
    # The next finite batch updates normally; the counter keeps the skipped one.
    state, m = _grpo_fn(1)(state, make_grpo_batch(1))
    assert int(m["actor_nonfinite_count"]) == 1 and int(state.step) == 2
    assert tree_diff(state.params, params) > 0


def test_score_tokens_matches_step_logprobs(params):
    """Behaviour log-probs scored at the sampler's temperature give ratio 1 (no clipping)."""
    batch = make_grpo_batch(0)
    logp = steps.score_tokens(CFG, params, batch.tokens_BT, batch.valid_BT,
                              temperature=LOSS_CFG.temperature, micro_batches=2)
    batch = batch.replace(old_logp_BT=jnp.where(batch.loss_mask_BT, logp, 0.0))
    _, (m,) = run_grpo(params, [batch], 1)
    np.testing.assert_allclose(m["ratio_mean"], 1.0, atol=1e-5)
    assert float(m["clipfrac"]) == 0.0 and abs(float(m["approx_kl"])) < 1e-6


def test_minibatches_and_epochs(params):
    state, (m,) = run_grpo(params, [make_grpo_batch(0)], 1, num_minibatches=2, epochs=2)
    assert int(state.step) == 4
    assert m["actor_loss"].shape == (4,) and m["actor_grad_sqnorm_micro"].shape == (4, 1)
    assert np.all(np.isfinite(m["actor_loss"]))


def test_bad_micro_batch_count_and_missing_reference(params):
    with pytest.raises(ValueError, match="micro_batches=3"):
        trace_grpo(params, make_grpo_batch(0), micro_batches=3)
    with pytest.raises(ValueError, match="ref_logp_BT"):
        trace_grpo(params, make_grpo_batch(0).replace(ref_logp_BT=None))


# ----------------------------------------------------------------------------- PPO


def test_ppo_step_micro_batch_invariant_and_updates_critic(params):
    critic = init_critic_from_actor(params, jax.random.PRNGKey(1))
    batch = make_ppo_batch(0)
    a1, c1, m1, floor = ppo_reference(params, critic, batch)
    a4, c4, m4 = ppo_fn(4)(new_state(params), new_state(critic, CTX), batch)
    for k in ("actor_grads", "critic_grads"):
        assert_tree_close(m4[k], m1[k], floor[k], tree_norm(m1[k]))
    assert tree_norm(m1["critic_grads"]["layers"]) > 0       # the trunk learns through the head
    n = int(np.asarray(batch.loss_mask_BT).sum())
    # value loss terms 0.5 (v - R)^2 with rewards in {0, 1} and |v| < 1: below 2
    assert_sum_close(m4["critic_loss"], m1["critic_loss"], n, 2.0)
    assert_metrics_close(m4, m1, batch, ("actor_loss",), group_size=1)
    for k in ("actor_grad_norm", "critic_grad_norm", "vf_clipfrac", "value_mean"):
        assert np.isfinite(float(m1[k])), k
    assert_ppo_step_close((a4, c4, m4), (a1, c1, m1), params, critic)
    # The critic moved towards the returns: its loss on the same batch fell.
    @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
    def vloss(cp, critic):
        v = critic_values(CFG, cp, batch.tokens_BT, batch.valid_BT)[:, :-1]
        adv = steps.ppo_advantages(CFG, critic, batch, LOSS_CFG)
        return losses.value_loss(v, adv["values_BS"], adv["returns_BS"], adv["mask_BS"],
                                 clip=None)[0]
    assert float(vloss(c1.params, critic)) < float(vloss(critic, critic))


def test_ppo_critic_has_its_own_schedule(params):
    """critic_minibatches=2: the critic takes 2 Adam updates on the two row splits (rows
    0, 2, 4, ... then 1, 3, 5, ...: microbatch.split_rows), as a manual loop of single updates
    does; the actor's update is the 1-update one (GAE reads the pre-update critic)."""
    critic = init_critic_from_actor(params, jax.random.PRNGKey(1))
    batch = make_ppo_batch(0)
    one = _ppo_fn_cached(1)(new_state(params), new_state(critic, CTX), batch)
    two = steps.make_train_step(steps.ppo_step, donate=False, compiler_options=FAST_COMPILE,
                                cfg=CFG, actor_tx=TX, critic_tx=CTX, loss_cfg=LOSS_CFG,
                                critic_minibatches=2, with_grads=True)(
        new_state(params), new_state(critic, CTX), batch)
    # two compiled programs: the actor's step equal up to float32 rounding
    _, _, _, floor = ppo_reference(params, critic, batch)
    assert_tree_close(two[2]["actor_grads"], one[2]["actor_grads"], floor["actor_grads"],
                      tree_norm(one[2]["actor_grads"]))
    assert_adam_step_close(two[0], one[0], new_state(params), two[2]["actor_grads"],
                           one[2]["actor_grads"], HP)
    assert np.shape(two[2]["critic_loss"]) == (2,) and np.shape(two[2]["actor_loss"]) == ()
    # the same two updates by hand: GAE from the pre-update critic, then the splits in order
    gae = steps.ppo_advantages(CFG, critic, batch, LOSS_CFG)
    data = dict(tokens_BT=batch.tokens_BT, valid_BT=batch.valid_BT, mask_BS=gae["mask_BS"],
                old_values_BS=gae["values_BS"], returns_BS=gae["returns_BS"])
    upd = jax.jit(functools.partial(steps._critic_update, o=steps.StepOptions(
        CFG, TX, LOSS_CFG, critic_tx=CTX)))
    def by_hand(data):
        state, B = new_state(critic, CTX), batch.tokens_BT.shape[0]
        for half in (slice(0, B, 2), slice(1, B, 2)):
            state, _ = upd(state, jax.tree.map(lambda x: x[half], data))
        return state.params

    def reorder_within_splits(seed):     # rows 2i stay even, 2i + 1 odd: the same two splits
        p = np.random.default_rng(seed).permutation(batch.tokens_BT.shape[0] // 2)
        return jax.tree.map(lambda x: x[np.stack([2 * p, 2 * p + 1], 1).reshape(-1)], data)

    want = by_hand(data)
    floor = reorder_floor(want, *[by_hand(reorder_within_splits(s)) for s in (1, 2)])
    assert_tree_close(two[1].params, want, floor, tree_diff(want, critic))


def test_float32_master_params_with_bfloat16_compute(params):
    """The accelerator presets' policy (param_dtype float32, dtype bfloat16): Adam keeps float32
    weights and moments, and the bf16 update stays close to the all-float32 one."""
    assert all(get_config(n).param_dtype == "float32" and get_config(n).dtype == "bfloat16"
               for n in ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen3-0.6b", "qwen3-1.7b"))
    cfg16 = CFG.replace(dtype="bfloat16")
    batch = make_grpo_batch(5)
    out = {}
    for name, cfg in (("f32", CFG), ("bf16", cfg16)):
        fn = steps.make_train_step(steps.grpo_step, donate=False, compiler_options=FAST_COMPILE,
                                   cfg=cfg, tx=TX, loss_cfg=LOSS_CFG, with_grads=True,
                                   group_size=GT)
        out[name] = fn(new_state(params), batch)
    state16, m16 = out["bf16"]
    leaves = jax.tree_util.tree_leaves((state16.params, state16.opt_state))
    assert all(x.dtype in (jnp.float32, jnp.int32) for x in leaves)
    g32, g16 = (np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in
                                jax.tree_util.tree_leaves(out[n][1]["actor_grads"])])
                for n in ("f32", "bf16"))
    cos = g32 @ g16 / np.linalg.norm(g32) / np.linalg.norm(g16)
    assert cos > 0.99, cos
    moved = tree_diff(state16.params, params)
    assert 0 < moved and np.isfinite(moved)


def test_decoupled_objective_in_the_step(params):
    """batch.prox_logp_BT (off-policy rollouts) switches the actor to decoupled PPO: prox equal
    to the behaviour log-probs is plain PPO (to float rounding of another graph); another prox changes the gradient to the
    importance-weighted, prox-centred surrogate, the same for 1 and 4 micro-batches."""
    batch = make_grpo_batch(3)
    plain = _grpo_fn(1)(new_state(params), batch)[1]["actor_grads"]
    same = _grpo_fn(1)(new_state(params), batch.replace(prox_logp_BT=batch.old_logp_BT))
    _, _, floor = grpo_reference(params, [batch])
    assert_tree_close(same[1]["actor_grads"], plain, floor["grads"], tree_norm(plain))
    rng = np.random.default_rng(0)
    prox = jnp.where(batch.loss_mask_BT,
                     batch.old_logp_BT + 0.3 * rng.normal(size=batch.old_logp_BT.shape), 0.0)
    g = {M: _grpo_fn(M)(new_state(params), batch.replace(prox_logp_BT=prox.astype(jnp.float32)))
         [1]["actor_grads"] for M in (1, 4)}
    assert tree_diff(g[1], plain) > 1e-3 * tree_norm(plain)
    with_prox = batch.replace(prox_logp_BT=prox.astype(jnp.float32))
    _, _, floor_prox = grpo_reference(params, [with_prox])
    assert_tree_close(g[4], g[1], floor_prox["grads"], tree_norm(g[1]))
    # The step's policy term is policy_loss with prox (the other terms, entropy and KL, do
    # not depend on prox, so they cancel in the difference to the plain step).
    delta = jax.tree.map(lambda a, b: a - b, g[1], plain)
    grad = jax.jit(jax.grad(_surrogate), static_argnums=3)
    ref_delta = jax.tree.map(lambda a, b: a - b, grad(params, batch, prox[:, 1:], True),
                             grad(params, batch, prox[:, 1:], False))
    # delta is a difference of two step gradients: each carries its own rounding
    assert_tree_close(delta, ref_delta, floor["grads"] + floor_prox["grads"], tree_norm(ref_delta))
    # LossConfig.decoupled without prox_logp_BT: the proximal policy is the params being
    # updated, the same as scoring them first and passing the scores as prox.
    scored = steps.score_tokens(CFG, params, batch.tokens_BT, batch.valid_BT,
                                temperature=LOSS_CFG.temperature)
    scored = jnp.where(batch.loss_mask_BT, scored, 0.0)
    g_scored = _grpo_fn(1)(new_state(params), batch.replace(prox_logp_BT=scored))
    g_auto = _grpo_fn(1, dataclasses.replace(LOSS_CFG, decoupled=True))(new_state(params), batch)
    assert_tree_close(g_auto[1]["actor_grads"], g_scored[1]["actor_grads"], floor["grads"],
                      tree_norm(g_scored[1]["actor_grads"]))
    np.testing.assert_allclose(g_auto[1]["ratio_mean"], 1.0, rtol=1e-6)
    assert tree_diff(g_auto[1]["actor_grads"], plain) > 1e-4 * tree_norm(plain)


def _surrogate(p, batch, prox_BS, use_prox):
    mask_BS = batch.loss_mask_BT[:, 1:]
    prox_BS = prox_BS if use_prox else None
    logits = steps.forward(CFG, p, batch.tokens_BT, batch.valid_BT)[:, :-1]
    logp = losses.token_logprobs(logits, batch.tokens_BT[:, 1:], LOSS_CFG.temperature)
    adv = steps._grpo_advantages_BS(batch, GT, LOSS_CFG.advantage)
    return losses.policy_loss(logp, batch.old_logp_BT[:, 1:], adv, mask_BS,
                              clip_low=LOSS_CFG.clip_low, clip_high=LOSS_CFG.clip_high,
                              dual_clip=LOSS_CFG.dual_clip, agg=LOSS_CFG.agg,
                              prox_logp_BT=prox_BS)[0]


@pytest.mark.parametrize("M", [1, 2])
def test_shared_prompt_update_equals_every_row(params, M):
    """shared_prompt_len runs each group's prompt once: the same loss, metrics, gradients
    and update as scoring every row, with or without micro-batches."""
    G = 4
    batch = make_grpo_batch(0, shared_group=G)
    check_shared_prompts(batch, TP, G)
    state_f, (m_f,) = run_grpo(params, [batch], M, group_size=G)
    state_s, (m_s,) = run_grpo(params, [batch], M, group_size=G, shared_prompt_len=TP)
    _, _, floor = grpo_reference(params, [batch], group_size=G)
    assert_metrics_close(m_s, m_f, batch, ("actor_loss", "pg_loss", "clipfrac", "approx_kl",
                                           "entropy", "kl", "tokens"), group_size=G)
    g = m_f["actor_grads"]
    assert_tree_close(m_s["actor_grads"], g, floor["grads"], tree_norm(g))
    grad_tol = tree_tol(floor["grads"], tree_norm(g))
    n = sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(g))
    for got, want in zip(m_s["actor_grad_sqnorm_micro"], m_f["actor_grad_sqnorm_micro"]):
        # two float32 sums of squares, of gradients each within grad_tol of the truth
        want = float(want)
        tol = 2 * sqnorm_bound(n, want, grad_tol)
        assert abs(float(got) - want) <= tol
    assert_adam_step_close(state_s, state_f, new_state(params), m_s["actor_grads"], g, HP)


def test_shared_prompt_preconditions(params):
    batch = make_grpo_batch(0)                       # every row has its own prompt
    with pytest.raises(ValueError, match=r"group 0 \(rows 0\.\.3\) has different prompts"):
        check_shared_prompts(batch, TP, 4)
    # minibatches hold whole groups (microbatch.multi_update): the shared prompt works with
    # them (tests/test_updates_per_rollout.py); one that would split a group is refused
    with pytest.raises(ValueError, match="num_minibatches=3"):
        trace_grpo(params, make_grpo_batch(0, shared_group=4), group_size=4,
                   shared_prompt_len=TP, num_minibatches=3)
