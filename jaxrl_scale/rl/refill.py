"""DAPO dynamic sampling: refill filtered groups until the update batch is full.

With `--refill`, a group whose G rewards are all equal (no learning signal under group-
normalised advantages) is filtered, and further rounds of P prompts x G responses are
generated until P groups with a reward spread are kept, at most `refill_cap` rounds per
update (verl `algorithm.filter_groups` with `max_num_gen_batches`, OpenRLHF and slime
`dynamic_sampling`). Rounds after the first have `--refill_prompts` prompts (default P): at
most two generate shapes, both compiled before the run's clock starts.

The update then sees the first P kept groups in generation order (later kept groups are
generated but not trained on, as verl aligns its batch). When the cap ends the refill short
of P, the batch is topped up with filtered groups whose loss mask is empty: the shapes stay
fixed and the shortfall is counted (`refill_short`), never hidden.

Counting (docs/science.md, Time to target): `generated` = every response of every round,
`retained` = the rows the loss sees. A refilled run's sample axis is responses generated
(scaling/io.py), since the refill rounds are what a larger retained batch costs.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from jaxrl_scale.rl.rollout import Rollout


def zero_variance(rewards_B: np.ndarray, group_size: int) -> np.ndarray:
    """bool [P]: the groups of `group_size` consecutive rows whose rewards are all equal."""
    r_PG = np.asarray(rewards_B).reshape(-1, int(group_size))
    return r_PG.max(1) == r_PG.min(1)


def kept_groups(rewards_rounds: Sequence[np.ndarray], group_size: int) -> list[tuple[int, int]]:
    """(round, group) of every group with a reward spread, in generation order."""
    return [(k, int(g)) for k, r in enumerate(rewards_rounds)
            for g in np.flatnonzero(~zero_variance(r, group_size))]


def needs_more(rewards_rounds: Sequence[np.ndarray], group_size: int, groups: int,
               cap: int) -> bool:
    """Whether another round is generated: fewer than `groups` kept and fewer than `cap`
    rounds so far."""
    return (len(rewards_rounds) < cap and
            len(kept_groups(rewards_rounds, group_size)) < groups)


def select_groups(rewards_rounds: Sequence[np.ndarray], group_size: int, groups: int
                  ) -> tuple[list[tuple[int, int]], int]:
    """(the `groups` (round, group) pairs the update trains on, how many of them are filtered
    fillers): the first `groups` kept groups, then, when too few were kept, the earliest
    filtered groups (their loss mask is empty)."""
    kept = kept_groups(rewards_rounds, group_size)[:groups]
    short = groups - len(kept)
    if short:
        chosen = set(kept)
        fill = [(k, g) for k, r in enumerate(rewards_rounds)
                for g in range(len(r) // group_size) if (k, g) not in chosen][:short]
        kept = sorted(kept + fill)
    return kept, short


def take_groups(rounds: Sequence[Rollout], picks: Sequence[tuple[int, int]]) -> Rollout:
    """One rollout made of the picked (round, group) groups, in the order given; decode_s is
    the rounds' total (every round was waited for), and so is reward_wait_s when every
    round's rewards were scored during its decode (rl/scoring.py)."""
    G = rounds[0].group_size
    rows = [(k, g * G + j) for k, g in picks for j in range(G)]
    waits = [r.reward_wait_s for r in rounds]

    def rows_of(field):
        return np.stack([np.asarray(getattr(rounds[k], field))[i] for k, i in rows])

    return Rollout(tokens_BM=rows_of("tokens_BM"), logprobs_BM=rows_of("logprobs_BM"),
                   lengths_B=rows_of("lengths_B"),
                   examples=tuple(rounds[k].examples[g] for k, g in picks),
                   prompts=[rounds[k].prompts[i] for k, i in rows], group_size=G,
                   decode_s=float(sum(r.decode_s for r in rounds)),
                   reward_wait_s=None if None in waits else float(sum(waits)))


def take_rewards(rewards_rounds: Sequence[np.ndarray], picks: Sequence[tuple[int, int]],
                 group_size: int) -> np.ndarray:
    """float32 [P * G]: the picked groups' rewards, aligned with `take_groups`."""
    G = int(group_size)
    return np.concatenate([np.asarray(rewards_rounds[k], np.float32)[g * G:(g + 1) * G]
                           for k, g in picks])


@dataclasses.dataclass(frozen=True)
class Refill:
    """One update's refilled rollout: what it trains on and what it cost."""
    rollout: Rollout            # the P picked groups (take_groups)
    rewards_B: np.ndarray       # their rewards
    failed: int                 # reward calls that failed in the extra rounds
    seen_rewards: np.ndarray    # every round's rewards and lengths (the step's reward stats)
    seen_lengths: np.ndarray
    counts: dict[str, Any]      # generated, gen_rounds, refill_short, zero_var_groups


def refill_rollout(first: Rollout, rewards_B: np.ndarray, next_round: Callable[[int], Rollout],
                   score: Callable[[Rollout], tuple[np.ndarray, int]], *, groups: int,
                   cap: int) -> Refill:
    """Rounds after `first` (scored `rewards_B`) while `needs_more`: `next_round(k)` samples
    round k, `score` gives its (rewards, reward failures)."""
    G = first.group_size
    rounds, rewards, failed = [first], [np.asarray(rewards_B)], 0
    while needs_more(rewards, G, groups, cap):
        r = next_round(len(rounds))
        more, f = score(r)
        rounds.append(r)
        rewards.append(np.asarray(more))
        failed += int(f)
    picks, short = select_groups(rewards, G, groups)
    counts = {"generated": int(sum(len(x) for x in rewards)), "gen_rounds": len(rounds),
              "refill_short": short,
              "zero_var_groups": int(sum(zero_variance(x, G).sum() for x in rewards))}
    return Refill(take_groups(rounds, picks), take_rewards(rewards, picks, G), failed,
                  np.concatenate(rewards),
                  np.concatenate([np.asarray(r.lengths_B) for r in rounds]), counts)


__all__ = ["Refill", "refill_rollout", "kept_groups", "needs_more", "select_groups", "take_groups", "take_rewards",
           "zero_variance"]
