"""Fault injection: a crash at any moment loses at most the work since the last checkpoint and
never corrupts what was saved.

A training run (test_train's tiny config, 4 steps, eval and checkpoint every 2) runs in a
child process that SIGKILLs itself at a chosen point: the n-th rollout, update or eval, in the
middle of an orbax save (items written, step not yet renamed into place), right after a save,
or half-way through a metrics.jsonl line. Another child resumes it with no fault, and the result
must be the uninterrupted reference run's: the same metrics records (wall-time fields aside),
no step missing or twice, bit-identical final params and optimizer state. Every child shares
one JAX compilation cache (the compile is most of a child's time) and runs with conftest's
8 fake devices and matmul precision.

Also here: a corrupted latest checkpoint (fallback to the previous one), metrics.jsonl with a
torn last line or a damaged middle line, and a full disk (metrics append, checkpoint save).
The fast cases run in CI; `-m slow` adds 10 seeded random kill points and end-to-end disk-full
runs. The sweep's "a killed sweep redoes no finished run" is tests/test_sweep.py's
test_sweep_resume_skips_finished_runs.
"""
from __future__ import annotations

import errno
import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from jaxrl_scale.checkpoint import (DIGEST_FILE, CheckpointError, Checkpointer, DiskFullError,
                                    check_pytree, is_disk_full, load_pytree, save_pytree)
from jaxrl_scale.experiment import metrics as metrics_mod
from jaxrl_scale.experiment.metrics import CorruptMetricsError, MetricsLog

TESTS = os.path.dirname(os.path.abspath(__file__))
MAX_STEPS = 4
# What an uninterrupted run logs: (step, is an eval record), in order.
EXPECTED_ORDER = [(0, True), (1, False), (2, False), (2, True), (3, False), (4, False),
                  (4, True)]
# How often each fault point is reached in one uninterrupted run (the n a kill can take).
CALLS = {"rollout": 4, "update": 4, "eval": 3, "save_write": 2, "save_commit": 2,
         "after_save": 2, "metrics": len(EXPECTED_ORDER)}
# The CI cases: mid-save (the commit rename not done: resume from step 2 beside a stale
# temporary directory), mid metrics line (a torn last line), during the update before the
# first checkpoint (a restart from scratch over logged records).
FAST = [("save_commit", 2), ("metrics", 5), ("update", 2)]
CHILD_TIMEOUT_S = 300


def fault_cfg(run_dir, data_dir):
    """test_train's tiny config, 4 steps: checkpoints 2 and 4, evals 0, 2 and 4."""
    from test_train import tiny_cfg
    return tiny_cfg(run_dir, data_dir, max_steps=MAX_STEPS)


def digit_reward():
    """A reward the random tiny model earns unevenly (test_train's _digit_share): groups have
    variance, so every update moves the params and Adam's moments. With the task's own reward
    a random policy scores 0 everywhere, the updates are zero and a lost or repeated update
    would go unnoticed."""
    import jaxrl_scale.data
    from jaxrl_scale.data.reward_runner import RewardFn
    from test_train import _digit_share
    jaxrl_scale.data.reward_for_task = lambda name, **kw: RewardFn(_digit_share, name="digits")


# ------------------------------------------------------------------ faults (run in the child)

def _die():
    os.kill(os.getpid(), signal.SIGKILL)


def _enospc(path=""):
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


