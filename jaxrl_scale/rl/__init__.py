"""RL core: advantages and losses (`rl.losses`), the rollout as a value and the loop's counters
(`rl.rollout`), the rollout batch (`rl.batch`), the steps' static options (`rl.config`), train state
(`rl.state`), the critic's value head (`rl.value`) and the sharded, micro-batched GRPO / PPO
update steps (`rl.steps`)."""
from jaxrl_scale.rl.batch import RolloutBatch, pack_sequences, rollout_batch  # noqa: F401
from jaxrl_scale.rl.losses import *  # noqa: F401,F403
from jaxrl_scale.rl.state import (  # noqa: F401
    TrainState,
    create_train_state,
    init_train_state,
    shard_train_state,
    state_shardings,
)
from jaxrl_scale.rl.config import LossConfig, StepOptions  # noqa: F401
from jaxrl_scale.rl.rollout import LoopState, Rollout  # noqa: F401
from jaxrl_scale.rl.steps import (  # noqa: F401
    final_token_rewards,
    grpo_step,
    make_train_step,
    ppo_advantages,
    ppo_step,
    score_tokens,
    token_weights,
)
from jaxrl_scale.rl.value import (  # noqa: F401
    critic_values,
    init_critic_from_actor,
    init_value_head,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS", "AGG_MODES", "KL_KINDS",
    "group_advantages", "gae", "masked_whiten", "aggregate", "kl_penalty", "policy_loss",
    "value_loss", "entropy_from_logits", "token_logprobs",
    "TrainState", "create_train_state", "init_train_state", "shard_train_state",
    "state_shardings",
    "RolloutBatch", "pack_sequences", "rollout_batch",
    "LossConfig", "StepOptions", "Rollout", "LoopState", "token_weights", "grpo_step", "score_tokens", "final_token_rewards",
    "ppo_advantages", "ppo_step", "make_train_step",
    "critic_values", "init_critic_from_actor", "init_value_head",
]
