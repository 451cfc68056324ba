"""--updates_per_rollout: u optimizer updates per rollout batch, each on a
minibatch of whole prompt groups. One update is today's step bit for bit; u minibatches over
one batch are u sequential steps on its slices; the sample axis stays responses generated."""
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_steps import (CFG, FAST_COMPILE, GT, LOSS_CFG, LR_FN, TP, TX, make_grpo_batch,
                        new_state, np_params)

from jaxrl_scale.experiment import study as study_mod
from jaxrl_scale.experiment.config import ConfigError, TrainConfig, validate
from jaxrl_scale.experiment.train import run_training
from jaxrl_scale.rl import steps
from jaxrl_scale.rl.microbatch import split_rows
from jaxrl_scale.scaling import io


@pytest.fixture(scope="module")
def params():
    return np_params(CFG, 0)


@functools.lru_cache(maxsize=None)
def _step(**kw):
    return steps.make_train_step(steps.grpo_step, donate=False, compiler_options=FAST_COMPILE,
                                 cfg=CFG, tx=TX, loss_cfg=LOSS_CFG, lr_fn=LR_FN,
                                 group_size=GT, **kw)


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def test_one_update_is_todays_step(params):
    """updates_per_rollout = 1 = update_epochs is StepOptions' default (num_minibatches =
    epochs = 1): the same
    (hashable, equal) options, so the same compiled program and bit-equal params."""
    base = steps.StepOptions(cfg=CFG, tx=TX, loss_cfg=LOSS_CFG, group_size=GT)
    assert (base.num_minibatches, base.epochs) == (1, 1)
    explicit = steps.StepOptions(cfg=CFG, tx=TX, loss_cfg=LOSS_CFG, group_size=GT,
                                 num_minibatches=TrainConfig().updates_per_rollout,
                                 epochs=TrainConfig().update_epochs)
    assert explicit == base and hash(explicit) == hash(base)
    batch = make_grpo_batch(0, shared_group=GT)
    today, _ = _step(shared_prompt_len=TP)(new_state(params), batch)
    one, _ = _step(shared_prompt_len=TP, num_minibatches=1)(new_state(params), batch)
    for a, b in zip(_leaves(today.params), _leaves(one.params)):
        np.testing.assert_array_equal(a, b)
    assert int(today.step) == int(one.step) == 1


def test_k_minibatches_are_k_sequential_steps(params):
    """k = 2 minibatches over one batch (shared prompt on: minibatches hold whole groups)
    equal two k = 1 steps on its slices (groups 0, 2, 4, 6 then 1, 3, 5, 7), optimizer state
    threaded. Group advantages and each update's loss normaliser depend only on the slice's
    rows, so both do the same float32 ops on the same values. Not bit-equal, though: the
    scan body of multi_update and the standalone jit are two compiled programs whose fusions
    order some float32 sums differently (measured: max |diff| 8.8e-7 at param norm 18.9, a
    few ulps of Adam's lr-sized steps); asserted to 1e-6 of the param norm, 20x above that
    and far below one update's size (lr 1e-3 per element)."""
    batch = make_grpo_batch(0, shared_group=GT)
    two, m2 = _step(shared_prompt_len=TP, num_minibatches=2)(new_state(params), batch)
    assert int(two.step) == 2 and np.shape(m2["actor_loss"]) == (2,)
    state = new_state(params)
    one = _step(shared_prompt_len=TP)
    for m in range(2):
        half = jax.tree.map(lambda x: None if x is None else split_rows(x, 2, GT)[m], batch)
        state, m1 = one(state, half)
        np.testing.assert_allclose(float(m1["actor_loss"]), float(m2["actor_loss"][m]),
                                   rtol=1e-5)
    assert int(state.step) == 2
    a, b = _leaves(two.params), _leaves(state.params)
    norm = np.sqrt(sum(float(np.sum(np.square(x))) for x in b))
    diff = max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))
    assert diff <= 1e-6 * norm, (diff, norm)
    for x, y in zip(_leaves(two.opt_state), _leaves(state.opt_state)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)


def _max_diff_vs_norm(a_tree, b_tree):
    a, b = _leaves(a_tree), _leaves(b_tree)
    norm = np.sqrt(sum(float(np.sum(np.square(x))) for x in b))
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b)), norm


