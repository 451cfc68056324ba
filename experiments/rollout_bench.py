"""Runs jaxrl_scale/cli/rollout_bench.py (installed as `jaxrl-rollout-bench`); --help lists its flags."""
import runpy

runpy.run_module("jaxrl_scale.cli.rollout_bench", run_name="__main__", alter_sys=True)
