"""Supervised warm-start: teach a small character-level policy the answer format.

RL on CPU needs a policy that already solves some problems (reward variance inside groups)
but not most of them (headroom). We train on a fraction of the task's solutions and stop as
soon as greedy held-out accuracy reaches `target_accuracy`. The checkpoint is cached under a
hash of the config, so every run of a sweep starts from the same weights.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from jaxrl_scale import checkpoint
from jaxrl_scale import distributed as dist
from jaxrl_scale import interrupt
from jaxrl_scale.experiment.batching import pack_texts
from jaxrl_scale.experiment.common import load_splits, prompt_length, write_json
from jaxrl_scale.experiment.config import DEFAULT_TASK_KWARGS
from jaxrl_scale.models import get_config, init_params, forward
from jaxrl_scale.rl.losses import token_logprobs


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    task: str = "arithmetic"
    task_kwargs: dict = dataclasses.field(default_factory=lambda: dict(DEFAULT_TASK_KWARGS))
    num_train_examples: int = 8000
    num_test_examples: int = 500
    data_dir: str = "~/.cache/jaxrl_scale/data"
    model: str = "rl_cpu"
    fraction: float = 0.25          # share of the train split whose solutions we imitate
    batch_size: int = 64
    lr: float = 1e-3
    max_steps: int = 3000
    eval_every: int = 50
    eval_prompts: int = 256
    target_accuracy: float = 0.3    # stop here: leaves RL headroom
    max_prompt_len: int = 0         # 0: automatic (longest prompt in the data)
    max_new_tokens: int = 6
    seed: int = 0
    cache_dir: str = "~/.cache/jaxrl_scale/sft"
    # The RL run's --chat_template ("none" or a .jinja path: the character tokenizer has no
    # template of its own), so the warm-start imitates solutions to the prompts RL will see.
    chat_template: str = "none"
    # Share of the SFT examples written as a conversation with the calculator tool of
    # data/tools.py (the assistant's calc(...) turn, its observation, the final answer), so a
    # policy trained with --env=jaxrl_scale.data.envs:calc has seen the format before RL.
    # arithmetic and arith_chain only; observation tokens are out of the loss, as in RL.
    tool_demos: float = 0.0

    def key(self) -> str:
        d = dataclasses.asdict(self)
        d.pop("cache_dir")
        if d["tool_demos"] == 0:   # the keys of entries cached before tool demonstrations
            d.pop("tool_demos")
        else:                      # the demonstrations' texts, as the template's text below
            from jaxrl_scale.data.tools import DEMO_FORMAT
            d["tool_demo_format"] = DEMO_FORMAT
        if d["chat_template"] == "none":   # the keys of entries cached before templates
            d.pop("chat_template")
        else:                              # the template's text, wherever its file is
            d["chat_template"] = _template_digest(self.chat_template)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _template_digest(spec: str) -> str:
    from jaxrl_scale.models.chat import ChatTemplateError, read_template
    try:
        return hashlib.sha256(read_template(spec, "char").encode()).hexdigest()
    except ChatTemplateError:   # validate_sft reports it; the key only needs to be stable
        return spec


# sft_warmstart(SFTConfig(**json), force) in a process of its own (multi-process runs)
_CHILD = ("import json, sys; from jaxrl_scale.experiment.sft import SFTConfig, sft_warmstart; "
          "sft_warmstart(SFTConfig(**json.loads(sys.argv[1])), force=sys.argv[2] == 'True')")


def sft_config_for(cfg, target_accuracy: float = SFTConfig.target_accuracy,
                   seed: int = 0, tool_demos: float = 0.0) -> SFTConfig:
    """The warm-start of an RL TrainConfig: the same task, data, model and response length
    (`seed`: its init and data order; another seed is an independent warm-start;
    `tool_demos`: SFTConfig.tool_demos)."""
    return SFTConfig(task=cfg.task, task_kwargs=cfg.task_kwargs, data_dir=cfg.data_dir,
                     model=cfg.model, num_train_examples=cfg.num_train_examples,
                     num_test_examples=cfg.num_test_examples,
                     max_new_tokens=cfg.max_new_tokens, target_accuracy=target_accuracy,
                     seed=seed, chat_template=_sft_template(cfg), tool_demos=tool_demos)


def _sft_template(cfg) -> str:
    """The warm-start's template: the RL run's, which the warm-start (always the character
    tokenizer) can render when the RL run's tokenizer is that one too."""
    return cfg.chat_template if cfg.tokenizer == "char" else "none"


