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
                m.main([])
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


@pytest.mark.parametrize("command, flag, field", [
    ("jaxrl-train", "--gamma=1.5", "gamma"), ("jaxrl-sweep", "--prompts=0", "prompts")])
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
