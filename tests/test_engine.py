"""Slot engine and partial rollout: a synchronous round equals generate() bit for bit (one device
and 8), a refilled slot decodes what generate gives for its prompt alone, no recompiles across
refills, errors before compiling; with k = 2 every update takes exactly B_train rows, staleness
stays within its bound and the trained lengths are the completed rollouts' (no short bias)."""
import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from jaxrl_scale.models import get_config, init_params
from jaxrl_scale.rl.partial import PartialRollout, staleness_metrics
from jaxrl_scale.sampling import generate
from jaxrl_scale.sampling import engine as engine_mod
from jaxrl_scale.sampling.engine import SlotEngine
from jaxrl_scale.sampling.rules import SamplingConfig

N = 10


@pytest.fixture(scope="module")
def model():
    cfg = get_config("tiny")
    params = jax.tree.map(lambda a: a * 4.0 if a.ndim >= 2 else a, init_params(cfg, 0))
    return cfg, params


def _prompts(n, seed=0, lo=3, hi=12):
    rng = np.random.default_rng(seed)
    return [list(map(int, rng.integers(1, 128, size=rng.integers(lo, hi)))) for _ in range(n)]


def _drain(eng, params, **kw):
    rows = {}
    while eng.live.any():
        h = eng.advance(params, **kw)
        for j, s in enumerate(h["slots"]):
            rows[int(s)] = {k: h[k][j] for k in ("tokens", "logprobs", "lengths", "versions")}
    return rows


@pytest.mark.parametrize("devices, temperature", [(1, 1.0), (8, 1.0), (8, 0.0)])
def test_synchronous_round_equals_generate(model, devices, temperature):
    cfg, params = model
    mesh = None if devices == 1 else Mesh(np.array(jax.devices()[:8]), ("data",))
    prompts = _prompts(16)
    kw = dict(eos_id=5, pad_id=0, mesh=mesh)
    want = generate(cfg, params, prompts, max_new_tokens=N, temperature=temperature, seed=3, **kw)
    eng = SlotEngine(cfg, slots=16, prompt_len=12, max_new_tokens=N,
                     sampling=SamplingConfig(temperature), steps_per_call=4, **kw)
    eng.reset(3)
    eng.admit(params, prompts, range(16))
    rows = _drain(eng, params)
    got = {k: np.stack([rows[i][k] for i in range(16)]) for k in ("tokens", "logprobs", "lengths")}
    np.testing.assert_array_equal(got["tokens"], np.asarray(want.tokens))
    np.testing.assert_array_equal(got["logprobs"], np.asarray(want.logprobs))
    np.testing.assert_array_equal(got["lengths"], np.asarray(want.lengths))


def test_advance_reports_the_steps_it_ran(model):
    """Each call's "steps" is what it decoded: 0 when no watched slot is live, and the
    calls' steps add up to the steps take_occupancy counts."""
    cfg, params = model
    eng = SlotEngine(cfg, slots=4, prompt_len=12, max_new_tokens=N, eos_id=None, pad_id=0,
                     sampling=SamplingConfig(0.0), steps_per_call=3)
    eng.reset(0)
    eng.take_occupancy()
    eng.admit(params, _prompts(4, seed=2), range(4), limits=[2, N, 5, N])
    assert eng.advance(params, watch=np.zeros((4,), bool))["steps"] == 0
    steps = [eng.advance(params)["steps"] for _ in range(5)]
    assert steps[0] == 3 and sum(steps) == eng.take_occupancy()[1] == N
    assert steps[-1] == 0   # every slot finished after N steps


def test_refilled_slot_decodes_what_generate_gives_alone(model):
    cfg, params = model
    prompts = _prompts(8, seed=1)
    eng = SlotEngine(cfg, slots=4, prompt_len=12, max_new_tokens=N, eos_id=None, pad_id=0,
                     sampling=SamplingConfig(0.0), steps_per_call=3)
    eng.warm(params, [1, 2, 4])
    eng.reset(0)
    before = engine_mod.compile_count()
    eng.admit(params, prompts[:4], range(4), limits=[2, N, 5, N])
    nxt, rows, owner = 4, {}, {s: s for s in range(4)}   # owner: slot -> prompt index
    while eng.live.any() or nxt < len(prompts):
        h = eng.advance(params)
        for j, s in enumerate(h["slots"]):
            rows[owner[int(s)]] = h["tokens"][j][:h["lengths"][j]]
        free = eng.free_slots()[:len(prompts) - nxt]
        if free.size:   # refill at whatever ring column the engine is at (wraps around)
            for s in free:
                owner[int(s)], nxt = nxt, nxt + 1
            eng.admit(params, [prompts[owner[int(s)]] for s in free], free)
    assert engine_mod.compile_count() == before, "refills recompiled"
    assert sorted(rows) == list(range(8))
    limits = [2, N, 5, N] + [N] * 4
    for i, p in enumerate(prompts):
        alone = generate(cfg, params, [p], max_new_tokens=limits[i], temperature=0.0,
                         eos_id=None, pad_id=0)
        np.testing.assert_array_equal(rows[i], np.asarray(alone.tokens)[0], err_msg=f"row {i}")


