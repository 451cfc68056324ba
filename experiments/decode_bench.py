"""Runs jaxrl_scale/cli/decode_bench.py (installed as `jaxrl-decode-bench`); --help lists its flags."""
import runpy

runpy.run_module("jaxrl_scale.cli.decode_bench", run_name="__main__", alter_sys=True)
