"""Every bad input of the commands ends with one line, `error: <field>: <problem>. Fix: <fix>.`,
and exit status 2 before any data, model or compile; installed commands; a quiet terminal.

The table runs in one child process per command (absl flags are process-global, and each
command defines its own), with run_training / run_sweep / the warm-start replaced by a
sentinel so a row that slipped through validation fails fast instead of training.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TRAIN_ROWS = [
    ("--algo=foo", "algo"), ("--group_size=1", "group_size"), ("--algo=ppo", "group_size"),
    ("--prompts_per_step=0", "prompts_per_step"), ("--base_lr=0", "base_lr"),
    ("--critic_base_lr=-1", "critic_base_lr"), ("--base_batch=0", "base_batch"),
    ("--lr_rule=cubic", "lr_rule"), ("--clip_low=-0.1", "clip_low"),
    ("--clip_high=-1", "clip_high"), ("--vf_clip=-1", "vf_clip"), ("--kl_coef=-0.05", "kl_coef"),
    ("--gamma=1.5", "gamma"), ("--lam=-1", "lam"), ("--eval_every=0", "eval_every"),
    ("--router_aux_coef=-1", "router_aux_coef"), ("--router_aux_coef=0.01", "router_aux_coef"),
    ("--checkpoint_every=0", "checkpoint_every"), ("--micro_batches=3", "micro_batches"),
    ("--max_new_tokens=0", "max_new_tokens"), ("--dual_clip=0.5", "dual_clip"),
    ("--gen_batch_ratio=0", "gen_batch_ratio"), ("--max_staleness=-2", "max_staleness"),
    ("--gen_batch_ratio=2 --max_staleness=0", "max_staleness"), ("--rollout=vllm", "rollout"),
    ("--rollout=generate --gen_batch_ratio=2", "rollout"), ("--engine_steps=0", "engine_steps"),
    ("--generate_chunk=0", "generate_chunk"), ("--eval_samples=0", "eval_samples"),
    ("--eval_prompts=0", "eval_prompts"), ("--eval_prompts=600", "eval_prompts"),
    ("--hf_checkpoint=/no/such/dir", "hf_checkpoint"), ("--task=foo", "task"),
    ("--model=foo", "model"), ("--tokenizer=/no/such/dir", "tokenizer"),
    ("--init_checkpoint=/no/such/dir", "init_checkpoint"), ("--task_kwargs='{bad'", "task_kwargs"),
    ("""--task_kwargs='{"digits": 0}'""", "task_kwargs"),
    ("""--task_kwargs='{"colour": 1}'""", "task_kwargs"),
    ("--task=math_jsonl", "task_kwargs"), ("--temperature=-1", "temperature"),
    ("--top_p=1.5", "top_p"), ("--top_k=-1", "top_k"), ("--advantage=foo", "advantage"),
    ("--agg=mean", "agg"), ("--kl_kind=k9", "kl_kind"), ("--max_steps=0", "max_steps"),
    ("--max_responses=-1", "max_responses"), ("--warmup_steps=-1", "warmup_steps"),
    ("--max_grad_norm=-1", "max_grad_norm"), ("--b1=1.5", "b1"), ("--eps=0", "eps"),
    ("--target=2", "target"), ("--target_margin=0.5", "target_margin"),
    ("--mesh_data=3", "mesh_data"), ("--num_train_examples=-5", "num_train_examples"),
    ("--max_prompt_len=-1", "max_prompt_len"), ("--seed=-1", "seed"),
    ("--entropy_coef=-1", "entropy_coef"),
    ("--run_dir={resumed} --warmstart=false --prompts_per_step=16", "prompts_per_step"),
    ("--run_dir={file}", "run_dir"),
    ("--critic_minibatches=2", "critic_minibatches"),
    ("--algo=ppo --group_size=1 --critic_minibatches=3", "critic_minibatches"),
    ("--algo=ppo --group_size=1 --critic_lr_rule=cubic", "critic_lr_rule"),
    ("--wandb_mode=cloud", "wandb_mode"), ("--reward_fn=nocolon", "reward_fn"),
    ("--reward_fn=no_such_module_xyz:f", "reward_fn"), ("--reward_timeout_s=-1", "reward_timeout_s"),
    ("--lora_rank=-1", "lora_rank"),
    ("--lora_alpha=0", "lora_alpha"), ("--lora_targets=q,x", "lora_targets"),
    ("--lora_targets=q,q", "lora_targets"), ("--lora_rank=4 --lora_targets=", "lora_targets"),
    ("--lora_rank=4 --algo=ppo --group_size=1", "lora_rank"),
    ("--lora_rank=4 --model=moe_cpu", "lora_targets"),
    # multi-process launch settings (jaxrl_scale/cli: checked before jax.distributed starts)
    ("--num_processes=0", "num_processes"),
    ("--coordinator_address=127.0.0.1:1234", "num_processes"), ("--process_id=1", "process_id"),
    ("--num_processes=2 --coordinator_address=nohost", "coordinator_address"),
    ("--num_processes=2 --coordinator_address=h:99999", "coordinator_address"),
    ("--num_processes=2 --coordinator_address=127.0.0.1:1234 --process_id=2", "process_id"),
]
SWEEP_ROWS = [
    ("--prompts=0", "prompts"), ("--seeds=", "seeds"), ("--algos=foo", "algos"),
    ("--lr_rules=cubic", "lr_rules"), ("--pairs=32y4", "pairs"), ("--target=foo", "target"),
    ("--gen_batch_ratios=0", "gen_batch_ratios"), ("--base_prompts=7", "base_prompts"),
    ("--max_responses=0", "max_responses"), ("--tune_lrs=-1", "tune_lrs"),
    ("--group_sizes=1", "group_size"), ("--clip_low=-1", "clip_low"),
    ("--prompts=8,16 --base_prompts=16 --fixed_prompts=", "REACHED"),   # a good grid runs
]
SFT_ROWS = [
    ("--target_accuracy=2", "target_accuracy"), ("--target_accuracy=nan", "target_accuracy"),
    ("--target_accuracy=0", "target_accuracy"), ("--target_accuracy=inf", "target_accuracy"),
    ("--batch_size=0", "batch_size"), ("--max_steps=0", "max_steps"),
    ("--max_steps=-3", "max_steps"), ("--lr=0", "lr"), ("--lr=inf", "lr"), ("--lr=nan", "lr"),
    ("--fraction=0", "fraction"), ("--fraction=1.5", "fraction"),
    ("--eval_every=0", "eval_every"), ("--max_steps=10 --eval_every=50", "eval_every"),
    ("--eval_prompts=0", "eval_prompts"), ("--max_new_tokens=0", "max_new_tokens"),
    ("--num_train_examples=0", "num_train_examples"),
    ("--num_test_examples=0", "num_test_examples"), ("--max_prompt_len=-1", "max_prompt_len"),
    ("--seed=-1", "seed"), ("--model=nope", "model"),
    ("--max_steps=2 --eval_every=1", "REACHED"),                   # a good config runs
]

# One child process per command: parse each row, run main(), record how it ended.
_CHILD = textwrap.dedent("""
    import contextlib, io, json, shlex, sys, time
    from absl import flags
    import {module} as m
    class Reached(Exception):
        pass
    def reached(*a, **k):
        raise Reached()
    for name in ("run_training", "run_sweep", "sft_warmstart"):
        if hasattr(m, name):
            setattr(m, name, reached)
    out = []
    for row in json.load(open(sys.argv[1])):
        flags.FLAGS.unparse_flags()
        flags.FLAGS(["cmd", *shlex.split(row)])
        err, code, t0 = io.StringIO(), None, time.perf_counter()
        try:
            with contextlib.redirect_stderr(err):
                ret = m.main([])
            code = ret
        except SystemExit as e:
            code = e.code
        except Reached:
            code = "REACHED"
        out.append(dict(row=row, code=code, stderr=err.getvalue(),
                        seconds=time.perf_counter() - t0))
    print(json.dumps(out))
