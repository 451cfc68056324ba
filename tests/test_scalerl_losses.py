"""The ScaleRL / DAPO loss pieces (docs/science.md, Losses and advantages): CISPO, the
advantage norm, prompt-level aggregation, overlong filtering and the soft overlong
punishment, each against a hand computation of its formula; one update step with each on; one
tiny run with all of them (and --pass_k) on; their flags' one-line refusals."""
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose

from numerics import tree_diff, tree_norm
from test_steps import CFG, GT, _grpo_fn, make_grpo_batch, new_state, np_params

from jaxrl_scale.experiment.config import TrainConfig, validate
from jaxrl_scale.experiment.errors import ConfigError
from jaxrl_scale.rl import losses, steps
from jaxrl_scale.rl.batch import overlong_reward, rollout_batch, truncated_rows

PLAIN = steps.LossConfig(clip_low=0.2, clip_high=0.28, agg="token-mean")   # no KL / entropy


@pytest.fixture(scope="module")
def params():
    return np_params(CFG, 0)


# ----------------------------------------------------------------------------- CISPO

LOGP = np.array([[-1.0, -2.0, -0.5], [-0.3, -1.2, -3.0]], np.float32)
OLD = np.array([[-1.5, -1.0, -0.5], [-2.0, -1.2, -1.0]], np.float32)
ADV = np.array([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]], np.float32)
MASK = np.array([[1, 1, 1], [1, 1, 0]], np.float32)


def test_cispo_loss_and_gradient_by_hand():
    """L = -sg(min(r, 1 + eps)) A logp, token-mean: the ratios are e^0.5, e^-1, 1, e^1.7, 1
    (the sixth token is masked); with eps = 0.5 the first and fourth weights are capped at
    1.5. The gradient in logp is -min(r, 1.5) A / 5 (the weight is held constant)."""
    w = np.array([[1.5, math.exp(-1.0), 1.0], [1.5, 1.0, 0.0]])
    want = -(w * ADV * LOGP * MASK).sum() / 5
    loss, met = losses.policy_loss(LOGP, OLD, ADV, MASK, objective="cispo", cispo_eps_high=0.5)
    assert_allclose(loss, want, rtol=1e-6)
    g = jax.grad(lambda lp: losses.policy_loss(lp, OLD, ADV, MASK, objective="cispo",
                                               cispo_eps_high=0.5)[0])(jnp.asarray(LOGP))
    assert_allclose(g, -w * ADV * MASK / 5, rtol=1e-6)
    assert_allclose(met["clipfrac"], 2 / 5)             # two capped weights, both A != 0
    assert_allclose(met["clipfrac_upper"], 1 / 5)       # the A > 0 one
    assert_allclose(met["clipfrac_lower"], 1 / 5)
    assert_allclose(met["ratio_mean"], (math.exp(0.5) + math.exp(-1) + 1 + math.exp(1.7) + 1) / 5,
                    rtol=1e-6)


def test_cispo_below_the_cap_is_the_unclipped_ppo_gradient():
    """Uncapped, sg(r) A d(logp) = A dr: CISPO's gradient is PPO's without its clip (a clip
    range that never binds), though the loss values differ."""
    def grad(**kw):
        return jax.grad(lambda lp: losses.policy_loss(lp, OLD, ADV, MASK, **kw)[0])(
            jnp.asarray(LOGP))
    assert_allclose(grad(objective="cispo", cispo_eps_high=100.0),
                    grad(clip_low=1.0, clip_high=100.0), rtol=1e-5)


def test_on_policy_cispo_is_the_clipped_loss_gradient():
    """One update per fresh rollout: old log-probs are the policy's own, every ratio is 1 and
    neither the clip nor the cap binds, so CISPO and the clipped surrogate step alike
    (results/loss_study: their runs learned identically at updates_per_rollout 1)."""
    def grad(**kw):
        return jax.grad(lambda lp: losses.policy_loss(lp, jax.lax.stop_gradient(lp), ADV, MASK,
                                                      **kw)[0])(jnp.asarray(LOGP))
    assert_allclose(grad(objective="cispo"), grad(clip_low=0.2, clip_high=0.28), rtol=1e-6)


