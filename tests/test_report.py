"""Report (answer, tables, figures) and the experiments/analyze.py command on synthetic sweeps."""

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import zlib

import pytest

from jaxrl_scale import scaling
from jaxrl_scale import report
from jaxrl_scale.experiment.analyze import analyze_and_report
from jaxrl_scale.scaling import findings
from jaxrl_scale.scaling.synthetic import SyntheticRun, write_synthetic_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "experiments", "analyze.py")
N_BOOT = 300  # enough for stable 90% intervals on these sweeps, and fast


def curve(r_n=1.0, lo=0.1, amp=0.7, scale=2000.0, cap=None):
    """True score J(N) of a config that needs r_n x the reference's responses."""
    def j(n):
        v = lo + amp * (1 - math.exp(-n / r_n / scale))
        return min(v, cap) if cap is not None else v
    return j


def _add_train_s(run_dir, c, gamma, batch):
    """Log an update time t_train = c + gamma * B on every training record."""
    path = os.path.join(run_dir, "metrics.jsonl")
    recs = [json.loads(line) for line in open(path)]
    with open(path, "w") as f:
        for r in recs:
            if "time_s" in r:
                r["train_s"] = c + gamma * batch
            f.write(json.dumps(r) + "\n")


def _noisy(root, name, batch, q, j, *, seeds=(0, 1), budget=6000, lr_rule="sqrt", algo="grpo",
           group_size=None, eval_n=400, train_s=True):
    kw = {"base_batch": 32}
    if group_size is not None:
        kw["group_size"] = group_size
    steps = int(budget // batch)
    for s in seeds:
        d = write_synthetic_run(root, SyntheticRun(
            f"{name}_s{s}", batch, 0, q, curve=j, steps=steps,
                                eval_every=max(1, steps // 30), lr_rule=lr_rule, algo=algo,
                                seed=s, eval_n=eval_n,
                                noise_seed=zlib.crc32(f"{name}_{s}".encode()),
                                step_jitter=0.05, gen_s=(0.1, 1e-3), extra_config=kw))
        if train_s:
            _add_train_s(d, 0.01, 5e-3, batch)


@pytest.fixture(scope="module")
def noisy(tmp_path_factory):
    """GRPO (5 configs x 2 seeds) + PPO (2 configs), binomial eval noise (eval_n=400)."""
    root = str(tmp_path_factory.mktemp("noisy"))
    _noisy(root, "grpo_P4G8_sqrt", 32, 100, curve(), group_size=8)          # reference
    _noisy(root, "grpo_P8G4_sqrt", 32, 100, curve(), group_size=4)          # identical
    _noisy(root, "grpo_P8G8_sqrt", 64, 160, curve(), group_size=8)          # faster
    _noisy(root, "grpo_P16G8_sqrt", 128, 100, curve(1.7), group_size=8)     # r_N 1.7: slower
    _noisy(root, "grpo_P8G8_fixed", 64, 160, curve(2.0), group_size=8, lr_rule="fixed")
    _noisy(root, "ppo_P32_sqrt", 32, 100, curve(), algo="ppo", seeds=(0,))
    _noisy(root, "ppo_P64_sqrt", 64, 100, curve(1.5), algo="ppo", seeds=(0,))
    os.makedirs(os.path.join(root, "crashed"))
    s = analyze_and_report(root, "auto", n_boot=N_BOOT)
    return root, s, open(s["report_path"]).read()


def _line(md, start):
    hits = [ln for ln in md.splitlines() if ln.startswith(start)]
    assert hits, f"no line starting with {start!r}"
    return hits[0]


def test_report_answer_first_and_figures(noisy):
    root, s, md = noisy
    for f in report.FIGURES + (report.REPORT_FILE, "summary.json"):
        p = os.path.join(root, f)
        assert os.path.isfile(p) and os.path.getsize(p) > 1000 or f.endswith(".md"), f
    assert "Not drawn" not in md and "`crashed`: no metrics.jsonl" in md
    lines = md.splitlines()
    assert lines[0].startswith("# Sweep report") and lines[2] == "## Answer"
    assert md.index("## Answer") < md.index("| config |") < md.index("### Per run")
    # facts() are the Answer lines, in order, before the table
    answer = md[:md.index("## Configs")]
    facts = report.facts(s)
    main = [f for f in facts if not f.startswith("Source finding")]
    pos = [answer.index(f"- {f}\n") for f in main]
    # design lines (2 x regime, 2 x design power, 2 x warm-starts + drift) + 2 x (power +
    # 3 verdicts + best + ctb) + cgb
    assert pos == sorted(pos) and len(main) == 20, main
    assert main[0].startswith("Regime [grpo]: ") and main[1].startswith("Regime [ppo]: ")
    assert main[2].startswith("Power [grpo]: with ") and main[6].startswith("Throughput: ")
    assert main[4].startswith("Warm-starts [grpo]: every run started from one warm-start")
    assert "machine drift is not controlled" in main[6]
    finds = [f for f in facts if f.startswith("Source finding")]
    assert len(finds) == 11 and len(re.findall(r"^- \(\d\) .*: \*\*", answer, re.M)) == 11


def test_report_power_and_verdicts(noisy):
    _, s, md = noisy
    assert s["configs"]["grpo_P16G8_sqrt"]["verdict"] == "slower"
    power = _line(md, "- [grpo] Power (reference grpo_P4G8_sqrt):")
    assert "eval SE = " in power and "(eval_n)" in power and "auto: start + max(0.5" in power
    assert re.search(r"SE / \(J\* - start\) = [\d.]+ vs 1/6 = 0.167 .*: OK\.$", power)
    slower = _line(md, "- [grpo] Slower")
    assert re.search(r"grpo_P16G8_sqrt \(B=128, lr sqrt, G=8\): T/T0 = [\d.]+ \[[\d.]+, [\d.]+\]",
                     slower)
    same = _line(md, "- [grpo] Indistinguishable")
    assert "grpo_P8G4_sqrt" in same and "grpo_P16G8_sqrt" not in same
    fast = _line(md, "- [grpo] Faster")
    assert "grpo_P8G8_sqrt (B=64" in fast
    # per-algorithm verdicts: PPO against its own reference
    ppo = _line(md, "- [ppo] Slower")
    assert "ppo_P64_sqrt" in ppo and s["configs"]["ppo_P64_sqrt"]["reference"] == "ppo_P32_sqrt"
    best = s["algos"]["grpo"]["best_set"]
    best_line = _line(md, "- [grpo] Fastest")
    assert best[0] == "grpo_P8G8_sqrt"
    if len(best) == 1:
        assert "distinguishable from all others" in best_line
    else:
        assert "no single best" in best_line
    ctb = _line(md, "- [grpo] Critical training batch")
    assert "a sample cost is detected at B = 128" in ctb
    cgb = _line(md, "- Critical generation batch")
    assert re.search(r"d0 = 0.1 \[[\d.]+, [\d.]+\] s", cgb) and "beyond the measured grid" in cgb


def test_report_findings(noisy):
    """The findings are data in summary.json (decided in scaling/findings.py); the report
    renders each one."""
    _, s, md = noisy
    f = {(x["id"], x["algo"]): x for x in s["findings"]}
    assert {x["id"] for x in s["findings"]} == set(findings.IDS)
    assert all(x["status"] in findings.STATUSES and x["claim"] and x["test"]
               for x in s["findings"])
    assert f["fixed_lr_lags", "grpo"]["status"] == "reproduced"
    lag = f["fixed_lr_lags", "grpo"]["numbers"][0]
    assert lag["fixed_config"] == "grpo_P8G8_fixed" and lag["N_ratio_ci"][0] > 1
    assert f["grad_norm_slope", "grpo"]["status"] == "reproduced"
    assert f["sublinear_collection", None]["status"] == "reproduced"
    pg = f["equal_PG_alike", "grpo"]
    (pair,) = pg["numbers"]
    assert {pair["group_size_a"], pair["group_size_b"]} == {4, 8}
    lo, hi = pair["N_ratio_ci"]
    # equivalence: alike only when the ratio's own interval lies inside [0.8, 1.25]
    assert pg["status"] == ("reproduced" if 0.8 <= lo and hi <= 1.25 else
                            "not reproduced" if hi < 1 or lo > 1 else "undetermined")
    assert f["equal_PG_alike", "ppo"]["status"] == "undetermined"
    six = f["larger_batch_faster", "grpo"]
    assert six["status"] == "reproduced"
    assert [x["config"] for x in six["numbers"] if x["verdict"] == "faster"] == ["grpo_P8G8_sqrt"]
    assert all(x["batch"] > 32 for x in six["numbers"])
    assert f["larger_batch_faster", "ppo"]["status"] in ("not reproduced", "undetermined")
    tf = s["critical_generation_batch"]["train_fit"]
    # cap = (d0 + c + (d1 + gamma) B0) / ((d1 + gamma) B0) with B0 = 32
    assert tf["r_q_cap"] == pytest.approx(0.302 / 0.192, rel=0.05)
    # the update's share quoted is the regime line's measured one (the fitted share only when
    # the logs carry no per-step generation and update times)
    reg = s["algos"]["grpo"]["regime"]
    assert reg["regime"] != "unknown", reg
    share = reg["update_share"]
    assert f"the update takes {share:.0%} of a step at the reference batch" in six["detail"]
    # rendered: one line per finding, its status in bold
    for x in s["findings"]:
        assert f"**{x['status']}**" in md and x["detail"] in md


def test_report_tables_have_intervals(noisy):
    _, s, md = noisy
    table = report.format_table(s)
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]]
            for r in table.splitlines()[2:]}
    assert table.splitlines()[0].count("|") == table.splitlines()[1].count("|")
    slow = rows["grpo_P16G8_sqrt"]  # algo, seeds, B, lr, N*, q, r_N, r_q, T/T0, verdict, ...
    assert slow[0] == "grpo" and slow[1] == "2/2" and slow[3] == "sqrt" and slow[9] == "slower"
    ci = re.compile(r"^[\d.,]+ \[[\d.,]+, [\d.,]+\]$")
    assert all(ci.match(c) for c in slow[4:9]), slow
    lo, hi = (float(x) for x in re.findall(r"\[([\d.]+), ([\d.]+)\]", slow[6])[0])
    assert lo > 1.0 and lo < 1.5 < hi + 0.3
    assert rows["grpo_P4G8_sqrt (ref)"][9] == "reference"
    per_run = report.format_table(s, per_run=True)
    assert "| grpo_P16G8_sqrt_s1 | grpo | 1 | 128 | sqrt | yes |" in per_run


