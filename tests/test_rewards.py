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
