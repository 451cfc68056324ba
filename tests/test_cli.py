"""Every bad input of the commands ends with one line, `error: <field>: <problem>. Fix: <fix>.`,
and exit status 2 before any data, model or compile; installed commands; a quiet terminal.

The table runs in one child process per command (absl flags are process-global, and each
command defines its own), with run_training / run_sweep / the warm-start replaced by a
sentinel so a row that slipped through validation fails fast instead of training.
"""
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A chat template that refuses a conversation without a system message (every run prompt is
# one user turn), and one that renders task prompts (all its characters are char tokens).
BROKEN_TEMPLATE = os.path.join(ROOT, "tests", "data", "broken_chat_template.jinja")
GOOD_TEMPLATE = os.path.join(ROOT, "tests", "data", "qwen2_5_chat_template.jinja")
CHAT_ROWS = [("--chat_template=auto", "chat_template"),     # the char tokenizer has none
             (f"--chat_template={BROKEN_TEMPLATE}", "chat_template"),
             ("--chat_template=/no/such/template.jinja", "chat_template")]

# Off-policy correction (LossConfig.is_cap / ratio_level): also run alone, by name (-k is_cap).
OFFPOLICY_ROWS = [
    ("--is_cap=-1", "is_cap"), ("--is_cap=0.5", "is_cap"), ("--is_cap=inf", "is_cap"),
    ("--ratio_level=seq", "ratio_level"),
]
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
    ("--mesh_expert=0", "mesh_expert"), ("--mesh_expert=2", "mesh_expert"),
    ("--model=moe_cpu --mesh_expert=3", "mesh_expert"),
    ("--model=moe_cpu --mesh_expert=16", "mesh_expert"), ("--moe_dispatch=ragged", "moe_dispatch"),
    ("--max_prompt_len=-1", "max_prompt_len"), ("--seed=-1", "seed"),
    ("--entropy_coef=-1", "entropy_coef"),
    ("--run_dir={resumed} --warmstart=false --prompts_per_step=16", "prompts_per_step"),
    ("--run_dir={file}", "run_dir"),
    ("--critic_minibatches=2", "critic_minibatches"),
    ("--updates_per_rollout=0", "updates_per_rollout"),
    ("--updates_per_rollout=-1", "updates_per_rollout"),
    ("--updates_per_rollout=3", "updates_per_rollout"),       # 32 prompts: 3 does not divide
    ("--updates_per_rollout=16 --micro_batches=4", "updates_per_rollout"),
    ("--updates_per_rollout=2 --is_cap=2", "updates_per_rollout"),
    ("--refill", "refill_cap"), ("--refill --refill_cap=0", "refill_cap"),
    ("--refill --refill_cap=-2", "refill_cap"), ("--refill_cap=4", "refill_cap"),
    ("--refill_prompts=4", "refill_prompts"),
    ("--refill --refill_cap=4 --refill_prompts=-1", "refill_prompts"),
    ("--refill --refill_cap=4 --algo=ppo --group_size=1", "refill"),
    ("--refill --refill_cap=4 --gen_batch_ratio=2", "refill"),
    ("--token_budget=-1", "token_budget"), ("--token_budget=64 --micro_batches=2", "micro_batches"),
    ("--token_budget=64 --ratio_level=sequence", "ratio_level"),
    ("--update_epochs=0", "update_epochs"),
    ("--update_epochs=2 --is_cap=2", "update_epochs"),
    ("--algo=ppo --group_size=1 --critic_minibatches=3", "critic_minibatches"),
    ("--algo=ppo --group_size=1 --critic_lr_rule=cubic", "critic_lr_rule"),
    ("--wandb_mode=cloud", "wandb_mode"), ("--reward_fn=nocolon", "reward_fn"),
    ("--reward_fn=no_such_module_xyz:f", "reward_fn"), ("--reward_timeout_s=-1", "reward_timeout_s"),
    ("--reward_fn=builtins:exec", "reward_fn"), ("--reward_fn=os:system", "reward_fn"),
    ("--reward_url=localhost:8000/get_reward", "reward_url"),
    ("--reward_fn=m:f --reward_url=http://127.0.0.1:1/r", "reward_url"),
    ("--reward_concurrency=0", "reward_concurrency"),
    ("--judge_url=http://127.0.0.1:1/v1/chat/completions --judge_model=m "
     "--judge_template={file}", "judge_template"),
    ("--base_lr=inf", "base_lr"), ("--critic_base_lr=nan", "critic_base_lr"),
    ("--lora_rank=-1", "lora_rank"), ("--remat=sometimes", "remat"),
    ("--lora_alpha=0", "lora_alpha"), ("--lora_targets=q,x", "lora_targets"),
    ("--lora_targets=q,q", "lora_targets"), ("--lora_rank=4 --lora_targets=", "lora_targets"),
    ("--lora_rank=4 --algo=ppo --group_size=1", "lora_rank"),
    ("--lora_rank=4 --model=moe_cpu", "lora_targets"),
    ("--warmstart_tool_demos=2", "warmstart_tool_demos"),
    ("--env=jaxrl_scale.data.envs:nope", "env"),
    *OFFPOLICY_ROWS, *CHAT_ROWS,
    # multi-process launch settings (jaxrl_scale/cli: checked before jax.distributed starts)
    ("--num_processes=0", "num_processes"),
    ("--coordinator_address=127.0.0.1:1234", "num_processes"), ("--process_id=1", "process_id"),
    ("--num_processes=2 --coordinator_address=nohost", "coordinator_address"),
    ("--num_processes=2 --coordinator_address=h:99999", "coordinator_address"),
    ("--num_processes=2 --coordinator_address=127.0.0.1:1234 --process_id=2", "process_id"),
]
SWEEP_ROWS = [
    ("--remat=save_only_these_names", "remat"),
    ("--prompts=0", "prompts"), ("--seeds=", "seeds"), ("--algos=foo", "algos"),
    ("--lr_rules=cubic", "lr_rules"), ("--pairs=32y4", "pairs"), ("--target=foo", "target"),
    ("--gen_batch_ratios=0", "gen_batch_ratios"), ("--base_prompts=7", "base_prompts"),
    ("--updates_per_rollout=0", "updates_per_rollout"),
    ("--updates_per_rollout=3", "updates_per_rollout"),   # P = 8 is not split into 3
    ("--max_responses=0", "max_responses"), ("--tune_lrs=-1", "tune_lrs"),
    ("--tune_seeds=0,0", "tune_seeds"), ("--tune_seeds=", "tune_seeds"),
    ("--group_sizes=1", "group_size"), ("--clip_low=-1", "clip_low"),
    ("--target_fraction=1.2", "target_fraction"), ("--target_fraction=0", "target_fraction"),
    ("--timing_blocks=1 --warm_starts=1", "timing_blocks"),
    ("--timing_blocks=0", "timing_blocks"), ("--target_stop_evals=-1", "target_stop_evals"),
    ("--timing_tolerance=0", "timing_tolerance"),
    ("--timing_blocks=6 --timing_max_blocks=4", "timing_max_blocks"),
    ("--warmstart_seed=-1", "warmstart_seed"), ("--max_prompt_len=3", "max_prompt_len"),
    ("--warmstart_tool_demos=1.5", "warmstart_tool_demos"),
    ("--max_responses=8", "max_responses"), ("--tune_responses=8", "tune_responses"),
    ("--warm_starts=0", "warm_starts"), ("--warm_starts=2 --nowarmstart", "warm_starts"),
    ("--warm_start_checkpoints=/no/such/a,/no/such/b", "warm_start_checkpoints"),
    ("--warm_start_checkpoints={file}", "warm_start_checkpoints"), *CHAT_ROWS,
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
    ("--seed=-1", "seed"), ("--model=nope", "model"), *CHAT_ROWS,
    ("--tool_demos=2", "tool_demos"), ("--tool_demos=0.5 --task=countdown --task_kwargs={}",
                                       "tool_demos"),
    ("--max_steps=2 --eval_every=1", "REACHED"),                   # a good config runs
    (f"--max_steps=2 --eval_every=1 --chat_template={GOOD_TEMPLATE}", "REACHED"),
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
    if m.__name__ == "jaxrl_scale.cli.plan":      # the timing pass (minutes) is the sentinel
        import jaxrl_scale.experiment.timing as timing
        timing.time_batches = reached
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


_BUILDS_DATA = {"--max_prompt_len=3"}


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
        # validation only: nothing compiled. A prompt-length row builds the task's data first
        # to find the longest prompt (measured 13.7 s on 2 cores with the load at 6).
        assert got["seconds"] < (60 if row in _BUILDS_DATA else 10), got


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


def test_train_is_cap_and_ratio_level_bad_inputs_one_line_each(tmp_path):
    rows = OFFPOLICY_ROWS + [("--is_cap=2 --ratio_level=sequence --max_steps=1", "REACHED")]
    results = _table(tmp_path, "jaxrl_scale.cli.train", rows)
    _check(results, rows)
    capped = [r for r in results if "0.5" in r["row"]][0]["stderr"]
    assert "down-weight on-policy tokens" in capped


def test_sweep_bad_inputs_one_line_each(tmp_path):
    (tmp_path / "a_file").write_text("")
    results = _table(tmp_path, "jaxrl_scale.cli.sweep", SWEEP_ROWS, file=tmp_path / "a_file")
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
    E = lambda rs: [{"step": s, "responses": 64 * s, "score": v} for s, v in rs]  # noqa: E731
    high = _bad(tmp_path, "high", evals=E([(0, 0.1), (5, 1.5), (10, 0.9)]))
    low = _bad(tmp_path, "low", evals=E([(0, -0.2), (5, 0.5), (10, 0.9)]))
    two = [json.dumps(r) for r in T([(1, 64, 1.0), (2, 128, 2.0), (2, 128, 2.1), (3, 192, 3.0)])]
    twice = _bad(tmp_path, "twice", raw=two)               # two trainings in one directory
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
        (f"--sweep_dir={good} --target_fraction=1", "target_fraction"),
        (f"--sweep_dir={good} --target_fraction=0", "target_fraction"),
        (f"--sweep_dir={good} --responses_per_step=0", "responses_per_step"),
        (f"--sweep_dir={good} --world_size=0", "world_size"),
        ("--n_boot=1000", "sweep_dir"),
        (f"--sweep_dir={neg}", "responses"), (f"--sweep_dir={dec}", "responses"),
        (f"--sweep_dir={tinf}", "time_s"), (f"--sweep_dir={tnan}", "time_s"),
        (f"--sweep_dir={tdec}", "time_s"),
        (f"--sweep_dir={tmp_path / 'nothing_here'}", "analysis"),
        (f"--sweep_dir={high}", "score"), (f"--sweep_dir={low}", "score"),
        (f"--sweep_dir={high} --score_range=0,1.2", "score"),
        (f"--sweep_dir={good} --score_range=foo", "score_range"),
        (f"--sweep_dir={good} --score_range=1,0", "score_range"),
        (f"--sweep_dir={good} --score_range=0,inf", "score_range"),
        (f"--sweep_dir={twice}", "step"),
    ]
    results = _table(tmp_path, "jaxrl_scale.cli.analyze", rows)
    _check(results, rows)
    by = {r["row"]: r["stderr"] for r in results}
    assert "metrics.jsonl step 2: is negative" in by[f"--sweep_dir={neg}"]
    assert "step 3: decreases (100 after 128 at step 2)" in by[f"--sweep_dir={dec}"]
    assert "step 2: is inf" in by[f"--sweep_dir={tinf}"]
    assert str(neg) in by[f"--sweep_dir={neg}"]          # names the file
    assert "metrics.jsonl step 5: is 1.5, outside [0, 1]" in by[f"--sweep_dir={high}"]
    assert "--score_range=any" in by[f"--sweep_dir={high}"]
    assert (f"{twice}/grpo_P8_G8_sqrt_s0/metrics.jsonl line 3 step 2: repeats the training "
            "record of line 2") in by[f"--sweep_dir={twice}"]


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


