"""LoRA adapters (models/lora.py): exact start at the base model, merged == unmerged, gradients
and optimizer state for the adapters alone, sharded == single device, PEFT interchange."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numerics import (assert_adam_step_close, assert_tree_close, permute_mlp, reorder_floor,
                      tiny_qwen2, tree_diff, tree_norm)

from jaxrl_scale import optim
from jaxrl_scale import sharding as shd
from jaxrl_scale.models import forward, get_config, param_shapes
from jaxrl_scale.models import lora
from jaxrl_scale.rl import steps
from jaxrl_scale.rl.state import create_train_state, state_shardings
from jaxrl_scale.models.decoder import unstack_layers

CFG = get_config("tiny")          # qwen2 layout with q/k/v biases
LCFG = lora.LoraConfig(rank=4, alpha=8.0)
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}
FORWARD = jax.jit(forward, static_argnums=0, compiler_options=FAST_COMPILE)
UNSTACK = jax.jit(unstack_layers, static_argnums=0, compiler_options=FAST_COMPILE)


def np_tree(shapes, seed, scale=0.02):
    """N(0, scale) leaves (unit norms, zero biases) drawn with numpy: the jitted init would
    compile longer than these tests run."""
    rng = np.random.default_rng(seed)

    def make(path, shape):
        name = str(path[-1].key)
        if "norm" in name:
            return jnp.ones(shape, jnp.float32)
        if name.startswith("b") and not name.startswith("lora"):
            return jnp.zeros(shape, jnp.float32)
        return jnp.asarray(scale * rng.normal(size=shape), jnp.float32)

    return jax.tree_util.tree_map_with_path(make, shapes, is_leaf=lambda x: isinstance(x, tuple))


def base_params(seed=0):
    return np_tree(param_shapes(CFG), seed)


def trained_adapters(seed=1, cfg=CFG, lcfg=LCFG):
    """Adapters as after training: A and B both nonzero (B = 0 would hide the B path)."""
    return np_tree(lora.adapter_shapes(cfg, lcfg), seed, scale=0.1)


def _tokens(seed, shape):
    return jnp.asarray(np.random.default_rng(seed).integers(0, CFG.vocab_size, shape))


def test_zero_adapters_start_exactly_at_the_base_model():
    """PEFT's init (B = 0): the forward, and the merged weights decoding runs
    (decoder.unstack_layers), equal the base model's bit for bit."""
    base = base_params()
    adapters = lora.init_adapters(CFG, LCFG, jax.random.PRNGKey(3))
    a_q = np.asarray(adapters["layers"]["lora_a_q"])
    assert np.abs(a_q).max() <= 1 / np.sqrt(CFG.hidden_size) and np.abs(a_q).max() > 0
    assert all(not np.any(np.asarray(v)) for k, v in adapters["layers"].items()
               if k.startswith("lora_b_"))
    tokens, valid = _tokens(0, (3, 9)), jnp.asarray(np.arange(9)[None] >= np.array([[0], [2], [5]]))
    composed = lora.compose(base, adapters, LCFG.scale)
    np.testing.assert_array_equal(np.asarray(FORWARD(CFG, composed, tokens, valid)),
                                  np.asarray(FORWARD(CFG, base, tokens, valid)))
    got, want = UNSTACK(CFG, composed), UNSTACK(CFG, base)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_merged_equals_unmerged():
    """x W + (x A) B (the update's path) == x (W + A B) (the decode's), to the rounding of a
    forward: the spread of the merged model with its MLP units reordered."""
    base, adapters = base_params(), trained_adapters()
    tokens = _tokens(1, (2, 11))
    unmerged = FORWARD(CFG, lora.compose(base, adapters, LCFG.scale), tokens)
    merged_params = lora.merge(base, adapters, LCFG.scale)
    assert not any(k.startswith("lora_") for k in merged_params["layers"])
    merged = FORWARD(CFG, merged_params, tokens)
    floor = reorder_floor(merged, FORWARD(CFG, permute_mlp(merged_params), tokens))
    assert_tree_close(unmerged, merged, floor, tree_norm(merged))
    # and the adapters matter: the merged model is not the base one
    assert tree_norm(merged - FORWARD(CFG, base, tokens)) > 100 * floor


LR = 1e-2


def _lora_state(seed=0):
    tx = optim.make_optimizer(optim.AdamHParams(lr=LR), max_grad_norm=1.0)
    return tx, create_train_state(trained_adapters(seed + 1), tx, seed, frozen=base_params(seed))