def sft_loss(cfg, params, batch):
    """Mean next-token NLL over response tokens (targets shifted by one)."""
    logits_BTV = forward(cfg, params, batch["tokens_BT"], batch["valid_BT"])
    logp_BT = token_logprobs(logits_BTV[:, :-1], batch["tokens_BT"][:, 1:])
    mask_BT = batch["response_BT"][:, 1:].astype(jnp.float32)
    return -(logp_BT * mask_BT).sum() / jnp.maximum(mask_BT.sum(), 1.0)


def greedy_accuracy(model_cfg, params, tokenizer, examples, reward_fn, *, max_new_tokens,
                    batch_size=256) -> float:
    """Fraction of examples whose greedy response earns reward > 0."""
    from jaxrl_scale.experiment.batching import decode_responses
    from jaxrl_scale.sampling import generate
    scores = []
    for i in range(0, len(examples), batch_size):
        chunk = examples[i:i + batch_size]
        out = generate(model_cfg, params, [tokenizer.encode_prompt(e["prompt"]) for e in chunk],
                       max_new_tokens=max_new_tokens, temperature=0.0,
                       eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id)
        texts = decode_responses(tokenizer, np.asarray(out.tokens), np.asarray(out.lengths))
        scores.append(reward_fn.score_batch(texts, chunk))
    return float((np.concatenate(scores) > 0).mean())


# The held-out episodes of a tool-using warm-start: TrainConfig's default --env_max_turns, and
# room for any calc observation (a value or a fixed error text, data/tools.py).
EVAL_TURNS, EVAL_OBS_TOKENS = 4, 32


def episode_accuracy(model_cfg, params, tokenizer, examples, *, max_new_tokens, prompt_len,
                     batch_size=256) -> float:
    """Fraction of examples whose greedy episode with the calculator (data/envs.calc, as RL
    runs it with --env) earns reward > 0: a policy that calls the tool scores 0 under
    greedy_accuracy's single response, so its warm-start is stopped by this one."""
    from jaxrl_scale.data.envs import calc
    from jaxrl_scale.rl.multiturn import EnvRunner
    from jaxrl_scale.rl.rollout import SamplingSettings
    from jaxrl_scale.sampling import SamplingConfig
    runner = EnvRunner(calc, name="calc", max_turns=EVAL_TURNS, max_obs_tokens=EVAL_OBS_TOKENS,
                       max_prompt_len=prompt_len)
    s = SamplingSettings(SamplingConfig(0.0, 0, 1.0), max_new_tokens, tokenizer.eos_id,
                         tokenizer.pad_id, batch_size)
    r = runner.rollout(model_cfg, params, list(examples), 1, tokenizer, s,
                       seed=jax.random.PRNGKey(0))
    return float((np.asarray(r.rewards_B) > 0).mean())


def conversation_ids(tokenizer, turns, codec=None) -> tuple[list[int], list[bool]]:
    """(ids, is-assistant per id) of (role, text) turns after the prompt, laid out as an RL
    episode (rl/multiturn.py): an "assistant" turn is its text and the EOS that ends it, an
    "observation" what rl/multiturn.ObservationCodec feeds (through the chat template, if
    any). codec: that ObservationCodec (made here when None)."""
    ids, mine = [], []
    for role, text in turns:
        if role == "assistant":
            t = list(tokenizer.encode(text)) + [tokenizer.eos_id]
        else:
            if codec is None:
                from jaxrl_scale.rl.multiturn import ObservationCodec
                codec = ObservationCodec(tokenizer)
            t = codec.encode(text)
        ids += t
        mine += [role == "assistant"] * len(t)
    return ids, mine


