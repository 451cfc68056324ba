"""Report (figures + report.md) and the experiments/analyze.py command on synthetic sweeps."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from jaxrl_scale import scaling
from jaxrl_scale.experiment import report
from jaxrl_scale.scaling.synthetic import write_synthetic_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "experiments", "analyze.py")


def _sweep(root):
    write_synthetic_run(root, "grpo_B512_sqrt_s0", 512, 10000, 10)
    write_synthetic_run(root, "grpo_B512_sqrt_s1", 512, 11000, 10, seed=1)
    write_synthetic_run(root, "grpo_B1024_sqrt_s0", 1024, 10000, 15)
    write_synthetic_run(root, "grpo_B2048_sqrt_s0", 2048, 12000, 24)
    write_synthetic_run(root, "grpo_B4096_sqrt_s0", 4096, 12000, 30, cap=0.4)
    write_synthetic_run(root, "grpo_B1024_fixed_s0", 1024, 16000, 15, lr_rule="fixed")
    os.makedirs(os.path.join(root, "crashed"))
    return str(root)


def test_write_report_all_figures(tmp_path):
    sw = _sweep(tmp_path)
    s = scaling.analyze_sweep(sw, 0.5, fit_sigmoid=True)
    path = report.write_report(sw, s)
    for f in report.FIGURES + (report.REPORT_FILE,):
        p = os.path.join(sw, f)
        assert os.path.isfile(p) and os.path.getsize(p) > 0, f
    md = open(path).read()
    assert "not reached" in md and "`crashed`: no metrics.jsonl" in md
    assert "±" in md  # seed mean ± std for grpo_B512_sqrt
    assert "grad-norm log-log slope over B=512...4,096 (lr rule sqrt) is -0.5" in md
    assert "Best config (max q/r_N among reached): grpo_B2048_sqrt" in md
    assert "Not drawn" not in md


def test_report_lists_figures_without_data(tmp_path):
    write_synthetic_run(tmp_path, "a_sqrt", 256, 5000, 10, grad_norm=None)
    write_synthetic_run(tmp_path, "b_sqrt", 512, 5000, 12, grad_norm=None)
    s = scaling.analyze_sweep(str(tmp_path), 0.5)
    md = open(report.write_report(str(tmp_path), s)).read()
    assert "grad_norm.png: fewer than 2 batches" in md
    assert not os.path.exists(tmp_path / "grad_norm.png")


def _run(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


def test_analyze_script(tmp_path):
    sw = _sweep(tmp_path / "sw")
    out = tmp_path / "out"
    res = _run(f"--sweep_dir={sw}", "--target=0.5", "--reference=grpo_B512_sqrt",
               f"--out={out}")
    assert res.returncode == 0, res.stderr
    assert "| grpo_B2048_sqrt |" in res.stdout and "skipped: crashed" in res.stderr
    s = json.load(open(out / "summary.json"))
    assert s["reference"] == "grpo_B512_sqrt" and s["target"] == 0.5
    assert s["best"] == "grpo_B2048_sqrt_s0"
    for x in s["runs"].values():
        assert {"N_star", "q", "r_N", "r_q", "T_over_T0", "reached"} <= set(x)
    assert s["runs"]["grpo_B4096_sqrt_s0"]["reached"] is False
    assert s["runs"]["grpo_B2048_sqrt_s0"]["r_N"] == pytest.approx(12000 / 10500)
    assert (out / "report.md").is_file() and (out / "time_to_target.png").is_file()



def _load_script():
    spec = importlib.util.spec_from_file_location("analyze_script", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_analyze_main_errors(tmp_path, capsys):
    mod = _load_script()  # main() in-process: one subprocess above is enough
    sw = _sweep(tmp_path / "sw")
    for args, msg in [((f"--sweep_dir={sw}", "--target=0.5", "--reference=nope"),
                       "available runs"),
                      ((f"--sweep_dir={sw}", "--target=abc"), "target must be a number"),
                      ((f"--sweep_dir={tmp_path / 'missing'}", "--target=0.5"),
                       "does not exist")]:
        mod.FLAGS.unparse_flags()
        mod.FLAGS(["analyze.py", *args])
        assert mod.main([]) == 1
        assert msg in capsys.readouterr().err
    mod.FLAGS.unparse_flags()
    mod.FLAGS(["analyze.py", f"--sweep_dir={sw}", "--target=0.5"])
    assert mod.main([]) == 0
    assert "grpo_B512_sqrt (ref)" in capsys.readouterr().out
    mod.FLAGS.unparse_flags()


def test_analyze_and_report_csv_only(tmp_path):
    p = tmp_path / "ext.csv"
    rows = ["it,n,wall,acc"] + [f"{k},{k * 64},{k * 6.4},{0.05 * k}" for k in range(1, 16)]
    p.write_text("\n".join(rows) + "\n")
    s = report.analyze_and_report(None, 0.5, csv=[str(p)],
                                  columns="step:it,responses:n,time_s:wall,score:acc")
    assert s["reference"] == "ext" and s["runs"]["ext"]["N_star"] == pytest.approx(640)
    assert s["runs"]["ext"]["q"] == pytest.approx(10)
    assert (tmp_path / "summary.json").is_file() and (tmp_path / "report.md").is_file()