def _grpo_batch(seed=0, rows=8, group=2):
    from jaxrl_scale.rl.batch import rollout_batch
    rng = np.random.default_rng(seed)
    prompts = [list(rng.integers(1, CFG.vocab_size, rng.integers(1, 4))) for _ in range(rows)]
    resp = rng.integers(1, CFG.vocab_size, (rows, 5)).astype(np.int32)
    logp = -np.log(CFG.vocab_size) + 0.2 * rng.normal(size=(rows, 5))
    batch, _ = rollout_batch(prompts, resp, logp, rng.integers(1, 6, rows), rng.normal(size=rows),
                             prompt_len=3, pad_id=0, group_size=group)
    return jax.tree.map(jnp.asarray, batch)


def test_only_adapters_get_gradients_and_optimizer_state():
    """The step's gradients and Adam moments have the adapters' tree, the base comes back
    unchanged, and the adapters' gradient equals autodiff through the merged weights."""
    tx, state = _lora_state()
    base_before = jax.tree.map(np.asarray, state.frozen)
    adapters_before = jax.tree.map(np.asarray, state.params)
    opts = steps.StepOptions(cfg=CFG, tx=tx, group_size=2, with_grads=True,
                             lora_scale=LCFG.scale)
    mu_leaves = [x for x in jax.tree.leaves(state.opt_state) if np.ndim(x) > 0]
    assert sum(np.size(x) for x in mu_leaves) == 2 * lora.tree_size(state.params)
    batch = _grpo_batch()
    new, m = jax.jit(lambda s, b: steps.grpo_step(s, b, opts),
                     compiler_options=FAST_COMPILE)(state, batch)
    assert jax.tree.structure(m["actor_grads"]) == jax.tree.structure(state.params)
    assert jax.tree.structure(new.opt_state) == jax.tree.structure(state.opt_state)
    for x, y in zip(jax.tree.leaves(new.frozen), jax.tree.leaves(base_before)):
        np.testing.assert_array_equal(np.asarray(x), y)
    assert all(np.any(np.asarray(x) != y) for x, y in
               zip(jax.tree.leaves(new.params), jax.tree.leaves(adapters_before)))

    # The same loss with the adapters merged into full weights (autodiff through W + A B).
    data = steps._actor_data(batch, steps._grpo_advantages_BS(batch, 2, "grpo"), opts.loss_cfg)
    row_scale_B, denom = steps._norm_parts(data["mask_BS"], opts.loss_cfg.agg)
    data = dict(data, w_BS=data["mask_BS"] * row_scale_B[:, None] / denom)
    loss_fn = steps._actor_loss_fn(CFG, opts.loss_cfg, False, denom)

    def merged_loss(adapters):
        return loss_fn(lora.merge(state.frozen, adapters, LCFG.scale), data)[0]

    want = jax.jit(jax.grad(merged_loss), compiler_options=FAST_COMPILE)(state.params)
    got = m["actor_grads"]
    # floor: the same step on the batch's groups reordered (another summation order)
    _, m_perm = jax.jit(lambda s, b: steps.grpo_step(s, b, opts),
                        compiler_options=FAST_COMPILE)(_lora_state()[1], _reordered(batch))
    assert_tree_close(got, want, tree_diff(got, m_perm["actor_grads"]), tree_norm(want))


def _reordered(batch, groups=4, group=2, seed=5):
    perm = np.random.default_rng(seed).permutation(groups)
    rows = np.concatenate([np.arange(group * p, group * p + group) for p in perm])
    return jax.tree.map(lambda x: x[rows], batch)


