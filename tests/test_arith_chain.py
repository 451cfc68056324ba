"""The arith_chain task: generator (length tail, correct work), reward, builder, SFT format,
the per-task response cap, and a tiny training run."""
import dataclasses
import random

import numpy as np
import pytest

from jaxrl_scale.data import load_task, reward_for_task
from jaxrl_scale.data.rewards import chain_final_answer
from jaxrl_scale.data.tasks import ArithChainSpec, arith_chain_problem, arith_chain_steps
from jaxrl_scale.experiment.config import DEFAULT_TASK_KWARGS, TrainConfig, task_max_new_tokens


def _sample(spec, n, seed=0):
    rng = random.Random(seed)
    return [arith_chain_problem(rng, spec) for _ in range(n)]


def _py_eval(expr: str) -> int:
    """An independent evaluator: Python's own, on text of digits and + - * only."""
    assert set(expr) <= set("0123456789+-*"), expr
    return eval(expr, {"__builtins__": {}}, {})   # noqa: S307 - checked above


def test_ops_count_follows_the_skewed_weights():
    spec = ArithChainSpec()
    rows = _sample(spec, 6000)
    counts = np.bincount([r["num_ops"] for r in rows], minlength=spec.max_ops + 1)[1:]
    freq = counts / counts.sum()
    w = np.array(spec.ops_weights())
    # 4 binomial SEs at n = 6000: a wrong decay (e.g. uniform k) is far outside this
    assert np.all(np.abs(freq - w) < 4 * np.sqrt(w * (1 - w) / len(rows)))
    assert np.all(np.diff(w) < 0) and abs(w.sum() - 1) < 1e-12


def test_response_lengths_are_long_tailed_and_bounded():
    spec = ArithChainSpec()
    lengths = np.array([len(r["solution"]) for r in _sample(spec, 6000)])
    q50, q90, q99 = np.quantile(lengths, [0.5, 0.9, 0.99])
    # Tens of characters at the top, a right tail: the mean above the median, and the 99th
    # percentile several medians long (the decode of a batch waits for its longest row).
    assert 5 <= q50 <= 15 and q90 >= 3 * q50 and q99 >= 5 * q50 and q99 >= 50
    assert lengths.mean() > 1.5 * q50
    assert lengths.max() <= spec.max_response_chars()
    # The cap the flags give the task covers the longest possible response plus EOS.
    assert task_max_new_tokens("arith_chain", DEFAULT_TASK_KWARGS) == spec.max_response_chars() + 1
    # The bound is tight enough to be a cap, not a guess: within a few characters of the
    # longest response of the longest chains.
    longest = max(len(r["solution"]) for r in _sample(dataclasses.replace(spec, min_ops=6), 3000))
    assert spec.max_response_chars() - longest <= 6


@pytest.mark.parametrize("ops", ["+-", "+-*", "*"])
def test_every_answer_and_every_step_is_correct(ops):
    spec = ArithChainSpec(ops=ops, digits=2 if ops != "*" else 1)
    for r in _sample(spec, 1500, seed=1):
        expr = r["prompt"][:-1]
        assert r["prompt"].endswith("=") and "=" not in expr
        truth = _py_eval(expr)
        assert int(r["answer"]) == truth
        steps = r["solution"].split("=")
        assert len(steps) == r["num_ops"] and steps[-1] == r["answer"]
        # Each shown step is an expression with the same value and one operation fewer.
        for i, s in enumerate(steps):
            body = s[1:] if s.startswith("-") else s      # a leading minus: a negative value
            assert sum(body.count(c) for c in "+-*") == r["num_ops"] - 1 - i
            assert eval(s, {"__builtins__": {}}, {}) == truth, (r, s)   # noqa: S307
        assert len(r["solution"]) <= spec.max_response_chars()


def test_steps_follow_precedence_then_left_to_right():
    assert arith_chain_steps([12, 7, 5], ["+", "-"]) == ["19-5", "14"]
    assert arith_chain_steps([3, 50, 7], ["-", "+"]) == ["-47+7", "-40"]
    assert arith_chain_steps([2, 3, 4], ["+", "*"]) == ["2+12", "14"]
    assert arith_chain_steps([9], []) == []


