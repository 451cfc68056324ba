"""Built-in tool and retry tasks (data/tools.py, data/envs.py) and the SFT warm-start's tool
demonstrations (experiment/sft.py, tool_demos): the calculator computes arithmetic and
nothing else, answers a bad call with an error observation (never an exception), scores the
final answer by the task's reward, is counted in env_tool_calls; demonstrations put only the
assistant's tokens in the loss; the default warm-start is the one it was."""
import jax
import numpy as np
import pytest

from jaxrl_scale.data import envs
from jaxrl_scale.data.tools import (CALL_ERROR, EXPR_ERROR, VALUE_ERROR, Calc, calc_demo,
                                    calc_observation, calc_value, task_reward)
from jaxrl_scale.experiment import sft
from jaxrl_scale.experiment.batching import pack_texts
from jaxrl_scale.experiment.config import ConfigError, TrainConfig, validate
from jaxrl_scale.experiment.sft import SFTConfig, pack_conversations, validate_sft
from jaxrl_scale.models import get_config, init_params
from jaxrl_scale.models.tokenizer import CharTokenizer
from jaxrl_scale.rl.multiturn import EnvRunner, load_env_factory
from jaxrl_scale.rl.rollout import SamplingSettings
from jaxrl_scale.sampling import SamplingConfig

TOK = CharTokenizer()
CHAIN = {"prompt": "12+7-5=", "answer": "14", "solution": "19-5=14", "num_ops": 2,
         "key": "12+7-5"}
ARITH = {"prompt": "23+58=", "answer": "81", "solution": "81", "key": "23+58"}


@pytest.mark.parametrize("call,want", [
    ("calc(12+7-5)", "14"), ("calc(2*(3+4))", "14"), ("calc( 5 - 12 )", "-7"),
    ("calc(__import__('os').system('x'))", EXPR_ERROR), ("calc(1+)", EXPR_ERROR),
    ("calc()", EXPR_ERROR), ("calc(01)", EXPR_ERROR), ("calc(2**999)", EXPR_ERROR),
    ("calc(" + "(" * 300 + "1" + ")" * 300 + ")", EXPR_ERROR),
    ("calc(1\u00e9)", EXPR_ERROR),
    ("calc 1+2", CALL_ERROR), ("calc(1+2", CALL_ERROR), ("calc(1)+2", CALL_ERROR),
    ("calc(1)+(2)", EXPR_ERROR),
    ("calc(" + "*".join(["99999"] * 9) + ")", VALUE_ERROR),
    ("calculate", CALL_ERROR)])
def test_calculator_evaluates_arithmetic_and_answers_anything_else_with_an_error(call, want):
    assert calc_value(call) == want and calc_observation(call) == want + "\n"


@pytest.mark.parametrize("turns,reward,calls", [
    (["calc(12+7-5)", "14"], 1.0, 1),                  # call, then the right answer
    (["14"], 1.0, 0),                                   # answered without the tool
    (["calc(12+7-5)<eos>junk", "14<eos>"], 1.0, 1),     # text after EOS is not the turn's
    (["calc(12+7)", "19"], 0.0, 1),                     # the wrong expression's value
    (["calc(12+7-", "calc(12+7-5)", "14"], 1.0, 2),     # a malformed call, then a good one
    (["19-5=14"], 1.0, 0),                              # arith_chain's shown work is fine
    (["15"], 0.0, 0)])
def test_scripted_conversations_score_by_the_tasks_reward(turns, reward, calls):
    env = envs.calc(dict(CHAIN))
    assert env.reset() == CHAIN["prompt"]
    total, done = 0.0, False
    for i, t in enumerate(turns):
        assert not done
        obs, r, done = env.step(t)
        total += r
        assert isinstance(obs, str) and done == (i == len(turns) - 1)
    assert (total, env.tool_calls) == (reward, calls)