def test_reference_misses_target(tmp_path):
    _noisy(tmp_path, "grpo_P4_sqrt", 32, 100, curve(cap=0.3), seeds=(0,), train_s=False)
    _noisy(tmp_path, "grpo_P8_sqrt", 64, 100, curve(), seeds=(0,), train_s=False)
    s = analyze_and_report(str(tmp_path), 0.5, n_boot=100)
    md = open(s["report_path"]).read()
    first = md.split("## Answer", 1)[1].strip().splitlines()[0]
    assert first.startswith("- The reference grpo_P4_sqrt did NOT reach the target J* = 0.5: "
                            "its best smoothed score is ")
    assert "eval SEs of" in first and "No time-to-target verdict is possible" in first
    assert "Critical training batch: undetermined" in md
    assert "- Seeds that reached J* per config: grpo_P4_sqrt 0/1; grpo_P8_sqrt 1/1." in md
    assert "| grpo_P8_sqrt | 1/1 |" in md and "n/a (reference missed J*)" in md
    assert "Among the configs that reached J* on their own (no T/T0): Fastest: grpo_P8_sqrt" in md
    for f in report.FIGURES:
        assert os.path.isfile(tmp_path / f), f


def test_underpowered_when_eval_noise_is_large(tmp_path):
    _noisy(tmp_path, "grpo_P4_sqrt", 32, 100, curve(amp=0.3), eval_n=50, train_s=False)
    _noisy(tmp_path, "grpo_P8_sqrt", 64, 100, curve(amp=0.3), eval_n=50, train_s=False)
    s = scaling.analyze_sweep(str(tmp_path), "auto", n_boot=100)
    power = [f for f in report.facts(s) if f.startswith("Power (reference")][0]
    assert s["signal_to_noise"] < 6
    assert power.endswith("UNDERPOWERED: verdicts below may be noise.")


