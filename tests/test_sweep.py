"""Sweep runner: plan, resume without redoing finished runs, analysis at the end."""
import dataclasses
import json
import math
import os

import pytest

from jaxrl_scale.experiment import study as study_mod
from jaxrl_scale.experiment import sweep as sweep_mod
from jaxrl_scale.experiment.config import TrainConfig
from jaxrl_scale.experiment.study import SweepConfig, plan
from jaxrl_scale.experiment.sweep import run_sweep


def _base(data_dir):
    return TrainConfig.make(data_dir=data_dir, model="tiny", num_train_examples=200,
                            num_test_examples=16, max_new_tokens=4, eval_prompts=8,
                            eval_samples=2, base_lr=1e-3)


def test_plan_grid_and_lr_rules():
    sweep = SweepConfig(sweep_dir="/tmp/s", prompts=(4, 8, 16), group_sizes=(8,), base_prompts=0,
                        lr_rules=("sqrt", "fixed"), fixed_prompts=(), pairs=(), seeds=(0, 1))
    runs = plan(sweep, TrainConfig())
    names = [os.path.basename(r.run_dir) for r in runs]
    # fixed lr at the reference batch is the sqrt run: 3 batches x 2 rules - 1, x 2 seeds
    assert len(runs) == 10 and len(set(names)) == 10
    assert "grpo_P4_G8_fixed_s0" not in names and "grpo_P16_G8_fixed_s1" in names
    assert {r.optim.base_batch for r in runs} == {32}
    r = next(r for r in runs if r.prompts_per_step == 16)
    assert r.batch_train == 128 and r.eval_every == sweep.eval_every_responses // 128


def test_plan_gen_batch_ratios_axis():
    """gen_batch_ratios=(1, 2) runs every config again at k = 2 (named ..._k2_s<seed>, with
    B_gen = 2 B_train) after the unchanged synchronous study; tuning stays synchronous."""
    default = study_mod.study_config("default")
    sync = plan(default, TrainConfig(micro_batches=2))
    names = [os.path.basename(r.run_dir) for r in sync]
    # the names the study always had (existing result directories resume)
    assert names == [f"{r.algo}_P{r.prompts_per_step}_G{r.group_size}_{r.optim.lr_rule}_s"
                     f"{r.seed}" for r in sync] and "grpo_P16_G8_sqrt_s0" in names
    assert {r.gen_batch_ratio for r in sync} == {1}
    both = plan(study_mod.study_config("default", gen_batch_ratios=(1, 2)),
                TrainConfig(micro_batches=2))
    assert len(both) == 2 * len(sync) and both[:len(sync)] == sync
    for r0, r2 in zip(sync, both[len(sync):]):
        stem, seed = os.path.basename(r0.run_dir).rsplit("_s", 1)
        assert os.path.basename(r2.run_dir) == f"{stem}_k2_s{seed}"
        assert r2.gen_batch_ratio == 2 and r2.batch_gen == 2 * r2.batch_train
        assert r2.replace(gen_batch_ratio=1, run_dir=r0.run_dir) == r0
    assert study_mod.run_name("grpo", 32, 8, "sqrt", 0, 2) == "grpo_P32_G8_sqrt_k2_s0"
    assert study_mod.run_name("grpo", 32, 8, "sqrt", 0) == "grpo_P32_G8_sqrt_s0"
    tune = study_mod.tune_plan(default, TrainConfig().replace(gen_batch_ratio=2))
    assert tune and {r.gen_batch_ratio for r in tune} == {1}
    with pytest.raises(ValueError, match="gen_batch_ratios"):
        sweep_mod.validate_sweep(SweepConfig(gen_batch_ratios=(0,)), TrainConfig())


