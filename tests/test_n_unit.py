"""N counts responses or tokens, whichever is declared (--n_unit): the training loop records
cumulative `response_tokens` (the retained responses' loss tokens; an episode's observation
tokens excluded) beside `responses`, and the analysis reads it as N under --n_unit=tokens."""
import json
import math
import os
import subprocess
import sys
import zlib

import pytest

from jaxrl_scale.scaling import io as sio
from jaxrl_scale.scaling import units
from jaxrl_scale.scaling.synthetic import SyntheticRun, write_synthetic_run

C = 4.0   # tokens per response in the synthetic study: a power of two, so c * N is exact


def _curve(n, cost=1.0):
    return 0.3 + 0.3 * (1 - math.exp(-n / cost / 6000))


def _study(root, tokens_per_response=C, drop_tokens_in=None):
    """Three configs x two seeds with a known sample cost at B=256; every record gets
    response_tokens = c * responses (none in the run `drop_tokens_in`)."""
    for name, batch, cost, budget in (("grpo_B32_sqrt", 32, 1.0, 16384),
                                      ("grpo_B64_sqrt", 64, 1.0, 16384),
                                      ("grpo_B256_sqrt", 256, 1.5, 24576)):
        for s in range(2):
            d = write_synthetic_run(root, SyntheticRun(
                f"{name}_s{s}", batch, 1, 300.0, curve=lambda n, c=cost: _curve(n, c),
                eval_n=4000, noise_seed=zlib.crc32(f"{name}/{s}".encode()),
                steps=budget // batch, eval_every=max(1, 1024 // batch), step_jitter=0.1,
                seed=s, gen_s=(0.01, 1e-4),
                extra_config={"base_batch": 32, "max_grad_norm": 1.0}))
            if f"{name}_s{s}" == drop_tokens_in:
                continue
            path = os.path.join(d, sio.METRICS_FILE)
            with open(path) as f:
                recs = [json.loads(line) for line in f]
            with open(path, "w") as f:
                for r in recs:
                    f.write(json.dumps({**r, "response_tokens": tokens_per_response *
                                        r["responses"]}) + "\n")
    return str(root)


def _analyze(sweep, n_unit, out):
    from jaxrl_scale.experiment.analyze import analyze_and_report
    return analyze_and_report(sweep, "auto", out=str(out), n_boot=100, n_unit=n_unit)


def test_tokens_scale_n_star_and_keep_every_verdict(tmp_path):
    """(a) response_tokens = c * responses on every record: under --n_unit=tokens each N* (run
    and config, with its interval) and q are exactly c times those under responses, r_N, T/T0
    and every verdict and finding are the same; summary.json and report.md declare the unit."""
    sweep = _study(tmp_path / "sweep")
    a = _analyze(sweep, "responses", tmp_path / "resp")
    b = _analyze(sweep, "tokens", tmp_path / "tok")
    assert a["n_unit"] == "responses" and b["n_unit"] == "tokens"
    with open(tmp_path / "tok" / "summary.json") as f:
        assert json.load(f)["n_unit"] == "tokens"
    assert set(a["runs"]) == set(b["runs"]) and len(a["runs"]) == 6
    for level in ("runs", "configs"):
        for name, x in a[level].items():
            y = b[level][name]
            assert x["N_star"] is not None and y["N_star"] == C * x["N_star"], (name, x, y)
            assert y["q"] == pytest.approx(C * x["q"], rel=1e-12)
            assert y.get("T_over_T0") == pytest.approx(x.get("T_over_T0"), rel=1e-12)
            if level == "configs":
                assert y["N_star_ci"] == [C * v for v in x["N_star_ci"]]
                assert y["verdict"] == x["verdict"] and y["r_N"] == pytest.approx(x["r_N"])
    assert a["configs"]["grpo_B256_sqrt"]["verdict"] == "slower"   # the study decides something
    assert a["best_set"] == b["best_set"]
    assert [(f["id"], f["status"]) for f in a["findings"]] == \
        [(f["id"], f["status"]) for f in b["findings"]]
    with open(tmp_path / "tok" / "report.md") as f:
        tok = f.read()
    with open(tmp_path / "resp" / "report.md") as f:
        resp = f.read()
    assert "N counts tokens (--n_unit=tokens)" in tok and "q (tok/s)" in tok
    assert "N counts responses (--n_unit=responses)" in resp and "q (resp/s)" in resp


def test_responses_is_todays_analysis(tmp_path):
    """The default reads the runs as they are: --n_unit=responses gives the numbers of an
    analysis that never heard of n_unit."""
    from jaxrl_scale import scaling
    sweep = _study(tmp_path / "sweep")
    plain = scaling.analyze_sweep(sweep, n_boot=50)
    declared = scaling.analyze_sweep(sweep, n_boot=50, n_unit="responses")
    assert plain == declared and plain["n_unit"] == "responses"


def test_a_run_without_response_tokens_is_one_line_naming_the_flag(tmp_path):
    """(b) One run lacks response_tokens (another framework's log, an older run): one line,
    exit 2, naming --n_unit and the fix, before any analysis; in Python a ConfigError."""
    from jaxrl_scale.experiment.errors import ConfigError
    sweep = _study(tmp_path / "sweep", drop_tokens_in="grpo_B64_sqrt_s1")
    runs = sio.read_sweep(sweep).runs
    with pytest.raises(ConfigError, match="^n_unit: .*grpo_B64_sqrt_s1.*Fix: pass "
                                          "--n_unit=responses"):
        units.in_n_unit(runs, "tokens")
    assert units.in_n_unit(runs, "responses") == runs   # the default needs no such field
    res = subprocess.run([sys.executable, "-m", "jaxrl_scale.cli.analyze",
                          f"--sweep_dir={sweep}", "--n_unit=tokens",
                          f"--out={tmp_path / 'out'}"],
                         capture_output=True, text=True, timeout=300)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith("error: n_unit: ") and "response_tokens" in lines[0]
    assert "Fix: pass --n_unit=responses" in lines[0] and "Traceback" not in res.stderr
    assert not (tmp_path / "out" / "summary.json").exists()


