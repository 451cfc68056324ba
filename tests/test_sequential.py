"""The sequential study (scaling/sequential.py): boundaries that spend exactly their error on
the joint normal, Holm inside the group-sequential design, the stops, one look equal to the
fixed design, error and power on simulated studies, and a replay of a recorded study."""
import math
import os

import numpy as np
import pytest
from scipy.stats import norm

from jaxrl_scale.scaling import calibration as cal
from jaxrl_scale.scaling import familywise
from jaxrl_scale.scaling import sequential as sq
from jaxrl_scale.scaling.calibration_sequential import sequential_rates, sequential_sweep

FRACTIONS = (0.5, 2 / 3, 1.0)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("kind", sq.SPENDING)
@pytest.mark.parametrize("alpha", [0.1, 0.025])
def test_boundaries_spend_the_declared_error_on_the_joint_normal(kind, alpha):
    # Z_k = S(t_k) / sqrt(t_k) for a Brownian motion S: the canonical joint normal.
    n = 400_000
    rng = np.random.default_rng(0)
    t = np.array(FRACTIONS)
    s = np.cumsum(rng.standard_normal((n, t.size)) * np.sqrt(np.diff(t, prepend=0)), 1)
    z = np.abs(s / np.sqrt(t))
    c = np.array(sq.boundaries(FRACTIONS, alpha, kind))
    crossed = np.cumsum(z >= c, 1) > 0
    for k in range(t.size):
        want = sq.spent(t[k], alpha, kind)
        got = crossed[:, k].mean()
        # Monte Carlo: 4 binomial SEs; the CDF's own error (abseps 1e-8) is far below.
        assert abs(got - want) <= 4 * math.sqrt(want * (1 - want) / n), (k, got, want)
    assert sq.spent(1.0, alpha, kind) == pytest.approx(alpha)


def test_one_look_is_the_fixed_test():
    assert sq.boundaries((1.0,), 0.1)[0] == pytest.approx(norm.ppf(0.95))
    # its t boundary is the fixed design's t quantile
    assert sq.t_boundary(norm.ppf(0.95), 7.5) == pytest.approx(familywise.t_ppf(0.95, 7.5))


def _hist(*ts, df=20.0):
    return [sq.Look(w, t * 0.1, 0.1, df) for w, t in zip((3, 4, 6), ts)]


def test_holm_step_down_frees_the_level_of_a_rejected_config():
    plan = sq.Plan(looks=(3, 4, 6))
    z2, z1 = plan.z(0.05)[-1], plan.z(0.1)[-1]
    t_between = (sq.t_boundary(z1, 20.0) + sq.t_boundary(z2, 20.0)) / 2  # passes at a, not a/2
    alone = sq.decide(plan, {"b": _hist(0, 0, t_between), "c": _hist(0, 0, 0.0)})
    assert alone["b"].verdict != "slower"
    with_strong = sq.decide(plan, {"a": _hist(0, 0, 50.0), "b": _hist(0, 0, t_between)})
    assert with_strong["a"].verdict == "slower" and with_strong["b"].verdict == "slower"
    assert with_strong["a"].look == 3 and with_strong["b"].blocks == 6


def test_early_looks_need_more_than_the_last():
    plan = sq.Plan(looks=(3, 4, 6))
    z = plan.z(0.1)
    assert z[0] > z[1] > z[2]     # O'Brien-Fleming type: early looks are strict
    t_last = sq.t_boundary(z[-1], 20.0) + 0.1
    d = sq.decide(plan, {"a": [sq.Look(3, -t_last * 0.1, 0.1, 20.0)]})
    assert d["a"].verdict == "open"       # enough at the end, not at the first look
    d = sq.decide(plan, {"a": [sq.Look(3, -0.1 * (sq.t_boundary(z[0], 20) + 0.1), 0.1, 20.0)]})
    assert d["a"].verdict == "faster" and d["a"].look == 1