def test_default_and_full_study_designs():
    """The default study: >= 5 batches over >= 16x with the sqrt lr, warm-starts as blocks
    with >= 2 seeds each (tau separable from seed noise), enough of them that Holm over its
    configs, with the warm-start x config interaction tau = 0.079 and the seed SD 0.087 of log
    N* in the error term, detects r_N = 1.25 with 80% power (noncentral t, df (C-1)(W-1));
    the full one adds the fixed-lr control at >= 2 batches, an equal-P*G pair with another G
    and PPO with its own grid, at 3 seeds."""
    from scipy import stats
    default = study_mod.study_config("default")
    runs = plan(default, TrainConfig(micro_batches=2))
    configs = {(r.algo, r.prompts_per_step, r.group_size, r.optim.lr_rule) for r in runs}
    sqrt_b = sorted({p * g for a, p, g, rule in configs if rule == "sqrt"})
    assert len(sqrt_b) >= 5 and sqrt_b[-1] / sqrt_b[0] >= 16
    k, W, C = len(default.seeds), default.warm_starts, len(configs)
    assert len(runs) == k * C and {r.seed for r in runs} == set(range(k)) and k >= 2
    blocks = plan(dataclasses.replace(default, warm_start_checkpoints=tuple(
        f"/ws{w}" for w in range(W))), TrainConfig(micro_batches=2))
    assert len(blocks) == W * k * C and len({r.seed for r in blocks}) == W * k
    se = math.sqrt(2 * (0.079 ** 2 + 0.087 ** 2 / k) / W)      # paired cell-mean contrast
    df, m = (C - 1) * (W - 1), C - 1
    assert stats.nct.sf(stats.t.ppf(1 - 0.1 / (2 * m), df), df, math.log(1.25) / se) >= 0.8
    assert default.target_stop_evals >= 2 and default.timing_steps > 0
    for r in runs:  # whole groups per micro-batch, and every config validates
        assert r.prompts_per_step % r.micro_batches == 0
    full = plan(study_mod.study_config("full"), TrainConfig(micro_batches=2))
    fc = {(r.algo, r.prompts_per_step, r.group_size, r.optim.lr_rule) for r in full}
    assert len({p * g for a, p, g, rule in fc if rule == "fixed"}) >= 2
    by_b = {}
    for a, p, g, rule in fc:
        if rule == "sqrt":
            by_b.setdefault(p * g, set()).add(g)
    assert any(len(gs) >= 2 for gs in by_b.values())
    ppo = [r for r in full if r.algo == "ppo"]
    assert ppo and {r.group_size for r in ppo} == {1} and {r.optim.base_batch for r in ppo} == {64}
    # the full study reuses the default's runs (the same warm-starts, seeds and names)
    ws = tuple(f"/ws{w}" for w in range(W))
    assert {(c.run_dir, c.init_checkpoint) for c in blocks} <= {
        (c.run_dir, c.init_checkpoint) for c in plan(dataclasses.replace(
            study_mod.study_config("full"), warm_start_checkpoints=ws),
            TrainConfig(micro_batches=2))}
    with pytest.raises(ValueError, match="study: 'nope' is unknown"):
        study_mod.study_config("nope")


