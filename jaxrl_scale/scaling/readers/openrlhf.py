"""OpenRLHF runs (``openrlhf.cli.train_ppo_ray``: PPO, GRPO, REINFORCE++, RLOO): the
TensorBoard event files of its ``TensorboardLogger``.

Layout followed: OpenRLHF ``openrlhf/utils/logging_utils.py`` (``TensorboardLogger``:
``SummaryWriter(os.path.join(args.logger.tensorboard_dir, args.logger.wandb.run_name))``,
``log_train``: ``add_scalar(f"train/{k}", v, global_step)``, ``log_eval``:
``add_scalar(f"eval/{k}", v, global_step)``) and ``openrlhf/trainer/ppo_trainer.py``
(commit 3c3be62, 2026-08): per step ``rollout/num_samples`` (the responses trained on,
``BasePPOTrainer._compute_rollout_stats``), ``timing/generation``, ``timing/make_experience``,
``timing/ppo_train``, ``timing/broadcast`` and ``timing/step_total`` (their sum;
``ppo_trainer_async.py``: the step's wall time, eval excluded); per eval
(``compute_eval_metrics``) ``eval_<datasource>_pass1``, ``eval_<datasource>_pass<n>`` and
``eval_num_samples`` (the eval responses of all data sources). The metrics reach W&B too
(``WandbLogger``: the same names under ``train/`` and ``eval/``, steps in
``train/global_step`` / ``eval/global_step``); a W&B history export of a run is read by
`wandb` with the same names. With ``--logger.tensorboard_dir=DIR`` every run is a
subdirectory ``DIR/<run_name>``: pass ``--sweep_dir=DIR``.

Responses: the cumulative sum of ``train/rollout/num_samples`` (no config needed; without it,
``--responses_per_step`` = rollout.batch_size x rollout.n_samples_per_prompt). Wall time:
cumulative ``train/timing/step_total``; generation and update time per step from
``train/timing/generation`` and ``train/timing/ppo_train``. The eval score is the first
``eval/eval_<datasource>_pass1`` (sorted) or ``--score_key``; its sample count is
``eval/eval_num_samples`` when the run evaluates one data source.
"""

from __future__ import annotations

import os

from jaxrl_scale.scaling import io as sio
from jaxrl_scale.scaling.readers import mapped, tensorboard

TB_MAP = {"time": "train/timing/step_total", "samples": "train/rollout/num_samples",
          "gen": "train/timing/generation", "train": "train/timing/ppo_train",
          "eval_n": "eval/eval_num_samples"}
# W&B: WandbLogger logs train and eval separately, each with its own global_step column.
WANDB_MAP = dict(TB_MAP, step="train/global_step", eval_step="eval/global_step")
SCORE_RE = r"^eval/eval_.+_pass1$"
SCORE_DESC = "eval/eval_<datasource>_pass1"
MARKERS = ("train/timing/step_total", "train/rollout/num_samples")


def is_tags(tags: set[str]) -> bool:
    """Tags (or W&B columns) that only OpenRLHF's PPO trainer logs."""
    return any(t in tags for t in MARKERS) or any(
        t.startswith("eval/eval_") and t.endswith("_pass1") for t in tags)


def preset(keys: set[str], wandb: bool = False) -> tuple[dict, list[str]]:
    """The tag map for a run with these tags, and what it lacks: eval_num_samples counts all
    data sources' eval responses, so it is the score's sample count only with one source."""
    tmap = dict(WANDB_MAP if wandb else TB_MAP)
    passes = sorted(k for k in keys if k.startswith("eval/eval_") and k.endswith("_pass1"))
    if len(passes) > 1:
        del tmap["eval_n"]
        return tmap, [f"{len(passes)} eval data sources: eval_num_samples counts them all, so "
                      "the eval sample count of the score is not known"]
    return tmap, []


def read_run(run_dir: str, name: str | None = None, **overrides) -> sio.Run:
    """One OpenRLHF run directory (its event files, anywhere under it)."""
    name = name or os.path.basename(os.path.normpath(run_dir))
    records, src, cut = tensorboard.read_event_records(run_dir)
    rows = [(r["step"], {k: v for k, v in r.items() if k != "step"}) for r in records]
    keys = {k for _, r in rows for k in r}
    tmap, warnings = preset(keys)
    tmap = mapped.present_only(tmap, keys)
    tmap.update(mapped.parse_tag_map(overrides.get("tag_map")))
    with tensorboard.cut_noted(cut):
        return mapped.run_from_rows(name, run_dir, "openrlhf", rows, tmap, source=src,
                                    overrides=overrides, step_is_update=True,
                                    score_pattern=SCORE_RE, score_desc=SCORE_DESC,
                                    warnings=cut + warnings)