def test_bad_input_raises_before_compiling(model):
    cfg, params = model
    eng = SlotEngine(cfg, slots=4, prompt_len=6, max_new_tokens=N, eos_id=None, pad_id=0)
    before = engine_mod.compile_count()
    with pytest.raises(ValueError, match="prompt capacity of 6"):
        eng.admit(params, [[1, 2, 3, 4, 5, 6, 7]], [0])
    with pytest.raises(ValueError, match="distinct free slot"):
        eng.admit(params, [[1, 2], [3]], [0, 0])
    with pytest.raises(ValueError, match="model context"):
        SlotEngine(cfg, slots=4, prompt_len=250, max_new_tokens=N, eos_id=None, pad_id=0)
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    with pytest.raises(ValueError, match="multiple of 8"):
        SlotEngine(cfg, slots=12, prompt_len=6, max_new_tokens=N, eos_id=None, pad_id=0,
                   mesh=mesh)
    assert engine_mod.compile_count() == before


def _long_tail_rollout(model, ratio, staleness, updates, P=4, G=2, seed=0, recompute=False):
    """PartialRollout over a synthetic long-tail length distribution (a row's length is its
    example's cap: 1-2 tokens mostly, N for one group in five). Returns the batches and the
    caps of the groups in admission order."""
    cfg, params = model
    rng = np.random.default_rng(seed)
    stream = iter(range(10 ** 6))
    admitted = []

    def next_example():
        i = next(stream)
        cap = int(N if rng.random() < 0.2 else rng.integers(1, 3))
        admitted.append(cap)
        return {"prompt": f"{i % 97}", "cap": cap}

    eng = SlotEngine(cfg, slots=ratio * P * G, prompt_len=4, max_new_tokens=N, eos_id=None,
                     pad_id=0, steps_per_call=2)
    pr = PartialRollout(eng, next_example, lambda s: [int(c) + 1 for c in s],
                        prompts_per_step=P, group_size=G, max_staleness=staleness,
                        recompute_kv=recompute, limit_fn=lambda ex: ex["cap"])
    batches = [pr.next_batch(params, version=v, seed=v) for v in range(updates)]
    return batches, admitted


@pytest.mark.parametrize("recompute", [False, True])
def test_partial_rollout_bounds_staleness_and_keeps_the_length_distribution(model, recompute):
    P, G, U = 4, 2, 12
    batches, admitted = _long_tail_rollout(model, 2, 1, U, P, G, recompute=recompute)
    trained = []
    for v, b in enumerate(batches):
        assert b.tokens_BM.shape[0] == P * G and len(b.examples) == P
        st = staleness_metrics(b.versions_BM, b.lengths_B, v)
        assert st["staleness_max"] <= 1
        lengths_PG = b.lengths_B.reshape(P, G)
        caps = [ex["cap"] for ex in b.examples]
        np.testing.assert_array_equal(lengths_PG, np.repeat(np.array(caps)[:, None], G, 1))
        trained += caps
    # Oldest first: the trained groups are exactly the first U*P admitted, long ones included.
    assert trained == admitted[:U * P]
    assert max(trained) == N
    some_stale = [staleness_metrics(b.versions_BM, b.lengths_B, v)["off_policy_token_frac"]
                  for v, b in enumerate(batches)]
    assert max(some_stale) > 0     # rows ran ahead of the policy and were kept


def test_partial_rollout_needs_fewer_decode_steps_than_synchronous(model):
    sync, _ = _long_tail_rollout(model, 1, 0, 8)
    part, _ = _long_tail_rollout(model, 2, 1, 8)
    # live rows per decode step = occupancy x slots (partial rollout has twice the slots)
    rows = lambda bs, slots: slots * np.mean([b.slot_occupancy for b in bs
                                              if b.decode_steps])
    steps = lambda bs: sum(b.decode_steps for b in bs)
    assert all(staleness_metrics(b.versions_BM, b.lengths_B, v)["staleness_max"] == 0
               for v, b in enumerate(sync))
    assert rows(part, 16) > 1.4 * rows(sync, 8), (rows(part, 16), rows(sync, 8))
    assert steps(part) < 0.8 * steps(sync), (steps(part), steps(sync))
