"""Multi-turn rollouts against an environment (`--env=module:factory`, docs/usage.md,
Multi-turn environments).

An environment is plain Python: `factory(example)` returns an object with
    reset() -> str                                  the first user message (the prompt)
    step(assistant_text) -> (str, float, bool)      (observation, reward, done)
An episode alternates assistant turns and observations for at most `max_turns` assistant
turns. Its reward is the SUM of the rewards `step` returned (a failed episode: 0).

Layout of an episode in the `Rollout` (rl/rollout.py): the prompt is the encoded first
message; tokens_BM holds everything after it, assistant turns and observations in order, in
the M = max_new_tokens columns (the episode's token budget); logprobs_BM holds the behaviour
log-prob of each assistant token and 0 on observation tokens; `assistant_BM` marks the
assistant tokens, and `mask_observations` drops every other token from the update's loss mask
(observations are context the policy reads, not actions it took).

Decoding (sampling/turns.py): turn 1 is `generate`'s computation, each later turn continues
from the KV cache of the conversation so far (only the observation is fed). A GRPO group is G
episodes of one example; rows are prompt-major, in calls of at most settings.chunk rows with
`generate_rollout`'s seeds, so an environment that ends after one step reproduces the
single-turn rollout exactly.

Isolation (data/env_runner.py, `--env_isolation`): each episode's environment lives in a
worker process of its own ("process", forked from a clean fork server; a call that outlives
the episode's budget kills that process, and with it only that episode) or on a daemon thread
of its own ("thread": a hung call is abandoned, not killed, so it may keep a CPU busy). Every
turn's calls go to all live episodes at once, each waited on for what is left of its own
episode's `timeout_s` of environment time (the time of its own calls, timed where they ran).

Failures: a call that raises, outlives that budget, returns the wrong types (or a reward that
is not a finite real number: reward_runner.reward_problem), an observation over
`max_obs_tokens` tokens, or a worker process that dies (segfault, os._exit, the OOM killer)
ends that episode alone with reward 0 and counts in env_failures (env_timeouts).
"""
from __future__ import annotations

import dataclasses
import inspect
import logging
import time
from typing import Any, Callable, Optional, Sequence

import flax.struct
import jax
import numpy as np

from jaxrl_scale.data.env_runner import make_hosts
from jaxrl_scale.data.reward_runner import reward_problem
from jaxrl_scale.experiment.errors import ConfigError
from jaxrl_scale.models.tokenizer import decode_response
from jaxrl_scale.rl.rollout import Rollout, SamplingSettings, _as_key
from jaxrl_scale.sampling.turns import Conversation, conversation_slots

log = logging.getLogger(__name__)

# A text longer than this many characters per allowed token is refused before it is
# tokenized (a tokenizer's token is at most a few dozen characters; a runaway environment
# must not cost a tokenizer pass over megabytes).
MAX_CHARS_PER_TOKEN = 32
_OWN_ENVS_PREFIX = "jaxrl_scale.data.envs:"


def load_env_factory(spec: str) -> Callable[[dict], Any]:
    """The factory named by "package.module:factory" (a function or a class, called with the
    example dict). The module must be the user's own (the checks of data/rewards.py's
    load_reward_fn) or jaxrl_scale.data.envs. ValueError naming what is wrong."""
    from jaxrl_scale.data.rewards import import_user_module
    module_name, sep, attr = spec.partition(":")
    if not (sep and module_name and attr.isidentifier()):
        raise ValueError(f"{spec!r} is not of the form 'package.module:factory'")
    module = import_user_module(module_name, spec, own=spec.startswith(_OWN_ENVS_PREFIX))
    fn = getattr(module, attr, None)
    if not (inspect.isfunction(fn) or inspect.isclass(fn)):
        raise ValueError(f"{module_name!r} has no function or class {attr!r}")
    return fn


@flax.struct.dataclass
class EnvRollout(Rollout):
    """A `Rollout` of episodes: assistant_BM marks the assistant tokens, rewards_B is each
    episode's summed reward (float32), env_stats the step record's env_* fields."""

    assistant_BM: Any = None
    rewards_B: Any = None
    env_stats: tuple = flax.struct.field(pytree_node=False, default=())

    def fields(self) -> dict[str, Any]:
        return dict(self.env_stats)


