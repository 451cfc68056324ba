"""Runs jaxrl_scale/cli/rl_bench.py (installed as `jaxrl-rl-bench`); --help lists its flags."""
import runpy

runpy.run_module("jaxrl_scale.cli.rl_bench", run_name="__main__", alter_sys=True)
