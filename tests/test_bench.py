"""Benchmark plumbing: chip peak lookup, the TRL-side char tokenizer, rl_bench's flag checks."""
import os
import subprocess
import sys

import pytest

from jaxrl_scale import bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("kind,name", [("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100"),
                                       ("TPU v5 lite", "TPU v5e"), ("TPU v5p", "TPU v5p"),
                                       ("TPU v6 lite", "TPU v6e"), ("NVIDIA A100-SXM4-80GB",
                                                                    "A100")])
def test_chip_peaks_by_device_kind(kind, name):
    got, peaks = bench.chip_peaks(kind)
    assert got == name and peaks["flops"]["bfloat16"] > 1e14 and peaks["hbm_bytes_per_s"] > 5e11
    assert bench.chip_peaks("cpu") is None


def test_trl_char_tokenizer_matches_ours():
    pytest.importorskip("transformers")
    from jaxrl_scale.cli import rl_bench
    hf, ours = rl_bench._char_tokenizer(128)
    for text in ["12+34=", "99-7=", "a b\nc", "(3*4)/5 = 2.4"]:
        ids = hf(text)["input_ids"]
        assert ids == ours.encode(text)
        assert hf.decode(ids + [ours.eos_id], skip_special_tokens=True) == text
    assert hf.pad_token_id == ours.pad_id and hf.eos_token_id == ours.eos_id
    assert len(hf) == 128  # every model logit decodes


def test_rl_bench_compare_trl_without_trl_names_the_fix(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "rl_bench.py"),
                        "--compare_trl", f"--trl_python={fake}"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0
    assert "pip install -e '.[bench]'" in p.stderr + p.stdout


def test_rl_bench_runs_and_splits_the_step(tmp_path):
    """The jaxrl_scale side end to end on a tiny model: every round has its split, and the
    parts (rollout, update, host) add up to the step."""
    out = tmp_path / "rl.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "rl_bench.py"),
                        "--model=tiny", "--prompts=4", "--group=2", "--steps=3", "--discard=1",
                        "--rounds=1", "--noevery_row", f"--data_dir={tmp_path / 'data'}",
                        f"--json_out={out}"],
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == 0, p.stderr[-2000:]
    import json
    res = json.load(open(out))["results"][0]
    (r,) = res["rounds"]["jaxrl_scale"]
    assert res["P"] == 4 and res["rounds"]["trl"] == [] == res["rounds"]["jaxrl_scale_every_row"]
    assert r["tokens_per_row"] > 0
    assert r["responses_per_s"] > 0 and min(r["rollout_s"], r["update_s"], r["host_s"]) > 0
    assert r["rollout_s"] + r["update_s"] + r["host_s"] <= 1.5 * r["step_s"]
    assert "jaxrl_scale" in p.stdout and "host %" in p.stdout
