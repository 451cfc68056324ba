"""Multi-turn episodes in the slot engine (rl/partial_turns.py; sampling/engine.py `resume`):
a one-turn environment is today's single-turn slot-engine rollout exactly, greedy episodes
equal the synchronous multi-turn rollout's, observations are forced tokens (log-prob 0,
outside the assistant mask, a version each), the cached continuation equals one full forward
over the conversation, a broken environment ends only its own episode, and jaxrl-train runs
--env on the slot engine."""
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numerics import assert_tree_close, permute_mlp, reorder_floor, tree_norm
import env_helpers

from jaxrl_scale.experiment.config import TrainConfig, validate
from jaxrl_scale.models import forward, get_config, init_params
from jaxrl_scale.models.tokenizer import CharTokenizer, decode_response
from jaxrl_scale.rl.batch import rollout_batch
from jaxrl_scale.rl.multiturn import EnvRunner, ObservationCodec, mask_observations
from jaxrl_scale.rl.partial import PartialRollout
from jaxrl_scale.rl.partial_turns import EpisodePartialRollout, slot_rollout
from jaxrl_scale.rl.rollout import SamplingSettings, staleness_metrics
from jaxrl_scale.sampling import SamplingConfig
from jaxrl_scale.sampling import engine as engine_mod
from jaxrl_scale.sampling.engine import SlotEngine

TOK = CharTokenizer()
EXAMPLES = [{"prompt": "12+34=", "answer": "46"}, {"prompt": "7-5=", "answer": "2"},
            {"prompt": "40+22=", "answer": "62"}, {"prompt": "9+9=", "answer": "18"}]
P, G, M = 4, 2, 40
PROMPT_LEN = 8
# A turn ends at this id (the tiny random model emits it often, greedy and sampled), and the
# observation holds it: a forced token never ends a turn.
EOS = TOK.encode("c")[0]
OBS = "no c"
RUNNER = dict(max_turns=3, max_obs_tokens=8, max_prompt_len=PROMPT_LEN)
TURN = 6   # the per-turn cap of the asynchronous episodes


@pytest.fixture(scope="module")
def model():
    cfg = get_config("tiny")
    params = jax.tree.map(lambda a: a * 4.0 if a.ndim >= 2 else a, init_params(cfg, 0))
    return cfg, params


OneTurn = env_helpers.OneTurn


def first_char(text):
    return env_helpers.first_char(text, None)


class Talk(env_helpers.Talk):
    obs = OBS


def _engine(cfg, slots, temperature, eos=EOS, steps=4):
    return SlotEngine(cfg, slots=slots, prompt_len=PROMPT_LEN, max_new_tokens=M,
                      sampling=SamplingConfig(temperature), eos_id=eos, pad_id=TOK.pad_id,
                      steps_per_call=steps)


def _stream(examples=EXAMPLES):
    it = itertools.cycle(examples)
    return lambda: dict(next(it))


def test_one_turn_env_equals_single_turn_engine_rollout(model):
    """k = 2, staleness 1, three updates: identical tokens, log-probs, versions, lengths,
    prompts and round statistics; rewards are the environment's; the mask is every token.
    (max_turns 3: every turn end stops `advance`, which must change no decode step.)"""
    cfg, params = model
    want_pr = PartialRollout(_engine(cfg, 2 * P * G, 1.0, TOK.eos_id), _stream(),
                             TOK.encode_prompt, prompts_per_step=P, group_size=G,
                             max_staleness=1)
    runner = EnvRunner(OneTurn, timeout_s=30.0, **RUNNER)
    got_pr = slot_rollout(_engine(cfg, 2 * P * G, 1.0, TOK.eos_id), _stream(),
                          TOK.encode_prompt, env=runner, tokenizer=TOK, prompts_per_step=P,
                          group_size=G, max_staleness=1)
    assert isinstance(got_pr, EpisodePartialRollout)
    calls = 0
    for v in range(3):
        want = want_pr.next_batch(params, version=v, seed=v)
        got = got_pr.next_batch(params, version=v, seed=v)
        for f in ("tokens_BM", "logprobs_BM", "versions_BM", "lengths_B"):
            np.testing.assert_array_equal(getattr(got, f), getattr(want, f), err_msg=f)
        assert got.prompts == want.prompts and got.examples == want.examples
        np.testing.assert_equal((got.slot_occupancy, got.decode_steps),
                                (want.slot_occupancy, want.decode_steps))   # nan: no step
        np.testing.assert_array_equal(got.assistant_BM,
                                      np.arange(M)[None, :] < want.lengths_B[:, None])
        texts = [decode_response(TOK, t[:n]) for t, n in zip(want.tokens_BM, want.lengths_B)]
        np.testing.assert_array_equal(got.rewards_B, [first_char(t) for t in texts])
        st = got.fields()
        assert st["env_turns"] == 1.0 and st["env_obs_tokens"] == 0 and st["env_failures"] == 0
        assert st["staleness_max"] == want.fields()["staleness_max"]
        calls += st["engine_calls"]
    assert (want.lengths_B < M).any() and (want.lengths_B == M).any()   # EOS and the budget
    assert calls > 0


