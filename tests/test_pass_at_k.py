"""pass@k and avg@k of the sampled eval (experiment/records.py: pass_at_k, pass_k_fields) and
the --pass_k flag's checks (docs/science.md, pass@k and avg@k). Numpy only; the eval record
of a real run is checked in tests/test_scalerl_losses.py (one run with every new flag on)."""
import itertools
import math

import numpy as np
import pytest

from jaxrl_scale.experiment.config import TrainConfig, validate
from jaxrl_scale.experiment.errors import ConfigError
from jaxrl_scale.experiment.records import pass_at_k, pass_k_fields


def _brute_pass_at_k(n: int, c: int, k: int) -> float:
    """The share of the C(n, k) k-subsets of n samples (the first c correct) holding one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_pass_at_k_is_the_share_of_k_subsets_with_a_correct_sample(n):
    for k in range(1, n + 1):
        c_P = np.arange(n + 1)
        got = pass_at_k(n, c_P, k)
        want = [_brute_pass_at_k(n, c, k) for c in c_P]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12, err_msg=f"n={n} k={k}")


def test_pass_at_k_closed_form_and_limits():
    # 1 - C(n - c, k) / C(n, k), by hand: n = 10, c = 3, k = 4: 1 - C(7, 4) / C(10, 4)
    assert pass_at_k(10, [3], 4)[0] == pytest.approx(1 - 35 / 210, abs=1e-15)
    assert pass_at_k(10, [3], 1)[0] == pytest.approx(0.3, abs=1e-15)     # pass@1 = c / n
    assert pass_at_k(10, [7, 8], 4).tolist() == [1.0, 1.0]                # n - c < k
    assert pass_at_k(10, [0], 10)[0] == 0.0
    # large n: no binomial coefficient is formed (C(1000, 500) overflows float64)
    got = pass_at_k(1000, [1], 500)[0]
    assert got == pytest.approx(0.5, abs=1e-12)
    assert math.isfinite(pass_at_k(1000, [10], 500)[0])
    for k in (0, 11):
        with pytest.raises(ValueError, match="1 <= k <= n"):
            pass_at_k(10, [1], k)


def test_pass_k_fields_means_and_standard_errors_over_prompts():
    ok_PN = np.array([[1, 0, 0, 0],      # c = 1: pass@2 = 1 - C(3,2)/C(4,2) = 1/2
                      [1, 1, 0, 0],      # c = 2: pass@2 = 1 - 1/6 = 5/6
                      [0, 0, 0, 0]], bool)
    got = pass_k_fields(ok_PN, (1, 2))
    p2 = np.array([0.5, 5 / 6, 0.0])
    avg = np.array([0.25, 0.5, 0.0])
    want = {"pass@1": avg.mean(), "pass@1_se": avg.std(ddof=1) / np.sqrt(3),
            "avg@1": avg.mean(), "avg@1_se": avg.std(ddof=1) / np.sqrt(3),
            "pass@2": p2.mean(), "pass@2_se": p2.std(ddof=1) / np.sqrt(3),
            "avg@2": avg.mean(), "avg@2_se": avg.std(ddof=1) / np.sqrt(3)}
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k] == pytest.approx(v, abs=1e-12), k
    assert pass_k_fields(ok_PN, ()) == {}
    one = pass_k_fields(ok_PN[:1], (1,))
    assert one["pass@1"] == 0.25 and one["pass@1_se"] is None     # one prompt: no spread


@pytest.mark.parametrize("kw, match", [
    (dict(pass_k=(1, 8)), r"^pass_k: k=8 is outside 1\.\.eval_samples=4 .*raise --eval_samples"),
    (dict(pass_k=(0,)), r"^pass_k: k=0 .*Fix: use k >= 1"),
    (dict(pass_k=(2, 2)), r"^pass_k: lists a k twice"),
    (dict(pass_k=("x",)), r"^pass_k: must be integers"),
    (dict(pass_k=(1,), eval_mode="exact"), r"^pass_k: .*--eval_mode=exact"),
])
def test_pass_k_flag_is_checked_before_any_work(kw, match):
    with pytest.raises(ConfigError, match=match):
        validate(TrainConfig.make(**kw))


def test_pass_k_round_trips_and_defaults_to_none():
    assert TrainConfig().pass_k == ()
    cfg = TrainConfig.make(pass_k="1,4", eval_samples=4)
    assert cfg.pass_k == (1, 4)
    validate(cfg)
    assert TrainConfig.from_json(cfg.to_json()) == cfg      # a JSON list on resume: equal
