"""Two processes equal one: a run over two JAX processes on loopback (4 fake CPU devices each,
jax.distributed with a 127.0.0.1 coordinator, gloo collectives), killed after its step-2
checkpoint and resumed in two processes (which find each other through a fake SLURM
environment, as `--distributed_auto` does on a cluster), gives the metrics and, after its 4
GRPO steps, the params of the same run in one process with 8 devices.

The run is test_faults' (test_train's tiny config with a reward the random model earns
unevenly, so every update moves the params; evals at steps 0, 2, 4; checkpoints at 2 and 4),
and its one-process reference run is test_faults' session fixture. What may differ: the order
in which a cross-process all-reduce sums (gloo vs XLA's in-process one), so floats are
compared to a tolerance, params to 1e-3 of the update (the multi-host acceptance bar).
"""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

from test_faults import (  # noqa: F401 -- env: the session's one-process reference run
    EXPECTED_ORDER, TESTS, _final_state, _finished_steps, _order, env)

PROCESSES = 2
CHILD_TIMEOUT_S = 300
TIME_KEYS_SUFFIX = "_s"

_CHILD = """
import json, sys
spec = json.loads(sys.argv[1])
sys.path.insert(0, spec["tests"])
import jax
jax.config.update("jax_default_matmul_precision", "highest")   # as conftest sets it
jax.config.update("jax_compilation_cache_dir", spec["cache"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
from jaxrl_scale import distributed
if spec["auto"]:      # the cluster's environment (here a fake SLURM job step) says who is who
    distributed.initialize(auto=True)
else:
    distributed.initialize(spec["address"], spec["processes"], spec["pid"])
if spec["selftest"]:
    import test_multihost
    test_multihost.selftest(spec["selftest"])
import test_faults as tf
tf.digit_reward()
if spec["point"]:
    tf.install_fault(spec["point"], spec["n"])
from jaxrl_scale.experiment.train import run_training
run_training(tf.fault_cfg(spec["run_dir"], spec["data_dir"]), progress=False)
"""


def _free_port(candidates=(0,)) -> int:
    """A port on 127.0.0.1 nobody listens on: the first of `candidates` that binds (0: any)."""
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port among the candidates")


def _slurm_env(pid: int) -> dict[str, str]:
    """What srun gives task `pid` of a 2-task job step on this host: jax.distributed's SLURM
    detection derives the coordinator (first node, port 61440 + job id % 4096) from it."""
    port = _free_port(random.Random().sample(range(61440, 65536), 4096))
    return dict(SLURM_JOB_ID=str(port - 61440), SLURM_STEP_NODELIST="127.0.0.1",
                SLURM_NTASKS=str(PROCESSES), SLURM_PROCID=str(pid), SLURM_LOCALID=str(pid),
                SLURM_STEP_NUM_NODES="1")


def _launch(run_dir, env, point=None, n=0, *, auto=False, selftest=None
            ) -> list[subprocess.CompletedProcess]:
    """The run in PROCESSES processes of 8 / PROCESSES fake devices each; their results.
    auto: the processes find each other from a (fake) SLURM environment, not from flags."""
    address = f"127.0.0.1:{_free_port()}"
    slurm = _slurm_env(0) if auto else {}
    penv = dict(os.environ, JAX_PLATFORMS="cpu",
                XLA_FLAGS=f"--xla_force_host_platform_device_count={8 // PROCESSES}")
    procs = []
    for pid in range(PROCESSES):
        spec = dict(tests=TESTS, cache=str(env["cache"]), run_dir=str(run_dir),
                    data_dir=str(env["data"]), address=address, processes=PROCESSES, pid=pid,
                    point=point, n=n, auto=auto,
                    selftest=selftest and os.path.join(selftest, f"process{pid}.json"))
        if auto:
            slurm.update(SLURM_PROCID=str(pid), SLURM_LOCALID=str(pid))
        procs.append(subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(spec)],
                                      env={**penv, **slurm}, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=CHILD_TIMEOUT_S)
            out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    finally:
        for p in procs:   # a hung peer must not outlive the test
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def _ok(results):
    for pid, r in enumerate(results):
        assert r.returncode == 0, f"process {pid}:\n{r.stderr[-3000:]}"


def _records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _assert_records_match(recs, ref):
    """Same records in the same order: counts exact, floats to float32 reduction-order noise,
    wall times (every *_s field) aside."""
    assert _order(recs) == _order(ref) == EXPECTED_ORDER
    for r, q in zip(recs, ref):
        r = {k: v for k, v in r.items() if not k.endswith(TIME_KEYS_SUFFIX)}
        q = {k: v for k, v in q.items() if not k.endswith(TIME_KEYS_SUFFIX)}
        assert r.keys() == q.keys(), (r["step"], r.keys() ^ q.keys())
        for k in r:
            if isinstance(q[k], (bool, int, str)) or q[k] is None:
                assert r[k] == q[k], (r["step"], k, r[k], q[k])
            else:
                np.testing.assert_allclose(r[k], q[k], rtol=1e-4, atol=1e-6,
                                           err_msg=f"step {r['step']} {k}")


