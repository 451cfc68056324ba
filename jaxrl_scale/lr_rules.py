"""Names of the batch-size scaling rules for Adam, free of JAX: `optim` implements them,
and the analysis (which needs no JAX) recognises them in run names."""

LR_RULES = ("fixed", "linear", "sqrt", "tuned")
ADAM_RULES = ("malladi",) + LR_RULES
