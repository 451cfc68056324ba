"""Runs jaxrl_scale/cli/analyze.py (installed as `jaxrl-analyze`); --help lists its flags."""
import runpy

runpy.run_module("jaxrl_scale.cli.analyze", run_name="__main__", alter_sys=True)
