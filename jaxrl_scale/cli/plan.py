r"""Plan the batch size before a sweep: from one probe run at the reference batch B0 and a
step-time fit, predict r_N(B), r_q(B) and T/T0 = r_N / r_q with intervals at candidate batches
and recommend the batch range that minimises time to target (docs/science.md, The planner;
jaxrl_scale/scaling/planner.py has the math and the range rule).

    python experiments/plan.py --probe_run=runs/grpo_P16_G8_sqrt_s0 --target=0.27 \
        --time_batches=64,128,256 --batches=64,128,256,512,1024      # timing pass (JAX)
    python experiments/plan.py --probe_run=RUN --timings_json=timings.json
    python experiments/plan.py --probe_run=RUN --step_times_from=SWEEP_DIR  # sweep's records
    python experiments/plan.py --probe_run=RUN --chip=H100 --model=qwen2_0.5b --prompt_len=256
    python experiments/plan.py ... --compare=SWEEP/summary.json   # predictions vs measured
    python experiments/plan.py ... --target=0.27 --schedule_steps=0:128,8192:256  # a schedule

Exactly one throughput source (--chip: jaxrl_scale.scaling.roofline.roofline_fit at the
candidates and B0, no throughput interval). --probe_run takes several run dirs (seeds of one
config): their updates are pooled. Writes OUT_DIR/plan.json (docs/api.md, plan.json; or
--json_out), plan.png, timings.json (the timing entries, unless --chip) and,
with --compare, compare.json + compare.md. Bad input: one line `error: ...` and exit 2.
"""

from __future__ import annotations

import json
import os
import sys

from absl import flags

from jaxrl_scale.cli import one_line_errors, quiet_logging, run_main
from jaxrl_scale.numbers import fmt_ci, to_jsonable, write_json
from jaxrl_scale.scaling import plan_compare, step_cost

FLAGS = flags.FLAGS
flags.DEFINE_list("probe_run", [], "Run dir(s) at the reference batch B0 (config.json + "
                  "metrics.jsonl with the gradient-norm fields); several = seeds, pooled.")
flags.DEFINE_list("batches", [], "Candidate batches (responses per update); default "
                  "B0/4 .. 8 B0 in doublings.")
flags.DEFINE_enum("noise_of", "actor", ["actor", "critic"], "Network whose B_simple is "
                  "B_crit (PPO: both are reported under by_network).")
flags.DEFINE_float("n_star", None, "Reference's responses to target N*: B_simple is taken "
                   "over the updates in [N*(1-w), N*(1+w)].")
flags.DEFINE_float("target", None, "Target score J*: N* is where the probe runs' (isotonic) "
                   "eval curves first reach it. Without --n_star/--target: the whole run.")
flags.DEFINE_float("window", 0.5, "Relative half width w of the N* window.")
flags.DEFINE_float("external_s", 0.0, "Seconds per request of time outside the model per "
                   "update (a reward judge, a remote verifier, an environment): with "
                   "--external_batch and --external_concurrency, every step time gains "
                   "external_s x ceil(B / (external_batch x external_concurrency)); 0: none.")
flags.DEFINE_integer("external_batch", 1, "Responses per external request.")
flags.DEFINE_integer("external_concurrency", 1, "External requests in flight at once.")
flags.DEFINE_enum("b_crit_link", "fitted", ["fitted", "simple"], "How the actor's B_crit "
                  "follows from its B_simple: 'fitted', B_crit = B_simple / a with a and its "
                  "between-study spread fitted on the recorded studies (scaling/planner_link.py); "
                  "'simple', B_crit = B_simple (McCandlish et al. 2018).")
flags.DEFINE_string("timings_json", None, "Timing-pass JSON: [{batch, batch_gen, gen_s: [...], "
                    "train_s: [...]}, ...] (experiment.timing.time_batches output).")
flags.DEFINE_list("time_batches", [], "Run a timing pass at these batches on the probe's "
                  "config (needs JAX and the probe's data and checkpoint).")
flags.DEFINE_string("step_times_from", None, "Sweep dir (or study dir with logs/): its runs' "
                    "own step-time records stand in for a timing pass.")
