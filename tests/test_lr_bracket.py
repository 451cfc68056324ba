"""Issue 27 item 1: the lr grid is extended until its best value is interior."""
import math

from jaxrl_scale.scaling import lr_bracket as lb


def _score(opt):
    return lambda lr: -(math.log(lr) - math.log(opt)) ** 2


def test_optimum_below_the_grid_is_bracketed_by_extension():
    """The recorded case: the score falls monotonically over {1e-4, 2e-4, 3e-4}."""
    calls = []
    f = _score(2e-5)
    t = lb.tune(lambda lr: calls.append(lr) or f(lr), (1e-4, 2e-4, 3e-4), factor=2)
    assert t["bracketed"] and t["chosen"] == 2.5e-5
    assert t["bracket"] == [1.25e-5, 5e-5]
    assert t["grid"] == sorted(calls) and t["extensions"] == 3
    assert len(t["scores"]) == len(t["grid"])


def test_optimum_above_and_inside():
    t = lb.tune(_score(1e-3), (1e-4, 2e-4), factor=2)
    assert t["bracketed"] and t["chosen"] == 8e-4 and t["bracket"] == [4e-4, 1.6e-3]
    t = lb.tune(_score(2e-4), (1e-4, 2e-4, 4e-4))
    assert t["bracketed"] and t["extensions"] == 0 and t["chosen"] == 2e-4


def test_cap_leaves_it_unbracketed_and_failed_runs_count_as_worse():
    t = lb.tune(_score(1e-9), (1e-4, 2e-4), max_extensions=2)
    assert not t["bracketed"] and t["extensions"] == 2 and t["chosen"] == 2.5e-5
    # a diverged run (no score) above the best brackets it from above
    assert lb.is_bracketed({1e-4: 0.1, 2e-4: 0.3, 4e-4: None})
    assert lb.extension({1e-4: 0.3, 2e-4: 0.2}) == [5e-5]
    assert lb.from_lr_tune_file({"tuned": {"grpo": {"scores": {"0.0001": 0.24, "0.0002": 0.22,
                                                                "0.0003": 0.18}}}}
                                )["grpo"]["bracketed"] is False


def test_summary_and_report_carry_the_bracket(tmp_path):
    """lr_tune.json with the recorded monotone curve: summary.json lr_tuning is not bracketed
    and the report's first lines warn."""
    import json
    from jaxrl_scale.experiment.analyze import analyze_and_report
    from jaxrl_scale.scaling.synthetic import write_synthetic_run
    for b, spread in ((64, 0.1), (128, 0.2)):
        for k in (0, 1):
            write_synthetic_run(str(tmp_path), f"grpo_B{b}_sqrt_s{k}", b,
                                10000 * (1 + spread * k), 10, seed=k,
                                extra_config={"base_batch": 64})
    with open(tmp_path / "lr_tune.json", "w") as f:
        json.dump({"tuned": {"grpo": {"lr": 1e-4, "scores": {"0.0001": 0.24, "0.0002": 0.221,
                                                             "0.0003": 0.176}}}}, f)
    s = analyze_and_report(str(tmp_path), 0.1, n_boot=20)
    t = s["lr_tuning"]
    assert t["grid"] == [1e-4, 2e-4, 3e-4] and t["chosen"] == 1e-4 and not t["bracketed"]
    assert t["scores"] == [0.24, 0.221, 0.176]
    answer = open(s["report_path"]).read().split("## Answer", 1)[1].strip().splitlines()
    assert answer[0].startswith("- WARNING [grpo]: the tuned base lr 0.0001 is at the edge")
    assert any(ln.startswith("- Power [grpo]: with 2 seeds") for ln in answer[:3])


def test_sweep_extend_tuning_adds_the_lr_beyond_the_best_edge(tmp_path):
    """sweep.extend_tuning on finished tuning runs whose score falls with lr: one new run at
    1e-4 / 2; none once the grid brackets the best lr."""
    import json
    import os
    from jaxrl_scale.experiment import sweep as sw
    from jaxrl_scale.experiment.config import TrainConfig
    sweep = sw.SweepConfig(sweep_dir=str(tmp_path), tune_lrs=(1e-4, 2e-4, 3e-4))
    base = TrainConfig()

    def fake(cfgs, score):
        for c in cfgs:
            os.makedirs(c.run_dir, exist_ok=True)
            with open(os.path.join(c.run_dir, "metrics.jsonl"), "w") as f:
                for n in (0, 1000, 2000):
                    f.write(json.dumps({"step": n // 128, "responses": n,
                                        "score": score(c.optim.base_lr) * n / 2000}) + "\n")

    tune = sw.tune_plan(sweep, base)
    fake(tune, lambda lr: 0.3 - 100 * lr)
    more = sw.extend_tuning(sweep, base, tune)
    assert [c.optim.base_lr for c in more] == [5e-5] and "_lr5e-05" in more[0].run_dir
    fake(more, lambda lr: 0.1)
    assert sw.extend_tuning(sweep, base, tune + more) == []
    t = sw.choose_lrs(sweep, tune + more, 1)["grpo"]
    assert t["lr"] == 1e-4 and t["lr_tuning"]["bracketed"] and t["lr_tuning"]["extensions"] == 1


