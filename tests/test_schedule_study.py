"""A scheduled config in the study: its name round-trips, the analysis takes it as one more
config (N counts responses; T/T0 against the reference with its interval and verdict, r_q
from the timing pass integrated along its recorded trajectory), the report draws its batch
trajectory, and the planner integrates its r_N(B) and r_q(B) along a trajectory."""
import dataclasses
import json
import math
import os

import numpy as np
import pytest

from jaxrl_scale import scaling
from jaxrl_scale.experiment.study import run_name
from jaxrl_scale.scaling import drift
from jaxrl_scale.scaling.configs import format_config_name, parse_config_name
from jaxrl_scale.scaling.schedule_plan import (batch_fractions, parse_segments,
                                               pass_ratio_along, responses_by_batch,
                                               segments_from_records, time_to_target)
from jaxrl_scale.scaling.synthetic import SyntheticRun, write_synthetic_run

# ------------------------------------------------------------------ names


@pytest.mark.parametrize("kw", [
    dict(algo="grpo", P=16, G=8, rule="sqrt"),
    dict(algo="grpo", P=16, G=8, rule="sqrt", schedule="noise"),
    dict(algo="grpo", P=8, G=8, rule="sqrt", schedule="steps", u=2, k=2, seed=3),
    dict(algo="ppo", P=64, G=1, rule="fixed", E=2, seed=0),
])
def test_config_names_round_trip(kw):
    name = format_config_name(**kw)
    got = parse_config_name(name)
    assert format_config_name(**got) == name
    assert {k: got[k] for k in kw} == kw


def test_the_study_names_its_scheduled_runs_as_configs_parses_them():
    name = run_name("grpo", 16, 8, "sqrt", 0, schedule="noise")
    assert name == "grpo_P16_G8_sqrt_sched-noise_s0"
    assert parse_config_name(name)["schedule"] == "noise"
    assert run_name("grpo", 16, 8, "sqrt", 1, k=2, u=2, schedule="steps") == format_config_name(
        "grpo", 16, 8, "sqrt", "steps", u=2, k=2, seed=1)
    assert run_name("grpo", 16, 8, "sqrt", 0) == "grpo_P16_G8_sqrt_s0"   # old names kept
    assert parse_config_name("my_run") is None


def test_a_study_runs_both_schedule_kinds_beside_the_fixed_batches():
    from jaxrl_scale.experiment.config import ConfigError, TrainConfig
    from jaxrl_scale.experiment.study import check_sweep_fields, plan, study_config
    sweep = study_config("default", prompts=(16, 32), warm_starts=2, seeds=(0,),
                         batch_schedule="noise,steps", batch_ramp="0:16,4096:32")
    check_sweep_fields(sweep)
    runs = {os.path.basename(c.run_dir): c for c in plan(sweep, TrainConfig())}
    assert {n for n in runs if n.endswith("_s0")} == {
        "grpo_P16_G8_sqrt_s0", "grpo_P32_G8_sqrt_s0", "grpo_P16_G8_sqrt_sched-noise_s0",
        "grpo_P16_G8_sqrt_sched-steps_s0"} and len(runs) == 4
    steps, noise = runs["grpo_P16_G8_sqrt_sched-steps_s0"], runs["grpo_P16_G8_sqrt_sched-noise_s0"]
    assert (steps.batch_schedule, steps.batch_ramp) == ("steps", "0:16,4096:32")
    assert (noise.batch_schedule, noise.batch_ramp) == ("noise", "")
    for bad in ("noise,none", "noise,noise", "noise,fast"):
        with pytest.raises(ConfigError, match="batch_schedule"):
            check_sweep_fields(dataclasses.replace(sweep, batch_schedule=bad))


# ------------------------------------------------------------------ trajectories


def test_recorded_trajectory_and_its_shares_to_target():
    train = [{"responses": n, "batch_train": b} for n, b in
             ((64, 64), (128, 64), (256, 128), (384, 128), (640, 256))]
    segs, end = segments_from_records(train)
    assert segs == ((0.0, 64.0), (128.0, 128.0), (384.0, 256.0)) and end == 640
    assert responses_by_batch(segs, 500) == {64.0: 128, 128.0: 256, 256.0: 116}
    # two runs pooled: one reached at 500, one ran out at 640
    w = batch_fractions([train, train], [500.0, None])
    assert w == pytest.approx({"64": 256 / 1140, "128": 512 / 1140, "256": 372 / 1140})


