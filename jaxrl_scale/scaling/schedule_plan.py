"""A batch schedule as a trajectory: the batch per update B along cumulative responses N, in
the analysis (a scheduled config's throughput from a timing pass) and in the planner (its
predicted T/T0 before it runs). docs/science.md, Batch schedule: time to target along a
trajectory, has the derivation. Numpy only.

A trajectory is a tuple of segments ((N_start, B), ...): from N_start responses on, B
responses per update, the first at N_start = 0 and N_start increasing; the last segment runs
on. This is the form `--batch_ramp` declares (there in prompts P; B = P * G) and the form a run
records (`segments_from_records`: each step's batch_train over the responses it trained).

Why one rule serves both. Time to target along a trajectory is the integral of dN / q(B(N))
over [0, N*]: throughput is per batch, so the responses trained at each batch are timed at
that batch's throughput. Relative to the reference batch B0 (q0 = q(B0), T0 = N0* / q0):

    T / T0 = (1 / N0*) * sum_segments n_s / r_q(B_s),   n_s = responses of segment s in [0, N*]

The analysis measures N* and n_s (the run's own trajectory to its N*) and takes r_q(B) from
the timing pass, per block, so a scheduled config is timed exactly as a fixed one: by the
pass's interleaved steps at each batch it visited, never by its own in-run q against the pass's
(`pass_ratio_along`). The planner predicts N* too: with McCandlish's r_N(B) = (1 + B/B_crit) /
(1 + B0/B_crit), a response trained at batch B is worth 1 / r_N(B) of a response at B0, so the
target is reached where sum_s n_s / r_N(B_s) = N0* (`time_to_target`).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from jaxrl_scale.numbers import is_number
from jaxrl_scale.scaling import stats


def check_segments(segments: Sequence[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """The trajectory as floats; ValueError when the first does not start at 0 responses,
    the starts do not increase or a batch is not a positive finite number."""
    out = tuple((float(n), float(b)) for n, b in segments)
    if not out or out[0][0] != 0:
        raise ValueError(f"a trajectory starts at 0 responses, got {out[:1] or 'nothing'}")
    for (n0, _), (n1, _) in zip(out, out[1:]):
        if not n1 > n0:
            raise ValueError(f"segment starts must increase, got {n0:g} then {n1:g}")
    if not all(math.isfinite(b) and b > 0 for _, b in out):
        raise ValueError(f"batches must be positive numbers, got {[b for _, b in out]}")
    return out


def parse_segments(text: str) -> tuple[tuple[float, float], ...]:
    """"RESPONSES:B,RESPONSES:B,..." -> ((responses, B), ...) (`check_segments`); the syntax
    of --batch_ramp, in responses per update B instead of prompts P."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        parts = item.split(":")
        try:
            out.append((float(parts[0]), float(parts[1])) if len(parts) == 2 else None)
        except ValueError:
            out.append(None)
        if out[-1] is None:
            raise ValueError(f"cannot parse {item!r} (want RESPONSES:B)")
    return check_segments(out)


def segments_from_records(train: Sequence[Mapping]) -> tuple[tuple[tuple[float, float], ...],
                                                             float]:
    """(trajectory, responses at its end) from a run's training records: a step that ends
    at N responses with batch_train B trained (N_prev, N] at B. Consecutive steps at one
    batch merge into one segment. ((), 0.0) when no record carries both."""
    pts = sorted((float(r["responses"]), float(r["batch_train"])) for r in train
                 if is_number(r.get("responses")) and is_number(r.get("batch_train")))
    out: list[tuple[float, float]] = []
    prev = 0.0
    for n, b in pts:
        if n <= prev:
            continue
        if not out or out[-1][1] != b:
            out.append((prev, b))
        prev = n
    return tuple(out), prev


