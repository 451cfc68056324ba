"""Runs jaxrl_scale/cli/train_bench.py (installed as `jaxrl-train-bench`); --help lists its flags."""
import runpy

runpy.run_module("jaxrl_scale.cli.train_bench", run_name="__main__", alter_sys=True)