def _sync_and_engine(model, temperature):
    cfg, params = model
    s = SamplingSettings(SamplingConfig(temperature, 0, 1.0), M, EOS, TOK.pad_id, P * G)
    sync = EnvRunner(Talk, timeout_s=30.0, **RUNNER).rollout(cfg, params, EXAMPLES, G, TOK, s,
                                                             seed=0)
    pr = EpisodePartialRollout(_engine(cfg, P * G, temperature), _stream(),
                               EnvRunner(Talk, timeout_s=30.0, **RUNNER), TOK,
                               prompts_per_step=P, group_size=G, max_staleness=0)
    return sync, pr.next_batch(params, version=0, seed=0)


@functools.partial(jax.jit, static_argnums=0)
def _full_logprobs(cfg, params, seq, valid):
    logp = jax.nn.log_softmax(forward(cfg, params, seq, valid)[:, PROMPT_LEN - 1:-1], -1)
    return jnp.take_along_axis(logp, seq[:, PROMPT_LEN:, None], axis=-1)[..., 0]


def _conversation_logprobs(cfg, params, r):
    """Temperature-1 log-probs of the assistant tokens under one full (uncached) forward of
    the whole conversation: prompt, assistant turns and observations, left-padded."""
    B = len(r.prompts)
    seq, valid = np.zeros((B, PROMPT_LEN + M), np.int32), np.zeros((B, PROMPT_LEN + M), bool)
    for i, p in enumerate(r.prompts):
        seq[i, PROMPT_LEN - len(p):PROMPT_LEN] = p
        valid[i, PROMPT_LEN - len(p):PROMPT_LEN + int(r.lengths_B[i])] = True
    seq[:, PROMPT_LEN:] = np.where(valid[:, PROMPT_LEN:], r.tokens_BM, 0)
    return np.where(r.assistant_BM, np.asarray(_full_logprobs(cfg, params, seq, valid)), 0.0)


def test_greedy_episodes_equal_the_synchronous_rollout(model):
    """Every slot admitted at once (a synchronous round), greedy: the tokens, layout, rewards
    and env fields of rl/multiturn's rollout; log-probs equal to the float32 reordering floor
    of a forward (the observation is fed token by token on a ring here, on chunks there)."""
    cfg, params = model
    sync, got = _sync_and_engine(model, 0.0)
    for f in ("tokens_BM", "assistant_BM", "lengths_B", "rewards_B"):
        np.testing.assert_array_equal(getattr(got, f), getattr(sync, f), err_msg=f)
    assert got.prompts == sync.prompts
    for k in ("env_turns", "env_obs_tokens", "env_failures", "env_timeouts"):
        assert got.fields()[k] == sync.fields()[k], k
    assert 1 < got.fields()["env_turns"] <= 3 and got.fields()["env_obs_tokens"] > 0
    ref = _conversation_logprobs(cfg, params, sync)
    floor = reorder_floor(ref, _conversation_logprobs(cfg, permute_mlp(params), sync))
    assert_tree_close(got.logprobs_BM, sync.logprobs_BM, floor, tree_norm(ref))


@pytest.fixture(scope="module", params=[False, True], ids=["kept_kv", "recompute_kv"])
def async_batches(model, request):
    """k = 2, staleness 1, temperature 1: three updates of Talk episodes of 1 or 3 turns,
    each turn ending at EOS or after TURN tokens, rows running across updates (their KV kept,
    or rebuilt at each update: prompt, turns and the observation fed so far)."""
    cfg, params = model
    eng = _engine(cfg, 2 * P * G, 1.0)
    # the head batch of one-turn episodes returns while three-turn ones are in flight
    examples = [dict(e, turns=k) for k in (1, 3) for e in EXAMPLES]
    pr = EpisodePartialRollout(eng, _stream(examples), EnvRunner(Talk, timeout_s=30.0,
                                                                 turn_tokens=TURN, **RUNNER),
                               TOK, prompts_per_step=P, group_size=G, max_staleness=1,
                               recompute_kv=request.param)
    eng.warm(params, range(G, eng.B + 1, G), rebuild=request.param)   # as jaxrl-train does: `resume` included
    before = engine_mod.compile_count()
    batches = [pr.next_batch(params, version=v, seed=v) for v in range(3)]
    return batches, engine_mod.compile_count() - before


