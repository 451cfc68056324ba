"""Batch size as a controller during a run (experiment/schedule.py): a schedule that never
moves is the fixed run bit for bit; a ramp changes P at its responses with the lr by the rule
and the Adam state carried; a resume mid-ramp is bit-identical; bad flags are one line before
any work; the noise rule's decisions on synthetic norms."""
import math
import os

import jax
import numpy as np
import optax
import pytest

from jaxrl_scale.checkpoint import Checkpointer
from jaxrl_scale.experiment.config import ConfigError, validate
from jaxrl_scale.experiment.schedule import (ScheduleState, after_step, decide,
                                             online_b_simple, parse_ramp, reachable_prompts)
from jaxrl_scale.experiment.states import trained_part
from jaxrl_scale.experiment.train import Run, run_training
from test_cli import _check, _table
from test_train import _records, tiny_cfg


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data"))


def _strip_times(recs):
    """The records without wall-clock fields (every `*_s`)."""
    return [{k: v for k, v in r.items() if not k.endswith("_s")} for r in recs]


def _cfg(run_dir, data_dir, **kw):
    """test_train's tiny run, 4 steps, 2 micro-batches, and a reward a random tiny policy
    earns unevenly (nonzero advantages, so the params move and the norms carry signal)."""
    base = dict(max_steps=4, eval_every=4, checkpoint_every=2, micro_batches=2,
                reward_fn="test_train:_digit_share")
    base.update(kw)
    return tiny_cfg(run_dir, data_dir, **base)


def _final_states(cfg):
    """The run's last checkpoint (params and optimizer state), as numpy."""
    like = trained_part(Run(cfg.replace(batch_schedule="none", batch_ramp="")).init_states)
    states, meta = Checkpointer(os.path.join(cfg.run_dir, "checkpoints")).restore(None, like)
    return jax.device_get(states), meta