def responses_by_batch(segments: Sequence[tuple[float, float]], upto: float
                       ) -> dict[float, float]:
    """{B: responses trained at B within [0, upto]} of a trajectory."""
    out: dict[float, float] = {}
    for i, (n0, b) in enumerate(segments):
        n1 = segments[i + 1][0] if i + 1 < len(segments) else math.inf
        got = min(n1, upto) - n0
        if got > 0:
            out[b] = out.get(b, 0.0) + got
    return out


def batch_fractions(trains: Sequence[Sequence[Mapping]], upto: Sequence[float | None]
                    ) -> dict[str, float] | None:
    """{B (as "%g"): share of the config's responses to target trained at B}, pooled over
    its runs: run i counts its trajectory up to upto[i] (its N*; None: not reached, its whole
    run). Pooled, not averaged: the config's T is the seed mean of the runs' times, and each
    response's time counts once. None when no run records batch_train."""
    tot: dict[float, float] = {}
    for train, n in zip(trains, upto):
        segs, end = segments_from_records(train)
        for b, x in responses_by_batch(segs, end if n is None else min(n, end)).items():
            tot[b] = tot.get(b, 0.0) + x
    total = sum(tot.values())
    if not total > 0:
        return None
    return {f"{b:g}": x / total for b, x in sorted(tot.items())}


def pass_ratio_along(timing: Sequence[dict], st: Mapping, e0: dict):
    """The timing pass's r_q of a scheduled config (`drift.PassRatio`), integrated along its
    trajectory: per unit u (block, or round), log r_q_u = -log sum_B w_B / r_q_u(B), w_B its
    `batch_fractions` and r_q_u(B) the pass's ratio at B against the reference's entry e0, so
    T/T0 = r_N / r_q is the time along the trajectory at the pass's speeds. None (the config
    then keeps its runs' own r_q, like any config the pass did not time) when the pass lacks
    a batch it visited or its units do not align."""
    from jaxrl_scale.scaling.drift import PassRatio, _match, pass_ratio
    w = st.get("batch_fractions") or {}
    if not w:
        return None
    logs, unit = [], None
    for b, share in w.items():
        e = _match(timing, {**st, "batch": float(b)})
        if e is None:
            return None
        p = pass_ratio(e, e0)
        if unit not in (None, p.unit) or (logs and p.units.size != logs[0][1].size):
            return None
        unit = p.unit
        logs.append((share, p.units))
    if not logs or not logs[0][1].size:
        return None
    per_unit = sum(share * np.exp(-u) for share, u in logs)
    return PassRatio(-np.log(per_unit), unit)


def time_to_target(segments: Sequence[tuple[float, float]], r_n: Mapping[float, np.ndarray],
                   r_q: Mapping[float, np.ndarray], n0: float) -> tuple[np.ndarray, np.ndarray]:
    """(T/T0, N*) of a trajectory from r_N(B) and r_q(B) against B0, each an array of draws
    (or a scalar) per batch of the trajectory, and the reference's N0*: the responses to
    target are reached where sum_s n_s / r_N(B_s) = N0*, and T/T0 = sum_s n_s / r_q(B_s) / N0*
    (the module docstring). A constant trajectory at B gives r_N(B) / r_q(B) exactly."""
    segs = check_segments(segments)
    shape = np.broadcast(*[np.asarray(v, float) for v in (*r_n.values(), *r_q.values())]).shape
    left = np.full(shape, float(n0))            # reference-equivalent responses still to go
    time = np.zeros(shape)                      # in units of 1 / q0
    n_star = np.zeros(shape)
    for i, (start, b) in enumerate(segs):
        length = segs[i + 1][0] - start if i + 1 < len(segs) else math.inf
        rn, rq = np.asarray(r_n[b], float), np.asarray(r_q[b], float)
        with np.errstate(invalid="ignore"):
            used = np.minimum(length, left * rn)   # responses of this segment before target
            left = np.maximum(left - used / rn, 0.0)
        time = time + used / rq
        n_star = n_star + used
    return time / n0, n_star