def _initial_params():
    from jaxrl_scale.models import get_config, init_params
    import jax
    p0 = init_params(get_config("tiny"), 0)
    return {jax.tree_util.keystr(p): np.asarray(x)
            for p, x in jax.tree_util.tree_flatten_with_path([{"params": p0}])[0]}


def _assert_params_match(run_dir, ref):
    """The final params: |theta - theta_ref| <= 1e-3 |theta_ref - theta_0| (global norms);
    counters and data position exact."""
    step, flat, meta = _final_state(run_dir)
    assert step == ref["step"] and flat.keys() == ref["state"].keys()
    p0 = _initial_params()
    keys = [k for k in flat if k.startswith("[0]['params']")]   # the (only) state's params
    assert set(keys) == set(p0)
    diff = np.sqrt(sum(np.sum((flat[k] - ref["state"][k]) ** 2.0) for k in keys))
    update = np.sqrt(sum(np.sum((ref["state"][k] - p0[k]) ** 2.0) for k in keys))
    assert update > 0
    assert diff <= 1e-3 * update, (diff, update)
    meta["counters"].pop("time_s")
    assert meta == ref["meta"]


def selftest(path: str) -> None:
    """Run in each child before training: the host-side helpers of jaxrl_scale.distributed
    on uneven splits, and the config check that only a multi-process run can reach."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from jaxrl_scale import distributed as dist, sharding as shd
    from jaxrl_scale.experiment.config import ConfigError, TrainConfig, validate_for_devices
    pid, out = jax.process_index(), {}
    for n in (5, 16):   # 3 + 2 rows, 8 + 8 rows
        rows = dist.host_rows(n)
        out[f"rows{n}"] = [rows.start, rows.stop]
        out[f"gather{n}"] = dist.allgather_rows(np.arange(n)[rows] * 10 + 1, n).tolist()
    x = np.arange(32.0).reshape(8, 4)
    mesh = shd.make_mesh()
    out["to_host_rows"] = dist.to_host(jax.device_put(x, shd.batch_sharding(mesh))).tolist()
    out["to_host_replicated"] = dist.to_host(
        jax.device_put(x, NamedSharding(mesh, P()))).tolist()
    out["broadcast"] = int(dist.broadcast(np.int32(pid + 7)))
    try:
        validate_for_devices(TrainConfig.make(gen_batch_ratio=2))
        out["engine_error"] = None
    except ConfigError as e:
        out["engine_error"] = e.field
    out["devices"], out["processes"] = len(jax.devices()), jax.process_count()
    with open(path, "w") as f:
        json.dump(out, f)


@pytest.fixture(scope="module")
def two_process_run(env, tmp_path_factory):
    """One two-process run, killed right after its step-2 checkpoint (both processes die
    before step 3) and resumed by processes that find each other through the fake SLURM
    environment: the uninterrupted and the resumed halves together cover every step, so one
    run checks both 'two processes equal one' and the resume (one launch less to wait for)."""
    root = tmp_path_factory.mktemp("multihost")
    run_dir = root / "run"
    killed = _launch(run_dir, env, point="after_save", n=1, selftest=str(root))
    state = dict(root=str(root), run_dir=run_dir, killed=killed,
                 finished_before=_finished_steps(run_dir),
                 done_before=os.path.exists(run_dir / "DONE.json"),
                 last_step_before=max(r["step"] for r in _records(run_dir)))
    _ok(_launch(run_dir, env, auto=True))
    return state


def test_distributed_helpers_in_two_processes(two_process_run):
    x = np.arange(32.0).reshape(8, 4).tolist()
    for pid in range(PROCESSES):
        with open(os.path.join(two_process_run["root"], f"process{pid}.json")) as f:
            out = json.load(f)
        assert out["rows5"] == [[0, 3], [3, 5]][pid] and out["rows16"] == [8 * pid, 8 * pid + 8]
        assert out["gather5"] == [1, 11, 21, 31, 41]
        assert out["gather16"] == list(range(1, 161, 10))
        assert out["to_host_rows"] == out["to_host_replicated"] == x
        assert out["broadcast"] == 7     # process 0's value everywhere
        assert out["engine_error"] == "gen_batch_ratio"
        assert (out["devices"], out["processes"]) == (8, PROCESSES)


def test_two_processes_killed_after_a_checkpoint_resume_to_the_same_run(env, two_process_run):
    for pid, r in enumerate(two_process_run["killed"]):
        assert r.returncode == -signal.SIGKILL, f"process {pid}:\n{r.stderr[-3000:]}"
    assert two_process_run["finished_before"] == [2]
    assert not two_process_run["done_before"] and two_process_run["last_step_before"] == 2
    run_dir = two_process_run["run_dir"]
    assert os.path.exists(run_dir / "DONE.json")


def test_two_processes_equal_one(env, two_process_run):
    """The killed-and-resumed two-process run's records and final params equal the
    one-process reference run's."""
    run_dir = str(two_process_run["run_dir"])
    _assert_records_match(_records(run_dir), env["ref"]["records"])
    _assert_params_match(run_dir, env["ref"])
