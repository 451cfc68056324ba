"""--remat: an update under rematerialisation (full, or a jax.checkpoint_policies policy) is
the update without it, the policies keep what they say for the backward, and the setting is a
validated, recorded TrainConfig field that reaches the train step.

What holds on CPU, checked before writing these tests: the gradients are not bitwise equal
(XLA fuses the recomputed forward differently, ~1e-8 apart) and Adam turns that into params
up to ~1e-5 apart where a gradient entry is near eps. So each update is checked as the
micro-batch tests check theirs (test_steps.assert_grpo_steps_match): gradients within the
rounding floor of the same update on the batch's groups reordered, params and Adam moments
within the derived one-step bound (numerics.assert_adam_step_close).
"""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_steps import (CFG, GT, TP, _grpo_fn, assert_grpo_steps_match, make_grpo_batch,
                        new_state, np_params)

from jaxrl_scale.experiment.config import ConfigError, TrainConfig, check_resume, write_config
from jaxrl_scale.models import forward, remat


@pytest.fixture(scope="module")
def params():
    return np_params(CFG, 0)


@pytest.mark.parametrize("setting", ["full", "dots_with_no_batch_dims_saveable"])
@pytest.mark.parametrize("shared", [0, TP], ids=["rows", "shared_prompt"])
def test_update_under_remat_is_the_update_without(params, setting, shared):
    """Both decoder paths (every row, and each group's prompt once) under remat."""
    batch = make_grpo_batch(0, shared_group=GT if shared else 0)
    kw = dict(shared_prompt_len=shared) if shared else {}
    state, ((m, want),) = assert_grpo_steps_match(_grpo_fn(1, remat=setting, **kw),
                                                  new_state(params), [batch], **kw)
    assert int(state.step) == 1 and float(np.asarray(want["actor_grad_norm"])) > 0


def test_bool_remat_is_none_or_full():
    """The benchmarks' bool flag: False and True are "none" and "full"."""
    assert remat.policy(False) == remat.policy("none") == remat.policy(None) == (False, None)
    assert remat.policy(True) == remat.policy("full") == (True, None)
    fn = lambda x: x   # noqa: E731
    assert remat.remat_block(fn, "none") is fn
    for bad in ("sometimes", "save_only_these_names", 1):
        with pytest.raises(ValueError, match="unknown"):
            remat.policy(bad)


def test_policies_keep_what_they_say_for_the_backward():
    """What the forward keeps for its backward (shapes only, no compile): everything without
    remat, each layer's input with full, and in between for the dot policies, dots_saveable
    (every matmul) more than dots_with_no_batch_dims_saveable (the products with a weight,
    which are the custom-VJP `dense`: recognised through its name). The last two would equal
    full if the policy or the name were lost on the way to jax.checkpoint."""
    p = jax.eval_shape(lambda: np_params(CFG, 0))
    tokens = jnp.zeros((4, 16), jnp.int32)
    kept = {r: remat.residual_bytes(lambda q: forward(CFG, q, tokens, remat=r), p)
            for r in ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable",
                      "nothing_saveable", "everything_saveable")}
    assert kept["none"] > kept["dots_saveable"] > kept["dots_with_no_batch_dims_saveable"] \
        > kept["full"], kept
    assert kept["nothing_saveable"] == kept["full"], kept
    assert kept["everything_saveable"] > kept["dots_saveable"], kept
    assert remat.residual_bytes(lambda q: forward(CFG, q, tokens, remat=True), p) == \
        kept["full"]


def test_remat_field_is_validated_recorded_and_not_resumable_with_another(tmp_path):
    assert TrainConfig().remat == "none"
    cfg = TrainConfig.make(remat="dots_saveable", run_dir=str(tmp_path / "r"))
    assert TrainConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ConfigError, match="^remat: 'sometimes' is unknown. Fix: use one of "
                                          "none, full, dots_saveable"):
        TrainConfig.make(remat="sometimes")
    write_config(cfg.run_dir, cfg)
    with open(os.path.join(cfg.run_dir, "config.json")) as f:
        assert json.load(f)["remat"] == "dots_saveable"
    (tmp_path / "r" / "metrics.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(ConfigError, match="remat \\(saved 'dots_saveable', now 'full'\\)"):
        check_resume(cfg.replace(remat="full"))
    old = json.load(open(os.path.join(cfg.run_dir, "config.json")))
    del old["remat"]              # a run saved before the field existed resumes as "none"
    assert TrainConfig.from_json(old).remat == "none"


def test_the_run_passes_its_remat_to_the_update(tmp_path, monkeypatch):
    """Run builds its update with cfg.remat (stopped right there: nothing is compiled)."""
    import jaxrl_scale.experiment.train as train
    from test_train import tiny_cfg
    seen = []

    class Built(Exception):
        pass

    def capture(step_fn, states, *, mesh=None, options=None, **kw):
        seen.append(options.remat)
        raise Built

    monkeypatch.setattr(train, "make_train_step", capture)
    with pytest.raises(Built):
        train.Run(tiny_cfg(tmp_path / "run", str(tmp_path / "data"), remat="full"))
    assert seen == ["full"]