def install_fault(point: str, n: int) -> None:
    """Patch the child so that the n-th call of `point` SIGKILLs it (or, for the enospc_*
    points, fails for lack of disk space as the OS would)."""
    from orbax.checkpoint._src.handlers import json_checkpoint_handler as jch
    from orbax.checkpoint._src.path import atomicity
    from jaxrl_scale import checkpoint
    from jaxrl_scale.experiment import train
    calls = [0]

    def hit() -> bool:
        calls[0] += 1
        return calls[0] == n

    if point == "rollout":       # before the n-th rollout generates anything
        real_rollout = train.Run.rollout

        def rollout(self, *a, **kw):
            if hit():
                _die()
            return real_rollout(self, *a, **kw)
        train.Run.rollout = rollout
    elif point == "sigint_compile":  # Ctrl-C while the update compiles (once a segfault)
        real_compile = train.Run.compile

        def compile_sigint(self):
            # from a thread, 50 ms in: the signal lands while jax traces, lowers and compiles
            threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
            return real_compile(self)
        train.Run.compile = compile_sigint
    elif point == "sigint_update":  # Ctrl-C while the n-th update runs
        real_compile = train.Run.compile

        def compile_(self):
            step, seconds = real_compile(self)

            def step_with_sigint(*args):
                if hit():
                    os.kill(os.getpid(), signal.SIGINT)  # handled when the update returns
                return step(*args)
            return step_with_sigint, seconds
        train.Run.compile = compile_
    elif point == "update":      # the update has changed the state in memory, nothing saved
        real_compile = train.Run.compile

        def compile_(self):
            step, seconds = real_compile(self)

            def step_then_die(*args):
                res = step(*args)
                if hit():
                    import jax
                    jax.block_until_ready(res)
                    _die()
                return res
            return step_then_die, seconds
        train.Run.compile = compile_
    elif point == "eval":        # the eval has run, its record is not written yet
        real_eval = train.Run.evaluate

        def evaluate(self, step):
            out = real_eval(self, step)
            if hit():
                _die()
            return out
        train.Run.evaluate = evaluate
    elif point in ("save_write", "enospc_save"):  # orbax is writing the step's items
        real_save_fn = jch.JsonCheckpointHandler._save_fn

        async def save_fn(self, x, directory):
            if point == "enospc_save":
                if hit():
                    raise _enospc(str(directory / self._filename))
                return await real_save_fn(self, x, directory)
            await real_save_fn(self, x, directory)  # the meta item is on disk, state may not be
            if hit():
                _die()
        jch.JsonCheckpointHandler._save_fn = save_fn
    elif point == "save_commit":  # every item written, the step not yet renamed into place
        real_finalize = atomicity.AtomicRenameTemporaryPath.finalize

        async def finalize(self):
            if self.get_final().name.isdigit() and hit():
                _die()
            return await real_finalize(self)
        atomicity.AtomicRenameTemporaryPath.finalize = finalize
    elif point == "after_save":  # the checkpoint is complete; the loop has not gone on
        real_ck_save = checkpoint.Checkpointer.save

        def ck_save(self, *a, **kw):
            real_ck_save(self, *a, **kw)
            if hit():
                _die()
        checkpoint.Checkpointer.save = ck_save
    elif point == "metrics":     # half a line is on disk (flushed, fsynced), then the kill
        real_write = metrics_mod.MetricsLog.write

        def write(self, record):
            if hit():
                data = (json.dumps(metrics_mod._jsonable(record)) + "\n").encode()
                with open(self.path, "ab") as f:
                    f.write(data[:len(data) // 2])
                    f.flush()
                    os.fsync(f.fileno())
                _die()
            real_write(self, record)
        metrics_mod.MetricsLog.write = write
    elif point == "enospc_metrics":  # the disk fills up half-way through a record's os.write
        metrics_mod.os = _FullDiskOs(hit)
    else:
        raise ValueError(f"unknown fault point {point!r}")


class _FullDiskOs:
    """The `os` module, except that the write for which `hit()` is true puts half its bytes
    on disk and then raises ENOSPC, as a filling disk does."""

    def __init__(self, hit):
        self._hit = hit

    def __getattr__(self, name):
        return getattr(os, name)

    def write(self, fd, data):
        if self._hit():
            os.write(fd, bytes(data[:len(data) // 2]))
            raise _enospc()
        return os.write(fd, data)


_CHILD = """
import json, sys
spec = json.loads(sys.argv[1])
sys.path.insert(0, spec["tests"])
import conftest  # the parent's XLA_FLAGS (8 fake CPU devices), platform and matmul precision
import jax
jax.config.update("jax_compilation_cache_dir", spec["cache"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
import test_faults as tf
tf.digit_reward()
if spec["point"]:
    tf.install_fault(spec["point"], spec["n"])
from jaxrl_scale.experiment.train import run_training
cfg = tf.fault_cfg(spec["run_dir"], spec["data_dir"])
if (spec["point"] or "").startswith("sigint"):   # as the commands run it (Ctrl-C deferred)
    from jaxrl_scale.cli import guarded
    guarded(lambda argv: run_training(cfg, progress=False), defer_sigint=True)([])
else:
    run_training(cfg, progress=False)
"""


def _child(run_dir, data_dir, cache, point=None, n=0) -> subprocess.CompletedProcess:
    spec = dict(tests=TESTS, cache=str(cache), run_dir=str(run_dir), data_dir=str(data_dir),
                point=point, n=n)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # conftest, imported by the child, sets it
    # SIGINT at its default in the child: a test suite started as a background job of a
    # shell script inherits SIGINT ignored, and a run then (rightly) ignores Ctrl-C
    return subprocess.run([sys.executable, "-c", _CHILD, json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _parallel(fn, items, jobs=2):
    """fn over items, two at a time: the children are compile-bound and mostly single-threaded
    once the compilation cache is warm, so two share the 2 CI cores well."""
    with ThreadPoolExecutor(jobs) as ex:
        return list(ex.map(fn, items))


# ------------------------------------------------------------------ reading a run

def _strip_times(recs):
    """Records without wall-time fields (time_s, gen_s, eval_s, compile_s, ...: every *_s)."""
    return [{k: v for k, v in r.items() if not k.endswith("_s")} for r in recs]


def _order(recs):
    return [(r["step"], "score" in r) for r in recs]


def _raw_lines(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):  # killed before the first record
        return b""
    with open(path, "rb") as f:
        return f.read()


def _final_state(run_dir):
    """(flat {path: array} of the latest checkpoint's state, its meta), read as saved."""
    import jax
    import orbax.checkpoint as ocp
    step = _finished_steps(run_dir)[-1]  # not a Checkpointer: it would clean up tmp dirs
    step_dir = os.path.join(run_dir, "checkpoints", str(step))
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])  # whatever devices saved it
    with ocp.StandardCheckpointer() as c:
        path = os.path.join(step_dir, "state")
        like = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one),
                            c.metadata(path).item_metadata.tree)
        tree = c.restore(path, like)
    with open(os.path.join(step_dir, "meta", "metadata")) as f:
        meta = json.load(f)
    flat = {jax.tree_util.keystr(p): np.asarray(x)
            for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
    return step, flat, meta


def _finished_steps(run_dir):
    d = os.path.join(run_dir, "checkpoints")
    return sorted(int(s) for s in os.listdir(d) if s.isdigit()) if os.path.isdir(d) else []


def _assert_like_reference(run_dir, ref):
    """The resumed run ended where the uninterrupted one did, bit for bit."""
    assert os.path.exists(os.path.join(run_dir, "DONE.json"))
    raw = _raw_lines(run_dir)
    assert raw.endswith(b"\n")
    recs = [json.loads(line) for line in raw.splitlines()]  # every line whole: none torn
    assert _order(recs) == EXPECTED_ORDER, "duplicate or missing steps"
    assert _strip_times(recs) == _strip_times(ref["records"])
    assert not glob.glob(os.path.join(run_dir, "checkpoints", "*.orbax-checkpoint-tmp*"))
    step, flat, meta = _final_state(run_dir)
    assert step == ref["step"] and flat.keys() == ref["state"].keys()
    for k, x in flat.items():
        np.testing.assert_array_equal(x, ref["state"][k], err_msg=k)  # exact, not approx
    meta["counters"].pop("time_s")
    assert meta == ref["meta"]


@pytest.fixture(scope="session")
def env(tmp_path_factory):
    """Shared data and compilation cache, then the uninterrupted reference run (also the
    one-process reference of tests/test_multihost.py)."""
    root = tmp_path_factory.mktemp("faults")
    data, cache, ref_dir = root / "data", root / "jax_cache", root / "reference"
    res = _child(ref_dir, data, cache)
    assert res.returncode == 0, res.stderr[-3000:]
    step, state, meta = _final_state(str(ref_dir))
    meta["counters"].pop("time_s")
    recs = MetricsLog(os.path.join(ref_dir, "metrics.jsonl")).read()
    assert _order(recs) == EXPECTED_ORDER
    # the reward moves the policy: updates are not zero, so a lost update would show
    assert any(r.get("actor_grad_norm", 0) > 0 for r in recs)
    ref = dict(records=recs, step=step, state=state, meta=meta)
    return dict(root=root, data=data, cache=cache, ref=ref)


def _crash(env, name, point, n):
    """Run a child that dies at the n-th `point`; check that it died there (SIGKILL, or the
    one-line disk-full error); return what the crash left: finished checkpoints, records."""
    run_dir = env["root"] / name
    res = _child(run_dir, env["data"], env["cache"], point, n)
    if point.startswith("sigint"):  # a clean stop: exit 130, one line, no traceback
        assert res.returncode == 130, (point, n, res.returncode, res.stderr[-3000:])
        assert "Traceback" not in res.stderr and "Fatal Python error" not in res.stderr
        last = res.stderr.strip().splitlines()[-1]
        assert last.startswith("interrupted: stopped ") and \
            "To resume, rerun the same command: " in last, res.stderr[-3000:]
    elif point.startswith("enospc"):
        assert res.returncode == 1, (point, n, res.returncode, res.stderr[-3000:])
        last = res.stderr.strip().splitlines()[-1]  # the error's own line names all three
        assert "Disk full" in last and "Fix: free space" in last, res.stderr[-3000:]
        where = "metrics.jsonl" if point == "enospc_metrics" else "checkpoints"
        assert str(run_dir / where) in last, last
    else:
        assert res.returncode == -signal.SIGKILL, (point, n, res.returncode,
                                                   res.stderr[-3000:])
    assert not os.path.exists(run_dir / "DONE.json")
    raw = _raw_lines(run_dir)
    if point == "metrics":  # the crash left a torn line for the resume to repair
        assert not raw.endswith(b"\n")
    if point in ("save_write", "save_commit"):  # ...or an unfinished save
        assert glob.glob(str(run_dir / "checkpoints" / "*.orbax-checkpoint-tmp*"))
    if point.startswith("enospc"):  # ...or neither: no half record, no partial step
        assert raw.endswith(b"\n")
        assert not glob.glob(str(run_dir / "checkpoints" / "*.orbax-checkpoint-tmp*"))
    whole = [json.loads(line) for line in raw.split(b"\n")[:-1]]
    return dict(run_dir=str(run_dir), finished=_finished_steps(run_dir), records=whole)


def _resume_and_check(env, crashed):
    """Resume with no fault; the run must end as the reference did, and only the work after
    the last finished checkpoint may have been redone."""
    res = _child(crashed["run_dir"], env["data"], env["cache"])
    assert res.returncode == 0, res.stderr[-3000:]
    _assert_like_reference(crashed["run_dir"], env["ref"])
    # What was logged up to the resumed checkpoint is kept as written (wall times included).
    last = crashed["finished"][-1] if crashed["finished"] else -1
    kept = [r for r in crashed["records"] if r["step"] <= last]
    assert MetricsLog(os.path.join(crashed["run_dir"], "metrics.jsonl")).read()[:len(kept)] \
        == kept
    return res


def _scenario(env, prefix, case):
    """Crash (or corrupt), resume, check. Returns (crashed, resume result), or the exception,
    re-raised by the test that owns the case."""
    point, n = case
    name = f"{prefix}_{point}_{n}"
    try:
        crashed = _corrupt_copy_of_reference(env, name, point) if point in CORRUPTIONS else \
            _crash(env, name, point, n)
        return crashed, _resume_and_check(env, crashed)
    except BaseException as e:  # noqa: B902 -- handed to the test's thread
        return e


def _run_scenarios(env, prefix, cases):
    """Every case's crash-and-resume, two at a time (a pipeline: each keeps a child busy)."""
    return dict(zip(cases, _parallel(lambda c: _scenario(env, prefix, c), cases)))


def _outcome(r):
    if isinstance(r, BaseException):
        raise r
    return r


def flip_byte(path, at=0.5):
    """Flip one bit of the byte `at` of the way into `path` (the file keeps its size)."""
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        data[int(len(data) * at)] ^= 0x40
        f.seek(0)
        f.write(bytes(data))


def _corrupt_copy_of_reference(env, name, how="corrupt_latest"):
    """The reference run as a crash right after its last save would leave it (checkpoints 2
    and 4, no DONE.json), with checkpoint 4's largest array file then cut in half (a copy cut
    short, a disk fault) or, for "bitflip_latest", one bit flipped in its middle (orbax reads
    that file without complaint: only the checksum notices)."""
    run_dir = env["root"] / name
    shutil.copytree(env["root"] / "reference", run_dir)
    os.remove(run_dir / "DONE.json")
    assert _finished_steps(run_dir) == [2, 4]
    files = [f for f in glob.glob(str(run_dir / "checkpoints" / "4" / "state" / "**"),
                                  recursive=True) if os.path.isfile(f) and "/d/" in f]
    path = max(files, key=os.path.getsize)
    if how == "bitflip_latest":
        flip_byte(path)
    else:
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    records = MetricsLog(os.path.join(run_dir, "metrics.jsonl")).read()
    return dict(run_dir=str(run_dir), finished=[2], records=records)  # 4 is lost: from 2


CORRUPT = ("corrupt_latest", 4)
BITFLIP = ("bitflip_latest", 4)
CORRUPTIONS = ("corrupt_latest", "bitflip_latest")
# Ctrl-C while the update compiles (the step-0 eval not run yet: a restart from scratch) and
# during update 3 (it finishes, a checkpoint is saved at step 3, the resume continues there).
SIGINT = [("sigint_compile", 1), ("sigint_update", 3)]


@pytest.fixture(scope="module")
def fast_runs(env):
    return _run_scenarios(env, "fast", FAST + [CORRUPT, BITFLIP] + SIGINT)


@pytest.mark.timeout(1200)  # the first one builds fast_runs: 16 children
@pytest.mark.parametrize("point, n", FAST)
def test_sigkill_then_resume_equals_uninterrupted(fast_runs, point, n):
    _outcome(fast_runs[(point, n)])


@pytest.mark.timeout(1200)  # the first one builds fast_runs: 16 children
def test_corrupt_latest_checkpoint_falls_back_and_run_ends_identical(fast_runs):
    """The resume warns naming step 4 and its path, moves it aside, resumes from 2, and ends
    exactly as the uninterrupted run (checked by _resume_and_check)."""
    crashed, res = _outcome(fast_runs[CORRUPT])
    ck_dir = os.path.join(crashed["run_dir"], "checkpoints")
    assert f"Checkpoint step 4 at {os.path.join(ck_dir, '4')} cannot be restored" in res.stderr
    assert os.path.isdir(ck_dir + ".corrupt/4")


@pytest.mark.timeout(1200)  # the first one builds fast_runs: 16 children
def test_bit_flip_in_latest_checkpoint_is_caught_by_its_checksum(fast_runs):
    """One flipped bit in step 4's array data: the restore names the checksum mismatch, moves
    step 4 aside, resumes from 2 and ends exactly as the uninterrupted run."""
    crashed, res = _outcome(fast_runs[BITFLIP])
    ck_dir = os.path.join(crashed["run_dir"], "checkpoints")
    assert f"Checkpoint step 4 at {os.path.join(ck_dir, '4')} cannot be restored " \
           "(CorruptCheckpointError: checksum mismatch in 1 of" in res.stderr
    assert os.path.isdir(ck_dir + ".corrupt/4")


@pytest.mark.timeout(1200)  # the first one builds fast_runs: 16 children
@pytest.mark.parametrize("point, n", SIGINT)
def test_ctrl_c_exits_130_then_resume_equals_uninterrupted(fast_runs, point, n):
    """Exit 130 with one line saying how to resume and no traceback (checked by _crash); the
    interrupted update finished and was checkpointed; the resume ends as the reference."""
    crashed, _ = _outcome(fast_runs[(point, n)])
    if point == "sigint_update":
        assert crashed["finished"] == [2, 3]   # step 3 saved at the Ctrl-C
        assert _order(crashed["records"]) == EXPECTED_ORDER[:5]
    else:
        assert crashed["finished"] == [] and crashed["records"] == []


def _slow_points(k=10, seed=0):
    """k distinct (point, n), seeded, from every point x call index not in FAST."""
    space = [(p, n) for p, c in CALLS.items() for n in range(1, c + 1) if (p, n) not in FAST]
    return random.Random(seed).sample(space, k)


# A full disk at the step-3 record (half of it written) and at the step-4 checkpoint.
DISK_FULL = [("enospc_metrics", 5), ("enospc_save", 2)]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 24 children: minutes on 2 busy cores
def test_sigkill_at_random_points_and_disk_full_then_resume_equals_uninterrupted(env):
    """10 seeded random kill points, and runs whose disk fills up (one clear error, no half
    record, checkpoint 2 intact): each resumed run ends exactly as the uninterrupted one."""
    cases = _slow_points() + DISK_FULL
    out = _run_scenarios(env, "slow", cases)
    failed = {c: r for c, r in out.items() if isinstance(r, BaseException)}
    print(f"{len(cases) - len(failed)}/{len(cases)} crash points resumed identical: {cases}")
    for r in failed.values():
        raise r


# ------------------------------------------------------------------ unit level

def _tiny_tree(x):
    import jax.numpy as jnp
    return {"w": jnp.full((64, 8), float(x)), "b": {"c": jnp.arange(16.0) + x}}


def _assert_tree_is(tree, x):
    np.testing.assert_array_equal(np.asarray(tree["w"]), np.full((64, 8), float(x)))
    np.testing.assert_array_equal(np.asarray(tree["b"]["c"]), np.arange(16.0) + x)


def test_restore_falls_back_past_unreadable_checkpoints(tmp_path):
    d = str(tmp_path / "ck")
    ck = Checkpointer(d, max_to_keep=3)
    for s in (2, 4, 6):
        ck.save(s, _tiny_tree(s), {"step": s})
    os.remove(max(glob.glob(f"{d}/6/state/**/d/*", recursive=True), key=os.path.getsize))
    with open(f"{d}/4/meta/metadata", "w") as f:
        f.write('{"ste')  # truncated JSON
    with pytest.warns(RuntimeWarning) as rec:
        tree, meta = Checkpointer(d).restore(None, _tiny_tree(0))
    _assert_tree_is(tree, 2)
    assert meta == {"step": 2}
    text = "\n".join(str(w.message) for w in rec)
    assert f"step 6 at {d}/6" in text and f"step 4 at {d}/4" in text
    # the bad steps are out of the way (kept for inspection); saving step 4 again works
    ck = Checkpointer(d, max_to_keep=3)
    assert ck.all_steps() == [2] and sorted(os.listdir(d + ".corrupt")) == ["4", "6"]
    ck.save(4, _tiny_tree(40), {"step": 4})
    _assert_tree_is(Checkpointer(d).restore(None, _tiny_tree(0))[0], 40)


def test_no_readable_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    d = str(tmp_path / "ck")
    ck = Checkpointer(d)
    for s in (2, 4):
        ck.save(s, _tiny_tree(s))
        with open(f"{d}/{s}/meta/metadata", "w") as f:
            f.write("")
    with pytest.warns(RuntimeWarning), pytest.raises(CheckpointError) as e:
        Checkpointer(d).restore(None, _tiny_tree(0))
    assert d in str(e.value) and f"delete {d}" in str(e.value)
    assert Checkpointer(d).all_steps() == [2, 4]  # nothing moved when nothing could be read


# ------------------------------------------------------------------ metrics.jsonl

def _write_lines(path, *chunks: bytes):
    with open(path, "wb") as f:
        f.write(b"".join(chunks))


def test_torn_last_metrics_line_is_repaired(tmp_path):
    path = str(tmp_path / "metrics.jsonl")
    log = MetricsLog(path)
    for s in (0, 1, 2):
        log.write({"step": s, "x": s / 3})
    with open(path, "ab") as f:
        f.write(b'{"step": 3, "x": 0.')  # a kill mid-write
    assert [r["step"] for r in log.read()] == [0, 1, 2]
    assert [r["step"] for r in log.truncate_after(1)] == [0, 1]
    log.write({"step": 2, "x": 1.0})
    with open(path) as f:
        assert [json.loads(line)["step"] for line in f] == [0, 1, 2]
    assert not os.path.exists(path + ".tmp")


def test_damaged_middle_metrics_line_raises_naming_file_and_line(tmp_path):
    """A crash can only tear the last line; an unreadable line with records after it is
    damage, and dropping the records after it silently would lose logged steps."""
    path = str(tmp_path / "metrics.jsonl")
    _write_lines(path, b'{"step": 0}\n', b'{"step": 1}\n', b'{"step": 2, "x": \n',
                 b'{"step": 3}\n', b'{"step": 4}\n')
    log = MetricsLog(path)
    for fn in (log.read, lambda: log.truncate_after(3)):
        with pytest.raises(CorruptMetricsError, match=rf"{path}, line 3: .*2 record"):
            fn()
    with open(path, "rb") as f:  # the resume's truncation did not rewrite the file
        assert f.read().count(b"\n") == 5
    _write_lines(path, b'{"step": 0}\n', b'\xff\xfe\n', b'{"step": 1}\n')  # not even UTF-8
    with pytest.raises(CorruptMetricsError, match="line 2"):
        log.read()


# ------------------------------------------------------------------ disk full

def test_disk_full_metrics_write_leaves_no_half_record(tmp_path, monkeypatch):
    path = str(tmp_path / "metrics.jsonl")
    log = MetricsLog(path)
    log.write({"step": 0})
    before = open(path, "rb").read()
    calls = []
    monkeypatch.setattr(metrics_mod, "os", _FullDiskOs(lambda: not calls.append(1)))
    with pytest.raises(OSError) as e:
        log.write({"step": 1, "loss": 0.5, "note": "x" * 200})
    assert calls, "the fault was not reached"
    assert e.value.errno == errno.ENOSPC
    msg = str(e.value)
    assert path in msg and "Disk full" in msg and "Fix: free space" in msg
    assert open(path, "rb").read() == before  # the half record was cut off again
    monkeypatch.undo()
    log.write({"step": 1})  # space freed: the next append and the next resume work
    assert [r["step"] for r in log.read()] == [0, 1]


def test_disk_full_while_truncating_metrics_keeps_the_old_file(tmp_path, monkeypatch):
    """The resume's rewrite of metrics.jsonl goes through a temporary file: a full disk there
    leaves the old file whole and no temporary file behind."""
    path = str(tmp_path / "metrics.jsonl")
    log = MetricsLog(path)
    for s in range(3):
        log.write({"step": s})
    before = open(path, "rb").read()

    class NoSpaceOnFsync(_FullDiskOs):
        def fsync(self, fd):
            raise _enospc()

    monkeypatch.setattr(metrics_mod, "os", NoSpaceOnFsync(lambda: False))
    with pytest.raises(OSError, match="Disk full while rewriting .*metrics.jsonl") as e:
        log.truncate_after(1)
    assert e.value.errno == errno.ENOSPC
    assert open(path, "rb").read() == before and not os.path.exists(path + ".tmp")


def test_disk_full_checkpoint_save_keeps_the_previous_one(tmp_path, monkeypatch):
    from orbax.checkpoint._src.handlers import json_checkpoint_handler as jch
    d = str(tmp_path / "ck")
    ck = Checkpointer(d)
    ck.save(2, _tiny_tree(2), {"step": 2})
    reached = []

    async def full(self, x, directory):
        reached.append(str(directory))
        raise _enospc(str(directory / self._filename))

    monkeypatch.setattr(jch.JsonCheckpointHandler, "_save_fn", full)
    with pytest.raises(DiskFullError) as e:
        ck.save(4, _tiny_tree(4), {"step": 4})
    assert reached and e.value.errno == errno.ENOSPC
    msg = str(e.value)
    assert d in msg and "Disk full" in msg and "step 2) is intact" in msg and "Fix:" in msg
    assert os.listdir(d) == ["2"]  # the partial step is gone
    monkeypatch.undo()
    tree, meta = Checkpointer(d).restore(None, _tiny_tree(0))
    _assert_tree_is(tree, 2)
    assert meta == {"step": 2}


def test_disk_full_is_recognised_through_wrapping():
    """Orbax may chain a writer thread's OSError; tensorstore words ENOSPC in a ValueError."""
    try:
        try:
            raise _enospc("/x")
        except OSError as inner:
            raise RuntimeError("save failed") from inner
    except RuntimeError as outer:
        assert is_disk_full(outer)
    assert is_disk_full(ValueError("DATA_LOSS: ... No space left on device [OS error: 28]"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))


# ------------------------------------------------------------------ checksums

def _random_tree(x):
    """Random values: their compressed bytes are not constant, as real params are not."""
    import jax.numpy as jnp
    rng = np.random.default_rng(x)
    return {"w": jnp.asarray(rng.standard_normal((64, 8)), jnp.float32),
            "b": {"c": jnp.arange(16.0) + x}}


def _largest_array_file(step_dir):
    files = [f for f in glob.glob(f"{step_dir}/state/**", recursive=True)
             if os.path.isfile(f) and "/d/" in f]
    return max(files, key=os.path.getsize)


def test_bit_flip_restores_silently_without_checksum_and_is_caught_with_it(tmp_path):
    import jax
    import orbax.checkpoint as ocp
    d = str(tmp_path / "ck")
    ck = Checkpointer(d, max_to_keep=3)
    for s in (2, 4):
        ck.save(s, _random_tree(s), {"step": s})
        assert os.path.exists(f"{d}/{s}/{DIGEST_FILE}")
    flip_byte(_largest_array_file(f"{d}/4"))
    # the fault is the silent kind: orbax alone restores other numbers without a word
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _random_tree(0))
    with ocp.StandardCheckpointer() as c:
        silent = c.restore(f"{d}/4/state", like)
    assert not np.array_equal(np.asarray(silent["w"]), np.asarray(_random_tree(4)["w"]))
    with pytest.warns(RuntimeWarning) as rec:
        tree, meta = Checkpointer(d).restore(None, _random_tree(0))
    np.testing.assert_array_equal(np.asarray(tree["w"]), np.asarray(_random_tree(2)["w"]))
    assert meta == {"step": 2}
    assert "step 4" in str(rec[0].message) and "checksum mismatch in 1 of" in str(rec[0].message)
    assert os.listdir(d + ".corrupt") == ["4"]
    with pytest.raises(CheckpointError, match="checksum mismatch"):   # an explicit step too
        flip_byte(_largest_array_file(f"{d}/2"))
        Checkpointer(d).restore(2, _random_tree(0))


def test_checkpoint_without_digest_file_restores_with_a_warning(tmp_path):
    """A save killed between orbax's commit and the digest file (or one written before
    checksums existed) is complete as far as orbax knows: it is used, unverified, with a word."""
    d = str(tmp_path / "ck")
    Checkpointer(d).save(2, _random_tree(2))
    os.remove(f"{d}/2/{DIGEST_FILE}")
    with pytest.warns(RuntimeWarning, match="restored unverified"):
        tree, _ = Checkpointer(d).restore(None, _random_tree(0))
    np.testing.assert_array_equal(np.asarray(tree["w"]), np.asarray(_random_tree(2)["w"]))


def test_damaged_digest_file_is_a_corrupt_checkpoint(tmp_path):
    d = str(tmp_path / "ck")
    Checkpointer(d).save(2, _random_tree(2))
    with open(f"{d}/2/{DIGEST_FILE}", "w") as f:
        f.write('{"files": ')
    with pytest.raises(CheckpointError, match="digest file .* is unreadable"):
        Checkpointer(d).restore(2, _random_tree(0))


def test_sft_cache_entry_with_a_flipped_bit_is_set_aside_and_retrained(tmp_path, monkeypatch):
    """sft_warmstart checks a cached entry's digests before handing it out: a corrupt entry is
    moved aside and trained again (here a stand-in trainer), never reused."""
    from jaxrl_scale.experiment import sft
    cfg = sft.SFTConfig(cache_dir=str(tmp_path / "cache"))
    trained = []

    def fake_train(cfg, out_dir, info_path, progress):
        trained.append(out_dir)
        save_pytree(os.path.join(out_dir, "params"), _random_tree(len(trained)))
        with open(info_path, "w") as f:
            json.dump({"accuracy": 0.3}, f)
        return os.path.join(out_dir, "params"), {"accuracy": 0.3}

    monkeypatch.setattr(sft, "_train", fake_train)
    path, _ = sft.sft_warmstart(cfg)
    assert sft.sft_warmstart(cfg)[0] == path and len(trained) == 1   # a good entry is reused
    flip_byte(_largest_array_file(os.path.join(path, "0")))
    assert "checksum mismatch" in check_pytree(path)
    with pytest.warns(RuntimeWarning, match="is corrupt .*checksum mismatch"):
        assert sft.sft_warmstart(cfg)[0] == path
    assert len(trained) == 2 and os.path.isdir(os.path.dirname(path) + ".corrupt")
    tree, _ = load_pytree(path, _random_tree(0))
    np.testing.assert_array_equal(np.asarray(tree["w"]), np.asarray(_random_tree(2)["w"]))


def test_step0_eval_cache_with_a_changed_byte_is_recomputed(tmp_path):
    from jaxrl_scale.experiment.eval_cache import read_sealed_json, sealed
    from jaxrl_scale.numbers import write_json
    path = str(tmp_path / "eval0.json")
    payload = {"key": {"seed": 0}, "eval": {"score": 0.25, "eval_n": 16}}
    write_json(path, sealed(payload))
    assert read_sealed_json(path) == payload
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace("0.25", "0.75"))   # still valid JSON, another score
    with pytest.warns(RuntimeWarning, match="sha256 does not match"):
        assert read_sealed_json(path) is None
    assert not os.path.exists(path) and os.path.exists(path + ".corrupt")
    with open(path, "w") as f:
        f.write('{"key": ')                       # torn
    with pytest.warns(RuntimeWarning, match="JSONDecodeError"):
        assert read_sealed_json(path) is None
    assert read_sealed_json(path) is None         # gone: the caller recomputes and writes


# ------------------------------------------------------------------ the run directory

_HOLDER = """
import sys, time
from jaxrl_scale.experiment.rundir import RunDirLock
RunDirLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(120)
"""


def _hold_lock(run_dir):
    os.makedirs(run_dir, exist_ok=True)
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(run_dir)], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_second_training_in_a_run_dir_is_refused_naming_the_holder(tmp_path):
    """Another process trains in the directory: run_training refuses with the holder's pid
    before loading anything; once the holder dies (SIGKILL: no cleanup), the lock is free."""
    from jaxrl_scale.experiment.config import ConfigError
    from jaxrl_scale.experiment.rundir import RunDirLock
    from jaxrl_scale.experiment.train import run_training
    run_dir, data = tmp_path / "run", tmp_path / "data"
    holder = _hold_lock(run_dir)
    try:
        with pytest.raises(ConfigError, match=rf"^run_dir: .* in use by another training "
                                              rf"\(process {holder.pid} on "):
            run_training(fault_cfg(run_dir, data), progress=False)
        assert not data.exists()                  # refused before the data was built
    finally:
        holder.kill()
        holder.wait()
    with RunDirLock(str(run_dir)):              # released by the OS with its holder
        with RunDirLock(str(run_dir)):          # reentrant within a process
            pass


def _read_only_filesystem(monkeypatch, under):
    """os.makedirs fails under `under` as on a read-only mount (EROFS), which no user, root
    included, writes through."""
    real = os.makedirs

    def makedirs(name, *a, **kw):
        if os.path.abspath(name).startswith(str(under)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), name)
        return real(name, *a, **kw)
    monkeypatch.setattr(os, "makedirs", makedirs)