flags.DEFINE_integer("timing_warmup", 2, "Timing pass: untimed (compiling) steps first.")
flags.DEFINE_integer("timing_steps", 3, "Timing pass: timed steps per batch (0 with "
                     "--step_times_from: every update after the warmup).")
flags.DEFINE_string("chip", None, "Roofline spec instead of a timing pass (e.g. H100, H200, "
                    "v5e); with --model and --prompt_len.")
flags.DEFINE_string("model", None, "Roofline: model preset (default: the probe's config).")
flags.DEFINE_integer("prompt_len", None, "Roofline: prompt tokens per sequence.")
flags.DEFINE_float("gen_batch_ratio", None, "k = B_gen / B_train of the planned runs "
                   "(default: the probe's).")
flags.DEFINE_integer("n_boot", 1000, "Bootstrap replicates (noise scale and step-time fit).")
flags.DEFINE_integer("block", 0, "Moving-block length in updates (0: n^(1/3)).")
flags.DEFINE_integer("n_windows", 8, "Windows of the B_simple trajectory.")
flags.DEFINE_float("ci_level", 0.9, "Level of every interval.")
flags.DEFINE_integer("seed", 0, "Bootstrap seed.")
flags.DEFINE_string("out_dir", "results/plan", "Where plan.json, plan.png, ... go.")
flags.DEFINE_string("json_out", None, "Planner JSON path (default OUT_DIR/plan.json); the "
                    "other files go beside it.")
flags.DEFINE_string("compare", None, "summary.json of a sweep (experiments/analyze.py): "
                    "predictions beside its measured r_N, r_q, T/T0.")
flags.DEFINE_string("schedule_steps", None, "A batch trajectory RESPONSES:B,RESPONSES:B,... "
                    "(B responses per update from that many cumulative responses on, the first "
                    "at 0; --batch_ramp's syntax in B, not P): also predict its T/T0 against "
                    "B0, integrating r_N(B) and r_q(B) along it with the same draws "
                    "(scaling/schedule_plan.py; plan.json \"schedule\"). Needs --target or "
                    "--n_star.")
flags.DEFINE_string("reward_fn", "", "Timing pass: the reward function (module:function) the "
                    "timed runs call. A probe's config.json never chooses code that runs: if "
                    "it names a reward_fn, pass the same name here to confirm it.")


def _numbers(name: str, values, integer: bool = False) -> list[float]:
    """The comma-separated list of --name as finite positive numbers (integers if asked)."""
    import math
    from jaxrl_scale.experiment.config import ConfigError
    out = []
    kind = "positive integer" if integer else "positive number"
    for v in values:
        try:
            x = float(v)
        except ValueError:
            raise ConfigError(name, f"{v!r} is not a number", f"pass e.g. --{name}=64,128,256") \
                from None
        if not (math.isfinite(x) and x > 0) or (integer and not x.is_integer()):
            raise ConfigError(name, f"{v!r} is not a finite {kind}",
                              f"pass e.g. --{name}=64,128,256")
        out.append(x)
    if len(set(out)) != len(out):
        raise ConfigError(name, f"{','.join(values)} repeats a value", "list each batch once")
    return out


THROUGHPUT_SOURCES = ("timings_json", "time_batches", "step_times_from", "chip")


def _throughput_source() -> str:
    """The one throughput source flag given; ConfigError for none or several."""
    from jaxrl_scale.experiment.errors import ConfigError
    given = [n for n in THROUGHPUT_SOURCES if FLAGS[n].value]
    if len(given) != 1:
        raise ConfigError("timings_json", "no throughput source given" if not given else
                          f"several throughput sources given ({', '.join(given)})",
                          "pass exactly one of --timings_json, --time_batches, "
                          "--step_times_from, --chip")
    return given[0]


def _schedule_segments():
    """--schedule_steps as trajectory segments (None when not given); ConfigError for bad
    syntax, or without the reference's N* (--target / --n_star) its segments are measured
    against."""
    from jaxrl_scale.experiment.config import ConfigError
    from jaxrl_scale.scaling.schedule_plan import parse_segments
    if not FLAGS.schedule_steps:
        return None
    try:
        segs = parse_segments(FLAGS.schedule_steps)
    except ValueError as e:
        raise ConfigError("schedule_steps", str(e), "pass e.g. --schedule_steps=0:128,8192:256 "
                          "(responses:batch, starting at 0)") from None
    if FLAGS.target is None and FLAGS.n_star is None:
        raise ConfigError("schedule_steps", "its segments start at absolute responses, so its "
                          "T/T0 needs the reference's N*", "pass --target (or --n_star)")
    return segs