def test_arithmetic_is_scored_by_exact_match_and_never_raises_out():
    env = envs.calc(dict(ARITH))
    assert env.step("calc(23+58)") == ("81\n", 0.0, False)
    assert env.step("23+58=81") == ("", 0.0, True)   # arithmetic wants the answer alone
    assert task_reward(ARITH)("81", ARITH) == 1.0
    for junk in ["", "calc(", "calc(\x00)", "calc(" + "9" * 10_000 + ")", "calc(((" * 50]:
        obs, r, _ = Calc(dict(ARITH)).step(junk)
        assert isinstance(obs, str) and r == 0.0


def test_retry_uses_the_tasks_own_reward_by_name():
    """--env=jaxrl_scale.data.envs:retry with --task=arithmetic and --task=arith_chain."""
    retry = load_env_factory("jaxrl_scale.data.envs:retry")
    env = retry(dict(CHAIN))
    assert env.step("19-5=13") == ("wrong, try again", 0.0, False)
    assert env.step("19-5=14") == ("", 1.0, True)
    env = retry(dict(ARITH))
    assert env.step("23+58=81")[1] == 0.0 and env.step("81") == ("", 1.0, True)
    assert load_env_factory("jaxrl_scale.data.envs:calc") is envs.calc
    for task in ("arithmetic", "arith_chain"):
        for env_name in ("retry", "calc"):
            validate(TrainConfig.make(task=task, env=f"jaxrl_scale.data.envs:{env_name}"))


class Scripted(Calc):
    """The calculator, fed the example's scripted turns instead of the model's text."""

    def __init__(self, example):
        super().__init__(example)
        self.script = iter(example["script"])

    def step(self, text):
        return super().step(next(self.script))


def test_env_tool_calls_counts_the_calls_of_each_episode():
    cfg = get_config("tiny")
    params = init_params(cfg, 0)
    rows = [dict(CHAIN, script=["calc(12+7-5)", "14"]),
            dict(CHAIN, script=["calc(12+)", "calc(12+7-5)", "14"]),
            dict(CHAIN, script=["13"])]
    shape = dict(max_turns=3, max_obs_tokens=16, max_prompt_len=8, turn_tokens=2)
    runner = EnvRunner(Scripted, **shape)
    s = SamplingSettings(SamplingConfig(1.0, 0, 1.0), 40, None, TOK.pad_id, 4)
    r = runner.rollout(cfg, params, rows, 1, TOK, s, seed=jax.random.PRNGKey(0))
    np.testing.assert_array_equal(r.rewards_B, [1.0, 1.0, 0.0])
    st = r.fields()
    assert st["env_tool_calls"] == pytest.approx(1.0) and st["env_failures"] == 0
    # the observations sit in the sequence outside the assistant's tokens
    obs = [TOK.decode(row[~a & (np.arange(len(row)) < n)])
           for row, a, n in zip(r.tokens_BM, r.assistant_BM, r.lengths_B)]
    assert obs == ["14\n", EXPR_ERROR + "\n14\n", ""]
    # an environment that counts no calls adds no field (the same shapes: no new compile)
    other = EnvRunner(envs.retry, **shape).rollout(cfg, params, rows, 1, TOK, s,
                                                   seed=jax.random.PRNGKey(0)).fields()
    assert "env_tool_calls" not in other and other["env_failures"] == 0


def test_demonstrations_compute_every_answer_of_the_built_in_tasks():
    """The calculator's value of a prompt is its answer (arith_chain's reductions follow the
    parser's precedence), so a demonstration never teaches a wrong final answer."""
    import random

    from jaxrl_scale.data.tasks import (ArithChainSpec, ArithmeticSpec, arith_chain_problem,
                                        arithmetic_problem)
    rng = random.Random(0)
    rows = [arith_chain_problem(rng, ArithChainSpec(ops="+-*", max_ops=4)) for _ in range(200)]
    rows += [arithmetic_problem(rng, ArithmeticSpec(ops="+-*")) for _ in range(50)]
    for row in rows:
        call, obs, answer = calc_demo(row)
        assert obs[1] == answer[1] + "\n" and answer[1] == row["answer"]
        env = envs.calc(row)
        assert env.step(call[1]) == (obs[1], 0.0, False) and env.step(answer[1])[1] == 1.0


