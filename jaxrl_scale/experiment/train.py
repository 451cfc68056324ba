"""One GRPO/PPO run: rollout -> rewards -> advantages -> one update -> eval -> checkpoint.

Everything a user can change is a TrainConfig field; this module is the only place where the
pieces meet. Accounting (SCIENCE.md section 1):
  responses            cumulative *retained* responses (zero-variance groups filtered out
                       when filter_zero_variance; they still count in responses_generated)
  time_s               cumulative wall seconds of generation + rewards + update (eval excluded,
                       reported as eval_s on eval records)
Resume: the run directory holds an orbax checkpoint (params, optimizer state, rng, step,
data position, counters). Restarting the same command continues from the last checkpoint
and truncates metrics.jsonl to it, so the file never holds duplicate or missing steps.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from jaxrl_scale import optim
from jaxrl_scale import sharding as shd
from jaxrl_scale.checkpoint import Checkpointer, load_pytree
from jaxrl_scale.experiment.batching import decode_responses, pack_sequences
from jaxrl_scale.experiment.common import load_splits, prompt_length
from jaxrl_scale.experiment.config import TrainConfig, validate, write_config
from jaxrl_scale.experiment.metrics import MetricsLog
from jaxrl_scale.models import get_config, init_params, load_hf
from jaxrl_scale.models.tokenizer import load_tokenizer
from jaxrl_scale.rl import losses
from jaxrl_scale.rl.state import create_train_state, shard_train_state
from jaxrl_scale.rl.steps import (GRPOBatch, LossConfig, PPOBatch, grpo_step, make_train_step,
                                  ppo_step)
from jaxrl_scale.rl.value import init_critic_from_actor
from jaxrl_scale.sampling import generate

DONE_FILE = "DONE.json"


def is_finished(run_dir: str) -> bool:
    return os.path.exists(os.path.join(run_dir, DONE_FILE))


def optimizer_for(cfg: TrainConfig, base_lr: float):
    """Adam whose hyper-parameters follow cfg.lr_rule in responses per update (P*G)."""
    base = optim.AdamHParams(lr=base_lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
    hp = optim.scaled_adam_hparams(base, cfg.batch_train, cfg.base_batch, cfg.lr_rule)
    tx = optim.make_optimizer(hp, warmup_steps=cfg.warmup_steps,
                              max_grad_norm=cfg.max_grad_norm or None)
    return hp, tx, functools.partial(optim.current_lr, hp, warmup_steps=cfg.warmup_steps)


def _model(cfg: TrainConfig, tok):
    if cfg.hf_checkpoint:
        model_cfg, params = load_hf(os.path.expanduser(cfg.hf_checkpoint))
    else:
        model_cfg = get_config(cfg.model)
        params = None
    if tok.vocab_size > model_cfg.vocab_size:
        raise ValueError(f"TrainConfig.tokenizer: vocab of {tok.vocab_size} ids exceeds the "
                         f"model's {model_cfg.vocab_size}. Fix: choose a larger --model.")
    if cfg.init_checkpoint:
        like = jax.eval_shape(lambda: init_params(model_cfg, 0))
        params, _ = load_pytree(os.path.expanduser(cfg.init_checkpoint), like)
    elif params is None:
        params = init_params(model_cfg, cfg.seed)
    return model_cfg, params


class Run:
    """Holds the static pieces of one run (built once; the loop below is the orchestration)."""

    def __init__(self, cfg: TrainConfig):
        validate(cfg)  # cheap checks first: nothing is loaded or compiled on bad input
        self.cfg = cfg
        self.mesh = shd.make_mesh(cfg.mesh_data, cfg.mesh_fsdp, cfg.mesh_tensor)
        self.tok = load_tokenizer(cfg.tokenizer)
        from jaxrl_scale.data import PromptStream, reward_for_task
        self.train_src, self.test_src = load_splits(cfg.task, cfg.task_kwargs, cfg.data_dir,
                                                    cfg.num_train_examples,
                                                    cfg.num_test_examples)
        self.stream = PromptStream(self.train_src, cfg.prompts_per_step, cfg.seed)
        self.reward_fn = reward_for_task(cfg.task)
        self.model_cfg, params = _model(cfg, self.tok)
        self.prompt_len = prompt_length(
            self.tok, [("train", self.train_src), ("test", self.test_src)], cfg.max_prompt_len,
            self.model_cfg.max_seq_len, "TrainConfig.max_prompt_len")
        validate(cfg.replace(max_prompt_len=self.prompt_len),
                 data_parallel=shd.data_parallel_size(self.mesh),
                 model_max_seq_len=self.model_cfg.max_seq_len)
        self.eval_rows = [self.test_src[i] for i in range(min(cfg.eval_prompts,
                                                              len(self.test_src)))]

        self.hp, tx, lr_fn = optimizer_for(cfg, cfg.base_lr)
        self.states = (shard_train_state(self.mesh, create_train_state(params, tx, cfg.seed)),)
        loss_cfg = LossConfig(clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                              dual_clip=cfg.dual_clip or None, agg=cfg.agg,
                              temperature=cfg.temperature, kl_coef=cfg.kl_coef,
                              kl_kind=cfg.kl_kind, entropy_coef=cfg.entropy_coef,
                              vf_clip=cfg.vf_clip or None, gamma=cfg.gamma, lam=cfg.lam)
        common = dict(cfg=self.model_cfg, loss_cfg=loss_cfg, micro_batches=cfg.micro_batches)
        if cfg.algo == "grpo":
            self.step_fn = make_train_step(grpo_step, self.states, mesh=self.mesh, tx=tx,
                                           lr_fn=lr_fn, group_size=cfg.group_size, **common)
        else:
            _, ctx, clr_fn = optimizer_for(cfg, cfg.critic_base_lr)
            critic = init_critic_from_actor(params, jax.random.PRNGKey(cfg.seed + 1))
            self.states += (shard_train_state(self.mesh, create_train_state(critic, ctx,
                                                                            cfg.seed + 1)),)
            self.step_fn = make_train_step(ppo_step, self.states, mesh=self.mesh, actor_tx=tx,
                                           critic_tx=ctx, actor_lr_fn=lr_fn,
                                           critic_lr_fn=clr_fn, **common)

    def _dummy_batch(self):
        cfg = self.cfg
        B, T = cfg.batch_train, self.prompt_len + cfg.max_new_tokens
        z = dict(tokens_BT=np.zeros((B, T), np.int32), valid_BT=np.ones((B, T), bool),
                 loss_mask_BT=np.ones((B, T), bool), old_logp_BT=np.zeros((B, T), np.float32))
        if cfg.algo == "grpo":
            return GRPOBatch(advantages=np.zeros((B,), np.float32), **z)
        return PPOBatch(rewards_B=np.zeros((B,), np.float32), **z)

    def compile(self) -> float:
        """Compile the update (AOT, fixed shapes) and the rollout; returns seconds spent.

        Compilation is a one-off cost, so it is timed here and kept out of time_s: the
        throughput q of a run must not depend on how many steps the run happens to take.
        """
        t0 = time.perf_counter()
        step = self.step_fn
        compiled = step.jitted.lower(*self.states, self._dummy_batch()).compile()

        def run_compiled(*args):
            shd.check_batch_divisible(self.mesh, args[-1])
            return compiled(*args)

        self.step_fn = run_compiled
        warm = [{"prompt": self.train_src[0]["prompt"]}] * self.cfg.prompts_per_step
        self.sample(warm, self.cfg.group_size, 0, self.cfg.temperature, score=False)
        if self.cfg.algo == "grpo":
            self.advantages(np.zeros((self.cfg.batch_train,), np.float32))
        return time.perf_counter() - t0

    @property
    def params(self):
        return self.states[0].params

    # ------------------------------------------------------------------ rollout + update

    def sample(self, examples, group: int, seed, temperature: float, score: bool = True):
        prompts = [self.tok.encode(e["prompt"]) for e in examples for _ in range(group)]
        t0 = time.perf_counter()
        C = self.cfg.generate_chunk  # chunk c samples with fold_in(seed, c); one chunk: seed
        chunks = [generate(self.model_cfg, self.params, prompts[i:i + C],
                           max_new_tokens=self.cfg.max_new_tokens, temperature=temperature,
                           top_k=self.cfg.top_k, top_p=self.cfg.top_p, eos_id=self.tok.eos_id,
                           pad_id=self.tok.pad_id, mesh=self.mesh,
                           seed=seed if len(prompts) <= C else
                           jax.random.fold_in(_as_key(seed), i // C))
                  for i in range(0, len(prompts), C)]
        tokens, logps, lengths = (np.concatenate([np.asarray(getattr(o, f)) for o in chunks])
                                  for f in ("tokens", "logprobs", "lengths"))
        self.last_decode_s = time.perf_counter() - t0  # the jitted decode, transfers included
        if not score:
            return prompts, tokens, logps, lengths, None
        texts = decode_responses(self.tok, tokens, lengths)
        rewards = self.reward_fn.score_batch(texts, [e for e in examples for _ in range(group)])
        return prompts, tokens, logps, lengths, rewards

    def advantages(self, rewards_B):
        return np.asarray(_group_advantages(jnp.asarray(rewards_B), self.cfg.group_size,
                                            self.cfg.advantage))

    def train_step(self, step: int) -> dict[str, Any]:
        cfg, G = self.cfg, self.cfg.group_size
        t0 = time.perf_counter()
        examples = self.stream.next_batch()
        gen_seed = jax.random.fold_in(jax.random.PRNGKey(cfg.seed), step)
        prompts, tokens_BM, logp_BM, len_B, rewards_B = self.sample(examples, G, gen_seed,
                                                                    cfg.temperature)
        gen_s = time.perf_counter() - t0

        t1 = time.perf_counter()
        packed = pack_sequences(prompts, tokens_BM, len_B, prompt_len=self.prompt_len,
                                pad_id=self.tok.pad_id)
        old_logp_BT = np.zeros(packed["tokens_BT"].shape, np.float32)
        old_logp_BT[:, self.prompt_len:] = np.where(packed["response_BT"][:, self.prompt_len:],
                                                       logp_BM, 0.0)
        groups_PG = rewards_B.reshape(-1, G)
        zero_var_P = groups_PG.max(1) == groups_PG.min(1)
        keep_B = np.repeat(~zero_var_P, G) if (cfg.filter_zero_variance and G > 1) else \
            np.ones_like(rewards_B, bool)
        loss_mask_BT = packed["response_BT"] & keep_B[:, None]
        retained = int(keep_B.sum())
        rec: dict[str, Any] = {}
        if retained:  # an all-filtered batch makes no update (Adam would still move params)
            if cfg.algo == "grpo":
                adv_B = self.advantages(rewards_B)
                batch = GRPOBatch(tokens_BT=packed["tokens_BT"], valid_BT=packed["valid_BT"],
                                  loss_mask_BT=loss_mask_BT, old_logp_BT=old_logp_BT,
                                  advantages=adv_B.astype(np.float32))
            else:
                batch = PPOBatch(tokens_BT=packed["tokens_BT"], valid_BT=packed["valid_BT"],
                                 loss_mask_BT=loss_mask_BT, old_logp_BT=old_logp_BT,
                                 rewards_B=rewards_B.astype(np.float32))
            t2 = time.perf_counter()
            *states, metrics = self.step_fn(*self.states, batch)
            self.states = tuple(states)
            metrics = jax.device_get(metrics)
            rec["update_s"] = time.perf_counter() - t2  # the jitted update, transfers included
            rec.update(_scalar_metrics(metrics, cfg.batch_train // cfg.micro_batches,
                                       cfg.max_grad_norm))
        train_s = time.perf_counter() - t1
        rec.update(
            reward_mean=float(rewards_B.mean()), accuracy=float((rewards_B > 0).mean()),
            response_len=float(len_B.mean()), retained=retained,
            generated=len(rewards_B), zero_var_groups=int(zero_var_P.sum()),
            gen_s=gen_s, decode_s=self.last_decode_s, train_s=train_s,
            batch_train=cfg.batch_train,
            batch_gen=cfg.batch_train, reward_failures=int(self.reward_fn.failures))
        return rec

    def evaluate(self, step: int) -> dict[str, float]:
        """Held-out accuracy: mean over eval_samples samples per prompt, plus greedy."""
        cfg = self.cfg
        seed = jax.random.fold_in(jax.random.PRNGKey(cfg.seed + 7919), step)
        *_, r_sampled = self.sample(self.eval_rows, cfg.eval_samples, seed, cfg.temperature)
        *_, r_greedy = self.sample(self.eval_rows, 1, seed, 0.0)
        ok_PK = (r_sampled > 0).reshape(len(self.eval_rows), cfg.eval_samples)
        return {"score": float(ok_PK.mean()), "eval_n": int(ok_PK.size),
                "eval_se": eval_se(ok_PK), "score_greedy": float((r_greedy > 0).mean()),
                "eval_n_greedy": int(r_greedy.size)}


def _as_key(seed):
    return jax.random.PRNGKey(seed) if isinstance(seed, int) else seed


def eval_se(ok_PK: np.ndarray) -> float | None:
    """SE of the eval score as an estimate of the policy's mean accuracy on this fixed prompt
    set: sqrt(sum_p var_p / K) / P with var_p the unbiased within-prompt variance of K samples.

    Every run is evaluated on the same prompts, so which prompts were drawn is common to all
    of them and cancels in comparisons; what differs between two evals is the sampling of
    responses. None with one sample per prompt (then the analysis uses eval_n, binomially).
    """
    P, K = ok_PK.shape
    if K < 2:
        return None
    var_P = np.var(ok_PK.astype(np.float64), axis=1, ddof=1)
    return float(np.sqrt(var_P.sum() / K) / P)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _group_advantages(rewards_N, group_size, estimator):
    return losses.group_advantages(rewards_N, group_size, estimator=estimator)


def _scalar_metrics(m: dict, micro_batch_size: int, max_grad_norm: float) -> dict[str, Any]:
    """Step metrics as JSON under the names of docs/API.md ("Gradient-norm fields"): GRPO's
    policy is the actor, so its grad_* metrics become actor_grad_*; micro-batch norms a list."""
    out = {}
    for k, v in m.items():
        if k == "grads":
            continue
        a = np.asarray(v)
        if k.startswith("grad_"):       # GRPO: the policy is the actor
            k = "actor_" + k
        if k.endswith("grad_sqnorm_micro"):
            out[k] = a.reshape(-1).tolist()
        elif a.ndim == 0:
            out[k] = float(a)
    out["micro_batch_size"] = micro_batch_size
    if max_grad_norm and "actor_grad_norm" in out:
        out["clipped"] = bool(out["actor_grad_norm"] > max_grad_norm)
    if "actor_lr" in out:
        out["lr"] = out["actor_lr"]
    return out


# What the step-0 eval depends on: the initial params, the eval prompts and the sampler.
_EVAL0_FIELDS = ("model", "hf_checkpoint", "init_checkpoint", "tokenizer", "task", "task_kwargs",
                 "data_dir", "num_train_examples", "num_test_examples", "max_prompt_len",
                 "eval_prompts", "eval_samples", "temperature", "top_k", "top_p",
                 "max_new_tokens", "seed", "generate_chunk")


def initial_eval(run: "Run", cache_dir: str | None = None) -> dict[str, Any]:
    """run.evaluate(0), shared through `cache_dir` by runs whose _EVAL0_FIELDS agree.

    The step-0 eval is a pure function of those fields (same params, prompts and sampling
    seed), so the runs of a sweep that start from one warm-start checkpoint with the same seed
    get bit-identical results; a cached copy saves one full eval per such run. The key
    includes the checkpoint's modification time, so a retrained checkpoint is re-evaluated.
    """
    if not cache_dir:
        return run.evaluate(0)
    key = {k: getattr(run.cfg, k) for k in _EVAL0_FIELDS}
    for k in ("hf_checkpoint", "init_checkpoint"):
        if key[k]:
            key[k + "_mtime"] = os.path.getmtime(os.path.expanduser(key[k]))
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    path = os.path.join(cache_dir, digest[:20] + ".json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)["eval"]
    ev = run.evaluate(0)
    os.makedirs(cache_dir, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump({"key": key, "eval": ev}, f, default=str)
    os.replace(path + ".tmp", path)
    return ev


def run_training(cfg: TrainConfig, *, progress: bool = True,
                 stop_after_steps: int | None = None,
                 eval0_cache: str | None = None) -> dict[str, Any]:
    """Train (or resume) in cfg.run_dir until max_steps / the response budget / the target.

    stop_after_steps: return early after this many steps of this call (tests simulate a crash).
    eval0_cache: a directory where runs share their step-0 eval (see `initial_eval`).
    Returns the final record with "finished" True when the run reached its end.
    """
    run = Run(cfg)
    compile_s = run.compile()
    os.makedirs(cfg.run_dir, exist_ok=True)
    write_config(cfg.run_dir, cfg)
    log = MetricsLog(os.path.join(cfg.run_dir, "metrics.jsonl"))
    ckpt = Checkpointer(os.path.join(cfg.run_dir, "checkpoints"))
    counters = {"step": 0, "responses": 0, "responses_generated": 0, "time_s": 0.0,
                "reached_at": None}
    if ckpt.latest_step() is not None:
        run.states, meta = ckpt.restore(None, run.states)
        run.states = tuple(run.states)
        counters.update(meta["counters"])
        run.stream.restore(meta["data_position"])
        run.reward_fn.failures = meta.get("reward_failures", 0)
        log.truncate_after(counters["step"])
    else:
        log.truncate_after(-1)
        ev = initial_eval(run, eval0_cache)  # the untrained score: curves start at N = 0
        log.write({"step": 0, "responses": 0, "time_s": 0.0, **ev, "compile_s": compile_s})
        if cfg.target and ev["score"] >= cfg.target:
            counters["reached_at"] = 0

    def save():
        ckpt.save(counters["step"], run.states,
                  {"counters": counters, "data_position": run.stream.position,
                   "reward_failures": int(run.reward_fn.failures)})

    def finished() -> bool:
        c = counters
        if c["step"] >= cfg.max_steps:
            return True
        if cfg.max_responses and c["responses"] >= cfg.max_responses:
            return True
        return c["reached_at"] is not None and \
            c["responses"] >= c["reached_at"] * (1.0 + cfg.target_margin)

    by_responses = bool(cfg.max_responses)  # budgeted runs show responses, others steps
    bar = tqdm(total=cfg.max_responses if by_responses else cfg.max_steps,
               initial=counters["responses" if by_responses else "step"],
               disable=not progress, desc=os.path.basename(os.path.normpath(cfg.run_dir)),
               unit="resp" if by_responses else "step", leave=False)
    last_score, steps_this_call = None, 0
    while not finished():
        if stop_after_steps is not None and steps_this_call >= stop_after_steps:
            break
        step = counters["step"] + 1
        t0 = time.perf_counter()
        rec = run.train_step(step)
        counters["step"] = step
        counters["responses"] += rec["retained"]
        counters["responses_generated"] += rec["generated"]
        counters["time_s"] += time.perf_counter() - t0
        log.write({"step": step, "responses": counters["responses"],
                   "responses_generated": counters["responses_generated"],
                   "time_s": counters["time_s"], **rec})
        if step % cfg.eval_every == 0:
            t_eval = time.perf_counter()
            ev = run.evaluate(step)
            last_score = ev["score"]
            log.write({"step": step, "responses": counters["responses"],
                       "time_s": counters["time_s"], **ev,
                       "eval_s": time.perf_counter() - t_eval})
            if cfg.target and counters["reached_at"] is None and ev["score"] >= cfg.target:
                counters["reached_at"] = counters["responses"]
        if step % cfg.checkpoint_every == 0:
            save()
        steps_this_call += 1
        bar.update(rec["retained"] if by_responses else 1)
        resp_s = counters["responses"] / max(counters["time_s"], 1e-9)
        bar.set_postfix(resp_s=f"{resp_s:.0f}", reward=f"{rec['reward_mean']:.3f}",
                        score="-" if last_score is None else f"{last_score:.3f}")
    bar.close()
    done = finished()
    if done:
        if ckpt.latest_step() != counters["step"]:
            save()
        with open(os.path.join(cfg.run_dir, DONE_FILE), "w") as f:
            json.dump(dict(counters), f)
    ckpt.close()
    return {**counters, "finished": done}