def test_retune_lr_per_batch_tunes_every_batch_and_runs_its_own_lr(tmp_path):
    """The source's recommendation as a study option: the grid at every batch, bracketed per
    batch, a "tuned" config per batch with that batch's best lr (exactly that lr), the cost
    recorded, and the report line comparing it with the sqrt rule."""
    import json
    import os
    from jaxrl_scale.experiment import sweep as sw
    from jaxrl_scale.experiment.config import TrainConfig
    from jaxrl_scale.optim import scaled_lr
    from jaxrl_scale.report.design import retune_lines
    from jaxrl_scale.scaling import lr_bracket
    sweep = sw.SweepConfig(sweep_dir=str(tmp_path), prompts=(8, 16, 32), base_prompts=16,
                           fixed_prompts=(), pairs=(), tune_lrs=(1e-4, 2e-4, 4e-4),
                           retune_lr_per_batch=True)
    base = TrainConfig()
    best = {64: 1e-4, 128: 2e-4, 256: 4e-4}          # known optimum per batch

    def fake(cfgs):
        for c in cfgs:
            B, lr = c.batch_train, c.optim.base_lr
            score = 0.3 - abs(math.log(lr / best[B]))   # peaks at best[B]
            os.makedirs(c.run_dir, exist_ok=True)
            with open(os.path.join(c.run_dir, "metrics.jsonl"), "w") as f:
                for n in (0, 1024, 2048):
                    f.write(json.dumps({"step": n // B, "responses": n, "time_s": n / 1000,
                                        "score": score * n / 2048, "eval_s": 2.0}) + "\n")

    tune = sw.tune_plan(sweep, base)
    assert sorted({c.batch_train for c in tune}) == [64, 128, 256] and len(tune) == 9
    assert {c.optim.lr_rule for c in tune if c.batch_train != 128} == {"tuned"}
    assert {os.path.basename(c.run_dir) for c in tune if c.batch_train == 128} == {
        "grpo_P16_G8_lr0.0001", "grpo_P16_G8_lr0.0002", "grpo_P16_G8_lr0.0004"}
    fake(tune)
    more = sw.extend_tuning(sweep, base, tune)     # 64's best is its grid's lowest, 256's top
    assert sorted((c.batch_train, c.optim.base_lr) for c in more) == [(64, 5e-5), (256, 8e-4)]
    fake(more)
    assert sw.extend_tuning(sweep, base, tune + more) == []
    lrs, runs = sw._tuned_plan(sweep, base, tune + more, 1)
    assert lrs["grpo"]["lr"] == 2e-4
    tuned = {c.batch_train: c for c in runs if c.optim.lr_rule == "tuned"}
    assert sorted(tuned) == [64, 256]               # at B0 the tuned config is the sqrt one
    for B, c in tuned.items():
        assert scaled_lr(c.optim.base_lr, B, c.optim.base_batch, "tuned") == best[B]
    # A batch whose tuned lr is the sqrt rule's lr there gets no config of its own: it would
    # repeat the sqrt config's runs bit for bit (and count twice in the Holm family).
    again = sw.plan(sweep, base, {"grpo": 2e-4},
                    {("grpo", 64): scaled_lr(2e-4, 64, 128, "sqrt"), ("grpo", 256): 4e-4})
    assert sorted({c.batch_train for c in again if c.optim.lr_rule == "tuned"}) == [256]
    assert len(again) == len(runs) - len(sweep.seeds)
    rec = json.load(open(os.path.join(str(tmp_path), sw.TUNE_FILE)))
    assert rec["tuned_per_batch"]["grpo"]["64"]["bracketed"]
    cost = rec["tuning_cost"]["grpo"]
    assert cost["64"] == {"runs": 4, "responses": 4 * 2048, "wall_s": 4 * (2.048 + 6.0)}
    ex = lr_bracket.read_tuning_extras(str(tmp_path))
    # The report line on a real Summary (a simulated sweep whose reference batch is 128) with
    # this sweep's tuning records.
    from jaxrl_scale.scaling import calibration as cal
    from jaxrl_scale.scaling.analysis import analyze
    import dataclasses
    import numpy as np
    s = analyze(cal.simulate_runs(cal.SAMPLED_3_SEEDS, np.random.default_rng(0)), "auto", n_boot=20)
    s = dataclasses.replace(s, lr_tuning_per_batch=ex["per_batch"], lr_tuning_cost=ex["cost"])
    (line,) = retune_lines(s)
    assert retune_lines(s.to_json()) == [line]      # the same from summary.json's dict
    assert line.startswith("Learning rate per batch [grpo] (re-tuned at every batch")
    assert "B=64: 0.0001 (sqrt rule: 0.000141)" in line and "B=256: 0.0004 (sqrt rule: 0.000283)" in line
    assert "Tuning cost: 11 runs" in line and "against 3 runs" in line
