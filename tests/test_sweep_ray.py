"""Sweeps at cluster scale: executor="ray" (a Ray task per run) gives the sequential sweep's
results, and --list_runs / --run_index split a study into one job per run."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from jaxrl_scale.experiment import study as study_mod
from jaxrl_scale.experiment import sweep as sweep_mod
from jaxrl_scale.experiment.config import ConfigError, TrainConfig
from jaxrl_scale.experiment.study import SweepConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _base(data_dir):
    return TrainConfig.make(data_dir=data_dir, model="tiny", num_train_examples=200,
                            num_test_examples=16, max_new_tokens=4, eval_prompts=8,
                            eval_samples=2, base_lr=1e-3)


def _sweep(sweep_dir, **kw):
    """Two GRPO runs (B = 8, 16) of two updates each, no lr tuning unless asked."""
    return SweepConfig(**{**dict(sweep_dir=str(sweep_dir), prompts=(4, 8), group_sizes=(2,),
                                 base_prompts=0, lr_rules=("sqrt",), fixed_prompts=(), pairs=(),
                                 seeds=(0,), max_responses=16, eval_every_responses=8,
                                 tune_lrs=(), tune_responses=16, target=0.5,
                                 compile_cache=False), **kw})


def _scores(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    return [(r["responses"], r["score"]) for r in recs if "score" in r]


@pytest.mark.filterwarnings("ignore:os.fork")
def test_ray_executor_matches_sequential(tmp_path):
    """The same grid through Ray (2 CPUs, a task per run) and one run after another: the same
    run directories, eval curves and summary.json verdicts; a failing task is reported on one
    line naming its run and costs no other run."""
    ray = pytest.importorskip("ray")
    data_dir = str(tmp_path / "data")
    seq = sweep_mod.run_sweep(_sweep(tmp_path / "seq"), _base(data_dir), progress=False)
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 2 ** 20,
             runtime_env={"env_vars": {"JAX_DEFAULT_MATMUL_PRECISION": "highest"}})
    try:
        par_sweep = _sweep(tmp_path / "ray", executor="ray")
        par = sweep_mod.run_sweep(par_sweep, _base(data_dir), progress=False)
        assert par["errors"] == {} and "analysis_error" not in par
        assert set(par["runs"]) == set(seq["runs"]) == {"grpo_P4_G2_sqrt_s0",
                                                        "grpo_P8_G2_sqrt_s0"}
        verdicts = {}
        for d in ("seq", "ray"):
            with open(tmp_path / d / "summary.json") as f:
                verdicts[d] = {c: v["verdict"] for c, v in json.load(f)["configs"].items()}
        assert verdicts["ray"] == verdicts["seq"] and len(verdicts["seq"]) == 2
        for name in seq["runs"]:
            assert _scores(tmp_path / "ray" / name) == _scores(tmp_path / "seq" / name)
        # One run whose directory holds another configuration fails inside its task; the
        # finished runs are skipped (not redone, not lost).
        bad = _base(data_dir).replace(run_dir=str(tmp_path / "ray" / "broken"), seed=7)
        os.makedirs(bad.run_dir)
        with open(os.path.join(bad.run_dir, "config.json"), "w") as f:
            json.dump(bad.replace(seed=8).to_json(), f)
        open(os.path.join(bad.run_dir, "metrics.jsonl"), "w").close()
        done = study_mod.plan(par_sweep, _base(data_dir))
        errors, timings = sweep_mod._run_all(done + [bad], "t", False, None, par_sweep)
        assert list(errors) == ["broken"] and "\n" not in errors["broken"]
        assert "seed" in errors["broken"] and list(timings) == ["broken"]
        assert os.path.isfile(os.path.join(bad.run_dir, "ERROR.txt"))
        assert all(os.path.isfile(os.path.join(c.run_dir, "DONE.json")) for c in done)
    finally:
        ray.shutdown()


def test_run_index_covers_every_run_once(tmp_path, monkeypatch):
    """all_runs numbers the tuning runs first, then the study; each index runs exactly its
    run; a study index waits for tuning and then gets the tuned lr."""
    sweep = _sweep(tmp_path / "s", seeds=(0, 1), tune_lrs=(1e-3, 3e-3))
    base = _base(str(tmp_path / "data"))
    runs = study_mod.all_runs(sweep, base)
    tune, study = study_mod.tune_plan(sweep, base), study_mod.plan(sweep, base)
    assert [c.run_dir for _, c in runs] == [c.run_dir for c in tune + study]
    assert len({n for n, _ in runs}) == len(runs) == 2 + 4
    assert runs[0][0] == os.path.join(study_mod.TUNE_DIR, "grpo_P4_G2_lr0.001")
    ran = []

    def fake(cfg, **kw):   # a finished run without training: DONE.json in its directory
        ran.append(cfg)
        os.makedirs(cfg.run_dir, exist_ok=True)
        open(os.path.join(cfg.run_dir, "DONE.json"), "w").close()

    monkeypatch.setattr(sweep_mod, "run_training", fake)
    monkeypatch.setattr(sweep_mod, "tune_score", lambda d: 1.0 if "lr0.003" in d else 0.5)
    with pytest.raises(ConfigError, match=r"run_index: run 2 \(grpo_P4_G2_sqrt_s0\) needs the "
                                          r"tuned lr, but lr-tuning runs \[0, 1\]"):
        sweep_mod.run_one(sweep, base, 2, progress=False)
    for i, (name, cfg) in enumerate(runs):
        res = sweep_mod.run_one(sweep, base, i, progress=False)
        assert res == {"run": name, "error": None, "skipped": False}
        assert ran[-1].run_dir == cfg.run_dir and len(ran) == i + 1
    assert {c.optim.base_lr for c in ran[2:]} == {3e-3}   # the tuned lr
    assert sweep_mod.run_one(sweep, base, 5, progress=False)["skipped"] and len(ran) == 6
    study_dirs = sorted(d for d in os.listdir(sweep.sweep_dir) if d.startswith("grpo"))
    assert study_dirs == sorted(os.path.basename(c.run_dir) for c in study)
    for i in (-1, 6):
        with pytest.raises(ConfigError, match=rf"run_index: {i} is out of range: the study "
                                              r"has 6 runs, 0\.\.5"):
            sweep_mod.check_run_index(sweep, base, i)


def test_executor_flags_are_checked_first(monkeypatch):
    base = TrainConfig()
    for kw, msg in (({"executor": "slurm"}, "executor: 'slurm' is not one of"),
                    ({"ray_address": "auto"}, "ray_address: 'auto' is given but the executor"),
                    ({"executor": "ray", "ray_cpus_per_run": 0}, "ray_cpus_per_run: must be > 0")):
        if kw.get("executor") == "ray" and importlib.util.find_spec("ray") is None:
            continue
        with pytest.raises(ConfigError, match=msg):
            sweep_mod.validate_sweep(SweepConfig(**kw), base)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n == "ray" else real(n, *a))
    with pytest.raises(ConfigError, match=r"executor: ray is not installed\. "
                                          r"Fix: pip install -e '\.\[ray\]'"):
        sweep_mod.validate_sweep(SweepConfig(executor="ray"), base)
    with pytest.raises(ConfigError, match="run_index: runs one run in this process"):
        sweep_mod.check_run_index(SweepConfig(executor="ray"), base, 0)


def _cli(tmp_path, *args, one_warm_start=True):
    grid = ["--prompts=4,8", "--group_sizes=2", "--base_prompts=0", "--fixed_prompts=",
            "--pairs=", "--tune_lrs=1e-3", f"--sweep_dir={tmp_path}",
            "--model=tiny", "--max_new_tokens=4", "--micro_batches=1"]
    if one_warm_start:
        grid += ["--seeds=0", "--warm_starts=1"]
    return subprocess.run([sys.executable, "experiments/sweep_batch.py", *grid, *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_cli_list_runs_and_one_line_errors(tmp_path):
    listed = _cli(tmp_path, "--list_runs")
    assert listed.returncode == 0, listed.stderr
    # the default study tunes every lr at 3 seeds (seed 0 keeps the one-seed name)
    assert listed.stdout.splitlines() == ["0 _lr_tune/grpo_P4_G2_lr0.001",
                                          "1 _lr_tune/grpo_P4_G2_lr0.001_s1",
                                          "2 _lr_tune/grpo_P4_G2_lr0.001_s2",
                                          "3 grpo_P4_G2_sqrt_s0", "4 grpo_P8_G2_sqrt_s0"]
    for args, msg in ((["--run_index=5"], "error: run_index: 5 is out of range: the study has 5 "
                                          "runs, 0..4."),
                      (["--executor=dask"], "error: executor: 'dask' is not one of")):
        res = _cli(tmp_path, *args)
        errs = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
        assert res.returncode == 2 and len(errs) == 1 and errs[0].startswith(msg), res.stderr
        assert "Traceback" not in res.stderr


def test_one_checkpoint_of_yours_is_one_block_of_the_same_runs(tmp_path):
    """--nowarmstart (or a checkpoint of yours) without --warm_starts: the default's 6
    warm-starts x 2 seeds become one warm-start x 12 seeds, said on stdout."""
    listed = _cli(tmp_path, "--list_runs", "--nowarmstart", one_warm_start=False)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].startswith("one warm-start (yours): 12 seeds per config, not 6 warm-starts")
    assert [ln.split()[1] for ln in lines[1:] if "sqrt" in ln] == [
        f"grpo_P{P}_G2_sqrt_s{s}" for P in (4, 8) for s in range(12)]
