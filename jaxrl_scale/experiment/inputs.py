"""What a run reads before its weights: the tokenizer, the data splits and the model's config,
each checked against the others (`load_inputs`), so a bad input is a ConfigError naming its
flag before any weight is read or anything compiled."""
from __future__ import annotations

from typing import Any, NamedTuple

from jaxrl_scale import distributed as dist
from jaxrl_scale.data.rewards import ANSWER_IN_RESPONSE
from jaxrl_scale.experiment.checks import check_chat_template, hf_model_config
from jaxrl_scale.experiment.common import check_answer_room, load_splits, prompt_length
from jaxrl_scale.experiment.config import TrainConfig, validate
from jaxrl_scale.experiment.errors import ConfigError
from jaxrl_scale.models import get_config
from jaxrl_scale.models.tokenizer import load_tokenizer


class Inputs(NamedTuple):
    """What a run reads before its weights: the tokenizer, the data and the model's config."""
    tok: Any
    train_src: Any
    test_src: Any
    model_cfg: Any
    prompt_len: int


def load_inputs(cfg: TrainConfig, sync_name: str = "load_splits") -> Inputs:
    """The run's tokenizer, data and model config (a preset, or --hf_checkpoint's config.json
    and safetensors headers: no tensor data), with every check that needs them (the
    tokenizer file, its vocabulary against the model's, the answers against max_new_tokens,
    the prompts against max_prompt_len and the context): a ConfigError naming the field, before
    any weight is read or anything compiled. `sync_name`: the multi-process barrier around the
    data build (one name per call site: a barrier is passed once)."""
    try:
        tok = load_tokenizer(cfg.tokenizer)
    except ValueError as e:
        raise ConfigError("tokenizer", " ".join(str(e).split()).rstrip("."),
                          "point --tokenizer at the directory of the model's tokenizer.json, or "
                          "use --tokenizer=char") from None
    tok.chat_template = check_chat_template(cfg.chat_template, cfg.tokenizer)
    with dist.primary_first(sync_name):   # process 0 builds the data, then the rest read it
        train_src, test_src = load_splits(cfg.task, cfg.task_kwargs, cfg.data_dir,
                                          cfg.num_train_examples, cfg.num_test_examples)
    sources = [("train", train_src), ("test", test_src)]
    if not (cfg.reward_fn or cfg.reward_url or cfg.judge_url or cfg.reward_model) and \
            cfg.task in ANSWER_IN_RESPONSE:   # the task's own exact match
        check_answer_room(tok, sources, cfg.max_new_tokens)
    model_cfg = hf_model_config(cfg.hf_checkpoint) if cfg.hf_checkpoint else \
        get_config(cfg.model)
    if model_cfg.is_moe:
        model_cfg = model_cfg.replace(moe_dispatch=cfg.moe_dispatch)
    if tok.vocab_size > model_cfg.vocab_size:
        raise ConfigError("tokenizer", f"its vocabulary of {tok.vocab_size} ids exceeds the "
                          f"model's {model_cfg.vocab_size} logits", "use the model's own "
                          "tokenizer, or a model with a larger vocabulary")
    prompt_len = prompt_length(tok, sources, cfg.max_prompt_len, model_cfg.max_seq_len)
    validate(cfg.replace(max_prompt_len=prompt_len), model_max_seq_len=model_cfg.max_seq_len)
    return Inputs(tok, train_src, test_src, model_cfg, prompt_len)