def test_report_lists_figures_without_data(tmp_path):
    write_synthetic_run(tmp_path, SyntheticRun("a_sqrt", 256, 5000, 10, grad_norm=None))
    write_synthetic_run(tmp_path, SyntheticRun("b_sqrt", 512, 5000, 12, grad_norm=None))
    s = scaling.analyze_sweep(str(tmp_path), 0.5, n_boot=50)
    md = open(report.render(s, str(tmp_path))).read()
    assert "grad_norm.png: fewer than 2 batches" in md
    assert not os.path.exists(tmp_path / "grad_norm.png")


def _sweep(root):
    """Noise-free linear curves: known N*, q (N* = n_star, q = q)."""
    write_synthetic_run(root, SyntheticRun("grpo_B512_sqrt_s0", 512, 10000, 10))
    write_synthetic_run(root, SyntheticRun("grpo_B512_sqrt_s1", 512, 11000, 10, seed=1))
    write_synthetic_run(root, SyntheticRun("grpo_B1024_sqrt_s0", 1024, 10000, 15))
    write_synthetic_run(root, SyntheticRun("grpo_B2048_sqrt_s0", 2048, 12000, 24))
    write_synthetic_run(root, SyntheticRun("grpo_B4096_sqrt_s0", 4096, 12000, 30, cap=0.4))
    write_synthetic_run(root, SyntheticRun("grpo_B1024_fixed_s0", 1024, 16000, 15, lr_rule="fixed"))
    # Second seeds, 1.1x the samples like the reference's: seed-paired family-wise tests
    for name, b, n, q, rule in (("grpo_B1024_sqrt", 1024, 10000, 15, "sqrt"),
                                ("grpo_B2048_sqrt", 2048, 12000, 24, "sqrt"),
                                ("grpo_B1024_fixed", 1024, 16000, 15, "fixed")):
        write_synthetic_run(root, SyntheticRun(f"{name}_s1", b, 1.1 * n, q, seed=1, lr_rule=rule))
    os.makedirs(os.path.join(root, "crashed"))
    return str(root)


