"""Sampling rules on logits and KV-cache generation (prefill + while_loop)."""
from jaxrl_scale.sampling.decode import (
    DecodeState, GenerateOutput, bucket_shape, clear_cache, compile_count, generate)
from jaxrl_scale.sampling.rules import (
    SamplingConfig, apply_temperature, masked_logits, sample_next, top_k_mask, top_p_mask,
    validate_sampling)

__all__ = [
    "DecodeState", "GenerateOutput", "SamplingConfig", "apply_temperature", "bucket_shape",
    "clear_cache", "compile_count", "generate", "masked_logits", "sample_next", "top_k_mask",
    "top_p_mask", "validate_sampling",
]
