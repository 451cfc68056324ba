"""Runs jaxrl_scale/cli/lora_bench.py; --help lists its flags."""
import runpy

runpy.run_module("jaxrl_scale.cli.lora_bench", run_name="__main__", alter_sys=True)