def test_tool_demonstrations_learn_only_the_assistants_tokens():
    prompts = [CHAIN["prompt"], ARITH["prompt"]]
    convs = [calc_demo(CHAIN), [("assistant", ARITH["solution"])]]
    assert convs[0] == [("assistant", "calc(12+7-5)"), ("observation", "14\n"),
                        ("assistant", "14")]
    P, M = 8, 24
    b = pack_conversations(TOK, prompts, convs, prompt_len=P, max_new_tokens=M)
    eos = TOK.eos_id
    row = b["tokens_BT"][0, P:]
    learned, seen = b["response_BT"][0, P:], b["valid_BT"][0, P:]
    want = TOK.encode("calc(12+7-5)") + [eos] + TOK.encode("14\n") + TOK.encode("14") + [eos]
    np.testing.assert_array_equal(row[:len(want)], want)
    mine = np.zeros(M, bool)
    mine[:13], mine[16:19] = True, True          # the two assistant turns, each with its EOS
    np.testing.assert_array_equal(learned, mine)
    assert seen[:len(want)].all() and not seen[len(want):].any()   # observation: context
    # a one-turn conversation is exactly the single-response SFT batch
    plain = pack_texts(TOK, prompts[1:], [ARITH["solution"]], prompt_len=P, max_new_tokens=M)
    for k in plain:
        np.testing.assert_array_equal(b[k][1:], plain[k])
    with pytest.raises(ValueError, match="max_new_tokens"):
        pack_conversations(TOK, prompts[:1], convs[:1], prompt_len=P, max_new_tokens=10)