def test_scores_outside_the_range_are_refused_unless_said_otherwise():
    from jaxrl_scale.scaling import io as sio
    run = sio.make_run("r", [{"step": 1, "responses": 64, "score": 2.5}], path="/x/r")
    sio.check_scores([run])             # "auto": another format's score may be a reward
    run.score_is_accuracy = True        # as read_run marks a jaxrl metrics.jsonl
    with pytest.raises(sio.DataError, match=r"^score: /x/r/metrics.jsonl step 1: is 2.5, "
                                            r"outside \[0, 1\] \(this score is an accuracy\)"):
        sio.check_scores([run])
    sio.check_scores([run], None)               # --score_range=any: a reward on its own scale
    sio.check_scores([run], (-5.0, 5.0))
    with pytest.raises(sio.DataError):
        sio.check_scores([run], (-5.0, 2.0))


@pytest.mark.parametrize("steps, line", [
    ([(1, 0), (2, 0), (2, 0), (3, 0)], 3),               # 0,1,2,2,3: a second training
    ([(1, 0), (2, 0), (3, 0), (1, 0)], 4),               # restarted from 1 in the same file
    ([(0, 1), (1, 0), (5, 1), (2, 0), (5, 1)], 5),       # eval steps repeat too
])
def test_interleaved_steps_are_refused_with_file_and_line(tmp_path, steps, line):
    """Training and eval records each have increasing steps (an eval shares its step with
    the training record before it; a resume cuts the file back first)."""
    from jaxrl_scale.scaling import io as sio
    lines = [json.dumps({"step": s, "responses": 64 * s, **({"score": 0.5} if ev else
                                                            {"time_s": 1.0 * s})})
             for s, ev in steps]
    d = _run_dir(tmp_path, "r", raw=lines)
    with pytest.raises(sio.DataError) as e:
        sio.read_run(str(d))
    assert str(e.value).startswith(f"step: {d}/metrics.jsonl line {line} step ")
    ok = _run_dir(tmp_path, "ok", raw=lines[:line - 1])
    sio.read_run(str(ok))


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


