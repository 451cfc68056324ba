"""Rewards scored outside the run's Python: an HTTP reward server (`RemoteReward`), an LLM judge
behind an OpenAI-compatible chat endpoint (`JudgeReward`), and the run's choice among them, a
reward model (models/reward_model.py), a user function and the task's own (`reward_for_run`).

Like data/reward_runner.RewardFn they never let a reward stop a run: a request that errs, times
out, answers something that is not JSON, or JSON of the wrong shape or length scores 0 for each
of its responses and counts each in `failures` (and `timeouts`). `seconds` is the wall time
spent in `score_batch`; `lap()` returns and restarts it (the training record's `reward_s`).

    reward = RemoteReward("http://127.0.0.1:5000/get_reward", concurrency=4, timeout_s=10)
    rewards_N = reward.score_batch(responses, examples)   # float32 [N]

Reward server, one POST per batch of at most `batch_size` responses (the shape OpenRLHF's
remote reward model client sends; "responses" and "examples" are extra keys it ignores):
    request   {"query": [prompt + response, ...], "prompts": [prompt, ...],
               "labels": [answer or "", ...], "responses": [response, ...],
               "examples": [task row, ...]}
    response  {"rewards": [float, ...]}   one per query, in order; other keys are ignored
Judge, one POST per response to URL (".../v1/chat/completions"):
    request   {"model": M, "messages": [{"role": "user", "content": template filled}],
               "temperature": 0}
    response  {"choices": [{"message": {"content": "... 0.8"}}]}, parsed by `judge_parse`
"""
from __future__ import annotations

import concurrent.futures
import json
import logging
import math
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Sequence

import numpy as np

from jaxrl_scale.data.reward_runner import reward_problem

__all__ = ["BatchReward", "JudgeReward", "RemoteReward", "JUDGE_PARSERS", "check_url",
           "fill_template", "reward_for_run"]

log = logging.getLogger(__name__)


class RequestFailed(Exception):
    """One request's failure; `retry`: whether another attempt may succeed."""

    def __init__(self, msg: str, *, retry: bool, timeout: bool = False) -> None:
        super().__init__(msg)
        self.retry, self.timeout = retry, timeout


def check_url(url: str) -> str | None:
    """Why `url` cannot be posted to (None if it can): an http(s) scheme and a host."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return f"{url!r} has no http:// or https:// scheme"
    if not parts.hostname:
        return f"{url!r} has no host"
    try:
        parts.port
    except ValueError as e:
        return f"{url!r} has a bad port ({e})"
    return None


def _jsonable(v: Any) -> Any:
    """numpy scalars and arrays of a task row as JSON; anything else as its str."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    return str(v)


def post_json(url: str, payload: Any, timeout_s: float | None,
              headers: dict[str, str] | None = None) -> Any:
    """POST `payload` as JSON, return the decoded JSON reply; RequestFailed otherwise.
    Retried (retry=True): no connection, a timeout, HTTP 408/429/5xx, a body that is not
    JSON (a server restarting behind a proxy). Not retried: any other HTTP error."""
    body = json.dumps(payload, default=_jsonable).encode()
    req = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        e.close()
        raise RequestFailed(f"HTTP {e.code} {e.reason}",
                            retry=e.code in (408, 429) or e.code >= 500) from None
    except (socket.timeout, TimeoutError) as e:
        raise RequestFailed(f"timed out after {timeout_s} s ({e})", retry=True,
                            timeout=True) from None
    except urllib.error.URLError as e:
        timed_out = isinstance(e.reason, (socket.timeout, TimeoutError))
        raise RequestFailed(f"{e.reason}", retry=True, timeout=timed_out) from None
    except (OSError, ValueError) as e:   # reset connection, bad status line, ...
        raise RequestFailed(f"{type(e).__name__}: {e}", retry=True) from None
    try:
        return json.loads(raw)
    except ValueError as e:
        raise RequestFailed(f"reply is not JSON ({e}): {raw[:80]!r}", retry=True) from None


