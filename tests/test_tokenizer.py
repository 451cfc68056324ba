import json

import pytest

from jaxrl_scale.models.tokenizer import (
    CHAR_VOCAB,
    CharTokenizer,
    HFTokenizer,
    Tokenizer,
    decode_response,
    load_tokenizer,
)


def test_char_round_trip_and_ids():
    tok = load_tokenizer("char")
    assert isinstance(tok, CharTokenizer) and isinstance(tok, Tokenizer)
    assert (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 1, 2)
    assert tok.vocab_size == 3 + len(CHAR_VOCAB) <= 128
    text = "nums 3 7 25 target 46:\n(25-7)*3-8 = 46? Yes! 'a' \"B\"; x/y, z."
    ids = tok.encode(text)
    assert all(3 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert tok.encode("0")[0] == 3  # digits come first, right after the specials
    with_specials = tok.encode("23+58=", add_bos=True, add_eos=True)
    assert with_specials[0] == tok.bos_id and with_specials[-1] == tok.eos_id
    padded = with_specials + [tok.pad_id] * 3
    assert tok.decode(padded) == "<bos>23+58=<eos>"
    assert tok.decode(padded, skip_special_tokens=True) == "23+58="
    assert decode_response(tok, tok.encode("81") + [tok.eos_id, tok.pad_id, 5]) == "81"


def test_char_unknown_character_is_named():
    tok = CharTokenizer()
    with pytest.raises(ValueError, match="'é'"):
        tok.encode("café")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])


def _build_hf_tokenizer(d, *, eos_in_config=True, gen_config=None):
    from tokenizers import Tokenizer as HFTok
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tk = HFTok(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<eos>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ["the cat sat on the mat", "23+58=81", "what is 7 times 6? 42", "hello world"] * 5
    tk.train_from_iterator(corpus, trainer=trainer)
    d.mkdir(parents=True, exist_ok=True)
    tk.save(str(d / "tokenizer.json"))
    cfg = {"pad_token": "<pad>"}
    if eos_in_config:
        cfg["eos_token"] = {"content": "<eos>", "special": True}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    if gen_config is not None:
        (d / "generation_config.json").write_text(json.dumps(gen_config))
    return tk


def test_hf_tokenizer_round_trip(tmp_path):
    d = tmp_path / "tok"
    raw = _build_hf_tokenizer(d)
    tok = load_tokenizer(str(d))
    assert isinstance(tok, HFTokenizer)
    assert tok.eos_id == raw.token_to_id("<eos>") and tok.pad_id == raw.token_to_id("<pad>")
    assert tok.vocab_size == raw.get_vocab_size()
    for text in ["the cat sat on the mat", "23+58=81", "unseen words: zebra 9!"]:
        ids = tok.encode(text)
        assert ids and all(0 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == text
        assert tok.decode(ids + [tok.pad_id, tok.pad_id]) == text
    ids = tok.encode("42") + [tok.eos_id, tok.pad_id]
    assert tok.decode(ids) == "42<eos>"
    assert tok.decode(ids, skip_special_tokens=True) == "42"
    assert decode_response(tok, ids) == "42"


def test_hf_tokenizer_eos_lookup_and_errors(tmp_path):
    d = tmp_path / "noeos"
    raw = _build_hf_tokenizer(d, eos_in_config=False)
    with pytest.raises(ValueError, match="no EOS token found.*eos_id"):
        HFTokenizer(str(d))
    assert HFTokenizer(str(d), eos_token="<eos>").eos_id == raw.token_to_id("<eos>")
    assert HFTokenizer(str(d), eos_id=7).eos_id == 7
    with pytest.raises(ValueError, match="not in the vocabulary"):
        HFTokenizer(str(d), eos_token="<nope>")

    d2 = tmp_path / "gen"
    raw = _build_hf_tokenizer(d2, eos_in_config=False, gen_config={"eos_token_id": [2, 1]})
    tok = HFTokenizer(str(d2))
    assert tok.eos_id == 2 and tok.eos_ids == (2, 1)

    with pytest.raises(ValueError, match="tokenizer.json"):
        HFTokenizer(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="expected 'char'"):
        load_tokenizer("no-such-tokenizer")


def _wrong_kinds(d):
    """tokenizer.json files of the wrong kind -> what the error must say."""
    good = json.loads((d / "tokenizer.json").read_text())
    return {
        "list": ("[1, 2, 3]", "it holds a JSON list, not a tokenizer object"),
        "not_json": ('{"model": {"type": "BPE", ', "not valid JSON"),
        "not_utf8": (b'{"model": "\xff"}', "not valid JSON"),
        "config_json": (json.dumps({"vocab_size": 128, "model_type": "llama"}),
                        'it has no "model" object, so it is not a Hugging Face tokenizers '
                        "file"),
        "model_type": (json.dumps(dict(good, model=dict(good["model"], type="SentencePiece"))),
                       "its model type 'SentencePiece' is none of the tokenizers library's "
                       "BPE, WordPiece, WordLevel, Unigram"),
    }


def test_hf_tokenizer_json_of_the_wrong_kind_is_one_clear_error(tmp_path):
    """Not JSON, a JSON list, a config.json saved under the name, an unknown model type: one
    line naming the file and what is wrong with it (the training commands print it as
    `error: tokenizer: ...`, exit 2)."""
    _build_hf_tokenizer(tmp_path / "good")
    for name, (text, why) in _wrong_kinds(tmp_path / "good").items():
        d = tmp_path / name
        d.mkdir()
        (d / "tokenizer.json").write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(ValueError) as e:
            load_tokenizer(str(d))
        msg = str(e.value)
        assert msg.startswith(f"HFTokenizer: {d}/tokenizer.json is not a usable tokenizer.json: "
                              f"{why}"), (name, msg)
        assert "\n" not in msg


def test_other_tokenizers_models_load(tmp_path):
    """WordPiece (and the library's other models) are tokenizers too: they load and round-trip."""
    from tokenizers import Tokenizer as HFTok
    from tokenizers import decoders, models, pre_tokenizers
    vocab = {"<pad>": 0, "<eos>": 1, "[UNK]": 2, "4": 3, "2": 4, "+": 5, "##2": 6}
    tk = HFTok(models.WordPiece(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.decoder = decoders.WordPiece()
    tk.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))
    tok = load_tokenizer(str(tmp_path))
    assert tok.encode("4 + 2") == [3, 5, 4] and tok.eos_id == 1