def pack_conversations(tokenizer, prompts, conversations, *, prompt_len: int,
                       max_new_tokens: int, codec=None):
    """pack_texts for conversations ((role, text) turns, see conversation_ids): response_BT
    marks the assistant's tokens only, so sft_loss learns them and not the observations
    (context the policy reads, out of RL's loss mask too: rl/multiturn.mask_observations).
    A conversation of one assistant turn packs exactly as pack_texts packs its text."""
    from jaxrl_scale.rl.batch import pack_sequences
    B, M = len(conversations), max_new_tokens
    resp_BM = np.full((B, M), tokenizer.pad_id, np.int32)
    mine_BM = np.zeros((B, M), bool)
    lengths_B = np.zeros((B,), np.int32)
    for i, turns in enumerate(conversations):
        ids, mine = conversation_ids(tokenizer, turns, codec)
        if len(ids) > M:
            raise ValueError(f"conversation {turns!r} needs {len(ids)} tokens > max_new_tokens"
                             f"={M}; raise --max_new_tokens.")
        resp_BM[i, :len(ids)], mine_BM[i, :len(ids)], lengths_B[i] = ids, mine, len(ids)
    batch = pack_sequences([tokenizer.encode_prompt(p) for p in prompts], resp_BM, lengths_B,
                           prompt_len=prompt_len, pad_id=tokenizer.pad_id)
    batch["response_BT"][:, prompt_len:] &= mine_BM
    return batch


def sft_conversations(rows, demo_B) -> list:
    """Each row's solution as one assistant turn, or where demo_B, its calculator
    conversation (data/tools.calc_demo)."""
    from jaxrl_scale.data.tools import calc_demo
    return [calc_demo(r) if d else [("assistant", r["solution"])] for r, d in zip(rows, demo_B)]


def sft_path(cfg: SFTConfig) -> str:
    """Where `sft_warmstart(cfg)` keeps its params (known before it trains)."""
    return os.path.join(os.path.expanduser(cfg.cache_dir), f"{cfg.task}_{cfg.key()}", "params")


# SFTConfig's numeric fields: (lowest, highest, lowest excluded), as config.RANGES
SFT_RANGES: dict[str, tuple[float, float, bool]] = {
    **{k: (1, float("inf"), False) for k in ("batch_size", "max_steps", "eval_every",
                                             "eval_prompts", "max_new_tokens",
                                             "num_train_examples", "num_test_examples")},
    **{k: (0, float("inf"), False) for k in ("max_prompt_len", "seed")},
    "lr": (0, float("inf"), True), "fraction": (0, 1, True), "target_accuracy": (0, 1, True),
    "tool_demos": (0, 1, False),
}
# the tasks whose prompt is the expression a calc(...) call computes (data/tools.calc_demo)
TOOL_DEMO_TASKS = ("arithmetic", "arith_chain")
SFT_INT_FIELDS = {f.name for f in dataclasses.fields(SFTConfig) if f.type in ("int", int)}


def validate_sft(cfg: SFTConfig) -> None:
    """ConfigError (`<field>: <problem>. Fix: <fix>.`) for the first bad field; cheap (no data,
    model or compile), so it runs before anything loads and before a cache entry is written."""
    from jaxrl_scale.experiment.config import ConfigError, check_ranges
    check_ranges(dataclasses.asdict(cfg), SFT_RANGES, SFT_INT_FIELDS)
    if cfg.max_steps < cfg.eval_every:
        raise ConfigError("eval_every", f"{cfg.eval_every} > max_steps {cfg.max_steps}: the "
                          "run would never evaluate (accuracy 0)",
                          "set --eval_every <= --max_steps")
    if not isinstance(cfg.task_kwargs, dict):
        raise ConfigError("task_kwargs", f"must be a JSON object, got {cfg.task_kwargs!r}",
                          "pass --task_kwargs='{\"key\": value}'")
    from jaxrl_scale.models.config import PRESETS
    if cfg.model not in PRESETS:
        raise ConfigError("model", f"{cfg.model!r} is not a model preset",
                          f"use one of {', '.join(sorted(PRESETS))}")
    from jaxrl_scale.experiment.checks import check_chat_template
    check_chat_template(cfg.chat_template, "char")
    if cfg.tool_demos > 0 and cfg.task not in TOOL_DEMO_TASKS:
        raise ConfigError("tool_demos", f"the calculator demonstrations are written for "
                          f"{' and '.join(TOOL_DEMO_TASKS)}, not {cfg.task!r}",
                          "set --tool_demos=0, or use one of those tasks")


