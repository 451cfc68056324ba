"""Runs jaxrl_scale/cli/pack_bench.py (installed as `jaxrl-pack-bench`); --help lists its flags."""
import runpy

runpy.run_module("jaxrl_scale.cli.pack_bench", run_name="__main__", alter_sys=True)