def test_the_default_warm_start_keeps_its_cache_key_and_batches(tmp_path, monkeypatch):
    # the keys SFTConfig gave before tool demonstrations existed: existing caches stay valid
    assert SFTConfig().key() == "28c2d1eccd540a51"
    assert SFTConfig(task="arith_chain", max_new_tokens=75, seed=3).key() == "7df363a71b2919ad"
    tools_key = SFTConfig(tool_demos=0.5).key()
    assert tools_key != SFTConfig().key()
    monkeypatch.setattr("jaxrl_scale.data.tools.DEMO_FORMAT", 2)   # new texts: a new entry
    assert SFTConfig(tool_demos=0.5).key() != tools_key and \
        SFTConfig().key() == "28c2d1eccd540a51"
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="tool_demos"):
        validate_sft(SFTConfig(task="countdown", tool_demos=0.5))
    with pytest.raises(ConfigError, match="tool_demos"):
        validate_sft(SFTConfig(tool_demos=1.5))
    # the default trains on pack_texts of the rows its seed draws, as before
    cfg = SFTConfig(model="tiny", num_train_examples=64, num_test_examples=8, batch_size=8,
                    max_steps=1, eval_every=1, eval_prompts=8, target_accuracy=1.0,
                    data_dir=str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"))
    seen = []
    monkeypatch.setattr(sft, "pack_texts", lambda tok, p, r, **kw: seen.append(p) or
                        pack_texts(tok, p, r, **kw))
    monkeypatch.setattr(sft, "pack_conversations", lambda *a, **kw: pytest.fail("called"))
    sft.sft_warmstart(cfg, progress=False)
    train, _ = sft.load_splits(cfg.task, cfg.task_kwargs, cfg.data_dir, 64, 8)
    idx = np.random.default_rng(cfg.seed).integers(0, max(cfg.batch_size, 16), cfg.batch_size)
    assert seen == [[train[int(i)]["prompt"] for i in idx]]


def test_warm_start_with_tool_demos_trains_and_evaluates_episodes(tmp_path, monkeypatch):
    cfg = SFTConfig(model="tiny", task="arith_chain",
                    task_kwargs={"digits": 2, "ops": "+-", "max_ops": 2},
                    num_train_examples=64, num_test_examples=8, batch_size=8, max_steps=2,
                    eval_every=2, eval_prompts=8, target_accuracy=1.0, max_new_tokens=24,
                    tool_demos=1.0, data_dir=str(tmp_path / "data"),
                    cache_dir=str(tmp_path / "cache"))
    batches = []
    real = sft.pack_conversations
    monkeypatch.setattr(sft, "pack_conversations",
                        lambda *a, **kw: batches.append(real(*a, **kw)) or batches[-1])
    _, info = sft.sft_warmstart(cfg, progress=False)
    assert info["steps"] == 2 and 0.0 <= info["accuracy"] <= 1.0
    b = batches[-1]   # every row a conversation: some response tokens are out of the loss
    assert (b["valid_BT"] & ~b["response_BT"])[:, -cfg.max_new_tokens:].any(axis=1).all()


@pytest.mark.slow   # about a minute: a whole run's data, compiles and evals (-m slow)
def test_training_step_with_the_calculator_records_tool_calls(tmp_path):
    """jaxrl-train --task=arith_chain --env=jaxrl_scale.data.envs:calc, one step."""
    import json

    from jaxrl_scale.experiment.train import run_training
    cfg = TrainConfig.make(run_dir=str(tmp_path / "run"), data_dir=str(tmp_path / "data"),
                           model="tiny", task="arith_chain", num_train_examples=16,
                           num_test_examples=4, prompts_per_step=4, group_size=2,
                           max_new_tokens=40, eval_every=5, eval_prompts=4, eval_samples=2,
                           max_steps=1, base_batch=8, env="jaxrl_scale.data.envs:calc",
                           env_max_turns=3, env_max_obs_tokens=16, env_timeout_s=30.0)
    assert run_training(cfg, progress=False)["finished"]
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        train = [r for r in map(json.loads, f) if "score" not in r]
    assert train[0]["env_tool_calls"] >= 0 and train[0]["env_failures"] == 0


def test_a_batch_study_runs_on_a_multi_turn_task(tmp_path):
    """jaxrl-sweep with --env: the lr tuning, the study runs and the analysis run on
    episodes (N counts retained episodes), every training record of every run carries the
    environment's fields, and nothing fails."""
    import json
    import os

    from jaxrl_scale.experiment.study import SweepConfig
    from jaxrl_scale.experiment.sweep import run_sweep
    base = TrainConfig.make(data_dir=str(tmp_path / "data"), model="tiny",
                            num_train_examples=200, num_test_examples=16, max_new_tokens=8,
                            eval_prompts=8, eval_samples=2, base_lr=1e-3,
                            env="jaxrl_scale.data.envs:retry", env_max_turns=2)
    sweep = SweepConfig(sweep_dir=str(tmp_path / "sweep"), prompts=(4, 8), group_sizes=(2,),
                        base_prompts=0, lr_rules=("sqrt",), fixed_prompts=(), pairs=(),
                        seeds=(0,), max_responses=32, eval_every_responses=16,
                        tune_lrs=(1e-3,), tune_responses=16, target=0.5, compile_cache=False,
                        tune_max_extensions=0)
    summary = run_sweep(sweep, base, progress=False)
    assert summary["errors"] == {} and "analysis_error" not in summary
    assert set(summary["runs"]) == {"grpo_P4_G2_sqrt_s0", "grpo_P8_G2_sqrt_s0"}
    for run in summary["runs"]:
        with open(os.path.join(sweep.sweep_dir, run, "metrics.jsonl")) as f:
            steps = [r for r in map(json.loads, f) if "reward_mean" in r]
        assert steps and all(r["env_turns"] >= 1 and "env_s" in r for r in steps), run
    assert os.path.isfile(summary["report_path"])
