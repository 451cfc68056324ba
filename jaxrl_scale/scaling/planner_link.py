"""The link between the probe's noise scale and the critical batch a sweep then measures,
fitted on recorded studies (docs/science.md, The planner).

McCandlish's B_crit ~ B_simple assumes an isotropic Hessian and a noise scale fixed over the
window; on the recorded GRPO studies the measured critical batch sits a factor of about 2 to 3
below the probe's B_simple (the noise scale grows as the loss falls, and a group's responses
share their prompt, so micro-batch norms over whole groups overstate the independent noise).
The records carry norms per micro-batch of whole groups only, so the inter/intra-prompt split
of the noise cannot be estimated from them; the link is therefore one factor a per algorithm,

    B_crit = B_simple / a,     log a ~ N(mu, sd^2) over studies,

with `a_s = kappa_meas,s * B_simple,s` per study s: kappa_meas = 1 / B_crit is the weighted
least-squares fit of the study's measured log r_N(B) = log(1 + B kappa) - log(1 + B0 kappa)
(weights 1 / SE^2 from their intervals), B_simple the probe's estimate in the N* window of the
study's reference runs. A new study's a is drawn from the predictive distribution
mu + sd sqrt(1 + 1/n) t_(n-1), so the plan's intervals carry the link's between-study error on
top of the probe's bootstrap. The fitted values live in planner_link.json beside this file,
written by results/planner_validation/fit_link.py and checked against a re-fit by the tests.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Mapping, Sequence

import numpy as np
from scipy import stats as sps
from scipy.optimize import minimize_scalar

LINK_JSON = os.path.join(os.path.dirname(__file__), "planner_link.json")
MIN_STUDIES = 3     # below this an algorithm uses the link fitted on every study
NO_COST = 0.01      # kappa * max B below this: the study measured no sample cost


@dataclasses.dataclass(frozen=True)
class StudyPoint:
    """One study's probe and measurement: its reference batch, the probe's B_simple in the N*
    window (with bootstrap replicates), and per tested batch the measured log r_N and its SE."""
    study: str
    algo: str
    batch0: float
    b_simple: float
    b_simple_R: tuple
    batches: tuple
    log_r_N: tuple
    se: tuple

    @property
    def kappa_meas(self) -> float:
        """1 / B_crit fitted to the measured r_N (bounded below by -0.9 / max B)."""
        B, y, se = (np.asarray(x, float) for x in (self.batches, self.log_r_N, self.se))

        def loss(k):
            return float(np.sum((y - np.log1p(B * k) + math.log1p(self.batch0 * k)) ** 2
                                / se ** 2))
        return float(minimize_scalar(loss, bounds=(-0.9 / B.max(), 0.05),
                                     method="bounded", options={"xatol": 1e-9}).x)

    @property
    def log_a(self) -> float:
        """log(B_simple / B_crit measured); -inf when the study measured no sample cost (the
        fitted r_N at its largest batch within NO_COST of 1 fixes no B_crit)."""
        k = self.kappa_meas
        if not k * max(self.batches) > NO_COST:
            return -math.inf
        return math.log(k * self.b_simple)


@dataclasses.dataclass(frozen=True)
class Link:
    """B_crit = B_simple / a, log a ~ N(mu, sd^2) between studies (n of them)."""
    mu: float
    sd: float
    n: int
    studies: tuple = ()
    algo: str = "all"

    def draws(self, n_draws: int, rng: np.random.Generator) -> np.ndarray:
        """Predictive draws of a for a new study: mu + sd sqrt(1 + 1/n) t_(n-1)."""
        if self.n < 2 or self.sd == 0:
            return np.full(n_draws, math.exp(self.mu))
        t = sps.t.rvs(self.n - 1, size=n_draws, random_state=rng)
        return np.exp(self.mu + self.sd * math.sqrt(1 + 1 / self.n) * t)

    def describe(self) -> str:
        if self.n == 0:
            return "B_crit = B_simple (McCandlish et al. 2018)"
        return (f"B_crit = B_simple / a, log a ~ N({self.mu:.3f}, {self.sd:.3f}^2) from {self.n} "
                f"recorded {self.algo} studies (a = {math.exp(self.mu):.2f})")


IDENTITY = Link(0.0, 0.0, 0)


def b_crit_draws(b_simple: float, b_simple_R, link: Link, seed: int = 0
                 ) -> tuple[float, np.ndarray]:
    """(point B_crit, replicates): B_simple / exp(mu), and each bootstrap replicate of
    B_simple divided by its own predictive draw of a (independent sources, paired by index)."""
    b_R = np.asarray(b_simple_R, float)
    a_R = link.draws(b_R.size, np.random.default_rng(seed))
    with np.errstate(invalid="ignore"):
        return float(b_simple) / math.exp(link.mu), b_R / a_R


def separation(log_ratio_parts: Mapping[str, np.ndarray], level: float) -> dict:
    """How far a candidate is from being told apart from the best batch. log_ratio_parts:
    replicates of log([T/T0](B) / [T/T0](B_best)): "joint" (every source of error at once, as
    the recommendation uses them) and one source varied at a time ("probe": B_simple's
    bootstrap, "link": a's predictive draws, "pass": the step-time fit's bootstrap), and
    "point", the point estimate. The joint interval's end towards 1 sets the total variance,
    V = ((point - end) / z)^2 (z the two-sided level's quantile); the parts share it in
    proportion to their own interval widths. The pair separates when V < (point / z)^2.
    Returns {"probe_runs_x": how many times more probe runs (the probe's share / x), "pass_x":
    how many times longer a timing pass, each with the other parts as they are; None where the
    other parts alone keep the pair together, 1 when it is separated already}."""
    z = float(sps.norm.ppf(0.5 + level / 2))

    def interval(v):
        v = np.asarray(v, float)
        v = v[np.isfinite(v)]
        return np.quantile(v, [0.5 - level / 2, 0.5 + level / 2]) if v.size > 1 else (0.0, 0.0)

    point = float(log_ratio_parts["point"])
    lo, hi = interval(log_ratio_parts["joint"])
    total = ((point - (lo if point > 0 else hi)) / z) ** 2
    width = {k: float(np.diff(interval(v))[0]) ** 2 for k, v in log_ratio_parts.items()
             if k not in ("point", "joint")}
    scale = total / sum(width.values()) if sum(width.values()) > 0 else 0.0
    var = {k: w * scale for k, w in width.items()}
    need = (point / z) ** 2
    out = {}
    for name, part in (("probe_runs_x", "probe"), ("pass_x", "pass")):
        rest = total - var.get(part, 0.0)
        if total <= need:
            out[name] = 1.0
        elif rest >= need or var.get(part, 0.0) <= 0:
            out[name] = None
        else:
            out[name] = float(math.ceil(var[part] / (need - rest) * 10) / 10)
    return out


def fit_link(points: Sequence[StudyPoint], algo: str = "all") -> Link:
    """Mean and SD of log a over the studies whose measured r_N fixes a finite B_crit."""
    la = [p.log_a for p in points]
    keep = [(p.study, x) for p, x in zip(points, la) if math.isfinite(x)]
    if not keep:
        return IDENTITY
    x = np.array([v for _, v in keep])
    return Link(float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else 0.0, int(x.size),
                tuple(s for s, _ in keep), algo)


def fit_links(points: Sequence[StudyPoint]) -> dict[str, Link]:
    """{algo: Link} for every algorithm with >= MIN_STUDIES studies, and "all"."""
    out = {"all": fit_link(points)}
    for algo in sorted({p.algo for p in points}):
        mine = [p for p in points if p.algo == algo]
        if len(mine) >= MIN_STUDIES:
            out[algo] = fit_link(mine, algo)
    return out


def save_links(links: Mapping[str, Link], path: str = LINK_JSON) -> None:
    with open(path, "w") as f:
        json.dump({k: dataclasses.asdict(v) for k, v in links.items()}, f, indent=1)
        f.write("\n")


def load_links(path: str = LINK_JSON) -> dict[str, Link]:
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        raw = json.load(f)
    return {k: Link(v["mu"], v["sd"], v["n"], tuple(v["studies"]), v["algo"])
            for k, v in raw.items()}


def link_for(algo: str | None, links: Mapping[str, Link] | None = None) -> Link:
    """The fitted link of an algorithm, else the one fitted on every study, else identity."""
    links = load_links() if links is None else links
    return links.get(algo or "") or links.get("all") or IDENTITY


def study_point(study: str, summary: Mapping, runs: Sequence, algo: str, half_width=0.5,
                n_boot: int = 1000, seed: int = 0) -> StudyPoint | None:
    """A recorded study's point: the probe is its reference config's runs that reached
    (B_simple in the N* window around their mean N*), the measurement the summary's r_N of the
    configs that share the reference's lr rule, group size and rollout (k = 1)."""
    from jaxrl_scale.scaling import planner
    refs = summary.get("reference_configs") or {algo: summary.get("reference_config")}
    ref = refs.get(algo)
    if not ref or ref not in summary["configs"]:
        return None
    rc = summary["configs"][ref]
    probe = [r for r in runs if r.group == ref]
    n0 = [summary["runs"][r.name]["N_star"] for r in probe
          if summary["runs"].get(r.name, {}).get("reached")]
    if not probe or not n0:
        return None
    z = planner.probe_noise(probe, "actor", n_star=float(np.mean(n0)), half_width=half_width,
                            n_boot=n_boot, seed=seed)
    if z is None:
        return None
    g_ref = rc.get("group_size")
    B, y, se = [], [], []
    for g, c in summary["configs"].items():
        if (g == ref or c.get("algo") != algo or c.get("lr_rule") != rc.get("lr_rule")
                or (c.get("gen_batch_ratio") or 1) != 1 or c.get("group_size") != g_ref
                or not c.get("r_N") or not c.get("r_N_ci") or c.get("refill")):
            continue
        lo, hi = c["r_N_ci"]
        if not (lo and hi and lo > 0 and math.isfinite(hi)):
            continue
        z90 = sps.norm.ppf(0.5 + summary.get("ci_level", 0.9) / 2)
        B.append(float(c["batch"]))
        y.append(math.log(c["r_N"]))
        se.append((math.log(hi) - math.log(lo)) / (2 * z90))
    if len(B) < 2:
        return None
    w = z["window"]
    return StudyPoint(study, algo, float(rc["batch"]), float(w["b_simple"]),
                      tuple(float(x) for x in w["reps"]), tuple(B), tuple(y), tuple(se))


__all__ = ["StudyPoint", "Link", "IDENTITY", "separation", "b_crit_draws", "fit_link", "fit_links", "save_links",
           "load_links", "link_for", "study_point", "LINK_JSON"]
