"""Multi-turn rollouts (--env, rl/multiturn.py; sampling/turns.py): a one-turn environment is
today's single-turn rollout bit for bit, the KV-cache continuation equals a full forward over
the whole conversation, observations never enter the loss, and a broken environment ends only
its own episode, under either isolation (a thread, or a worker process that is killed)."""
import functools
import multiprocessing
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import env_helpers
from env_helpers import OBS, RELEASE, Broken, Echo, OneTurn, Talk, first_char
from numerics import assert_tree_close, permute_mlp, reorder_floor, tree_norm

from jaxrl_scale.data import envs
from jaxrl_scale.data.reward_runner import RewardFn
from jaxrl_scale.experiment.config import ConfigError, TrainConfig, validate
from jaxrl_scale.models import forward, get_config, init_params
from jaxrl_scale.models.tokenizer import CharTokenizer
from jaxrl_scale.rl import steps
from jaxrl_scale.rl.batch import rollout_batch
from jaxrl_scale.rl.multiturn import (EnvRollout, EnvRunner, ObservationCodec, env_for_run,
                                      load_env_factory, mask_observations, score_episodes)
from jaxrl_scale.rl.rollout import SamplingSettings, generate_rollout, score_rollout
from jaxrl_scale.sampling import SamplingConfig

TOK = CharTokenizer()
EXAMPLES = [{"prompt": "12+34=", "answer": "46"}, {"prompt": "7-5=", "answer": "2"},
            {"prompt": "40+22=", "answer": "62"}, {"prompt": "9+9=", "answer": "18"}]
G, M = 2, 40
PROMPT_LEN = 8
# One runner shape for every test (8 rows in calls of 4, M, the turn and observation caps),
# so the conversation functions compile once for the file; each turn samples TURN tokens.
RUNNER = dict(max_turns=3, max_obs_tokens=16, max_prompt_len=PROMPT_LEN)
TURN = 2
# XLA's CPU optimisations dominate the update's compile time here and change no number the
# test compares (both batches go through the same compiled step)
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


@pytest.fixture(scope="module")
def model():
    cfg = get_config("tiny")
    # a larger init scale than N(0, 0.02) gives peaked, tie-free next-token distributions
    params = jax.tree.map(lambda a: a * 4.0 if a.ndim >= 2 else a, init_params(cfg, 0))
    return cfg, params


def settings(chunk=4, eos=False, budget=M):
    """eos=False: turns end at their token cap only (a random tiny model samples EOS at
    random, which would make the turn layout the tests check a matter of chance)."""
    return SamplingSettings(SamplingConfig(1.0, 0, 1.0), budget, TOK.eos_id if eos else None,
                            TOK.pad_id, chunk)


def test_one_turn_env_equals_single_turn_rollout(model):
    """Same tokens, log-probs, lengths, rewards, update batch and loss as generate_rollout
    with the same reward as a reward function, in two chunks (fold_in seeds per chunk)."""
    cfg, params = model
    s = settings(eos=True)
    seed = jax.random.PRNGKey(5)
    want = generate_rollout(cfg, params, EXAMPLES, G, TOK.encode_prompt, s, seed=seed)
    want_r, _ = score_rollout(want, TOK, RewardFn(first_char))
    runner = EnvRunner(OneTurn, timeout_s=30.0, **RUNNER)
    got = runner.rollout(cfg, params, EXAMPLES, G, TOK, s, seed=seed)
    got_r, failed = score_episodes(got, TOK, None)
    for f in ("tokens_BM", "logprobs_BM", "lengths_B"):
        np.testing.assert_array_equal(getattr(got, f), getattr(want, f))
    np.testing.assert_array_equal(got_r, want_r)
    assert failed == 0 and got.prompts == want.prompts and got.assistant_BM.sum() == \
        want.lengths_B.sum()
    assert 0 < got_r.sum() < len(got_r)
    st = got.fields()
    assert st["env_turns"] == 1.0 and st["env_failures"] == 0 and st["env_obs_tokens"] == 0

    def batch_of(r, rewards):
        b, _ = rollout_batch(r.prompts, r.tokens_BM, r.logprobs_BM, r.lengths_B, rewards,
                             prompt_len=PROMPT_LEN, pad_id=TOK.pad_id, group_size=G)
        return mask_observations(b, r, PROMPT_LEN)

    b_got, b_want = batch_of(got, got_r), batch_of(want, want_r)
    for f in ("tokens_BT", "valid_BT", "loss_mask_BT", "old_logp_BT", "rewards_B"):
        np.testing.assert_array_equal(getattr(b_got, f), getattr(b_want, f))
    step = steps.make_train_step(steps.grpo_step, donate=False, cfg=cfg, tx=optax.adam(1e-3),
                                 loss_cfg=steps.LossConfig(temperature=1.0), group_size=G,
                                 compiler_options=FAST_COMPILE)
    from jaxrl_scale.rl.state import create_train_state
    loss = [step(create_train_state(params, optax.adam(1e-3), 0),
                 jax.tree.map(jnp.asarray, b))[1] for b in (b_got, b_want)]
    loss = jax.device_get(loss)
    assert loss[0].keys() == loss[1].keys() and np.isfinite(loss[0]["actor_loss"])
    for k in loss[0]:
        np.testing.assert_array_equal(loss[0][k], loss[1][k], err_msg=k)


