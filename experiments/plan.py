"""Runs jaxrl_scale/cli/plan.py (installed as `jaxrl-plan`); --help lists its flags."""
import runpy

runpy.run_module("jaxrl_scale.cli.plan", run_name="__main__", alter_sys=True)
