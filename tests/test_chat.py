"""Chat templates (models/chat.py): the ids `render` gives equal transformers'
`apply_chat_template(..., tokenize=True)` for Qwen2.5-, Qwen3- and Llama-3-style templates
(tests/data/*_chat_template.jinja, each under a tiny tokenizer built here), runs put their
prompts through the template the same way in the RL loop and in the SFT warm-start, and a
template that cannot serve is refused with one line naming --chat_template."""
import json
import os

import pytest

from jaxrl_scale.models.chat import (ChatTemplateError, load_chat_template, read_template,
                                     render, render_text)
from jaxrl_scale.models.tokenizer import CharTokenizer, load_tokenizer

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
QWEN25 = os.path.join(DATA, "qwen2_5_chat_template.jinja")
QWEN3 = os.path.join(DATA, "qwen3_chat_template.jinja")
LLAMA3 = os.path.join(DATA, "llama3_chat_template.jinja")
BROKEN = os.path.join(DATA, "broken_chat_template.jinja")

SPECIALS = ["<pad>", "<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
            "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
# Each family's tokenizer_config.json special tokens; Llama's tokenizer also adds its BOS in
# the post-processor, which the template's own BOS must not double.
FAMILIES = {
    "qwen2.5": (QWEN25, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, False),
    "qwen3": (QWEN3, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, False),
    "llama3": (LLAMA3, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, True),
}

SINGLE = [{"role": "user", "content": "What is 23+58?"}]
MULTI = [{"role": "user", "content": "What is 23+58?"},
         {"role": "assistant", "content": "81"},
         {"role": "user", "content": "And 7 times 6?"}]
SYSTEM = [{"role": "system", "content": "You are a careful calculator."},
          {"role": "user", "content": "What is 23+58?"},
          {"role": "assistant", "content": "It is 81."},
          {"role": "user", "content": "nums 3 5 7 target 22:"}]
CONVERSATIONS = {"single": SINGLE, "multi": MULTI, "system": SYSTEM}


def build_tokenizer(d, template_file=None, config=None, bos_post_processor=False):
    """A byte-level BPE tokenizer.json with the chat special tokens, and a
    tokenizer_config.json holding `config` and (when given) the template's text."""
    from tokenizers import Tokenizer as HFTok
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tk = HFTok(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ["system user assistant", "What is 23+58? It is 81.", "You are a helpful "
              "assistant.", "nums 3 5 7 target 22:", "Cutting Knowledge Date: Today"] * 5
    tk.train_from_iterator(corpus, trainer=trainer)
    if bos_post_processor:
        bos = tk.token_to_id("<|begin_of_text|>")
        tk.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
            special_tokens=[("<|begin_of_text|>", bos)])
    os.makedirs(d, exist_ok=True)
    tk.save(os.path.join(d, "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", **(config or {})}
    if template_file:
        with open(template_file, encoding="utf-8") as f:
            cfg["chat_template"] = f.read()
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)
    return str(d)


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    return {name: build_tokenizer(root / name, path, cfg, bos)
            for name, (path, cfg, bos) in FAMILIES.items()}


def _hf(d):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(d)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_render_matches_transformers(family_dirs, family, conversation, generation_prompt):
    d, messages = family_dirs[family], CONVERSATIONS[conversation]
    hf = _hf(d)
    want = hf.apply_chat_template(messages, tokenize=True, return_dict=False,
                                  add_generation_prompt=generation_prompt)
    got = render(messages, d, add_generation_prompt=generation_prompt)
    assert got == list(want)
    text = render_text(messages, d, add_generation_prompt=generation_prompt)
    assert text == hf.apply_chat_template(messages, tokenize=False,
                                          add_generation_prompt=generation_prompt)
    header = "<|im_start|>assistant\n" if family.startswith("qwen") else \
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert text.endswith(header) == generation_prompt
    if family == "llama3":   # one BOS: the template's (the tokenizer's own is not added)
        assert got.count(load_tokenizer(d).bos_id) == 1 and got[0] == load_tokenizer(d).bos_id


def test_template_arguments_reach_the_template(family_dirs):
    """Tools, and keyword arguments such as Qwen3's enable_thinking, as transformers passes
    them."""
    tools = [{"type": "function", "function": {"name": "add", "description": "Add two numbers",
              "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                              "b": {"type": "number"}}}}}]
    for family in ("qwen2.5", "qwen3", "llama3"):
        d = family_dirs[family]
        hf = _hf(d)
        want = hf.apply_chat_template(SINGLE, tools=tools, tokenize=True, return_dict=False,
                                      add_generation_prompt=True)
        assert render(SINGLE, d, tools=tools) == list(want), family
    d = family_dirs["qwen3"]
    want = _hf(d).apply_chat_template(SINGLE, tokenize=True, return_dict=False,
                                      add_generation_prompt=True, enable_thinking=False)
    got = render(SINGLE, d, enable_thinking=False)
    assert got == list(want) and "<think>\n\n</think>" in render_text(SINGLE, d,
                                                                         enable_thinking=False)


def test_where_auto_finds_the_template(tmp_path):
    d = build_tokenizer(tmp_path / "plain", config={"eos_token": "<|im_end|>"})
    with pytest.raises(ChatTemplateError, match="no chat_template"):
        read_template("auto", d)
    with pytest.raises(ChatTemplateError, match="character tokenizer has none"):
        read_template("auto", "char")
    assert read_template("none", d) is None
    # a named list: the "default" one; a chat_template.jinja beside it wins
    cfg = json.load(open(os.path.join(d, "tokenizer_config.json")))
    cfg["chat_template"] = [{"name": "tool_use", "template": "T"},
                            {"name": "default", "template": "D"}]
    json.dump(cfg, open(os.path.join(d, "tokenizer_config.json"), "w"))
    assert read_template("auto", d) == "D"
    assert read_template("auto", os.path.join(d, "tokenizer.json")) == "D"
    (tmp_path / "plain" / "chat_template.jinja").write_text("J")
    assert read_template("auto", d) == "J"
    assert read_template(QWEN25).startswith("{#- Test fixture")


def test_a_template_that_cannot_serve_is_refused(tmp_path):
    with pytest.raises(ChatTemplateError, match="needs a system message first"):
        load_chat_template(BROKEN, "char")
    bad = tmp_path / "syntax.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }}")
    with pytest.raises(ChatTemplateError, match="does not parse"):
        load_chat_template(str(bad), "char")
    with pytest.raises(ChatTemplateError, match="neither auto, none nor a template file"):
        load_chat_template(str(tmp_path / "missing.jinja"), "char")
    assert load_chat_template("none", "char") is None


def test_run_config_check_names_the_flag(tmp_path, family_dirs):
    from jaxrl_scale.experiment.config import ConfigError, TrainConfig, validate
    for value in ("auto", BROKEN, str(tmp_path / "missing.jinja")):
        with pytest.raises(ConfigError, match="^chat_template: .*Fix: "):
            validate(TrainConfig.make(chat_template=value))
    validate(TrainConfig.make(chat_template=QWEN25))            # renders, and encodes as chars
    validate(TrainConfig.make(chat_template="auto", tokenizer=family_dirs["qwen3"]))
    assert TrainConfig().chat_template == "none"                # today's prompts by default
    cfg = TrainConfig.make(chat_template=QWEN25)
    assert TrainConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg


def test_prompts_go_through_the_template(family_dirs):
    """A run's prompt ids are the template's one-user-turn conversation with the generation
    prompt: the same ids as `render` under an HF tokenizer; under the character tokenizer, the
    characters of the rendered text."""
    from jaxrl_scale.experiment.checks import check_chat_template
    d = family_dirs["llama3"]
    tok = load_tokenizer(d)
    bare = tok.encode_prompt("23+58=")
    assert bare == tok.encode("23+58=")                         # no template: unchanged
    tok.chat_template = check_chat_template("auto", d)
    msgs = [{"role": "user", "content": "23+58="}]
    assert tok.encode_prompt("23+58=") == render(msgs, d) == list(
        _hf(d).apply_chat_template(msgs, tokenize=True, return_dict=False,
                                   add_generation_prompt=True))
    char = CharTokenizer()
    char.chat_template = check_chat_template(QWEN25, "char")
    ids = char.encode_prompt("23+58=")
    assert char.decode(ids) == render_text(msgs, None, template=read_template(QWEN25))
    assert char.decode(ids).endswith("<|im_start|>user\n23+58=<|im_end|>\n"
                                     "<|im_start|>assistant\n")


def test_sft_warm_start_sees_the_rl_runs_templated_prompts(tmp_path, monkeypatch):
    """The warm-start of a run with a template trains on and evaluates the same templated
    prompts the RL run samples from, and is cached apart from the bare-prompt one (whose
    cache key stays what it was before templates existed)."""
    import dataclasses
    import hashlib

    import numpy as np

    from jaxrl_scale.experiment import sft
    from jaxrl_scale.experiment.batching import pack_texts
    from jaxrl_scale.experiment.config import ConfigError, TrainConfig

    rl = TrainConfig.make(chat_template=QWEN25)
    cfg = sft.sft_config_for(rl)
    assert cfg.chat_template == QWEN25
    plain = sft.sft_config_for(TrainConfig())
    d = dataclasses.asdict(plain)
    d.pop("cache_dir"), d.pop("chat_template"), d.pop("tool_demos")   # default: not keyed
    assert plain.key() == hashlib.sha256(json.dumps(d, sort_keys=True).encode()
                                         ).hexdigest()[:16]
    assert cfg.key() != plain.key()
    copy = tmp_path / "same.jinja"                              # keyed by text, not by path
    copy.write_text(open(QWEN25).read())
    assert dataclasses.replace(cfg, chat_template=str(copy)).key() == cfg.key()
    # an HF tokenizer's template is not the character warm-start's to render
    assert sft.sft_config_for(TrainConfig.make(tokenizer=str(tmp_path))).chat_template == "none"
    with pytest.raises(ConfigError, match="^chat_template: "):
        sft.validate_sft(dataclasses.replace(cfg, chat_template="auto"))
    with pytest.raises(ConfigError, match="^chat_template: "):
        sft.validate_sft(dataclasses.replace(cfg, chat_template=BROKEN))

    # training batches and greedy evaluation both encode prompts through the template
    from jaxrl_scale.experiment.checks import check_chat_template
    tok = CharTokenizer()
    tok.chat_template = check_chat_template(QWEN25, "char")
    want = tok.encode_prompt("23+58=")
    assert len(want) > 40 and want != tok.encode("23+58=")
    batch = pack_texts(tok, ["23+58="], ["81"], prompt_len=len(want), max_new_tokens=4)
    assert list(np.asarray(batch["tokens_BT"])[0, :len(want)]) == want
    seen = []

    def fake_generate(model_cfg, params, prompts, **kw):
        seen.extend(prompts)
        raise StopIteration

    monkeypatch.setattr("jaxrl_scale.sampling.generate", fake_generate)
    with pytest.raises(StopIteration):
        sft.greedy_accuracy(None, None, tok, [{"prompt": "23+58=", "answer": "81"}], None,
                            max_new_tokens=4)
    assert seen == [want]


def test_a_run_trains_on_templated_prompts(tmp_path):
    """load_inputs gives the run a tokenizer whose prompts go through the template (and sizes
    --max_prompt_len by them); a short run trains on them and records the flag."""
    from jaxrl_scale.experiment.config import TrainConfig
    from jaxrl_scale.experiment.inputs import load_inputs
    from jaxrl_scale.experiment.train import run_training

    short = tmp_path / "short.jinja"
    short.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                     "{% if add_generation_prompt %}<assistant>{% endif %}")
    base = dict(data_dir=str(tmp_path / "data"), model="tiny", num_train_examples=64,
                num_test_examples=16, prompts_per_step=4, group_size=4, max_new_tokens=4,
                eval_every=1, eval_prompts=8, eval_samples=2, max_steps=1,
                checkpoint_every=1, base_batch=16, tensorboard=False)
    bare = load_inputs(TrainConfig.make(run_dir=str(tmp_path / "bare"), **base))
    cfg = TrainConfig.make(run_dir=str(tmp_path / "run"), chat_template=str(short), **base)
    inputs = load_inputs(cfg)
    assert inputs.prompt_len == bare.prompt_len + len("<user><assistant>")
    prompt = inputs.train_src[0]["prompt"]
    assert inputs.tok.decode(inputs.tok.encode_prompt(prompt)) == f"<user>{prompt}<assistant>"
    assert bare.tok.encode_prompt(prompt) == bare.tok.encode(prompt)
    out = run_training(cfg, progress=False)
    assert out["step"] == 1
    with open(tmp_path / "run" / "config.json") as f:
        assert json.load(f)["chat_template"] == str(short)


def test_sft_warm_start_trains_on_templated_prompts(tmp_path, monkeypatch):
    """The warm-start itself, end to end: its batches' prompts are the template's, and its
    cache entry is its own."""
    from jaxrl_scale.experiment import sft

    short = tmp_path / "short.jinja"
    short.write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    base = dict(model="tiny", num_train_examples=64, num_test_examples=16, batch_size=8,
                max_steps=2, eval_every=1, eval_prompts=8, target_accuracy=1.0,
                data_dir=str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"))
    packed, real = [], sft.pack_texts

    def spy(tok, prompts, *a, **kw):
        packed.append([tok.decode(tok.encode_prompt(p)) for p in prompts[:1]] + prompts[:1])
        return real(tok, prompts, *a, **kw)

    monkeypatch.setattr(sft, "pack_texts", spy)
    path, info = sft.sft_warmstart(sft.SFTConfig(chat_template=str(short), **base),
                                   progress=False)
    assert info["steps"] == 2 and info["config"]["chat_template"] == str(short)
    assert all(text == f"[{p}]" for text, p in packed) and len(packed) == 2
    plain, _ = sft.sft_warmstart(sft.SFTConfig(**base), progress=False)
    assert plain != path