def _conversation_logprobs(cfg, params, r):
    """Temperature-1 log-probs of every response token under one full (uncached) forward of
    the whole conversation: prompt, assistant turns and observations, left-padded."""
    B = len(r.prompts)
    T = PROMPT_LEN + M
    seq, valid = np.zeros((B, T), np.int32), np.zeros((B, T), bool)
    for i, p in enumerate(r.prompts):
        seq[i, PROMPT_LEN - len(p):PROMPT_LEN] = p
        valid[i, PROMPT_LEN - len(p):PROMPT_LEN + int(r.lengths_B[i])] = True
    seq[:, PROMPT_LEN:] = np.where(valid[:, PROMPT_LEN:], r.tokens_BM, 0)

    return np.where(r.assistant_BM, np.asarray(_full_logprobs(cfg, params, seq, valid)), 0.0)


@functools.partial(jax.jit, static_argnums=0)
def _full_logprobs(cfg, params, seq, valid):
    logp = jax.nn.log_softmax(forward(cfg, params, seq, valid)[:, PROMPT_LEN - 1:-1], -1)
    return jnp.take_along_axis(logp, seq[:, PROMPT_LEN:, None], axis=-1)[..., 0]


def test_continuation_equals_full_forward_and_masks_observations(model):
    """Turns 2 and 3 decode from the cached prefix (only the observation is fed): their
    behaviour log-probs equal the full forward's over the whole conversation, to the float32
    reordering floor of that forward (the MLP's units permuted, numerics.permute_mlp). The
    update's loss mask is exactly the assistant tokens: no observation token in it."""
    cfg, params = model
    runner = EnvRunner(Talk, timeout_s=30.0, turn_tokens=TURN, **RUNNER)
    r = runner.rollout(cfg, params, EXAMPLES, G, TOK, settings(), seed=11)
    obs = ObservationCodec(TOK).encode(OBS)
    st = r.fields()
    assert st["env_turns"] == 3.0 and st["env_obs_tokens"] == 2 * len(obs)
    used = 3 * TURN + 2 * len(obs)
    np.testing.assert_array_equal(r.lengths_B, used)
    np.testing.assert_array_equal(r.rewards_B, 3.0)
    # layout: TURN assistant tokens, the observation, TURN, the observation, TURN
    turn = [True] * TURN + [False] * len(obs)
    want_mask = np.array(turn + turn + [True] * TURN + [False] * (M - used))
    np.testing.assert_array_equal(r.assistant_BM, np.broadcast_to(want_mask, r.tokens_BM.shape))
    np.testing.assert_array_equal(r.tokens_BM[:, TURN:TURN + len(obs)], np.broadcast_to(
        obs, (len(r.prompts), len(obs))))
    np.testing.assert_array_equal(r.logprobs_BM[~r.assistant_BM], 0.0)

    ref = _conversation_logprobs(cfg, params, r)
    ref_p = _conversation_logprobs(cfg, permute_mlp(params), r)
    assert_tree_close(r.logprobs_BM, ref, reorder_floor(ref, ref_p), tree_norm(ref))

    batch, _ = rollout_batch(r.prompts, r.tokens_BM, r.logprobs_BM, r.lengths_B, r.rewards_B,
                             prompt_len=PROMPT_LEN, pad_id=TOK.pad_id, group_size=G)
    batch = mask_observations(batch, r, PROMPT_LEN)
    obs_BT = np.zeros_like(batch.loss_mask_BT)
    obs_BT[:, PROMPT_LEN:] = ~r.assistant_BM & (np.arange(M) < r.lengths_B[:, None])
    assert obs_BT.sum() == len(r.prompts) * 2 * len(obs)
    assert not (batch.loss_mask_BT & obs_BT).any()
    assert batch.valid_BT[obs_BT].all()     # observations are context: the policy reads them
    np.testing.assert_array_equal(batch.loss_mask_BT[:, PROMPT_LEN:], r.assistant_BM)