def check_flags() -> None:
    """ConfigError (one line, exit 2) for every flag the planner cannot use, before any run is
    read, timed or written: ranges through the shared checker (config.check_ranges: finite,
    typed), the one throughput source and the files and directories the flags name."""
    import math
    from jaxrl_scale.experiment.config import ConfigError, check_ranges
    from jaxrl_scale.scaling.stats import min_n_boot
    inf = math.inf
    if FLAGS.target is not None and not math.isfinite(FLAGS.target):
        raise ConfigError("target", f"must be a finite score, got {FLAGS.target}",
                          "pass the score J* the probe reaches, e.g. --target=0.3")
    if not (math.isfinite(FLAGS.ci_level) and 0 < FLAGS.ci_level < 1):
        raise ConfigError("ci_level", f"must be in (0, 1), got {FLAGS.ci_level}",
                          "set --ci_level in (0, 1), e.g. 0.9")
    ranges = {"window": (0, inf, True), "timing_warmup": (0, inf, False),
              "timing_steps": (0, inf, False), "block": (0, inf, False),
              "n_windows": (1, inf, False), "seed": (0, inf, False),
              "n_star": (0, inf, True),
              "prompt_len": (1, inf, False), "gen_batch_ratio": (1, inf, False),
              "external_s": (0, inf, False), "external_batch": (1, inf, False),
              "external_concurrency": (1, inf, False)}
    ints = {"timing_warmup", "timing_steps", "block", "n_windows", "seed", "prompt_len",
            "external_batch", "external_concurrency"}
    check_ranges({k: FLAGS[k].value for k in ranges if FLAGS[k].value is not None}, ranges,
                 ints)
    need = min_n_boot(FLAGS.ci_level)
    if FLAGS.n_boot < need:
        raise ConfigError("n_boot", f"must be >= {need} for {FLAGS.ci_level:g} intervals, got "
                          f"{FLAGS.n_boot}", f"set --n_boot >= {need} (default 1000)")
    if FLAGS.n_star is not None and FLAGS.target is not None:
        raise ConfigError("n_star", "both --n_star and --target given", "pass one of them")
    if not FLAGS.probe_run:
        raise ConfigError("probe_run", "no probe run given", "pass --probe_run=RUN_DIR "
                          "(a run at the reference batch)")
    for p in FLAGS.probe_run:
        if not os.path.isfile(os.path.join(p, "metrics.jsonl")):
            raise ConfigError("probe_run", f"{p!r} has no metrics.jsonl", "pass a run "
                              "directory written by jaxrl-train (config.json + metrics.jsonl)")
    _numbers("batches", FLAGS.batches)
    _schedule_segments()
    _throughput_source()
    if FLAGS.timings_json and not os.path.isfile(FLAGS.timings_json):
        raise ConfigError("timings_json", f"{FLAGS.timings_json!r} is not a file",
                          "pass the JSON list a timing pass wrote")
    if FLAGS.step_times_from and not os.path.isdir(FLAGS.step_times_from):
        raise ConfigError("step_times_from", f"{FLAGS.step_times_from!r} is not a directory",
                          "pass a sweep directory whose subdirectories are runs")
    if FLAGS.time_batches:
        _numbers("time_batches", FLAGS.time_batches, integer=True)
    if FLAGS.chip:
        from jaxrl_scale.bench import CHIPS
        if FLAGS.chip not in CHIPS:
            raise ConfigError("chip", f"unknown chip {FLAGS.chip!r}",
                              f"pass one of {', '.join(sorted(CHIPS))}")
        if not FLAGS.prompt_len:
            raise ConfigError("prompt_len", "the roofline needs the prompt length",
                              "pass --prompt_len=TOKENS")
    if FLAGS.model:
        from jaxrl_scale.models.config import PRESETS
        if FLAGS.model not in PRESETS:
            raise ConfigError("model", f"unknown preset {FLAGS.model!r}",
                              f"pass one of {', '.join(sorted(PRESETS))}")
    if FLAGS.compare and not os.path.isfile(FLAGS.compare):
        raise ConfigError("compare", f"{FLAGS.compare!r} is not a file",
                          "pass the summary.json experiments/analyze.py wrote")
    json_out = FLAGS.json_out or os.path.join(FLAGS.out_dir, "plan.json")
    if os.path.isdir(json_out):
        raise ConfigError("json_out" if FLAGS.json_out else "out_dir", f"{json_out!r} is a "
                          "directory", "pass a file path for the plan JSON")
    parent = os.path.dirname(os.path.abspath(json_out))
    while not os.path.exists(parent):     # the nearest existing ancestor is where it is made
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError("json_out" if FLAGS.json_out else "out_dir", f"cannot write under "
                          f"{parent!r} (not a writable directory)", "choose a writable "
                          "--out_dir (or --json_out)")


