"""Other frameworks' logs (scaling/readers): TRL trainer_state.json and verl FileLogger JSONL,
written in each framework's own layout for sweeps with known answers, through the same
analysis; bad inputs get one line naming the file or the flag."""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxrl_scale.experiment.analyze import analyze_and_report
from jaxrl_scale.scaling import readers
from jaxrl_scale.scaling.analysis import AnalysisError
from jaxrl_scale.scaling.synthetic import SyntheticRun, write_synthetic_run

TARGET = 0.5
# (batch, N*, q): r_N 1, 1, 1.2; r_q 1, 1.5, 2.4; T/T0 1, 1/1.5, 0.5 (as tests/test_scaling.py)
SWEEP = [(512, 10000, 10.0), (1024, 10000, 15.0), (2048, 12000, 24.0)]
WANT = {512: (1.0, 1.0, 1.0, "indistinguishable"), 1024: (1.0, 1.5, 1 / 1.5, "faster"),
        2048: (1.2, 2.4, 0.5, "faster")}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _dump_yaml(path, d):
    """What the framework writes (a YAML file); JSON is YAML too, for a machine without PyYAML."""
    try:
        import yaml
        text = yaml.safe_dump(d, default_flow_style=False, sort_keys=False)
    except ImportError:
        text = json.dumps(d, indent=2)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


# ----------------------------------------------------------------------------- TRL


def write_trl_run(root, name, per_device, ga, world, n_star, q, *, steps=40, eval_every=2,
                  step_time=True, args_file=True, accelerate_file=True, in_checkpoint=False):
    """A GRPOTrainer output_dir: trainer_state.json written by transformers'
    TrainerState.save_to_json itself (the writer TRL's trainers call; byte for byte its
    json.dumps(asdict(state), indent=2, sort_keys=True) + "\\n" without transformers), TRL's
    CLI config YAML and accelerate's config YAML beside it."""
    batch = per_device * ga * world
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    history = []
    for s in range(1, steps + 1):
        n = s * batch
        e = {"clip_ratio/high_max": 0.0, "clip_ratio/high_mean": 0.0,
             "clip_ratio/low_mean": 0.0, "clip_ratio/low_min": 0.0,
             "clip_ratio/region_mean": 0.0, "completions/clipped_ratio": 0.0,
             "completions/max_length": 256.0, "completions/mean_length": 120.5,
             "completions/min_length": 12.0, "entropy": 0.61, "epoch": s / steps,
             "frac_reward_zero_std": 0.0, "grad_norm": 0.25, "kl": 0.0,
             "learning_rate": 1e-06 * (1 - (s - 1) / steps), "loss": 0.0,
             "num_tokens": float(n * 150), "reward": min(1.0, 0.9 * TARGET * n / n_star),
             "reward_std": 0.3, "rewards/accuracy_reward/mean": 0.4,
             "rewards/accuracy_reward/std": 0.3, "step": s}
        if step_time:
            e["step_time"] = batch / q
        history.append(e)
        if s % eval_every == 0:
            history.append({"epoch": s / steps, "eval_clip_ratio/region_mean": 0.0,
                            "eval_completions/mean_length": 118.0, "eval_loss": 0.0,
                            "eval_reward": TARGET * n / n_star, "eval_reward_std": 0.31,
                            "eval_runtime": 11.5, "eval_samples_per_second": 44.5,
                            "eval_steps_per_second": 0.7, "step": s})
    history.append({"epoch": 1.0, "step": steps, "total_flos": 0.0, "train_loss": 0.0,
                    "train_runtime": steps * batch / q + 11.5 * (steps // eval_every),
                    "train_samples_per_second": 1.5, "train_steps_per_second": 0.1})
    state = {"best_global_step": None, "best_metric": None, "best_model_checkpoint": None,
             "epoch": 1.0, "eval_steps": eval_every, "global_step": steps,
             "is_hyper_param_search": False, "is_local_process_zero": True,
             "is_world_process_zero": True, "log_history": history, "logging_steps": 1,
             "max_steps": steps, "num_input_tokens_seen": 0, "num_train_epochs": 1,
             "save_steps": 500, "stateful_callbacks": {"TrainerControl": {
                 "args": {"should_epoch_stop": False, "should_evaluate": False,
                          "should_log": False, "should_save": True,
                          "should_training_stop": True}, "attributes": {}}},
             "total_flos": 0.0, "train_batch_size": per_device, "trial_name": None,
             "trial_params": None}
    sd = os.path.join(d, f"checkpoint-{steps}") if in_checkpoint else d
    os.makedirs(sd, exist_ok=True)
    path = os.path.join(sd, "trainer_state.json")
    try:   # the writer TRL's trainers use (transformers is in the test extra)
        from transformers import TrainerState
    except ImportError:
        TrainerState = None
    if TrainerState is not None:
        known = {f.name for f in dataclasses.fields(TrainerState)}
        TrainerState(**{k: v for k, v in state.items() if k in known}).save_to_json(path)
    else:  # byte for byte what save_to_json writes
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(state, indent=2, sort_keys=True) + "\n")
    if args_file:
        _dump_yaml(os.path.join(d, "grpo_config.yaml"), {
            "model_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct", "dataset_name": "openai/gsm8k",
            "output_dir": d, "learning_rate": 1e-6, "per_device_train_batch_size": per_device,
            "gradient_accumulation_steps": ga, "num_generations": 8, "logging_steps": 1,
            "eval_strategy": "steps", "eval_steps": eval_every, "max_steps": steps,
            "bf16": True, "report_to": ["none"]})
    if accelerate_file:
        _dump_yaml(os.path.join(d, "accelerate_config.yaml"), {
            "compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU",
            "mixed_precision": "bf16", "num_machines": 1, "num_processes": world,
            "use_cpu": False})
    return d


