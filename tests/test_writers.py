"""Metric writers: TensorBoard's reader sees metrics.jsonl's scalars exactly; resume; W&B."""

import glob
import os
import sys

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from jaxrl_scale.experiment import writers
from jaxrl_scale.experiment.writers import (TensorBoardWriter, WandbWriter, close_all,
                                            make_writers, scalars, write_all)

TRAIN = {"step": 1, "responses": 64, "time_s": 2.5, "loss": -0.125, "clipped": True,
         "actor_grad_sqnorm_micro": [1.5, 2.25], "kl": None, "note": "warmup",
         "nested": {"a": 1.0}, "nan_metric": float("nan")}
EVAL = {"step": 1, "responses": 64, "time_s": 2.5, "score": 0.4375, "eval_se": 0.03,
        "eval_s": 1.0}
TRAIN2 = {"step": 2, "responses": 128, "time_s": 5.0, "loss": -0.25, "clipped": False,
          "actor_grad_sqnorm_micro": [np.float32(3.0), 4.0], "kl": 0.01,
          "ratio": np.asarray(1.5)}


def read_tb(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    """What a TensorBoard user sees: tag -> [(step, value)] after the reader's purges."""
    acc = EventAccumulator(os.path.join(run_dir, "tensorboard"))
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def expected(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        for k, v in scalars(r).items():
            if not any(s == r["step"] for s, _ in out.get(k, [])):
                out.setdefault(k, []).append((r["step"], float(v)))
    return out


def assert_same(got, want):
    assert sorted(got) == sorted(want)
    for tag, points in want.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in points], tag
        np.testing.assert_allclose([v for _, v in got[tag]], [v for _, v in points],
                                   rtol=1e-7, err_msg=tag)  # float32 on disk


def test_scalars_flattening():
    assert scalars(TRAIN) == {"responses": 64, "time_s": 2.5, "loss": -0.125, "clipped": 1,
                              "actor_grad_sqnorm_micro/0": 1.5,
                              "actor_grad_sqnorm_micro/1": 2.25}
    got = scalars(TRAIN2)
    assert got["ratio"] == 1.5 and got["clipped"] == 0 and got["actor_grad_sqnorm_micro/0"] == 3.0
    assert all(type(v) in (int, float) for v in got.values())  # plain numbers for W&B


def test_tensorboard_sees_the_records_scalars(tmp_path):
    run_dir = str(tmp_path)
    w = TensorBoardWriter(run_dir)
    for r in (TRAIN, EVAL, TRAIN2):
        w.write(r)
    w.close()
    got = read_tb(run_dir)
    assert_same(got, expected([TRAIN, EVAL, TRAIN2]))
    # train and eval of step 1 both there, the shared counters once
    assert got["score"] == [(1, 0.4375)] and got["loss"][0] == (1, -0.125)
    assert got["responses"] == [(1, 64.0), (2, 128.0)]
    assert not {"step", "kl/0", "note", "nested", "nan_metric"} & set(got)
    assert [s for s, _ in got["kl"]] == [2]  # None at step 1 skipped


def test_tensorboard_record_on_disk_before_close(tmp_path):
    """A kill right after write() loses nothing: no close, no flush by the caller."""
    w = TensorBoardWriter(str(tmp_path))
    w.write(TRAIN)
    assert read_tb(str(tmp_path))["loss"] == [(1, -0.125)]
    w.close()


def test_tensorboard_purge_on_resume(tmp_path):
    run_dir = str(tmp_path)
    w = TensorBoardWriter(run_dir)
    for s in range(1, 6):
        w.write({"step": s, "loss": float(s), "score": 10.0 * s})
    w.close()  # the crash; the checkpoint was at step 2
    w = TensorBoardWriter(run_dir, purge_step=3)  # within the same second: distinct file
    for s in (3, 4):
        w.write({"step": s, "loss": -float(s), "score": -10.0 * s})
    w.close()
    assert len(glob.glob(os.path.join(run_dir, "tensorboard", "*tfevents*"))) == 2
    got = read_tb(run_dir)
    assert got["loss"] == [(1, 1.0), (2, 2.0), (3, -3.0), (4, -4.0)]
    assert got["score"] == [(1, 10.0), (2, 20.0), (3, -30.0), (4, -40.0)]


def test_fresh_restart_purges_everything(tmp_path):
    """No checkpoint: the loop restarts at step 0, so purge_step=0 hides the old attempt."""
    run_dir = str(tmp_path)
    w = TensorBoardWriter(run_dir)
    for s in range(3):
        w.write({"step": s, "loss": 1.0})
    w.close()
    w = TensorBoardWriter(run_dir, purge_step=0)
    w.write({"step": 0, "loss": 2.0})
    w.close()
    assert read_tb(run_dir)["loss"] == [(0, 2.0)]


def test_make_writers_default_is_tensorboard_only(tmp_path):
    ws = make_writers(str(tmp_path), config={"lr": 1e-6})
    assert [type(w) for w in ws] == [TensorBoardWriter]
    write_all(ws, TRAIN)
    close_all(ws)
    assert read_tb(str(tmp_path))["loss"] == [(1, -0.125)]
    assert make_writers(str(tmp_path), tensorboard=False) == []


def test_missing_wandb_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(ImportError, match="pip install wandb"):
        WandbWriter("proj", str(tmp_path), {})
    with pytest.raises(ImportError, match="pip install wandb"):
        make_writers(str(tmp_path), wandb_project="proj")  # at construction, before training


def test_wandb_run_id_is_stable_per_run_dir(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert writers.wandb_run_id(a) == writers.wandb_run_id(a) != writers.wandb_run_id(b)


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    for k, v in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path),
                 "WANDB_CONFIG_DIR": str(tmp_path / "cfg"),
                 "WANDB_CACHE_DIR": str(tmp_path / "cache"),
                 "WANDB_DATA_DIR": str(tmp_path / "data"), "WANDB_DISABLE_GIT": "true",
                 "WANDB_DISABLE_CODE": "true"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    return wandb


def test_wandb_offline_run(tmp_path, wandb_offline):
    run_dir = str(tmp_path / "grpo_P8_G8_s0")
    ws = make_writers(run_dir, wandb_project="jaxrl-test", config={"lr": 1e-6})  # WANDB_MODE
    assert [type(w) for w in ws] == [WandbWriter, TensorBoardWriter]
    run = ws[0]._run
    assert run.id == writers.wandb_run_id(run_dir) and run.name == "grpo_P8_G8_s0"
    assert run.config["lr"] == 1e-6
    for r in (TRAIN, EVAL, TRAIN2):
        write_all(ws, r)
    assert run.summary["score"] == 0.4375  # step 1's row, committed once step 2 came
    assert run.summary["actor_grad_sqnorm_micro/1"] == 2.25
    close_all(ws)
    runs = glob.glob(os.path.join(run_dir, "wandb", f"offline-run-*-{run.id}"))
    assert len(runs) == 1 and glob.glob(os.path.join(runs[0], "*.wandb"))
    w = WandbWriter("jaxrl-test", run_dir, {"lr": 1e-6})  # the resume: the same W&B run
    assert w._run.id == run.id
    w.write({"step": 3, "loss": 0.5})
    w.close()