def check_warm_start(cfg: SFTConfig) -> None:
    """`validate_sft` of an RL command's warm-start, its error named by that command's flag
    (--warmstart_tool_demos for tool_demos), before the run or sweep starts anything."""
    from jaxrl_scale.experiment.errors import ConfigError
    try:
        validate_sft(cfg)
    except ConfigError as e:
        if e.field != "tool_demos":
            raise
        raise ConfigError("warmstart_tool_demos", e.problem,
                          e.fix.replace("--tool_demos", "--warmstart_tool_demos")) from None


def sft_warmstart(cfg: SFTConfig, *, progress: bool = True, force: bool = False):
    """Train (or reuse the cached) warm-start. Returns (checkpoint_dir, info dict).
    A ConfigError (validate_sft) before anything loads or is cached."""
    validate_sft(cfg)
    out_dir = os.path.dirname(sft_path(cfg))
    info_path = os.path.join(out_dir, "info.json")
    if jax.process_count() > 1:
        # A multi-process run: process 0 trains the entry in a one-process child (its jit and
        # orbax save must not wait for the other processes), the rest wait, all read it.
        if dist.is_primary() and (force or not os.path.exists(info_path)
                                  or _entry_problem(out_dir, info_path)):
            subprocess.run([sys.executable, "-c", _CHILD, json.dumps(dataclasses.asdict(cfg)),
                            str(bool(force))], check=True)
        dist.barrier("sft_warmstart")
        force = False
    with _entry_lock(out_dir):
        if os.path.exists(info_path) and not force:
            problem = _entry_problem(out_dir, info_path)
            if problem is None:
                with open(info_path) as f:
                    return os.path.join(out_dir, "params"), json.load(f)
            _set_aside(out_dir, problem)
        return _train(cfg, out_dir, info_path, progress)


