"""Token-budget micro-batches: packed rows give each sequence's own hidden
states; the plan keeps groups whole and every token once; the packed GRPO update equals the
padded one; 8 devices equal 1."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numerics import EPS32, assert_tree_close, tree_diff
from test_steps import (CFG, GT, LOSS_CFG, LR_FN, R, TP, TX,
                        assert_metrics_close, grpo_reference, make_grpo_batch, new_state,
                        np_params, run_grpo)

from jaxrl_scale import sharding as shd
from jaxrl_scale.models.decoder import forward, hidden_states, logits_from_hidden
from jaxrl_scale.models.packing import segment_positions
from jaxrl_scale.rl import steps
from jaxrl_scale.rl.packed import PackedGRPO, min_budget, plan_packing
from jaxrl_scale.rl.state import state_shardings

T = TP + R


@pytest.fixture(scope="module")
def params():
    return np_params(CFG, 0)


def test_segment_positions_restart_per_sequence():
    seg = jnp.asarray([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(segment_positions(seg),
                                  [[0, 1, 2, 0, 1, 0, 0, 1], [0, 1, 2, 3, 4, 5, 6, 7]])


def test_a_packed_row_gives_each_sequence_its_own_logits(params):
    """Three sequences end to end in one row of 16 (padding after them) against each alone in
    a row of its own: the same logits at every token. Masked keys add exact zeros to the
    softmax, so both sides sum the same nonzero terms; only the matmuls' blocking may differ
    (float32: a few ulps of the largest logit, bounded by 64 eps here)."""
    rng = np.random.default_rng(0)
    seqs = [rng.integers(1, CFG.vocab_size, n) for n in (5, 3, 6)]
    row = np.zeros((1, 16), np.int32)
    seg = np.zeros((1, 16), np.int32)
    at = 0
    for k, s in enumerate(seqs, 1):
        row[0, at:at + s.size], seg[0, at:at + s.size] = s, k
        at += s.size
    packed = np.asarray(logits_from_hidden(CFG, params, hidden_states(
        CFG, params, jnp.asarray(row), segment_ids_BT=jnp.asarray(seg))))
    blocked = np.asarray(logits_from_hidden(CFG, params, hidden_states(
        CFG, params, jnp.asarray(row), segment_ids_BT=jnp.asarray(seg), window=8)))
    # blocks of 8 (every sequence <= 8): the same scores kept, attended in 2 x 8 windows
    np.testing.assert_allclose(blocked, packed, rtol=0, atol=64 * EPS32 * np.abs(packed).max())
    at = 0
    for s in seqs:
        alone = np.asarray(forward(CFG, params, jnp.asarray(s[None], jnp.int32)))[0]
        scale = np.abs(alone).max()
        np.testing.assert_allclose(packed[0, at:at + s.size], alone, rtol=0,
                                   atol=64 * EPS32 * scale)
        at += s.size


def test_plan_keeps_groups_whole_and_every_token_once():
    batch = make_grpo_batch(3)
    valid = np.asarray(batch.valid_BT)
    keep = np.ones(len(valid), bool)
    keep[4:6] = False                       # a filtered group: left out
    plan = plan_packing(valid, keep, GT, rows=2, budget=2 * T)
    src = plan.src_MDL[plan.src_MDL >= 0]
    want = np.concatenate([b * T + np.flatnonzero(valid[b]) for b in np.flatnonzero(keep)])
    np.testing.assert_array_equal(np.sort(src), np.sort(want))   # every kept token once
    for m in range(plan.micro_batches):
        rows_m = set(plan.src_MDL[m][plan.src_MDL[m] >= 0] // T)
        for g in {b // GT for b in rows_m}:   # a group's kept rows all in this micro-batch
            assert {g * GT + j for j in range(GT) if keep[g * GT + j]} <= rows_m
    assert (plan.seg_MDL > 0).sum(axis=-1).max() <= 2 * T
    assert plan.micro_batches < len(valid) // GT        # packing: fewer than one group each
    with pytest.raises(ValueError, match="does not fit"):
        plan_packing(valid, keep, 4, rows=1, budget=T)
    assert min_budget(T, 4, 1) == 4 * T and min_budget(T, 2, 8) == T


def _options(loss_cfg=LOSS_CFG, **kw):
    return steps.StepOptions(cfg=CFG, tx=TX, loss_cfg=loss_cfg, group_size=GT, lr_fn=LR_FN,
                             **kw)


def _run_packed(params, batches, budget, mesh=None, **kw):
    update = PackedGRPO(_options(**kw), budget, mesh)
    state = new_state(params)
    if mesh is not None:
        state = jax.device_put(state, state_shardings(mesh, state))
    metrics = []
    for b in batches:
        state, m = update(state, b)
        metrics.append(m)
    return state, metrics


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_packed_update_equals_padded(params, agg):
    """Three updates, packed (rows of 2T tokens) vs padded (M = 1): params within the padded
    step's own rounding floor (its spread over reorderings of the groups), the metrics within
    their summation bounds; one batch has a filtered group (empty mask)."""
    lc = dataclasses.replace(LOSS_CFG, agg=agg)
    batches = [make_grpo_batch(s) for s in range(3)]
    batches[1] = batches[1].replace(loss_mask_BT=batches[1].loss_mask_BT.at[:GT].set(False))
    state1, m1, floor = grpo_reference(params, batches, loss_cfg=lc)
    state, m = _run_packed(params, batches, 2 * T, loss_cfg=lc)
    update_norm = tree_diff(state1.params, params)
    assert_tree_close(state.params, state1.params, 2 * floor["params"], update_norm)
    for got, want, b in zip(m, m1, batches):
        assert_metrics_close(got, want, b, ("actor_loss", "pg_loss", "clipfrac", "approx_kl",
                                            "entropy", "kl"), loss_cfg=lc)
        assert got["tokens"] == float(want["tokens"])
        assert got["packed_microbatches"] >= 1 and 0 <= got["pad_frac"] < 1
    assert int(state.step) == 3 and float(m[0]["actor_grad_norm"]) > 0
    assert "actor_grad_sqnorm_micro" not in m[0]


def test_packed_on_8_devices_equals_1(params):
    """Rows of a micro-batch over 8 data-parallel devices (one packed row each) vs one
    device: the same update to the padded step's rounding floor."""
    batches = [make_grpo_batch(s) for s in range(2)]
    _, _, floor = grpo_reference(params, batches)
    one, _ = _run_packed(params, batches, 2 * T)   # one row per micro-batch: a group needs 2T
    mesh = shd.make_mesh(data=8)
    eight, m8 = _run_packed(params, batches, T, mesh=mesh)
    assert_tree_close(jax.device_get(eight.params), one.params, 2 * floor["params"],
                      tree_diff(one.params, params))
    assert m8[0]["packed_microbatches"] >= 1


