import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from jaxrl_scale.data.rewards import (
    RewardFn,
    countdown_reward,
    exact_match,
    final_line,
    math_verify_reward,
    reward_for_task,
    verify_countdown,
)


def _flaky(response, example):
    """Module level so worker processes can import it."""
    if response == "raise":
        raise RuntimeError("boom")
    if response == "hang":
        time.sleep(30)
    if response == "nan":
        return float("nan")
    return 1.0


def test_exact_match():
    ex = {"answer": "81"}
    assert exact_match("81", ex) == 1.0
    assert exact_match("  81 <eos>junk", ex) == 1.0
    assert exact_match("81\n23+1=24", ex) == 1.0
    assert exact_match("81<|im_end|>", ex) == 1.0
    assert exact_match("811", ex) == 0.0
    assert exact_match("", ex) == 0.0
    assert exact_match("-5", {"answer": "-5"}) == 1.0
    assert final_line(" a b \nc") == "a b"


def test_countdown_verifier():
    nums, target = [3, 7, 25, 8], 46
    assert verify_countdown("3*7+25", nums, target)
    assert verify_countdown("(25-7)*3-8", nums, target)
    assert verify_countdown("25 + 3 * 7 = 46", nums, target)
    assert not verify_countdown("25+3*7=45", nums, target)
    assert not verify_countdown("3*7+24", nums, target)  # wrong value / number not given
    assert not verify_countdown("25+25-3-1", nums, target)  # 25 reused, 1 not given
    assert not verify_countdown("7*7-3", nums, target)  # reuse
    assert not verify_countdown("(25*8-7)/3", nums, 64)  # division not allowed
    assert not verify_countdown("-3+7*7", nums, target)  # unary minus not allowed
    assert not verify_countdown("__import__('os').system('true')", nums, target)
    assert verify_countdown("7*7-3", [7, 7, 3], target)  # duplicates in the given numbers
    ex = {"prompt": "nums 3 7 25 target 46:", "answer": "46", "numbers": "3 7 25"}
    assert countdown_reward("3*7+25<eos>", ex) == 1.0
    assert countdown_reward("3*7+25\nmore text", ex) == 1.0
    assert countdown_reward("3*7*25", ex) == 0.0
    no_numbers_field = {"prompt": ex["prompt"], "answer": "46"}
    assert countdown_reward("25+7*3", no_numbers_field) == 1.0


def test_math_verify_equivalences():
    assert math_verify_reward("1/2", {"answer": "0.5"}) == 1.0
    assert math_verify_reward("The answer is 0.5", {"answer": "\\frac{1}{2}"}) == 1.0
    assert math_verify_reward("so $\\boxed{\\sqrt{18}}$", {"answer": "3\\sqrt{2}"}) == 1.0
    assert math_verify_reward("6 * 3 = 18 dollars.\n#### 18", {"answer": "18"}) == 1.0
    assert math_verify_reward("The answer is 41.", {"answer": "42"}) == 0.0
    assert math_verify_reward("I don't know", {"answer": "2"}) == 0.0


def test_reward_fn_counts_failures_and_never_raises():
    r = RewardFn(_flaky)
    out = r.score_batch(["ok", "raise", "nan", "ok"], [{}] * 4)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [1, 0, 0, 1])
    assert (r.calls, r.failures, r.timeouts) == (4, 2, 0)
    # N = P*G responses against P examples, prompt-major.
    r2 = RewardFn(exact_match)
    out = r2.score_batch(["1", "2", "2", "2"], [{"answer": "1"}, {"answer": "2"}])
    np.testing.assert_array_equal(out, [1, 0, 1, 1])
    with pytest.raises(ValueError, match="do not match"):
        r2.score_batch(["1", "2", "3"], [{"answer": "1"}, {"answer": "2"}])


def test_reward_fn_thread_timeout_off_main_thread():
    r = RewardFn(_flaky, timeout_s=0.3)
    results = []
    t = threading.Thread(target=lambda: results.append(r.score_batch(["ok", "hang", "ok"], [{}])))
    start = time.monotonic()
    t.start()
    t.join(10)
    assert time.monotonic() - start < 5
    np.testing.assert_array_equal(results[0], [1, 0, 1])
    assert (r.failures, r.timeouts) == (1, 1)


def test_reward_fn_process_isolation_kills_hung_calls():
    r = RewardFn(_flaky, timeout_s=1.0, isolation="process", num_workers=2)
    try:
        out = r.score_batch(["ok", "hang", "raise", "ok", "ok"], [{}])
        np.testing.assert_array_equal(out, [1, 0, 0, 1, 1])
        assert (r.failures, r.timeouts) == (2, 1)
        np.testing.assert_array_equal(r.score_batch(["ok"] * 3, [{}]), [1, 1, 1])  # restarted
    finally:
        r.close()


