"""Runs jaxrl_scale/cli/train.py (installed as `jaxrl-train`); --help lists its flags."""
import runpy

runpy.run_module("jaxrl_scale.cli.train", run_name="__main__", alter_sys=True)