def _timing_config(runs):
    """The probe's TrainConfig for the timing pass, with the reward function the user passed:
    a probe's config.json may come from anyone, and its reward_fn names code to run."""
    from jaxrl_scale.experiment.config import ConfigError, TrainConfig, validate
    named = runs[0].config.get("reward_fn") or ""
    if named and FLAGS.reward_fn != named:
        raise ConfigError("reward_fn", f"the probe's config.json names reward_fn {named!r}, "
                          "which the timing pass would call; a run directory never chooses "
                          "code that runs", f"pass --reward_fn={named} if you trust that "
                          "function, or use --timings_json / --step_times_from")
    try:
        cfg = TrainConfig.from_json(runs[0].config).replace(reward_fn=FLAGS.reward_fn)
        validate(cfg)
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise ConfigError(e.field, f"{e.problem} (in the probe's config.json)", e.fix) \
                from None
        raise ConfigError("probe_run", f"its config.json is not a TrainConfig ({e})",
                          "pass a run written by jaxrl-train, or use --timings_json") from None
    G = cfg.group_size
    for b in _numbers("time_batches", FLAGS.time_batches, integer=True):
        if b % G:
            raise ConfigError("time_batches", f"{b:g} is not a multiple of the probe's "
                              f"group_size {G}", "pass batches B = P * G")
    return cfg


def _fit(runs, timing_cfg=None) -> dict:
    """The step-time fit from the one throughput source given (scaling.step_cost.fit_step_times
    on timing entries, or the roofline's fit), with "timings_source" saying which."""
    from jaxrl_scale.experiment.config import ConfigError
    from jaxrl_scale.scaling import planner
    src = _throughput_source()
    if src == "chip":
        return _roofline(runs)
    if src == "timings_json":
        try:
            with open(FLAGS.timings_json) as f:
                timings = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError("timings_json", f"cannot read {FLAGS.timings_json!r} ({e})",
                              "pass a JSON list written by a timing pass") from None
        if isinstance(timings, dict):   # a sweep's timing.json: its passes' entries
            algo = runs[0].config.get("algo")
            timings = [e for e in timings.get("entries") or []
                       if e.get("algo", algo) == algo]
        what = f"timing pass from {FLAGS.timings_json}"
    elif src == "step_times_from":
        pool, like = planner.like_probe(planner.sweep_runs(FLAGS.step_times_from), runs[0])
        timings = planner.timings_from_runs(pool, FLAGS.timing_warmup, FLAGS.timing_steps)
        steps = f"{FLAGS.timing_steps} timed" if FLAGS.timing_steps else "all"
        what = (f"step-time records of {FLAGS.step_times_from} (runs with the probe's {like}): "
                f"{steps} updates after {FLAGS.timing_warmup} warm-up, per run")
    else:
        batches = [int(b) for b in _numbers("time_batches", FLAGS.time_batches)]
        try:
            from jaxrl_scale.experiment.timing import time_batches
        except ImportError as e:
            raise ConfigError("time_batches", f"no timing pass in this checkout ({e})",
                              "pass --timings_json or --step_times_from") from None
        timings = time_batches(timing_cfg, batches,
                               warmup=FLAGS.timing_warmup, steps=FLAGS.timing_steps or 3)
        what = f"timing pass at {batches} on {runs[0].path}'s config"
    fit = step_cost.fit_step_times(timings, n_boot=FLAGS.n_boot, seed=FLAGS.seed)
    miss = step_cost.fit_misses(fit, timings) if src == "step_times_from" else []
    if miss:   # a learning sweep's first updates mix compiles, warm-up and machine load
        m = max(miss, key=lambda r: abs(r["rel_err"]))
        raise ConfigError("step_times_from", f"the step-time fit misses its own records at "
                          f"B={m['batch']:g} by {m['rel_err']:+.0%} (fitted {m['step_s_fit']:.3g}"
                          f" s per update, timed {m['step_s']:.3g} s, outside the fit's interval"
                          f"; {len(miss)} batch(es) miss)", "time the batches with "
                          "--time_batches instead (results/planner_validation/"
                          "throughput_sources.md)")
    fit["timings_source"] = what
    return fit


