"""Other frameworks' logs (scaling/readers): TRL trainer_state.json and verl FileLogger JSONL,
written in each framework's own layout for sweeps with known answers, through the same
analysis; bad inputs get one line naming the file or the flag."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxrl_scale.experiment.analyze import analyze_and_report
from jaxrl_scale.scaling import readers
from jaxrl_scale.scaling.analysis import AnalysisError
from jaxrl_scale.scaling.synthetic import write_synthetic_run

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
    """A GRPOTrainer output_dir: trainer_state.json exactly as transformers'
    TrainerState.save_to_json writes it (json.dumps(asdict(state), indent=2, sort_keys=True)
    + "\\n"), TRL's CLI config YAML and accelerate's config YAML beside it."""
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
    with open(os.path.join(sd, "trainer_state.json"), "w", encoding="utf-8") as f:
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
    write_synthetic_run(str(tmp_path), "j_s0", 512, 10000, 10.0)
    with pytest.raises(readers.ReaderError) as e:
        readers.read_sweep_dir(str(tmp_path))
    assert e.value.field == "format" and "jaxrl: j_s0; trl: t_s0; verl: v_s0" in str(e.value)
    sweep = readers.read_sweep_dir(str(tmp_path), "verl")
    assert [r.name for r in sweep.runs] == ["v_s0"]
    assert {x["dir"]: x["reason"] for x in sweep.skipped}["t_s0"].endswith("(it is a trl run)")
    with pytest.raises(readers.ReaderError, match="^format: unknown format"):
        readers.read_sweep_dir(str(tmp_path), "openrlhf")


def test_own_sweeps_read_as_before(tmp_path):
    write_synthetic_run(str(tmp_path), "grpo_B512_sqrt_s0", 512, 10000, 10.0)
    write_synthetic_run(str(tmp_path), "grpo_B1024_sqrt_s0", 1024, 10000, 15.0)
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
    # our own runs keep their tensorboard/ copy of metrics.jsonl: still ours
    write_synthetic_run(str(tmp_path / "own"), "grpo_B512_s0", 512, 10000, 10.0)
    os.makedirs(tmp_path / "own" / "grpo_B512_s0" / "tensorboard")
    open(tmp_path / "own" / "grpo_B512_s0" / "tensorboard" / "events.out.tfevents.1.h",
         "wb").close()
    assert readers.detect_format(str(tmp_path / "own" / "grpo_B512_s0")) == "jaxrl"