def test_cispo_refuses_what_it_does_not_use():
    for kw in (dict(cispo_eps_high=0.0), dict(dual_clip=3.0), dict(ratio_level="sequence")):
        with pytest.raises(ValueError, match="cispo needs"):
            losses.policy_loss(LOGP, OLD, ADV, MASK, objective="cispo", **kw)
    with pytest.raises(ValueError, match="valid policy losses"):
        losses.policy_loss(LOGP, OLD, ADV, MASK, objective="reinforce")
    with pytest.raises(ValueError, match="cispo_eps_high"):
        steps.LossConfig(policy_loss="cispo", cispo_eps_high=-1.0)


def test_cispo_step_gradient_is_the_hand_formula(params):
    """The update step with --policy_loss=cispo: its gradient is that of the formula written
    out on the batch (token log-probs of the params, token-mean over the loss mask)."""
    batch = make_grpo_batch(5)
    lc = steps.LossConfig(policy_loss="cispo", cispo_eps_high=0.1, agg="token-mean")
    _, m = _grpo_fn(1, lc)(new_state(params), batch)
    adv_BS = steps._grpo_advantages_BS(batch, GT, "grpo")
    mask_BS, old_BS = batch.loss_mask_BT[:, 1:], batch.old_logp_BT[:, 1:]

    def formula(p):
        logits = steps.forward(CFG, p, batch.tokens_BT, batch.valid_BT)[:, :-1]
        logp = losses.token_logprobs(logits, batch.tokens_BT[:, 1:])
        w = jax.lax.stop_gradient(jnp.minimum(jnp.exp(logp - old_BS), 1.1))
        return -jnp.sum(w * adv_BS * logp * mask_BS) / jnp.sum(mask_BS)

    want = jax.jit(jax.grad(formula))(params)
    assert tree_diff(m["actor_grads"], want) <= 1e-4 * tree_norm(want)
    assert 0 < float(m["clipfrac"]) < 1        # some weights hit the cap 1.1, some did not


# ----------------------------------------------------------------------------- advantage norm

REWARDS = np.array([1.0, 0.0, 0.0, 0.0,      # centred: .75, -.25, -.25, -.25
                    1.0, 1.0, 0.0, 0.0,      # centred: .5, .5, -.5, -.5
                    0.3, 0.3, 0.3, 0.3],     # constant group: 0
                   np.float32)
CENTRED = np.array([.75, -.25, -.25, -.25, .5, .5, -.5, -.5, 0, 0, 0, 0])


@pytest.mark.parametrize("estimator", losses.ADVANTAGE_ESTIMATORS)
def test_auto_norm_is_each_estimators_own(estimator):
    auto = losses.group_advantages(REWARDS, 4, estimator=estimator)
    own = "group" if estimator == "grpo" else "none"
    assert np.array_equal(auto, losses.group_advantages(REWARDS, 4, estimator=estimator,
                                                        norm=own))


def test_drgrpo_is_grpo_without_the_std():
    rng = np.random.default_rng(0)
    r = np.concatenate([rng.normal(size=12), np.full(4, 0.5)]).astype(np.float32)
    assert np.array_equal(losses.group_advantages(r, 4, estimator="drgrpo"),
                          losses.group_advantages(r, 4, estimator="grpo", norm="none"))
    assert_allclose(losses.group_advantages(REWARDS, 4, estimator="grpo", norm="none"), CENTRED,
                    atol=1e-7)


