"""Public loss and advantage functions; the implementations live in `jaxrl_scale.rl.losses`."""
from jaxrl_scale.rl.losses import (  # noqa: F401
    ADVANTAGE_ESTIMATORS,
    AGG_MODES,
    KL_KINDS,
    aggregate,
    entropy_from_logits,
    gae,
    group_advantages,
    kl_penalty,
    masked_whiten,
    policy_loss,
    token_logprobs,
    value_loss,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS", "AGG_MODES", "KL_KINDS",
    "group_advantages", "gae", "masked_whiten", "aggregate", "kl_penalty", "policy_loss",
    "value_loss", "entropy_from_logits", "token_logprobs",
]