def trl_sweep(root):
    for b, ns, q in SWEEP:
        write_trl_run(root, f"grpo_B{b}_s0", b // 32, 4, 8, ns, q)
    return str(root)


def _check_known_answer(s, fmt, rtol=1e-9):
    runs, configs = s["runs"], s["configs"]
    assert s["reference_config"] == "grpo_B512"
    for b, ns, q in SWEEP:
        rn, rq, tt, verdict = WANT[b]
        c, x = configs[f"grpo_B{b}"], runs[f"grpo_B{b}_s0"]
        assert x["batch"] == b and x["batch_source"] == "config"
        np.testing.assert_allclose([c["N_star"], c["q"], c["r_N"], c["r_q"], c["T_over_T0"]],
                                   [ns, q, rn, rq, tt], rtol=rtol)
        assert c["verdict"] == verdict, (fmt, b)
    assert s["best_set"] == ["grpo_B2048"]


def test_trl_sweep_known_answer(tmp_path):
    root = trl_sweep(tmp_path)
    write_trl_run(root, "grpo_B4096_noeval_s0", 128, 4, 8, 12000, 30.0, eval_every=10 ** 6)
    os.makedirs(tmp_path / "crashed")
    assert readers.detect_format(os.path.join(root, "grpo_B512_s0")) == "trl"
    s = analyze_and_report(root, TARGET, tolerance=0.1)
    _check_known_answer(s, "trl")
    skipped = {x["dir"]: x["reason"] for x in s["skipped"]}
    assert set(skipped) == {"grpo_B4096_noeval_s0", "crashed"}
    assert "no eval score (eval_reward" in skipped["grpo_B4096_noeval_s0"]
    assert "trainer_state.json" in skipped["grpo_B4096_noeval_s0"]
    assert "trainer_state.json" in skipped["crashed"]
    assert os.path.isfile(s["report_path"]) and os.path.isfile(s["summary_path"])


def test_trl_checkpoint_state_defaults_and_overrides(tmp_path):
    """No config beside the state: per-device batch from TrainerState.train_batch_size,
    accumulation and world size default to 1 with a warning; the flags supply them."""
    d = write_trl_run(tmp_path, "grpo_B512_s0", 16, 4, 8, 10000, 10.0, args_file=False,
                      accelerate_file=False, in_checkpoint=True)
    sweep = readers.read_sweep_dir(str(tmp_path), "auto")
    (run,) = sweep.runs
    assert sweep.format == "trl" and run.batch == 16
    assert any("gradient_accumulation_steps not found" in w for w in run.warnings)
    assert any("world size not found" in w for w in run.warnings)
    sweep = readers.read_sweep_dir(d, "trl", gradient_accumulation_steps=4, world_size=8)
    assert sweep.runs[0].batch == 512
    assert not any("not found" in w for w in sweep.runs[0].warnings)
    sweep = readers.read_sweep_dir(d, "trl", responses_per_step=512)
    assert sweep.runs[0].batch == 512


def test_trl_time_fallbacks_and_bad_state(tmp_path):
    d = write_trl_run(tmp_path, "a_s0", 16, 4, 8, 10000, 10.0, step_time=False)
    (run,) = readers.read_sweep_dir(str(tmp_path)).runs
    assert any("train_runtime" in w for w in run.warnings)
    assert run.train[-1]["time_s"] == pytest.approx(40 * 512 / 10 + 11.5 * 20)
    # no time at all: skipped, naming the file
    with open(os.path.join(d, "trainer_state.json")) as f:
        state = json.load(f)
    state["log_history"] = [e for e in state["log_history"] if "train_runtime" not in e]
    with open(os.path.join(d, "trainer_state.json"), "w") as f:
        f.write(json.dumps(state, indent=2, sort_keys=True) + "\n")
    sweep = readers.read_sweep_dir(str(tmp_path))
    assert not sweep.runs and "no wall time" in sweep.skipped[0]["reason"]
    assert os.path.join(d, "trainer_state.json") in sweep.skipped[0]["reason"]
    # truncated state: one reason naming the file
    text = open(os.path.join(d, "trainer_state.json")).read()
    with open(os.path.join(d, "trainer_state.json"), "w") as f:
        f.write(text[: len(text) // 2])
    with pytest.raises(AnalysisError, match="trainer_state.json: not valid JSON"):
        analyze_and_report(str(tmp_path), TARGET)


def test_trl_batch_unknown_names_the_flag(tmp_path):
    d = write_trl_run(tmp_path, "a_s0", 16, 4, 8, 10000, 10.0, args_file=False)
    path = os.path.join(d, "trainer_state.json")
    state = json.load(open(path))
    state["train_batch_size"] = None
    open(path, "w").write(json.dumps(state, indent=2, sort_keys=True) + "\n")
    with pytest.raises(readers.ReaderError) as e:
        readers.read_sweep_dir(str(tmp_path))
    assert e.value.field == "responses_per_step" and "--responses_per_step=" in str(e.value)
    assert "a_s0" in str(e.value)


# ----------------------------------------------------------------------------- verl

VAL_KEY = "val-core/openai/gsm8k/reward/mean@1"


def write_verl_run(root, name, train_batch_size, n, n_star, q, *, steps=40, test_freq=2,
                   gen_s=(1.0, 1e-3), config=True, log_name="metrics.jsonl", val=True):
    """A verl run directory: the FileLogger JSONL exactly as verl/utils/tracking.py writes it
    (json.dumps({"step": step, "data": data}) + "\\n" per Tracking.log call; the
    val_before_train record at step 0; validation metrics merged into the step's record,
    timing_s/step including timing_s/testing) and Hydra's .hydra/config.yaml."""
    batch = train_batch_size * n
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    lines = []
    if val:
        lines.append({"step": 0, "data": {VAL_KEY: 0.0,
                                          "val-aux/openai/gsm8k/reward/mean@1": 0.0}})
    for s in range(1, steps + 1):
        resp = s * batch
        gen, upd = gen_s[0] + gen_s[1] * batch, 0.25 * batch / q
        data = {"training/global_step": s, "training/epoch": 0,
                "actor/entropy": 0.6, "actor/pg_loss": -0.01, "actor/pg_clipfrac": 0.0,
                "actor/ppo_kl": 0.0, "actor/grad_norm": 0.2, "actor/lr": 1e-06,
                "critic/score/mean": min(1.0, 0.9 * TARGET * resp / n_star),
                "critic/score/max": 1.0, "critic/score/min": 0.0,
                "critic/rewards/mean": 0.3, "critic/advantages/mean": 0.0,
                "response_length/mean": 210.0, "response_length/clip_ratio": 0.0,
                "prompt_length/mean": 100.0,
                "timing_s/generate_sequences": gen, "timing_s/gen": gen,
                "timing_s/reward": 0.5, "timing_s/old_log_prob": 2.0, "timing_s/ref": 2.0,
                "timing_s/adv": 0.1, "timing_s/update_actor": upd,
                "timing_s/step": batch / q}
        if val and s % test_freq == 0:
            data["timing_s/testing"] = 7.5
            data["timing_s/step"] += 7.5
            data[VAL_KEY] = TARGET * resp / n_star
            data["val-aux/openai/gsm8k/reward/mean@1"] = TARGET * resp / n_star
        data.update({"timing_per_token_ms/gen": 0.01, "perf/total_num_tokens": batch * 310,
                     "perf/time_per_step": data["timing_s/step"],
                     "perf/throughput": batch * 310 / data["timing_s/step"] / 8})
        lines.append({"step": s, "data": data})
    with open(os.path.join(d, log_name), "w") as f:
        for rec in lines:
            f.write(json.dumps(rec) + "\n")
    if config:
        _dump_yaml(os.path.join(d, ".hydra", "config.yaml"), {
            "data": {"train_files": "~/data/gsm8k/train.parquet",
                     "val_files": "~/data/gsm8k/test.parquet", "prompt_key": "prompt",
                     "max_prompt_length": 512, "max_response_length": 1024,
                     "train_batch_size": train_batch_size, "shuffle": True},
            "actor_rollout_ref": {
                "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"},
                "actor": {"strategy": "fsdp", "ppo_mini_batch_size": train_batch_size // 2,
                          "optim": {"lr": 1e-06}},
                "rollout": {"name": "vllm", "n": n, "temperature": 1.0,
                            "response_length": "${data.max_response_length}"}},
            "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
            "trainer": {"project_name": "verl_grpo_gsm8k", "experiment_name": name,
                        "logger": ["console", "file"], "n_gpus_per_node": 8, "nnodes": 1,
                        "test_freq": test_freq, "total_training_steps": steps,
                        "val_before_train": val}})
    return d


def verl_sweep(root):
    for b, ns, q in SWEEP:
        write_verl_run(root, f"grpo_B{b}_s0", b // 8, 8, ns, q)
    return str(root)


def test_verl_sweep_known_answer(tmp_path):
    root = verl_sweep(tmp_path)
    write_verl_run(root, "grpo_B4096_noval_s0", 512, 8, 12000, 30.0, val=False)
    # a half-written last line (a run still going): counted, named, the rest read
    with open(os.path.join(root, "grpo_B1024_s0", "metrics.jsonl"), "a") as f:
        f.write('{"step": 41, "data": {"timing_s/st')
    assert readers.detect_format(os.path.join(root, "grpo_B512_s0")) == "verl"
    s = analyze_and_report(root, TARGET, tolerance=0.1)
    _check_known_answer(s, "verl")
    assert s["skipped"][0]["dir"] == "grpo_B4096_noval_s0"
    assert "no eval score (val-core/" in s["skipped"][0]["reason"]
    assert any("grpo_B1024_s0: 1 unreadable line(s)" in w and "metrics.jsonl" in w
               for w in s["warnings"])
    sweep = readers.read_sweep_dir(root)
    run = next(r for r in sweep.runs if r.name == "grpo_B2048_s0")
    assert run.algo == "grpo" and run.train[0]["gen_s"] == pytest.approx(1 + 2048e-3)
    assert run.train[0]["train_s"] == pytest.approx(0.25 * 2048 / 24)
    assert run.evals[0]["responses"] == 0 and run.evals[-1]["responses"] == 40 * 2048


def test_verl_batch_unknown_names_the_flag(tmp_path):
    write_verl_run(tmp_path, "a_s0", 64, 8, 10000, 10.0, config=False)
    with pytest.raises(readers.ReaderError) as e:
        readers.read_sweep_dir(str(tmp_path), "verl")
    msg = str(e.value)
    assert msg.startswith("responses_per_step: run a_s0: data.train_batch_size and "
                          "actor_rollout_ref.rollout.n not found")
    assert ". Fix: pass --responses_per_step=" in msg and "\n" not in msg
    (run,) = readers.read_sweep_dir(str(tmp_path), "verl", responses_per_step=512).runs
    assert run.batch == 512
    with pytest.raises(readers.ReaderError, match="^responses_per_step: must be a positive"):
        readers.read_sweep_dir(str(tmp_path), "verl", responses_per_step=-1)


def test_verl_chosen_score_key(tmp_path):
    write_verl_run(tmp_path, "a_s0", 64, 8, 10000, 10.0)
    (run,) = readers.read_sweep_dir(str(tmp_path), score_key="critic/score/mean").runs
    assert len(run.evals) == 40
    sweep = readers.read_sweep_dir(str(tmp_path), score_key="val-core/nope/mean@1")
    assert not sweep.runs and "val-core/nope/mean@1" in sweep.skipped[0]["reason"]


# ----------------------------------------------------------------------------- sweeps


def test_mixed_frameworks_refused_and_format_selects(tmp_path):
    write_verl_run(tmp_path, "v_s0", 64, 8, 10000, 10.0)
    write_trl_run(tmp_path, "t_s0", 16, 4, 8, 10000, 10.0)
    write_synthetic_run(str(tmp_path), SyntheticRun("j_s0", 512, 10000, 10.0))
    with pytest.raises(readers.ReaderError) as e:
        readers.read_sweep_dir(str(tmp_path))
    assert e.value.field == "format" and "jaxrl: j_s0; trl: t_s0; verl: v_s0" in str(e.value)
    sweep = readers.read_sweep_dir(str(tmp_path), "verl")
    assert [r.name for r in sweep.runs] == ["v_s0"]
    assert {x["dir"]: x["reason"] for x in sweep.skipped}["t_s0"].endswith("(it is a trl run)")
    with pytest.raises(readers.ReaderError, match="^format: unknown format"):
        readers.read_sweep_dir(str(tmp_path), "mlflow")


def test_own_sweeps_read_as_before(tmp_path):
    write_synthetic_run(str(tmp_path), SyntheticRun("grpo_B512_sqrt_s0", 512, 10000, 10.0))
    write_synthetic_run(str(tmp_path), SyntheticRun("grpo_B1024_sqrt_s0", 1024, 10000, 15.0))
    sweep = readers.read_sweep_dir(str(tmp_path))
    assert sweep.format == "jaxrl" and len(sweep.runs) == 2
    # the synthetic linear curves pass 1 late in the run (no accuracy does): score_range=None
    s = analyze_and_report(str(tmp_path), TARGET, fmt="auto", score_range=None)
    assert s["configs"]["grpo_B1024_sqrt"]["r_q"] == pytest.approx(1.5)


def _cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "jaxrl_scale.cli.analyze", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=300, env=env)


def test_cli_format_flag(tmp_path):
    root = verl_sweep(tmp_path / "verl")
    res = _cli(f"--sweep_dir={root}", "--format=verl", f"--target={TARGET}", "--n_boot=50",
               cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "grpo_B2048" in res.stdout
    bad = tmp_path / "bad"
    write_verl_run(bad, "a_s0", 64, 8, 10000, 10.0, config=False)
    res = _cli(f"--sweep_dir={bad}", f"--target={TARGET}", cwd=tmp_path)
    lines = [l for l in res.stderr.splitlines() if l.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith("error: responses_per_step: ") and ". Fix: " in lines[0]


def test_trl_num_iterations_divides_new_responses(tmp_path):
    d = write_trl_run(tmp_path, "a_s0", 16, 4, 8, 10000, 10.0)
    _dump_yaml(os.path.join(d, "grpo_config.yaml"), {"per_device_train_batch_size": 16,
                                                      "gradient_accumulation_steps": 4,
                                                      "num_iterations": 2})
    (run,) = readers.read_sweep_dir(d).runs
    assert run.batch == 256 and any("num_iterations = 2" in w for w in run.warnings)


def test_verl_elapsed_seconds_without_step_timing(tmp_path):
    """Newer FileLogger lines carry "elapsed_seconds": the wall time when timing_s/step is
    absent (validation time taken out)."""
    d = write_verl_run(tmp_path, "a_s0", 64, 8, 10000, 10.0, val=True)
    path = os.path.join(d, "metrics.jsonl")
    lines = [json.loads(x) for x in open(path)]
    t = 100.0                                   # setup before the first record: not counted
    with open(path, "w") as f:
        for rec in lines:
            if rec["step"] > 0:
                t += 51.2 + rec["data"].get("timing_s/testing", 0.0)
            rec["data"].pop("timing_s/step", None)
            f.write(json.dumps({"step": rec["step"], "elapsed_seconds": t,
                                "data": rec["data"]}) + "\n")
    (run,) = readers.read_sweep_dir(str(tmp_path)).runs
    assert run.train[-1]["time_s"] == pytest.approx(40 * 51.2)
    assert any("elapsed_seconds" in w for w in run.warnings)
    # without the step-0 record the first step's time comes from the next interval's rate
    with open(path) as f:
        rest = f.readlines()[1:]
    with open(path, "w") as f:
        f.writelines(rest)
    (run,) = readers.read_sweep_dir(str(tmp_path)).runs
    assert run.train[-1]["time_s"] == pytest.approx(40 * 51.2)


def test_bad_config_and_empty_sweep_name_the_file(tmp_path):
    d = write_verl_run(tmp_path, "a_s0", 64, 8, 10000, 10.0)
    with open(os.path.join(d, ".hydra", "config.yaml"), "w") as f:
        f.write("data: {train_batch_size: [64\n")
    with pytest.raises(AnalysisError) as e:
        analyze_and_report(str(tmp_path), TARGET)
    msg = str(e.value)
    assert msg.startswith("no usable verl runs") and "a_s0: " in msg
    assert os.path.join(d, ".hydra", "config.yaml") in msg and "\n" not in msg


def test_overrides_fill_gaps_only(tmp_path):
    """--responses_per_step fills a run whose files lack the batch; a run whose config gives
    it keeps its own (one flag for a sweep of several batches)."""
    write_verl_run(tmp_path, "a_s0", 64, 8, 10000, 10.0)
    write_verl_run(tmp_path, "b_s0", 128, 8, 10000, 10.0, config=False)
    runs = {r.name: r.batch for r in readers.read_sweep_dir(str(tmp_path),
                                                            responses_per_step=1024).runs}
    assert runs == {"a_s0": 512, "b_s0": 1024}
    t = tmp_path / "trl"
    write_trl_run(t, "c_s0", 16, 4, 8, 10000, 10.0)
    (run,) = readers.read_sweep_dir(str(t), responses_per_step=7, world_size=2).runs
    assert run.batch == 512


def _jsonl_to_events(run_dir, project="verl_grpo_gsm8k"):
    """Replace a verl run's FileLogger JSONL by what its _TensorboardAdapter writes instead:
    SummaryWriter(tensorboard_log/<project>/<experiment>).add_scalar(key, value, step) per
    metric (one simple_value per event), with tensorboard's own record writer and protos."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.record_writer import RecordWriter
    path = os.path.join(run_dir, "metrics.jsonl")
    lines = [json.loads(x) for x in open(path)]
    os.remove(path)
    d = os.path.join(run_dir, "tensorboard_log", project, os.path.basename(run_dir))
    os.makedirs(d)
    with open(os.path.join(d, "events.out.tfevents.1700000000.host.1.0"), "wb") as f:
        w = RecordWriter(f)
        w.write(Event(wall_time=1.7e9, file_version="brain.Event:2").SerializeToString())
        for rec in lines:
            for k, v in rec["data"].items():
                ev = Event(wall_time=1.7e9, step=rec["step"], summary=Summary(
                    value=[Summary.Value(tag=k, simple_value=float(v))]))
                w.write(ev.SerializeToString())
        w.flush()


def test_verl_tensorboard_known_answer(tmp_path):
    pytest.importorskip("tensorboard")
    root = verl_sweep(tmp_path)
    for b, _, _ in SWEEP:
        _jsonl_to_events(os.path.join(root, f"grpo_B{b}_s0"))
    assert readers.detect_format(os.path.join(root, "grpo_B512_s0")) == "verl"
    s = analyze_and_report(root, TARGET, tolerance=0.1)
    _check_known_answer(s, "verl-tensorboard", rtol=1e-6)   # simple_value is float32
    assert not any("truncated" in w for w in s["warnings"])
    # a cut file: read up to the cut, named in the run's warnings
    from jaxrl_scale.scaling.readers.tensorboard import event_files
    (p,) = event_files(os.path.join(root, "grpo_B512_s0"))
    data = open(p, "rb").read()
    open(p, "wb").write(data[:-3])
    run = next(r for r in readers.read_sweep_dir(root).runs if r.name == "grpo_B512_s0")
    assert any(w.startswith(f"{p}: truncated after ") for w in run.warnings), run.warnings
    # our own runs keep their tensorboard/ copy of metrics.jsonl: still ours
    write_synthetic_run(str(tmp_path / "own"), SyntheticRun("grpo_B512_s0", 512, 10000, 10.0))
    os.makedirs(tmp_path / "own" / "grpo_B512_s0" / "tensorboard")
    open(tmp_path / "own" / "grpo_B512_s0" / "tensorboard" / "events.out.tfevents.1.h",
         "wb").close()
    assert readers.detect_format(str(tmp_path / "own" / "grpo_B512_s0")) == "jaxrl"


# ----------------------------------------------------------------------------- OpenRLHF


class _SummaryWriter:
    """What ``torch.utils.tensorboard.SummaryWriter`` writes, without torch: its FileWriter is
    tensorboard's own EventFileWriter; ``add_scalar`` is one event of
    ``Summary(value=[Summary.Value(tag, simple_value)])`` at ``int(step)``; ``add_text`` one
    string tensor under ``<tag>/text_summary`` with the text plugin's metadata."""

    def __init__(self, log_dir):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        self.w = EventFileWriter(log_dir)

    def _add(self, value, step):
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        self.w.add_event(Event(wall_time=1.7e9 + step, step=int(step),
                               summary=Summary(value=[value])))

    def add_scalar(self, tag, value, step):
        from tensorboard.compat.proto.summary_pb2 import Summary
        self._add(Summary.Value(tag=tag, simple_value=float(value)), step)

    def add_text(self, tag, text, step):
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
        md = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
        t = TensorProto(dtype="DT_STRING", string_val=[text.encode()],
                        tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
        self._add(Summary.Value(tag=tag + "/text_summary", metadata=md, tensor=t), step)

    def close(self):
        self.w.close()


EVAL_N = 1319 * 4     # gsm8k test prompts x eval.n_samples_per_prompt


def openrlhf_logs(batch, q, n_star, *, steps=40, eval_steps=2, evals=True):
    """(train status per step, eval logs per eval step) as OpenRLHF's PPOTrainer.fit builds
    them (openrlhf/trainer/ppo_trainer.py): the timing/* of train_step plus
    timing/generation, timing/step_total = their sum; the rollout/* stats; the eval logs of
    compute_eval_metrics after the step's train log when global_step % eval.steps == 0."""
    train, ev = [], {}
    for s in range(1, steps + 1):
        t = batch / q
        st = {"policy_loss": -0.01, "actor_lr": 1e-6, "kl": 0.001, "entropy_loss": 0.6,
              "response_length": 210.0, "total_length": 310.0,
              "timing/make_experience": 0.10 * t, "timing/ppo_train": 0.25 * t,
              "timing/broadcast": 0.05 * t,
              "rollout/reward_mean": min(1.0, 0.9 * TARGET * s * batch / n_star),
              "rollout/reward_std": 0.3, "rollout/response_length_mean": 210.0,
              "rollout/truncated_rate": 0.0, "rollout/num_samples": float(batch),
              "generated_samples": ["Question: 1+1? Answer: 2", 1.0],
              "timing/generation": 0.60 * t}
        st["timing/step_total"] = sum(v for k, v in st.items() if k.startswith("timing/"))
        train.append((s, st))
        if evals and s % eval_steps == 0:
            p = TARGET * s * batch / n_star
            ev[s] = {"eval_gsm8k_pass4": min(1.0, 1.5 * p), "eval_gsm8k_pass1": p,
                     "eval_gsm8k_response_length_mean": 205.0, "eval_gsm8k_truncated_rate": 0.0,
                     "eval_response_length_mean": 205.0, "eval_truncated_rate": 0.0,
                     "eval_num_samples": float(EVAL_N)}
    return train, ev


def write_openrlhf_run(tensorboard_dir, run_name, batch, q, n_star, **kw):
    """<logger.tensorboard_dir>/<logger.wandb.run_name>/events.out.tfevents.* as OpenRLHF's
    TensorboardLogger writes them (openrlhf/utils/logging_utils.py: log_train add_scalar
    "train/<k>" (add_text for generated_samples), log_eval add_scalar "eval/<k>", at
    global_step)."""
    d = os.path.join(tensorboard_dir, run_name)
    os.makedirs(d, exist_ok=True)
    w = _SummaryWriter(d)
    train, ev = openrlhf_logs(batch, q, n_star, **kw)
    for s, st in train:
        for k, v in st.items():
            if k == "generated_samples" and v is not None:
                text, reward = v
                w.add_text("train/generated_samples",
                           f"Sample:\\n{text}\\n\\nReward: {reward:.4f}", s)
            elif v is not None:
                w.add_scalar(f"train/{k}", v, s)
        for k, v in ev.get(s, {}).items():
            w.add_scalar(f"eval/{k}", v, s)
    w.close()
    return d


def openrlhf_sweep(root):
    for b, ns, q in SWEEP:
        write_openrlhf_run(root, f"grpo_B{b}_s0", b, q, ns)
    return str(root)


def test_openrlhf_tensorboard_known_answer(tmp_path):
    pytest.importorskip("tensorboard")
    root = openrlhf_sweep(tmp_path)
    write_openrlhf_run(root, "grpo_B4096_noeval_s0", 4096, 30.0, 12000, evals=False)
    assert readers.detect_format(os.path.join(root, "grpo_B512_s0")) == "openrlhf"
    s = analyze_and_report(root, TARGET, tolerance=0.1)
    _check_known_answer(s, "openrlhf", rtol=1e-6)     # simple_value is float32
    assert [x["dir"] for x in s["skipped"]] == ["grpo_B4096_noeval_s0"]
    assert "no eval score (eval/eval_<datasource>_pass1)" in s["skipped"][0]["reason"]
    (run,) = readers.read_sweep_dir(os.path.join(root, "grpo_B2048_s0")).runs
    assert run.evals[0]["eval_n"] == EVAL_N and run.evals[0]["responses"] == 2 * 2048
    assert run.train[0]["gen_s"] == pytest.approx(0.6 * 2048 / 24, rel=1e-6)
    assert run.train[0]["train_s"] == pytest.approx(0.25 * 2048 / 24, rel=1e-6)


def test_openrlhf_logging_steps_and_missing_count(tmp_path):
    """--logger.logging_steps=k: the steps between logged ones count at the logged step's
    time and samples (warned); a log without rollout/num_samples needs --responses_per_step,
    named in one line."""
    pytest.importorskip("tensorboard")
    d = os.path.join(tmp_path, "a_s0")
    os.makedirs(d)
    w = _SummaryWriter(d)
    train, ev = openrlhf_logs(512, 10.0, 10000)
    for s, st in train:
        if s % 4 == 0:
            for k in ("timing/step_total", "rollout/num_samples"):
                w.add_scalar(f"train/{k}", st[k], s)
        for k, v in ev.get(s, {}).items():
            w.add_scalar(f"eval/{k}", v, s)
    w.close()
    (run,) = readers.read_sweep_dir(str(tmp_path)).runs
    assert run.train[-1]["time_s"] == pytest.approx(40 * 512 / 10, rel=1e-6)
    assert run.evals[-1]["responses"] == pytest.approx(40 * 512)
    assert any("not logged at every step" in x for x in run.warnings)
    d2 = os.path.join(tmp_path, "b", "b_s0")
    os.makedirs(d2)
    w = _SummaryWriter(d2)
    w.add_scalar("train/timing/step_total", 51.2, 1)
    w.add_scalar("eval/eval_gsm8k_pass1", 0.1, 1)
    w.close()
    with pytest.raises(readers.ReaderError) as e:
        readers.read_sweep_dir(str(tmp_path / "b"))
    assert str(e.value).startswith("responses_per_step: run b_s0: ") and "\n" not in str(e.value)
    (run,) = readers.read_sweep_dir(str(tmp_path / "b"), responses_per_step=64).runs
    assert run.batch == 64 and run.evals[0]["responses"] == 64


# ----------------------------------------------------------------------------- prime-rl

PRIME_SCORE = "eval/gsm8k/all/default/avg@4"


def write_primerl_run(root, name, batch, q, n_star, *, steps=40, interval=2, evals=True,
                      policy_version=True):
    """<output_dir>/<run.name>/metrics.jsonl as prime-rl's FileMonitor.log_metrics appends it
    (src/prime_rl/monitors/file.py: json.dumps({"step": step, "time": time.time(),
    **metrics}) + "\\n"), from both processes: the orchestrator's step line
    (orchestrator.py finalize_train_batch: progress/*, time/step, "step": step), its eval
    lines (finalize_eval_batch: eval/<env>/{all,effective}/<agent>/avg@k, pass@k,
    policy_version, "step": float(step); the base-model eval at step 1 and one after every
    interval-th step, of the policy one update behind (async level 1)) and the trainer's
    perf / optim / time lines."""
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    t0, lines, total = 1.7e9, [], 0

    def log(step, metrics, t):
        lines.append(json.dumps({"step": step, "time": t0 + t, **metrics}) + "\n")

    def eval_line(step, version, t):
        p = TARGET * version * batch / n_star
        log(step, {"eval/gsm8k/all/num_turns/mean": 1.0, "eval/gsm8k/all/has_error/mean": 0.0,
                   "eval/gsm8k/all/cancelled/mean": 0.0, "eval/gsm8k/all/default/avg@4": p,
                   "eval/gsm8k/effective/num_turns/mean": 1.0,
                   "eval/gsm8k/effective/default/avg@4": p,
                   "eval/gsm8k/effective/default/pass@1": p,
                   "eval/gsm8k/effective/default/pass@4": min(1.0, 1.6 * p),
                   **({"eval/gsm8k/policy_version": float(version)} if policy_version else {}),
                   "step": float(step)}, t)

    t = 0.0
    if evals:
        eval_line(1, 0, 0.5)
    for s in range(1, steps + 1):
        t += batch / q
        log(s, {"train/agg/all/num_turns/mean": 1.0, "train/agg/effective/default/reward/mean":
                min(1.0, 0.9 * TARGET * total / n_star),
                "progress/tokens": batch * 310, "progress/input_tokens": batch * 100,
                "progress/output_tokens": batch * 210, "progress/rollouts": batch,
                "progress/tasks": batch // 8, "progress/total_tokens": total * 310,
                "progress/total_rollouts": total, "progress/total_tasks": total // 8,
                "time/step": batch / q, "time/pack": 0.01, "time/save_ckpt": 0.0,
                "time/wait_for_policy": 0.2, "step": s, "off_policy/mean": 0.5,
                "off_policy/dropped": 0.0, "batch/gsm8k": 1.0}, t)
        total += batch
        log(s, {"perf/throughput": 1e4, "perf/throughput_per_gpu": 1.2e3, "perf/mfu": 0.3,
                "perf/peak_memory": 40.0, "step": s}, t + 0.1)
        log(s, {"optim/lr": 1e-6, "optim/grad_norm": 0.2, "step": s}, t + 0.1)
        log(s, {"time/step": 0.8 * batch / q, "time/wait_for_batch": 0.1,
                "time/load_data": 0.01, "time/broadcast_weights": 0.5, "time/save_ckpt": 0.0,
                "time/forward_backward": 0.25 * batch / q, "step": s}, t + 0.1)
        if evals and s % interval == 0:
            eval_line(s + 1, s - 1, t + 0.2)
    with open(os.path.join(d, "metrics.jsonl"), "a", buffering=1) as f:
        f.writelines(lines)
    return d


def primerl_sweep(root):
    for b, ns, q in SWEEP:
        write_primerl_run(root, f"grpo_B{b}_s0", b, q, ns)
    return str(root)


def test_primerl_known_answer(tmp_path):
    root = primerl_sweep(tmp_path)
    write_primerl_run(root, "grpo_B4096_noeval_s0", 4096, 30.0, 12000, evals=False)
    with open(os.path.join(root, "grpo_B1024_s0", "metrics.jsonl"), "a") as f:
        f.write('{"step": 41, "time": 1700000000.0, "progress/rollo')    # still running
    assert readers.detect_format(os.path.join(root, "grpo_B512_s0")) == "prime-rl"
    s = analyze_and_report(root, TARGET, tolerance=0.1)
    _check_known_answer(s, "prime-rl")
    assert [x["dir"] for x in s["skipped"]] == ["grpo_B4096_noeval_s0"]
    assert "no eval score (eval/<env>/all/<agent>/avg@k)" in s["skipped"][0]["reason"]
    assert any("grpo_B1024_s0: 1 unreadable line(s)" in w and "metrics.jsonl" in w
               for w in s["warnings"])
    (run,) = readers.read_sweep_dir(os.path.join(root, "grpo_B2048_s0")).runs
    # placed at its policy_version: the base eval at 0 responses, the last of policy v39
    assert run.evals[0]["responses"] == 0 and run.evals[-1]["responses"] == 39 * 2048
    assert run.train[0]["train_s"] == pytest.approx(0.25 * 2048 / 24)
    assert run.train[-1]["time_s"] == pytest.approx(40 * 2048 / 24)    # the trainer's not added
    assert any(f"eval score from {PRIME_SCORE}" in w for w in run.warnings)


def test_primerl_without_policy_version_and_bad_logs(tmp_path):
    d = write_primerl_run(tmp_path, "a_s0", 512, 10.0, 10000, policy_version=False)
    (run,) = readers.read_sweep_dir(str(tmp_path)).runs
    assert run.evals[-1]["responses"] == 40 * 512      # the step before its line's (41 - 1)
    assert any("without eval/gsm8k/policy_version" in w for w in run.warnings)
    # a log cut inside its first line: skipped, naming the file and what is missing
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        f.write('{"step": 1, "time": 1700000000.0, "progress/rollo')
    sweep = readers.read_sweep_dir(str(tmp_path), "prime-rl")
    assert not sweep.runs
    assert sweep.skipped[0]["reason"].startswith(os.path.join(d, "metrics.jsonl"))


# ----------------------------------------------------------------------------- any TensorBoard

TAG_MAP = "score=Eval/accuracy,time=perf/step_seconds,samples=batch/responses"


def write_tb_run(root, name, batch, q, n_star, *, steps=40, eval_every=2, score=True):
    """A run of some other trainer: SummaryWriter.add_scalar under its own tag names, at the
    optimizer step."""
    d = os.path.join(root, name, "tb")
    os.makedirs(d)
    w = _SummaryWriter(d)
    for s in range(1, steps + 1):
        w.add_scalar("loss/policy", -0.01, s)
        w.add_scalar("perf/step_seconds", batch / q, s)
        w.add_scalar("batch/responses", batch, s)
        if score and s % eval_every == 0:
            w.add_scalar("Eval/accuracy", TARGET * s * batch / n_star, s)
    w.close()
    return os.path.join(root, name)


def test_tensorboard_tag_map_known_answer(tmp_path):
    pytest.importorskip("tensorboard")
    root = str(tmp_path)
    for b, ns, q in SWEEP:
        write_tb_run(root, f"grpo_B{b}_s0", b, q, ns)
    write_tb_run(root, "grpo_B4096_noeval_s0", 4096, 30.0, 12000, score=False)
    assert readers.detect_format(os.path.join(root, "grpo_B512_s0")) == "tensorboard"
    s = analyze_and_report(root, TARGET, tolerance=0.1, fmt="tensorboard",
                           overrides={"tag_map": TAG_MAP})
    _check_known_answer(s, "tensorboard", rtol=1e-6)
    assert [x["dir"] for x in s["skipped"]] == ["grpo_B4096_noeval_s0"]
    assert "no eval score (Eval/accuracy)" in s["skipped"][0]["reason"]
    # the same map from a YAML/JSON file
    path = tmp_path / "map.json"
    path.write_text(json.dumps(dict(x.split("=") for x in TAG_MAP.split(","))))
    runs = {r.name: r.batch for r in readers.read_sweep_dir(root, tag_map=str(path)).runs}
    assert runs == {"grpo_B512_s0": 512, "grpo_B1024_s0": 1024, "grpo_B2048_s0": 2048}


def test_tensorboard_tag_map_refusals(tmp_path):
    pytest.importorskip("tensorboard")
    write_tb_run(str(tmp_path), "a_s0", 512, 10.0, 10000)
    root = str(tmp_path)
    cases = [(None, "tag_map: run a_s0: TensorBoard event files, but no tag map"),
             ("score=Eval/accuracy,samples=batch/responses", "tag_map: run a_s0: no time tag"),
             ("score=Eval/accuracy,time=perf/nope,samples=batch/responses",
              "tag_map: run a_s0: "),
             ("score=Eval/accuracy,time=perf/step_seconds",
              "responses_per_step: run a_s0: "),
             ("score", "tag_map: item 'score' is not field=tag"),
             ("scores=Eval/accuracy", "tag_map: unknown field(s) scores")]
    for spec, start in cases:
        with pytest.raises(readers.ReaderError) as e:
            readers.read_sweep_dir(root, tag_map=spec)
        msg = str(e.value)
        assert msg.startswith(start) and ". Fix: " in msg and "\n" not in msg, (spec, msg)
    with pytest.raises(readers.ReaderError) as e:
        readers.read_sweep_dir(root, tag_map=cases[2][0])
    assert "no 'perf/nope' values (the time tag" in str(e.value)
    assert "events.out.tfevents." in str(e.value)      # the file it looked in
    (run,) = readers.read_sweep_dir(root, tag_map=cases[3][0], responses_per_step=512).runs
    assert run.batch == 512


# ----------------------------------------------------------------------------- W&B exports


def _to_csv(path, rows):
    """pandas.DataFrame(rows).to_csv(path): the index as a first, unnamed column; a value the
    row lacks (NaN) as an empty cell; floats as repr."""
    cols = sorted({k for r in rows for k in r})
    with open(path, "w", newline="") as f:
        f.write("," + ",".join(cols) + "\n")
        for i, r in enumerate(rows):
            f.write(str(i) + "," + ",".join("" if k not in r else repr(r[k]) for k in cols)
                    + "\n")


def wandb_history(batch, q, n_star, *, steps=40, eval_every=2, eval_s=5.0):
    """Run.history() of a trainer that calls wandb.log(train) per step and wandb.log(eval)
    every eval_every steps: _step counts the calls, _runtime the seconds since wandb.init
    (eval time included), _timestamp the clock."""
    rows, t = [], 0.0
    for s in range(1, steps + 1):
        t += batch / q
        rows.append({"_step": len(rows), "_runtime": t, "_timestamp": 1.7e9 + t,
                     "train/loss": -0.01, "train/step_time": batch / q,
                     "train/samples": batch})
        if s % eval_every == 0:
            t += eval_s
            rows.append({"_step": len(rows), "_runtime": t, "_timestamp": 1.7e9 + t,
                         "eval/acc": TARGET * s * batch / n_star})
    return rows


def test_wandb_csv_known_answer_and_runtime_fallback(tmp_path):
    root = str(tmp_path)
    for b, ns, q in SWEEP:
        _to_csv(os.path.join(root, f"grpo_B{b}_s0.csv"), wandb_history(b, q, ns))
    with open(os.path.join(root, "notes.csv"), "w") as f:
        f.write("a,b\n1,2\n")
    assert readers.detect_format(os.path.join(root, "grpo_B512_s0.csv")) == "wandb"
    tmap = "score=eval/acc,samples=train/samples,time=train/step_time"
    s = analyze_and_report(root, TARGET, tolerance=0.1, overrides={"tag_map": tmap})
    _check_known_answer(s, "wandb")
    (skip,) = s["skipped"]      # a CSV that is not an export: listed, saying what it lacks
    assert skip["dir"] == "notes.csv" and "W&B history export (CSV/parquet with _step" in \
        skip["reason"]
    # no time column mapped: _runtime, eval time included and said so
    (run, *_) = readers.read_sweep_dir(root, tag_map="score=eval/acc,samples=train/samples"
                                       ).runs
    assert run.name == "grpo_B1024_s0"
    assert run.train[-1]["time_s"] == pytest.approx(40 * 1024 / 15 + 20 * 5.0 - 5.0)
    assert any("wall time from _runtime" in w for w in run.warnings)
    with pytest.raises(readers.ReaderError, match="^tag_map: run grpo_B1024_s0: .*W&B export"):
        readers.read_sweep_dir(root)


def write_openrlhf_wandb_export(run_dir, batch, q, n_star):
    """Run.history().to_parquet() of an OpenRLHF run: WandbLogger.log_train logs
    {"train/<k>": v, "train/global_step": step}, log_eval {"eval/<k>": v,
    "eval/global_step": step}, each a wandb.log call (openrlhf/utils/logging_utils.py)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    train, ev = openrlhf_logs(batch, q, n_star)
    rows, t = [], 0.0
    for s, st in train:
        t += st["timing/step_total"]
        rows.append({"_step": len(rows), "_runtime": t, "_timestamp": 1.7e9 + t,
                     "train/global_step": s, **{f"train/{k}": v for k, v in st.items()
                                                if k != "generated_samples"}})
        if s in ev:
            t += 30.0
            rows.append({"_step": len(rows), "_runtime": t, "_timestamp": 1.7e9 + t,
                         "eval/global_step": s, **{f"eval/{k}": v for k, v in ev[s].items()}})
    cols = sorted({k for r in rows for k in r})
    os.makedirs(run_dir, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in cols} for r in rows]),
                   os.path.join(run_dir, "history.parquet"))


def test_wandb_parquet_openrlhf_detected(tmp_path):
    pytest.importorskip("pyarrow")
    root = str(tmp_path)
    for b, ns, q in SWEEP:
        write_openrlhf_wandb_export(os.path.join(root, f"grpo_B{b}_s0"), b, q, ns)
    assert readers.detect_format(os.path.join(root, "grpo_B512_s0")) == "wandb"
    s = analyze_and_report(root, TARGET, tolerance=0.1)    # no map: OpenRLHF's columns
    _check_known_answer(s, "wandb-openrlhf")
    assert any("history.parquet: the columns openrlhf logs" in w for w in s["warnings"])
    # a cut parquet: listed as skipped, naming the file
    p = os.path.join(root, "grpo_B512_s0", "history.parquet")
    data = open(p, "rb").read()
    with open(p, "wb") as f:
        f.write(data[: len(data) // 2])
    sweep = readers.read_sweep_dir(root)
    reason = {x["dir"]: x["reason"] for x in sweep.skipped}["grpo_B512_s0"]
    assert "history.parquet" in reason, reason


def test_each_layout_detected_as_its_own(tmp_path):
    """Auto-detection tells every layout apart (no two formats claim one run), and a sweep
    mixing them is refused with one line naming each."""
    pytest.importorskip("tensorboard")
    r = str(tmp_path)
    write_trl_run(r, "trl_s0", 16, 4, 8, 10000, 10.0)
    write_verl_run(r, "verl_s0", 64, 8, 10000, 10.0)
    _jsonl_to_events(write_verl_run(r, "verltb_s0", 64, 8, 10000, 10.0))
    write_openrlhf_run(r, "openrlhf_s0", 512, 10.0, 10000)
    write_primerl_run(r, "prime_s0", 512, 10.0, 10000)
    write_tb_run(r, "tb_s0", 512, 10.0, 10000)
    _to_csv(os.path.join(r, "wandb_s0.csv"), wandb_history(512, 10.0, 10000))
    write_openrlhf_wandb_export(os.path.join(r, "wandbdir_s0"), 512, 10.0, 10000)
    write_synthetic_run(r, SyntheticRun("jaxrl_s0", 512, 10000, 10.0))
    want = {"trl_s0": "trl", "verl_s0": "verl", "verltb_s0": "verl", "openrlhf_s0": "openrlhf",
            "prime_s0": "prime-rl", "tb_s0": "tensorboard", "wandb_s0.csv": "wandb",
            "wandbdir_s0": "wandb", "jaxrl_s0": "jaxrl"}
    assert {e: readers.detect_format(os.path.join(r, e)) for e in want} == want
    with pytest.raises(readers.ReaderError) as e:
        readers.read_sweep_dir(r)
    msg = str(e.value)
    assert msg.startswith("format: ") and "\n" not in msg
    for f in set(want.values()):
        assert f"{f}: " in msg
    # one format selected: the others are listed as skipped, saying what they are
    sweep = readers.read_sweep_dir(r, "prime-rl")
    assert [x.name for x in sweep.runs] == ["prime_s0"]
    assert {x["dir"]: x["reason"] for x in sweep.skipped}["openrlhf_s0"].endswith(
        "(it is a openrlhf run)")


@pytest.mark.slow     # three command launches (a few seconds each)
def test_cli_tag_map_and_new_formats(tmp_path):
    pytest.importorskip("tensorboard")
    root = str(tmp_path / "tb")
    for b, ns, q in SWEEP:
        write_tb_run(root, f"grpo_B{b}_s0", b, q, ns)
    res = _cli(f"--sweep_dir={root}", "--format=tensorboard", f"--tag_map={TAG_MAP}",
               f"--target={TARGET}", "--n_boot=50", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "grpo_B2048" in res.stdout
    for args, start in [(["--tag_map=score"], "error: tag_map: item 'score' is not field=tag"),
                        ([], "error: tag_map: run grpo_B1024_s0: TensorBoard event files, "
                             "but no tag map")]:
        res = _cli(f"--sweep_dir={root}", f"--target={TARGET}", *args, cwd=tmp_path)
        lines = [x for x in res.stderr.splitlines() if x.strip()]
        assert res.returncode == 2 and len(lines) == 1, res.stderr
        assert lines[0].startswith(start) and ". Fix: " in lines[0], lines[0]


def test_openrlhf_broken_event_file_named(tmp_path):
    """An event file with no readable record among OpenRLHF runs: still theirs (not a mixed
    sweep), listed as skipped naming the file; a cut one keeps the steps written before the
    cut (tensorboard's loader stops there, as for a run still going), with a warning naming
    the file."""
    pytest.importorskip("tensorboard")
    root = str(tmp_path)
    write_openrlhf_run(root, "a_s0", 512, 10.0, 10000)
    d = write_openrlhf_run(root, "b_s0", 1024, 15.0, 10000)
    (p,) = [os.path.join(d, f) for f in os.listdir(d)]
    data = open(p, "rb").read()
    with open(p, "wb") as f:
        f.write(data[: len(data) // 2])
    os.makedirs(os.path.join(root, "c_s0"))
    with open(os.path.join(root, "c_s0", "events.out.tfevents.1700000000.host.1.0"), "wb") as f:
        f.write(b"\x00not an event file\x00" * 10)
    for fmt in ("auto", "openrlhf"):
        sweep = readers.read_sweep_dir(root, fmt)
        assert sweep.format == "openrlhf" and [r.name for r in sweep.runs] == ["a_s0", "b_s0"]
        (skip,) = sweep.skipped
        assert skip["dir"] == "c_s0" and "c_s0/events.out.tfevents." in skip["reason"]
        assert "no scalar events" in skip["reason"]
    b = next(r for r in sweep.runs if r.name == "b_s0")
    assert 0 < b.train[-1]["step"] < 40
    assert any(w.startswith(f"{p}: truncated after ") for w in b.warnings), b.warnings


def test_wandb_verl_export_detected(tmp_path):
    """verl's W&B tracker logs wandb.log(data, step=step) (verl/utils/tracking.py), so _step is
    verl's step and the names are its FileLogger's: recognised without a map; the batch (not
    logged) comes from --responses_per_step; timing_s/testing is taken out of timing_s/step."""
    d = write_verl_run(tmp_path / "v", "grpo_B1024_s0", 128, 8, 10000, 15.0)
    rows, t = [], 0.0
    for line in open(os.path.join(d, "metrics.jsonl")):
        rec = json.loads(line)
        t += rec["data"].get("timing_s/step", 0.0)
        rows.append({"_step": rec["step"], "_runtime": t, "_timestamp": 1.7e9 + t,
                     **rec["data"]})
    _to_csv(os.path.join(tmp_path, "grpo_B1024_s0.csv"), rows)
    with pytest.raises(readers.ReaderError, match="^responses_per_step: run grpo_B1024_s0: "):
        readers.read_sweep_dir(str(tmp_path), "wandb")
    (run,) = readers.read_sweep_dir(str(tmp_path), "wandb", responses_per_step=1024).runs
    assert run.batch == 1024 and run.evals[0]["responses"] == 0
    assert run.evals[-1]["responses"] == 40 * 1024
    assert run.train[-1]["time_s"] == pytest.approx(40 * 1024 / 15.0)
    assert run.train[0]["gen_s"] == pytest.approx(1 + 1024e-3)


_NO_JAX = """
import sys
from absl import flags
from jaxrl_scale.cli import analyze
FLAGS = flags.FLAGS
for argv in sys.argv[1:]:
    FLAGS.unparse_flags()
    FLAGS(["analyze"] + argv.split())
    try:
        rc = analyze.main([])
    except SystemExit as e:       # one_line_errors ends a bad flag with exit 2
        rc = e.code
    print("rc", rc)
print("loaded", sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "optax", "flax")
                       or m in ("jaxrl_scale.optim", "jaxrl_scale.experiment.config")))
"""


def test_cli_imports_no_jax(tmp_path):
    """jaxrl-analyze (a bad flag, a sweep mixing tasks, then a verl sweep: its runs' lr rule
    is read from their names) never imports JAX: seconds of every launch, for nothing it
    uses. The refusals are one line each, exit 2."""
    root = verl_sweep(tmp_path / "verl")
    mixed = tmp_path / "mixed"
    for b, task in ((512, "arithmetic"), (1024, "gsm8k")):
        write_synthetic_run(str(mixed), SyntheticRun(f"grpo_B{b}_sqrt_s0", b, 10000, 10.0,
                            extra_config={"task": task}))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", _NO_JAX, f"--sweep_dir={root} --ci_level=2",
                          f"--sweep_dir={mixed} --format=jaxrl",
                          f"--sweep_dir={root} --target={TARGET} --n_boot=50"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.splitlines()
    assert [x for x in lines if x.startswith("rc ")] == ["rc 2", "rc 2", "rc 0"], \
        res.stdout[-3000:]
    errors = [x for x in res.stderr.splitlines() if x.startswith("error: ")]
    assert errors[0].startswith("error: ci_level: must be in (0, 1)"), errors
    assert errors[1] == (f"error: task: {mixed} mixes runs of different tasks (run "
                         "grpo_B1024_sqrt_s0: gsm8k; run grpo_B512_sqrt_s0: arithmetic). Fix: "
                         "analyse one task's runs per sweep directory (move the others out); "
                         "if it is the same data, make their configs name it alike."), errors
    assert lines[-1] == "loaded []", lines[-1]


# ----------------------------------------------------------------------------- mixed tasks


def _set_config(path, dotted, value):
    """Rewrite one key of a run's YAML/JSON config (the framework wrote the rest)."""
    from jaxrl_scale.scaling.readers.common import load_structured
    d = load_structured(path)
    *head, last = dotted.split(".")
    cur = d
    for k in head:
        cur = cur[k]
    cur[last] = value
    _dump_yaml(path, d)


def _mixed(root, fmt="auto", **kw):
    with pytest.raises(readers.ReaderError) as e:
        readers.read_sweep_dir(str(root), fmt, **kw)
    msg = str(e.value)
    assert e.value.field == "task" and "\n" not in msg and ". Fix: " in msg, msg
    return msg


def test_mixed_tasks_refused_ours(tmp_path):
    """config.json task + task_kwargs: 2-digit arithmetic is not 4-digit arithmetic; a run
    whose config names no task (an older log) joins either."""
    for b, digits in ((512, 2), (1024, 2), (2048, 4)):
        write_synthetic_run(str(tmp_path), SyntheticRun(f"grpo_B{b}_sqrt_s0", b, 10000, 10.0,
                            extra_config={"task": "arithmetic",
                                          "task_kwargs": {"digits": digits, "ops": "+-"}}))
    msg = _mixed(tmp_path)
    assert ('(run grpo_B1024_sqrt_s0: arithmetic {"digits":2,"ops":"+-"}; run '
            'grpo_B2048_sqrt_s0: arithmetic {"digits":4,"ops":"+-"})') in msg, msg
    # --format=jaxrl reads through analysis.load_runs: refused there too
    with pytest.raises(readers.ReaderError, match="^task: .* mixes runs of different tasks"):
        analyze_and_report(str(tmp_path), TARGET, fmt="jaxrl")
    # no task
    write_synthetic_run(str(tmp_path), SyntheticRun("grpo_B2048_sqrt_s0", 2048, 12000, 24.0))
    write_synthetic_run(str(tmp_path), SyntheticRun("grpo_B4096_sqrt_s0", 4096, 12000, 24.0,
                        config=False))
    sweep = readers.read_sweep_dir(str(tmp_path))
    assert len(sweep.runs) == 4
    assert [readers.task_of(r) for r in sweep.runs].count(None) == 2


def test_mixed_tasks_refused_verl(tmp_path):
    root = verl_sweep(tmp_path)
    cfg = os.path.join(root, "grpo_B1024_s0", ".hydra", "config.yaml")
    # the same files under another home directory: the same task
    _set_config(cfg, "data.train_files", "/mnt/shared/gsm8k/train.parquet")
    sweep = readers.read_sweep_dir(root)
    assert {readers.task_of(r) for r in sweep.runs} == {
        "train_files=gsm8k/train.parquet val_files=gsm8k/test.parquet"}
    _set_config(cfg, "data.train_files", ["~/data/math/train.parquet",
                                          "~/data/gsm8k/train.parquet"])
    msg = _mixed(root)
    # runs in directory order: grpo_B1024_s0 is the first with a task
    assert msg.startswith(f"task: {root} mixes runs of different tasks (run grpo_B1024_s0: "
                          "train_files=math/train.parquet,gsm8k/train.parquet "
                          "val_files=gsm8k/test.parquet; run grpo_B2048_s0: "
                          "train_files=gsm8k/train.parquet val_files=gsm8k/test.parquet). "
                          "Fix: "), msg
    # a config without data files: unknown, allowed
    _set_config(cfg, "data", {"train_batch_size": 128})
    assert len(readers.read_sweep_dir(root).runs) == 3


def test_mixed_tasks_refused_trl(tmp_path):
    root = trl_sweep(tmp_path)
    cfg = os.path.join(root, "grpo_B2048_s0", "grpo_config.yaml")
    _set_config(cfg, "dataset_config", "main")
    msg = _mixed(root)
    assert "(run grpo_B1024_s0: openai/gsm8k; run grpo_B2048_s0: openai/gsm8k:main)" in msg
    _set_config(cfg, "dataset_config", None)
    _set_config(cfg, "dataset_name", None)    # no dataset named: unknown, allowed
    sweep = readers.read_sweep_dir(root)
    assert {r.name: readers.task_of(r) for r in sweep.runs} == {
        "grpo_B512_s0": "openai/gsm8k", "grpo_B1024_s0": "openai/gsm8k", "grpo_B2048_s0": None}


def test_mixed_tasks_refused_primerl(tmp_path):
    """prime-rl's resolved config in <run dir>/configs/: its training sources' env blocks."""
    root = str(tmp_path)
    for b, ns, q in SWEEP:
        d = write_primerl_run(root, f"grpo_B{b}_s0", b, q, ns)
        env = {"taskset": {"id": "gsm8k" if b < 2048 else "math500"}}
        os.makedirs(os.path.join(d, "configs"))
        with open(os.path.join(d, "configs", "orchestrator.json"), "w") as f:
            json.dump({"train": {"source": [{"env": env, "ratio": 1.0}]}}, f, indent=2)
    msg = _mixed(root)
    assert ('(run grpo_B1024_s0: {"taskset":{"id":"gsm8k"}}; run grpo_B2048_s0: '
            '{"taskset":{"id":"math500"}})') in msg, msg


# ----------------------------------------------------------------------------- cut event files


def _record_offsets(path):
    """Byte offset of each TFRecord in an event file (uint64 length, 4-byte length CRC, data,
    4-byte data CRC), the test's own walk of what tensorboard's writer wrote."""
    import struct
    data, out, pos = open(path, "rb").read(), [], 0
    while pos < len(data):
        out.append(pos)
        pos += 12 + struct.unpack("<Q", data[pos:pos + 8])[0] + 4
    assert pos == len(data)
    return out, data


def test_cut_event_file_named_with_offset(tmp_path):
    """tensorboard's loader stops silently at a cut or corrupt record: the run still reads
    what precedes it, with a warning naming the file, the records read and the byte offset;
    a run whose only file is cut before its first whole record is skipped saying so."""
    pytest.importorskip("tensorboard")
    from jaxrl_scale.scaling.readers import tensorboard as tb
    root = str(tmp_path)
    for b, ns, q in SWEEP:
        write_tb_run(root, f"grpo_B{b}_s0", b, q, ns)
    events = {b: tb.event_files(os.path.join(root, f"grpo_B{b}_s0"))[0] for b, _, _ in SWEEP}
    for p in events.values():
        assert tb.frame_records(p)[3] is None     # a whole file: no problem (its CRCs check)
    # cut mid-data of record 100 (each step logs 3-4 scalars, one event each)
    offs, data = _record_offsets(events[1024])
    open(events[1024], "wb").write(data[: offs[100] + 20])
    # the data of record 50 damaged: the loader stops there (failed data CRC)
    offs2, data2 = _record_offsets(events[2048])
    bad = bytearray(data2)
    bad[offs2[50] + 14] ^= 0xFF
    open(events[2048], "wb").write(bytes(bad))
    # a run of one file cut inside its first record's header
    d = os.path.join(root, "grpo_B4096_s0", "tb")
    os.makedirs(d)
    open(os.path.join(d, os.path.basename(events[512])), "wb").write(data[:7])
    sweep = readers.read_sweep_dir(root, "tensorboard", tag_map=TAG_MAP)
    runs = {r.name: r for r in sweep.runs}
    (w,) = [x for x in runs["grpo_B1024_s0"].warnings if "truncated" in x]
    assert w.startswith(f"{events[1024]}: truncated after 100 records (the record at byte "
                        f"{offs[100]} runs past the end of the file at byte {offs[100] + 20}")
    assert runs["grpo_B1024_s0"].train[-1]["step"] < 40    # the steps before the cut, read
    (w,) = [x for x in runs["grpo_B2048_s0"].warnings if "unreadable record" in x]
    assert w.startswith(f"{events[2048]}: unreadable record at byte {offs2[50]} (its data "
                        f"fails its CRC) after 50 of {len(offs2)} records")
    assert not [x for x in runs["grpo_B512_s0"].warnings if events[512] in x]
    (skip,) = sweep.skipped
    assert skip["dir"] == "grpo_B4096_s0" and "no scalar events" in skip["reason"]
    assert "truncated after 0 records (the record at byte 0 runs past the end of the file at " \
        "byte 7" in skip["reason"], skip["reason"]
    # a file of garbage: its first length fails its CRC
    open(os.path.join(d, os.path.basename(events[512])), "wb").write(b"\x00not events\x00" * 9)
    sweep = readers.read_sweep_dir(root, "tensorboard", tag_map=TAG_MAP)
    assert "corrupt record header at byte 0 after 0 records" in sweep.skipped[0]["reason"]
    # cut before its first eval: skipped for that, and the cut named as the likely reason
    offs3, data3 = _record_offsets(events[512])
    open(events[512], "wb").write(data3[: offs3[3] + 2])
    sweep = readers.read_sweep_dir(root, "tensorboard", tag_map=TAG_MAP)
    reason = {x["dir"]: x["reason"] for x in sweep.skipped}["grpo_B512_s0"]
    assert "no eval score" in reason and f"truncated after 3 records (the record at byte " \
        f"{offs3[3]} " in reason, reason