def test_batch_norm_by_hand():
    """c / (std_{N-1} of c over the batch + 1e-6); with valid_N the std is over those rows."""
    std = math.sqrt(np.sum((CENTRED - CENTRED.mean()) ** 2) / 11)
    got = losses.group_advantages(REWARDS, 4, estimator="grpo", norm="batch")
    assert_allclose(got, CENTRED / (std + 1e-6), rtol=1e-6)
    valid = np.repeat([1, 1, 0], 4)                       # the constant group filtered
    std8 = math.sqrt(np.sum((CENTRED[:8] - CENTRED[:8].mean()) ** 2) / 7)
    got = losses.group_advantages(REWARDS, 4, estimator="drgrpo", norm="batch", valid_N=valid)
    assert_allclose(got, CENTRED / (std8 + 1e-6), rtol=1e-6)
    rloo = losses.group_advantages(REWARDS, 4, estimator="rloo", norm="group")
    group_std = np.repeat([0.5, math.sqrt(1 / 3), 0.0], 4)   # unbiased, per group
    assert_allclose(rloo, CENTRED * 4 / 3 / (group_std + 1e-6), rtol=1e-5, atol=1e-7)
    big = losses.group_advantages(REWARDS * 1e30, 4, estimator="grpo", norm="batch")
    assert_allclose(big, CENTRED / std, rtol=1e-5)           # finite at any reward scale
    with pytest.raises(ValueError, match="valid advantage norms"):
        losses.group_advantages(REWARDS, 4, norm="prompt")


def test_adv_norm_in_the_step(params):
    """The step: --advantage=drgrpo is --advantage=grpo --adv_norm=none (the same update), and
    --adv_norm=batch scales that update by 1 / (batch std of the centred rewards + eps) (the
    clipped surrogate is positively homogeneous in A)."""
    import dataclasses
    batch = make_grpo_batch(7)
    run = {}
    for name, kw in {"drgrpo": dict(advantage="drgrpo"), "none": dict(adv_norm="none"),
                     "batch": dict(adv_norm="batch")}.items():
        run[name] = _grpo_fn(1, dataclasses.replace(PLAIN, **kw))(new_state(params), batch)[1]
    g_dr, g_none, g_batch = (run[k]["actor_grads"] for k in ("drgrpo", "none", "batch"))
    assert tree_diff(g_dr, g_none) <= 1e-6 * tree_norm(g_none)
    c = np.asarray(batch.rewards_B).reshape(-1, GT)
    c = (c - c.mean(axis=1, keepdims=True)).reshape(-1)
    scale = 1.0 / (c.std(ddof=1) + 1e-6)
    want = jax.tree.map(lambda g: g * scale, g_none)
    assert tree_diff(g_batch, want) <= 1e-5 * tree_norm(want)


# ----------------------------------------------------------------------------- prompt-mean


def test_prompt_mean_by_hand():
    """Mean over prompts (G = 2 rows) of the group's token sum / token count: group 0 holds
    1, 2, 3 (mean 2), group 1 holds 4, 5, 6 (mean 5), group 2 no token (left out): 3.5.
    Token-mean would give 21 / 6 = 3.5 too here, so a second mask tells them apart."""
    x = np.array([[1, 2, 0], [3, 0, 0], [4, 5, 6], [7, 0, 0], [8, 9, 9], [9, 9, 9]], np.float32)
    m = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0], [0, 0, 0], [0, 0, 0]], np.float32)
    assert_allclose(losses.aggregate(x, m, "prompt-mean", group_size=2), 3.5, rtol=1e-6)
    m2 = m.copy()
    m2[3, 0] = 1                                           # group 1: 4, 5, 6, 7: mean 5.5
    assert_allclose(losses.aggregate(x, m2, "prompt-mean", group_size=2), (2 + 5.5) / 2,
                    rtol=1e-6)
    assert_allclose(losses.aggregate(x, m2, "token-mean"), 28 / 7, rtol=1e-6)
    assert_allclose(losses.aggregate(x, m2, "prompt-mean"),      # G = 1: per-row means
                    losses.aggregate(x, m2, "seq-mean-token-mean"), rtol=1e-6)
    w = steps.token_weights(jnp.asarray(m2), "prompt-mean", group_size=2)
    assert_allclose(jnp.sum(x * w), (2 + 5.5) / 2, rtol=1e-6)
    assert losses.aggregate(x, 0 * m, "prompt-mean", group_size=2) == 0.0
    with pytest.raises(ValueError, match="whole groups"):
        losses.aggregate(x, m, "prompt-mean", group_size=4)


