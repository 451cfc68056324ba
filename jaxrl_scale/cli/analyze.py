r"""Analyse a sweep: N*, q, r_N, r_q, T/T0 with 90% intervals and a verdict per config,
summary.json and a report with figures.

    python experiments/analyze.py --sweep_dir=DIR [--target=0.6|auto] [--reference=CONFIG]
    python experiments/analyze.py --sweep_dir=DIR --format=verl|trl|openrlhf|prime-rl \
        [--responses_per_step=N]
    python experiments/analyze.py --sweep_dir=DIR --format=tensorboard|wandb \
        --tag_map=score=eval/acc,time=perf/step_s,samples=rollout/n
    python experiments/analyze.py --csv=run.csv \
        --columns=step:global_step,responses:samples,time_s:wall,score:val_acc --target=0.6

Writes OUT/summary.json ({"reference", "target", "runs": {...}, "best", ...}) and
OUT/report.md + PNGs; prints the table. Needs no JAX.
"""

from __future__ import annotations

import sys

from absl import flags

from jaxrl_scale.cli import one_line_errors, print_summary, run_main
from jaxrl_scale.experiment.analyze import analyze_and_report
from jaxrl_scale.scaling import io as sio
from jaxrl_scale.scaling import readers
from jaxrl_scale.scaling.analysis import AnalysisError
from jaxrl_scale.scaling.units import N_UNITS

FLAGS = flags.FLAGS
flags.DEFINE_string("sweep_dir", None, "Directory whose subdirectories are runs "
                    "(config.json + metrics.jsonl); several, comma-separated, are analysed "
                    "together (e.g. one study per warm-start: the warm-starts are the test's "
                    "blocks; --out is then required).")
flags.DEFINE_string("target", "auto", "Validation score target J*, or 'auto': the reference's "
                    "start + --target_fraction of the way to what all its seeds reach (at "
                    "least 3 eval SEs).")
flags.DEFINE_float("target_fraction", None, "Where the auto target sits between the start and "
                   "what every reference seed reaches (0..1; default: the study's, recorded in "
                   "SWEEP_DIR/sweep.json, else 0.5).")
flags.DEFINE_string("reference", None, "Reference run or config name (default, per algorithm: "
                    "the config at the sweep's base_batch, else the smallest sqrt-lr batch).")
flags.DEFINE_float("tolerance", 0.25, "Critical training batch: largest B whose r_N interval "
                   "stays below 1 + tol.")
flags.DEFINE_float("ci_level", 0.9, "Level of every interval.")
flags.DEFINE_integer("n_boot", 1000, "Bootstrap replicates.")
flags.DEFINE_bool("fit_sigmoid", False, "Also fit the ScaleRL sigmoid J(N) per run.")
flags.DEFINE_multi_string("csv", [], "CSV of an external run (repeatable); joins the sweep.")
flags.DEFINE_string("columns", None, "CSV column map ours:theirs,... e.g. "
                    "step:global_step,responses:samples,time_s:wall,score:val_acc")
flags.DEFINE_string("out", None, "Output directory (default: sweep_dir).")
flags.DEFINE_enum("format", "auto", list(readers.FORMATS), "Layout of the runs in --sweep_dir: "
                  "auto (detected from the files present), jaxrl (metrics.jsonl), trl "
                  "(trainer_state.json), verl (FileLogger JSONL + .hydra/config.yaml), "
                  "openrlhf (its TensorBoard event files), prime-rl (its metrics.jsonl), "
                  "tensorboard (any event files, through --tag_map), wandb (W&B history "
                  "exports, CSV/parquet; OpenRLHF's and verl's columns detected, others "
                  "through --tag_map).")
flags.DEFINE_float("responses_per_step", None, "Responses per optimizer step of every run, "
                   "when its log and config do not give it (TRL: per_device_train_batch_size "
                   "x gradient_accumulation_steps x world size; verl: data.train_batch_size x "
                   "actor_rollout_ref.rollout.n).")
flags.DEFINE_integer("world_size", None, "TRL: processes per run when no config beside "
                     "trainer_state.json gives it (default 1, with a warning).")
flags.DEFINE_string("score_key", None, "Eval metric to use (default: TRL eval_reward; verl "
                    "the first val-core/.../mean@N; OpenRLHF the first eval_<source>_pass1; "
                    "prime-rl the first eval/<env>/all/<agent>/avg@k).")
flags.DEFINE_string("tag_map", None, "What the tags (TensorBoard) or columns (W&B export) "
                    "mean: field=tag,... or a JSON/YAML file of {field: tag}. Fields: "
                    "score (required), time (seconds per step) or elapsed (seconds since "
                    "start; W&B default _runtime), samples (responses per step) or responses "
                    "(cumulative) or --responses_per_step; optional step, eval_step, gen, "
                    "train, eval_time, eval_n.")


flags.DEFINE_enum("n_unit", "responses", list(N_UNITS), "What the sample count N "
                  "counts: responses (cumulative retained responses, episodes for --env runs) "
                  "or tokens (their tokens in the loss, each record's response_tokens; "
                  "an episode's observation tokens excluded).")