""")


def _table(tmp_path, module, rows, **fmt):
    spec = tmp_path / f"{module.rsplit('.', 1)[-1]}_rows.json"
    def fill(row):
        for k, v in fmt.items():
            row = row.replace("{" + k + "}", str(v))
        return row
    spec.write_text(json.dumps([fill(r) for r, _ in rows]))
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    res = subprocess.run([sys.executable, "-c", _CHILD.format(module=module), str(spec)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _check(results, rows):
    assert len(results) == len(rows)
    for got, (row, field) in zip(results, rows):
        if field == "REACHED":
            assert got["code"] == "REACHED", got
            continue
        lines = [l for l in got["stderr"].splitlines() if l.strip()]
        assert got["code"] == 2, got
        assert len(lines) == 1 and lines[0].startswith(f"error: {field}: "), (row, got["stderr"])
        assert ". Fix: " in lines[0], lines[0]
        assert got["seconds"] < 10, got      # validation only: nothing loaded or compiled


def _resumed_dir(tmp_path) -> str:
    """A run directory started with P=32 (config.json and a metrics file)."""
    from jaxrl_scale.experiment.config import TrainConfig, write_config
    d = tmp_path / "resumed"
    write_config(str(d), TrainConfig.make(run_dir=str(d), prompts_per_step=32))
    (d / "metrics.jsonl").write_text('{"step": 0}\n')
    return str(d)


def test_train_bad_inputs_one_line_each(tmp_path):
    assert len(TRAIN_ROWS) >= 30
    (tmp_path / "a_file").write_text("")
    rows = TRAIN_ROWS + [("--run_dir={resumed} --warmstart=false --max_steps=7", "REACHED")]
    results = _table(tmp_path, "jaxrl_scale.cli.train", rows, resumed=_resumed_dir(tmp_path),
                     file=tmp_path / "a_file")
    _check(results, rows)
    moved = [r for r in results if "prompts_per_step=16" in r["row"]][0]["stderr"]
    assert "saved 32, now 16" in moved and "max_steps" in moved   # what may change is listed


def test_sweep_bad_inputs_one_line_each(tmp_path):
    results = _table(tmp_path, "jaxrl_scale.cli.sweep", SWEEP_ROWS)
    _check(results, SWEEP_ROWS)


def test_sft_bad_inputs_one_line_each(tmp_path):
    assert len(SFT_ROWS) >= 16
    results = _table(tmp_path, "jaxrl_scale.cli.sft", SFT_ROWS)
    _check(results, SFT_ROWS)


def test_sft_warmstart_refuses_before_caching(tmp_path):
    """The library entry point validates too: a zero-batch run is never cached."""
    from jaxrl_scale.experiment.config import ConfigError
    from jaxrl_scale.experiment.sft import SFTConfig, sft_warmstart
    with pytest.raises(ConfigError, match="^batch_size: "):
        sft_warmstart(SFTConfig(batch_size=0, cache_dir=str(tmp_path / "c")))
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("command, flag, field", [
    ("jaxrl-train", "--gamma=1.5", "gamma"), ("jaxrl-sweep", "--prompts=0", "prompts"),
    ("jaxrl-sft", "--max_steps=0", "max_steps"),
    ("jaxrl-analyze", "--n_boot=0", "n_boot")])
def test_installed_command_exits_2_with_one_line(tmp_path, command, flag, field):
    """The real thing for one row per command: the console script, exit status 2, one line on
    stderr, no traceback, no run directory made."""
    exe = os.path.join(os.path.dirname(sys.executable), command)
    if not os.path.exists(exe):
        pytest.skip(f"{command} is not installed (pip install -e .)")
    res = subprocess.run([exe, flag], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    lines = [l for l in res.stderr.splitlines() if l.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith(f"error: {field}: ") and "Traceback" not in res.stderr
    assert os.listdir(tmp_path) == []


def test_every_command_is_installed_with_help():
    """pyproject's console scripts name modules that exist and define run()."""
    import importlib
    import tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert {"jaxrl-train", "jaxrl-sweep", "jaxrl-analyze"} <= set(scripts)
    for name, target in scripts.items():
        module, func = target.split(":")
        spec = importlib.util.find_spec(module)
        assert spec is not None, name
        with open(spec.origin) as f:
            assert f"def {func}(" in f.read(), name


