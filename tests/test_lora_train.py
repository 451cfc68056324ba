"""LoRA in the training loop: a run trains adapters only, checkpoints them alone (the config
names the base) and resumes exactly; the step-0 record says the run is LoRA."""
import os

import jax
import numpy as np
import pytest
from test_train import _digit_reward, _records, _strip_times, tiny_cfg

from jaxrl_scale.checkpoint import Checkpointer
from jaxrl_scale.experiment.config import ConfigError, TrainConfig
from jaxrl_scale.experiment.train import Run, run_training, trained_part


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data"))


def lora_cfg(run_dir, data_dir, **kw):
    return tiny_cfg(run_dir, data_dir, lora_rank=4, lora_alpha=8.0, lora_targets=("q", "v", "down"),
                    max_steps=4, base_lr=1e-2, **kw)


def test_lora_run_checkpoints_adapters_only_and_resumes_exactly(tmp_path, data_dir, monkeypatch):
    _digit_reward(monkeypatch)   # a reward the random tiny model gets partly right: gradients
    ref = lora_cfg(tmp_path / "ref", data_dir)
    assert run_training(ref, progress=False)["finished"]
    run_dir = str(tmp_path / "cut")
    out = run_training(lora_cfg(run_dir, data_dir), progress=False, stop_after_steps=3)
    assert not out["finished"]   # checkpoint at step 2, step 3 logged and then lost
    out = run_training(lora_cfg(run_dir, data_dir), progress=False)
    assert out["finished"] and out["step"] == 4
    recs, ref_recs = _records(run_dir), _records(ref.run_dir)
    assert _strip_times(recs) == _strip_times(ref_recs)
    step0 = recs[0]
    assert step0["lora_rank"] == 4 and step0["lora_targets"] == "q,v,down"
    assert 0 < step0["trainable_params"] < step0["model_params"] / 10
    assert all(np.isfinite(r["actor_loss"]) for r in recs if "actor_loss" in r)

    # The checkpoint holds the adapters (and their Adam state), no base weights; both runs'
    # final adapters are bit-identical and moved away from their init.
    run = Run(ref)
    like = trained_part(run.init_states)
    assert set(like[0].params["layers"]) == {"lora_a_q", "lora_b_q", "lora_a_v", "lora_b_v",
                                             "lora_a_down", "lora_b_down"}
    a, meta = Checkpointer(os.path.join(ref.run_dir, "checkpoints")).restore(None, like)
    b, _ = Checkpointer(os.path.join(run_dir, "checkpoints")).restore(None, like)
    assert a[0].frozen is None and meta["counters"]["step"] == 4
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert np.any(np.asarray(a[0].params["layers"]["lora_b_q"]) != 0)
    saved = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in
                os.walk(os.path.join(ref.run_dir, "checkpoints", "4")) for f in fs)
    base_bytes = sum(np.asarray(x).nbytes for x in jax.tree.leaves(run.init_states[0].frozen))
    assert saved < base_bytes, (saved, base_bytes)


def test_lora_fields_are_validated_and_survive_json():
    cfg = TrainConfig.make(lora_rank=8, lora_targets="q,v")
    assert cfg.lora_targets == ("q", "v") and cfg.lora.scale == 16.0 / 8
    assert TrainConfig.from_json(cfg.to_json()) == cfg       # JSON lists come back as tuples
    assert TrainConfig().lora is None
    from jaxrl_scale.experiment.config import validate
    with pytest.raises(ConfigError, match="^lora_targets: .*Fix: "):
        validate(TrainConfig.make(lora_rank=4, lora_targets=("q", "w")))


def test_one_lora_update_moves_the_policy_toward_high_advantage_responses():
    """The smallest "LoRA learns" check: after one GRPO update of the adapters alone, the
    advantage-weighted log-likelihood of the batch's responses, sum_b A_b log pi(y_b), is
    higher than before (first-order policy improvement)."""
    from jaxrl_scale.models import get_config, lora
    from jaxrl_scale.optim import AdamHParams, make_optimizer
    from jaxrl_scale.rl import losses
    from jaxrl_scale.rl.state import create_train_state
    from jaxrl_scale.rl.steps import StepOptions, grpo_step, score_tokens
    from test_lora import _grpo_batch, base_params, trained_adapters
    cfg, lcfg = get_config("tiny"), lora.LoraConfig(rank=4, alpha=8.0)
    tx = make_optimizer(AdamHParams(lr=1e-3), max_grad_norm=1.0)
    state = create_train_state(trained_adapters(), tx, 0, frozen=base_params())
    batch = _grpo_batch(rows=16, group=4)
    adv_B = np.asarray(losses.group_advantages(batch.rewards_B, 4))
    mask_BT = np.asarray(batch.loss_mask_BT)

    def objective(adapters):
        params = lora.merge(state.frozen, adapters, lcfg.scale)
        logp_BT = np.asarray(score_tokens(cfg, params, batch.tokens_BT, batch.valid_BT))
        return float(np.sum(adv_B[:, None] * logp_BT * mask_BT))

    before = objective(state.params)
    opts = StepOptions(cfg=cfg, tx=tx, group_size=4, lora_scale=lcfg.scale)
    new, _ = jax.jit(lambda s, b: grpo_step(s, b, opts))(state, batch)
    assert objective(new.params) > before + 1e-3 * abs(before)
