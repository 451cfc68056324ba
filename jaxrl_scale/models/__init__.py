"""Decoder models, HF checkpoint I/O and tokenizers."""
from jaxrl_scale.models.config import ModelConfig, PRESETS, get_config
from jaxrl_scale.models.decoder import (
    KVCache, Params, extend, forward, forward_with_aux, hidden_states, init_cache, init_params,
    logits_from_hidden, param_shapes, positions_from_valid)

from jaxrl_scale.models.hf import check_hf, load_hf, save_hf
from jaxrl_scale.models.hf_config import HFCheckpointError, config_from_hf, config_to_hf
from jaxrl_scale.models.moe import load_balancing_loss
from jaxrl_scale.models.tokenizer import CharTokenizer, HFTokenizer, Tokenizer, load_tokenizer