def test_time_along_a_trajectory_known_answers():
    """A constant trajectory is the fixed-batch prediction r_N / r_q; two segments are the
    hand-computed sum; draws integrate one by one."""
    r_n = {128.0: 1.0, 256.0: 1.5}
    r_q = {128.0: 1.0, 256.0: 1.8}
    t, n = time_to_target([(0, 256)], r_n, r_q, 1000.0)
    assert t == pytest.approx(1.5 / 1.8, rel=1e-15) and n == pytest.approx(1500)
    # 400 responses at B0 (400 of the 1000 reference-equivalent ones), then 600 x 1.5 = 900
    # responses at 256: N* = 1300, T/T0 = (400 / 1 + 900 / 1.8) / 1000 = 0.9
    t, n = time_to_target(parse_segments("0:128,400:256"), r_n, r_q, 1000.0)
    assert t == pytest.approx(0.9, rel=1e-12) and n == pytest.approx(1300)
    # a segment beyond N* costs nothing
    t, _ = time_to_target([(0, 128), (5000, 256)], r_n, r_q, 1000.0)
    assert t == pytest.approx(1.0)
    t_R, _ = time_to_target([(0, 128), (400, 256)], {128.0: np.ones(2), 256.0: np.array(
        [1.5, 2.0])}, {128.0: np.ones(2), 256.0: np.array([1.8, 1.0])}, 1000.0)
    assert t_R == pytest.approx([0.9, (400 + 1200 / 1.0) / 1000])
    for bad in ("100:128", "0:128,0:256", "0:0", "0:x"):
        with pytest.raises(ValueError):
            parse_segments(bad)


# ------------------------------------------------------------------ the analysis


Q = {64: 20.0, 128: 30.0, 256: 45.0}       # throughput (responses/s) at each batch
RAMP = ((0, 64), (2048, 128), (3072, 256))  # the scheduled config's trajectory
N0 = 4000.0                                # the reference's N*
N_SCHED = 4800.0


def _write_scheduled(root, name, n_star, seed, steps=60, target=0.5):
    """A `--batch_schedule=steps` run: RAMP's batch at each step (batch_train on the
    record), a step at B taking B / Q[B] seconds, J(N) = target * N / n_star."""
    d = os.path.join(root, name)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"name": name, "batch_train": 64, "lr_rule": "sqrt", "algo": "grpo",
                   "seed": seed, "group_size": 8, "base_batch": 64,
                   "batch_schedule": "steps", "batch_ramp": "0:8,2048:16,3072:32"}, f)
    n = t = 0.0
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for s in range(1, steps + 1):
            b = max(bb for start, bb in RAMP if n >= start)
            n, t = n + b, t + b / Q[b]
            f.write(json.dumps({"step": s, "responses": n, "time_s": t, "batch_train": b})
                    + "\n")
            f.write(json.dumps({"step": s, "responses": n,
                                "score": min(1.0, target * n / n_star)}) + "\n")


def _study(root, timing=True):
    root = str(root)
    for P, b, r_n in ((8, 64, 1.0), (16, 128, 1.1), (32, 256, 1.3)):
        for k in range(3):
            write_synthetic_run(root, SyntheticRun(
                f"grpo_P{P}_G8_sqrt_s{k}", b, N0 * r_n * (1 + 0.03 * k), Q[b], seed=k,
                steps=int(2.5 * N0 * r_n / b), eval_every=1,
                extra_config={"base_batch": 64, "group_size": 8}))
    for k in range(3):
        _write_scheduled(root, f"grpo_P8_G8_sqrt_sched-steps_s{k}", N_SCHED * (1 + 0.03 * k), k)
    if timing:   # the interleaved pass: the same speeds, a little noise per round
        rng = np.random.default_rng(1)
        ent = [{"batch": b, "gen_batch_ratio": 1, "group_size": 8,
                "step_s": list(b / Q[b] * np.exp(0.02 * rng.standard_normal(8)))}
               for b in (64, 128, 256)]
        with open(os.path.join(root, drift.TIMING_FILE), "w") as f:
            json.dump(ent, f)