# Run directories no process can create or write, root included (none is about permissions):
# case -> what the line's fix says
_UNUSABLE_RUN_DIRS = {
    "parent_is_a_file": "a part of that path is a file",            # mkdir: ENOTDIR
    "parent_is_a_symlink_loop": "a symbolic link in that path loops",  # mkdir: ELOOP
    "read_only_filesystem": "the filesystem is read-only",          # EROFS
}


@pytest.mark.parametrize("case", sorted(_UNUSABLE_RUN_DIRS))
def test_unwritable_run_dir_is_refused_before_loading_anything(case, tmp_path, monkeypatch):
    """A run dir that cannot be created or written for a reason other than permissions (so
    the test runs as root too, as CI does): one ConfigError on run_dir that says why, before
    the data is built."""
    from jaxrl_scale.experiment.config import ConfigError
    from jaxrl_scale.experiment.train import run_training
    data = tmp_path / "data"
    if case == "parent_is_a_file":
        (tmp_path / "a_file").write_text("")
        run_dir = tmp_path / "a_file" / "run"
    elif case == "parent_is_a_symlink_loop":
        os.symlink("loop", tmp_path / "loop")
        run_dir = tmp_path / "loop" / "run"
    else:
        run_dir = tmp_path / "ro_mount" / "run"
        _read_only_filesystem(monkeypatch, tmp_path / "ro_mount")
    with pytest.raises(ConfigError, match=r"^run_dir: cannot write in .*Fix: ") as e:
        run_training(fault_cfg(run_dir, data), progress=False)
    assert _UNUSABLE_RUN_DIRS[case] in str(e.value)
    assert not data.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through a chmod (the cases above "
                    "run as root)")
