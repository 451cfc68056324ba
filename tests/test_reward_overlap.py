"""Rewards scored on a worker thread while decoding continues (rl/scoring.py, --reward_overlap):
the same rewards and failure counts as scoring after the rollout, and the scoring does start
before the decode ends."""
import threading
import time

import jax
import numpy as np
import pytest

from jaxrl_scale.data.reward_runner import RewardFn
from jaxrl_scale.experiment.config import TrainConfig
from jaxrl_scale.experiment.train import run_training
from jaxrl_scale.models import get_config, init_params
from jaxrl_scale.models.tokenizer import CharTokenizer
from jaxrl_scale.rl.partial import PartialRollout
from jaxrl_scale.rl.rollout import SamplingSettings, generate_rollout, score_rollout
from jaxrl_scale.rl.scoring import RewardScorer, scorer_for_run
from jaxrl_scale.sampling import SamplingConfig
from jaxrl_scale.sampling.engine import SlotEngine
from test_train import _records, tiny_cfg

TOK = CharTokenizer()
N = 10                                   # response cap of the engine tests
P, G = 4, 2


@pytest.fixture(scope="module")
def model():
    cfg = get_config("tiny")
    params = jax.tree.map(lambda a: a * 4.0 if a.ndim >= 2 else a, init_params(cfg, 0))
    return cfg, params


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data"))


def _flaky_digits(response, example):
    """Deterministic, mixed within groups, and failing on some responses: raises where the
    response's characters sum to 0 mod 3, else the share of them that are digits."""
    if sum(map(ord, response)) % 3 == 0:
        raise RuntimeError("a reward bug on this response")
    return sum(c.isdigit() for c in response) / max(len(response), 1)


def _partial(model, ratio, scorer, caps=None, staleness=1):
    """PartialRollout over a long-tail length distribution: a row's length is its example's
    cap (`caps` in admission order, else 1-2 tokens mostly and N for one group in five)."""
    cfg, _ = model
    rng = np.random.default_rng(0)
    stream = iter(range(10 ** 6))

    def next_example():
        i = next(stream)
        cap = caps[i] if caps else int(N if rng.random() < 0.2 else rng.integers(1, 3))
        return {"prompt": f"{i % 97}", "answer": str(i % 10), "cap": cap}

    eng = SlotEngine(cfg, slots=ratio * P * G, prompt_len=4, max_new_tokens=N, eos_id=None,
                     pad_id=TOK.pad_id, steps_per_call=2)
    return PartialRollout(eng, next_example, lambda s: [int(c) + 1 for c in s],
                          prompts_per_step=P, group_size=G, max_staleness=staleness,
                          limit_fn=lambda ex: ex["cap"], scorer=scorer)


def test_slot_engine_rewards_equal_scoring_after(model):
    """The slot engine with a scorer (k = 2, groups carried across updates): per update the
    same tokens as without one, and rewards and failure counts equal to score_rollout's on
    those rows; some responses fail, and they are counted the same."""
    _, params = model
    plain = _partial(model, 2, None)
    overlapped = _partial(model, 2, RewardScorer(TOK, RewardFn(_flaky_digits)))
    failures = 0
    for v in range(6):
        a = plain.next_batch(params, version=v, seed=v)
        b = overlapped.next_batch(params, version=v, seed=v)
        np.testing.assert_array_equal(a.tokens_BM, b.tokens_BM)
        assert a.rewards_B is None and a.reward_wait_s is None and b.reward_wait_s >= 0
        want, want_failed = score_rollout(a, TOK, RewardFn(_flaky_digits))
        np.testing.assert_array_equal(b.rewards_B, want)
        assert b.rewards_B.dtype == np.float32 and b.reward_failures == want_failed
        failures += want_failed
    assert failures > 0


@pytest.mark.parametrize("chunk", [3, 8, 64])
def test_chunked_generate_rewards_equal_scoring_after(model, chunk):
    """generate_rollout with a scorer: in several chunks (3 rows: chunks split groups) the
    rollout carries rewards and failures equal to score_rollout's, with the same tokens; in
    one chunk (64) nothing overlaps and it carries none."""
    cfg, params = model
    examples = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(5)]
    s = SamplingSettings(SamplingConfig(1.0, 0, 1.0), 6, TOK.eos_id, TOK.pad_id, chunk)
    seed = jax.random.PRNGKey(3)
    plain = generate_rollout(cfg, params, examples, 4, TOK.encode_prompt, s, seed=seed)
    got = generate_rollout(cfg, params, examples, 4, TOK.encode_prompt, s, seed=seed,
                           scorer=RewardScorer(TOK, RewardFn(_flaky_digits)))
    np.testing.assert_array_equal(plain.tokens_BM, got.tokens_BM)
    if chunk >= 20:
        assert got.rewards_B is None and got.reward_wait_s is None
        return
    want, want_failed = score_rollout(plain, TOK, RewardFn(_flaky_digits))
    np.testing.assert_array_equal(got.rewards_B, want)
    assert got.reward_failures == want_failed > 0 and got.reward_wait_s >= 0