def _roofline(runs) -> dict:
    """The roofline's straight-line fit at the candidate batches and B0 (scaling.roofline;
    no bootstrap: no throughput interval). Response lengths: the probe's per-update means."""
    from jaxrl_scale.experiment.config import ConfigError
    from jaxrl_scale.scaling import io as sio
    try:
        from jaxrl_scale.scaling.roofline import roofline_fit
    except ImportError as e:
        raise ConfigError("chip", f"no roofline model in this checkout ({e})",
                          "pass --timings_json, --time_batches or --step_times_from") from None
    from jaxrl_scale.models import get_config
    name = FLAGS.model or sio.config_get(runs[0].config, "model")
    if not name:
        raise ConfigError("model", "no model preset given and the probe's config has none",
                          "pass --model=PRESET")
    try:
        cfg = get_config(name)
    except (KeyError, ValueError) as e:
        raise ConfigError("model", f"unknown preset {name!r} ({e})", "pass a preset of "
                          "jaxrl_scale.models") from None
    if not FLAGS.prompt_len:
        raise ConfigError("prompt_len", "the roofline needs the prompt length",
                          "pass --prompt_len=TOKENS")
    lens = [max(1, round(r["response_len"])) for r in runs[0].train
            if isinstance(r.get("response_len"), (int, float))]
    if not lens:
        raise ConfigError("probe_run", "no training record carries response_len",
                          "pass a probe run logged by jaxrl-train")
    b0 = runs[0].batch
    batches = sorted(set(_numbers("batches", FLAGS.batches)) | {b0, 2 * b0})
    try:
        fit = dict(roofline_fit(cfg, FLAGS.chip, [int(b) for b in batches], FLAGS.prompt_len,
                                lens))
    except (KeyError, ValueError) as e:
        raise ConfigError("chip", f"roofline for {FLAGS.chip!r} failed ({e})",
                          "pass a chip of jaxrl_scale.bench.CHIPS, e.g. --chip=H100") from None
    fit["source"] = "jaxrl_scale.scaling.roofline.roofline_fit"
    fit["timings_source"] = f"roofline spec ({FLAGS.chip}, model {name})"
    return fit


