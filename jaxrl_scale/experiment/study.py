"""The study's design: `SweepConfig`, the named `STUDIES`, and every run of the study as a
TrainConfig (its name, batch, lr rule and budget). Pure: nothing here starts a run.

Protocol (the source's; docs/science.md, Batch-size invariance and the lr rules, and
Learning-rate tuning and its bracket): the base lr is tuned at the reference batch
B0 = base_prompts * base_group by a small stage of its own (SWEEP_DIR/_lr_tune, every lr at
every tune seed); every other run scales it by its lr rule (sqrt; the fixed-lr control keeps
it). Each run lives in SWEEP_DIR/<algo>_P<P>_G<G>_<rule>_s<seed>; a run with asynchronous
partial rollout (B_gen = k * B_train, k = gen_batch_ratio > 1) in
<algo>_P<P>_G<G>_<rule>_k<k>_s<seed>, one with u > 1 optimizer updates per rollout
(updates_per_rollout) in <algo>_P<P>_G<G>_<rule>_u<u>[_k<k>]_s<seed>, so the synchronous
one-update runs keep their names whatever the axes. `all_runs` numbers every run (the lr-tuning runs first) for a job array.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import math
import os
from typing import Any

from jaxrl_scale.experiment.checks import check_eval_mode
from jaxrl_scale.experiment.config import ALGOS, ConfigError, TrainConfig
from jaxrl_scale.optim import scaled_lr


TUNE_DIR = "_lr_tune"          # read_sweep skips "_"-prefixed directories: not study runs
EXECUTORS = ("local", "ray")


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """The study. Batch per update B = P * G (PPO: G = 1). Runs: every (algo, P, G, rule) of
    the grid, plus the fixed-lr control at ``fixed_prompts`` (base G) and the extra (P, G)
    points of ``pairs`` (the grid's rules), each for every seed and every ``gen_batch_ratios``
    k (B_gen = k * B_train sequences in flight; 1 = synchronous rollout)."""

    sweep_dir: str = "runs/sweep"
    algos: tuple[str, ...] = ("grpo",)
    prompts: tuple[int, ...] = (8, 16, 32, 64, 128)
    group_sizes: tuple[int, ...] = (8,)
    lr_rules: tuple[str, ...] = ("sqrt",)
    fixed_prompts: tuple[int, ...] = (32, 64)    # fixed-lr control at these P (base G)
    pairs: tuple[tuple[int, int], ...] = ((32, 4),)   # equal P*G with another G
    ppo_prompts: tuple[int, ...] = ()            # PPO's own P grid (default: `prompts`)
    seeds: tuple[int, ...] = (0, 1, 2)          # per warm-start
    # Warm-starts as blocks: every config runs every seed from each warm-start, and the
    # analysis tests with the warm-starts as its units (verdicts about the population of
    # warm-starts, not one draw). warm_starts = W trains W SFT warm-starts of the built-in
    # policy (seeds warmstart_seed .. + W - 1); warm_start_checkpoints names your own (orbax
    # params dirs, one block each). Warm-start w runs the seeds seed + w * (max(seeds) + 1).
    warm_starts: int = 1
    warm_start_checkpoints: tuple[str, ...] = ()
    gen_batch_ratios: tuple[int, ...] = (1,)    # rollout axis: every config at each k
    updates_per_rollout: tuple[int, ...] = (1,)  # reuse axis: every config at each u
    base_prompts: int = 16             # reference P (0: smallest P of the grid)
    base_group: int = 0                # reference G (0: smallest G of the grid)
    max_responses: int = 15360         # response budget per run
    eval_every_responses: int = 5120   # evals at the same N for every batch (64..1024 divide it)
    tune_lrs: tuple[float, ...] = (1e-4, 2e-4, 3e-4)   # lr-tuning stage at B0 (empty: none)
    tune_seeds: tuple[int, ...] = (0,)  # seeds per lr in the tuning stage (>= 2: the choice
                                        # and its bracket are told from seed noise)
    tune_responses: int = 6144         # response budget of each tuning run
    tune_factor: float = 2.0           # the grid grows by this factor beyond its best edge
    tune_max_extensions: int = 3       # rounds of extension until the best lr is interior
    retune_lr_per_batch: bool = False  # the source's recommendation: tune the lr at every batch
                                       # of the grid too, and add a config per batch run with
                                       # its own tuned lr (rule "tuned") beside the lr rules
    timing_steps: int = 0              # > 0: an interleaved timing pass after the runs
                                       # (timing.json; the analysis takes r_q from it), in
                                       # blocks of this many rounds (experiment.timing)
    timing_blocks: int = 4             # the pass's blocks before its stopping rule applies
    timing_max_blocks: int = 8         # ... and at most
    timing_tolerance: float = 0.07     # stop when every log r_q 90% half-width is <= this
    target: float | str = "auto"       # analysis target J* ("auto": from the reference)
    target_fraction: float = 0.5       # auto J* = start + this x (what every reference seed
                                       # reliably reached - start)
    n_unit: str = "responses"          # what the analysis' N counts: responses or tokens
    # > 0: each warm-start's reference runs go first, to the full budget; every other run of
    # that warm-start stops this many evals after its eval first reaches the target those
    # reference runs set (the analysis sets the same one). 0: every run to max_responses.
    target_stop_evals: int = 0
    # "fixed": every config runs from every warm-start. "sequential": the warm-starts run in
    # rounds; at each of `looks` (warm-starts done; default half, two thirds and all of them)
    # the configs decided by the group-sequential test (scaling.sequential: `spending`, the
    # futility stop at `futility`, 0: none) get no more runs, and the study ends early when
    # none is open (docs/science.md, Sequential study).
    design: str = "fixed"
    # True (fixed design, two or more warm-starts, a timing pass per warm-start): after the
    # first warm-start, `jaxrl-plan` on its reference runs and timing pass; the batches its
    # recommended set rules out get no runs from later warm-starts (plan_first.json).
    plan_first: bool = False
    looks: tuple[int, ...] = ()
    spending: str = "obf"
    futility: float = 0.9
    # "noise", "steps" or both ("noise,steps"; experiment/schedule.py): each algorithm also
    # runs a scheduled config per kind beside the fixed batches, from its reference P and G
    # (the same warm-starts and seeds; name tag _sched-<kind>); "steps" follows batch_ramp
    # ("RESPONSES:P,..."), "noise" grows up to the base config's batch_cap (0: the
    # algorithm's largest grid batch).
    batch_schedule: str = "none"
    batch_ramp: str = ""
    compile_cache: bool = True         # JAX persistent compilation cache (shared shapes)
    executor: str = "local"            # "local": one run after another; "ray": a task per run
    ray_address: str = ""              # existing Ray cluster (ray.init(address=...)); "": local
    ray_cpus_per_run: float = 1.0      # num_cpus each run's Ray task reserves

    def base_batch(self) -> int:
        P0 = self.base_prompts or min(self.prompts)
        G0 = self.base_group or min(self.group_sizes)
        return P0 * G0


# What `sweep_batch.py --study=NAME` runs; every field can still be overridden by its flag.
STUDIES: dict[str, dict[str, Any]] = {
    # GRPO, 5 batches over 16x (64..1024 responses, sqrt lr), reference B0 = 128 (P=16 x G=8)
    # with its lr tuned first. Warm-starts as blocks: 6 SFT warm-starts x 2 seeds per config
    # (60 runs), so the verdicts are about the population of warm-starts, not one draw (one
    # warm-start's verdicts flipped on another CPU, whose floating-point path trains another
    # one). With the interaction tau in the error term, Holm over 4 configs (df (C-1)(W-1) =
    # 20) detects r_N = 1.15 (tau 0.04) to 1.21 (tau 0.079) with 80% power, tau the
    # interaction measured between recorded warm-starts and 0.087 the seed SD of log N*
    # (tests/test_sweep.py: test_default_and_full_study_designs). Two
    # seeds per cell separate tau from the seed noise (its interval is reported).
    # Each warm-start's reference runs go to the full budget and set its target; the other
    # runs stop 3 evals after reaching it (half the responses of a recorded study came after
    # N*; results/truncation shows the N* this keeps). A timing pass of one block (8 rounds
    # over the batches) follows each warm-start, so r_q is timed in the machine state of
    # each block's learning and the spread between passes is in the error term.
    # Exact evals every 1,024 responses. The auto target sits three quarters of the way from
    # the start to what every reference seed reached (not half-way): there the curves are
    # past their noisy first bend and most runs have >= 6 evals before N*
    # (results/target_fraction).
    # The lr is tuned at 3 seeds per lr (one per warm-start, seeds no study run has): one
    # seed's scores of adjacent lrs differed by less than the seed-to-seed SD of the score.
    # The fixed-lr control and the equal-P*G pairs, which would make the family larger, are
    # in "full".
    "default": {"fixed_prompts": (), "pairs": (), "warm_starts": 6, "seeds": (0, 1),
                "eval_every_responses": 1024, "timing_steps": 8, "timing_blocks": 1,
                "timing_max_blocks": 1, "target_stop_evals": 3, "target_fraction": 0.75,
                "tune_seeds": (0, 1, 2)},
    # The default's design and configs (its runs reused when run in the same --sweep_dir:
    # the same warm-starts, seeds and names) plus B = 32, the fixed-lr control at B = 256 and
    # 512, two equal-P*G pairs (32 x 4, 8 x 16) and a PPO sweep over P = 64..1024 with its
    # own tuned lr (actor and critic noise scales): the source's findings.
    "full": {"fixed_prompts": (32, 64), "algos": ("grpo", "ppo"),
             "prompts": (4, 8, 16, 32, 64, 128), "pairs": ((32, 4), (8, 16)),
             "ppo_prompts": (64, 128, 256, 512, 1024)},
}


STUDIES["full"] = {**STUDIES["default"], **STUDIES["full"]}


def exact_eval_where_possible(base: TrainConfig, asked: bool) -> TrainConfig:
    """The study evaluates exactly (rl/exact_eval.py) where the task's reward allows it; a task
    scored otherwise (arith_chain, countdown, math) falls back to sampled evals unless
    --eval_mode was given, which then gets its own error."""
    if asked or base.eval_mode != "exact":
        return base
    try:
        check_eval_mode(base)
    except ValueError:
        return base.replace(eval_mode="sampled")
    return base


def study_config(name: str, **overrides) -> SweepConfig:
    if name not in STUDIES:
        raise ConfigError("study", f"{name!r} is unknown", f"use one of {sorted(STUDIES)}")
    return SweepConfig(**{**STUDIES[name], **overrides})


def run_name(algo: str, P: int, G: int, rule: str, seed: int, k: int = 1, u: int = 1,
             schedule: str = "none") -> str:
    """The tags ``_sched-<kind>`` (a batch schedule starting at P), ``_u<u>``
    (updates_per_rollout) and ``_k<k>`` only for a schedule and u, k != 1: runs with
    one update per rollout, synchronous, keep the names they always had, so a study that adds
    either axis resumes from its old results. ``_u`` comes first: stripping ``_k``
    (scaling.io.strip_ratio) names the synchronous twin with the same updates. The names
    scaling.configs.format_config_name writes and parse_config_name reads."""
    tag = (f"_sched-{schedule}" if schedule != "none" else "") + (
        f"_u{u}" if u != 1 else "") + (f"_k{k}" if k != 1 else "")
    return f"{algo}_P{P}_G{G}_{rule}{tag}_s{seed}"


TUNE_SEED_OFFSET = 100_000   # lr tuning from several warm-starts: seeds no study run has


def warm_start_bases(sweep: SweepConfig, base: TrainConfig) -> list[TrainConfig]:
    """The base config of each warm-start block: one per warm_start_checkpoints entry, else
    `base` alone (its own init_checkpoint, if any, is the one warm-start)."""
    return [base.replace(init_checkpoint=p) for p in sweep.warm_start_checkpoints] or [base]


def is_reference_run(sweep: SweepConfig, c: TrainConfig) -> bool:
    """Whether run `c` belongs to its algorithm's reference config, the one
    `scaling.references.default_references` picks: the reference batch, lr rule sqrt,
    synchronous rollout, one update per rollout and the base group size (PPO: 1)."""
    G0 = 1 if c.algo == "ppo" else (sweep.base_group or min(sweep.group_sizes))
    return (c.batch_train == reference_batch(sweep, c.algo) and c.optim.lr_rule == "sqrt"
            and c.gen_batch_ratio == 1 and c.updates_per_rollout == 1 and c.group_size == G0
            and c.batch_schedule == "none")


def block_seed(sweep: SweepConfig, seed: int, w: int) -> int:
    """The run seed of study seed `seed` from warm-start w: distinct over warm-starts, and
    the seeds themselves for one warm-start."""
    return seed + w * (max(sweep.seeds) + 1)


def _points(sweep: SweepConfig) -> list[tuple[str, int, int, str]]:
    """(algo, P, G, rule) of every config, in run order (reference first per algo)."""
    G0 = sweep.base_group or min(sweep.group_sizes)
    out = []
    for algo in sweep.algos:
        if algo == "ppo":
            ps = sweep.ppo_prompts or sweep.prompts
            pts = [(algo, P, 1, r) for r in sweep.lr_rules for P in ps]
        else:
            pts = [(algo, P, G, r) for r in sweep.lr_rules for G in sweep.group_sizes
                   for P in sweep.prompts]
            pts += [(algo, P, G, r) for r in sweep.lr_rules for P, G in sweep.pairs]
            pts += [(algo, P, G0, "fixed") for P in sweep.fixed_prompts]
        if sweep.retune_lr_per_batch:
            G = 1 if algo == "ppo" else G0
            pts += [(algo, B // G, G, "tuned") for B in tune_batches(sweep, algo)]
        out += pts
    seen, uniq = set(), []
    for p in out:
        if p not in seen:
            seen.add(p)
            uniq.append(p)
    return uniq


def _scheduled_points(sweep: SweepConfig) -> list[tuple[str, int, int, str, str]]:
    """(algo, P, G, rule, schedule) of the scheduled configs: one per algorithm and lr rule
    of the grid, starting at the reference's P and G; [] without a schedule."""
    G0 = sweep.base_group or min(sweep.group_sizes)
    return [(algo, reference_batch(sweep, algo) // G, G, rule, kind)
            for kind in schedule_kinds(sweep)
            for algo in sweep.algos for G in ((1,) if algo == "ppo" else (G0,))
            for rule in sweep.lr_rules]


def schedule_kinds(sweep: SweepConfig) -> tuple[str, ...]:
    """The study's schedule kinds, in the order given ("none": ())."""
    return tuple(k for k in (x.strip() for x in sweep.batch_schedule.split(",")) if k != "none")


def _schedule_fields(sweep: SweepConfig, base: TrainConfig, algo: str, schedule: str
                     ) -> dict[str, Any]:
    """The TrainConfig fields of a run with `schedule` ("none": a fixed batch)."""
    if schedule == "none":
        return {"batch_schedule": "none", "batch_ramp": ""}
    grid = [P * G for a, P, G, _ in _points(sweep) if a == algo]
    return {"batch_schedule": schedule,
            "batch_ramp": sweep.batch_ramp if schedule == "steps" else "",
            "batch_cap": base.batch_cap or max(grid)}


def reference_batch(sweep: SweepConfig, algo: str) -> int:
    if algo == "ppo":   # PPO's own grid: its smallest P (G = 1)
        return min(sweep.ppo_prompts or sweep.prompts)
    return sweep.base_batch()


def tune_batches(sweep: SweepConfig, algo: str) -> list[int]:
    """Batches the lr is tuned at: the reference's, or (retune_lr_per_batch) every batch of
    the algorithm's P grid at its base G, the reference first."""
    B0 = reference_batch(sweep, algo)
    if not sweep.retune_lr_per_batch:
        return [B0]
    if algo == "ppo":
        grid = {P for P in (sweep.ppo_prompts or sweep.prompts)}
    else:
        G0 = sweep.base_group or min(sweep.group_sizes)
        grid = {P * G0 for P in sweep.prompts}
    return [B0] + sorted(grid - {B0})


def plan(sweep: SweepConfig, base: TrainConfig, base_lrs: dict[str, float] | None = None,
         batch_lrs: dict[tuple[str, int], float] | None = None) -> list[TrainConfig]:
    """Every run of the study as a TrainConfig, seeds innermost, gen_batch_ratios outermost,
    then updates_per_rollout (the synchronous one-update study first, as it was without the
    axes). The fixed-lr (and tuned-lr)
    run at the reference batch is the sqrt run (same lr), so it is run once. ``base_lrs``
    {algo: lr} replaces base.optim.base_lr (the tuned lr); ``batch_lrs`` {(algo, B): lr}, the
    lr tuned at B itself, is the base lr of the "tuned" configs."""
    runs, seen = [], set()
    points = [(*p, "none") for p in _points(sweep)] + _scheduled_points(sweep)
    for k, u, (w, wbase), (algo, P, G, rule, sched) in itertools.product(
            sweep.gen_batch_ratios, sweep.updates_per_rollout,
            enumerate(warm_start_bases(sweep, base)), points):
        if sched != "none" and k != 1:
            continue   # a schedule runs the synchronous padded update (schedule.py)
        B0 = reference_batch(sweep, algo)
        B = P * G
        eff_rule = "sqrt" if (B == B0 and rule in ("fixed", "linear", "tuned")
                              and sched == "none") else rule
        lr = (batch_lrs or {}).get((algo, B)) if eff_rule == "tuned" else None
        base_lr = (base_lrs or {}).get(algo, base.optim.base_lr)
        if lr is not None and any(math.isclose(lr, scaled_lr(base_lr, B, B0, r), rel_tol=1e-9)
                                  for r in sweep.lr_rules):
            continue   # the lr tuned at B is a grid rule's lr there: that config is this one
        for seed in (block_seed(sweep, s, w) for s in sweep.seeds):
            name = run_name(algo, P, G, eff_rule, seed, k, u, sched)
            if name in seen:
                continue
            seen.add(name)
            runs.append(wbase.replace(
                run_dir=os.path.join(sweep.sweep_dir, name), algo=algo,
                prompts_per_step=P, group_size=G, lr_rule=eff_rule, seed=seed,
                gen_batch_ratio=k, updates_per_rollout=u,
                base_batch=B0, base_lr=lr or base_lr,
                max_responses=sweep.max_responses, max_steps=10 ** 9,
                eval_every=max(1, sweep.eval_every_responses // B),
                checkpoint_every=max(1, sweep.max_responses // 2 // B),   # half-way and end
                target=0.0, target_margin=0.0, **_schedule_fields(sweep, base, algo, sched)))
    return runs


def tune_plan(sweep: SweepConfig, base: TrainConfig) -> list[TrainConfig]:
    """One run per (algo, lr, tune seed) at the reference batch, seeds innermost, shorter
    budget, synchronous rollout (the lr is tuned once; partial rollout is a system change
    measured against it)."""
    return [tune_run(sweep, base, algo, lr, B, seed) for algo in sweep.algos
            for B in tune_batches(sweep, algo) for lr in sweep.tune_lrs
            for seed in sweep.tune_seeds]


def _tune_block(sweep: SweepConfig, base: TrainConfig, seed: int) -> tuple[TrainConfig, int]:
    """(base, run seed) of tune seed `seed`: with several warm-starts, tune seed j runs from
    warm-start j mod W on a seed no study run has (the tuning scores then average over
    warm-starts and never reuse the reference runs' first responses)."""
    bases = warm_start_bases(sweep, base)
    if len(bases) < 2:
        return base, seed
    return bases[seed % len(bases)], TUNE_SEED_OFFSET + seed


def tune_run_name(algo: str, P: int, G: int, lr: float, seed: int = 0) -> str:
    """Seed 0 keeps the name it had when tuning ran one seed (old sweep dirs resume); other
    seeds add ``_s<seed>``."""
    return f"{algo}_P{P}_G{G}_lr{lr:g}" + (f"_s{seed}" if seed else "")


def tune_run(sweep: SweepConfig, base: TrainConfig, algo: str, lr: float,
             batch: int | None = None, seed: int = 0) -> TrainConfig:
    """The tuning run of one (algo, lr, seed) at `batch` (default: the reference batch), with
    lr exactly `lr` there (rule sqrt at B0, "tuned" elsewhere)."""
    B0 = reference_batch(sweep, algo)
    B = batch or B0
    G = 1 if algo == "ppo" else (sweep.base_group or min(sweep.group_sizes))
    base, seed = _tune_block(sweep, base, seed)
    name = tune_run_name(algo, B // G, G, lr, seed)
    return base.replace(
        run_dir=os.path.join(sweep.sweep_dir, TUNE_DIR, name), algo=algo,
        prompts_per_step=B // G, group_size=G, lr_rule="sqrt" if B == B0 else "tuned",
        seed=seed,
        base_batch=B0, gen_batch_ratio=1, updates_per_rollout=1,
        base_lr=lr, max_responses=sweep.tune_responses, max_steps=10 ** 9,
        eval_every=max(1, sweep.eval_every_responses // 2 // B),
        checkpoint_every=max(1, sweep.tune_responses // 2 // B),
        target=0.0, target_margin=0.0)


def all_runs(sweep: SweepConfig, base: TrainConfig) -> list[tuple[str, TrainConfig]]:
    """(name relative to sweep_dir, config) of every run, in the order `sweep.run_one` indexes them:
    the lr-tuning runs first, then the study's runs (with base.optim.base_lr: the tuned lr is
    known only once tuning has finished, and it does not change a run's name)."""
    return [(os.path.relpath(c.run_dir, sweep.sweep_dir), c)
            for c in tune_plan(sweep, base) + plan(sweep, base)]


DESIGNS = ("fixed", "sequential")


def n_blocks(sweep: SweepConfig) -> int:
    """The study's warm-start blocks."""
    return len(sweep.warm_start_checkpoints) or sweep.warm_starts


def sequential_plan(sweep: SweepConfig):
    """The sequential study's `scaling.sequential.Plan` (None for a fixed design)."""
    from jaxrl_scale.scaling.sequential import plan_of
    return plan_of(dataclasses.asdict(sweep))


def check_sweep_fields(sweep: SweepConfig) -> None:
    """A ConfigError naming the first bad field of the study itself (its runs' configs are
    checked by sweep.validate_sweep)."""
    from jaxrl_scale.optim import ADAM_RULES

    def need(field: str, ok: bool, problem: str, fix: str) -> None:
        if not ok:
            raise ConfigError(field, problem, fix)

    def ints(field: str, lo: int, example: str) -> None:
        v = getattr(sweep, field)
        need(field, all(isinstance(x, int) and x >= lo for x in v),
             f"must be integers >= {lo}, got {v}", f"e.g. --{field}={example}")

    need("algos", bool(sweep.algos) and set(sweep.algos) <= set(ALGOS),
         f"{sweep.algos} is not a non-empty subset of {ALGOS}", "e.g. --algos=grpo,ppo")
    need("prompts", bool(sweep.prompts), "is empty", "e.g. --prompts=8,16,32")
    need("seeds", bool(sweep.seeds), "is empty", "e.g. --seeds=0,1,2")
    need("warm_starts", isinstance(sweep.warm_starts, int) and sweep.warm_starts >= 1,
         f"must be an integer >= 1, got {sweep.warm_starts!r}",
         "e.g. --warm_starts=6 (SFT warm-starts, each a block of the test)")
    n_ckpt = len(sweep.warm_start_checkpoints)
    need("warm_start_checkpoints", n_ckpt != 1, "names one checkpoint: one warm-start is "
         "no block design", "name two or more, or use --init_checkpoint for one")
    need("warm_start_checkpoints", not n_ckpt or sweep.warm_starts in (1, n_ckpt),
         f"names {n_ckpt} checkpoints but --warm_starts={sweep.warm_starts}",
         f"drop --warm_starts (the checkpoints are the warm-starts) or give {sweep.warm_starts}")
    need("warm_start_checkpoints", len(set(sweep.warm_start_checkpoints)) == n_ckpt,
         f"repeats a checkpoint: {sweep.warm_start_checkpoints}", "name each warm-start once")
    need("group_sizes", bool(sweep.group_sizes), "is empty", "e.g. --group_sizes=8")
    need("gen_batch_ratios", bool(sweep.gen_batch_ratios), "is empty",
         "e.g. --gen_batch_ratios=1,2 (1: synchronous rollout)")
    need("updates_per_rollout", bool(sweep.updates_per_rollout), "is empty",
         "e.g. --updates_per_rollout=1,2,4 (1: one update per rollout)")
    for field, lo, example in (("prompts", 1, "8,16,32"), ("group_sizes", 1, "4,8"),
                               ("fixed_prompts", 1, "32,64"), ("ppo_prompts", 1, "64,128"),
                               ("seeds", 0, "0,1,2"), ("gen_batch_ratios", 1, "1,2"),
                               ("updates_per_rollout", 1, "1,2,4")):
        ints(field, lo, example)
    need("target_stop_evals", isinstance(sweep.target_stop_evals, int)
         and sweep.target_stop_evals >= 0, f"must be an integer >= 0, got "
         f"{sweep.target_stop_evals!r}", "e.g. --target_stop_evals=3 (0: every run to "
         "--max_responses)")
    need("design", sweep.design in DESIGNS, f"must be one of {DESIGNS}, got {sweep.design!r}",
         "e.g. --design=sequential")
    if sweep.design == "sequential":
        from jaxrl_scale.scaling.sequential import SPENDING, default_looks
        W = n_blocks(sweep)
        need("design", W >= 3, f"=sequential needs 3 or more warm-starts to add in rounds, "
             f"the study has {W}", "e.g. --warm_starts=6, or --design=fixed")
        looks = tuple(sweep.looks) or default_looks(W)
        need("looks", all(isinstance(x, int) for x in looks) and looks[0] >= 2 and all(
             b > a for a, b in zip(looks, looks[1:])) and looks[-1] == W,
             f"must be increasing warm-start counts from >= 2 to all {W}, got {looks}",
             f"e.g. --looks={','.join(map(str, default_looks(W)))}")
        need("spending", sweep.spending in SPENDING, f"must be one of {SPENDING}, got "
             f"{sweep.spending!r}", "e.g. --spending=obf (O'Brien-Fleming type)")
        need("futility", 0 <= sweep.futility < 1, f"must lie in [0, 1), got {sweep.futility}",
             "e.g. --futility=0.9 (stop a config that cannot be 10% faster; 0: never)")
    if sweep.plan_first:
        need("plan_first", sweep.design == "fixed" and n_blocks(sweep) >= 2
             and sweep.timing_steps > 0, "needs --design=fixed, two or more warm-starts and "
             f"a timing pass per warm-start (design {sweep.design}, {n_blocks(sweep)} "
             f"warm-start(s), timing_steps {sweep.timing_steps})",
             "e.g. --warm_starts=6 --timing_steps=8, or drop --plan_first")
    from jaxrl_scale.experiment.schedule import SCHEDULES
    kinds = [x.strip() for x in sweep.batch_schedule.split(",")]
    need("batch_schedule", set(kinds) <= set(SCHEDULES) and len(set(kinds)) == len(kinds)
         and (kinds == ["none"] or "none" not in kinds), f"{sweep.batch_schedule!r} is not "
         f"one of {SCHEDULES} or a list of distinct kinds other than none",
         "e.g. --batch_schedule=noise or noise,steps (none: fixed batches only)")
    need("batch_ramp", ("steps" in kinds) == bool(sweep.batch_ramp),
         "--batch_schedule=steps needs a ramp" if "steps" in kinds else
         f"is set but --batch_schedule={sweep.batch_schedule}",
         "pass e.g. --batch_schedule=steps --batch_ramp=0:16,8192:32")
    need("target_fraction", 0 < sweep.target_fraction < 1,
         f"must lie strictly between 0 and 1, got {sweep.target_fraction}",
         "e.g. --target_fraction=0.75 (the auto target's share of the way from the start to "
         "what every reference seed reached)")
    from jaxrl_scale.scaling.units import N_UNITS
    need("n_unit", sweep.n_unit in N_UNITS, f"must be one of {', '.join(N_UNITS)}, got "
         f"{sweep.n_unit!r}", "pass --n_unit=responses or --n_unit=tokens")
    need("pairs", all(len(pg) == 2 and min(pg) >= 1 for pg in sweep.pairs),
         f"must be PxG pairs of positive integers, got {sweep.pairs}", "e.g. --pairs=32x4")
    bad = [r for r in sweep.lr_rules if r not in ADAM_RULES or r == "tuned"]
    need("lr_rules", bool(sweep.lr_rules) and not bad, f"{bad or 'empty'} not among "
         f"{tuple(r for r in ADAM_RULES if r != 'tuned')}", "use some of "
         f"{', '.join(r for r in ADAM_RULES if r != 'tuned')} (per-batch tuned lrs: "
         "--retune_lr_per_batch)")
    need("retune_lr_per_batch", not sweep.retune_lr_per_batch or bool(sweep.tune_lrs),
         "needs an lr grid to tune at every batch, but --tune_lrs is empty",
         "pass --tune_lrs=1e-4,2e-4,3e-4 or drop --retune_lr_per_batch")
    need("timing_steps", isinstance(sweep.timing_steps, int) and sweep.timing_steps >= 0,
         f"must be an integer >= 0, got {sweep.timing_steps!r}",
         "e.g. --timing_steps=6 (0: no timing pass)")
    # r_q's interval is between blocks: those of the one pass, or with warm-start blocks
    # (a pass after each warm-start) between the passes, which may then have one block each
    lo = 1 if sweep.warm_starts > 1 or sweep.warm_start_checkpoints else 2
    need("timing_blocks", isinstance(sweep.timing_blocks, int) and sweep.timing_blocks >= lo,
         f"must be an integer >= {lo} (r_q's interval is between blocks), got "
         f"{sweep.timing_blocks!r}", "e.g. --timing_blocks=4")
    need("timing_max_blocks", isinstance(sweep.timing_max_blocks, int)
         and sweep.timing_max_blocks >= sweep.timing_blocks, f"must be an integer >= "
         f"timing_blocks={sweep.timing_blocks}, got {sweep.timing_max_blocks!r}",
         f"e.g. --timing_max_blocks={max(8, sweep.timing_blocks)}")
    need("timing_tolerance", sweep.timing_tolerance > 0, f"must be > 0, got "
         f"{sweep.timing_tolerance}", "e.g. --timing_tolerance=0.07 (log r_q half-width)")
    need("tune_factor", sweep.tune_factor > 1, f"must be > 1, got {sweep.tune_factor}",
         "e.g. --tune_factor=2")
    need("tune_max_extensions", isinstance(sweep.tune_max_extensions, int)
         and sweep.tune_max_extensions >= 0, f"must be an integer >= 0, got "
         f"{sweep.tune_max_extensions!r}", "e.g. --tune_max_extensions=3 (0: the grid as given)")
    need("tune_seeds", bool(sweep.tune_seeds) and len(set(sweep.tune_seeds)) == len(
         sweep.tune_seeds) and all(isinstance(x, int) and x >= 0 for x in sweep.tune_seeds),
         f"must be distinct integers >= 0, at least one, got {sweep.tune_seeds}",
         "e.g. --tune_seeds=0,1,2 (seeds per lr in the tuning stage; 0 alone: noise not "
         "measured)")
    need("tune_lrs", all(lr > 0 for lr in sweep.tune_lrs),
         f"learning rates must be > 0, got {sweep.tune_lrs}", "e.g. --tune_lrs=1e-4,2e-4")
    for field in ("max_responses", "eval_every_responses", "tune_responses"):
        v = getattr(sweep, field)
        need(field, isinstance(v, int) and v >= 1, f"must be an integer >= 1, got {v!r}",
             f"set --{field} to a positive number of responses")
    biggest = max(P * G for _, P, G, _ in _points(sweep))
    need("max_responses", sweep.max_responses >= biggest, f"{sweep.max_responses} responses is "
         f"less than one update of the study's largest batch, {biggest}",
         f"set --max_responses >= {biggest} (the default study gives each run 15 updates' "
         f"worth: e.g. {15 * biggest})")
    tune_b = max((B for a in sweep.algos for B in tune_batches(sweep, a)), default=0)
    need("tune_responses", not sweep.tune_lrs or sweep.tune_responses >= tune_b,
         f"{sweep.tune_responses} responses is less than one update of the tuning batch "
         f"{tune_b}", f"set --tune_responses >= {tune_b}")
    for field in ("base_prompts", "base_group"):
        v = getattr(sweep, field)
        need(field, isinstance(v, int) and v >= 0, f"must be >= 0 (0: the smallest), got {v}",
             f"set --{field} to a grid value or 0")
    need("executor", sweep.executor in EXECUTORS, f"{sweep.executor!r} is not one of "
         f"{EXECUTORS}", "use --executor=local (one run after another) or --executor=ray")
    need("executor", sweep.executor != "ray" or importlib.util.find_spec("ray") is not None,
         "ray is not installed", "pip install -e '.[ray]'")
    need("ray_address", not sweep.ray_address or sweep.executor == "ray",
         f"{sweep.ray_address!r} is given but the executor is {sweep.executor!r}",
         "add --executor=ray, or drop --ray_address")
    need("ray_cpus_per_run", sweep.ray_cpus_per_run > 0,
         f"must be > 0, got {sweep.ray_cpus_per_run}", "e.g. --ray_cpus_per_run=4")
    t = sweep.target
    need("target", t == "auto" or (isinstance(t, (int, float)) and 0 <= t <= 1),
         f"must be 'auto' or a score in [0, 1], got {t!r}", "e.g. --target=auto or 0.6")