def test_scoring_starts_while_the_engine_still_decodes(model):
    """One synchronous round (k = 1) of a short group and three long ones: the short group's
    scoring call starts on the scorer's thread before the round's last eng.advance returns,
    and is still under way while an advance runs. The advance after the first submission
    waits until the call has started (so the order is forced, not a matter of timing), and
    the call waits until that advance returned: a scorer that scored after the decode, or
    inline, would time out and fail."""
    _, params = model
    started, advanced = threading.Event(), threading.Event()
    log = {"calls": [], "returns": []}

    def reward(response, example):
        if not started.is_set():
            log["calls"].append((time.perf_counter(), threading.current_thread()))
            started.set()
            log["overlapped"] = advanced.wait(30)   # an advance ran while this call ran
        return 1.0

    scorer = RewardScorer(TOK, RewardFn(reward))
    submit = scorer.submit
    submitted = threading.Event()

    def spy_submit(*a, **kw):
        submitted.set()
        return submit(*a, **kw)

    scorer.submit = spy_submit
    pr = _partial(model, 1, scorer, caps=[1, N, N, N], staleness=0)
    eng, advance = pr.engine, pr.engine.advance

    def spy_advance(*a, **kw):
        after_submit = submitted.is_set()
        if after_submit:
            started.wait(30)
        out = advance(*a, **kw)
        if after_submit:
            advanced.set()
        log["returns"].append(time.perf_counter())
        return out

    eng.advance = spy_advance
    r = pr.next_batch(params, version=0, seed=0)
    assert log["calls"] and log.get("overlapped") is True
    first_call, thread = log["calls"][0]
    assert thread is not threading.main_thread()
    assert first_call < log["returns"][-1]
    np.testing.assert_array_equal(r.rewards_B, np.ones(P * G, np.float32))


def test_scorer_only_where_overlap_applies(tmp_path, data_dir):
    """--reward_overlap=false and --env score after the rollout (no scorer)."""
    cfg = tiny_cfg(tmp_path, data_dir)
    assert cfg.reward_overlap and isinstance(scorer_for_run(cfg, TOK, None), RewardScorer)
    assert scorer_for_run(cfg.replace(reward_overlap=False), TOK, None) is None
    assert scorer_for_run(cfg.replace(env="jaxrl_scale.data.envs:retry"), TOK, None) is None
    assert TrainConfig().reward_overlap


def _strip_times(recs):
    return [{k: v for k, v in r.items() if not k.endswith("_s")} for r in recs]


@pytest.mark.parametrize("kw", [dict(rollout="engine", gen_batch_ratio=2),
                                dict(generate_chunk=6)],
                         ids=["engine_k2", "generate_chunks"])
def test_train_steps_equal_with_and_without_overlap(tmp_path, data_dir, kw):
    """Two steps and their evals with a reward that fails on some responses: every logged
    value but the timings equal with --reward_overlap on and off (reward_failures included);
    only the overlapped run records reward_wait_s. generate_chunk=6: the step's 16 rows and
    the eval's in chunks of 6 (groups split across chunks)."""
    recs = {}
    for on in (True, False):
        cfg = tiny_cfg(tmp_path / f"on{on}", data_dir, max_steps=2, eval_every=2,
                       reward_fn=f"{__name__}:_flaky_digits", reward_overlap=on, **kw)
        run_training(cfg, progress=False)
        recs[on] = _records(cfg.run_dir)
    assert _strip_times(recs[True]) == _strip_times(recs[False])
    train = [r for r in recs[True] if "actor_loss" in r]
    assert len(train) == 2 and all(r["reward_wait_s"] >= 0 for r in train)
    assert not any("reward_wait_s" in r for r in recs[False])
    assert train[-1]["reward_failures"] > 0


def test_reward_calls_from_two_threads_run_one_at_a_time():
    """RewardFn and BatchReward (the remote rewards' base) take one score_counted call at a
    time, whichever thread makes it, so each call's failure count is its own: the scorer's
    worker and an eval on the main thread never share the reward's workers or counters."""
    from jaxrl_scale.data.remote_rewards import BatchReward
    active, most = [0], [0]
    lock = threading.Lock()

    def fn(response, example):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.002)
        with lock:
            active[0] -= 1
        if response.startswith("x"):
            raise RuntimeError("fails")
        return 1.0

    class Batch(BatchReward):
        def _score(self, pairs):
            out = []
            for r, e in pairs:
                try:
                    out.append(fn(r, e))
                except RuntimeError:
                    self._fail(1, "fails")
                    out.append(None)
            return out

    for reward in (RewardFn(fn), RewardFn(fn, timeout_s=10.0), Batch("b")):
        most[0] = 0
        jobs = {k: [("x" if i < k else "y") + str(i) for i in range(20)] for k in (3, 7)}
        got = {}
        threads = [threading.Thread(target=lambda k=k: got.__setitem__(
            k, reward.score_counted(jobs[k], [{}] * 20))) for k in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert most[0] == 1, reward
        assert {k: f for k, (_, f) in got.items()} == {3: 3, 7: 7}
        assert reward.failures == 10 and reward.seconds > 0