def _run_dir(root, name, train=None, evals=None, raw=None):
    """A jaxrl run directory: config.json and metrics.jsonl (records, or raw lines)."""
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"name": name, "algo": "grpo", "batch_train": 64,
                                               "lr_rule": "sqrt", "seed": 0}))
    if train is None:
        train = [{"step": s, "responses": 64 * s, "time_s": 1.0 * s} for s in range(1, 11)]
    if evals is None:
        evals = [{"step": s, "responses": 64 * s, "score": 0.1 + 0.08 * s} for s in (0, 5, 10)]
    lines = raw if raw is not None else [json.dumps(r) for r in train + evals]
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return d


def _bad(tmp_path, name, **kw):
    root = tmp_path / name
    _run_dir(root, "grpo_P8_G8_sqrt_s0", **kw)
    return root


def test_analyze_bad_inputs_one_line_each(tmp_path):
    good = tmp_path / "good"
    _run_dir(good, "grpo_P8_G8_sqrt_s0")
    T = lambda rs: [{"step": s, "responses": n, "time_s": t} for s, n, t in rs]   # noqa: E731
    neg = _bad(tmp_path, "neg", train=T([(1, 64, 1.0), (2, -64, 2.0)]))
    dec = _bad(tmp_path, "dec", train=T([(1, 64, 1.0), (2, 128, 2.0), (3, 100, 3.0)]))
    tinf = _bad(tmp_path, "tinf", raw=['{"step": 1, "responses": 64, "time_s": 1.0}',
                                       '{"step": 2, "responses": 128, "time_s": Infinity}',
                                       '{"step": 2, "responses": 128, "score": 0.5}'])
    tnan = _bad(tmp_path, "tnan", raw=['{"step": 1, "responses": 64, "time_s": NaN}',
                                       '{"step": 1, "responses": 64, "score": 0.5}'])
    tdec = _bad(tmp_path, "tdec", train=T([(1, 64, 5.0), (2, 128, 4.0)]))
    rows = [
        (f"--sweep_dir={good} --n_boot=0", "n_boot"), (f"--sweep_dir={good} --n_boot=19", "n_boot"),
        (f"--sweep_dir={good} --ci_level=0.99 --n_boot=150", "n_boot"),
        (f"--sweep_dir={good} --n_boot=-5", "n_boot"), (f"--sweep_dir={good} --target=-1", "target"),
        (f"--sweep_dir={good} --target=nan", "target"), (f"--sweep_dir={good} --target=inf", "target"),
        (f"--sweep_dir={good} --target=high", "target"),
        (f"--sweep_dir={good} --target=0.05", "target"),      # below every score: N* = 0
        (f"--sweep_dir={good} --ci_level=1", "ci_level"),
        (f"--sweep_dir={good} --ci_level=0", "ci_level"),
        (f"--sweep_dir={good} --tolerance=-1", "tolerance"),
        (f"--sweep_dir={good} --tolerance=nan", "tolerance"),
        (f"--sweep_dir={good} --responses_per_step=0", "responses_per_step"),
        (f"--sweep_dir={good} --world_size=0", "world_size"),
        ("--n_boot=1000", "sweep_dir"),
        (f"--sweep_dir={neg}", "responses"), (f"--sweep_dir={dec}", "responses"),
        (f"--sweep_dir={tinf}", "time_s"), (f"--sweep_dir={tnan}", "time_s"),
        (f"--sweep_dir={tdec}", "time_s"),
        (f"--sweep_dir={tmp_path / 'nothing_here'}", "analysis"),
    ]
    results = _table(tmp_path, "jaxrl_scale.cli.analyze", rows)
    _check(results, rows)
    by = {r["row"]: r["stderr"] for r in results}
    assert "metrics.jsonl step 2: is negative" in by[f"--sweep_dir={neg}"]
    assert "step 3: decreases (100 after 128 at step 2)" in by[f"--sweep_dir={dec}"]
    assert "step 2: is inf" in by[f"--sweep_dir={tinf}"]
    assert str(neg) in by[f"--sweep_dir={neg}"]          # names the file