def schedule_plan(runs, fit: dict, segments: Sequence[tuple[float, float]], *,
                  who: str = "actor", n_star: float | None = None,
                  target: float | None = None, half_width: float = 0.5,
                  gen_batch_ratio: float | None = None, n_boot: int = 1000,
                  block: int | None = None, n_windows: int = 8,
                  level: float = stats.CI_LEVEL, seed: int = 0, link=None,
                  external=None) -> dict:
    """The planner's T/T0 of a trajectory (plan.json "schedule"), with its interval from the
    planner's own draws: `planner.predict` at the trajectory's batches with the arguments
    `planner.batch_plan` takes (the same seed gives the same joint draws of B_crit and the
    step-time fit, so a constant trajectory at B reproduces batch_plan's row at B exactly),
    integrated draw by draw (`time_to_target`). Needs the reference's N* (n_star or target):
    the segments' starts are absolute responses."""
    from jaxrl_scale.scaling import planner, planner_link, step_cost
    from jaxrl_scale.scaling.step_cost import PlanError
    runs = list(runs)
    try:
        segs = check_segments(segments)
    except ValueError as e:
        raise PlanError("schedule_steps", str(e), "pass e.g. --schedule_steps=0:128,8192:256")
    if target is not None:
        n_star = planner.probe_n_star(runs, target)
    if n_star is None:
        raise PlanError("schedule_steps", "a trajectory's segments start at absolute "
                        "responses, so its T/T0 needs the reference's N*",
                        "pass --target (or --n_star) with --schedule_steps")
    b0 = planner._probe_batch(runs)
    k = gen_batch_ratio if gen_batch_ratio is not None else runs[0].gen_batch_ratio
    theta = step_cost.theta_of_fit(fit)
    theta_R4 = np.asarray(fit.get("boot", np.zeros((0, 4))), float).reshape(-1, 4)
    if theta_R4.shape[0] == 0:
        theta_R4 = theta[None, :]
    i = planner.NETWORKS.index(who)
    z = planner.probe_noise(runs, who, n_star, half_width, n_windows, n_boot, block, level,
                            seed + 10 * i)
    if z is None:
        raise planner._no_norms(runs, who)
    link = planner_link.link_for(runs[0].algo) if link is None else link
    w = z["window"]
    bc, bc_R = planner_link.b_crit_draws(w["b_simple"], w["reps"], link if who == "actor"
                                         else planner_link.IDENTITY, seed)
    batches = sorted({b for _, b in segs})
    rows, reps = planner.predict(batches, b0, bc, bc_R, theta, theta_R4, k, level, seed,
                                 external)
    col = {b: c for c, b in enumerate(batches)}
    t, n = time_to_target(segs, {b: rows[c]["r_N"] for b, c in col.items()},
                          {b: rows[c]["r_q"] for b, c in col.items()}, n_star)
    t_R, n_R = time_to_target(segs, {b: reps["r_N_RC"][:, c] for b, c in col.items()},
                              {b: reps["r_q_RC"][:, c] for b, c in col.items()}, n_star)
    return {"segments": [list(s) for s in segs], "reference_batch": b0, "n_star_reference":
            n_star, "T_over_T0": float(t), "T_over_T0_ci": stats.quantile_ci(t_R, level),
            "N_star": float(n), "N_star_ci": stats.quantile_ci(n_R, level),
            "r_N": float(n) / n_star, "predictions": rows, "ci_level": level,
            "rule": "T/T0 = sum over segments of n_s / r_q(B_s) / N0*, the segments cut "
                    "where sum n_s / r_N(B_s) = N0* (docs/science.md, Batch schedule)"}


__all__ = ["check_segments", "parse_segments", "segments_from_records", "responses_by_batch",
           "batch_fractions", "pass_ratio_along", "time_to_target", "schedule_plan"]
