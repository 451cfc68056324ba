"""Multi-turn rollouts (--env, rl/multiturn.py; sampling/turns.py): a one-turn environment is
today's single-turn rollout bit for bit, the KV-cache continuation equals a full forward over
the whole conversation, observations never enter the loss, and a broken environment ends only
its own episode."""
import functools
import os
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from numerics import assert_tree_close, permute_mlp, reorder_floor, tree_norm

from jaxrl_scale.data import envs
from jaxrl_scale.data.reward_runner import RewardFn
from jaxrl_scale.experiment.config import ConfigError, TrainConfig, validate
from jaxrl_scale.models import forward, get_config, init_params
from jaxrl_scale.models.tokenizer import CharTokenizer
from jaxrl_scale.rl import steps
from jaxrl_scale.rl.batch import rollout_batch
from jaxrl_scale.rl.multiturn import (EnvRollout, EnvRunner, ObservationCodec, load_env_factory,
                                      mask_observations, score_episodes)
from jaxrl_scale.rl.rollout import SamplingSettings, generate_rollout, score_rollout
from jaxrl_scale.sampling import SamplingConfig

TOK = CharTokenizer()
EXAMPLES = [{"prompt": "12+34=", "answer": "46"}, {"prompt": "7-5=", "answer": "2"},
            {"prompt": "40+22=", "answer": "62"}, {"prompt": "9+9=", "answer": "18"}]
G, M = 2, 40
PROMPT_LEN = 8
OBS = "wrong, try again"   # every test's observation: the retry example's (one feed shape)
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


def first_char(text, example):
    """A reward that varies between samples (so GRPO's advantages are not all 0)."""
    return float(len(text) > 0 and text[0] in "0123456789+-=")


class OneTurn:
    def __init__(self, example):
        self.example = example

    def reset(self):
        return self.example["prompt"]

    def step(self, text):
        return "", first_char(text, self.example), True


class Talk:
    """Answers every assistant turn with OBS and reward 1, done after 3 turns."""

    def __init__(self, example):
        self.example, self.n = example, 0

    def reset(self):
        return self.example["prompt"]

    def step(self, text):
        self.n += 1
        return OBS, 1.0, self.n >= 3


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


RELEASE = threading.Event()


class Broken:
    """Behaviour by the example's "kind"; "ok" is a well-behaved two-turn episode."""

    def __init__(self, example):
        self.kind, self.n = example["kind"], 0
        if self.kind == "init_raises":
            raise RuntimeError("cannot build")

    def reset(self):
        if self.kind == "reset_type":
            return 42
        return "1+1="

    def step(self, text):
        self.n += 1
        kind = self.kind if self.n >= 2 or self.kind == "raises" else "ok"
        if kind == "raises":
            raise ValueError("bad step")
        if kind == "hangs":
            RELEASE.wait(60)
        if kind == "wrong_types":
            return 1.0, "obs", None
        if kind == "nan_reward":
            return "", float("nan"), True
        if kind == "huge":
            return "x" * 100_000, 0.0, False
        if kind == "long_obs":
            return "y" * 17, 0.0, False
        return OBS, 0.5, self.n >= 3


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
    (dict(env="jaxrl_scale.data.envs:retry", rollout="engine"), "env"),
    (dict(env="jaxrl_scale.data.envs:retry", gen_batch_ratio=2), "env"),
    (dict(env="jaxrl_scale.data.envs:retry", refill=True, refill_cap=2), "refill"),
    (dict(env="jaxrl_scale.data.envs:retry", env_max_turns=0), "env_max_turns"),
    (dict(env="jaxrl_scale.data.envs:retry", env_max_obs_tokens=0), "env_max_obs_tokens"),
    (dict(env="jaxrl_scale.data.envs:retry", env_timeout_s=0.0), "env_timeout_s")])
def test_bad_env_flags_name_the_flag(flags, field):
    with pytest.raises(ConfigError) as e:
        validate(TrainConfig.make(**flags))
    assert e.value.field == field
    validate(TrainConfig.make(env="jaxrl_scale.data.envs:retry"))   # the good one passes


def test_env_with_the_slot_engine_exits_2_in_one_line(tmp_path):
    exe = os.path.join(os.path.dirname(sys.executable), "jaxrl-train")
    if not os.path.exists(exe):
        pytest.skip("jaxrl-train is not installed (pip install -e .)")
    res = subprocess.run([exe, "--env=jaxrl_scale.data.envs:retry", "--rollout=engine"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith("error: env: ") and "--rollout=generate" in lines[0]
    assert os.listdir(tmp_path) == []


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