def _assert_same_tree(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _adam_count(states) -> int:
    found = [s for s in jax.tree.leaves(states[0].opt_state,
                                        is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
             if isinstance(s, optax.ScaleByAdamState)]
    return int(found[0].count)


# ------------------------------------------------------------------ the loop, tiny runs


@pytest.fixture(scope="module")
def fixed_run(tmp_path_factory, data_dir):
    cfg = _cfg(tmp_path_factory.mktemp("fixed"), data_dir)
    run_training(cfg, progress=False)
    return cfg


@pytest.mark.parametrize("kw", [dict(batch_schedule="steps", batch_ramp="0:4"),
                                dict(batch_schedule="noise", batch_cap=16, schedule_every=2,
                                     schedule_window=2, schedule_c=1e-9)])
def test_a_schedule_that_never_moves_is_the_fixed_run(tmp_path, data_dir, fixed_run, kw):
    """`steps` with one entry at P0, and `noise` with the cap at the starting batch: the
    metrics (the noise decisions' own fields aside) and the params are the fixed run's, bit
    for bit."""
    cfg = _cfg(tmp_path, data_dir, **kw)
    run_training(cfg, progress=False)
    want, got = _strip_times(_records(fixed_run.run_dir)), _strip_times(_records(cfg.run_dir))
    extra = {"B_simple_online", "B_simple_online_lo", "B_simple_online_hi",
             "schedule_doublings_wanted"}
    if kw["batch_schedule"] == "noise":   # decided at steps 2 and 4, and kept the batch
        assert [r["step"] for r in got if "schedule_doublings_wanted" in r] == [2, 4]
        got = [{k: v for k, v in r.items() if k not in extra} for r in got]
    assert got == want
    _assert_same_tree(_final_states(cfg)[0], _final_states(fixed_run)[0])


@pytest.fixture(scope="module")
def ramp_run(tmp_path_factory, data_dir):
    cfg = _cfg(tmp_path_factory.mktemp("ramp"), data_dir, batch_schedule="steps",
               batch_ramp="0:4,32:8", max_steps=5)
    run_training(cfg, progress=False)
    return cfg


def test_steps_ramp_changes_p_at_its_responses_with_the_sqrt_lr(ramp_run):
    """P = 4 (16 responses) until 32 responses are trained, then 8; the lr follows the sqrt
    rule at each batch; the Adam state carries across the change (its count keeps rising)."""
    recs = [r for r in _records(ramp_run.run_dir) if "actor_loss" in r]
    assert [r["batch_train"] for r in recs] == [16, 16, 32, 32, 32]
    assert [r["responses"] for r in recs] == [16, 32, 64, 96, 128]
    np.testing.assert_allclose([r["lr"] for r in recs],
                               [1e-3] * 2 + [1e-3 * math.sqrt(2)] * 3, rtol=1e-6)
    assert [r["updates"] for r in recs] == [1, 2, 3, 4, 5]
    assert [r["micro_batch_size"] for r in recs] == [8, 8, 16, 16, 16]
    states, meta = _final_states(ramp_run)
    assert _adam_count(states) == 5
    assert meta["schedule"] == {"prompts": 8, "last_change": 2, "window": []}


def test_resume_mid_ramp_is_bit_identical(tmp_path, data_dir, ramp_run, monkeypatch):
    """Stopped after step 3 (checkpoint at step 2, where the ramp had just doubled P) and
    resumed: the same records and params as the uninterrupted run. Each call builds and
    compiles the update at both P before its first step (none inside the run's clock)."""
    calls = []
    for name in ("_update_parts", "compile", "train_step"):
        def traced(self, *a, _orig=getattr(Run, name), _name=name, **k):
            calls.append(_name)
            return _orig(self, *a, **k)
        monkeypatch.setattr(Run, name, traced)
    cfg = ramp_run.replace(run_dir=str(tmp_path))
    out = run_training(cfg, progress=False, stop_after_steps=3)
    assert not out["finished"]
    assert run_training(cfg, progress=False)["finished"]
    before = ["_update_parts", "compile", "_update_parts", "compile"]
    assert calls == before + ["train_step"] * 3 + before + ["train_step"] * 3
    assert _strip_times(_records(cfg.run_dir)) == _strip_times(_records(ramp_run.run_dir))
    _assert_same_tree(_final_states(cfg)[0], _final_states(ramp_run)[0])


def test_noise_schedule_resumes_bit_identically(tmp_path, data_dir):
    """`noise` deciding every 2 steps on a 2-update window, c so large that any positive lower
    bound doubles (once per decision, up to the cap): stopped after step 3 (checkpoint at step
    2, just after a doubling, with its window) and resumed, the same records and params."""
    kw = dict(batch_schedule="noise", batch_cap=64, schedule_every=2, schedule_window=2,
              schedule_c=1e6, max_steps=5)
    ref = _cfg(tmp_path / "ref", data_dir, **kw)
    run_training(ref, progress=False)
    cfg = _cfg(tmp_path / "cut", data_dir, **kw)
    run_training(cfg, progress=False, stop_after_steps=3)
    run_training(cfg, progress=False)
    want = _strip_times(_records(ref.run_dir))
    assert _strip_times(_records(cfg.run_dir)) == want
    decided = [r for r in want if "schedule_doublings_wanted" in r]
    assert [r["step"] for r in decided] == [2, 4]
    batches = [r["batch_train"] for r in want if "actor_loss" in r]
    assert batches[:3] == [16, 16, 32] and batches == sorted(batches) and batches[-1] <= 64
    _assert_same_tree(_final_states(cfg)[0], _final_states(ref)[0])


# ------------------------------------------------------------------ flags


@pytest.mark.parametrize("kw, field", [
    (dict(batch_schedule="linear"), "batch_schedule"),
    (dict(batch_schedule="noise", batch_cap=1024), "micro_batches"),
    (dict(batch_schedule="noise", micro_batches=2, batch_cap=64), "batch_cap"),
    (dict(batch_schedule="steps"), "batch_ramp"),
    (dict(batch_schedule="steps", batch_ramp="0:32,100"), "batch_ramp"),
    (dict(batch_schedule="steps", batch_ramp="0:64,100:32"), "batch_ramp"),
    (dict(batch_schedule="steps", batch_ramp="100:64,0:128"), "batch_ramp"),
    (dict(batch_schedule="steps", batch_ramp="0:16"), "batch_ramp"),
    (dict(batch_ramp="0:64"), "batch_ramp"),
    (dict(schedule_every=0), "schedule_every"),
    (dict(schedule_c=0.0), "schedule_c"),
    (dict(batch_schedule="steps", batch_ramp="0:32,64:48", micro_batches=32), "batch_ramp"),
])
def test_bad_schedule_flags_name_the_field(kw, field):
    with pytest.raises(ConfigError, match=f"^{field}: .*Fix: "):
        validate(tiny_cfg("unused", "unused").replace(prompts_per_step=32, **kw))


SCHEDULE_ROWS = [
    ("--batch_schedule=noise --batch_cap=4096", "micro_batches"),
    ("--batch_schedule=noise --micro_batches=2 --batch_cap=8", "batch_cap"),
    ("--batch_schedule=steps --batch_ramp=0:32,x", "batch_ramp"),
    ("--batch_schedule=steps --batch_ramp=0:64,100:32", "batch_ramp"),
    ("--batch_schedule=sometimes", "batch_schedule"),
]


def test_train_bad_schedule_flags_exit_2_in_one_line_before_the_warmstart(tmp_path):
    """The installed command (warm-start on by default) refuses each row with one line and
    exit status 2 before any data, model or warm-start."""
    _check(_table(tmp_path, "jaxrl_scale.cli.train", SCHEDULE_ROWS), SCHEDULE_ROWS)


# ------------------------------------------------------------------ pure functions


def _window(n, g2=1.0, trace=1000.0, b_small=8, b_big=16):
    """n updates whose norms follow E|g_B|^2 = |G|^2 + tr(Sigma) / B exactly."""
    return tuple({"actor_grad_sqnorm_micro": [g2 + trace / b_small] * (b_big // b_small),
                  "actor_grad_sqnorm": g2 + trace / b_big, "batch": b_big,
                  "micro_batch_size": b_small} for _ in range(n))


def test_online_b_simple_recovers_the_noise_scale_of_synthetic_norms():
    est = online_b_simple(_window(6), seed=0)
    for k in ("B_simple_online", "B_simple_online_lo", "B_simple_online_hi"):
        assert est[k] == pytest.approx(1000.0)
    assert online_b_simple(_window(1), seed=0) is None   # no interval from one update
    noisy = [dict(r, actor_grad_sqnorm_micro=[m * (1 + 0.1 * ((i % 3) - 1))
                                              for m in r["actor_grad_sqnorm_micro"]])
             for i, r in enumerate(_window(12))]
    est = online_b_simple(noisy, seed=0)
    assert est["B_simple_online_lo"] <= est["B_simple_online"] <= est["B_simple_online_hi"]


def test_decide_doubles_once_when_c_times_the_lower_bound_exceeds_the_batch():
    # c * lo = 430 > 16: 16 -> 32 now; a rule jumping while c * lo > B would take 5 at once
    assert decide(1000.0, 16, 1024, 0.43) == (32, 5)
    assert decide(1000.0, 256, 1024, 0.43) == (512, 1)
    assert decide(1000.0, 512, 1024, 0.43) == (512, 0)   # 430 < 512: kept
    assert decide(1000.0, 16, 32, 0.43) == (32, 1)       # the cap bounds it
    assert decide(1000.0, 32, 32, 0.43) == (32, 0)
    assert decide(math.nan, 16, 1024, 0.43) == (16, 0)   # no interval: kept
    assert decide(math.inf, 16, 64, 0.43) == (32, 2)     # unbounded: one doubling at a time
    assert decide(-5.0, 16, 64, 0.43) == (16, 0)


def test_after_step_decides_on_its_cadence_from_a_full_window():
    cfg = tiny_cfg("unused", "unused", batch_schedule="noise", micro_batches=2,
                   prompts_per_step=4, group_size=4, batch_cap=256, schedule_every=3,
                   schedule_window=4, schedule_c=0.43)
    rows = _window(6)
    state = ScheduleState(4)
    seen = []
    for step, row in enumerate(rows, start=1):
        rec = {"actor_grad_sqnorm_micro": row["actor_grad_sqnorm_micro"],
               "actor_grad_sqnorm": row["actor_grad_sqnorm"], "micro_batch_size": 8}
        state, fields = after_step(cfg, state, step, 16 * step, rec)
        seen.append((step, state.prompts, fields.get("schedule_doublings_wanted")))
    # step 3: window of 3 < 4, no decision; step 6: B_simple 1000, c * lo = 430 > 16
    assert seen[2] == (3, 4, None) and seen[5] == (6, 8, 4)
    assert state.last_change == 6 and len(state.window) == 4
    assert ScheduleState.from_json(state.to_json()) == state
    assert after_step(cfg, state, 7, 0, {})[0].window == state.window   # no update, no row


def test_ramp_parsing_and_the_reachable_batches():
    assert parse_ramp("0:4, 32:8,64:8") == ((0, 4), (32, 8), (64, 8))
    cfg = tiny_cfg("unused", "unused", batch_schedule="steps", batch_ramp="10:8,20:16")
    assert reachable_prompts(cfg) == (4, 8, 16)
    cfg = tiny_cfg("unused", "unused", batch_schedule="noise", micro_batches=2, batch_cap=100)
    assert reachable_prompts(cfg) == (4, 8, 16)   # 16 x 4 = 64 <= 100 < 128
    assert reachable_prompts(tiny_cfg("unused", "unused")) == (4,)