def _layout(tokens, n, obs):
    """The assistant mask a row must have: turns end at EOS or after TURN tokens; after each
    turn but the episode's last comes the observation."""
    mask, i, turns = np.zeros((M,), bool), 0, 0
    while i < n:
        start = i
        while i < n:
            mask[i] = True
            i += 1
            if tokens[i - 1] == EOS or i - start == TURN:
                break
        turns += 1
        if turns == 3 or i == n:
            break
        assert list(tokens[i:i + len(obs)]) == obs
        i += len(obs)
    assert i == n and turns <= 3
    return mask


def _turns(assistant_BM):
    """Assistant turns per row: runs of the mask (observations separate them)."""
    a = np.asarray(assistant_BM)
    return (a[:, 1:] & ~a[:, :-1]).sum(1) + a[:, 0]


def test_observations_are_forced_tokens_with_mask_0_and_a_version(async_batches):
    batches, compiles = async_batches
    obs = ObservationCodec(TOK).encode(OBS)
    assert EOS in obs and compiles == 0   # no shape per observation or turn length
    for v, b in enumerate(batches):
        for t, n, a in zip(b.tokens_BM, b.lengths_B, b.assistant_BM):
            np.testing.assert_array_equal(a, _layout(t, int(n), obs))
        within = np.arange(M)[None, :] < b.lengths_B[:, None]
        assert (b.logprobs_BM[within & ~b.assistant_BM] == 0).all()
        assert (b.logprobs_BM[b.assistant_BM] < 0).all()
        assert (b.assistant_BM <= within).all()
        assert staleness_metrics(b.versions_BM, b.lengths_B, v)["staleness_max"] <= 1
        vers = np.where(within, b.versions_BM, v)
        assert (np.diff(vers, axis=1)[within[:, 1:]] >= 0).all() and (vers <= v).all()
        batch, _ = rollout_batch(b.prompts, b.tokens_BM, b.logprobs_BM, b.lengths_B,
                                 b.rewards_B, prompt_len=PROMPT_LEN, pad_id=TOK.pad_id,
                                 group_size=G)
        batch = mask_observations(batch, b, PROMPT_LEN)
        np.testing.assert_array_equal(batch.loss_mask_BT[:, PROMPT_LEN:], b.assistant_BM)
        np.testing.assert_array_equal(b.rewards_B, _turns(b.assistant_BM))   # 1 per step
    obs_tokens = sum(int((~b.assistant_BM & (np.arange(M) < b.lengths_B[:, None])).sum())
                     for b in batches)
    assert obs_tokens > 0
    # some row's observation (and turns) were fed under a later version than its first turn
    assert any((b.versions_BM[:, :1] < b.versions_BM.max(1, keepdims=True)).any()
               for b in batches)


def test_continuation_equals_full_forward(model, async_batches):
    """Turns decoded after an observation (fed as forced tokens into the slot's ring columns,
    the prefix cache kept) have the log-probs of one full forward over the conversation, to
    the float32 reordering floor of that forward."""
    cfg, params = model
    batches, _ = async_batches
    for b in batches:
        ref = _conversation_logprobs(cfg, params, b)
        floor = reorder_floor(ref, _conversation_logprobs(cfg, permute_mlp(params), b))
        assert_tree_close(b.logprobs_BM, ref, floor, tree_norm(ref))


class Broken:
    """Behaviour by the example's "kind"; "ok" is Talk."""

    def __init__(self, example):
        self.kind, self.n = example["kind"], 0
        if self.kind == "init_raises":
            raise RuntimeError("cannot build")

    def reset(self):
        return "1+1="

    def step(self, text):
        self.n += 1
        if self.kind == "raises" or (self.kind == "raises_later" and self.n == 2):
            raise ValueError("bad step")
        if self.kind == "hangs" and self.n == 2:
            import time
            time.sleep(3.0)
        if self.kind == "long_obs":
            return "y" * 9, 0.0, False
        return OBS, 1.0, self.n >= 3


KINDS = ["ok", "init_raises", "raises", "raises_later", "hangs", "long_obs"]