def test_reward_for_task():
    assert reward_for_task("arithmetic").fn is exact_match
    assert reward_for_task("countdown").fn is countdown_reward
    with pytest.raises(ValueError, match="known"):
        reward_for_task("nope")
    r = reward_for_task("math_jsonl", timeout_s=20)
    try:
        assert r.isolation == "process"
        out = r.score_batch(["1/2", "\\boxed{0.5}", "7"], [{"answer": "0.5"}])
        np.testing.assert_array_equal(out, [1, 1, 0])
        assert r.failures == 0
    finally:
        r.close()


# ---------------------------------------------------------------------------------------------
# A reward is a finite real number; anything else is a counted failure scored 0.

_VALUES = [
    (True, 1.0), (False, 0.0), (1, 1.0), (0.25, 0.25), (np.float32(0.5), 0.5),
    (np.int64(-2), -2.0), (np.bool_(True), 1.0), (1e30, 1e30), (-3e38, -3e38),
    ("1.0", None), ("", None), (None, None), (float("nan"), None), (float("inf"), None),
    (-float("inf"), None), (4e38, None), (10 ** 400, None), ([1.0], None), (1 + 0j, None),
    (np.array([1.0, 2.0]), None), ({"r": 1}, None),
]


@pytest.mark.parametrize("value, want", _VALUES, ids=[repr(v)[:20] for v, _ in _VALUES])
def test_rewards_are_finite_real_numbers(value, want):
    """Strings (even "1.0"), None, NaN, inf, |r| beyond float32 and containers score 0 and
    count as failures (docs/usage.md: "an exception, a timeout or a non-number scores 0"); bools,
    ints, floats and numpy scalars are rewards, kept as float32."""
    r = RewardFn(lambda response, example: value)
    out = r.score_batch(["x", "y"], [{}])
    if want is None:
        np.testing.assert_array_equal(out, [0, 0])
        assert r.failures == 2 and "returned" in r.last_error
    else:
        np.testing.assert_array_equal(out, np.float32([want, want]))
        assert r.failures == 0


# ---------------------------------------------------------------------------------------------
# --reward_fn names code: only the user's own functions and the library's rewards.

_USER_MODULE = '''
import os
from subprocess import run
from jaxrl_scale.data.rewards import exact_match
system = os.system
evil = eval
def score(response, example):
    return float(response.strip() == str(example["answer"]))
def _private(response, example):
    return 1.0
class Scorer:
    def __call__(self, response, example):
        return 1.0
scorer = Scorer()
'''

_SPECS = [
    ("builtins:exec", "standard-library module 'builtins'"),
    ("builtins:eval", "standard-library module 'builtins'"),
    ("os:system", "standard-library module 'os'"),
    ("subprocess:run", "standard-library module 'subprocess'"),
    ("pickle:loads", "standard-library module 'pickle'"),
    ("antigravity:fly", "standard-library module 'antigravity'"),   # refused before import
    ("numpy:load", "site-packages"),
    ("jaxrl_scale.numbers:write_json", "not one of the library's rewards"),
    ("my_rw:system", "builtin_function_or_method, not a function"),
    ("my_rw:evil", "builtin_function_or_method, not a function"),
    ("my_rw:run", "standard-library module 'subprocess'"),           # re-exported
    ("my_rw:os", "module, not a function"),
    ("my_rw:scorer", "Scorer, not a function"),
    ("my_rw:__builtins__", "dict, not a function"),
    ("my_rw:score.__globals__", "not a function name"),
    ("my_rw:nothing", "has no function 'nothing'"),
    ("no_such_module_xyz:f", "cannot import"),
    ("nocolon", "not of the form"),
    ("my_rw:score", None), ("my_rw:_private", None), ("my_rw:exact_match", None),
    ("jaxrl_scale.data.rewards:exact_match", None),
]


@pytest.mark.parametrize("spec, refusal", _SPECS, ids=[s for s, _ in _SPECS])
def test_reward_fn_spec_allowlist(tmp_path, spec, refusal):
    """The working directory is importable without PYTHONPATH (as under the installed
    commands, whose sys.path has no ''), and nothing outside the user's own modules or the
    library's rewards is ever returned. Runs in a child: sys.path and imports stay clean."""
    (tmp_path / "my_rw.py").write_text(_USER_MODULE)
    code = ("import sys; sys.path[:] = [p for p in sys.path if p not in ('', sys.argv[2])]\n"
            "from jaxrl_scale.data.rewards import load_reward_fn\n"
            "try:\n"
            "    fn = load_reward_fn(sys.argv[1])\n"
            "    print('OK', fn(' 12', {'answer': '12'}))\n"
            "except ValueError as e:\n"
            "    print('REFUSED', e)\n"
            "print('antigravity' in sys.modules)\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(
        __file__))))    # this checkout's package; the module's directory is only the cwd
    res = subprocess.run([sys.executable, "-c", code, spec, str(tmp_path)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env=env)
    out = res.stdout.splitlines()
    assert res.returncode == 0 and len(out) == 2, res.stderr
    if refusal is None:
        assert out[0] == "OK 1.0", out
    else:
        assert out[0].startswith("REFUSED") and refusal in out[0], out
    assert out[1] == "False"          # a refused stdlib module is not even imported
