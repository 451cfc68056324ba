"""Batch size as a controller during a run (docs/usage.md, Batch schedule; the formulas in
docs/science.md, Batch schedule): the prompts per step P that the next step uses, from a fixed
ramp over cumulative responses (`steps`) or from the online gradient noise scale (`noise`).

Pure and free of JAX: a typed `ScheduleState` that the checkpoint holds (so a resume mid-ramp
continues bit for bit), the flag checks, and the decision functions. The train loop
(experiment/train.py) compiles every P this module says a run may reach before its clock
starts, and switches between them after the step that decides.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from jaxrl_scale.experiment.errors import ConfigError

SCHEDULES = ("none", "noise", "steps")
# Bootstrap of the window's B_simple: replicates, and the interval's level (its lower end is
# the 5% quantile: a doubling needs the noise scale to be large with 95% confidence).
N_BOOT = 1000
LEVEL = 0.9
# The per-update fields a noise decision reads (the window the checkpoint holds).
_NORM_KEYS = ("actor_grad_sqnorm_micro", "actor_grad_sqnorm")


@dataclasses.dataclass(frozen=True)
class ScheduleState:
    """What the schedule knows after a step: the P the next step uses, the step whose end
    last changed P (-1: never), and (`noise`) the last schedule_window updates' squared
    gradient norms with their batch sizes (one dict per update)."""

    prompts: int
    last_change: int = -1
    window: tuple = ()

    def to_json(self) -> dict[str, Any]:
        return {"prompts": self.prompts, "last_change": self.last_change,
                "window": [dict(w) for w in self.window]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ScheduleState":
        return cls(int(d["prompts"]), int(d.get("last_change", -1)),
                   tuple(dict(w) for w in d.get("window", ())))


def parse_ramp(text: str) -> tuple[tuple[int, int], ...]:
    """"RESPONSES:P,RESPONSES:P,..." -> ((responses, P), ...); a ConfigError naming
    --batch_ramp for bad syntax, responses that do not increase or a P that shrinks."""
    out: list[tuple[int, int]] = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        parts = item.split(":")
        try:
            n, p = (int(parts[0]), int(parts[1])) if len(parts) == 2 else (None, None)
        except ValueError:
            n = p = None
        if n is None or n < 0 or p < 1:
            raise ConfigError("batch_ramp", f"cannot parse {item!r} (want RESPONSES:P, "
                              "responses >= 0, P >= 1)", "pass e.g. --batch_ramp=0:8,4096:16")
        if out and n <= out[-1][0]:
            raise ConfigError("batch_ramp", f"responses must increase, got {out[-1][0]} then "
                              f"{n}", "list the entries in order of responses")
        if out and p < out[-1][1]:
            raise ConfigError("batch_ramp", f"P only grows, got {out[-1][1]} then {p}",
                              "give non-decreasing prompts per step")
        out.append((n, p))
    return tuple(out)


def reachable_prompts(cfg) -> tuple[int, ...]:
    """Every P the run may use, the starting one first: each is compiled before the run's
    clock starts. steps: the ramp's; noise: P0 doubled while P * G <= batch_cap."""
    p0 = cfg.prompts_per_step
    if cfg.batch_schedule == "steps":
        return (p0,) + tuple(sorted({p for _, p in parse_ramp(cfg.batch_ramp)} - {p0}))
    if cfg.batch_schedule == "noise":
        out = [p0]
        while 2 * out[-1] * cfg.group_size <= cfg.batch_cap:
            out.append(2 * out[-1])
        return tuple(out)
    return (p0,)


