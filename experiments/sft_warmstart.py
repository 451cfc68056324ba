"""Runs jaxrl_scale/cli/sft.py (installed as `jaxrl-sft`); --help lists its flags."""
import runpy

runpy.run_module("jaxrl_scale.cli.sft", run_name="__main__", alter_sys=True)