KINDS = ["ok", "init_raises", "reset_type", "raises", "hangs", "wrong_types", "huge",
         "long_obs"]


def test_bad_environments_end_only_their_episode(model):
    """Raising (at construction or in step), a wrong type from reset or step, an observation
    over the cap (huge, or one token over --env_max_obs_tokens) and one that hangs past the
    episode's time: each ends its own episode with reward 0, counted; the
    good episodes run all their turns and the runner keeps working."""
    cfg, params = model
    examples = [{"kind": k, "prompt": "1+1=", "answer": "2"} for k in KINDS]
    runner = EnvRunner(Broken, timeout_s=2.0, turn_tokens=TURN, **RUNNER)
    try:
        r = runner.rollout(cfg, params, examples, 1, TOK, settings(), seed=0)
    finally:
        RELEASE.set()
    ok = np.array([k == "ok" for k in KINDS])
    np.testing.assert_array_equal(r.rewards_B[ok], 1.5)
    np.testing.assert_array_equal(r.rewards_B[~ok], 0.0)
    st = r.fields()
    assert st["env_failures"] == len(KINDS) - 1 and st["env_timeouts"] == 1
    assert runner.failures == len(KINDS) - 1
    assert st["env_s"] >= 1.5          # the hung call was waited on for the episode's budget
    lens = r.lengths_B
    assert (lens[[KINDS.index("init_raises"), KINDS.index("reset_type")]] == 0).all()
    assert (lens[ok] == 3 * TURN + 2 * len(OBS)).all()
    RELEASE.clear()
    again = runner.rollout(cfg, params, [examples[0]] * 8, 1, TOK, settings(), seed=1)
    assert (again.rewards_B == 1.5).all() and again.fields()["env_failures"] == 0


# Rows in calls of 4: the thread test's broken kinds, plus a call that sleeps for good (the
# hang is killed, not abandoned) and a process that exits, beside 8 healthy episodes. The last
# call holds the exit alone, so its error is the rollout's last.
PROCESS_ROWS = ["ok", "init_raises", "ok", "reset_type", "ok", "raises", "ok", "sleeps",
                "wrong_types", "huge", "long_obs", "ok", "ok", "exits", "ok", "ok"]


def test_process_isolation_kills_a_hung_environment_and_ends_only_its_episode(model, tmp_path):
    """--env_isolation=process: a step that sleeps for good is killed when the episode's time
    is up (reward 0, one env_timeout; its process, and the one it started, are gone after the
    rollout); a process that calls os._exit(1) ends only its episode (a failure, not a
    timeout); raising, wrong types and observations over the cap count as under threads. The
    healthy episodes' tokens, log-probs and rewards equal those of a run where every
    environment is healthy, no worker process is left, and the runner keeps working."""
    cfg, params = model
    rows = [{"kind": k, "prompt": "1+1=", "answer": "2", "pid_dir": str(tmp_path)}
            for k in PROCESS_ROWS]
    runner = EnvRunner(Broken, timeout_s=2.0, turn_tokens=TURN, isolation="process", **RUNNER)
    r = runner.rollout(cfg, params, rows, 1, TOK, settings(), seed=0)
    assert multiprocessing.active_children() == []
    for kind in ("sleeps", "sleeps_child", "exits", "ok"):
        assert not env_helpers.alive(int((tmp_path / kind).read_text())), kind
    st = r.fields()
    bad = len(PROCESS_ROWS) - PROCESS_ROWS.count("ok")
    assert st["env_failures"] == runner.failures == bad and st["env_timeouts"] == 1
    assert "process died (exit code 1)" in runner.last_error
    assert st["env_s"] >= 1.5          # the sleeping call was waited on for the episode's budget
    ok = np.array([k == "ok" for k in PROCESS_ROWS])
    np.testing.assert_array_equal(r.rewards_B[~ok], 0.0)
    healthy = runner.rollout(cfg, params, [dict(rows[0])] * len(rows), 1, TOK, settings(),
                             seed=0)
    assert healthy.fields()["env_failures"] == 0 and (healthy.rewards_B == 1.5).all()
    for f in ("tokens_BM", "logprobs_BM", "lengths_B", "assistant_BM", "rewards_B"):
        np.testing.assert_array_equal(getattr(r, f)[ok], getattr(healthy, f)[ok], err_msg=f)
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("factory", [Echo, envs.retry, envs.calc],
                         ids=["echo", "retry", "calc"])