def test_two_epochs_of_two_minibatches_are_four_sequential_steps(params):
    """update_epochs = 2 at k = 2: four updates on the slices [m0, m1, m0, m1] (each pass in
    the same order), optimizer state threaded, equal to four k = 1 steps on them. The same
    two-compiled-programs argument as the k = 2 test above bounds the difference: a few
    ulps of Adam's lr-sized steps per update (measured: max |diff| 1.4e-6 at param norm
    18.9), so twice that test's bound for twice the updates (2e-6 of the param norm, 27x
    above the measurement, still far below one update's lr 1e-3 per element)."""
    batch = make_grpo_batch(0, shared_group=GT)
    four, m4 = _step(shared_prompt_len=TP, num_minibatches=2, epochs=2)(new_state(params),
                                                                       batch)
    assert int(four.step) == 4 and np.shape(m4["actor_loss"]) == (4,)
    state = new_state(params)
    one = _step(shared_prompt_len=TP)
    for i, m in enumerate([0, 1, 0, 1]):
        half = jax.tree.map(lambda x: None if x is None else split_rows(x, 2, GT)[m], batch)
        state, m1 = one(state, half)
        np.testing.assert_allclose(float(m1["actor_loss"]), float(m4["actor_loss"][i]),
                                   rtol=1e-5)
    # the second pass sees moved params: its losses are not the first pass's
    assert float(m4["actor_loss"][2]) != float(m4["actor_loss"][0])
    assert int(state.step) == 4
    diff, norm = _max_diff_vs_norm(four.params, state.params)
    assert diff <= 2e-6 * norm, (diff, norm)
    for x, y in zip(_leaves(four.opt_state), _leaves(state.opt_state)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)


def test_an_all_filtered_minibatch_makes_no_update(params):
    """filter_zero_variance can leave a minibatch with only filtered groups (loss mask all
    zero): its gradient is zero, but Adam's momentum would still move the params and the
    step count would advance. At k = 2 with minibatch 1 (groups 1, 3, 5, 7) all zero-variance
    and filtered, the step is one update on minibatch 0 alone: the same params (to the k = 2
    test's two-programs tolerance), the same Adam count and state.step, exactly; the record
    counts the skipped minibatch and its means are over the update made."""
    from jaxrl_scale.experiment.records import step_metrics
    batch = make_grpo_batch(0, shared_group=GT)
    odd_B = (np.arange(batch.rewards_B.shape[0]) // GT) % 2 == 1
    batch = batch.replace(rewards_B=jnp.where(odd_B, 0.5, batch.rewards_B),
                          loss_mask_BT=batch.loss_mask_BT & ~odd_B[:, None])
    two, m2 = _step(shared_prompt_len=TP, num_minibatches=2)(new_state(params), batch)
    first = jax.tree.map(lambda x: None if x is None else split_rows(x, 2, GT)[0], batch)
    one, m1 = _step(shared_prompt_len=TP)(new_state(params), first)
    assert int(two.step) == int(one.step) == 1
    assert np.asarray(m2["empty_minibatch"]).tolist() == [0.0, 1.0]
    diff, norm = _max_diff_vs_norm(two.params, one.params)
    assert diff <= 1e-6 * norm, (diff, norm)
    for x, y in zip(_leaves(two.opt_state), _leaves(one.opt_state)):
        if np.issubdtype(x.dtype, np.integer):
            np.testing.assert_array_equal(x, y)   # Adam's count and the schedule's
        else:
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)
    rec = step_metrics(jax.device_get(m2), 8, 1.0, actor_batch=8)
    assert rec["empty_minibatches"] == 1 and "empty_minibatch" not in rec
    np.testing.assert_allclose(rec["actor_loss"], float(m1["actor_loss"]), rtol=1e-5)
    np.testing.assert_allclose(rec["actor_grad_sqnorm"], float(m1["actor_grad_sqnorm"]),
                               rtol=1e-4)