def test_prompt_mean_step_is_the_aggregate_and_micro_batch_invariant(params):
    import dataclasses
    batch = make_grpo_batch(9)
    lc = dataclasses.replace(PLAIN, agg="prompt-mean")
    (_, m1), (_, m4) = (_grpo_fn(M, lc)(new_state(params), batch) for M in (1, 4))
    assert tree_diff(m4["actor_grads"], m1["actor_grads"]) <= 1e-5 * tree_norm(m1["actor_grads"])
    logits = steps.forward(CFG, params, batch.tokens_BT, batch.valid_BT)[:, :-1]
    logp = losses.token_logprobs(logits, batch.tokens_BT[:, 1:])
    want, _ = losses.policy_loss(logp, batch.old_logp_BT[:, 1:],
                                 steps._grpo_advantages_BS(batch, GT, "grpo"),
                                 batch.loss_mask_BT[:, 1:], clip_low=0.2, clip_high=0.28,
                                 agg="prompt-mean", group_size=GT)
    assert_allclose(m1["pg_loss"], want, rtol=1e-5, atol=1e-7)
    token, _ = losses.policy_loss(logp, batch.old_logp_BT[:, 1:],
                                  steps._grpo_advantages_BS(batch, GT, "grpo"),
                                  batch.loss_mask_BT[:, 1:], clip_low=0.2, clip_high=0.28)
    assert abs(float(token) - float(want)) > 1e-4          # the groups' lengths differ


