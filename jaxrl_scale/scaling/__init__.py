"""Scaling analysis: time-to-target, throughput model, gradient noise scale (numpy only).

Reads ``metrics.jsonl`` / ``config.json`` run directories (or CSVs from other frameworks) and
computes N*, q, r_N, r_q, T/T0 (docs/science.md, Time to target), the two critical batches
(docs/science.md, Critical batches) and the McCandlish noise scale (docs/science.md,
Gradient noise scale).
"""

from jaxrl_scale.scaling.analysis import (
    VERDICTS,
    AnalysisError,
    analyze,
    analyze_runs,
    analyze_sweep,
    auto_target,
    default_reference,
    default_references,
    eval_noise,
    resolve_reference,
    resolve_references,
    to_jsonable,
    write_summary,
)
from jaxrl_scale.scaling.findings import Finding
from jaxrl_scale.scaling.io import (
    Run,
    Sweep,
    group_runs,
    make_run,
    parse_columns,
    read_csv_run,
    read_run,
    read_sweep,
    strip_seed,
)
from jaxrl_scale.scaling.noise import (
    NoiseScaleEMA,
    b_simple,
    flattening_batch,
    loglog_slope,
    noise_scale_from_records,
    noise_scale_from_run,
    predicted_r_n,
    two_batch_estimates,
)
from jaxrl_scale.scaling.stats import (
    CI_LEVEL,
    binomial_se,
    bootstrap_crossing,
    isotonic,
    noise_from_curve,
    quantile_ci,
)
from jaxrl_scale.scaling.step_cost import fit_linear_time, fit_step_times, predict_r_q, r_q
from jaxrl_scale.scaling.records import (CriticalGenerationBatch, CriticalTrainingBatch, Drift,
                                         Power, Regime)
from jaxrl_scale.scaling.summary import AlgoSummary, ConfigStats, RunStats, Summary
from jaxrl_scale.scaling.values import ConfigRatios, FamilyTest, Ratio
from jaxrl_scale.scaling.throughput import (
    critical_generation_batch,
    step_costs,
    throughput_gains,
)
from jaxrl_scale.scaling.time_to_target import (
    fit_sigmoid,
    n_star,
    sigmoid_curve,
    throughput,
    time_at,
    time_ratio,
)