def test_ppo_actor_takes_the_updates_the_critic_its_own(params):
    """PPO: updates_per_rollout is the actor's num_minibatches; the critic keeps its own
    critic_minibatches (the trainer always passes it, default 1)."""
    from jaxrl_scale.rl.state import create_train_state
    from jaxrl_scale.rl.value import init_critic_from_actor
    from test_steps import CTX, make_ppo_batch
    o = steps.StepOptions(cfg=CFG, tx=TX, critic_tx=CTX, loss_cfg=LOSS_CFG, num_minibatches=2,
                          critic_minibatches=1)
    critic = init_critic_from_actor(params, jax.random.PRNGKey(1))
    a, c, m = jax.eval_shape(lambda p, q, b: steps.ppo_step(
        create_train_state(p, TX, 0), create_train_state(q, CTX, 0), b, o),
        params, critic, make_ppo_batch(0))
    assert np.shape(m["actor_loss"]) == (2,) and np.shape(m["critic_loss"]) == ()


def _cfg(run_dir, data_dir, **kw):
    base = dict(run_dir=str(run_dir), data_dir=data_dir, model="tiny",
                num_train_examples=200, num_test_examples=32, prompts_per_step=4, group_size=4,
                max_new_tokens=4, eval_every=100, eval_prompts=8, eval_samples=2,
                checkpoint_every=100, max_steps=2, base_lr=1e-3, base_batch=16,
                tensorboard=False)
    base.update(kw)
    return TrainConfig.make(**base)


def _train_records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["step"] > 0 and "score" not in r]


def test_train_two_updates_per_rollout(tmp_path):
    """jaxrl-train's loop at u = 2: two updates per rollout step (`updates` 2, 4), the
    actor's metrics means over them, and the same `responses` series as u = 1 (samples are
    responses generated, not updates); the analysis reads u back and groups by it."""
    data = str(tmp_path / "data")
    recs = {}
    for u in (1, 2):
        cfg = _cfg(tmp_path / f"r{u}", data, updates_per_rollout=u)
        run_training(cfg, progress=False)
        recs[u] = _train_records(cfg.run_dir)
    assert [r["step"] for r in recs[2]] == [1, 2]
    assert [r["updates"] for r in recs[1]] == [1, 2]
    assert [r["updates"] for r in recs[2]] == [2, 4]
    assert [r["responses"] for r in recs[2]] == [r["responses"] for r in recs[1]] == [16, 32]
    assert recs[2][0]["reward_mean"] == recs[1][0]["reward_mean"]   # the same first rollout
    r = recs[2][-1]
    assert r["actor_batch"] == 8 and r["micro_batch_size"] == 8
    assert isinstance(r["actor_loss"], float) and len(r["actor_grad_sqnorm_micro"]) == 1
    assert "actor_batch" not in recs[1][-1] and recs[1][-1]["micro_batch_size"] == 16
    assert r["empty_minibatches"] == 0 and "empty_minibatches" not in recs[1][-1]
    run = io.read_run(str(tmp_path / "r2"))
    assert run.updates_per_rollout == 2 and run.group == "r2_u2"
    assert io.read_run(str(tmp_path / "r1")).updates_per_rollout == 1


def test_train_two_update_epochs(tmp_path):
    """jaxrl-train's loop at u = 1, E = 2: two passes over the whole batch per rollout step
    (`updates` 2, 4), the actor's metrics means over the two updates at actor_batch B_train;
    the analysis groups the run apart from E = 1 (`_e2`)."""
    cfg = _cfg(tmp_path / "e2", str(tmp_path / "data"), update_epochs=2)
    run_training(cfg, progress=False)
    recs = _train_records(cfg.run_dir)
    assert [r["updates"] for r in recs] == [2, 4]
    assert [r["responses"] for r in recs] == [16, 32]
    r = recs[-1]
    assert r["actor_batch"] == 16 and r["micro_batch_size"] == 16
    assert isinstance(r["actor_loss"], float) and len(r["actor_grad_sqnorm_micro"]) == 1
    run = io.read_run(cfg.run_dir)
    assert (run.update_epochs, run.updates_per_rollout, run.group) == (2, 1, "e2_e2")