def _probe(root, name, norms=True, reward_fn=""):
    """A probe run at B0 = 128 (P=16 x G=8, 2 micro-batches): config.json of a real
    TrainConfig, 40 training records (with the micro-batch gradient norms unless norms=False)
    and evals every 10 steps reaching 0.5."""
    from jaxrl_scale.experiment.config import TrainConfig, write_config
    import numpy as np
    d = root / name
    write_config(str(d), TrainConfig.make(run_dir=str(d), prompts_per_step=16, group_size=8,
                                          micro_batches=2, reward_fn=""))
    if reward_fn:     # as a shared run directory may hold it (write_config would load it)
        cfg = json.loads((d / "config.json").read_text())
        cfg["reward_fn"] = reward_fn
        (d / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(0)
    recs = []
    for s in range(1, 41):
        r = {"step": s, "responses": 128 * s, "time_s": 1.0 * s, "gen_s": 0.5, "train_s": 0.5}
        if norms:
            micro = (1 + rng.standard_normal(2) * 0.3).tolist()
            r.update(actor_grad_sqnorm_micro=micro, actor_grad_sqnorm=0.6 * np.mean(micro),
                     micro_batch_size=64)
        recs.append(r)
    recs += [{"step": s, "responses": 128 * s, "score": 0.1 + 0.01 * s} for s in (0, 10, 20, 30, 40)]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    return d


def test_plan_bad_inputs_one_line_each(tmp_path):
    """Every flag of jaxrl-plan is checked before any timing pass (the sentinel): a probe
    without micro-batch norms is refused before it, and a probe's config.json never picks the
    reward function the pass would call."""
    good = _probe(tmp_path, "good")
    nonorm = _probe(tmp_path, "nonorm", norms=False)
    evil = _probe(tmp_path, "evil", reward_fn="builtins:exec")
    named = _probe(tmp_path, "named", reward_fn="my_rw:score")
    twice = _probe(tmp_path, "twice")          # a second training appended to the probe
    with open(twice / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 1, "responses": 128, "time_s": 1.0}) + "\n")
    tj = tmp_path / "timings.json"
    tj.write_text(json.dumps([{"batch": b, "batch_gen": b, "gen_s": [1 + 1e-3 * b] * 3,
                               "train_s": [0.5 + 2e-3 * b] * 3} for b in (64, 128, 256)]))
    (tmp_path / "a_file").write_text("")
    P, T = f"--probe_run={good}", f"--timings_json={tj}"
    rows = [
        (T, "probe_run"), (f"--probe_run={tmp_path / 'nope'} {T}", "probe_run"),
        (f"--probe_run={nonorm} --time_batches=64,128", "probe_run"),
        (P, "timings_json"), (f"{P} {T} --chip=H100", "timings_json"),
        (f"{P} --timings_json={tmp_path / 'no.json'}", "timings_json"),
        (f"{P} --step_times_from={tmp_path / 'nope'}", "step_times_from"),
        (f"{P} {T} --batches=64,abc", "batches"), (f"{P} {T} --batches=64,inf", "batches"),
        (f"{P} {T} --batches=64,-1", "batches"), (f"{P} {T} --batches=64,64", "batches"),
        (f"{P} --time_batches=64,100.5", "time_batches"), (f"{P} --time_batches=60", "time_batches"),
        (f"{P} --time_batches=0", "time_batches"),
        (f"{P} {T} --n_boot=0", "n_boot"), (f"{P} {T} --n_boot=19", "n_boot"),
        (f"{P} {T} --ci_level=1", "ci_level"), (f"{P} {T} --ci_level=nan", "ci_level"),
        (f"{P} {T} --ci_level=0", "ci_level"),
        (f"{P} {T} --window=0", "window"), (f"{P} {T} --window=inf", "window"),
        (f"{P} {T} --n_star=-5", "n_star"), (f"{P} {T} --n_star=inf", "n_star"),
        (f"{P} {T} --n_star=1000 --target=0.3", "n_star"),
        (f"{P} {T} --target=nan", "target"), (f"{P} {T} --target=2", "target"),
        (f"{P} {T} --gen_batch_ratio=0.5", "gen_batch_ratio"),
        (f"{P} {T} --timing_warmup=-1", "timing_warmup"),
        (f"{P} {T} --timing_steps=-1", "timing_steps"), (f"{P} {T} --block=-1", "block"),
        (f"{P} {T} --n_windows=0", "n_windows"), (f"{P} {T} --seed=-1", "seed"),
        (f"{P} {T} --external_s=-1", "external_s"),
        (f"{P} {T} --external_s=2 --external_batch=0", "external_batch"),
        (f"{P} {T} --external_s=2 --external_concurrency=0", "external_concurrency"),
        (f"{P} --chip=Z80 --prompt_len=16", "chip"), (f"{P} --chip=H100", "prompt_len"),
        (f"{P} --chip=H100 --prompt_len=0", "prompt_len"),
        (f"{P} --chip=H100 --prompt_len=16 --model=nope", "model"),
        (f"{P} {T} --compare={tmp_path / 'no.json'}", "compare"),
        (f"{P} {T} --out_dir={tmp_path / 'a_file'}", "out_dir"),
        (f"{P} {T} --out_dir={tmp_path / 'a_file' / 'sub'}", "out_dir"),
        # security: the probe's config.json names code; it runs only if the user names it
        (f"--probe_run={evil} --time_batches=64,128", "reward_fn"),
        (f"--probe_run={evil} --time_batches=64,128 --reward_fn=builtins:exec", "reward_fn"),
        (f"--probe_run={named} --time_batches=64,128", "reward_fn"),
        (f"{P} --time_batches=64,128 --reward_fn=os:system", "reward_fn"),
        (f"--probe_run={twice} {T}", "step"),
        (f"{P} --time_batches=64,128", "REACHED"),            # a good timing request runs
    ]
    assert sum(f != "REACHED" for _, f in rows) >= 15
    results = _table(tmp_path, "jaxrl_scale.cli.plan", rows)
    _check(results, rows)
    by = {r["row"]: r["stderr"] for r in results}
    assert "--reward_fn=builtins:exec if you trust" in \
        by[f"--probe_run={evil} --time_batches=64,128"]
    assert "micro_batches=2" in by[f"--probe_run={nonorm} --time_batches=64,128"]
    assert not (tmp_path / "results").exists()      # nothing written by a refused row