def test_make_run_counts_what_it_ignores():
    """NaN scores and string-typed numbers are ignored, counted, and listed in run.warnings."""
    from jaxrl_scale.scaling import io as sio
    recs = [{"step": 1, "responses": 64, "time_s": 1.0},
            {"step": 2, "responses": "128", "time_s": 2.0},
            {"step": 2, "responses": 128, "score": float("nan")},
            {"step": 3, "responses": 192, "score": "0.5"},
            {"step": 4, "responses": 256, "score": 0.5}]
    run = sio.make_run("r", recs, {"batch_train": 64}, source="m.jsonl")
    assert len(run.evals) == 1 and len(run.train) == 1
    w = "\n".join(run.warnings)
    assert "1 eval record(s) with a non-finite score ignored (first at step 2) in m.jsonl" in w
    assert "1 record(s) with a string-typed 'responses' ignored (first at step 2)" in w
    assert "1 record(s) with a string-typed 'score' ignored (first at step 3)" in w


@pytest.mark.parametrize("recs, field, step", [
    ([{"step": 1, "responses": -1, "time_s": 0.0}], "responses", 1),
    ([{"step": 1, "responses": 9, "time_s": 0.0}, {"step": 2, "responses": 8, "time_s": 1.0}],
     "responses", 2),
    ([{"step": 4, "responses": 9, "time_s": float("inf")}], "time_s", 4),
    ([{"step": 4, "responses": 9, "time_s": float("nan")}], "time_s", 4),
    ([{"step": 1, "responses": 9, "time_s": 3.0}, {"step": 2, "responses": 10, "time_s": 1.0}],
     "time_s", 2),
])
def test_make_run_refuses_nonsense(recs, field, step):
    from jaxrl_scale.scaling import io as sio
    with pytest.raises(sio.DataError) as e:
        sio.make_run("r", recs, source="m.jsonl")
    assert str(e.value).startswith(f"{field}: m.jsonl step {step}: ") and ". Fix: " in str(e.value)