def test_packed_update_with_the_new_pieces_equals_padded(params):
    """--token_budget runs the same update with CISPO, batch-level advantages and prompt-mean
    (weights and advantages come from the whole padded batch first): params within the padded
    step's own rounding floor; one batch has a filtered group."""
    import dataclasses

    from numerics import assert_tree_close
    from test_packing import T, _run_packed
    from test_steps import grpo_reference
    lc = dataclasses.replace(PLAIN, policy_loss="cispo", adv_norm="batch", agg="prompt-mean")
    batches = [make_grpo_batch(s) for s in (20, 21)]
    batches[1] = batches[1].replace(loss_mask_BT=batches[1].loss_mask_BT.at[:GT].set(False))
    state1, m1, floor = grpo_reference(params, batches, loss_cfg=lc)
    state, m = _run_packed(params, batches, 2 * T, loss_cfg=lc)
    assert_tree_close(state.params, state1.params, 2 * floor["params"],
                      tree_diff(state1.params, params))
    for got, want in zip(m, m1):
        assert_allclose(got["pg_loss"], want["pg_loss"], rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------- DAPO lengths

EOS = 1


def _rollout(tokens_BM, lengths_B, rewards_B, **kw):
    prompts = [[5, 6]] * len(lengths_B)
    logp = np.full(np.shape(tokens_BM), -1.0, np.float32)
    return rollout_batch(prompts, np.asarray(tokens_BM, np.int32), logp, np.asarray(lengths_B),
                         np.asarray(rewards_B, np.float32), prompt_len=2, pad_id=0,
                         group_size=2, **kw)


def test_truncated_rows_and_overlong_filtering_by_hand():
    """M = 4: a row of 4 tokens ending in EOS finished; one of 4 without EOS was cut; shorter
    rows finished. With no EOS token every full row counts as cut."""
    tokens = [[3, 4, 5, EOS], [3, 4, 5, 6], [3, EOS, 0, 0], [7, 7, 7, 0]]
    lengths = [4, 4, 2, 3]
    assert truncated_rows(tokens, lengths, EOS).tolist() == [False, True, False, False]
    assert truncated_rows(tokens, lengths, None).tolist() == [True, True, False, False]
    plain, acc = _rollout(tokens, lengths, [1, 0, 1, 0], eos_id=EOS)
    masked, acc_m = _rollout(tokens, lengths, [1, 0, 1, 0], eos_id=EOS, mask_truncated=True)
    assert "truncated" not in acc and acc["retained"] == 4
    assert acc_m["truncated"] == 1 and acc_m["retained"] == 3
    want = np.asarray(plain.loss_mask_BT).copy()
    want[1] = False                                       # only the cut row leaves the loss
    assert np.array_equal(masked.loss_mask_BT, want)
    assert np.array_equal(masked.rewards_B, plain.rewards_B)   # its reward still counts


def test_overlong_reward_by_hand():
    """Lmax = 8, L = 4, p = 0.5: 0 up to 4 tokens, then -0.5 (|y| - 4) / 4, -0.5 past 8."""
    got = overlong_reward([2, 4, 5, 6, 8, 9], max_len=8, buffer=4, penalty=0.5)
    assert_allclose(got, [0, 0, -0.125, -0.25, -0.5, -0.5], atol=1e-7)
    assert overlong_reward([8], max_len=8, buffer=0, penalty=0.5).tolist() == [0.0]
    # in the batch: M = 4, L = 2, p = 1 -> lengths 4, 4, 2, 3 get -1, -1, 0, -0.5
    tokens = [[3, 4, 5, EOS], [3, 4, 5, 6], [3, EOS, 0, 0], [7, 7, 7, 0]]
    batch, acc = _rollout(tokens, [4, 4, 2, 3], [1, 1, 0, 0], overlong_buffer=2,
                          overlong_penalty=1.0, filter_zero_variance=True)
    assert_allclose(batch.rewards_B, [0, 0, 0, -0.5], atol=1e-7)
    assert acc["overlong_penalty_mean"] == pytest.approx(-2.5 / 4)
    # groups are filtered on the task's rewards (as verl's dynamic sampling filters on
    # accuracy): group 1's task rewards (0, 0) are equal, so it is filtered although its
    # penalised rewards (0, -0.5) differ
    assert acc["zero_var_groups"] == 2 and acc["retained"] == 0


def test_truncated_row_leaves_the_update(params):
    """--mask_truncated in the step: what a cut response holds no longer moves the update."""
    batch = make_grpo_batch(11)
    cut = np.asarray(batch.loss_mask_BT).copy()
    cut[3] = False                                        # row 3 as rollout_batch masks it
    cut_batch = batch.replace(loss_mask_BT=jnp.asarray(cut))
    other = np.asarray(batch.tokens_BT).copy()
    other[3, -3:] = (other[3, -3:] + 1) % CFG.vocab_size
    fn = _grpo_fn(1, PLAIN)
    g = fn(new_state(params), cut_batch)[1]["actor_grads"]
    g_other = fn(new_state(params), cut_batch.replace(tokens_BT=jnp.asarray(other)))[1]
    assert tree_diff(g_other["actor_grads"], g) <= 1e-6 * tree_norm(g)
    assert tree_diff(fn(new_state(params), batch)[1]["actor_grads"], g) > 1e-4 * tree_norm(g)


# ----------------------------------------------------------------------------- a run


def _digit_share(response, example):
    return sum(c.isdigit() for c in response) / max(len(response), 1)


def test_a_run_with_every_new_flag_on(tmp_path, monkeypatch):
    """CISPO, batch-level advantages, prompt-mean, overlong filtering and punishment, and
    pass@k on the eval: the run trains, its training records carry truncated and
    overlong_penalty_mean, its eval records pass@k / avg@k with their standard errors."""
    import json

    import jaxrl_scale.data
    from jaxrl_scale.data.reward_runner import RewardFn
    from jaxrl_scale.experiment.train import run_training
    monkeypatch.setattr(jaxrl_scale.data, "reward_for_task",
                        lambda name, **kw: RewardFn(_digit_share, name="digits"))
    cfg = TrainConfig.make(
        run_dir=str(tmp_path / "run"), data_dir=str(tmp_path / "data"), model="tiny",
        num_train_examples=64, num_test_examples=8, prompts_per_step=4, group_size=4,
        max_new_tokens=4, eval_every=2, eval_prompts=4, eval_samples=4, checkpoint_every=2,
        max_steps=2, base_lr=1e-3, base_batch=16, policy_loss="cispo", adv_norm="batch",
        agg="prompt-mean", mask_truncated=True, overlong_buffer=2, overlong_penalty=0.5,
        pass_k=(1, 4), tensorboard=False)
    out = run_training(cfg, progress=False)
    assert out["finished"] and out["step"] == 2
    with open(os.path.join(cfg.run_dir, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    train = [r for r in recs if "score" not in r]
    evals = [r for r in recs if "score" in r]
    assert [r["step"] for r in evals] == [0, 2]
    for r in train:
        assert 0 <= r["truncated"] <= 16 and r["retained"] <= 16 - r["truncated"]
        assert -0.5 <= r["overlong_penalty_mean"] <= 0
        # an untrained model seldom ends before the cap: most rows are cut, yet the batch
        # std (over the groups the loss sees) keeps the update finite
        assert r["updates"] == r["step"] and 0 <= r["actor_grad_norm"] < 1e3
    for r in evals:
        for k in (1, 4):
            for name in (f"pass@{k}", f"avg@{k}"):
                assert 0 <= r[name] <= 1 and r[f"{name}_se"] is not None
        assert r["avg@4"] == pytest.approx(r["score"]) and r["pass@1"] == pytest.approx(r["score"])
        assert r["pass@4"] >= r["pass@1"]


# ----------------------------------------------------------------------------- the flags


@pytest.mark.parametrize("kw, field", [
    (dict(cispo_eps_high=0.0), "cispo_eps_high"), (dict(cispo_eps_high=-1.0), "cispo_eps_high"),
    (dict(policy_loss="reinforce"), "policy_loss"), (dict(adv_norm="prompt"), "adv_norm"),
    (dict(agg="prompt_mean"), "agg"), (dict(overlong_buffer=-1), "overlong_buffer"),
    (dict(overlong_buffer=7), "overlong_buffer"), (dict(overlong_penalty=-1.0), "overlong_penalty"),
    (dict(policy_loss="cispo", dual_clip=3.0), "dual_clip"),
    (dict(policy_loss="cispo", ratio_level="sequence"), "ratio_level"),
    (dict(algo="ppo", group_size=1, adv_norm="batch"), "adv_norm"),
])
def test_bad_values_name_the_flag(kw, field):
    with pytest.raises(ConfigError, match=f"^{field}: .*Fix: "):
        validate(TrainConfig.make(**kw))


def test_the_commands_refuse_bad_values_in_one_line_before_the_warm_start(tmp_path):
    """jaxrl-train: each bad value one line, exit 2, in seconds, before the warm-start (the
    sentinel); all the new flags together pass validation."""
    from test_cli import _check, _table
    rows = [("--cispo_eps_high=0", "cispo_eps_high"), ("--policy_loss=foo", "policy_loss"),
            ("--policy_loss=cispo --dual_clip=3", "dual_clip"), ("--adv_norm=foo", "adv_norm"),
            ("--algo=ppo --group_size=1 --adv_norm=batch", "adv_norm"),
            ("--agg=prompt", "agg"), ("--overlong_buffer=7", "overlong_buffer"),
            ("--overlong_penalty=-1", "overlong_penalty"), ("--pass_k=1,8", "pass_k"),
            ("--pass_k=x", "pass_k"), ("--pass_k=0", "pass_k"),
            ("--policy_loss=cispo --cispo_eps_high=3 --adv_norm=batch --agg=prompt-mean "
             "--mask_truncated --overlong_buffer=2 --overlong_penalty=0.5 --pass_k=1,4",
             "REACHED")]
    _check(_table(tmp_path, "jaxrl_scale.cli.train", rows), rows)