def _entry_problem(out_dir: str, info_path: str) -> str | None:
    """What makes a finished cache entry unusable (its params' files differ from their
    digests, its info.json does not read), or None."""
    problem = checkpoint.check_pytree(os.path.join(out_dir, "params"))
    if problem is None:
        try:
            with open(info_path) as f:
                json.load(f)["accuracy"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            problem = f"{info_path} is unreadable ({type(e).__name__}: {str(e)[:200]})"
    return problem


def _set_aside(out_dir: str, problem: str) -> None:
    """Move a corrupt cache entry to <entry>.corrupt[-n] (kept for inspection), so that the
    warm-start is trained again in its place."""
    dest, n = out_dir + ".corrupt", 1
    while os.path.exists(dest):
        dest, n = f"{out_dir}.corrupt-{n}", n + 1
    shutil.move(out_dir, dest)
    warnings.warn(f"SFT warm-start cache entry {out_dir} is corrupt ({problem}); moved to "
                  f"{dest} and trained again.", RuntimeWarning, stacklevel=3)


@contextlib.contextmanager
def _entry_lock(out_dir: str):
    """One builder per cache entry: processes sharing the cache (job-array tasks, Ray
    workers) wait here for the first one and then read its entry. flock on a file beside the
    entry; the OS releases it when the holder dies, so a killed builder blocks nobody."""
    os.makedirs(os.path.dirname(out_dir), exist_ok=True)
    with open(out_dir + ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _train(cfg: SFTConfig, out_dir: str, info_path: str, progress: bool):
    """Train the warm-start and write the cache entry (params, then info.json)."""
    from jaxrl_scale.data import reward_for_task
    from jaxrl_scale.models.tokenizer import CharTokenizer
    from jaxrl_scale.experiment.checks import check_chat_template
    tok = CharTokenizer()
    tok.chat_template = check_chat_template(cfg.chat_template, "char")   # as the RL run's prompts
    model_cfg = get_config(cfg.model)
    if tok.vocab_size > model_cfg.vocab_size:
        raise ValueError(f"SFTConfig.model: preset {cfg.model!r} has {model_cfg.vocab_size} "
                         f"logits < {tok.vocab_size} character ids. Fix: pick a larger model.")
    train, test = load_splits(cfg.task, cfg.task_kwargs, cfg.data_dir, cfg.num_train_examples,
                              cfg.num_test_examples)
    prompt_len = prompt_length(tok, [("train", train), ("test", test)], cfg.max_prompt_len,
                               model_cfg.max_seq_len)
    n_train = max(cfg.batch_size, int(len(train) * cfg.fraction))
    train_rows = [train[i] for i in range(min(n_train, len(train)))]
    eval_rows = [test[i] for i in range(min(cfg.eval_prompts, len(test)))]
    reward_fn = reward_for_task(cfg.task)

    codec = None
    if cfg.tool_demos > 0:   # every demonstration fits the budget: refused now, not mid-run
        from jaxrl_scale.rl.multiturn import ObservationCodec
        from jaxrl_scale.experiment.config import ConfigError
        codec = ObservationCodec(tok)
        longest = max(len(conversation_ids(tok, t, codec)[0])
                      for t in sft_conversations(train_rows, [True] * len(train_rows)))
        if longest > cfg.max_new_tokens:
            raise ConfigError("max_new_tokens", f"{cfg.max_new_tokens} tokens cannot hold the "
                              f"longest calculator demonstration ({longest} tokens: the call, "
                              "its observation and the answer)",
                              f"set --max_new_tokens >= {longest}, or --tool_demos=0")
    # which rows are demonstrations: a stream of its own, so the rows drawn are the same
    demo_rng = np.random.default_rng([cfg.seed, 1])

    params = init_params(model_cfg, cfg.seed)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(cfg.lr))
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(lambda p: sft_loss(model_cfg, p, batch))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    rng = np.random.default_rng(cfg.seed)
    t0, acc, history = time.time(), 0.0, []
    bar = tqdm(range(1, cfg.max_steps + 1), desc="sft", disable=not progress)
    for it in bar:
        idx = rng.integers(0, len(train_rows), cfg.batch_size)
        rows = [train_rows[i] for i in idx]
        if cfg.tool_demos == 0:
            batch = pack_texts(tok, [r["prompt"] for r in rows], [r["solution"] for r in rows],
                               prompt_len=prompt_len, max_new_tokens=cfg.max_new_tokens)
        else:
            demo_B = demo_rng.random(len(rows)) < cfg.tool_demos
            batch = pack_conversations(tok, [r["prompt"] for r in rows],
                                       sft_conversations(rows, demo_B), prompt_len=prompt_len,
                                       max_new_tokens=cfg.max_new_tokens, codec=codec)
        params, opt_state, loss = step(params, opt_state, batch)
        if interrupt.requested():   # Ctrl-C (interrupt.deferred_sigint): nothing is cached
            raise interrupt.Interrupted(f"SFT warm-start stopped at step {it}; nothing was "
                                        "cached (a rerun trains it from the start)")
        if it % cfg.eval_every == 0:
            acc = greedy_accuracy(model_cfg, params, tok, eval_rows, reward_fn,
                                  max_new_tokens=cfg.max_new_tokens) if cfg.tool_demos == 0 \
                else episode_accuracy(model_cfg, params, tok, eval_rows,
                                      max_new_tokens=cfg.max_new_tokens, prompt_len=prompt_len)
            history.append({"step": it, "loss": float(loss), "accuracy": acc})
            bar.set_postfix(loss=f"{float(loss):.3f}", acc=f"{acc:.3f}")
            if acc >= cfg.target_accuracy:
                break
    info = {"config": {k: v for k, v in dataclasses.asdict(cfg).items()},
            "model_config": dataclasses.asdict(model_cfg), "steps": it, "accuracy": acc,
            "seconds": time.time() - t0, "history": history}
    # params without info.json are an unfinished (or forced-over) entry: replace them
    shutil.rmtree(os.path.join(out_dir, "params"), ignore_errors=True)
    checkpoint.save_pytree(os.path.join(out_dir, "params"), params, {"accuracy": acc})
    write_json(info_path, info, indent=2)  # info.json last: marks the cache entry complete
    return os.path.join(out_dir, "params"), info