def test_read_only_run_dir_by_permissions_is_refused(tmp_path):
    from jaxrl_scale.experiment.config import ConfigError
    from jaxrl_scale.experiment.train import run_training
    ro = tmp_path / "read_only"
    ro.mkdir()
    ro.chmod(0o555)
    with pytest.raises(ConfigError, match=r"^run_dir: cannot write in .*Permission denied.*"
                                          r"Fix: choose a --run_dir you can write to"):
        run_training(fault_cfg(ro / "run", tmp_path / "data"), progress=False)
    assert not (tmp_path / "data").exists()


def test_finished_run_is_reported_without_writing(env, tmp_path):
    """A finished run returns its final counters at once: nothing loaded, compiled or
    written (config.json untouched, no lock file), so a read-only copy works too."""
    from jaxrl_scale.experiment.train import run_training
    run_dir = tmp_path / "finished"
    shutil.copytree(env["root"] / "reference", run_dir)
    before = {p: os.stat(p).st_mtime_ns for p in glob.glob(f"{run_dir}/**", recursive=True)}
    out = run_training(fault_cfg(run_dir, tmp_path / "no_data"), progress=False)
    assert out["finished"] and out["step"] == MAX_STEPS
    assert {p: os.stat(p).st_mtime_ns for p in glob.glob(f"{run_dir}/**", recursive=True)} \
        == before
    assert not (tmp_path / "no_data").exists()