BENCH_ROWS = {
    "jaxrl_scale.cli.decode_bench": [
        ("--batch_sizes=0,4", "batch_sizes"), ("--batch_sizes=a", "batch_sizes"),
        ("--prompt_len=0", "prompt_len"), ("--new_tokens=-1", "new_tokens"),
        ("--repeats=0", "repeats"), ("--dtype=int7", "dtype"), ("--model=nope", "model"),
        ("--hf_checkpoint=/no/such/dir", "hf_checkpoint"), ("--min_gain=inf", "min_gain"),
        ("--min_gain=0", "min_gain"), ("--copy_mib=0", "copy_mib"), ("--seed=-1", "seed"),
        ("--json_out={file}/x.json", "json_out")],
    "jaxrl_scale.cli.train_bench": [
        ("--batch=0", "batch"), ("--seq_len=1", "seq_len"), ("--prompt_len=80", "prompt_len"),
        ("--group_size=7", "group_size"), ("--micro_batches=3", "micro_batches"),
        ("--micro_batches=0", "micro_batches"), ("--repeats=0", "repeats"),
        ("--dtype=fp8", "dtype"), ("--model=nope", "model"), ("--matmul_n=0", "matmul_n")],
    "jaxrl_scale.cli.pack_bench": [
        ("--prompts=0", "prompts"), ("--group_size=1", "group_size"), ("--max_ops=0", "max_ops"),
        ("--token_budget=-1", "token_budget"), ("--token_budget=10", "token_budget"),
        ("--rounds=0", "rounds"), ("--model=nope", "model"), ("--json_out={file}/x.json", "json_out")],
    "jaxrl_scale.cli.rl_bench": [
        ("--prompts=0", "prompts"), ("--prompts=x", "prompts"), ("--group=1", "group"),
        ("--steps=2 --discard=2", "discard"), ("--rounds=0", "rounds"),
        ("--micro_batches=3", "micro_batches"), ("--lr=inf", "lr"), ("--lr=0", "lr"),
        ("--task=nope", "task"), ("--model=nope", "model"),
        ("--max_new_tokens=0", "max_new_tokens")],
    "jaxrl_scale.cli.rollout_bench": [
        ("--settings=nope", "settings"), ("--ratio=1", "ratio"), ("--rounds=0", "rounds"),
        ("--steps=2 --discard=2", "discard"), ("--group=1", "group"),
        ("--small_median=nan", "small_median"), ("--small_max_new=0", "small_max_new"),
        ("--init_checkpoint=/no/such/dir", "init_checkpoint"), ("--seed=-3", "seed")],
}