def test_sweep_axis_names_and_parsing():
    """--updates_per_rollout=1,2 doubles the configs; u = 2 runs are named ..._u2_s<seed>
    (before any _k tag) and the one-update names are unchanged; io reads u and groups seeds."""
    one = study_mod.study_config("default")
    sync = study_mod.plan(one, TrainConfig(micro_batches=2))
    both = study_mod.plan(study_mod.study_config("default", updates_per_rollout=(1, 2)),
                          TrainConfig(micro_batches=2))
    assert len(both) == 2 * len(sync) and both[:len(sync)] == sync
    for r0, r2 in zip(sync, both[len(sync):]):
        stem, seed = os.path.basename(r0.run_dir).rsplit("_s", 1)
        assert os.path.basename(r2.run_dir) == f"{stem}_u2_s{seed}"
        assert r2.updates_per_rollout == 2 and r2.replace(updates_per_rollout=1,
                                                          run_dir=r0.run_dir) == r0
    assert study_mod.run_name("grpo", 32, 8, "sqrt", 3, 2, 4) == "grpo_P32_G8_sqrt_u4_k2_s3"
    assert {r.updates_per_rollout for r in study_mod.tune_plan(
        study_mod.study_config("default", updates_per_rollout=(2,)), TrainConfig())} == {1}
    recs = [{"step": 0, "responses": 0, "score": 0.1}]
    for name, u in (("grpo_P16_G8_sqrt_u2_s0", 2), ("grpo_P16_G8_sqrt_u4_k2_s1", 4),
                    ("grpo_P16_G8_sqrt_s0", 1), ("grpo_P16_G8_sqrt_k2_s0", 1)):
        run = io.make_run(name, recs, {})
        assert run.updates_per_rollout == u, name
        assert run.group == io.strip_seed(name)
    assert io.strip_ratio("grpo_P16_G8_sqrt_u4_k2") == "grpo_P16_G8_sqrt_u4"
    cfg_run = io.make_run("mine", recs, {"updates_per_rollout": 2, "gen_batch_ratio": 2})
    assert (cfg_run.updates_per_rollout, cfg_run.group) == (2, "mine_u2_k2")
    # update_epochs E != 1: its own group, tagged _e<E> after _u<u> and before _k<k>
    for config, name, group in [
            ({"update_epochs": 2}, "mine", "mine_e2"),
            ({"update_epochs": 1}, "mine", "mine"),
            ({"updates_per_rollout": 2, "update_epochs": 3, "gen_batch_ratio": 2}, "mine",
             "mine_u2_e3_k2"),
            ({"update_epochs": 2}, "grpo_P16_G8_sqrt_u4_k2_s1", "grpo_P16_G8_sqrt_u4_e2_k2"),
            ({"update_epochs": 2}, "grpo_P16_G8_sqrt_u4_e2_k2_s1",
             "grpo_P16_G8_sqrt_u4_e2_k2")]:
        run = io.make_run(name, recs, config)
        assert run.group == group, (config, name)
        assert run.update_epochs == config["update_epochs"]
    assert io.make_run("grpo_P16_G8_sqrt_u4_e2_s0", recs, {}).updates_per_rollout == 4
    with pytest.raises(ConfigError, match="updates_per_rollout"):
        study_mod.check_sweep_fields(study_mod.SweepConfig(updates_per_rollout=(0,)))


@pytest.mark.parametrize("kw, words", [
    (dict(updates_per_rollout=0), "must be >= 1"),
    (dict(updates_per_rollout=-1), "must be >= 1"),
    (dict(prompts_per_step=4, updates_per_rollout=3), "do not divide the 4 prompt groups"),
    (dict(prompts_per_step=4, micro_batches=2, updates_per_rollout=4), "micro-batches"),
    (dict(updates_per_rollout=2, is_cap=2.0), "--is_cap=0"),
])
def test_bad_updates_per_rollout(kw, words):
    with pytest.raises(ConfigError, match="updates_per_rollout") as e:
        validate(TrainConfig.make(**kw))
    assert words in str(e.value) and "\n" not in str(e.value)
    validate(TrainConfig.make(prompts_per_step=4, micro_batches=2, updates_per_rollout=2,
                              share_prompt=True))


@pytest.mark.parametrize("kw, words", [
    (dict(update_epochs=0), "must be >= 1"),
    (dict(update_epochs=2, is_cap=2.0), "--is_cap=0"),
])
def test_bad_update_epochs(kw, words):
    with pytest.raises(ConfigError, match="update_epochs") as e:
        validate(TrainConfig.make(**kw))
    assert words in str(e.value) and "\n" not in str(e.value)
    validate(TrainConfig.make(update_epochs=2))