def _print(result: dict) -> None:
    print(f"reference batch B0 = {result['reference_batch']:g}; {result['noise_of']} B_simple "
          f"(N* window) = {_ci(result['B_simple'], result['B_simple_ci'])}")
    print("| B | r_N | r_q | T/T0 | in range |\n|---|---|---|---|---|")
    for p in result["predictions"]:
        print(f"| {p['batch']:g} | {_ci(p['r_N'], p['r_N_ci'])} | {_ci(p['r_q'], p['r_q_ci'])} "
              f"| {_ci(p['T_over_T0'], p['T_over_T0_ci'])} | {'yes' if p['in_range'] else ''} |")
    th = result["throughput"]
    print(f"step-time fit ({th['source']}; {th.get('timings_source', '')}): t_gen = "
          f"{th['d0']:.4g} + {th['d1']:.4g} B_gen s, t_train = {th['overhead']:.4g} + "
          f"{th['gamma']:.4g} B s")
    if th.get("reward_d1") is not None:
        b0 = result["reference_batch"]
        share = (th["reward_d0"] + th["reward_d1"] * b0) / (th["d0"] + th["d1"] * b0)
        print(f"  of t_gen, the reward function (measured reward_s): {th['reward_d0']:.4g} + "
              f"{th['reward_d1']:.4g} B_gen s, "
              + (f"{share:.0%} of the rollout at B0" if share >= 0.01 else
                 "under 1% of the rollout at B0"))
    if th.get("external_d1") is not None:
        b0 = result["reference_batch"]
        share = (th["external_d0"] + th["external_d1"] * b0) / (th["d0"] + th["d1"] * b0)
        print(f"  of t_gen, the environment and the reward (measured env_s + reward_s): "
              f"{th['external_d0']:.4g} + {th['external_d1']:.4g} B_gen s, {share:.0%} of the "
              "rollout at B0")
    if th.get("check"):
        print("  fitted vs timed seconds per update: " + ", ".join(
            f"B={c['batch']:g} {c['rel_err']:+.1%}" for c in th["check"]))
    rec = result["recommended"]
    print(f"recommended B = {rec['batch']:g}, range [{rec['range'][0]:g}, {rec['range'][1]:g}]")
    print(plan_compare.separation_text(rec))
    sc = result.get("schedule")
    if sc:
        print(f"schedule {FLAGS.schedule_steps}: predicted T/T0 = "
              f"{_ci(sc['T_over_T0'], sc['T_over_T0_ci'])}, N* = "
              f"{_ci(sc['N_star'], sc['N_star_ci'])} responses (B0's N* "
              f"{sc['n_star_reference']:g})")
    cs = result.get("critic_schedule")
    if cs:
        print(f"critic (its own noise scale): recommended batch per update {cs['critic_batch']:g}"
              f" -> at B = {cs['at_batch']:g} use --critic_minibatches={cs['critic_minibatches']}"
              f" ({cs['critic_batch_per_update']:g} responses per critic update)")


def _ci(v, ci) -> str:
    return fmt_ci(v, ci) if v is not None else "-"


def main(argv):
    del argv
    quiet_logging()
    from jaxrl_scale.scaling.io import DataError
    with one_line_errors():
        try:
            _plan()
        except DataError as e:    # a probe's (or a sweep's) records are nonsense: bad input
            print(f"error: {e}", file=sys.stderr, flush=True)
            sys.exit(2)
    return 0