def test_two_updates_per_rollout_packed(params):
    """num_minibatches = 2: each minibatch (groups 0, 2, ... then 1, 3, ...) weighted and
    packed alone: the padded two-update step's params."""
    batches = [make_grpo_batch(4)]
    padded, pm = run_grpo(params, batches, 1, num_minibatches=2)
    _, _, floor = grpo_reference(params, batches)
    state, m = _run_packed(params, batches, 2 * T, num_minibatches=2)
    assert_tree_close(state.params, padded.params, 4 * floor["params"],
                      tree_diff(padded.params, params))
    assert np.shape(m[0]["actor_loss"]) == (2,) and int(state.step) == 2


def test_a_run_with_a_token_budget(tmp_path):
    """jaxrl-train's loop with --token_budget: it trains (the same `responses` series as the
    padded run, updates 1, 2) and logs how it packed."""
    import json
    import os
    from test_updates_per_rollout import _cfg
    from jaxrl_scale.experiment.train import run_training
    # a reward a random tiny model earns unevenly, so the advantages (and gradients) are not 0
    cfg = _cfg(tmp_path / "packed", str(tmp_path / "data"), token_budget=256,
               reward_fn="test_train:_digit_share")
    run_training(cfg, progress=False)
    with open(os.path.join(cfg.run_dir, "metrics.jsonl")) as f:
        recs = [r for r in map(json.loads, f) if r["step"] > 0 and "score" not in r]
    assert [r["updates"] for r in recs] == [1, 2]
    assert [r["responses"] for r in recs] == [16, 32]
    for r in recs:
        assert r["packed_microbatches"] >= 1 and 0 <= r["pad_frac"] < 1
        assert r["actor_grad_norm"] > 0 and r["tokens"] > 0


@pytest.mark.parametrize("kw, field", [
    (dict(token_budget=-1), "token_budget"),
    (dict(token_budget=64, algo="ppo", group_size=1), "algo"),
    (dict(token_budget=64, ratio_level="sequence"), "ratio_level"),
    (dict(token_budget=64, lora_rank=4), "lora_rank"),
    (dict(token_budget=64, micro_batches=2), "micro_batches"),
    (dict(token_budget=16, max_prompt_len=8, max_new_tokens=8), "token_budget"),
])
def test_bad_token_budgets_name_the_field(kw, field):
    from jaxrl_scale.experiment.config import ConfigError, TrainConfig, validate
    with pytest.raises(ConfigError) as e:
        validate(TrainConfig.make(**kw), data_parallel=1)
    assert e.value.field == field and "\n" not in str(e.value)


def test_a_filtered_minibatch_makes_no_packed_update(params):
    """num_minibatches = 2 with every group of minibatch 1 filtered: the packed update skips
    it as the padded one does (one optimizer step, empty_minibatch flags 0, 1)."""
    batch = make_grpo_batch(5)
    mask = np.asarray(batch.loss_mask_BT).copy()
    for g in range(1, len(mask) // GT, 2):     # minibatch 1 = groups 1, 3, 5, 7
        mask[g * GT:(g + 1) * GT] = False
    batch = batch.replace(loss_mask_BT=jnp.asarray(mask))
    padded, pm = run_grpo(params, [batch], 1, num_minibatches=2)
    state, m = _run_packed(params, [batch], 2 * T, num_minibatches=2)
    assert int(state.step) == int(padded.step) == 1
    np.testing.assert_array_equal(m[0]["empty_minibatch"], [0.0, 1.0])
    np.testing.assert_array_equal(np.asarray(pm[0]["empty_minibatch"]), [0.0, 1.0])
    _, _, floor = grpo_reference(params, [batch])
    assert_tree_close(state.params, padded.params, 4 * floor["params"],
                      tree_diff(padded.params, params))