flags.DEFINE_string("score_range", "auto", "LO,HI: the range every eval score must lie in; "
                    "'auto': [0, 1] for jaxrl runs (their score is an accuracy), any finite "
                    "score for other formats; 'any' when the score is a reward on another "
                    "scale.")


def score_range() -> tuple[float, float] | str | None:
    """--score_range as (lo, hi), "auto", or None for 'any'; ConfigError if it is none."""
    import math
    from jaxrl_scale.experiment.errors import ConfigError
    raw = FLAGS.score_range.strip().lower()
    if raw == "any":
        return None
    if raw == "auto":
        return "auto"
    try:
        lo, hi = (float(x) for x in raw.split(","))
    except ValueError:
        raise ConfigError("score_range", f"must be auto, any or LO,HI, got "
                          f"{FLAGS.score_range!r}", "pass e.g. --score_range=0,1 or "
                          "--score_range=any") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ConfigError("score_range", f"needs finite LO < HI, got {FLAGS.score_range!r}",
                          "pass e.g. --score_range=0,1 or --score_range=any")
    return lo, hi


def check_flags() -> None:
    """ConfigError (one line, exit 2) for a flag the analysis cannot use; before any data."""
    import math
    from jaxrl_scale.experiment.errors import ConfigError
    if not (math.isfinite(FLAGS.ci_level) and 0 < FLAGS.ci_level < 1):
        raise ConfigError("ci_level", f"must be in (0, 1), got {FLAGS.ci_level}",
                          "set --ci_level in (0, 1), e.g. 0.9")
    # each tail of a ci_level interval needs at least one replicate beyond its quantile
    from jaxrl_scale.scaling.stats import min_n_boot   # --n_boot=0 removed every interval
    need = min_n_boot(FLAGS.ci_level)
    if FLAGS.n_boot < need:
        raise ConfigError("n_boot", f"must be >= {need} for {FLAGS.ci_level:g} intervals, got "
                          f"{FLAGS.n_boot}", f"set --n_boot >= {need} (default 1000)")
    if FLAGS.target.strip().lower() != "auto":
        try:
            t = float(FLAGS.target)
        except ValueError:
            raise ConfigError("target", f"must be 'auto' or a number, got {FLAGS.target!r}",
                              "pass --target=auto or a score such as --target=0.6") from None
        if not math.isfinite(t) or t < 0:
            raise ConfigError("target", f"must be a finite score >= 0, got {FLAGS.target}",
                              "pass --target=auto or a score such as --target=0.6")
    f = FLAGS.target_fraction
    if f is not None and not (math.isfinite(f) and 0 < f < 1):
        raise ConfigError("target_fraction", f"must lie strictly between 0 and 1, got {f}",
                          "e.g. --target_fraction=0.75, or leave it out for the study's own")
    if not (math.isfinite(FLAGS.tolerance) and FLAGS.tolerance > 0):
        raise ConfigError("tolerance", f"must be a finite number > 0, got {FLAGS.tolerance}",
                          "set --tolerance > 0, e.g. 0.25")
    rps = FLAGS.responses_per_step
    if rps is not None and not (math.isfinite(rps) and rps > 0):
        raise ConfigError("responses_per_step", f"must be a finite number > 0, got {rps}",
                          "pass the responses per optimizer step, e.g. 64")
    score_range()
    if FLAGS.world_size is not None and FLAGS.world_size < 1:
        raise ConfigError("world_size", f"must be >= 1, got {FLAGS.world_size}",
                          "pass the number of training processes, e.g. 8")


def main(argv):
    del argv
    with one_line_errors():
        check_flags()
        if FLAGS.sweep_dir is None and not FLAGS.csv:
            from jaxrl_scale.experiment.errors import ConfigError
            raise ConfigError("sweep_dir", "no runs given", "pass --sweep_dir=DIR or --csv=FILE")
    try:
        summary = analyze_and_report(FLAGS.sweep_dir, FLAGS.target, FLAGS.reference,
                                     FLAGS.tolerance, FLAGS.fit_sigmoid, csv=FLAGS.csv,
                                     columns=FLAGS.columns, out=FLAGS.out,
                                     ci_level=FLAGS.ci_level, n_boot=FLAGS.n_boot,
                                     target_fraction=FLAGS.target_fraction,
                                     fmt=FLAGS.format, overrides=dict(
                                         responses_per_step=FLAGS.responses_per_step,
                                         world_size=FLAGS.world_size,
                                         score_key=FLAGS.score_key,
                                         tag_map=FLAGS.tag_map),
                                     score_range=score_range(), n_unit=FLAGS.n_unit)
    except readers.ReaderError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except sio.DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (AnalysisError, FileNotFoundError, ValueError) as e:
        msg = str(e).rstrip(".")
        if "Fix:" not in msg:   # one line, field first, with a Fix like every bad input
            msg = f"analysis: {msg}. Fix: correct the input this names, then rerun"
        print(f"error: {msg}.".replace("..", "."), file=sys.stderr)
        return 2
    print_summary(summary)
    return 0


def run():
    """Console-script entry point."""
    run_main(main, __name__)


if __name__ == "__main__":
    run()