def _plan() -> None:
    from jaxrl_scale.experiment.config import ConfigError
    from jaxrl_scale.scaling import planner
    from jaxrl_scale.scaling.planner_link import IDENTITY
    try:
        check_flags()
        runs = planner.read_runs(FLAGS.probe_run)
        # what the probe must carry, before the throughput source (a timing pass takes minutes)
        planner.check_probe(runs, who=FLAGS.noise_of, n_star=FLAGS.n_star, target=FLAGS.target)
        timing_cfg = _timing_config(runs) if FLAGS.time_batches else None
        fit = _fit(runs, timing_cfg)
        result = planner.batch_plan(
            runs, fit, _numbers("batches", FLAGS.batches) or None, who=FLAGS.noise_of,
            n_star=FLAGS.n_star, target=FLAGS.target, half_width=FLAGS.window,
            gen_batch_ratio=FLAGS.gen_batch_ratio, n_boot=FLAGS.n_boot,
            block=FLAGS.block or None, n_windows=FLAGS.n_windows, level=FLAGS.ci_level,
            seed=FLAGS.seed, link=None if FLAGS.b_crit_link == "fitted" else IDENTITY,
            external=step_cost.ExternalTime(FLAGS.external_s, FLAGS.external_batch,
                                            FLAGS.external_concurrency)
            if FLAGS.external_s > 0 else None)
        segs = _schedule_segments()
        if segs is not None:
            from jaxrl_scale.scaling.schedule_plan import schedule_plan
            result["schedule"] = schedule_plan(
                runs, fit, segs, who=FLAGS.noise_of, n_star=FLAGS.n_star, target=FLAGS.target,
                half_width=FLAGS.window, gen_batch_ratio=FLAGS.gen_batch_ratio,
                n_boot=FLAGS.n_boot, block=FLAGS.block or None, n_windows=FLAGS.n_windows,
                level=FLAGS.ci_level, seed=FLAGS.seed,
                link=None if FLAGS.b_crit_link == "fitted" else IDENTITY,
                external=step_cost.ExternalTime(FLAGS.external_s, FLAGS.external_batch,
                                                FLAGS.external_concurrency)
                if FLAGS.external_s > 0 else None)
        summary = None
        if FLAGS.compare:
            try:
                with open(FLAGS.compare) as f:
                    summary = json.load(f)
            except (OSError, json.JSONDecodeError) as e:
                raise ConfigError("compare", f"cannot read {FLAGS.compare!r} ({e})",
                                  "pass the summary.json experiments/analyze.py wrote") from None
            if not isinstance(summary, dict) or "configs" not in summary:
                raise ConfigError("compare", f"{FLAGS.compare!r} has no \"configs\"",
                                  "pass the summary.json experiments/analyze.py wrote")
    except planner.PlanError as e:
        raise ConfigError(e.field, e.problem, e.fix) from None

    json_out = FLAGS.json_out or os.path.join(FLAGS.out_dir, "plan.json")
    out_dir = os.path.dirname(json_out) or "."
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.splitext(json_out)[0]
    if fit.get("timings"):
        write_json(os.path.join(out_dir, "timings.json"), to_jsonable(fit["timings"]), indent=1)
    rows = None
    if summary is not None:
        comp = {net: planner.compare(result, summary, network=net)
                for net in result["by_network"]}
        rows = comp[result["noise_of"]]
        g = result["group_size"]
        counts = {net: planner.compare_counts(r) for net, r in comp.items()}
        counts_g = {net: planner.compare_counts(r, g) for net, r in comp.items()}
        checks = {net: planner.recommendation_check(
            dict(result, recommended=result["by_network"][net]["recommended"]), summary, r)
            for net, r in comp.items()}
        write_json(os.path.join(out_dir, "compare.json"), to_jsonable({
            "summary": FLAGS.compare, "plan": json_out, "rows": comp, "counts": counts,
            "counts_same_group_size": counts_g, "recommendation": checks}), indent=1)
        md = [f"# Planner predictions vs {FLAGS.compare}\n",
              "✓: measured point inside the predicted interval; ~: only the intervals "
              "overlap; x: disjoint. Intervals at "
              f"{result['ci_level']:.0%}.\n"]
        for net, r in comp.items():
            bs = result["by_network"][net]
            ck = checks[net]
            md += [f"## B_crit = {net} B_simple = {_ci(bs['B_simple'], bs['B_simple_ci'])}\n",
                   planner.format_compare(r), ""]
            for label, cs in (("all non-reference configs", counts[net]),
                              (f"G = {g} only", counts_g[net])):
                md.append(f"- {label}: " + "; ".join(
                    f"{m} {c['inside']}/{c['n']} inside, {c['overlap']}/{c['n']} overlap, "
                    f"median |log(pred/meas)| {_ci(c['median_abs_log_error'], None)}"
                    for m, c in cs.items()))
            md += [f"- recommended B = {ck['recommended']:g} (range {ck['range'][0]:g}.."
                   f"{ck['range'][1]:g}); measured fastest (G = {g}): "
                   f"{ck['measured_fastest']} (B = {_ci(ck['measured_fastest_batch'], None)}); "
                   f"sweep's best set at G = {g}: B = {ck['measured_best_set_batches']}", ""]
        with open(os.path.join(out_dir, "compare.md"), "w") as f:
            f.write("\n".join(md) + "\n")
    write_json(json_out, to_jsonable(result), indent=1)
    png = planner.plot_plan(result, stem + ".png", rows)
    _print(result)
    for w in result["warnings"]:
        print(f"warning: {w}")
    if rows is not None:
        print(planner.format_compare(rows))
    print(f"wrote {json_out} and {png}" + (f", {out_dir}/compare.md" if rows is not None else ""))


def run():
    """Console-script entry point."""
    run_main(main, __name__)


if __name__ == "__main__":
    run()
