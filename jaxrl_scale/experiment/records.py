"""What the training loop's records hold, from the step's outputs: the update's metrics as
JSON (`step_metrics`), the eval score's standard error (`eval_se`) and pass@k / avg@k
(`pass_k_fields`), and the streak of skipped non-finite updates that stops a run that cannot
learn (`skipped_streak`)."""
from __future__ import annotations

from typing import Any

import numpy as np

from jaxrl_scale.experiment.errors import ConfigError
from jaxrl_scale.scaling import stats


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


def pass_at_k(n: int, c_P: np.ndarray, k: int) -> np.ndarray:
    """Unbiased pass@k of each prompt from n samples of which c_P were correct (Chen et al.
    2021, "Evaluating Large Language Models Trained on Code", eq. 1):
        1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i)
    the probability that k of the n samples drawn without replacement hold a correct one. The
    product form never forms a binomial coefficient (exact in float64 for any n); with
    n - c < k the product has its i = k factor, 0, so pass@k = 1."""
    n, k = int(n), int(k)
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    c_P = np.asarray(c_P, np.int64)
    i_N = np.arange(1, n + 1, dtype=np.float64)
    factor_PN = np.where(i_N[None, :] > (n - c_P)[:, None], 1.0 - k / i_N[None, :], 1.0)
    return 1.0 - np.prod(factor_PN, axis=1)


def pass_k_fields(ok_PN: np.ndarray, ks) -> dict[str, float | None]:
    """The eval record's pass@k and avg@k for each k in `ks`, from ok_PN (P prompts x n samples
    graded), each the mean over prompts with its standard error over prompts,
    std_{P-1} / sqrt(P) (None for one prompt): pass@k (`pass_at_k`) and avg@k, the expected
    accuracy of the mean of k draws, which is the n samples' accuracy for every k <= n."""
    P, n = ok_PN.shape
    c_P = np.asarray(ok_PN, bool).sum(axis=1)

    def mean_se(x_P: np.ndarray) -> tuple[float, float | None]:
        se = float(np.std(x_P, ddof=1) / np.sqrt(P)) if P > 1 else None
        return float(np.mean(x_P)), se

    out: dict[str, float | None] = {}
    for k in ks:
        for name, x_P in ((f"pass@{k}", pass_at_k(n, c_P, k)), (f"avg@{k}", c_P / n)):
            out[name], out[f"{name}_se"] = mean_se(x_P)
    return out


def _updates_made(empty_U) -> Any:
    """Which of the U updates were made (a boolean index), from their empty_minibatch flags;
    every one when there are no flags or none was made (the mean then stays defined)."""
    if empty_U is None:
        return slice(None)
    made_U = np.asarray(empty_U) == 0
    return made_U if made_U.any() else slice(None)


def step_metrics(m: dict, micro_batch_size: int, max_grad_norm: float,
                 critic: dict | None = None, actor_batch: int | None = None) -> dict[str, Any]:
    """The update's metrics as JSON, under the step's own names (docs/api.md, metrics.jsonl):
    scalars as floats, micro-batch norms as lists; adds micro_batch_size and whether clipping
    acted.

    critic: the PPO critic's schedule {"critic_updates", "critic_batch",
    "critic_micro_batch_size"}, recorded as is. With several critic updates per rollout its
    metrics carry a leading [updates] axis and are logged as means over the updates (the
    squared norms stay unbiased estimates of E|g|^2 at the critic's own batch sizes, which
    the noise scale reads from these fields).

    actor_batch: responses per actor update when the actor makes several per rollout
    (updates_per_rollout x update_epochs > 1; recorded as `actor_batch`, the noise scale's
    big batch): its metrics then carry a leading [updates] axis too and are logged the same
    way. Cumulative
    counters (`*_nonfinite_count`) take the last update's value; `clipped` is whether
    clipping acted on any of the actor's updates. A minibatch with no loss tokens makes no
    update (rl/microbatch.multi_update): the per-update `empty_minibatch` flags are recorded
    as their count, `empty_minibatches` (`critic_empty_minibatches`), and the means are over
    the updates made, so a skipped one's zero gradient does not dilute the noise scale's
    |G|^2.
    """
    out: dict[str, Any] = dict(critic or {})
    reduce = bool(critic) and critic["critic_updates"] > 1
    made = {who: _updates_made(m.get(flag)) for who, flag in (
        ("actor", "empty_minibatch"), ("critic", "critic_empty_minibatch"))}
    for k, v in m.items():
        if k.endswith("grads"):
            continue
        a = np.asarray(v)
        if k.endswith("empty_minibatch"):
            out[k + "es"] = int(a.sum())
            continue
        who = "critic" if k.startswith("critic_") else "actor"
        if a.ndim and (reduce if who == "critic" else actor_batch is not None):
            a = a[-1] if k.endswith("nonfinite_count") else a[made[who]].mean(axis=0)
        out[k] = a.reshape(-1).tolist() if a.ndim else float(a)
    if actor_batch is not None:
        out["actor_batch"] = actor_batch
    out["micro_batch_size"] = micro_batch_size
    if max_grad_norm:
        out["clipped"] = bool(np.any(np.asarray(m["actor_grad_norm"]) > max_grad_norm))
    return out


# A run stops when this many updates in a row were all skipped as non-finite (optim's
# skip_nonfinite_updates): a skipped update leaves the params as they were, so a transient
# overflow costs one step and the next, on new prompts, usually goes through; five in a row
# is a run that cannot move (an infinite lr, an overflowing loss) and must not report
# "finished" after training on nothing. A run with 1% of its steps skipped at random trips
# this with probability 1e-10 per step.
NONFINITE_STREAK = 5


class NonfiniteUpdatesError(ConfigError):
    """The run's last NONFINITE_STREAK updates were all skipped as non-finite (one line, like
    a bad input: the usual cause is an lr or reward scale the update cannot take)."""


def skipped_streak(streak: int, count_before: float, rec: dict) -> tuple[int, float]:
    """(consecutive skipped updates, actor_nonfinite_count) after the step whose record is
    `rec`: the cumulative count grew = this update was skipped; a step without an update (all
    groups filtered) neither extends nor breaks the streak."""
    count = rec.get("actor_nonfinite_count")
    if count is None:
        return streak, count_before
    return (streak + 1 if count > count_before else 0), count


def target_stop(scores: tuple, target: float, evals_after: int) -> bool:
    """Whether a run whose evals so far scored `scores` may stop at `target`: the monotone
    (isotonic) fit of them, the curve the analysis reads N* from (`scaling.run_stats`),
    reached it at least `evals_after` evals before the last one. 0: the raw eval alone."""
    k = evals_after
    return not k or (len(scores) > k and stats.isotonic(scores)[-k - 1] >= target)