@pytest.mark.parametrize("module", sorted(BENCH_ROWS))
def test_bench_bad_inputs_one_line_each(tmp_path, module):
    """The benches check their flags like the commands: one line, exit 2, before any model."""
    (tmp_path / "a_file").write_text("")
    rows = BENCH_ROWS[module]
    results = _table(tmp_path, module, rows, file=tmp_path / "a_file")
    _check(results, rows)

@pytest.mark.parametrize("arg,field", [("--batch=6", "group_size"), ("--shapes=foo", "shapes"),
                                       ("--new_tokens=200", "new_tokens")])
def test_moe_bench_bad_flags_one_line(arg, field):
    """The MoE dispatch benchmark refuses bad flags in one line, exit 2, before compiling."""
    res = subprocess.run([sys.executable, "-m", "jaxrl_scale.cli.moe_bench", arg],
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, JAX_PLATFORMS="cpu"))
    lines = [l for l in res.stderr.splitlines() if l.strip()]
    assert res.returncode == 2, res.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}: "), lines
    assert ". Fix: " in lines[0]

# ------------------------------------------------------------------ data, tokenizer, checkpoint

_SMALL_DATA = ("--data_dir={data} --num_train_examples=64 --num_test_examples=16 "
               "--eval_prompts=8")


def _bad_inputs(tmp_path) -> dict:
    """{name: path} of the bad files the rows below point at: HF checkpoints (a truncated
    or corrupt safetensors file, a non-integer num_attention_heads) and tokenizer.json files
    of the wrong kind; plus a good checkpoint ('ck') and the data dir."""
    from test_faults import hf_variant, save_tiny_hf
    from test_tokenizer import _build_hf_tokenizer, _wrong_kinds
    ck = tmp_path / "ck"
    save_tiny_hf(ck)
    raw = (ck / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    flipped = bytearray(raw)
    flipped[raw.index(b'"shape"') + 2] ^= 0x20
    paths = {"ck": ck, "data": tmp_path / "data"}
    for name, weights in [("cut_header", raw[:8 + n // 2]), ("cut_data", raw[:-1000]),
                          ("flipped", bytes(flipped))]:
        paths[name] = hf_variant(ck, tmp_path / name, weights)
    for name, heads in [("heads_str", "8.5"), ("heads_word", "eight"), ("heads_float", 8.5)]:
        paths[name] = hf_variant(ck, tmp_path / name, num_attention_heads=heads)
    _build_hf_tokenizer(tmp_path / "tok_good")
    for name, (text, _) in _wrong_kinds(tmp_path / "tok_good").items():
        d = paths[f"tok_{name}"] = tmp_path / f"tok_{name}"
        d.mkdir()
        (d / "tokenizer.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    return paths


def test_train_data_tokenizer_and_checkpoint_problems_one_line_each(tmp_path):
    """What only the data, the tokenizer or the checkpoint's files show: one line naming the
    field, exit 2, in seconds: before the warm-start (rows with the built-in model) and
    before any weight is read."""
    paths = _bad_inputs(tmp_path)
    cases = {"max_prompt_len": (f"{_SMALL_DATA} --max_prompt_len=3", "max_prompt_len")}
    cases.update({k: (f"--hf_checkpoint={{{k}}}", "hf_checkpoint") for k in (
        "cut_header", "cut_data", "flipped", "heads_str", "heads_word", "heads_float")})
    cases.update({k: (f"{_SMALL_DATA} --tokenizer={{{k}}}", "tokenizer") for k in paths
                  if k.startswith("tok_") and k != "tok_good"})
    rows = list(cases.values())
    results = _table(tmp_path, "jaxrl_scale.cli.train", rows, **paths)
    _check(results, rows)
    line = {k: r["stderr"].strip() for k, r in zip(cases, results)}
    assert re.fullmatch(r"error: max_prompt_len: 3 is shorter than the longest prompt, (\d+) "
                        r"tokens \(train example \d+\)\. Fix: set --max_prompt_len >= \1 \(or "
                        r"0: the longest prompt\); the model context is 128 tokens\.",
                        line["max_prompt_len"]), line
    assert "model.safetensors is truncated or corrupt: the header length field says" in \
        line["cut_header"]
    assert "config.json num_attention_heads='eight' must be an integer >= 1" in \
        line["heads_word"]
    assert "tokenizer.json is not a usable tokenizer.json: it holds a JSON list" in \
        line["tok_list"]


def test_short_max_prompt_len_real_commands_one_line_before_the_model(tmp_path):
    """jaxrl-train (an HF checkpoint: no warm-start) and jaxrl-sft as a user runs them:
    exit 2, the one line names max_prompt_len and the longest prompt, no traceback, no
    crash file, nothing cached."""
    from test_faults import save_tiny_hf
    save_tiny_hf(tmp_path / "ck")
    small = _SMALL_DATA.format(data=tmp_path / "data").split()
    commands = {
        "train": ["jaxrl_scale.cli.train", f"--hf_checkpoint={tmp_path / 'ck'}",
                  "--tokenizer=char", f"--run_dir={tmp_path / 'run'}", "--max_steps=1"],
        "sft": ["jaxrl_scale.cli.sft", f"--cache_dir={tmp_path / 'sft'}"]}
    for name, cmd in commands.items():
        res = subprocess.run([sys.executable, "-m", *cmd, *small, "--max_prompt_len=3"],
                             capture_output=True, text=True, timeout=300, cwd=tmp_path,
                             env=dict(os.environ, JAX_PLATFORMS="cpu", TMPDIR=str(tmp_path)))
        lines = [l for l in res.stderr.splitlines() if l.strip()]
        assert res.returncode == 2 and len(lines) == 1, (name, res.stderr[-3000:])
        assert re.fullmatch(r"error: max_prompt_len: 3 is shorter than the longest prompt, "
                            r"(\d+) tokens \(train example \d+\)\. Fix: set --max_prompt_len "
                            r">= \1 \(or 0: the longest prompt\); the model context is "
                            r"(256|128) tokens\.", lines[0]), (name, lines)
    assert not list(tmp_path.glob("**/crash-*")) and not list(tmp_path.glob("**/params"))


# ------------------------------------------------------------------ run directory

_HOLDER = ("import sys, time; from jaxrl_scale.experiment.rundir import RunDirLock; "
           "RunDirLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(120)")


def test_train_unusable_run_dir_one_line_before_anything(tmp_path):
    """A run dir under a file, or one another process trains in: one line on run_dir, exit 2,
    in seconds (before the warm-start, data, model and compile); the holder's pid is named."""
    (tmp_path / "a_file").write_text("")
    locked = tmp_path / "locked"
    locked.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(locked)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        rows = [("--run_dir={file}/run", "run_dir"), ("--run_dir={locked}", "run_dir"),
                ("--run_dir={locked} --warmstart=false", "run_dir")]
        results = _table(tmp_path, "jaxrl_scale.cli.train", rows, file=tmp_path / "a_file",
                         locked=locked)
    finally:
        holder.kill()
        holder.wait()
    _check(results, rows)
    assert "cannot write in" in results[0]["stderr"]
    assert f"in use by another training (process {holder.pid} on " in results[1]["stderr"]
    assert not (tmp_path / "data").exists()


def test_sweep_unwritable_sweep_dir_one_line(tmp_path):
    (tmp_path / "a_file").write_text("")
    rows = [("--prompts=8,16 --base_prompts=16 --fixed_prompts= --sweep_dir={file}/sweep",
             "sweep_dir")]
    _check(_table(tmp_path, "jaxrl_scale.cli.sweep", rows, file=tmp_path / "a_file"), rows)


# ------------------------------------------------------------------ the top level

def _guarded_exit(main, capsys, **kw):
    from jaxrl_scale.cli import guarded
    with pytest.raises(SystemExit) as e:
        guarded(main, **kw)([])
    err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    return e.value.code, err


def test_unexpected_exception_is_one_line_and_a_traceback_file(tmp_path, capsys,
                                                               monkeypatch):
    import jaxrl_scale.cli as cli

    def buggy(argv):
        return {}["missing"]

    for error_dir in (None, str(tmp_path)):   # no run dir known yet: a temporary file
        monkeypatch.setattr(cli, "_error_dir", error_dir)
        code, err = _guarded_exit(buggy, capsys)
        assert code == 1 and len(err) == 1, err
        line = err[0]
        assert line.startswith("error: unexpected KeyError: 'missing' (full traceback in ")
        assert line.endswith("). This is a bug: please report it.")
        path = line.split("(full traceback in ")[1].split("). This is")[0]
        if error_dir:
            assert os.path.dirname(path) == error_dir
        text = open(path).read()
        assert "Traceback (most recent call last)" in text and "in buggy" in text
        os.remove(path)


def test_known_failures_keep_their_own_line_and_code(capsys):
    """Ctrl-C: exit 130 and how to resume; a full disk or damaged checkpoint: its own line
    (it says what to do), exit 1, no 'bug'; a bad input: exit 2 as before."""
    import errno
    from jaxrl_scale.checkpoint import CheckpointError
    from jaxrl_scale.cli import one_line_errors
    from jaxrl_scale.experiment.config import ConfigError
    from jaxrl_scale.interrupt import Interrupted

    def raising(exc):
        def main(argv):
            with one_line_errors():
                raise exc
        return main

    cases = [
        (KeyboardInterrupt(), 130, "interrupted. To resume, rerun the same command: "),
        (Interrupted("stopped after step 3 of r; checkpoint step 3 saved"), 130,
         "interrupted: stopped after step 3 of r; checkpoint step 3 saved. To resume, rerun"),
        (OSError(errno.ENOSPC, "Disk full while appending to m.jsonl. Fix: free space"), 1,
         "error: [Errno 28] Disk full while appending to m.jsonl. Fix: free space"),
        (CheckpointError("No checkpoint in d can be restored"), 1,
         "error: No checkpoint in d can be restored"),
        (ConfigError("seed", "must be >= 0", "pass 0 or more"), 2,
         "error: seed: must be >= 0. Fix: pass 0 or more."),
    ]
    for exc, want_code, start in cases:
        code, err = _guarded_exit(raising(exc), capsys)
        assert code == want_code and len(err) == 1 and err[0].startswith(start), (exc, err)
        assert "bug" not in err[0]


_EVERY_COMMAND = """
import sys
import {module} as m
def main(argv):
    raise RuntimeError("planted")
m.main = main
sys.argv = ["cmd"]
m.run()
"""


def _script_modules():
    import tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    return {name: target.split(":") for name, target in scripts.items()}


def test_every_command_runs_through_the_shared_top_level():
    """Each console script's entry function calls cli.run_main (hence `guarded`); the slow
    test below plants a bug in each and runs it."""
    import ast
    for name, (module, func) in _script_modules().items():
        path = os.path.join(ROOT, *module.split(".")) + ".py"
        tree = ast.parse(open(path).read())
        entry = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func]
        assert entry, (name, func)
        calls = [c.func.id for c in ast.walk(entry[0])
                 if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)]
        assert calls == ["run_main"], (name, calls)


@pytest.mark.slow
def test_every_command_reports_an_unexpected_exception_in_one_line(tmp_path):
    """Each console script's run() goes through the shared top level (a planted bug in its
    main: one line, exit 1, the traceback in a file)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", TMPDIR=str(tmp_path))
    procs = {name: subprocess.Popen(
        [sys.executable, "-c", _EVERY_COMMAND.format(module=module)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
        for name, (module, _) in _script_modules().items()}
    for name, p in procs.items():
        out, err = p.communicate(timeout=300)
        lines = [l for l in err.splitlines() if l.strip()]
        assert p.returncode == 1 and len(lines) == 1, (name, err[-2000:])
        assert lines[0].startswith("error: unexpected RuntimeError: planted (full traceback "
                                   f"in {tmp_path}"), (name, lines)