def test_sweep_resume_skips_finished_runs(tmp_path, monkeypatch):
    data_dir = str(tmp_path / "data")
    sweep = SweepConfig(sweep_dir=str(tmp_path / "sweep"), prompts=(4, 8), group_sizes=(2,),
                        base_prompts=0, lr_rules=("sqrt",), fixed_prompts=(), pairs=(), seeds=(0,),
                        max_responses=32, eval_every_responses=16, tune_lrs=(1e-3, 3e-3),
                        tune_responses=16, target=0.5, compile_cache=False,
                        tune_max_extensions=0)
    calls = []
    real = sweep_mod.run_training

    def counting(cfg, **kw):
        calls.append(os.path.basename(cfg.run_dir))
        return real(cfg, **kw)

    monkeypatch.setattr(sweep_mod, "run_training", counting)
    summary = run_sweep(sweep, _base(data_dir), progress=False)
    assert sorted(calls) == ["grpo_P4_G2_lr0.001", "grpo_P4_G2_lr0.003",
                             "grpo_P4_G2_sqrt_s0", "grpo_P8_G2_sqrt_s0"]
    assert summary["errors"] == {}
    # The tuned lr is recorded and used by every run of the study.
    with open(os.path.join(sweep.sweep_dir, sweep_mod.TUNE_FILE)) as f:
        tuned = json.load(f)["tuned"]["grpo"]
    assert tuned["lr"] in (1e-3, 3e-3) and set(tuned["scores"]) == {"0.001", "0.003"}
    with open(os.path.join(sweep.sweep_dir, "grpo_P8_G2_sqrt_s0", "config.json")) as f:
        assert json.load(f)["optim"]["base_lr"] == tuned["lr"]
    # A random tiny policy never reaches 0.5: the report says so instead of inventing N*,
    # and the tuning runs are not study runs.
    assert "analysis_error" not in summary and summary["reference_reached"] is False
    assert set(summary["runs"]) == {"grpo_P4_G2_sqrt_s0", "grpo_P8_G2_sqrt_s0"}
    assert os.path.isfile(summary["report_path"])
    for name in calls:
        d = name if "_sqrt_" in name else os.path.join(study_mod.TUNE_DIR, name)
        with open(os.path.join(sweep.sweep_dir, d, "DONE.json")) as f:
            assert json.load(f)["responses"] >= (32 if "_sqrt_" in name else 16)
    # A second call redoes nothing; losing one run's DONE marker (a kill) redoes only it.
    calls.clear()
    run_sweep(sweep, _base(data_dir), progress=False, analyse=False)
    assert calls == []
    os.remove(os.path.join(sweep.sweep_dir, "grpo_P8_G2_sqrt_s0", "DONE.json"))
    run_sweep(sweep, _base(data_dir), progress=False, analyse=False)
    assert calls == ["grpo_P8_G2_sqrt_s0"]


def test_sweep_rejects_bad_grid_before_running(tmp_path):
    sweep = SweepConfig(sweep_dir=str(tmp_path), prompts=(2,), group_sizes=(1,), base_prompts=0,
                        fixed_prompts=(), pairs=())
    with pytest.raises(ValueError, match="group_size"):
        run_sweep(sweep, _base(str(tmp_path)), progress=False)