# ------------------------------------------------------------------ HF checkpoint files

def save_tiny_hf(path, max_shard_bytes=None):
    """The 'tiny' preset's init as an HF checkpoint (save_hf; no torch): (config, params)."""
    from jaxrl_scale.models import get_config, init_params, save_hf
    cfg = get_config("tiny")
    params = init_params(cfg, 0)
    save_hf(path, cfg, params, max_shard_bytes=max_shard_bytes)
    return cfg, params


def hf_variant(src, dst, weights: bytes | None = None, file: str = "model.safetensors",
               **config):
    """A copy of the checkpoint `src` at `dst` with `file` replaced by `weights` and/or
    config.json's fields set to `config` (a value of None removes the field)."""
    shutil.copytree(src, dst)
    if weights is not None:
        (dst / file).write_bytes(weights)
    if config:
        c = json.loads((dst / "config.json").read_text())
        c.update(config)
        (dst / "config.json").write_text(json.dumps({k: v for k, v in c.items()
                                                     if v is not None}))
    return dst


@pytest.fixture(scope="module")
def hf_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf") / "tiny"
    cfg, params = save_tiny_hf(d)
    return d, cfg, params


def _refuse_tensor_reads(monkeypatch):
    """Any tensor read fails the test: the checks must speak from config.json and the headers
    (read without safetensors) alone."""
    from jaxrl_scale.experiment import states
    from jaxrl_scale.models import hf

    def refuse(*a, **k):
        raise AssertionError("tensor data read before every check passed")
    monkeypatch.setattr(hf, "safe_open", refuse)
    monkeypatch.setattr(states, "load_hf", refuse)   # where the run's params are built


