"""Runs jaxrl_scale/cli/export.py (installed as `jaxrl-export`); --help lists its flags."""
import runpy

runpy.run_module("jaxrl_scale.cli.export", run_name="__main__", alter_sys=True)