def _run(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


def test_analyze_script(tmp_path):
    sw = _sweep(tmp_path / "sw")
    out = tmp_path / "out"
    res = _run(f"--sweep_dir={sw}", "--target=auto", "--reference=grpo_B512_sqrt",
               f"--out={out}", "--score_range=any")   # the linear curves pass 1 late
    assert res.returncode == 0, res.stderr
    assert "| grpo_B2048_sqrt |" in res.stdout and "skipped: crashed" in res.stderr
    assert "- Power (reference grpo_B512_sqrt): eval SE = " in res.stdout  # facts(): Answer
    s = json.load(open(out / "summary.json"))
    assert s["reference"] == "grpo_B512_sqrt" and s["target_rule"]["rule"].startswith("start")
    assert isinstance(s["best"], list) and s["best"] == s["best_set"]
    for x in s["runs"].values():
        assert {"N_star", "q", "r_N", "r_q", "T_over_T0", "reached"} <= set(x)
    assert s["runs"]["grpo_B4096_sqrt_s0"]["reached"] is False
    assert (out / "report.md").is_file() and (out / "time_to_target.png").is_file()


def _load_script():
    return importlib.import_module("jaxrl_scale.cli.analyze")


def test_analyze_main(tmp_path, capsys):
    mod = _load_script()  # main() in-process: one subprocess above is enough
    sw = _sweep(tmp_path / "sw")
    for args, msg in [((f"--sweep_dir={sw}", "--target=0.5"),   # linear curves pass 1
                       "error: score: "),
                      ((f"--sweep_dir={sw}", "--target=0.5", "--reference=nope",
                        "--score_range=any"), "available runs"),
                      ((f"--sweep_dir={sw}", "--target=abc"), "error: target: must be 'auto' or a number"),
                      ((f"--sweep_dir={tmp_path / 'missing'}", "--target=0.5"),
                       "does not exist")]:
        mod.FLAGS.unparse_flags()
        mod.FLAGS(["analyze.py", *args])
        try:
            code = mod.main([])
        except SystemExit as e:     # a bad flag: one line, exit 2, before any data
            code = e.code
        assert code == 2            # every analysis error: one line with a Fix, exit 2
        err = capsys.readouterr().err
        assert msg in err and ". Fix: " in err and len(err.strip().splitlines()) == 1
    mod.FLAGS.unparse_flags()
    mod.FLAGS(["analyze.py", f"--sweep_dir={sw}", "--target=0.5", "--score_range=any"])
    assert mod.main([]) == 0
    out = capsys.readouterr().out
    mod.FLAGS.unparse_flags()
    assert "grpo_B512_sqrt (ref)" in out
    s = json.load(open(os.path.join(sw, "summary.json")))
    assert s["target"] == 0.5 and s["best"] == ["grpo_B2048_sqrt"]
    assert s["runs"]["grpo_B2048_sqrt_s0"]["r_N"] == pytest.approx(12000 / 10500)
    assert s["configs"]["grpo_B2048_sqrt"]["verdict"] == "faster"
    assert s["configs"]["grpo_B4096_sqrt"]["verdict"] == "not reached"
    assert "Fastest: grpo_B2048_sqrt (B=2,048, lr sqrt" in out
    assert "distinguishable from all others" in out
    assert "Not reached: grpo_B4096_sqrt (B=4,096, lr sqrt): 0/1 seeds reached J*" in out


def test_analyze_and_report_csv_only(tmp_path):
    p = tmp_path / "ext.csv"
    rows = ["it,n,wall,acc"] + [f"{k},{k * 64},{k * 6.4},{0.05 * k}" for k in range(1, 16)]
    p.write_text("\n".join(rows) + "\n")
    s = analyze_and_report(None, 0.5, csv=[str(p)], n_boot=50,
                                  columns="step:it,responses:n,time_s:wall,score:acc")
    assert s["reference"] == "ext" and s["runs"]["ext"]["N_star"] == pytest.approx(640)
    assert s["runs"]["ext"]["q"] == pytest.approx(10)
    assert (tmp_path / "summary.json").is_file() and (tmp_path / "report.md").is_file()
    md = (tmp_path / "report.md").read_text()
    assert "Fastest: ext (B=64, T = 64 s, T/T0 = 1 [1, 1]), the only config that reached J*" in md
    assert "| ext (ref) | 1/1 | 64 |" in md


def test_report_imports_no_jax():
    """The report renders only: importing it (and the analysis entry) loads no JAX."""
    code = ("import sys, jaxrl_scale.report, jaxrl_scale.experiment.analyze; "
            "assert 'jax' not in sys.modules, sorted(m for m in sys.modules if 'jax' == m[:3])")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT,
                   env=dict(os.environ, PYTHONPATH=ROOT))