def mask_observations(batch, r: Rollout, prompt_len: int):
    """The update batch with observation tokens out of the loss mask (unchanged for a
    single-turn rollout): response column j of row b is learned from only where
    r.assistant_BM[b, j]."""
    if not isinstance(r, EnvRollout):
        return batch
    keep_BT = np.zeros(np.shape(batch.loss_mask_BT), bool)
    keep_BT[:, prompt_len:] = r.assistant_BM
    return batch.replace(loss_mask_BT=np.asarray(batch.loss_mask_BT) & keep_BT)


def score_episodes(r: Rollout, tokenizer, reward_fn) -> tuple[np.ndarray, int]:
    """Run.rewards for either rollout: an episode's reward is the environment's (no reward
    call fails), a single-turn response's the reward function's (rl/rollout.score_rollout)."""
    if isinstance(r, EnvRollout):
        return np.asarray(r.rewards_B, np.float32), 0
    from jaxrl_scale.rl.rollout import score_rollout
    return score_rollout(r, tokenizer, reward_fn)


class ObservationCodec:
    """Token ids of an observation as the user turn that follows an assistant turn: with a
    chat template, the text the template writes after the assistant's end-of-turn token up
    to the next assistant generation prompt (read off a rendered conversation of a user turn,
    an assistant turn and the observation's user turn); without one, the observation's own
    ids. ValueError for a template that renders no end-of-turn token after the assistant."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.template = getattr(tokenizer, "chat_template", None)
        if self.template is None:
            return
        from jaxrl_scale.models.chat import encode_rendered
        self._encode = encode_rendered
        said, marker = "\x01said\x01", "\x01observation\x01"
        text = self.template.text([{"role": "user", "content": "u"},
                                   {"role": "assistant", "content": said},
                                   {"role": "user", "content": marker}], True)
        # the EOS token's text: the template's own name for it when that is the EOS id
        # (decode drops pad ids, and a tokenizer's pad is often its EOS)
        eos = self.template.tokens.get("eos_token")
        if not (isinstance(eos, str) and eos and
                getattr(tokenizer, "token_to_id", lambda _: None)(eos) == tokenizer.eos_id):
            eos = tokenizer.decode([tokenizer.eos_id])
        start = text.find(said) + len(said)
        end = text.find(eos, start) if start >= len(said) else -1
        obs = text.find(marker, end)
        if not eos or end < 0 or obs < 0:
            raise ValueError(f"the chat template writes no end-of-turn token ({eos!r}, the "
                             "tokenizer's EOS) after an assistant turn, so an observation "
                             "cannot follow the turn the model ended")
        # the sampled turn ends at EOS: what the template writes after it, then the user turn
        self._head, self._tail = text[end + len(eos):obs], text[obs + len(marker):]

    def encode(self, text: str) -> list[int]:
        if self.template is None:
            return list(self.tok.encode(text))
        return list(self._encode(self.tok, self._head + text + self._tail))


@dataclasses.dataclass
class _Episode:
    example: dict
    host: Any = None                  # where its environment lives (data/env_runner.py)
    tool_calls: Optional[int] = None  # the environment's count, where it keeps one
    spent_s: float = 0.0
    reward: float = 0.0
    turns: int = 0
    live: bool = True
    failed: bool = False


class EnvRunner:
    """Runs episodes of `factory` for the synchronous rollout (see the module docstring).
    max_prompt_len: the longest first message (tokens) the run's batch holds; turn_tokens:
    the most tokens one assistant turn may sample (None: what is left of the budget);
    isolation: "thread" or "process" (data/env_runner.py; ValueError for a factory a worker
    process cannot load by name)."""

    def __init__(self, factory: Callable[[dict], Any], *, name: str = "env",
                 max_turns: int = 4, max_obs_tokens: int = 256, timeout_s: float = 60.0,
                 max_prompt_len: int | None = None, turn_tokens: int | None = None,
                 isolation: str = "thread"):
        self.factory, self.name = factory, name
        self.isolation = isolation
        self.hosts = make_hosts(isolation, factory, MAX_CHARS_PER_TOKEN * int(max_obs_tokens))
        self.turn_tokens = turn_tokens   # one assistant turn's cap (None: the episode budget)
        self.max_turns, self.max_obs_tokens = int(max_turns), int(max_obs_tokens)
        self.timeout_s, self.max_prompt_len = float(timeout_s), max_prompt_len
        self.failures = self.timeouts = 0   # cumulative, every rollout (evals included)
        self.host_s = 0.0   # seconds starting and ending hosts (worker processes), cumulative
        self.last_error: str | None = None

    # -- the environment side ------------------------------------------------------------

    def _fail(self, ep: _Episode, stats: dict, msg: str, timeout: bool = False) -> None:
        ep.failed, ep.live, ep.reward = True, False, 0.0
        stats["env_failures"] += 1
        self.failures += 1
        if timeout:
            stats["env_timeouts"] += 1
            self.timeouts += 1
        self.last_error = msg
        if self.failures <= 5:
            log.warning("environment %s failed (episode reward 0): %s", self.name, msg)
        self._close(ep)

    def _close(self, ep: _Episode) -> None:
        self._close_all([ep])

    def _close_all(self, eps: Sequence[_Episode]) -> None:
        """End the episodes' hosts (a thread exits once its call, if stuck, returns; a worker
        process exits, or is killed, and is reaped)."""
        hosts = [ep.host for ep in eps if ep.host is not None]
        for ep in eps:
            ep.host = None
        if hosts:
            t0 = time.perf_counter()
            self.hosts.close(hosts)
            self.host_s += time.perf_counter() - t0

    def _calls(self, eps: Sequence[_Episode], ops: Sequence[tuple], stats: dict) -> list:
        """ops[i] ("reset", example) or ("step", text) on each episode's host, side by side,
        each waited on until what is left of its own episode's budget has passed (an episode
        is charged the time of its own calls, timed where they ran). Returns each Reply
        (data/env_runner.py), or None where the episode failed (counted)."""
        t0 = time.perf_counter()
        got = self.hosts.call([ep.host for ep in eps], ops,
                              [self.timeout_s - ep.spent_s for ep in eps])
        out = []
        for ep, r in zip(eps, got):
            if r.error is None:
                ep.spent_s += r.seconds
                ep.tool_calls = r.tool_calls
            if r.timeout or (r.error is None and ep.spent_s > self.timeout_s):
                r, ep.spent_s = None, self.timeout_s   # (or done after the budget ran out)
                self._fail(ep, stats, f"no answer within the episode's {self.timeout_s:g} s",
                           timeout=True)
            elif r.error is not None:
                self._fail(ep, stats, r.error)
                r = None
            out.append(r)
        stats["env_s"] += time.perf_counter() - t0
        return out

    def _reset_all(self, eps: list[_Episode], stats: dict) -> list[Optional[str]]:
        t0 = time.perf_counter()
        for ep, host in zip(eps, self.hosts.open(len(eps))):
            ep.host = host
        self.host_s += time.perf_counter() - t0
        got = self._calls(eps, [("reset", ep.example) for ep in eps], stats)
        first = []
        for ep, r in zip(eps, got):
            msg = None
            if r is not None:
                msg = r.value
                if not isinstance(msg, str):
                    self._fail(ep, stats, f"reset() returned {type(msg).__name__}, not str")
                    msg = None
            first.append(msg)
        return first

    def _step_all(self, eps: list[_Episode], texts: list[str], stats: dict) -> list:
        """(observation, done) per episode (None where it failed); rewards accumulate."""
        got = self._calls(eps, [("step", t) for t in texts], stats)
        out = []
        for ep, r in zip(eps, got):
            if ep.failed:
                out.append(None)
                continue
            v = r.value
            problem = _step_problem(v)
            if problem is None and r.chars > MAX_CHARS_PER_TOKEN * self.max_obs_tokens:
                problem = f"an observation of {r.chars} characters"
            if problem is not None:
                self._fail(ep, stats, f"step() {problem}")
                out.append(None)
                continue
            ep.reward += float(v[1])
            out.append((v[0], bool(v[2])))
        return out

    # -- the rollout -----------------------------------------------------------------------

    def rollout(self, model_cfg, params, examples: Sequence[dict], group: int, tokenizer,
                settings: SamplingSettings, *, seed, mesh=None) -> EnvRollout:
        """G = group episodes of each example, prompt-major, in calls of at most
        settings.chunk rows (chunk c samples with fold_in(seed, c), a single chunk with the
        seed itself: `generate_rollout`'s seeds)."""
        B = len(examples) * group
        rows = [e for e in examples for _ in range(group)]
        M, chunk = settings.max_new_tokens, settings.chunk
        tokens_BM = np.full((B, M), settings.pad_id, np.int32)
        logps_BM = np.zeros((B, M), np.float32)
        assistant_BM = np.zeros((B, M), bool)
        lengths_B = np.zeros((B,), np.int32)
        rewards_B = np.zeros((B,), np.float32)
        prompts: list = [None] * B
        stats = {"env_failures": 0, "env_timeouts": 0, "env_s": 0.0}
        turns_B, obs_B = np.zeros((B,), np.int32), np.zeros((B,), np.int32)
        codec = ObservationCodec(tokenizer)
        calls: list = []   # each episode's env.tool_calls, where its environment counts them
        t0, host_s = time.perf_counter(), self.host_s
        for i in range(0, B, chunk):
            key = seed if B <= chunk else jax.random.fold_in(_as_key(seed), i // chunk)
            sl = slice(i, min(i + chunk, B))
            eps, prompts[sl] = self._start(model_cfg, rows[sl], tokenizer, settings, stats,
                                           (group - i % group) % group, group)
            try:
                self._episodes(model_cfg, params, tokenizer, codec, settings, key, mesh, stats,
                               eps, prompts[sl], out=(tokens_BM[sl], logps_BM[sl],
                                                      assistant_BM[sl], lengths_B[sl],
                                                      rewards_B[sl], turns_B[sl], obs_B[sl]))
            finally:   # an interrupted rollout leaves no worker behind
                self._close_all(eps)
            calls += [ep.tool_calls for ep in eps]
        stats["env_s"] += self.host_s - host_s   # starting and ending worker processes
        stats.update(env_turns=float(turns_B.mean()), env_obs_tokens=float(obs_B.mean()))
        if any(isinstance(c, int) for c in calls):   # a tool environment (data/tools.py)
            stats["env_tool_calls"] = float(np.mean([c if isinstance(c, int) else 0
                                                     for c in calls]))
        return EnvRollout(tokens_BM=tokens_BM, logprobs_BM=logps_BM, lengths_B=lengths_B,
                          examples=tuple(examples), prompts=prompts, group_size=group,
                          decode_s=time.perf_counter() - t0 - stats["env_s"],
                          assistant_BM=assistant_BM, rewards_B=rewards_B,
                          env_stats=tuple(sorted(stats.items())))

    def _start(self, model_cfg, rows, tok, s: SamplingSettings, stats, lead: int,
               group: int) -> tuple[list[_Episode], list]:
        """(one reset episode per row, the encoded first messages). A failed reset's row gets
        a prompt of its group (the layout a shared-prompt update wants), or one pad token; it
        never decodes. lead: the rows before the first group that starts in `rows`."""
        eps = [_Episode(example=e) for e in rows]
        ids: list = [None] * len(rows)
        try:
            first = self._reset_all(eps, stats)
        except BaseException:   # e.g. ^C while waiting: no worker left behind
            self._close_all(eps)
            raise
        for b, (ep, msg) in enumerate(zip(eps, first)):
            if msg is None:
                continue
            try:
                p = list(tok.encode_prompt(msg))
            except Exception as e:  # noqa: BLE001 - e.g. a character the tokenizer lacks
                self._fail(ep, stats, f"reset() gave a message the tokenizer refuses: {e}")
                continue
            if not p or (self.max_prompt_len and len(p) > self.max_prompt_len) or \
                    len(p) + s.max_new_tokens > model_cfg.max_seq_len:
                self._fail(ep, stats, f"reset() gave a first message of {len(p)} tokens (the "
                           f"run's max_prompt_len is {self.max_prompt_len})")
                continue
            ids[b] = p
        for b in range(len(rows)):
            if ids[b] is None:
                start = 0 if b < lead else lead + (b - lead) // group * group
                stop = lead if b < lead else start + group
                sib = [ids[k] for k in range(start, min(stop, len(rows))) if ids[k]]
                ids[b] = sib[0] if sib else [s.pad_id]
        return eps, ids

    def _episodes(self, model_cfg, params, tok, codec, s: SamplingSettings, seed, mesh, stats,
                  eps, ids, *, out):
        """Run `eps` (first messages `ids`) to their ends on one `Conversation`, writing
        into `out`'s row slices."""
        tokens_BM, logps_BM, assistant_BM, lengths_B, rewards_B, turns_B, obs_B = out
        M = s.max_new_tokens
        conv = Conversation(model_cfg, params, ids, max_new_tokens=M,
                            extra_slots=conversation_slots(M, self.max_turns,
                                                           self.max_obs_tokens),
                            temperature=s.strategy.temperature, top_k=s.strategy.top_k,
                            top_p=s.strategy.top_p, eos_id=s.eos_id, pad_id=s.pad_id,
                            seed=seed, mesh=mesh)
        for _ in range(self.max_turns):
            live = np.array([ep.live for ep in eps])
            if not live.any():
                break
            cap = M if self.turn_tokens is None else self.turn_tokens
            tok_BN, logp_BN, len_B, last_B = conv.decode(live, np.clip(M - lengths_B, 1, cap))
            texts = []
            for b in np.flatnonzero(live):
                k, at = int(len_B[b]), int(lengths_B[b])
                tokens_BM[b, at:at + k] = tok_BN[b, :k]
                logps_BM[b, at:at + k] = logp_BN[b, :k]
                assistant_BM[b, at:at + k] = True
                lengths_B[b] += k
                turns_B[b] += 1
                texts.append(decode_response(tok, tok_BN[b, :k]))
            live_eps = [eps[b] for b in np.flatnonzero(live)]
            for ep in live_eps:
                ep.turns += 1
            results = self._step_all(live_eps, texts, stats)
            cached, nxt = {}, {}
            for b, ep, res in zip(np.flatnonzero(live), live_eps, results):
                if res is None:
                    continue
                obs, done = res
                if done or ep.turns >= self.max_turns:
                    ep.live = False
                    continue
                try:
                    o = codec.encode(obs)
                except Exception as e:  # noqa: BLE001 - e.g. a character the tokenizer lacks
                    self._fail(ep, stats, f"step() gave an observation the tokenizer refuses: "
                               f"{e}")
                    continue
                if len(o) > self.max_obs_tokens:
                    self._fail(ep, stats, f"step() returned an observation of {len(o)} tokens "
                               f"(--env_max_obs_tokens={self.max_obs_tokens})")
                    continue
                if lengths_B[b] + len(o) >= M:   # no room for one more assistant token
                    ep.live = False
                    continue
                at = int(lengths_B[b])
                tokens_BM[b, at:at + len(o)] = o
                lengths_B[b] += len(o)
                obs_B[b] += len(o)
                last = int(last_B[b])
                cached[int(b)] = [last] + o[:-1] if o else []
                nxt[int(b)] = o[-1] if o else last
            if cached:
                conv.feed(cached, nxt)
        for b, ep in enumerate(eps):
            rewards_B[b] = 0.0 if ep.failed else ep.reward
            if not ep.failed and reward_problem(rewards_B[b]) is not None:
                self._fail(ep, stats, f"the episode's summed reward {ep.reward!r} is not a "
                           "finite float32")
                rewards_B[b] = 0.0
        self._close_all(eps)


def _step_problem(v: Any) -> str | None:
    """Why `v` is not a step result (observation str, reward, done bool); None if it is."""
    if not isinstance(v, (tuple, list)) or len(v) != 3:
        return f"returned {type(v).__name__} {v!r:.60}, not (observation, reward, done)"
    obs, reward, done = v
    if not isinstance(obs, str):
        return f"returned an observation of type {type(obs).__name__}, not str"
    problem = reward_problem(reward)
    if problem is not None:
        return f"reward: {problem}"
    if not isinstance(done, (bool, np.bool_)):
        return f"returned done of type {type(done).__name__}, not bool"
    return None


def run_isolation(cfg) -> str:
    """--env_isolation, with "auto" resolved: a thread for the library's own environments
    (data/envs.py: bounded work, no hangs to kill; a process per episode costs milliseconds
    of CPU each, seconds per step on a small machine), a process for any other module."""
    if cfg.env_isolation != "auto":
        return cfg.env_isolation
    return "thread" if cfg.env.startswith(_OWN_ENVS_PREFIX) else "process"


def env_for_run(cfg, tokenizer, prompt_len: int) -> EnvRunner | None:
    """The run's EnvRunner (None without --env); a ConfigError for a chat template that
    cannot carry observations or a multi-process run."""
    if not cfg.env:
        return None
    if jax.process_count() > 1:   # every process would run every episode, each its own way
        raise ConfigError("env", "multi-turn episodes run in single-process runs only",
                          "run on one host, or drop --env")
    try:
        ObservationCodec(tokenizer)
    except ValueError as e:
        raise ConfigError("chat_template", str(e), "use a template that ends each assistant "
                          "turn with the EOS token, or drop --env") from None
    try:
        return EnvRunner(load_env_factory(cfg.env), name=cfg.env, max_turns=cfg.env_max_turns,
                         max_obs_tokens=cfg.env_max_obs_tokens, timeout_s=cfg.env_timeout_s,
                         max_prompt_len=prompt_len, isolation=run_isolation(cfg))
    except ValueError as e:   # a factory a worker process cannot load by name
        raise ConfigError("env", str(e), "define the factory at the top level of its module, "
                          "or pass --env_isolation=thread") from None


__all__ = ["EnvRollout", "EnvRunner", "ObservationCodec", "env_for_run", "load_env_factory",
           "mask_observations", "run_isolation", "score_episodes"]