def _cli(*args):
    """sweep_from_flags() of experiments/sweep_batch.py for these flags, in a subprocess (its
    absl flags would clash with other scripts' in this process)."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import sys, dataclasses, json; "
            "from jaxrl_scale.cli import sweep as m; m.FLAGS(['sweep_batch.py', *sys.argv[1:]]); "
            "print(json.dumps(dataclasses.asdict(m.sweep_from_flags())))")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          cwd=root, timeout=120)


def test_cli_flags_override_the_study():
    res = _cli("--study=full", "--prompts=8,16", "--pairs=16x4", "--tune_lrs=",
               "--target=0.3", "--seeds=0")
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    full = study_mod.study_config("full")
    assert got["algos"] == list(full.algos) and got["ppo_prompts"] == list(full.ppo_prompts)
    assert got["prompts"] == [8, 16] and got["pairs"] == [[16, 4]] and got["tune_lrs"] == []
    assert got["target"] == 0.3 and got["seeds"] == [0] and got["gen_batch_ratios"] == [1]
    two = _cli("--gen_batch_ratios=1,2")
    assert two.returncode == 0, two.stderr
    assert json.loads(two.stdout.strip().splitlines()[-1])["gen_batch_ratios"] == [1, 2]
    bad = _cli("--pairs=16y4")
    assert bad.returncode != 0 and "pairs: cannot parse '16y4'" in bad.stderr and "32x4" in bad.stderr


def test_cli_flat_flags_set_nested_fields():
    """sweep_batch.py's TrainConfig flags are flat names of the nested fields."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import sys, json; from jaxrl_scale.cli import sweep as m, "
            "flagdefs; m.FLAGS(['sweep_batch.py', *sys.argv[1:]]); "
            "from jaxrl_scale.experiment.config import TrainConfig; "
            "print(json.dumps(flagdefs.build_from_flags(TrainConfig, skip=m._PER_RUN)"
            ".to_json()))")
    res = subprocess.run([sys.executable, "-c", code, "--clip_high=0.3", "--temperature=0.8",
                          "--warmup_steps=5"], capture_output=True, text=True, cwd=root,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["loss"]["clip_high"] == 0.3 and got["optim"]["warmup_steps"] == 5
    assert got["sampling"]["temperature"] == got["loss"]["temperature"] == 0.8
    assert got["optim"]["max_grad_norm"] == 10.0 and got["eval_samples"] == 16   # STUDY_BASE


def test_sweep_that_lost_a_run_says_so(tmp_path, monkeypatch):
    """One run's metrics.jsonl has a corrupt line before its last (the resume's read refuses
    it): the sweep goes on, sweep_status.json says runs_failed and names it, the report's
    first line says the sweep is incomplete, and the command's exit status is 3. Runs are
    synthetic (no training): what is tested is the sweep's accounting."""
    from jaxrl_scale.experiment.metrics import CorruptMetricsError, MetricsLog
    from jaxrl_scale.scaling.synthetic import SyntheticRun, write_synthetic_run
    sweep = SweepConfig(sweep_dir=str(tmp_path / "sweep"), prompts=(4, 8, 16), group_sizes=(2,),
                        base_prompts=0, lr_rules=("sqrt",), fixed_prompts=(), pairs=(),
                        seeds=(0, 1), max_responses=320, eval_every_responses=32,
                        tune_lrs=(), target=0.5, compile_cache=False, tune_max_extensions=0)
    lost = os.path.join(sweep.sweep_dir, "grpo_P16_G2_sqrt_s1")
    os.makedirs(lost)
    with open(os.path.join(lost, "metrics.jsonl"), "w") as f:
        f.write('{"step": 0, "responses": 0, "score": 0.1}\n{"step": 1, "resp\n{"step": 2}\n')

    def synthetic_training(cfg, **kw):
        MetricsLog(os.path.join(cfg.run_dir, "metrics.jsonl")).read()   # as a resume does
        root, name = os.path.split(cfg.run_dir)
        write_synthetic_run(root, SyntheticRun(
            name, cfg.batch_train, n_star=40.0 * cfg.batch_train ** 0.5,
                            q=50.0, steps=320 // cfg.batch_train, eval_every=1, cap=0.9,
                            seed=cfg.seed, noise_seed=cfg.seed, eval_n=200))
        with open(os.path.join(cfg.run_dir, "DONE.json"), "w") as f:
            json.dump({"step": 1}, f)
        return {"finished": True}

    monkeypatch.setattr(sweep_mod, "run_training", synthetic_training)
    summary = run_sweep(sweep, TrainConfig(), progress=False)
    assert list(summary["errors"]) == ["grpo_P16_G2_sqrt_s1"]
    assert summary["errors"]["grpo_P16_G2_sqrt_s1"].startswith(CorruptMetricsError.__name__)
    with open(os.path.join(sweep.sweep_dir, "sweep_status.json")) as f:
        status = json.load(f)
    assert status["status"] == "runs_failed" and status["failed_runs"] == ["grpo_P16_G2_sqrt_s1"]
    assert status["runs"] == 6
    with open(summary["report_path"]) as f:
        first = f.readline()
    assert first.startswith("**Incomplete sweep: 1 run(s) or step(s) failed** "
                            "(grpo_P16_G2_sqrt_s1)")
    code, line = sweep_mod.exit_status(summary)
    assert code == sweep_mod.EXIT_RUNS_FAILED == 3 and "grpo_P16_G2_sqrt_s1" in line
    assert line.startswith("error: sweep: 1 run(s) failed") and ". Fix: " in line
    assert sweep_mod.exit_status({"errors": {}}) == (0, None)
    assert sweep_mod.exit_status({"errors": {}, "analysis_error": "x"}) == (1, None)
    assert sweep_mod.sweep_status({}, 6)["status"] == "complete"


def test_study_evaluates_exactly_where_the_reward_allows():
    """The study's exact eval falls back to samples for a task whose reward is not exact
    match (arith_chain), unless --eval_mode was given (which then meets its own error)."""
    from jaxrl_scale.experiment.study import exact_eval_where_possible
    from jaxrl_scale.experiment.config import validate
    base = TrainConfig.make(eval_mode="exact")
    assert exact_eval_where_possible(base, asked=False).eval_mode == "exact"
    chain = TrainConfig.make(eval_mode="exact", task="arith_chain", task_kwargs={},
                             max_new_tokens=75)
    assert exact_eval_where_possible(chain, asked=False).eval_mode == "sampled"
    kept = exact_eval_where_possible(chain, asked=True)
    with pytest.raises(ValueError, match="eval_mode: 'exact' needs an exact-match reward"):
        validate(kept)


def _warm_starts(tmp_path, n):
    import jax
    import numpy as np
    from jaxrl_scale.checkpoint import save_pytree
    from jaxrl_scale.models import get_config, init_params
    cfg = get_config("tiny")
    paths = []
    for w in range(n):
        p = str(tmp_path / f"ws{w}")
        save_pytree(p, jax.tree.map(np.asarray, init_params(cfg, jax.random.PRNGKey(w))))
        paths.append(p)
    return paths


def test_sequential_sweep_drops_decided_configs(tmp_path, monkeypatch):
    """--design=sequential: after each look the configs decided there get no runs from later
    warm-starts (B = 8 is forced "slower" at the first look on top of the real rule), each
    look is recorded in sequential.json, a warm-start's callback runs before its block, and
    the analysis decides as the sweep did, its report opening with the sequential lines."""
    from jaxrl_scale.report import render
    from jaxrl_scale.scaling import sequential as sq
    from jaxrl_scale.scaling.analysis import analyze_sweep, load_runs
    real = sq.decide

    def forced(plan, history):
        d = real(plan, history)
        d["grpo_P8_G2_sqrt"] = sq.Decision("slower", 1, 2, 1.5, [1.2, 1.9])
        return d
    monkeypatch.setattr(sq, "decide", forced)
    paths = _warm_starts(tmp_path, 3)
    sweep = SweepConfig(sweep_dir=str(tmp_path / "sweep"), prompts=(4, 8, 16),
                        group_sizes=(2,), base_prompts=0, lr_rules=("sqrt",), fixed_prompts=(),
                        pairs=(), seeds=(0,), max_responses=64, eval_every_responses=16,
                        tune_lrs=(), compile_cache=False, timing_steps=0,
                        target_stop_evals=0, warm_start_checkpoints=tuple(paths),
                        design="sequential", looks=(2, 3))
    called = []
    res = run_sweep(sweep, _base(str(tmp_path / "data")), progress=False, analyse=False,
                    before_block=called.append)
    assert res["errors"] == {}
    with open(os.path.join(sweep.sweep_dir, sweep_mod.SEQUENTIAL_FILE)) as f:
        rec = json.load(f)
    stopped = {g for g, d in rec["decisions"].items() if d["verdict"] in sq.DECIDED}
    assert "grpo_P8_G2_sqrt" in stopped and rec["decisions"]["grpo_P8_G2_sqrt"]["look"] == 1
    runs, _ = load_runs(sweep.sweep_dir)
    blocks = {}
    for r in runs:
        blocks.setdefault(r.group, set()).add(r.block)
    assert len(blocks["grpo_P8_G2_sqrt"]) == 2           # not run from the third warm-start
    study_blocks = len(blocks["grpo_P4_G2_sqrt"])
    assert study_blocks == (2 if stopped == {"grpo_P8_G2_sqrt", "grpo_P16_G2_sqrt"} else 3)
    assert called == list(range(study_blocks))
    if "grpo_P16_G2_sqrt" not in stopped:
        assert len(blocks["grpo_P16_G2_sqrt"]) == 3
    s = analyze_sweep(sweep.sweep_dir, target="auto", n_boot=20)
    assert s["sequential"]["decisions"]["grpo_P8_G2_sqrt"]["verdict"] == "slower"
    assert s["configs"]["grpo_P8_G2_sqrt"]["verdict"] == "slower"
    assert s["sequential"]["runs"]["grpo_P8_G2_sqrt"] == 2
    text = open(render(s, str(tmp_path / "out"))).read()
    assert "Sequential study (O'Brien-Fleming spending" in text
    assert "grpo_P8_G2_sqrt: slower at look 1 (2 warm-starts)" in text
    with pytest.raises(ValueError, match="looks"):
        sweep_mod.validate_sweep(dataclasses.replace(sweep, looks=(2, 4)), _base("d"))
    with pytest.raises(ValueError, match="design"):
        sweep_mod.validate_sweep(dataclasses.replace(sweep, design="adaptive"), _base("d"))


def test_sweep_from_warm_start_blocks(tmp_path):
    """--warm_start_checkpoints=A,B: every config runs every seed from each warm-start (run
    seeds offset per warm-start), the lr-tuning runs come from both on seeds no study run
    has, and the analysis takes the warm-starts as its blocks (one auto target each)."""
    import jax
    import numpy as np
    from jaxrl_scale.checkpoint import save_pytree
    from jaxrl_scale.models import get_config, init_params
    from jaxrl_scale.experiment.records import target_stop
    from jaxrl_scale.scaling.analysis import analyze_sweep
    data_dir = str(tmp_path / "data")
    base = _base(data_dir)
    cfg = get_config("tiny")
    paths = []
    for w in range(2):
        p = str(tmp_path / f"ws{w}")
        save_pytree(p, jax.tree.map(np.asarray, init_params(cfg, jax.random.PRNGKey(w))))
        paths.append(p)
    sweep = SweepConfig(sweep_dir=str(tmp_path / "sweep"), prompts=(4, 8), group_sizes=(2,),
                        base_prompts=0, lr_rules=("sqrt",), fixed_prompts=(), pairs=(),
                        seeds=(0, 1), max_responses=64, eval_every_responses=16,
                        tune_lrs=(1e-3,), tune_seeds=(0, 1), tune_responses=16,
                        compile_cache=False, tune_max_extensions=0, timing_steps=1,
                        timing_blocks=1, timing_max_blocks=1, target_stop_evals=1,
                        warm_start_checkpoints=tuple(paths))
    runs = plan(sweep, base)
    got = {(os.path.basename(r.run_dir), r.init_checkpoint) for r in runs}
    assert got == {(f"grpo_P{P}_G2_sqrt_s{s}", paths[s // 2]) for P in (4, 8)
                   for s in range(4)}
    tune = study_mod.tune_plan(sweep, base)
    assert {(r.seed, r.init_checkpoint) for r in tune} == {
        (study_mod.TUNE_SEED_OFFSET, paths[0]), (study_mod.TUNE_SEED_OFFSET + 1, paths[1])}
    assert run_sweep(sweep, base, progress=False, analyse=False)["errors"] == {}
    with open(os.path.join(sweep.sweep_dir, "timing.json")) as f:
        timing = json.load(f)
    assert set(timing["warm_starts"]) == set(paths)        # one pass after each warm-start
    assert {e["warm_start"] for e in timing["entries"]} == set(paths)
    s = analyze_sweep(sweep.sweep_dir, target="auto")
    assert {r["block"] for r in s["runs"].values()} == {"w0", "w1"}
    assert s["drift"]["r_q_source"] == "each warm-start's timing pass"
    # target_stop_evals: the references ran to the budget; every other run was given its
    # warm-start's target, the one the analysis set, and stopped one eval after reaching it
    for name, r in s["runs"].items():
        with open(os.path.join(sweep.sweep_dir, name, "config.json")) as f:
            c = json.load(f)
        with open(os.path.join(sweep.sweep_dir, name, "DONE.json")) as f:
            done = json.load(f)
        if name.startswith("grpo_P4_"):      # the reference config
            assert c["target"] == 0 and done["responses"] == 64
        else:
            assert c["target"] == r["target"] and c["target_evals"] == 1
            with open(os.path.join(sweep.sweep_dir, name, "metrics.jsonl")) as f:
                scores = tuple(x["score"] for x in map(json.loads, f) if "score" in x)
            if done["responses"] < 64:    # stopped at the first eval the rule allowed
                assert target_stop(scores, c["target"], 1)
                assert not target_stop(scores[:-1], c["target"], 1)
    with pytest.raises(ValueError, match="warm_start_checkpoints"):
        sweep_mod.validate_sweep(SweepConfig(warm_start_checkpoints=(paths[0],)), base)
    with pytest.raises(ValueError, match="warm_start_checkpoints"):
        sweep_mod.validate_sweep(SweepConfig(warm_starts=3, warm_start_checkpoints=tuple(paths)),
                                 base)


@pytest.mark.slow   # two warm-starts with a timing pass each: minutes on 2 cores
def test_plan_first_runs_later_warm_starts_only_where_the_plan_keeps(tmp_path, monkeypatch):
    """--plan_first: after the first warm-start (its runs and its timing pass), the plan's
    recommended set decides which batches the later warm-starts run (B = 32 forced out here);
    the reference always runs; plan_first.json records it; a plan that cannot be made keeps
    every config; the flag needs a fixed design with a pass per warm-start."""
    from jaxrl_scale.scaling import plan_compare
    from jaxrl_scale.scaling.analysis import load_runs
    seen = {}

    def forced(runs, timing, fraction, **kw):
        seen["entries"] = len((timing or {}).get("entries", []))
        seen["runs"] = len(runs)
        return {"recommended": {"batch": 8.0, "batches": [8.0, 16.0]}}, ""
    monkeypatch.setattr(plan_compare, "block_plan", forced)
    paths = _warm_starts(tmp_path, 2)
    sweep = SweepConfig(sweep_dir=str(tmp_path / "sweep"), prompts=(4, 8, 16),
                        group_sizes=(2,), base_prompts=4, lr_rules=("sqrt",), fixed_prompts=(),
                        pairs=(), seeds=(0,), max_responses=64, eval_every_responses=16,
                        tune_lrs=(), compile_cache=False, timing_steps=2,
                        target_stop_evals=0, warm_start_checkpoints=tuple(paths),
                        plan_first=True)
    res = run_sweep(sweep, _base(str(tmp_path / "data")), progress=False, analyse=False)
    assert res["errors"] == {}
    assert seen["runs"] == 3 and seen["entries"] >= 2   # the first warm-start only, its pass
    with open(os.path.join(sweep.sweep_dir, sweep_mod.PLAN_FIRST_FILE)) as f:
        rec = json.load(f)
    assert rec["plan_first"]["dropped"] == ["grpo_P16_G2_sqrt"]
    runs, _ = load_runs(sweep.sweep_dir)
    blocks = {}
    for r in runs:
        blocks.setdefault(r.group, set()).add(r.block)
    assert len(blocks["grpo_P16_G2_sqrt"]) == 1
    assert len(blocks["grpo_P4_G2_sqrt"]) == 2 and len(blocks["grpo_P8_G2_sqrt"]) == 2


def test_plan_first_needs_a_fixed_design_with_a_pass_per_warm_start(tmp_path):
    paths = _warm_starts(tmp_path, 3)
    sweep = SweepConfig(sweep_dir=str(tmp_path / "sweep"), prompts=(4, 8), group_sizes=(2,),
                        base_prompts=4, lr_rules=("sqrt",), fixed_prompts=(), pairs=(),
                        seeds=(0,), max_responses=64, eval_every_responses=16, tune_lrs=(),
                        compile_cache=False, timing_steps=2,
                        warm_start_checkpoints=tuple(paths), plan_first=True)
    sweep_mod.validate_sweep(sweep, _base("d"))
    for bad in (dict(timing_steps=0), dict(design="sequential", looks=(2, 3))):
        with pytest.raises(ValueError, match="plan_first"):
            sweep_mod.validate_sweep(dataclasses.replace(sweep, **bad), _base("d"))