def test_larger_batch_finding_quotes_the_measured_update_share():
    """Finding (6) quotes the update's share of a step that the regime line measured (median
    over the reference's runs), not the line fit's gamma B0 / step, which can differ (a fitted
    intercept absorbs part of the update); the fit only when nothing was measured."""
    from jaxrl_scale.scaling.summary import AlgoSummary, ConfigStats
    larger = [("grpo_P32_G8_sqrt", ConfigStats.from_json({"r_q": 1.2, "r_q_ci": [1.1, 1.3]}))]
    fit = {"train_fit": {"update_share_at_reference": 0.56}}
    info = AlgoSummary.from_json({"regime": {"update_share": 0.67},
                                  "critical_generation_batch": fit})
    assert "the update takes 67% of a step" in findings._cap_text(larger, info)
    info = AlgoSummary.from_json({"regime": {"regime": "unknown"},
                                  "critical_generation_batch": fit})
    assert "the update takes 56% of a step" in findings._cap_text(larger, info)


def test_slower_on_lower_bounds_is_reported_as_a_bound(tmp_path):
    """A config none of whose runs reach the target within the budget, far slower than the
    reference: the family-wise test on lower bounds calls it slower, and the report gives
    T/T0 as a bound with the seeds that missed, not as a number it does not have."""
    import dataclasses
    import numpy as np
    from jaxrl_scale import report
    from jaxrl_scale.scaling import calibration as cal
    from jaxrl_scale.scaling.analysis import analyze_runs
    d = dataclasses.replace(cal.DEFAULT, configs=cal.DEFAULT.configs[:3], warm_starts=4,
                            seeds=2, timing_blocks=0, timing_max_blocks=0, max_responses=7168)
    runs = cal.simulate_runs(d, np.random.default_rng(1), r_N={"grpo_P32_G8_sqrt": 1.9})
    s = analyze_runs(runs, 0.255, n_boot=50)
    c = s["configs"]["grpo_P32_G8_sqrt"]
    assert (c["verdict"], c["seeds_reached"], c["T_over_T0"]) == ("slower", 0, None)
    assert "lower bounds" in c["test"]
    text = open(report.render(s, str(tmp_path), runs)).read()
    assert "grpo_P32_G8_sqrt (B=256, lr sqrt): T/T0 >= " in text
    assert "8 of 8 seeds did not reach J*" in text
    assert "Targets per warm-start (each from its own reference runs): w0 " in text
    # the fastest set is over the configs every run of which reached: it says so
    assert ("Among the 2 configs whose every run reached J* (grpo_P32_G8_sqrt left out"
            in text)
    # indistinguishable is not equality: each such config says whether TOST shows equivalence
    ind = next(l for l in text.splitlines() if "Indistinguishable from the reference" in l)
    alike = s["configs"]["grpo_P8_G8_sqrt"]["alike_T"]
    assert ("equivalent within [0.8, 1.25]" if alike else "not shown equivalent") in ind