def test_reward_reads_the_final_number():
    ex = {"prompt": "12+7-5=", "answer": "14"}
    assert chain_final_answer("19-5=14", ex) == 1.0
    assert chain_final_answer("14", ex) == 1.0                    # no work shown: still correct
    assert chain_final_answer(" 19-5 = 14 <eos>junk", ex) == 1.0
    assert chain_final_answer("19-5=14\n=99", ex) == 1.0          # only the first line counts
    assert chain_final_answer("19-5=15", ex) == 0.0
    assert chain_final_answer("19-5=", ex) == 0.0
    assert chain_final_answer("19-5=14=3", ex) == 0.0             # the last "=" decides
    assert chain_final_answer("", ex) == 0.0
    assert chain_final_answer("19-5=-14", ex) == 0.0
    assert chain_final_answer("-47+7=-40", {"answer": "-40"}) == 1.0
    r = reward_for_task("arith_chain")
    assert r.fn is chain_final_answer
    np.testing.assert_array_equal(r.score_batch(["19-5=14", "1"], [ex, ex]), [1, 0])


def test_builder_round_trips_and_holds_out(tmp_path):
    kw = dict(num_examples=300, max_ops=4)
    a = load_task("arith_chain", "train", data_dir=tmp_path / "a", seed=2, **kw)
    b = load_task("arith_chain", "train", data_dir=tmp_path / "b", seed=2, **kw)
    rows = [a[i] for i in range(len(a))]
    assert rows == [b[i] for i in range(len(b))] and len(rows) == 300
    assert [r["id"] for r in rows] == list(range(300))
    assert "max_ops-4" in a.config.name and "ops_decay-0p7" in a.config.name
    for r in rows:
        assert set(r) >= {"prompt", "answer", "solution", "num_ops", "id"}
        assert 1 <= r["num_ops"] <= 4 and isinstance(r["num_ops"], int)
        assert int(r["answer"]) == _py_eval(r["prompt"][:-1])
        assert chain_final_answer(r["solution"], r) == 1.0     # the SFT target earns reward 1
    test = load_task("arith_chain", "test", data_dir=tmp_path / "a", seed=2, max_ops=4,
                     num_examples=40)
    assert {r["prompt"] for r in rows}.isdisjoint(test[i]["prompt"] for i in range(len(test)))
    with pytest.raises(ValueError, match="min_ops"):
        load_task("arith_chain", "train", data_dir=tmp_path, min_ops=3, max_ops=2,
                  num_examples=5)
    with pytest.raises(ValueError, match="ops_decay"):
        load_task("arith_chain", "train", data_dir=tmp_path, ops_decay=0.0, num_examples=5)


def test_sft_data_fits_the_cap_and_the_cache_is_keyed_by_task(tmp_path):
    from jaxrl_scale.experiment.batching import pack_texts
    from jaxrl_scale.experiment.sft import sft_config_for, sft_path
    from jaxrl_scale.models.tokenizer import CharTokenizer
    tok = CharTokenizer()
    spec = ArithChainSpec(min_ops=6)
    rows = _sample(spec, 64, seed=3)
    cap = task_max_new_tokens("arith_chain", DEFAULT_TASK_KWARGS)
    batch = pack_texts(tok, [r["prompt"] for r in rows], [r["solution"] for r in rows],
                       prompt_len=24, max_new_tokens=cap)
    resp = np.asarray(batch["response_BT"])
    tokens = np.asarray(batch["tokens_BT"])
    for i, r in enumerate(rows):       # the whole solution and its EOS are learned, in order
        ids = tokens[i][resp[i].astype(bool)].tolist()
        assert ids == tok.encode(r["solution"]) + [tok.eos_id]
    with pytest.raises(ValueError, match="max_new_tokens"):   # the old cap would not fit
        pack_texts(tok, [rows[0]["prompt"]], [rows[0]["solution"]], prompt_len=24,
                   max_new_tokens=TrainConfig().max_new_tokens)
    old = TrainConfig.make(run_dir=str(tmp_path))
    new = old.replace(task="arith_chain", max_new_tokens=cap)
    a, b = sft_config_for(old), sft_config_for(new)
    assert a.key() != b.key() and sft_path(a) != sft_path(b)
    assert b.max_new_tokens == cap and b.task == "arith_chain"


