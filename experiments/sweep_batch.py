"""Runs jaxrl_scale/cli/sweep.py (installed as `jaxrl-sweep`); --help lists its flags."""
import runpy

runpy.run_module("jaxrl_scale.cli.sweep", run_name="__main__", alter_sys=True)
