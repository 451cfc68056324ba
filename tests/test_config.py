"""TrainConfig: nested loss / sampling / optim configs, their flat names, JSON round trip."""
import dataclasses

import pytest

from jaxrl_scale.experiment.config import OptimConfig, TrainConfig, validate
from jaxrl_scale.rl.steps import LossConfig
from jaxrl_scale.sampling.rules import SamplingConfig


def test_flat_names_route_to_their_sub_config():
    cfg = TrainConfig.make(clip_high=0.3, base_lr=1e-3, top_k=5, prompts_per_step=4)
    assert cfg.loss.clip_high == 0.3 and cfg.optim.base_lr == 1e-3
    assert cfg.sampling.top_k == 5 and cfg.prompts_per_step == 4
    assert cfg.loss.clip_low == LossConfig().clip_low          # untouched fields keep defaults
    again = cfg.replace(lr_rule="fixed", base_lr=2e-3)
    assert again.optim == dataclasses.replace(cfg.optim, lr_rule="fixed", base_lr=2e-3)
    assert again.loss == cfg.loss and cfg.optim.lr_rule == "sqrt"   # frozen: cfg unchanged
    with pytest.raises(ValueError, match="clip_hgh: TrainConfig has no such field. Fix: did you mean clip_high"):
        TrainConfig.make(clip_hgh=0.3)


def test_every_leaf_has_one_flat_name():
    flat = TrainConfig().flat()
    leaves = {f.name for c in (LossConfig, SamplingConfig, OptimConfig)
              for f in dataclasses.fields(c)} - {"temperature", "decoupled"}   # derived
    tops = {f.name for f in dataclasses.fields(TrainConfig)} - {"loss", "sampling", "optim"}
    assert set(flat) == leaves | tops | {"temperature"}
    assert len(flat) == len(leaves) + len(tops) + 1


def test_loss_temperature_is_the_samplers():
    cfg = TrainConfig.make(temperature=0.7)
    assert cfg.loss.temperature == cfg.sampling.temperature == 0.7
    assert TrainConfig(sampling=SamplingConfig(temperature=0.5)).loss.temperature == 0.5


def test_decoupled_objective_follows_the_rollout():
    """Stale tokens (partial rollout) are learned from with decoupled PPO, others are not."""
    assert not TrainConfig().loss.decoupled
    assert not TrainConfig.make(rollout="engine").loss.decoupled       # k = 1, staleness 0
    cfg = TrainConfig.make(gen_batch_ratio=2)
    assert cfg.loss.decoupled and cfg.staleness_bound == 1 and cfg.use_engine
    assert TrainConfig.from_json(cfg.to_json()) == cfg
    assert not cfg.replace(gen_batch_ratio=1, max_staleness=0).loss.decoupled


def test_json_round_trip_and_flat_json():
    cfg = TrainConfig.make(clip_high=0.3, kl_coef=0.05, temperature=0.9, seed=3)
    d = cfg.to_json()
    assert d["loss"]["kl_coef"] == 0.05 and d["optim"]["base_lr"] == cfg.optim.base_lr
    assert d["batch_train"] == cfg.batch_train
    assert TrainConfig.from_json(d) == cfg
    assert TrainConfig.from_json({"clip_high": 0.3, "kl_coef": 0.05, "temperature": 0.9,
                                  "seed": 3, "unknown": 1}) == cfg


def test_errors_name_the_nested_field_by_its_flag():
    with pytest.raises(ValueError, match=r"^base_lr: must be > 0.*Fix: set --base_lr > 0"):
        TrainConfig.make(base_lr=0.0)
    with pytest.raises(ValueError, match=r"^dual_clip: "):
        validate(TrainConfig.make(dual_clip=0.5))
    with pytest.raises(ValueError, match="kl_kind"):
        TrainConfig.make(kl_kind="k9")
    with pytest.raises(ValueError, match="top_p"):
        TrainConfig.make(top_p=0.0)


def test_mesh_expert_must_divide_experts_and_devices():
    """--mesh_expert: an `expert` mesh axis for MoE models; one-line errors otherwise."""
    from jaxrl_scale.experiment.checks import check_mesh
    from jaxrl_scale.experiment.config import ConfigError, TrainConfig
    mesh = check_mesh(TrainConfig.make(model="moe_cpu", mesh_expert=4))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 1, "expert": 4, "tensor": 1}
    for kw, n, match in [(dict(model="moe_cpu", mesh_expert=8), 4, "does not divide the 4 devices"),
                         (dict(model="moe_cpu", mesh_expert=3), None, "8 experts"),
                         (dict(mesh_expert=2), None, "is dense")]:
        with pytest.raises(ConfigError, match=match):
            check_mesh(TrainConfig.make(**kw), num_devices=n)