def _leaves_equal(a, b):
    import jax
    la, lb = jax.tree.leaves_with_path(a), jax.tree.leaves_with_path(b)
    assert [p for p, _ in la] == [p for p, _ in lb]
    for (p, x), (_, y) in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str(p))


def test_truncated_safetensors_is_refused_before_any_tensor_is_read(hf_ckpt, tmp_path,
                                                                    monkeypatch):
    """Cut inside the length field, inside the header, at its end, inside the data, one byte
    short, one byte long; then one shard of a sharded checkpoint: an HFCheckpointError naming
    the file, before any tensor is read; from run_training, one ConfigError on
    hf_checkpoint before the data is built."""
    from jaxrl_scale.experiment.config import ConfigError
    from jaxrl_scale.experiment.train import run_training
    from jaxrl_scale.models.hf import HFCheckpointError, check_hf, load_hf
    src = hf_ckpt[0]
    raw = (src / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    sizes = [0, 5, 8, 8 + n // 2, 8 + n - 1, 8 + n, 8 + n + 1, (8 + n + len(raw)) // 2,
             len(raw) - 1]
    _refuse_tensor_reads(monkeypatch)
    cases = [raw[:k] for k in sizes] + [raw + b"\0"]
    for i, weights in enumerate(cases):
        d = hf_variant(src, tmp_path / f"cut{i}", weights)
        for fn in (check_hf, load_hf):
            with pytest.raises(HFCheckpointError, match=rf"^{re.escape(str(d))}/model\."
                                                        "safetensors is truncated or corrupt: "):
                fn(d)
    data = tmp_path / "data"
    with pytest.raises(ConfigError, match=rf"^hf_checkpoint: '{re.escape(str(d))}' cannot be "
                                          r"used: .* is truncated or corrupt: .*\. Fix: "
                                          r"re-download"):
        run_training(fault_cfg(tmp_path / "run", data).replace(hf_checkpoint=str(d)),
                     progress=False)
    assert not data.exists()

    sharded = tmp_path / "sharded"
    save_tiny_hf(sharded, max_shard_bytes=100_000)
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 2
    bad = hf_variant(sharded, tmp_path / "bad_shard", shards[1].read_bytes()[:-100],
                     file=shards[1].name)
    with pytest.raises(HFCheckpointError, match=rf"{shards[1].name} is truncated"):
        load_hf(bad)
    for index in (b"[]", b'{"weight_map": ', b'{"weight_map": {"x": 3}}'):
        d = hf_variant(sharded, tmp_path / f"index{len(index)}", index,
                       file="model.safetensors.index.json")
        with pytest.raises(HFCheckpointError, match=r"model\.safetensors\.index\.json"):
            load_hf(d)


def test_corrupt_safetensors_header_is_refused_or_changes_nothing(hf_ckpt, tmp_path):
    """One flipped bit in the length field or the header's JSON (150 seeded positions, plus
    every byte of the metadata): refused with an HFCheckpointError naming the file, or (a bit
    of the unused metadata) the params load unchanged. Nothing partial is ever used."""
    from jaxrl_scale.models.hf import HFCheckpointError, check_hf, load_hf
    src, _, params = hf_ckpt
    raw = (src / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    meta = raw.index(b'"__metadata__"')
    positions = sorted(set(random.Random(0).sample(range(8 + n), 150)) |
                       set(range(8)) | set(range(meta, meta + 32)))
    d = hf_variant(src, tmp_path / "ck")
    refused, unchanged = 0, 0
    for pos in positions:
        for bit in (0x01, 0x20):
            flipped = bytearray(raw)
            flipped[pos] ^= bit
            (d / "model.safetensors").write_bytes(bytes(flipped))
            try:
                check_hf(d)
            except HFCheckpointError as e:
                assert str(d / "model.safetensors") in str(e) and "\n" not in str(e), str(e)
                refused += 1
                continue
            _leaves_equal(load_hf(d)[1], params)
            unchanged += 1
    assert refused > 10 * unchanged and unchanged > 0, (refused, unchanged)


@pytest.mark.parametrize("field, value, match", [
    ("num_attention_heads", "8.5", "num_attention_heads='8.5' must be an integer >= 1"),
    ("num_attention_heads", "eight", "num_attention_heads='eight' must be an integer >= 1"),
    ("num_attention_heads", 8.5, "num_attention_heads=8.5 must be an integer >= 1"),
    ("num_attention_heads", True, "num_attention_heads=True must be an integer"),
    ("num_attention_heads", 0, "num_attention_heads=0 must be an integer >= 1"),
    ("hidden_size", "64", "hidden_size='64' must be an integer"),
    ("num_key_value_heads", 2.0, "num_key_value_heads=2.0 must be an integer"),
    ("num_key_value_heads", 3, "cannot build: ModelConfig.num_heads=4 must be a multiple of "
                               "num_kv_heads=3"),
    ("max_position_embeddings", -1, "max_position_embeddings=-1 must be an integer >= 1"),
    ("rms_norm_eps", "1e-6", "rms_norm_eps='1e-6' must be a finite number > 0"),
    ("rope_theta", [1e6], r"rope_theta=\[1000000.0\] must be a finite number"),
    ("vocab_size", None, r"missing required field\(s\) \['vocab_size'\]"),
])
def test_config_json_fields_of_the_wrong_type_are_one_clear_error(hf_ckpt, tmp_path,
                                                                  monkeypatch, field, value,
                                                                  match):
    """A config.json integer that is not one (never truncated: 8.5 is not 8), a number that
    is a string: an HFCheckpointError naming config.json and the field; the commands' one
    line names hf_checkpoint. Nothing is read but config.json."""
    from jaxrl_scale.experiment.checks import hf_model_config
    from jaxrl_scale.experiment.config import ConfigError
    from jaxrl_scale.models.hf import HFCheckpointError, check_hf, load_hf
    d = hf_variant(hf_ckpt[0], tmp_path / "ck", **{field: value})
    _refuse_tensor_reads(monkeypatch)
    for fn in (check_hf, load_hf):
        with pytest.raises(HFCheckpointError, match=rf"^config\.json .*{match}"):
            fn(d)
    with pytest.raises(ConfigError, match=rf"^hf_checkpoint: '{re.escape(str(d))}' cannot be "
                                          rf"used: config\.json .*{match}.*\. Fix: "):
        hf_model_config(str(d))


@pytest.mark.parametrize("text", ["[1, 2]", '{"vocab_size": ', "\udcff"])
def test_config_json_that_is_no_json_object_is_one_clear_error(hf_ckpt, tmp_path, text):
    from jaxrl_scale.models.hf import HFCheckpointError, load_hf
    d = hf_variant(hf_ckpt[0], tmp_path / "ck")
    (d / "config.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(HFCheckpointError, match=rf"^{re.escape(str(d))}/config\.json (is not "
                                                 "valid JSON|holds a JSON list, not an object)"):
        load_hf(d)


def test_short_max_prompt_len_is_refused_before_the_weights_are_read(hf_ckpt, tmp_path,
                                                                     monkeypatch):
    """--max_prompt_len below the longest prompt: the ConfigError names the field and the
    longest prompt, from the tokenizer and the data alone (no weight read, nothing compiled)."""
    from jaxrl_scale.experiment.config import ConfigError
    from jaxrl_scale.experiment.train import run_training
    _refuse_tensor_reads(monkeypatch)
    cfg = fault_cfg(tmp_path / "run", tmp_path / "data").replace(
        hf_checkpoint=str(hf_ckpt[0]), max_prompt_len=3)
    with pytest.raises(ConfigError, match=r"^max_prompt_len: 3 is shorter than the longest "
                                          r"prompt, (\d+) tokens \(\w+ example \d+\)\. Fix: set "
                                          r"--max_prompt_len >= \1 \(or 0: the longest prompt\); "
                                          r"the model context is 256 tokens\.$"):
        run_training(cfg, progress=False)


def test_intact_hf_checkpoint_is_the_runs_starting_point(hf_ckpt, tmp_path):
    """The checks pass an intact checkpoint through: the run starts from its params exactly."""
    from jaxrl_scale.experiment.train import Run
    cfg = fault_cfg(tmp_path / "run", tmp_path / "data").replace(hf_checkpoint=str(hf_ckpt[0]))
    run = Run(cfg)
    assert run.model_cfg == hf_ckpt[1]
    _leaves_equal(run.init_states[0].params, hf_ckpt[2])
