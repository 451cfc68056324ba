"""Runs jaxrl_scale/cli/moe_bench.py (installed as `jaxrl-moe-bench`); --help lists its flags."""
import runpy

runpy.run_module("jaxrl_scale.cli.moe_bench", run_name="__main__", alter_sys=True)
