"""Runs jaxrl_scale/cli/workload_bench.py (installed as `jaxrl-workload-bench`); --help lists its flags."""
import runpy

runpy.run_module("jaxrl_scale.cli.workload_bench", run_name="__main__", alter_sys=True)