class BatchReward:
    """Scores a batch with `_score(pairs) -> [float | None]` (None: that response failed, its
    failure already counted) and keeps RewardFn's counters: calls, failures, timeouts,
    last_error; plus `seconds` in score_batch. Requests run on a pool of `concurrency`
    threads; each is tried 1 + `retries` times, sleeping backoff_s * 2**k before retry k + 1
    (a server that is restarting gets time to come back; the sleeps are capped at 30 s)."""

    def __init__(self, name: str, *, concurrency: int = 1, timeout_s: float | None = 10.0,
                 retries: int = 0, backoff_s: float = 0.5) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.name, self.concurrency, self.retries = name, concurrency, retries
        self.timeout_s = timeout_s or None
        self.backoff_s = backoff_s
        self.calls = self.failures = self.timeouts = self.requests = 0
        self.seconds, self._lap_start, self._logged = 0.0, 0.0, 0
        self.last_error: str | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()     # the counters, from the pool's threads
        self._call_lock = threading.Lock()  # one score_batch at a time, from any thread

    def _fail(self, n: int, msg: str, *, timeout: bool = False) -> None:
        with self._lock:
            self.failures += n
            self.timeouts += n if timeout else 0
            self.last_error = msg
            self._logged += 1
            if self._logged <= 5:   # the first few; the counters carry the rest
                log.warning("reward %s failed for %d response(s) (reward 0): %s",
                            self.name, n, msg)

    def _value(self, v: Any) -> float | None:
        problem = reward_problem(v)
        if problem is not None:
            self._fail(1, f"the reply's reward {problem}")
            return None
        return float(v)

    def _request(self, make: Callable[[], Any], n: int) -> Any:
        """make() with retries; None after the last failure (n failures counted)."""
        for attempt in range(self.retries + 1):
            with self._lock:
                self.requests += 1
            try:
                return make()
            except RequestFailed as e:
                last = e
                if not e.retry:
                    break
                if attempt < self.retries:
                    time.sleep(min(30.0, self.backoff_s * 2 ** attempt))
        self._fail(n, f"{last} (after {attempt + 1} attempt(s))", timeout=last.timeout)
        return None

    def _map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """fn over items on the pool, results in the items' order."""
        if self.concurrency == 1 or len(items) <= 1:
            return [fn(x) for x in items]
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.concurrency, thread_name_prefix=f"reward-{self.name}"[:30])
        return list(self._pool.map(fn, items))

    def _score(self, pairs: list[tuple[str, dict[str, Any]]]) -> list[float | None]:
        raise NotImplementedError

    def score_batch(self, responses: Sequence[str], examples: Sequence[dict[str, Any]]
                    ) -> np.ndarray:
        """float32 [N]; `examples` has N entries, or P with N = P*G responses prompt-major."""
        return self.score_counted(responses, examples)[0]

    def score_counted(self, responses: Sequence[str], examples: Sequence[dict[str, Any]]
                      ) -> tuple[np.ndarray, int]:
        """(score_batch's rewards, the failures of this call). Calls from several threads
        (rl/scoring.py's worker, an eval on the main thread) run one at a time, so each
        call's failures and `seconds` are its own."""
        n, p = len(responses), len(examples)
        if p == 0 or n % p:
            raise ValueError(f"score_batch: {n} responses do not match {p} examples "
                             "(need N == P or N == P*G)")
        pairs = [(responses[i], examples[i // (n // p)]) for i in range(n)]
        with self._call_lock:
            t0, before = time.perf_counter(), self.failures
            self.calls += n
            try:
                out = self._score(pairs)
            except Exception as e:  # noqa: BLE001 - a reward never crashes the run
                out = [None] * n
                self._fail(n, f"{type(e).__name__}: {e}")
            self.seconds += time.perf_counter() - t0
            failed = self.failures - before
        return np.asarray([0.0 if v is None else v for v in out], np.float32), failed

    def __call__(self, response: str, example: dict[str, Any]) -> float:
        return float(self.score_batch([response], [example])[0])

    def lap(self) -> float:
        """Seconds in score_batch since the last lap (or the start); a call counts in the lap
        it ends in (no lock: a lap never waits for a call under way on another thread)."""
        now = self.seconds   # read once: a worker may add to it meanwhile
        dt, self._lap_start = now - self._lap_start, now
        return dt

    def metrics(self) -> dict[str, int]:
        return {"calls": self.calls, "failures": self.failures, "timeouts": self.timeouts}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.name}, calls={self.calls}, "
                f"failures={self.failures}, timeouts={self.timeouts})")


class RemoteReward(BatchReward):
    """A reward server at `url`: the batch in contiguous chunks of at most `batch_size`
    responses (0: split evenly over the `concurrency` requests), one POST each (shapes in
    the module docstring). A reply without a "rewards" list of the chunk's length fails the
    whole chunk; an entry that is not a real number (null, "1.0", NaN) fails that response."""

    def __init__(self, url: str, *, batch_size: int = 0, **kw: Any) -> None:
        problem = check_url(url)
        if problem:
            raise ValueError(problem)
        super().__init__(url, **kw)
        self.url, self.batch_size = url, batch_size

    def _chunks(self, n: int) -> list[tuple[int, int]]:
        size = self.batch_size or max(1, math.ceil(n / self.concurrency))
        return [(i, min(n, i + size)) for i in range(0, n, size)]

    def _score(self, pairs):
        def one(span: tuple[int, int]) -> list[float | None]:
            chunk = pairs[span[0]:span[1]]
            prompts = [str(e.get("prompt", "")) for _, e in chunk]
            payload = {"query": [p + r for p, (r, _) in zip(prompts, chunk)],
                       "prompts": prompts,
                       "labels": [str(e.get("answer", "")) for _, e in chunk],
                       "responses": [r for r, _ in chunk], "examples": [e for _, e in chunk]}
            reply = self._request(lambda: post_json(self.url, payload, self.timeout_s),
                                  len(chunk))
            if reply is None:
                return [None] * len(chunk)
            rewards = reply.get("rewards") if isinstance(reply, dict) else None
            if not isinstance(rewards, list) or len(rewards) != len(chunk):
                got = (f"{len(rewards)} rewards" if isinstance(rewards, list) else
                       f"no 'rewards' list ({type(reply).__name__} {str(reply)[:60]!r})")
                self._fail(len(chunk), f"the reply has {got} for {len(chunk)} queries")
                return [None] * len(chunk)
            return [self._value(v) for v in rewards]
        return [v for part in self._map(one, self._chunks(len(pairs))) for v in part]


# ---------------------------------------------------------------------------------------------
# The judge: a chat model asked, per response, how good it is.

JUDGE_FIELDS = ("{prompt}", "{response}", "{answer}")
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def parse_last_number(text: str) -> float | None:
    """The last number in the reply if it lies in [0, 1] ("Score: 0.8" -> 0.8), else None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    v = float(found[-1])
    return v if 0.0 <= v <= 1.0 else None


def parse_yes_no(text: str) -> float | None:
    """1 for a last standalone "yes", 0 for a last "no" (any case), None for neither."""
    found = _YES_NO.findall(text)
    return None if not found else float(found[-1].lower() == "yes")


JUDGE_PARSERS: dict[str, Callable[[str], float | None]] = {
    "number": parse_last_number, "yes_no": parse_yes_no}


def fill_template(template: str, prompt: str, response: str, answer: str) -> str:
    """The template with its {prompt} {response} {answer} fields replaced; any other brace
    is kept as written (a template may show the judge JSON), so this is no str.format."""
    values = dict(zip(JUDGE_FIELDS, (prompt, response, answer)))
    return re.sub("|".join(re.escape(f) for f in JUDGE_FIELDS), lambda m: values[m.group()],
                  template)


class JudgeReward(BatchReward):
    """An LLM judge: one chat completion per response at `url` (an OpenAI-compatible
    /v1/chat/completions) with `template` filled, the reward parsed from the reply's text by
    `parse` ("number": the last number, which must be in [0, 1]; "yes_no": the last yes or
    no). A reply the rule cannot read scores 0 and counts as a failure (not retried: a
    temperature-0 judge would say the same again)."""

    def __init__(self, url: str, model: str, template: str, *, parse: str = "number",
                 api_key: str = "", **kw: Any) -> None:
        problem = check_url(url)
        if problem:
            raise ValueError(problem)
        if "{response}" not in template:
            raise ValueError("the judge template has no {response} field")
        if parse not in JUDGE_PARSERS:
            raise ValueError(f"parse must be one of {sorted(JUDGE_PARSERS)}, got {parse!r}")
        super().__init__(f"judge:{model}", **kw)
        self.url, self.model, self.template, self.parse = url, model, template, parse
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def _score(self, pairs):
        def one(pair: tuple[str, dict[str, Any]]) -> float | None:
            response, ex = pair
            content = fill_template(self.template, str(ex.get("prompt", "")), response,
                                    str(ex.get("answer", "")))
            payload = {"model": self.model, "temperature": 0,
                       "messages": [{"role": "user", "content": content}]}
            reply = self._request(lambda: post_json(self.url, payload, self.timeout_s,
                                                    self.headers), 1)
            if reply is None:
                return None
            try:
                text = reply["choices"][0]["message"]["content"]
                assert isinstance(text, str)
            except (KeyError, IndexError, TypeError, AssertionError):
                self._fail(1, f"no choices[0].message.content in {str(reply)[:80]!r}")
                return None
            v = JUDGE_PARSERS[self.parse](text)
            if v is None:
                self._fail(1, f"rule {self.parse!r} finds no score in {text[-80:]!r}")
            return v
        return self._map(one, pairs)


# ---------------------------------------------------------------------------------------------
# The run's reward.


def reward_for_run(cfg: Any, tokenizer: Any = None):
    """The reward a TrainConfig asks for: --reward_url, --judge_url, --reward_model,
    --reward_fn, else the task's (config validation refuses more than one)."""
    from jaxrl_scale import data   # looked up at call time (tests patch the package's names)
    kw = dict(concurrency=cfg.reward_concurrency, timeout_s=cfg.reward_timeout_s or None,
              retries=cfg.reward_retries)
    if cfg.reward_url:
        return RemoteReward(cfg.reward_url, batch_size=cfg.reward_batch_size, **kw)
    if cfg.judge_url:
        with open(os.path.expanduser(cfg.judge_template), encoding="utf-8") as f:
            template = f.read()
        return JudgeReward(cfg.judge_url, cfg.judge_model, template, parse=cfg.judge_parse,
                           api_key=os.environ.get("OPENAI_API_KEY", ""), **kw)
    if cfg.reward_model:
        from jaxrl_scale.models.reward_model import ModelReward
        return ModelReward(cfg.reward_model, tokenizer, batch_size=cfg.reward_batch_size)
    if cfg.reward_fn:
        return data.user_reward(cfg.reward_fn, timeout_s=cfg.reward_timeout_s or None)
    return data.reward_for_task(cfg.task)