def check_schedule(cfg, data_parallel: int | None = None) -> None:
    """The batch schedule's flags (cheap: before any data, model or warm-start). Every P the
    schedule may reach must divide like the starting one (micro-batches hold whole groups)."""
    kind = cfg.batch_schedule
    if kind not in SCHEDULES:
        raise ConfigError("batch_schedule", f"{kind!r} is unknown",
                          f"use one of {', '.join(SCHEDULES)}")
    for name in ("schedule_every", "schedule_window"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(name, f"must be an integer >= 1, got {v!r}", f"pass --{name}=10")
    if isinstance(cfg.batch_cap, bool) or not isinstance(cfg.batch_cap, int) or \
            cfg.batch_cap < 0:
        raise ConfigError("batch_cap", f"must be an integer >= 0, got {cfg.batch_cap!r}",
                          "pass the largest batch in responses, e.g. --batch_cap=2048")
    c = cfg.schedule_c
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 < c < math.inf:
        raise ConfigError("schedule_c", f"must be a finite number > 0, got {c!r}",
                          "pass e.g. --schedule_c=0.43")
    if kind == "none":
        if cfg.batch_ramp:
            raise ConfigError("batch_ramp", "is set but --batch_schedule=none",
                              "add --batch_schedule=steps, or drop --batch_ramp")
        return
    if cfg.use_engine or cfg.token_budget:
        flag = "token_budget" if cfg.token_budget else "gen_batch_ratio"
        raise ConfigError(flag, f"--batch_schedule={kind} runs the synchronous padded update "
                          "(the slot engine's slots and packing are sized once)",
                          f"drop --{flag}, or use --batch_schedule=none")
    if kind == "steps":
        ramp = parse_ramp(cfg.batch_ramp)
        if not ramp:
            raise ConfigError("batch_ramp", "--batch_schedule=steps needs a ramp",
                              "pass e.g. --batch_ramp=0:8,4096:16")
        if ramp[0][1] < cfg.prompts_per_step:
            raise ConfigError("batch_ramp", f"P only grows: the ramp's {ramp[0][1]} is below "
                              f"--prompts_per_step={cfg.prompts_per_step}",
                              "start the ramp at P >= prompts_per_step")
    else:
        if cfg.micro_batches < 2:
            raise ConfigError("micro_batches", "--batch_schedule=noise estimates the noise "
                              f"scale from micro-batch gradients, got {cfg.micro_batches}",
                              "pass --micro_batches=2 or more (dividing prompts_per_step)")
        if cfg.batch_cap < cfg.batch_train:
            raise ConfigError("batch_cap", f"{cfg.batch_cap} responses is below the starting "
                              f"batch P*G = {cfg.batch_train}",
                              f"pass --batch_cap >= {cfg.batch_train} (responses)")
    step_div = cfg.micro_batches * cfg.updates_per_rollout
    for p in reachable_prompts(cfg)[1:]:
        rows = p * cfg.group_size // step_div
        if p % step_div or (data_parallel and rows % data_parallel):
            raise ConfigError("batch_ramp", f"P={p} does not split into {step_div} "
                              f"micro-batches of whole groups over {data_parallel or 1} "
                              "data-parallel devices", "choose each P as a multiple of "
                              "the starting one")


def ramp_prompts(ramp: Sequence[tuple[int, int]], responses: int, prompts: int) -> int:
    """P once `responses` are trained on: the last ramp entry reached, never below `prompts`
    (the current P: the schedule only grows it)."""
    for n, p in ramp:
        if responses >= n:
            prompts = max(prompts, p)
    return prompts


def window_row(rec: dict[str, Any], batch: int) -> dict[str, Any] | None:
    """The part of a training record a noise decision reads: the squared norms, the update's
    batch (B_big) and micro-batch size (B_small); None when the step made no update."""
    if not all(k in rec for k in _NORM_KEYS):
        return None
    return {**{k: rec[k] for k in _NORM_KEYS}, "batch": rec.get("actor_batch", batch),
            "micro_batch_size": rec["micro_batch_size"]}


def online_b_simple(window: Sequence[dict], seed: int) -> dict[str, float] | None:
    """B_simple over the window, mean(tr Sigma) / mean(|G|^2) of the per-update two-batch
    estimates, with its moving-block bootstrap interval (scaling/noise.py's estimator, the
    analysis's own); None when fewer than two updates have usable norms."""
    from jaxrl_scale.scaling.noise import bootstrap_b_simple, per_update_estimates
    est = per_update_estimates(list(window), batch=0)
    if est["g2_U"].size < 2:
        return None
    b = bootstrap_b_simple(est["g2_U"], est["trace_U"], n_boot=N_BOOT, level=LEVEL, seed=seed)
    return {"B_simple_online": b["b_simple"], "B_simple_online_lo": b["ci"][0],
            "B_simple_online_hi": b["ci"][1]}


def decide(b_simple_lo: float, batch: int, cap: int, c: float) -> tuple[int, int]:
    """(the next batch, doublings the evidence allows at once). The batch doubles (once) when
    the lower end of c * B_simple's interval exceeds it and the double fits under the cap; a
    NaN bound (no interval) keeps it. The second value counts the doublings a rule that
    jumped straight to c * B_simple_lo would make (capped): > 1 marks a decision that such a
    rule would have taken as one jump."""
    wanted, b = 0, batch
    while c * b_simple_lo > b and 2 * b <= cap:   # NaN compares False: no decision
        b, wanted = 2 * b, wanted + 1
    return (2 * batch if wanted else batch), wanted


def after_step(cfg, state: ScheduleState, step: int, responses: int, rec: dict[str, Any]
               ) -> tuple[ScheduleState, dict[str, Any]]:
    """The schedule after step `step` (its training record `rec`, `responses` trained so
    far): (the new state, whose `prompts` the next step uses; the fields the record adds)."""
    if cfg.batch_schedule == "steps":
        p = ramp_prompts(parse_ramp(cfg.batch_ramp), responses, state.prompts)
        return (state if p == state.prompts else
                dataclasses.replace(state, prompts=p, last_change=step)), {}
    if cfg.batch_schedule != "noise":
        return state, {}
    U = cfg.updates_per_rollout
    row = window_row(rec, state.prompts * cfg.group_size // U)
    window = (state.window + ((row,) if row else ()))[-cfg.schedule_window:]
    state = dataclasses.replace(state, window=window)
    if step % cfg.schedule_every or len(window) < cfg.schedule_window:
        return state, {}
    est = online_b_simple(window, seed=cfg.seed * 1_000_003 + step)
    if est is None:
        return state, {}
    batch = state.prompts * cfg.group_size
    # compared with the update's batch (B_train / u: the one the norms describe), capped in
    # responses per step
    new, wanted = decide(est["B_simple_online_lo"], batch // U, cfg.batch_cap // U,
                         cfg.schedule_c)
    fields = {**est, "schedule_doublings_wanted": wanted}
    if new != batch // U:
        state = dataclasses.replace(state, prompts=2 * state.prompts, last_change=step)
    return state, fields


__all__ = ["SCHEDULES", "ScheduleState", "parse_ramp", "reachable_prompts", "check_schedule",
           "ramp_prompts", "window_row", "online_b_simple", "decide", "after_step"]