def test_sharded_lora_step_equals_one_device():
    """On 8 fake devices (data 2 x fsdp 2 x tensor 2) the base is sharded by the rule table,
    the adapters replicated, and the update equals the single-device one."""
    tx, state = _lora_state()
    opts = dict(cfg=CFG, tx=tx, group_size=2, lora_scale=LCFG.scale, with_grads=True,
                compiler_options=FAST_COMPILE)
    batch = _grpo_batch()
    step1 = steps.make_train_step(steps.grpo_step, donate=False, **opts)
    one, m1 = step1(state, batch)
    _, m_reo = step1(state, _reordered(batch))
    mesh = shd.make_mesh(2, 2, 2)
    sh = state_shardings(mesh, state)
    wq_shape = state.frozen["layers"]["wq"].shape
    assert sh.frozen["layers"]["wq"].spec == shd.spec_for(mesh, "wq", wq_shape)
    assert sh.frozen["layers"]["wq"].spec != jax.sharding.PartitionSpec()
    assert sh.params["layers"]["lora_a_q"].spec == jax.sharding.PartitionSpec()
    sharded = jax.device_put(state, sh)
    many, m8 = steps.make_train_step(steps.grpo_step, sharded, mesh=mesh, donate=False,
                                     **opts)(sharded, batch)
    g1, g8 = m1["actor_grads"], m8["actor_grads"]
    assert_tree_close(g8, g1, tree_diff(g1, m_reo["actor_grads"]), tree_norm(g1))
    assert_adam_step_close(many, one, state, g8, g1, optim.AdamHParams(lr=LR))
    for x, y in zip(jax.tree.leaves(many.frozen), jax.tree.leaves(state.frozen)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_lora_config_rejects_bad_settings():
    assert lora.invalid(0, 16, ("q",))[0] == "lora_rank"
    assert lora.invalid(4, 0, ("q",))[0] == "lora_alpha"
    assert lora.invalid(4, 16, ("q", "x"))[0] == "lora_targets"
    assert lora.invalid(4, 16, ("q", "q"))[0] == "lora_targets"
    assert lora.invalid(4, 16, ())[0] == "lora_targets"
    assert lora.invalid(4, 16, ("q", "down"), get_config("moe_cpu"))[0] == "lora_targets"
    assert lora.invalid(4, 16, ("q", "o"), get_config("moe_cpu")) is None
    with pytest.raises(ValueError, match="lora_targets"):
        lora.LoraConfig(4, 16.0, ("qq",))


# ----------------------------------------------------------------------------- PEFT / HF

def _hf_qwen2(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = tiny_qwen2()
    model.save_pretrained(tmp_path / "base")
    return model


def test_peft_export_loads_in_peft_with_the_same_logits(tmp_path):
    """save_peft's directory loads with peft.PeftModel.from_pretrained: PEFT's own key names
    and shapes, the same logits as our unmerged forward; the merged HF export loads in plain
    transformers with the same logits too."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from jaxrl_scale.models import load_hf
    hf_model = _hf_qwen2(tmp_path)
    cfg, base = load_hf(str(tmp_path / "base"))
    lcfg = lora.LoraConfig(rank=4, alpha=12.0, targets=("q", "k", "v", "o", "gate", "up", "down"))
    adapters = np_tree(lora.adapter_shapes(cfg, lcfg), 3, scale=0.2)
    lora.save_peft(tmp_path / "adapter", cfg, lcfg, adapters,
                   base_model_name_or_path=str(tmp_path / "base"))

    # PEFT's own state-dict names and shapes for this config are exactly ours.
    fresh = peft.get_peft_model(type(hf_model)(hf_model.config), peft.LoraConfig(
        r=4, lora_alpha=12, target_modules=sorted(json.load(open(
            tmp_path / "adapter" / lora.PEFT_CONFIG_FILE))["target_modules"])))
    want_sd = {("base_model.model." + k.split("base_model.model.", 1)[1]): tuple(v.shape)
               for k, v in peft.get_peft_model_state_dict(fresh).items()}
    got_sd = {k: v.shape for k, v in lora.peft_state_dict(cfg, lcfg, adapters).items()}
    assert got_sd == want_sd

    loaded = peft.PeftModel.from_pretrained(hf_model, str(tmp_path / "adapter")).eval()
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 12))
    with torch.no_grad():
        theirs = loaded(torch.tensor(tokens)).logits.numpy()
    ours = np.asarray(FORWARD(cfg, lora.compose(base, adapters, lcfg.scale), jnp.asarray(tokens)))
    base_logits = np.asarray(FORWARD(cfg, base, jnp.asarray(tokens)))
    assert np.abs(ours - base_logits).max() > 0.1          # the adapters change the logits
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)

    # Round trip through PEFT's format, and the merged export in plain transformers.
    lcfg2, adapters2 = lora.load_peft(tmp_path / "adapter", cfg)
    assert lcfg2 == lcfg
    for x, y in zip(jax.tree.leaves(adapters2), jax.tree.leaves(adapters)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    import transformers
    lora.save_merged_hf(tmp_path / "merged", cfg, base, adapters, lcfg)
    merged_hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).eval()
    with torch.no_grad():
        np.testing.assert_allclose(merged_hf(torch.tensor(tokens)).logits.numpy(), theirs,
                                   atol=1e-4, rtol=0)
    assert os.path.isfile(tmp_path / "merged" / "config.json")