def test_bad_environment_ends_only_its_episode(model):
    """Raising at construction, in the first or a later step, an observation over the cap
    and a step past the episode's time: each ends its own episode with reward 0, counted;
    the good episodes run all three turns, and the next batch runs."""
    cfg, params = model
    examples = [{"kind": k, "prompt": "1+1=", "answer": "2"} for k in KINDS]
    runner = EnvRunner(Broken, timeout_s=1.0, turn_tokens=4, **RUNNER)
    pr = EpisodePartialRollout(_engine(cfg, len(KINDS) * G, 1.0, eos=None, steps=8),
                               _stream(examples), runner, TOK, prompts_per_step=len(KINDS),
                               group_size=G, max_staleness=0)
    r = pr.next_batch(params, version=0, seed=0)
    ok = np.repeat([k == "ok" for k in KINDS], G)
    np.testing.assert_array_equal(r.rewards_B[~ok], 0.0)
    np.testing.assert_array_equal(r.rewards_B[ok], 3.0)
    st = r.fields()
    assert st["env_failures"] == (len(KINDS) - 1) * G and st["env_timeouts"] == G
    lens = r.lengths_B.reshape(len(KINDS), G)
    assert (lens[KINDS.index("init_raises")] == 0).all()
    assert (lens[KINDS.index("raises")] > 0).all()
    turns = _turns(r.assistant_BM).reshape(len(KINDS), G)
    assert (turns[KINDS.index("ok")] == 3).all() and (lens[KINDS.index("ok")] == 20).all()
    assert (turns[KINDS.index("raises_later")] == 2).all()
    pr.next_example = _stream(examples[:1])
    again = pr.next_batch(params, version=1, seed=1)
    assert again.fields()["env_failures"] == 0 and (again.rewards_B == 3.0).all()


def test_env_with_the_slot_engine_is_accepted():
    for flags in (dict(rollout="engine"), dict(gen_batch_ratio=2)):
        validate(TrainConfig.make(env="jaxrl_scale.data.envs:retry", **flags))


@pytest.mark.slow   # about a minute: a whole run's data, compiles and evals (-m slow)
def test_training_steps_with_env_on_the_slot_engine(tmp_path):
    """jaxrl-train's loop with --env on the slot engine (k = 2): two steps, each record with
    the env fields, the engine's fields and an update."""
    import json

    from jaxrl_scale.experiment.train import run_training
    cfg = TrainConfig.make(run_dir=str(tmp_path / "run"), data_dir=str(tmp_path / "data"),
                           model="tiny", num_train_examples=16, num_test_examples=4,
                           prompts_per_step=4, group_size=2, max_new_tokens=M, eval_every=5,
                           eval_prompts=4, eval_samples=2, max_steps=2, base_batch=8,
                           env="jaxrl_scale.data.envs:retry", env_max_turns=3,
                           env_max_obs_tokens=16, env_timeout_s=30.0, gen_batch_ratio=2)
    assert cfg.use_engine
    assert run_training(cfg, progress=False)["finished"]
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        train = [r for r in map(json.loads, f) if "score" not in r]
    assert [r["updates"] for r in train] == [1, 2]
    for r in train:
        assert {"env_turns", "env_obs_tokens", "env_s", "env_failures", "env_timeouts",
                "engine_calls", "slot_occupancy", "staleness_max"} <= set(r)
        assert r["env_failures"] == 0 and r["env_turns"] >= 1


def test_close_ends_the_episodes_in_flight(model):
    """Episodes admitted and not yet trained each hold a worker process under
    --env_isolation=process; close() (Run.close, at the end of jaxrl-train's loop) ends
    them, and their processes are gone."""
    cfg, params = model
    runner = EnvRunner(Talk, timeout_s=30.0, turn_tokens=TURN, isolation="process", **RUNNER)
    pr = EpisodePartialRollout(_engine(cfg, 2 * P * G, 1.0), _stream(), runner, TOK,
                               prompts_per_step=P, group_size=G, max_staleness=1)
    pr.next_batch(params, version=0, seed=0)
    pr._admit(params, 1)   # the next round's admissions: their environments have started
    pids = [r.ep.host.proc.pid for g in pr.pending for r in g.rows if r.ep.host is not None]
    assert pids and all(map(env_helpers.alive, pids))
    pr.close()
    assert not pr.pending and not any(map(env_helpers.alive, pids))


def test_run_close_closes_what_the_run_holds():
    """Run.close ends the slot engine's episodes and the reward thread, whichever exist."""
    from types import SimpleNamespace

    from jaxrl_scale.experiment.train import Run
    closed = []
    part = SimpleNamespace(close=lambda: closed.append("partial"))
    Run.close(SimpleNamespace(partial=part, scorer=SimpleNamespace(
        close=lambda: closed.append("scorer"))))
    Run.close(SimpleNamespace(partial=None, scorer=None))          # nothing to close
    Run.close(SimpleNamespace(partial=object(), scorer=None))      # a rollout without close
    assert closed == ["partial", "scorer"]
