"""One GRPO/PPO run: rollout -> rewards -> batch (rl/batch.py) -> update (advantages and the
KL term inside the jitted step, rl/steps.py) -> log -> eval -> checkpoint.

Rollout: `generate` over the step's P prompts x G samples (synchronous), or, with
gen_batch_ratio > 1 (or --rollout=engine), the next batch of the slot engine's asynchronous
partial rollout (rl/partial.py: B_gen sequences in flight, the P oldest groups per update,
staleness-bounded; the update is then decoupled PPO: cfg.loss.decoupled).

Everything a user can change is a TrainConfig field; this module is the only place where the
pieces meet. Values flow through the loop explicitly: each rollout path returns a `Rollout`
(rl/rollout.py), the reward helper returns (rewards, failures), the update takes its static
options as one `StepOptions` (rl/config.py), and the loop's counters and train states are a
`LoopState` that `Run.train_step` / `Run.evaluate` take and return; `Run` holds only what does
not change while the run runs (plus the stream and engine that read the data). Accounting
(docs/science.md, Time to target):
  responses            cumulative *retained* responses (zero-variance groups filtered out
                       when filter_zero_variance; they still count in responses_generated)
  response_tokens      cumulative loss tokens of those responses (episodes: assistant tokens)
  time_s               cumulative wall seconds of generation + rewards + update (eval excluded,
                       reported as eval_s on eval records)
Resume: the run directory holds an orbax checkpoint (params, optimizer state, rng, step,
data position, counters). Restarting the same command continues from the last checkpoint
and truncates metrics.jsonl to it, so the file never holds duplicate or missing steps.
"""
from __future__ import annotations

import functools
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from jaxrl_scale import distributed as dist
from jaxrl_scale import interrupt
from jaxrl_scale import optim
from jaxrl_scale import sharding as shd
from jaxrl_scale.checkpoint import Checkpointer
from jaxrl_scale.experiment.checks import check_lora, check_packing
from jaxrl_scale.experiment.common import write_json
from jaxrl_scale.experiment.config import (TrainConfig, check_resume, validate_for_devices,
                                           write_config)
from jaxrl_scale.experiment.eval_cache import initial_eval
from jaxrl_scale.experiment.inputs import load_inputs
from jaxrl_scale.experiment.metrics import MetricsLog
from jaxrl_scale.experiment.records import (NONFINITE_STREAK, NonfiniteUpdatesError, eval_se,
                                            pass_k_fields, skipped_streak, step_metrics,
                                            target_stop)
from jaxrl_scale.experiment.rundir import DONE_FILE, claim_run_dir, done_counters
from jaxrl_scale.experiment.schedule import ScheduleState, after_step, reachable_prompts
from jaxrl_scale.experiment.states import (born_state, optimizer_for, start_params,
                                           trained_part)
from jaxrl_scale.experiment.writers import close_all, make_writers, write_all
from jaxrl_scale.models import lora
from jaxrl_scale.rl import exact_eval
from jaxrl_scale.rl.batch import RolloutBatch, check_shared_prompts, rollout_batch
from jaxrl_scale.rl.config import StepOptions
from jaxrl_scale.rl.multiturn import env_for_run, mask_observations, score_episodes
from jaxrl_scale.rl.packed import PackedGRPO
from jaxrl_scale.rl.partial_turns import slot_rollout
from jaxrl_scale.rl.refill import Refill, refill_rollout
from jaxrl_scale.rl.rollout import LoopState, Rollout, SamplingSettings, generate_rollout
from jaxrl_scale.rl.scoring import scorer_for_run
from jaxrl_scale.rl.state import state_shardings
from jaxrl_scale.rl.steps import grpo_step, make_train_step, ppo_step, score_tokens
from jaxrl_scale.rl.value import init_critic_from_actor
from jaxrl_scale.sampling.engine import SlotEngine


def stop_requested() -> bool:
    """Ctrl-C was pressed (interrupt.deferred_sigint); in a multi-process run, on process 0
    (a collective: every process must ask at the same point, and all stop together)."""
    if jax.process_count() == 1:
        return interrupt.requested()
    return bool(dist.broadcast(np.int32(interrupt.requested())))