def test_response_cap_only_for_the_chain_task():
    assert task_max_new_tokens("arithmetic", DEFAULT_TASK_KWARGS) is None
    assert task_max_new_tokens("arith_chain", {"max_ops": 2}) == \
        ArithChainSpec(max_ops=2).max_response_chars() + 1
    assert task_max_new_tokens("arith_chain", {"max_ops": 0}) is None   # validation reports it


@pytest.mark.slow   # a compile of the tiny model: 5 min on the shared 2-core machine
def test_tiny_training_run_on_the_chain_task(tmp_path):
    from jaxrl_scale.experiment.train import run_training
    cfg = TrainConfig.make(run_dir=str(tmp_path / "run"), data_dir=str(tmp_path / "data"),
                           task="arith_chain", task_kwargs={"max_ops": 2}, model="tiny",
                           max_new_tokens=task_max_new_tokens("arith_chain", {"max_ops": 2}),
                           num_train_examples=64, num_test_examples=8, prompts_per_step=4,
                           group_size=2, max_steps=2, eval_every=2, eval_prompts=4,
                           eval_samples=2, checkpoint_every=2, base_batch=8,
                           tensorboard=False)
    out = run_training(cfg, progress=False)
    assert out["step"] == 2 and out["responses"] == 16


_FLAGS_CHILD = """
import json, sys
from absl import flags
import jaxrl_scale.cli.sweep as m
from jaxrl_scale.cli import flagdefs
from jaxrl_scale.experiment.config import TrainConfig
for argv in json.loads(sys.argv[1]):
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["cmd", *argv])
    cfg = flagdefs.build_from_flags(TrainConfig, skip=m._PER_RUN)
    print(cfg.task, cfg.max_new_tokens)
"""


def test_one_flag_switches_the_main_job_to_the_chain_task():
    """The sweep's flags: --task=arith_chain alone brings the task's response cap."""
    import json
    import subprocess
    import sys
    cases = [
        ([], "arithmetic 6"),
        (["--task=arith_chain"], f"arith_chain {ArithChainSpec().max_response_chars() + 1}"),
        (["--task=arith_chain", '--task_kwargs={"max_ops": 3}'],
         f"arith_chain {ArithChainSpec(max_ops=3).max_response_chars() + 1}"),
        (["--task=arith_chain", "--max_new_tokens=20"], "arith_chain 20"),   # the flag wins
    ]
    res = subprocess.run([sys.executable, "-c", _FLAGS_CHILD, json.dumps([a for a, _ in cases])],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-len(cases):] == [w for _, w in cases]


_BENCH_CHILD = """
import contextlib, io, json, sys
from absl import flags
import jaxrl_scale.cli.workload_bench as m
m.sft_warmstart = None     # a good config must not get this far in this test
for argv in json.loads(sys.argv[1]):
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["cmd", *argv])
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            code = m.main([])
    except SystemExit as e:
        code = e.code
    print(json.dumps([code, err.getvalue().strip().splitlines()]))
"""


def test_workload_bench_bad_inputs_one_line_each():
    import json
    import subprocess
    import sys
    rows = [(["--tasks=arithmetic,nope"], "tasks"), (["--tasks=math_jsonl"], "tasks"),
            (["--sft_max_steps=arith_chain:0"], "sft_max_steps"),
            (["--sft_max_steps=countdown:5"], "sft_max_steps"), (["--steps=0"], "steps")]
    res = subprocess.run([sys.executable, "-c", _BENCH_CHILD, json.dumps([a for a, _ in rows])],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    got = [json.loads(line) for line in res.stdout.strip().splitlines()[-len(rows):]]
    for (argv, field), (code, err) in zip(rows, got):
        assert code == 2 and len(err) == 1, (argv, code, err)
        assert err[0].startswith(f"error: {field}: ") and "Fix: " in err[0], (argv, err)