def test_bad_tokens_are_refused():
    """A decreasing or negative response_tokens is no cumulative count."""
    from jaxrl_scale.experiment.errors import ConfigError
    recs = [{"step": s, "responses": 8 * s, "time_s": 1.0 * s, "response_tokens": t}
            for s, t in ((1, 40), (2, 30))]
    run = sio.make_run("r", recs, {"batch_train": 8})
    with pytest.raises(ConfigError, match="less than 40"):
        units.in_n_unit([run], "tokens")
    with pytest.raises(ConfigError, match="^n_unit: must be one of"):
        units.in_n_unit([run], "bytes")


# ----------------------------------------------------------------------------- training


def _records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _check_counts(recs):
    """response_tokens on every record, starting at 0, non-decreasing, each training step
    adding its retained_tokens; the eval record of a step repeats that step's count."""
    assert recs[0]["step"] == 0 and recs[0]["response_tokens"] == 0
    last = 0
    for r in recs[1:]:
        if "score" in r:
            assert r["response_tokens"] == last
            continue
        assert r["response_tokens"] == last + r["retained_tokens"]
        last = r["response_tokens"]
    assert last > 0
    return [r for r in recs if "score" not in r and r["step"] > 0]


def test_training_records_response_tokens_through_a_resume(tmp_path):
    """(c) A tiny run: every step's retained_tokens is the sum of its responses' lengths (no
    filter: every response is retained, all its tokens in the loss), response_tokens adds them
    up, and a resume from the step-2 checkpoint carries on from the restored count."""
    from jaxrl_scale.experiment.config import TrainConfig
    from jaxrl_scale.experiment.train import run_training
    cfg = TrainConfig.make(run_dir=str(tmp_path / "run"), data_dir=str(tmp_path / "data"),
                           model="tiny", num_train_examples=64, num_test_examples=8,
                           prompts_per_step=4, group_size=4, max_new_tokens=4, eval_every=2,
                           eval_prompts=4, eval_samples=2, checkpoint_every=2, max_steps=4,
                           base_lr=1e-3, base_batch=16)
    first = run_training(cfg, progress=False, stop_after_steps=2)
    assert not first["finished"] and first["response_tokens"] > 0
    out = run_training(cfg, progress=False)
    assert out["finished"]
    train = _check_counts(_records(cfg.run_dir))
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    for r in train:   # the mean length of the 16 responses, all retained: their sum
        assert r["retained"] == r["generated"] == 16
        assert r["retained_tokens"] == round(r["response_len"] * r["generated"])
    assert out["response_tokens"] == train[-1]["response_tokens"]
    with open(os.path.join(cfg.run_dir, "DONE.json")) as f:
        assert json.load(f)["response_tokens"] == out["response_tokens"]


@pytest.mark.slow   # about a minute like tests/test_env.py's env run (-m slow)
def test_env_run_counts_assistant_tokens_only(tmp_path):
    """(c) A multi-turn --env run: response_tokens counts the episodes' assistant tokens only,
    fewer than all their tokens (the observations' are in response_len, not in the loss)."""
    from jaxrl_scale.experiment.config import TrainConfig
    from jaxrl_scale.experiment.train import run_training
    cfg = TrainConfig.make(run_dir=str(tmp_path / "run"), data_dir=str(tmp_path / "data"),
                           model="tiny", num_train_examples=16, num_test_examples=4,
                           prompts_per_step=4, group_size=2, max_new_tokens=40, eval_every=5,
                           eval_prompts=4, eval_samples=2, max_steps=2, base_batch=8,
                           env="jaxrl_scale.data.envs:retry", env_max_turns=3,
                           env_max_obs_tokens=16, env_timeout_s=30.0)
    assert run_training(cfg, progress=False)["finished"]
    train = _check_counts(_records(cfg.run_dir))
    totals, observed = 0, 0
    for r in train:   # every episode retained (no filter): all of its assistant tokens
        total = round(r["response_len"] * r["generated"])   # assistant + observation tokens
        obs = round(r["env_obs_tokens"] * r["generated"])
        assert r["retained_tokens"] == total - obs, r
        totals, observed = totals + total, observed + obs
    assert observed > 0 and train[-1]["response_tokens"] == totals - observed < totals


def test_sweep_declares_n_unit_for_its_analysis():
    """jaxrl-sweep --n_unit=tokens sets SweepConfig.n_unit (which run_sweep passes to its
    analysis); a unit that is none of the two is refused by the study's field check."""
    import dataclasses

    from jaxrl_scale.experiment.errors import ConfigError
    from jaxrl_scale.experiment.study import SweepConfig, check_sweep_fields
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import sys, dataclasses, json; "
            "from jaxrl_scale.cli import sweep as m; m.FLAGS(['jaxrl-sweep', *sys.argv[1:]]); "
            "print(json.dumps(dataclasses.asdict(m.sweep_from_flags())))")
    res = subprocess.run([sys.executable, "-c", code, "--n_unit=tokens"], capture_output=True,
                         text=True, cwd=root, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1])["n_unit"] == "tokens"
    assert SweepConfig().n_unit == "responses"
    check_sweep_fields(dataclasses.replace(SweepConfig(), n_unit="tokens"))
    with pytest.raises(ConfigError, match="^n_unit: "):
        check_sweep_fields(dataclasses.replace(SweepConfig(), n_unit="bytes"))