def _expected_t_over_t0(scale=1.0):
    """Time along RAMP to N_SCHED * scale over the reference's N0 * scale / Q[64]."""
    n = {64: 2048.0, 128: 1024.0, 256: N_SCHED * scale - 3072.0}
    return sum(x / Q[b] for b, x in n.items()) / (N0 * scale / Q[64])


def test_a_scheduled_config_analyses_end_to_end_with_the_pass_along_its_trajectory(tmp_path):
    _study(tmp_path)
    s = scaling.analyze_sweep(str(tmp_path), target=0.5)
    g = "grpo_P8_G8_sqrt_sched-steps"
    c = s["configs"][g]
    assert s["reference_config"] == "grpo_P8_G8_sqrt"
    assert c["batch"] is None and c["batch_schedule"] == "steps" and c["batch_start"] == 64
    # N counts responses: its N* is the responses to target, whatever the batch
    assert c["N_star"] == pytest.approx(N_SCHED * 1.03, rel=1e-6)
    w = c["batch_fractions"]
    assert set(w) == {"64", "128", "256"} and sum(w.values()) == pytest.approx(1)
    # r_q from the pass: 1 / sum_B w_B / r_q(B), the speeds along its trajectory
    row = s["drift"]["configs"][g]
    want_rq = 1 / sum(x / (Q[int(b)] / Q[64]) for b, x in w.items())
    assert row["r_q_interleaved"] == pytest.approx(want_rq, rel=0.03)
    assert c["test"] == "paired t + interleaved r_q" and c["r_q"] == row["r_q_interleaved"]
    want = _expected_t_over_t0(1.03)
    assert c["T_over_T0"] == pytest.approx(want, rel=0.03)
    lo, hi = c["T_over_T0_ci"]
    assert lo <= c["T_over_T0"] <= hi and hi < 1
    assert c["verdict"] == "faster"
    # in-run q integrates the same speeds: the two agree
    assert c["T_over_T0_in_run"] == pytest.approx(want, rel=0.03)
    # the fixed configs' critical batch never sees it (no one batch)
    pts = s["algos"]["grpo"]["critical_training_batch"]["points"]
    assert g not in [p["config"] for p in pts]
    assert not any("batch per update unknown" in x for x in s["warnings"])


def test_without_a_pass_the_scheduled_config_is_timed_by_its_own_runs(tmp_path):
    _study(tmp_path, timing=False)
    s = scaling.analyze_sweep(str(tmp_path), target=0.5)
    c = s["configs"]["grpo_P8_G8_sqrt_sched-steps"]
    assert s["drift"]["controlled"] is False
    assert c["T_over_T0"] == pytest.approx(_expected_t_over_t0(), rel=0.03)
    assert c["verdict"] == "faster"


def test_a_pass_without_a_visited_batch_gives_no_pass_ratio():
    st = {"algo": "grpo", "gen_batch_ratio": 1, "group_size": 8, "batch_schedule": "steps",
          "batch_fractions": {"64": 0.5, "512": 0.5}}
    e0 = {"batch": 64, "step_s": [1.0, 1.1, 0.9]}
    assert pass_ratio_along([e0], st, e0) is None


def test_report_draws_the_batch_trajectory(tmp_path):
    from jaxrl_scale.report import render
    from jaxrl_scale.scaling.analysis import load_runs
    _study(tmp_path)
    s = scaling.analyze_sweep(str(tmp_path), target=0.5)
    runs, _ = load_runs(str(tmp_path))
    path = render(s, str(tmp_path / "report"), runs)
    assert os.path.isfile(tmp_path / "report" / "batch_trajectory.png")
    text = open(path).read()
    assert "batch_trajectory.png" in text
    # the config table gives its batches as the span it trained at, with its kind
    assert "| 64..256 (steps) |" in text
    # a study without a schedule draws none and does not list it as missing
    other = tmp_path / "fixed"
    for k in range(2):
        write_synthetic_run(str(other), SyntheticRun(f"grpo_P8_G8_sqrt_s{k}", 64, 1000, 10.0,
                                                     seed=k, steps=40))
    s = scaling.analyze_sweep(str(other), target=0.5)
    path = render(s, str(other / "report"), load_runs(str(other))[0])
    assert "batch_trajectory" not in open(path).read()