def test_thread_and_process_isolation_give_the_same_rollout(model, factory):
    """A well-behaved environment (episodes of different lengths; the built-in ones) gives the
    same tokens, log-probs, observations and rewards on threads and in worker processes."""
    cfg, params = model
    got = {}
    for isolation in ("thread", "process"):
        runner = EnvRunner(factory, timeout_s=30.0, turn_tokens=TURN, isolation=isolation,
                           **RUNNER)
        got[isolation] = runner.rollout(cfg, params, EXAMPLES, G, TOK, settings(), seed=3)
    a, b = got["thread"], got["process"]
    for f in ("tokens_BM", "logprobs_BM", "lengths_B", "assistant_BM", "rewards_B"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    assert a.prompts == b.prompts
    fa, fb = a.fields(), b.fields()
    assert fa.pop("env_s") >= 0 and fb.pop("env_s") >= 0 and fa == fb
    assert fa["env_failures"] == 0
    if factory is Echo:   # episodes end at different turns: some rows sit out later turns
        assert 1 < fa["env_turns"] < 3 and len(set(a.lengths_B)) > 1
    if factory is envs.calc:
        assert fa["env_tool_calls"] == 0.0   # the count crosses from the worker process
    assert multiprocessing.active_children() == []


def test_process_isolation_is_the_default_for_a_users_module_and_needs_a_loadable_factory():
    user = "tests.env_helpers:Echo"
    for env, flags, want in ((user, dict(), "process"),
                             ("jaxrl_scale.data.envs:retry", dict(), "thread"),
                             (user, dict(env_isolation="thread"), "thread"),
                             ("jaxrl_scale.data.envs:retry", dict(env_isolation="process"),
                              "process")):
        cfg = TrainConfig.make(env=env, **flags)
        assert env_for_run(cfg, TOK, PROMPT_LEN).isolation == want, (env, flags)
    with pytest.raises(ValueError, match="top level"):
        EnvRunner(lambda example: Echo(example), isolation="process")
    with pytest.raises(ValueError, match="isolation"):
        EnvRunner(Echo, isolation="fork")
    EnvRunner(lambda example: Echo(example), isolation="thread")   # threads take any callable


_ORPHAN = """
import os, sys, time
from env_helpers import Broken
from jaxrl_scale.data.env_runner import ProcessHosts
hosts = ProcessHosts(Broken, 512)
hs = hosts.open(1)
for op in [("reset", {"kind": "sleeps"}), ("step", "a")]:   # the second step sleeps
    assert hosts.call(hs, [op], [60.0])[0].error is None
hs[0].conn.send(("step", "b"))
time.sleep(0.5)
print(hs[0].proc.pid, flush=True)
os._exit(0)   # the runner dies in the middle of the call, cleaning nothing up
"""


def test_a_worker_process_outlives_no_runner():
    """A worker stuck in a call exits on its own once the runner is gone (killed, crashed)."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(here), here, os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-c", _ORPHAN], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    pid = int(res.stdout.split()[-1])
    end = time.monotonic() + 30
    while env_helpers.alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    assert not env_helpers.alive(pid)


def test_retry_env_example_runs(model):
    """The docs' example environment (data/envs.py), loaded as --env loads it: a wrong answer
    gets "wrong, try again" up to TRIES answers; a right one ends the episode with reward 1."""
    factory = load_env_factory("jaxrl_scale.data.envs:retry")
    env = factory(EXAMPLES[0])
    assert env.reset() == "12+34="
    assert env.step("45") == ("wrong, try again", 0.0, False)
    assert env.step("46") == ("", 1.0, True)
    env = factory(EXAMPLES[0])
    assert [env.step("1")[2] for _ in range(envs.TRIES)] == [False] * (envs.TRIES - 1) + [True]
    cfg, params = model
    runner = EnvRunner(factory, timeout_s=30.0, turn_tokens=TURN, **RUNNER)
    r = runner.rollout(cfg, params, EXAMPLES, G, TOK, settings(), seed=2)
    assert isinstance(r, EnvRollout) and r.fields()["env_failures"] == 0
    # an untrained model never answers right: TRIES turns (the budget fits them), reward 0
    assert r.fields()["env_turns"] == envs.TRIES and (r.rewards_B == 0).all()


@pytest.mark.parametrize("flags, field", [
    (dict(env="nosuchmodule_xyz:make"), "env"),
    (dict(env="jaxrl_scale.data.envs:retry", refill=True, refill_cap=2), "refill"),
    (dict(env="jaxrl_scale.data.envs:retry", env_max_turns=0), "env_max_turns"),
    (dict(env="jaxrl_scale.data.envs:retry", env_max_obs_tokens=0), "env_max_obs_tokens"),
    (dict(env="jaxrl_scale.data.envs:retry", env_timeout_s=0.0), "env_timeout_s"),
    (dict(env="jaxrl_scale.data.envs:retry", env_isolation="fork"), "env_isolation")])
def test_bad_env_flags_name_the_flag(flags, field):
    with pytest.raises(ConfigError) as e:
        validate(TrainConfig.make(**flags))
    assert e.value.field == field
    validate(TrainConfig.make(env="jaxrl_scale.data.envs:retry"))   # the good one passes


@pytest.mark.parametrize("family", ["qwen2.5", "qwen3", "llama3"])
def test_observation_is_the_templates_next_user_turn(family, tmp_path):
    """Under a chat template, prompt + the assistant's turn ending at EOS + the observation's
    ids render the template's own text of the three-turn conversation, generation prompt
    included: the model continues exactly where the template would have it."""
    pytest.importorskip("tokenizers")
    from test_chat import FAMILIES, MULTI, build_tokenizer

    from jaxrl_scale.models.chat import encode_rendered, load_chat_template
    from jaxrl_scale.models.tokenizer import load_tokenizer
    path, config, bos = FAMILIES[family]
    d = build_tokenizer(tmp_path / family, path, config, bos)
    tok = load_tokenizer(d)
    tok.chat_template = load_chat_template("auto", d)
    ids = (tok.encode_prompt(MULTI[0]["content"]) + encode_rendered(tok, MULTI[1]["content"])
           + [tok.eos_id] + ObservationCodec(tok).encode(MULTI[2]["content"]))
    # the raw decode: this family's pad is its EOS, which Tokenizer.decode drops
    assert tok._tok.decode(ids, skip_special_tokens=False) == tok.chat_template.text(MULTI, True)


@pytest.mark.slow   # about a minute: a whole run's data, compiles and evals (-m slow)
def test_training_step_with_env_records_env_fields(tmp_path):
    """jaxrl-train's loop with --env: one step's record carries the env fields, the update
    trains on the episodes, and config.json keeps the flags."""
    import json

    from jaxrl_scale.experiment.train import run_training
    cfg = TrainConfig.make(run_dir=str(tmp_path / "run"), data_dir=str(tmp_path / "data"),
                           model="tiny", num_train_examples=16, num_test_examples=4,
                           prompts_per_step=4, group_size=2, max_new_tokens=M, eval_every=5,
                           eval_prompts=4, eval_samples=2, max_steps=1, base_batch=8,
                           env="jaxrl_scale.data.envs:retry", env_max_turns=3,
                           env_max_obs_tokens=16, env_timeout_s=30.0)
    assert run_training(cfg, progress=False)["finished"]
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        train = [r for r in map(json.loads, f) if "score" not in r]
    assert {"env_turns", "env_obs_tokens", "env_s", "env_failures", "env_timeouts"} <= \
        set(train[0]) and train[0]["env_failures"] == 0 and train[0]["updates"] == 1
    with open(tmp_path / "run" / "config.json") as f:
        saved = json.load(f)
    assert saved["env"] == cfg.env and saved["env_max_turns"] == 3
