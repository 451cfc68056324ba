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
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from jaxrl_scale.checkpoint import CheckpointError, Checkpointer, DiskFullError, is_disk_full
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
    from jaxrl_scale.data.rewards import RewardFn
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
run_training(tf.fault_cfg(spec["run_dir"], spec["data_dir"]), progress=False)
"""


def _child(run_dir, data_dir, cache, point=None, n=0) -> subprocess.CompletedProcess:
    spec = dict(tests=TESTS, cache=str(cache), run_dir=str(run_dir), data_dir=str(data_dir),
                point=point, n=n)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # conftest, imported by the child, sets it
    return subprocess.run([sys.executable, "-c", _CHILD, json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)


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
    if point.startswith("enospc"):
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
        crashed = _corrupt_copy_of_reference(env, name) if point == "corrupt_latest" else \
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


def _corrupt_copy_of_reference(env, name):
    """The reference run as a crash right after its last save would leave it (checkpoints 2
    and 4, no DONE.json), with checkpoint 4's largest array file then cut in half (a copy cut
    short, a disk fault)."""
    run_dir = env["root"] / name
    shutil.copytree(env["root"] / "reference", run_dir)
    os.remove(run_dir / "DONE.json")
    assert _finished_steps(run_dir) == [2, 4]
    files = [f for f in glob.glob(str(run_dir / "checkpoints" / "4" / "state" / "**"),
                                  recursive=True) if os.path.isfile(f) and "/d/" in f]
    path = max(files, key=os.path.getsize)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    records = MetricsLog(os.path.join(run_dir, "metrics.jsonl")).read()
    return dict(run_dir=str(run_dir), finished=[2], records=records)  # 4 is lost: from 2


CORRUPT = ("corrupt_latest", 4)


@pytest.fixture(scope="module")
def fast_runs(env):
    return _run_scenarios(env, "fast", FAST + [CORRUPT])


@pytest.mark.parametrize("point, n", FAST)
def test_sigkill_then_resume_equals_uninterrupted(fast_runs, point, n):
    _outcome(fast_runs[(point, n)])


def test_corrupt_latest_checkpoint_falls_back_and_run_ends_identical(fast_runs):
    """The resume warns naming step 4 and its path, moves it aside, resumes from 2, and ends
    exactly as the uninterrupted run (checked by _resume_and_check)."""
    crashed, res = _outcome(fast_runs[CORRUPT])
    ck_dir = os.path.join(crashed["run_dir"], "checkpoints")
    assert f"Checkpoint step 4 at {os.path.join(ck_dir, '4')} cannot be restored" in res.stderr
    assert os.path.isdir(ck_dir + ".corrupt/4")


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