def test_summary_round_trips_the_schedule_fields(tmp_path):
    from jaxrl_scale.scaling.summary import Summary
    _study(tmp_path)
    s = scaling.analyze_sweep(str(tmp_path), target=0.5)
    back = Summary.from_json(json.loads(json.dumps(s))).to_json()
    c = back["configs"]["grpo_P8_G8_sqrt_sched-steps"]
    assert c["batch_schedule"] == "steps" and math.isclose(sum(c["batch_fractions"].values()), 1)


# ------------------------------------------------------------------ the planner


def test_planner_schedule_constant_equals_the_fixed_prediction_and_two_segments_the_sum(
        tmp_path):
    """With the planner's own draws: a constant trajectory at B is batch_plan's row at B
    (point and interval); a two-segment one is the hand-computed sum of its rows."""
    from jaxrl_scale.scaling import planner, planner_link, step_cost
    from jaxrl_scale.scaling.schedule_plan import schedule_plan
    from test_planner import B0, _timings, _write_probe
    d, n_star = _write_probe(tmp_path)
    runs = planner.read_runs([d])
    fit = step_cost.fit_step_times(_timings(), n_boot=200, seed=0)
    kw = dict(target=0.5, n_boot=500, seed=0, link=planner_link.IDENTITY)
    fixed = planner.batch_plan(runs, fit, [B0, 256, 512], **kw)
    rows = {p["batch"]: p for p in fixed["predictions"]}
    one = schedule_plan(runs, fit, [(0, 512)], **kw)
    assert one["T_over_T0"] == pytest.approx(rows[512]["T_over_T0"], rel=1e-12)
    assert one["T_over_T0_ci"] == pytest.approx(rows[512]["T_over_T0_ci"], rel=1e-12)
    assert one["N_star"] == pytest.approx(n_star * rows[512]["r_N"], rel=1e-12)
    # B0 for the first n1 responses, then 512: n1 / N0* of the way at B0's speed, the rest
    # (N0* - n1) reference-equivalent responses cost r_N(512) each at r_q(512)
    n1 = 0.25 * n_star
    two = schedule_plan(runs, fit, [(0, B0), (n1, 512)], **kw)
    r5 = rows[512]
    want = (n1 + (n_star - n1) * r5["r_N"] / r5["r_q"]) / n_star
    assert two["T_over_T0"] == pytest.approx(want, rel=1e-12)
    lo, hi = two["T_over_T0_ci"]
    assert lo <= two["T_over_T0"] <= hi
    # between the two fixed batches' intervals' ends, as a mixture of them must be
    assert min(1.0, r5["T_over_T0_ci"][0]) <= lo and hi <= max(1.0, r5["T_over_T0_ci"][1])
    with pytest.raises(step_cost.PlanError, match="N\\*"):
        schedule_plan(runs, fit, [(0, 512)], n_boot=500, seed=0)


def test_plan_cli_prints_the_schedule_prediction(tmp_path):
    from test_planner import _plan_cmd, _timings, _write_probe
    d, n_star = _write_probe(tmp_path / "runs", steps=200)
    tj = tmp_path / "timings.json"
    tj.write_text(json.dumps(_timings()))
    out = tmp_path / "out"
    args = [f"--probe_run={d}", f"--timings_json={tj}", "--batches=128,256", "--n_boot=200",
            f"--out_dir={out}"]
    res = _plan_cmd(*args, f"--n_star={n_star}", "--schedule_steps=0:128,2000:256")
    assert res.returncode == 0, res.stderr[-2000:]
    sc = json.loads((out / "plan.json").read_text())["schedule"]
    assert sc["segments"] == [[0, 128], [2000, 256]] and len(sc["T_over_T0_ci"]) == 2
    assert "schedule 0:128,2000:256: predicted T/T0 = " in res.stdout
    for bad, why in (([f"--n_star={n_star}", "--schedule_steps=5:128"], "starts at 0"),
                     (["--schedule_steps=0:128"], "needs the reference's N\\*")):
        res = _plan_cmd(*args, *bad)
        assert res.returncode == 2 and res.stderr.startswith("error: schedule_steps: ")
        assert len(res.stderr.strip().splitlines()) == 1