class Run:
    """The static pieces of one run (built once; the loop below is the orchestration): the
    config, mesh, tokenizer, data, reward function, model config, the jitted update and the
    frozen reference. What changes while the run runs is a `LoopState` (rl/rollout.py) that
    `train_step` and `evaluate` take and return; the prompt stream and the slot engine are
    the run's stateful readers (their position is checkpointed as data_position)."""

    def __init__(self, cfg: TrainConfig):
        # cheap checks first: no weight is read and nothing compiled on bad input
        self.mesh = validate_for_devices(cfg)
        self.cfg = cfg
        self.tok, self.train_src, self.test_src, self.model_cfg, self.prompt_len = \
            load_inputs(cfg)
        self.sampling = SamplingSettings(cfg.sampling, cfg.max_new_tokens, self.tok.eos_id,
                                         self.tok.pad_id, cfg.generate_chunk)
        check_packing(cfg.replace(max_prompt_len=self.prompt_len),
                      shd.data_parallel_size(self.mesh), self.model_cfg)
        from jaxrl_scale.data import PromptStream
        from jaxrl_scale.data.remote_rewards import reward_for_run
        # The engine admits one prompt group at a time; the example order is the same.
        self.stream = PromptStream(self.train_src, 1 if cfg.use_engine else cfg.prompts_per_step,
                                   cfg.seed)
        self.reward_fn = reward_for_run(cfg, self.tok)   # task, function, server, judge, model
        self.env = env_for_run(cfg, self.tok, self.prompt_len)      # --env: multi-turn episodes
        self.scorer = scorer_for_run(cfg, self.tok, self.reward_fn)  # rewards during decode
        params = start_params(cfg, self.model_cfg, self.mesh)
        self.eval_rows = [self.test_src[i] for i in range(min(cfg.eval_prompts,
                                                              len(self.test_src)))]

        self.lora = cfg.lora
        if self.lora is not None:   # the model's own checks (an MoE model has no dense MLP)
            check_lora(cfg, self.model_cfg)
        # GRPO's G responses share their prompt: the update runs it once per group (not
        # with --env, whose episodes' first messages are the environment's).
        self.shared_prompt_len = self.prompt_len if (
            cfg.algo == "grpo" and cfg.share_prompt and cfg.group_size > 1 and not cfg.env) else 0
        options = self._options(cfg)
        # The initial train state(s): the loop's first LoopState (`initial_state`) and the
        # template of shapes and shardings for compiling and restoring; the update donates
        # them, so the loop never reads them back from here.
        self.init_states = (born_state(self.mesh, self.model_cfg, params, options.tx, cfg.seed,
                                       self.lora),)
        self._merge = None
        if self.lora is not None:   # decoding runs the merged weights: one merge per update
            base = self.init_states[0].frozen
            self._merge = jax.jit(lambda b, a: lora.merge(b, a, self.lora.scale),
                                  out_shardings=shd.tree_shardings(self.mesh, base))
        if cfg.algo == "ppo":
            critic = init_critic_from_actor(self.init_states[0].params,
                                            jax.random.PRNGKey(cfg.seed + 1))
            self.init_states += (born_state(self.mesh, self.model_cfg, critic,
                                            options.critic_tx, cfg.seed + 1),)
        # the update at each P a batch schedule reaches (`use_prompts`), built once
        self._at = {cfg.prompts_per_step: (cfg, *self._update_parts(cfg, options))}
        self.step_fn, self.packed, self.critic_schedule = self._at[cfg.prompts_per_step][1:]
        # KL to a frozen reference: the initial policy (rebuilt the same way on resume).
        # (Off-policy rollouts need no scoring pass: cfg.loss.decoupled, see LossConfig.)
        self._exact_scorer = None   # built at the first exact eval (rl/exact_eval.py)
        # all eval rows in one call, unless their [rows, T, vocab] log-probs pass 2^28 floats
        self._exact_chunk = max(1, min(len(self.eval_rows), 2 ** 28 // (
            (self.prompt_len + cfg.max_new_tokens) * self.model_cfg.vocab_size)))
        self.ref_params = self.score_ref = None
        if cfg.loss.kl_coef:
            self.ref_params = jax.tree.map(jnp.copy, self.policy_params(self.init_states[0]))
            rows = shd.batch_sharding(self.mesh)
            self.score_ref = jax.jit(
                functools.partial(score_tokens, self.model_cfg,
                                  temperature=cfg.sampling.temperature,
                                  micro_batches=cfg.micro_batches),
                in_shardings=(state_shardings(self.mesh, self.ref_params), rows, rows),
                out_shardings=rows)
        self.partial = None
        if cfg.use_engine:
            engine = SlotEngine(self.model_cfg, slots=cfg.batch_gen, prompt_len=self.prompt_len,
                                max_new_tokens=cfg.max_new_tokens, sampling=cfg.sampling,
                                eos_id=self.tok.eos_id, pad_id=self.tok.pad_id, mesh=self.mesh,
                                steps_per_call=cfg.engine_steps)
            self.partial = slot_rollout(   # with --env: episodes (rl/partial_turns.py)
                engine, lambda: self.stream.next_batch()[0], self.tok.encode_prompt,
                env=self.env, tokenizer=self.tok, prompts_per_step=cfg.prompts_per_step,
                group_size=cfg.group_size, max_staleness=cfg.staleness_bound,
                recompute_kv=cfg.recompute_kv, scorer=self.scorer)

    def close(self) -> None:
        """End what the run started beside its thread: the episodes in flight (and their
        environments' worker processes) and the reward thread (a sweep runs many runs in
        one process)."""
        for part in (self.partial, self.scorer):
            getattr(part, "close", lambda: None)()

    def _options(self, cfg: TrainConfig) -> StepOptions:
        """The update's static options at cfg's batch: updates_per_rollout = U minibatches of
        whole groups, one update each, in update_epochs = E passes, so the lr rule sees the
        update's batch, B_train / U (PPO's critic: its own minibatches and rule)."""
        U, E = cfg.updates_per_rollout, cfg.update_epochs
        tx, lr_fn = optimizer_for(cfg, cfg.optim.base_lr, cfg.batch_train // U)
        if cfg.algo == "grpo":
            return StepOptions(self.model_cfg, tx, cfg.loss, cfg.micro_batches, lr_fn=lr_fn,
                               group_size=cfg.group_size,
                               shared_prompt_len=self.shared_prompt_len, num_minibatches=U,
                               epochs=E, remat=cfg.remat,
                               lora_scale=self.lora.scale if self.lora else None)
        ctx, clr_fn = optimizer_for(cfg, cfg.optim.critic_base_lr,
                                    cfg.batch_train // cfg.critic_minibatches,
                                    cfg.optim.critic_lr_rule)
        return StepOptions(self.model_cfg, tx, cfg.loss, cfg.micro_batches, lr_fn=lr_fn,
                           critic_tx=ctx, critic_lr_fn=clr_fn, num_minibatches=U, epochs=E,
                           remat=cfg.remat, critic_minibatches=cfg.critic_minibatches,
                           critic_epochs=cfg.critic_epochs)

    def _update_parts(self, cfg: TrainConfig, options: StepOptions):
        """(step_fn, packed update or None, PPO critic's schedule or None) at cfg's batch."""
        step_fn = make_train_step(grpo_step if cfg.algo == "grpo" else ppo_step,
                                  self.init_states, mesh=self.mesh, options=options)
        packed = PackedGRPO(options, cfg.token_budget, self.mesh) if cfg.token_budget else None
        critic = None if cfg.algo != "ppo" else {
            "critic_updates": cfg.critic_minibatches * cfg.critic_epochs,
            "critic_batch": cfg.batch_train // cfg.critic_minibatches,
            "critic_micro_batch_size": cfg.batch_train // (cfg.critic_minibatches *
                                                           cfg.micro_batches)}
        return step_fn, packed, critic

    def use_prompts(self, prompts: int) -> None:
        """Run the next steps at `prompts` per step (a batch schedule's change,
        experiment/schedule.py): the config, the stream's batch and the update at that batch,
        its lr by the run's rule there. The train states carry over unchanged
        (experiment/states.py: the Adam state does not depend on the lr)."""
        if prompts not in self._at:
            cfg = next(iter(self._at.values()))[0].replace(prompts_per_step=prompts)
            self._at[prompts] = (cfg, *self._update_parts(cfg, self._options(cfg)))
        self.cfg, self.step_fn, self.packed, self.critic_schedule = self._at[prompts]
        self.stream.batch_size = prompts

    def policy_params(self, state):
        """The full params of the policy in a train state, for decoding and scoring: the
        state's params, or under LoRA its base with the adapters merged in (a new array per
        call; decoding then costs what the base model's does)."""
        if state.frozen is None:
            return state.params
        return self._merge(state.frozen, state.params)

    def describe(self) -> dict[str, Any]:
        """What the step-0 record adds for a LoRA run (nothing for a full update): the
        adapters and the trained vs the model's parameter counts."""
        st = self.init_states[0]
        if self.lora is None:
            return {}
        return {"lora_rank": self.lora.rank, "lora_alpha": self.lora.alpha,
                "lora_targets": ",".join(self.lora.targets),
                "trainable_params": lora.tree_size(st.params),
                "model_params": lora.tree_size(st.frozen)}

    @property
    def data_position(self) -> int:
        """Stream position of the first example not yet trained on: groups still in flight
        are read (and generated) again after a resume."""
        waiting = self.partial.waiting if self.partial is not None else 0
        return self.stream.position - waiting

    def initial_state(self) -> LoopState:
        """The loop's state before the first update (a resume restores over it)."""
        return LoopState(states=self.init_states)

    def _dummy_batch(self):
        cfg = self.cfg
        B, T = cfg.batch_train, self.prompt_len + cfg.max_new_tokens
        zeros_BT = np.zeros((B, T), np.float32)
        return RolloutBatch(tokens_BT=np.zeros((B, T), np.int32), valid_BT=np.ones((B, T), bool),
                            loss_mask_BT=np.ones((B, T), bool), old_logp_BT=zeros_BT,
                            rewards_B=np.zeros((B,), np.float32),
                            ref_logp_BT=zeros_BT if cfg.loss.kl_coef else None)

    def compile(self):
        """Compile the update (AOT, fixed shapes) and the rollout. Returns (update, seconds):
        the compiled update, called as update(*states, batch) like `step_fn`, and the
        seconds spent.

        Compilation is a one-off cost, so it is timed here and kept out of time_s: the
        throughput q of a run must not depend on how many steps the run happens to take.
        """
        t0 = time.perf_counter()
        mesh = self.mesh
        if self.packed is not None:   # its micro-batch shape and the optimizer step
            update = self.packed
            update.warm(self.init_states[0], jax.device_put(self._dummy_batch(),
                                                            shd.batch_sharding(mesh)))
        else:
            shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                  self._dummy_batch())
            compiled = self.step_fn.jitted.lower(*self.init_states, shapes).compile()

            def update(*args):
                shd.check_batch_divisible(mesh, args[-1])
                return compiled(*args)

        cfg, params = self.cfg, self.policy_params(self.init_states[0])
        if self.partial is not None:   # every admission bucket (whole groups) and the decode
            self.partial.engine.warm(params, range(cfg.group_size, cfg.batch_gen + 1,
                                                   cfg.group_size), cfg.recompute_kv)
        else:
            sizes = {cfg.prompts_per_step, cfg.refill_round if cfg.refill else 0} - {0}
            for n in sorted(sizes):   # the step's rollout, and a refill round's when it differs
                warm = [self.train_src[0]] * n   # a real row: an --env factory reads it
                self.sample(params, warm, cfg.group_size, 0, cfg.sampling.temperature,
                            score=False)
        if self.score_ref is not None:
            dummy = jax.device_put(self._dummy_batch(), shd.batch_sharding(self.mesh))
            self.score_ref(self.ref_params, dummy.tokens_BT, dummy.valid_BT)
        return update, time.perf_counter() - t0

    # ------------------------------------------------------------------ rollout + update

    def sample(self, params, examples, group: int, seed, temperature: float,
               score: bool = True) -> Rollout:
        """`generate` over examples x group samples at `temperature`
        (rl/rollout.generate_rollout, its chunks scored as they decode unless not `score`), or
        --env's episodes (rl/multiturn.py)."""
        if self.env is not None:
            return self.env.rollout(self.model_cfg, params, examples, group, self.tok,
                                    self.sampling.with_temperature(temperature), seed=seed,
                                    mesh=self.mesh)
        return generate_rollout(self.model_cfg, params, examples, group, self.tok.encode_prompt,
                                self.sampling.with_temperature(temperature), seed=seed,
                                mesh=self.mesh, scorer=self.scorer if score else None)

    def rewards(self, r: Rollout) -> tuple[np.ndarray, int]:
        """(rewards of all B rows, reward calls that failed on every process): those the
        rollout carries (scored during its decode, or an episode's), else scored now."""
        if r.rewards_B is not None:
            return np.asarray(r.rewards_B, np.float32), r.reward_failures
        return score_episodes(r, self.tok, self.reward_fn)

    def rollout(self, params, step: int, seed) -> Rollout:
        """The rollout of update `step`: `generate` over the step's prompts, or the slot
        engine's next batch (trained at policy version step - 1)."""
        cfg = self.cfg
        if self.partial is None:
            return self.sample(params, self.stream.next_batch(), cfg.group_size, seed,
                               cfg.sampling.temperature)
        return self.partial.next_batch(params, version=step - 1, seed=seed)

    def refill(self, params, first: Rollout, rewards_B: np.ndarray, seed) -> Refill:
        """DAPO dynamic sampling (rl/refill.py): further rounds of cfg.refill_round new
        prompts x G, round k sampled with fold_in(seed, k), until P groups with a reward
        spread are kept or cfg.refill_cap rounds ran."""
        cfg = self.cfg
        return refill_rollout(
            first, rewards_B, lambda k: self.sample(
                params, self.stream.next_batch(cfg.refill_round), cfg.group_size,
                jax.random.fold_in(seed, k), cfg.sampling.temperature), self.rewards,
            groups=cfg.prompts_per_step, cap=cfg.refill_cap)

    def train_step(self, loop: LoopState, update=None) -> tuple[LoopState, dict[str, Any]]:
        """rollout -> rewards -> batch -> (reference scores) -> update: (the loop state after
        update number loop.step + 1, the step's training record). `update`: the compiled
        step from `compile()` (default: `step_fn`, compiled at its first call)."""
        cfg, update = self.cfg, update or self.packed or self.step_fn
        step, t0, _ = loop.step + 1, time.perf_counter(), self.reward_fn.lap()   # not eval's
        gen_seed = jax.random.fold_in(jax.random.PRNGKey(cfg.seed), step)
        params = self.policy_params(loop.states[0])
        r = self.rollout(params, step, gen_seed)
        rewards_B, failed = self.rewards(r)
        seen_rewards, seen_lengths = rewards_B, r.lengths_B   # every response generated
        refill = None
        if cfg.refill:
            refill = self.refill(params, r, rewards_B, gen_seed)
            r, rewards_B, failed = refill.rollout, refill.rewards_B, failed + refill.failed
            seen_rewards, seen_lengths = refill.seen_rewards, refill.seen_lengths
        gen_s = time.perf_counter() - t0

        t1 = time.perf_counter()
        batch, accounting = rollout_batch(r.prompts, r.tokens_BM, r.logprobs_BM, r.lengths_B,
                                          rewards_B, prompt_len=self.prompt_len,
                                          pad_id=self.tok.pad_id, group_size=cfg.group_size,
                                          filter_zero_variance=cfg.filters_groups,
                                          eos_id=self.tok.eos_id, mask_truncated=cfg.mask_truncated,
                                          overlong_buffer=cfg.overlong_buffer,
                                          overlong_penalty=cfg.overlong_penalty)
        batch = mask_observations(batch, r, self.prompt_len)   # episodes: assistant tokens
        accounting["retained_tokens"] = int(np.asarray(batch.loss_mask_BT).sum())
        if refill is not None:   # the rounds' counts, not the trained batch's
            accounting.update(refill.counts)
        rec: dict[str, Any] = {}
        states = loop.states
        if self.shared_prompt_len:
            check_shared_prompts(batch, self.shared_prompt_len, cfg.group_size)
        if accounting["retained"]:  # an all-filtered batch makes no update (Adam would move)
            t2 = time.perf_counter()
            # placed explicitly: a multi-process jit takes no numpy for a sharded input
            batch = jax.device_put(batch, shd.batch_sharding(self.mesh))
            if self.score_ref is not None:
                batch = batch.replace(ref_logp_BT=self.score_ref(
                    self.ref_params, batch.tokens_BT, batch.valid_BT))
            *states, metrics = update(*states, batch)
            metrics = jax.device_get(metrics)
            rec["update_s"] = time.perf_counter() - t2  # reference + update, transfers included
            U, E = cfg.updates_per_rollout, cfg.update_epochs
            rec.update(step_metrics(metrics, cfg.batch_train // (U * cfg.micro_batches),
                                    cfg.optim.max_grad_norm, self.critic_schedule,
                                    actor_batch=cfg.batch_train // U if U * E > 1 else None))
        rec["updates"] = int(jax.device_get(states[0].step))   # the actor's, so far
        failures = loop.reward_failures + failed
        rec.update(
            reward_mean=float(seen_rewards.mean()), accuracy=float((seen_rewards > 0).mean()),
            response_len=float(seen_lengths.mean()), **accounting,
            gen_s=gen_s, decode_s=r.decode_s, train_s=time.perf_counter() - t1,
            batch_train=cfg.batch_train, batch_gen=cfg.batch_gen,
            reward_failures=failures, reward_s=self.reward_fn.lap(), **r.fields())
        loop = loop.counted(accounting).replace(states=tuple(states), step=step,
                                                reward_failures=failures)
        return loop, rec

    def evaluate(self, loop: LoopState) -> tuple[LoopState, dict[str, float]]:
        """Held-out accuracy at loop.step: mean over eval_samples samples per prompt (or, with
        eval_mode "exact", the mean probability of a rewarded sample), plus greedy; the loop
        state counts the eval's reward failures."""
        cfg = self.cfg
        seed = jax.random.fold_in(jax.random.PRNGKey(cfg.seed + 7919), loop.step)
        params = self.policy_params(loop.states[0])
        if cfg.eval_mode == "exact":
            return self._evaluate_exact(loop, params, seed)
        r_sampled, f_sampled = self.rewards(self.sample(
            params, self.eval_rows, cfg.eval_samples, seed, cfg.sampling.temperature))
        r_greedy, f_greedy = self.rewards(self.sample(params, self.eval_rows, 1, seed, 0.0))
        ok_PK = (r_sampled > 0).reshape(len(self.eval_rows), cfg.eval_samples)
        loop = loop.replace(reward_failures=loop.reward_failures + f_sampled + f_greedy)
        return loop, {"score": float(ok_PK.mean()), "eval_n": int(ok_PK.size),
                      "eval_se": eval_se(ok_PK), "score_greedy": float((r_greedy > 0).mean()),
                      "eval_n_greedy": int(r_greedy.size), **pass_k_fields(ok_PK, cfg.pass_k)}

    def _evaluate_exact(self, loop: LoopState, params, seed):
        """Mean P_exact over the eval prompts (rl/exact_eval.py): no sampling noise, so no
        eval_se or eval_n (the analysis takes the curve's own jitter), and no decode at all
        (no greedy score either: it would cost as much as the exact score)."""
        del seed   # nothing is sampled
        cfg = self.cfg
        if self._exact_scorer is None:
            self._exact_scorer = exact_eval.make_scorer(
                self.model_cfg, cfg.sampling.temperature, exact_eval.end_tokens(self.tok),
                self.mesh, params)
        p = exact_eval.answer_probability(
            self.model_cfg, params, self.tok, self.eval_rows, prompt_len=self.prompt_len,
            max_new_tokens=cfg.max_new_tokens, temperature=cfg.sampling.temperature,
            mesh=self.mesh, scorer=self._exact_scorer, chunk=self._exact_chunk)
        return loop, {"score": float(p.mean()), "eval_mode": "exact",
                      "eval_prompts": len(self.eval_rows)}


def run_training(cfg: TrainConfig, *, progress: bool = True,
                 stop_after_steps: int | None = None,
                 eval0_cache: str | None = None) -> dict[str, Any]:
    """Train (or resume) in cfg.run_dir until max_steps / the response budget / the target.

    stop_after_steps: return early after this many steps of this call (tests simulate a crash).
    eval0_cache: a directory where runs share their step-0 eval (see eval_cache.initial_eval).
    Returns the final record with "finished" True when the run reached its end.

    Multi-process (after `dist.initialize`): every process calls this with the same cfg and
    run_dir (a filesystem they share); they run the rollout, eval and update together over
    the global mesh and save each checkpoint together, and process 0 alone writes
    config.json, metrics.jsonl, the metric writers and DONE.json.
    """
    check_resume(cfg)   # a directory of another configuration is refused, before any work
    done = done_counters(cfg.run_dir)
    if done is not None:   # nothing to do, nothing to write (the directory may be read-only)
        return {**done, "finished": True}
    with claim_run_dir(cfg):   # writable and ours, before data, model and compile
        return _train(cfg, progress, stop_after_steps, eval0_cache)


def _train(cfg: TrainConfig, progress: bool, stop_after_steps: int | None,
           eval0_cache: str | None) -> dict[str, Any]:
    """run_training's body, with the run directory held. Ctrl-C (interrupt.deferred_sigint)
    is honoured between the phases and between steps: the step under way finishes, its
    records are written, a checkpoint is saved at it, then Interrupted is raised."""
    run = Run(cfg)
    if stop_requested():
        raise interrupt.Interrupted("stopped while loading the data and model; nothing new "
                                    "was trained")
    update, compile_s = run.compile()   # a Ctrl-C here waits for the compile (see interrupt.py)
    updates = {cfg.prompts_per_step: update}
    for p in reachable_prompts(cfg)[1:]:   # each batch a schedule may reach, before the clock
        run.use_prompts(p)
        updates[p], seconds = run.compile()
        compile_s += seconds
    if stop_requested():
        raise interrupt.Interrupted("stopped after compiling; nothing new was trained")
    primary = dist.is_primary()
    if primary:
        write_config(cfg.run_dir, cfg)
    log = MetricsLog(os.path.join(cfg.run_dir, "metrics.jsonl"))
    ckpt = Checkpointer(os.path.join(cfg.run_dir, "checkpoints"))
    loop, sched = run.initial_state(), ScheduleState(cfg.prompts_per_step)
    resumed = ckpt.latest_step() is not None
    if resumed:   # the newest checkpoint that reads (checkpoint.py falls back past bad ones)
        states, meta = ckpt.restore(None, trained_part(loop.states))
        states = [s.replace(frozen=init.frozen) for s, init in zip(states, loop.states)]
        loop = loop.replace(states=tuple(states), **meta["counters"],
                            reward_failures=meta.get("reward_failures", 0),
                            eval_scores=tuple(meta.get("eval_scores", ())))
        run.stream.restore(meta["data_position"])
        sched = ScheduleState.from_json(meta.get("schedule", sched.to_json()))
        if primary:
            log.truncate_after(loop.step)
    if len(updates) > 1:   # a schedule: the P of its (restored) state
        run.use_prompts(sched.prompts)
        update = updates[sched.prompts]
    # TensorBoard / W&B get every record metrics.jsonl gets; the steps after the restored
    # checkpoint are replayed, so the writers hide what a killed attempt logged from there.
    writers = make_writers(cfg.run_dir, tensorboard=cfg.tensorboard,
                           wandb_project=cfg.wandb_project, wandb_mode=cfg.wandb_mode or None,
                           config=cfg.to_json(),
                           purge_step=loop.step + 1 if resumed else 0) if primary else []

    def emit(record: dict) -> None:
        if primary:
            log.write(record)
            write_all(writers, record)

    if not resumed:
        if primary:
            log.truncate_after(-1)
        loop, ev = initial_eval(run, loop, eval0_cache)  # the untrained score: curves at N = 0
        emit({"step": 0, "responses": 0, "response_tokens": 0, "time_s": 0.0, **ev,
              "compile_s": compile_s, **run.describe()})
        loop = loop.replace(eval_scores=(float(ev["score"]),))
        if cfg.target and ev["score"] >= cfg.target:
            loop = loop.replace(reached_at=0, reached_step=0)

    def save(loop: LoopState) -> None:
        ckpt.save(loop.step, trained_part(loop.states),
                  {"counters": loop.counters(), "data_position": run.data_position,
                   "reward_failures": loop.reward_failures,
                   "eval_scores": list(loop.eval_scores),
                   **({"schedule": sched.to_json()} if cfg.batch_schedule != "none" else {})})

    def finished(c: LoopState) -> bool:
        if c.step >= cfg.max_steps:
            return True
        if cfg.max_responses and c.responses >= cfg.max_responses:
            return True
        if c.reached_at is None or c.responses < c.reached_at * (1.0 + cfg.target_margin):
            return False
        # target_evals > 0: stop once the monotone (isotonic) fit of this run's evals, the
        # curve the analysis reads N* from, reached the target target_evals evals ago; a
        # single noisy eval above the target is not enough (the fit may pool it down)
        return target_stop(c.eval_scores, cfg.target, cfg.target_evals)

    by_responses = bool(cfg.max_responses)  # budgeted runs show responses, others steps
    bar = tqdm(total=cfg.max_responses if by_responses else cfg.max_steps,
               initial=loop.responses if by_responses else loop.step,
               disable=not (progress and primary),
               desc=os.path.basename(os.path.normpath(cfg.run_dir)),
               unit="resp" if by_responses else "step", leave=False)
    last_score, steps_this_call, diverged, stopped = None, 0, None, False
    streak, skips = 0, int(jax.device_get(optim.nonfinite_count(loop.states[0].opt_state)))
    while not finished(loop):
        if stop_after_steps is not None and steps_this_call >= stop_after_steps:
            break
        if stop_requested():
            stopped = True
            break
        t0 = time.perf_counter()
        loop, rec = run.train_step(loop, update)
        loop = loop.replace(time_s=loop.time_s + time.perf_counter() - t0)
        step = loop.step
        sched, fields = after_step(cfg, sched, step, loop.responses, rec)
        rec.update(fields)
        if sched.prompts != run.cfg.prompts_per_step:   # the schedule changed the batch
            run.use_prompts(sched.prompts)
            update = updates[sched.prompts]
        emit({"step": step, **loop.position(), **rec})
        if step % cfg.eval_every == 0:
            t_eval = time.perf_counter()
            loop, ev = run.evaluate(loop)
            last_score = ev["score"]
            loop = loop.replace(eval_scores=loop.eval_scores + (float(ev["score"]),))
            emit({"step": step, **loop.position(), **ev, "eval_s": time.perf_counter() - t_eval})
            if cfg.target and loop.reached_at is None and ev["score"] >= cfg.target:
                loop = loop.replace(reached_at=loop.responses, reached_step=step)
        if step % cfg.checkpoint_every == 0:
            save(loop)
        steps_this_call += 1
        streak, skips = skipped_streak(streak, skips, rec)
        if streak >= NONFINITE_STREAK:
            diverged = NonfiniteUpdatesError(
                "base_lr", f"the last {streak} updates (steps {step - streak + 1}..{step}) "
                f"were all skipped as non-finite ({skips:g} skipped in all): this run cannot "
                "learn", "lower --base_lr or set --max_grad_norm, and check the rewards' scale; "
                f"rerun to resume from the last checkpoint ({cfg.run_dir})")
            break
        bar.update(rec["retained"] if by_responses else 1)
        resp_s = loop.responses / max(loop.time_s, 1e-9)
        bar.set_postfix(resp_s=f"{resp_s:.0f}", reward=f"{rec['reward_mean']:.3f}",
                        score="-" if last_score is None else f"{last_score:.3f}")
    bar.close()
    if diverged is not None:
        ckpt.close()
        close_all(writers + [run])
        raise diverged
    done = finished(loop)
    if stopped:
        kept = "nothing new was trained"
        if loop.step > 0:
            if ckpt.latest_step() != loop.step:
                save(loop)
            kept = f"checkpoint step {loop.step} saved in {ckpt.directory}"
        ckpt.close()
        close_all(writers + [run])
        raise interrupt.Interrupted(f"stopped after step {loop.step} of {cfg.run_dir}; {kept}")
    if done:
        if ckpt.latest_step() != loop.step:
            save(loop)
        if primary:
            write_json(os.path.join(cfg.run_dir, DONE_FILE), loop.counters())
    ckpt.close()
    close_all(writers + [run])
    return {**loop.counters(), "finished": done}
