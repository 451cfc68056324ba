"""RL core: advantages and losses (`rl.losses`), the rollout as a value and the loop's counters
(`rl.rollout`), the rollout batch (`rl.batch`), the steps' static options (`rl.config`), train state
(`rl.state`), the critic's value head (`rl.value`) and the sharded, micro-batched GRPO / PPO
update steps (`rl.steps`)."""
import importlib

from jaxrl_scale.rl import losses as _losses

# name -> submodule; loaded on first use (PEP 562), so importing one submodule (e.g.
# rl.config from experiment/config.py) does not import the others (rl.steps).
_WHERE = {
    **{name: "losses" for name in _losses.__all__},
    **{name: "batch" for name in ("RolloutBatch", "pack_sequences", "rollout_batch")},
    **{name: "state" for name in ("TrainState", "create_train_state", "init_train_state",
                                  "shard_train_state", "state_shardings")},
    **{name: "config" for name in ("LossConfig", "StepOptions")},
    **{name: "rollout" for name in ("LoopState", "Rollout")},
    **{name: "steps" for name in ("final_token_rewards", "grpo_step", "make_train_step",
                                  "ppo_advantages", "ppo_step", "score_tokens",
                                  "token_weights")},
    **{name: "value" for name in ("critic_values", "init_critic_from_actor",
                                  "init_value_head")},
}
_SUBMODULES = ("batch", "config", "losses", "partial", "rollout", "state", "steps", "value")


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ADVANTAGE_ESTIMATORS", "AGG_MODES", "KL_KINDS",
    "group_advantages", "gae", "masked_whiten", "aggregate", "kl_penalty", "policy_loss",
    "value_loss", "entropy_from_logits", "token_logprobs",
    "TrainState", "create_train_state", "init_train_state", "shard_train_state",
    "state_shardings",
    "RolloutBatch", "pack_sequences", "rollout_batch",
    "LossConfig", "StepOptions", "Rollout", "LoopState", "token_weights", "grpo_step",
    "score_tokens", "final_token_rewards", "ppo_advantages", "ppo_step", "make_train_step",
    "critic_values", "init_critic_from_actor", "init_value_head",
]
