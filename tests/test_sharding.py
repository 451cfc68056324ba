"""Mesh sizing, the partition rule table, born-sharded params, and sharded == 1-device updates."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxrl_scale import sharding as shd
from jaxrl_scale.models import param_shapes
from jaxrl_scale.rl import steps
from jaxrl_scale.rl.state import init_train_state, shard_train_state
from jaxrl_scale.rl.value import init_critic_from_actor

# The 1-device reference runs (and their compiled steps) are shared with test_steps.
from numerics import assert_adam_step_close, assert_tree_close, tree_norm
from test_steps import (CFG, CTX, FAST_COMPILE, GT, HP, LOSS_CFG, LR_FN, TX,
                        assert_grpo_steps_match, assert_metrics_close, assert_ppo_step_close,
                        make_grpo_batch, make_ppo_batch, new_state, np_params, ppo_fn)
from test_steps import grpo_reference as grpo_with_floors
from test_steps import ppo_reference as ppo_with_floors

MESHES = {"data8": dict(data=8), "d2f2t2": dict(data=2, fsdp=2, tensor=2),
          "f4t2": dict(fsdp=4, tensor=2)}


# ----------------------------------------------------------------------------- mesh, rules


def test_make_mesh_sizes():
    assert dict(shd.make_mesh().shape) == {"data": 8, "fsdp": 1, "tensor": 1}
    assert dict(shd.make_mesh(data=2, fsdp=-1, tensor=2).shape) == {
        "data": 2, "fsdp": 2, "tensor": 2}
    assert dict(shd.make_mesh(tensor=2, devices=jax.devices()[:4]).shape) == {
        "data": 2, "fsdp": 1, "tensor": 2}
    with pytest.raises(ValueError, match="3 devices, but 8"):
        shd.make_mesh(data=3)
    with pytest.raises(ValueError, match="does not divide the 8 devices"):
        shd.make_mesh(data=-1, tensor=3)
    with pytest.raises(ValueError, match="at most one"):
        shd.make_mesh(data=-1, fsdp=-1)


def test_rule_table_covers_every_parameter_kind():
    cfg = CFG.replace(qk_norm=True)
    params = init_critic_from_actor(
        jax.tree.map(jnp.zeros, param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple)),
        jax.random.PRNGKey(0))
    kinds = {str(p[-1].key) for p, _ in jax.tree_util.tree_leaves_with_path(params)}
    kinds |= {"lm_head"}
    assert kinds <= set(shd.PARAM_RULES), kinds - set(shd.PARAM_RULES)


def test_specs_and_non_dividing_dims():
    mesh = shd.make_mesh(data=2, fsdp=2, tensor=2)
    sh = shd.tree_shardings(mesh, param_shapes(CFG))      # shape tuples are accepted
    assert sh["layers"]["wq"].spec == P(None, "fsdp", "tensor", None)
    assert sh["layers"]["wo"].spec == P(None, "tensor", None, "fsdp")
    assert sh["layers"]["w_down"].spec == P(None, "tensor", "fsdp")
    assert sh["layers"]["bk"].spec == P(None, "tensor", None)
    assert sh["embed"].spec == P("tensor", "fsdp") and sh["lm_head"].spec == P("fsdp", "tensor")
    assert sh["final_norm"].spec == P(None) and sh["layers"]["attn_norm"].spec == P(None, None)
    # tensor=8: 4 query heads and 2 kv heads do not divide, F = 128 does.
    mesh8 = shd.make_mesh(data=1, tensor=8)
    sh8 = shd.tree_shardings(mesh8, param_shapes(CFG))
    assert sh8["layers"]["wq"].spec == P(None, None, None, None)
    assert sh8["layers"]["w_up"].spec == P(None, None, "tensor")


def test_params_and_optimizer_state_born_sharded():
    mesh = shd.make_mesh(data=2, fsdp=2, tensor=2)
    shapes = param_shapes(CFG)

    def init():  # cheap deterministic init; the point is where the arrays are born
        return jax.tree.map(lambda s: jnp.full(s, 0.5, jnp.float32), shapes,
                            is_leaf=lambda x: isinstance(x, tuple))

    state = init_train_state(init, TX, mesh=mesh)
    wq = state.params["layers"]["wq"]                         # [L, D=64, N=4, H=16]
    assert wq.sharding.spec == P(None, "fsdp", "tensor", None)
    assert wq.addressable_shards[0].data.shape == (CFG.num_layers, 32, 2, CFG.head_dim)
    np.testing.assert_array_equal(wq, 0.5)
    adam = state.opt_state.inner_state[1][0]                  # clip -> (adam, schedule)
    assert adam.mu["layers"]["wq"].sharding.spec == wq.sharding.spec
    assert adam.nu["layers"]["w_down"].sharding.spec == P(None, "tensor", "fsdp")
    assert adam.count.sharding.spec == P()
    assert state.opt_state.nonfinite_count.sharding.spec == P()
    assert state.step.sharding.spec == P() and state.rng.sharding.spec == P()


def test_batch_not_divisible_gives_clear_error():
    mesh = shd.make_mesh(data=2, fsdp=2, tensor=2)
    batch = make_grpo_batch(0, rows=6)
    state = shard_train_state(mesh, new_state(np_params(CFG)))
    fn = steps.make_train_step(steps.grpo_step, state, mesh=mesh, cfg=CFG, tx=TX,
                               loss_cfg=LOSS_CFG, group_size=2)
    with pytest.raises(ValueError, match=r"6 rows .* 2 x 2 = 4 data-parallel devices"):
        fn(state, batch)


# ----------------------------------------------------------------------------- equivalence


@pytest.fixture(scope="module")
def params():
    return np_params(CFG, 0)


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_grpo_on_mesh_matches_one_device(params, mesh_name):
    """Three donated steps on the mesh, each equal to the 1-device step from the same state
    (gradients, params and Adam moments), the state staying sharded by the rule table."""
    batches = [make_grpo_batch(s) for s in range(3)]
    mesh = shd.make_mesh(**MESHES[mesh_name])
    state = shard_train_state(mesh, new_state(params))
    fn = steps.make_train_step(steps.grpo_step, state, mesh=mesh, compiler_options=FAST_COMPILE,
                               cfg=CFG, tx=TX, loss_cfg=LOSS_CFG, micro_batches=2, lr_fn=LR_FN,
                               with_grads=True, group_size=GT)
    state, metrics = assert_grpo_steps_match(fn, state, batches)
    assert_metrics_close(*metrics[0], batches[0], ("actor_loss",))
    want = shd.spec_for(mesh, "wq", params["layers"]["wq"].shape)
    assert state.params["layers"]["wq"].sharding.spec == want
    assert state.opt_state.inner_state[1][0].mu["layers"]["wq"].sharding.spec == want


@pytest.fixture(scope="module")
def ppo_reference(params):
    critic = init_critic_from_actor(params, jax.random.PRNGKey(1))
    batch = make_ppo_batch(0)
    actor, critic_state, metrics, floor = ppo_with_floors(params, critic, batch)
    return critic, batch, (actor, critic_state, metrics), floor


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_ppo_on_mesh_matches_one_device(params, ppo_reference, mesh_name):
    critic, batch, (ref_actor, ref_critic, ref_m), floor = ppo_reference
    mesh = shd.make_mesh(**MESHES[mesh_name])
    states = (shard_train_state(mesh, new_state(params)),
              shard_train_state(mesh, new_state(critic, CTX)))
    fn = ppo_fn(2, states=states, mesh=mesh)
    actor, critic_state, m = fn(*states, batch)
    for k in ("actor_grads", "critic_grads"):
        assert_tree_close(m[k], ref_m[k], floor[k], tree_norm(ref_m[k]))
    assert_ppo_step_close((actor, critic_state, m), (ref_actor, ref_critic, ref_m), params,
                          critic)
    assert critic_state.params["value_w"].sharding.spec == shd.spec_for(
        mesh, "value_w", critic["value_w"].shape)


@pytest.mark.parametrize("mesh_name", ["data8", "d2f2t2"])
def test_shared_prompt_update_on_mesh_matches_one_device(params, mesh_name):
    """The shared-prompt update (prompt rows = groups, fewer than the data-parallel devices
    here) on a mesh equals the 1-device shared-prompt update."""
    from test_steps import TP
    G = 4
    batch = make_grpo_batch(0, shared_group=G)
    ref_state, (ref,), floor = grpo_with_floors(params, [batch], group_size=G,
                                                shared_prompt_len=TP)
    mesh = shd.make_mesh(**MESHES[mesh_name])
    state = shard_train_state(mesh, new_state(params))
    fn = steps.make_train_step(steps.grpo_step, state, mesh=mesh, compiler_options=FAST_COMPILE,
                               cfg=CFG, tx=TX, loss_cfg=LOSS_CFG, micro_batches=2, lr_fn=LR_FN,
                               with_grads=True, group_size=G, shared_prompt_len=TP)
    state, m = fn(state, batch)
    g_ref = ref["actor_grads"]
    assert_tree_close(m["actor_grads"], g_ref, floor["grads"], tree_norm(g_ref))
    assert_metrics_close(m, ref, batch, ("actor_loss",), group_size=G)
    assert_adam_step_close(state, ref_state, new_state(params), m["actor_grads"], g_ref, HP)