def test_equivalence_futility_and_lower_bounds():
    plan = sq.Plan(looks=(3, 6))
    tight = sq.Look(3, 0.01, 0.01, 20.0)
    slow_ish = sq.Look(3, math.log(1.12), 0.05, 20.0)   # cannot be 10% faster; not shown slower
    cens = sq.Look(3, -0.3, 0.01, 20.0, censored=True)    # a lower bound below 0: says nothing
    d = sq.decide(plan, {"a": [tight], "b": [slow_ish], "c": [cens]})
    assert d["a"].verdict == "equivalent" and d["a"].stopped
    assert d["b"].verdict == "not faster by the margin"
    assert d["c"].verdict == "open" and not d["c"].stopped
    assert sq.open_configs(d, ["a", "b", "c"]) == ["c"]
    last = sq.decide(plan, {"c": [cens, sq.Look(6, -0.3, 0.01, 20.0, censored=True)]})
    assert last["c"].verdict == "undecided"
    high = sq.decide(plan, {"c": [sq.Look(3, 0.5, 0.01, 20.0, censored=True)]})
    assert high["c"].verdict == "slower"


def test_plan_rejects_bad_looks():
    for looks in ((), (4, 3), (1, 6)):
        with pytest.raises(ValueError):
            sq.Plan(looks=looks)
    with pytest.raises(ValueError):
        sq.Plan(spending="linear")


def test_a_single_look_gives_the_fixed_designs_verdicts():
    design = cal.DEFAULT
    rng = np.random.default_rng(3)
    n = 40
    est = cal.simulate_estimates(design, n, rng, {"grpo_P128_G8_sqrt": 1.3})
    units = cal.simulate_pass_units(design, rng, {}, n * 6).reshape(n, 6, 5, -1)
    names = [c[0] for c in design.configs]
    decided = 0
    for i in range(n):
        dec, _ = sequential_sweep(design, sq.Plan(looks=(6,), futility=None), est, units, i,
                                  0.9)
        configs, per_run, off, boff = cal.sweep_inputs(design, est, units, i, 0.9)
        fw = familywise.sweep_tests(configs, per_run, {}, {"grpo": names[0]}, 0.9,
                                    offsets=off, block_offsets=boff)
        for g in names[1:]:
            fixed = fw["configs"][g].verdict
            seq = dec[g].verdict
            assert (seq in ("faster", "slower")) == (fixed in ("faster", "slower")), (i, g)
            if fixed in ("faster", "slower"):
                assert seq == fixed
                decided += 1
    assert decided >= 10          # the comparison is not vacuous


def test_sequential_study_holds_the_error_rate_and_detects_a_cost():
    # 120 null studies of the default design (tau, machine-state shifts, 6 warm-starts x 2)
    # under the Pocock-type rule with five looks, the one that stops most often: a rule that
    # tested every look at alpha would name a false winner in about a quarter of them.
    plan = sq.Plan(looks=(2, 3, 4, 5, 6), spending="pocock")
    null = sequential_rates(cal.DEFAULT, plan, 120, seed=11)
    assert null["fwer_sequential"]["ci95"][0] <= 0.1
    assert null["fwer_sequential"]["rate"] <= 0.1 + 2.33 * math.sqrt(0.09 / 120)
    slow = sequential_rates(cal.DEFAULT, plan, 60, seed=12, r_N={"grpo_P128_G8_sqrt": 1.5})
    calls = slow["sequential"]["grpo_P128_G8_sqrt"]
    against = sum(calls.get(v, {"rate": 0.0})["rate"] for v in ("slower",
                                                                "not faster by the margin"))
    assert against >= 0.9 and calls["slower"]["rate"] >= 0.3   # slower, or stopped cheaper
    assert slow["cost"]["sequential"]["runs"] < slow["cost"]["fixed"]["runs"]


def test_replay_of_a_recorded_study_agrees_with_its_fixed_verdicts():
    from jaxrl_scale.scaling.analysis import load_runs
    from jaxrl_scale.scaling.replay import replay
    d = os.path.join(REPO, "results/main_job/logs")
    runs, _ = load_runs(d)
    one = replay(runs, sq.Plan(looks=(6,), futility=None), sweep_dir=d, n_boot=20)
    for g, x in one["decisions"].items():
        fixed = one["fixed"][g]
        assert (x.verdict in ("faster", "slower")) == (fixed in ("faster", "slower")), g
    r = replay(runs, sq.Plan(looks=(2, 3, 4, 5, 6), spending="pocock"), sweep_dir=d,
               n_boot=20)
    assert r["cost"]["fixed"]["runs"] == 60
    assert r["cost"]["sequential"]["runs"] <= r["cost"]["fixed"]["runs"]
    for g, x in r["decisions"].items():     # never the opposite of the whole study's verdict
        assert not (x.verdict == "faster" and r["fixed"][g] == "slower")
        assert not (x.verdict == "slower" and r["fixed"][g] == "faster")
