"""Runs jaxrl_scale/cli/device_check.py (installed as `jaxrl-device-check`); --help lists its flags."""
import runpy

runpy.run_module("jaxrl_scale.cli.device_check", run_name="__main__", alter_sys=True)
