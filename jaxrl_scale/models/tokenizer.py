"""Tokenizers behind one small interface: a character tokenizer for the built-in tasks and an
adapter over Hugging Face `tokenizers` (tokenizer.json) for real checkpoints.

    tok = load_tokenizer("char")            # CharTokenizer, vocab_size 99
    tok = load_tokenizer("/ckpt/Qwen2.5")   # HFTokenizer over /ckpt/Qwen2.5/tokenizer.json
    ids = tok.encode("23+58=");  text = tok.decode(ids)
    ids = tok.encode_prompt("23+58=")       # through tok.chat_template when set (models/chat.py)

`decode` never stops early: it renders every id except `pad_id`. Generation output keeps the
EOS token and pads after it, so use `decode_response` to get the text a reward should see.
"""
from __future__ import annotations

import abc
import json
import os
import string
from typing import Any, Iterable

__all__ = [
    "Tokenizer",
    "CharTokenizer",
    "HFTokenizer",
    "CHAR_VOCAB",
    "load_tokenizer",
    "decode_response",
]


class Tokenizer(abc.ABC):
    """The interface every tokenizer in jaxrl_scale offers."""

    pad_id: int
    eos_id: int
    bos_id: int | None = None
    # models.chat.ChatTemplate a run's prompts are rendered with (--chat_template), or None
    chat_template: Any = None

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`."""

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a task prompt: with a `chat_template`, the prompt as one user turn
        followed by the assistant's generation prompt; without one, `encode(text)`."""
        if self.chat_template is None:
            return self.encode(text)
        return self.chat_template.encode_prompt(self, text)

    @abc.abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`; `pad_id` is skipped, nothing else is (not even EOS)."""

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (ids are in [0, vocab_size))."""


def decode_response(tokenizer: Tokenizer, ids: Iterable[int]) -> str:
    """Text of a generated response: everything before the first EOS, pads dropped.

    Models often have more logits than the tokenizer has ids (padded vocabularies); a sampled
    id the tokenizer cannot decode becomes U+FFFD, so it can never match an answer.
    """
    pieces, run = [], []
    for i in ids:
        i = int(i)
        if i == tokenizer.eos_id:
            break
        if i == tokenizer.pad_id:
            continue
        if i < tokenizer.vocab_size:
            run.append(i)
        else:
            pieces += [tokenizer.decode(run), "\ufffd"]
            run = []
    return "".join(pieces) + tokenizer.decode(run)


# ---------------------------------------------------------------------------------------------
# Character tokenizer.

_SPECIALS = ("<pad>", "<eos>", "<bos>")  # ids 0, 1, 2
# The character set, in id order starting at 3: the symbols the built-in tasks need first, then
# the rest of printable ASCII so GSM8K-style text also encodes. 96 characters, vocab_size 99.
_TASK_CHARS = (
    string.digits
    + "+-*/=() "
    + string.ascii_lowercase
    + string.ascii_uppercase
    + ".,:;?!'\"\n"
)
_REST = "".join(c for c in string.printable if c not in _TASK_CHARS and c not in "\t\r\x0b\x0c")
CHAR_VOCAB: str = _TASK_CHARS + _REST
assert len(set(CHAR_VOCAB)) == len(CHAR_VOCAB) == 96


class CharTokenizer(Tokenizer):
    """One id per character: pad=0, eos=1, bos=2, then `CHAR_VOCAB` in order from id 3.

    `encode` adds no BOS/EOS (pass `add_bos=True` / `add_eos=True`); an unknown character is a
    ValueError naming it. `decode` renders EOS/BOS as "<eos>"/"<bos>" unless
    `skip_special_tokens=True`, and always drops pads.
    """

    pad_id = 0
    eos_id = 1
    bos_id = 2

    def __init__(self) -> None:
        self._offset = len(_SPECIALS)
        self._to_id = {c: i + self._offset for i, c in enumerate(CHAR_VOCAB)}

    @property
    def vocab_size(self) -> int:
        return self._offset + len(CHAR_VOCAB)

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        try:
            ids = [self._to_id[c] for c in text]
        except KeyError as e:
            c = e.args[0]
            pos = text.index(c)
            raise ValueError(
                f"CharTokenizer cannot encode character {c!r} (U+{ord(c):04X}) at position {pos} "
                f"of {text[:60]!r}; the vocabulary is printable ASCII plus newline"
            ) from None
        if add_bos:
            ids.insert(0, self.bos_id)
        if add_eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i == self.pad_id:
                continue
            if i < 0 or i >= self.vocab_size:
                raise ValueError(f"token id {i} outside the vocabulary [0, {self.vocab_size})")
            if i < self._offset:
                if not skip_special_tokens:
                    out.append(_SPECIALS[i])
                continue
            out.append(CHAR_VOCAB[i - self._offset])
        return "".join(out)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


# ---------------------------------------------------------------------------------------------
# Hugging Face `tokenizers` adapter.


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
    return data if isinstance(data, dict) else {}


_TOKENIZER_MODELS = ("BPE", "WordPiece", "WordLevel", "Unigram")   # the `tokenizers` models


def _not_a_tokenizer(file: str) -> str | None:
    """Why `file` (which the tokenizers library refused) is not a tokenizer.json, in words;
    None when it looks like one (the library's own message then says what is wrong)."""
    try:
        with open(file, "rb") as f:
            d = json.loads(f.read())
    except ValueError as e:   # JSONDecodeError, or bytes that are not UTF-8
        return f"not valid JSON ({e})"
    if not isinstance(d, dict):
        return f"it holds a JSON {type(d).__name__}, not a tokenizer object"
    model = d.get("model")
    if not isinstance(model, dict):
        return ('it has no "model" object, so it is not a Hugging Face tokenizers file (a '
                'config.json or tokenizer_config.json under that name?)')
    kind = model.get("type")
    if kind is not None and kind not in _TOKENIZER_MODELS:
        return (f"its model type {str(kind)[:40]!r} is none of the tokenizers library's "
                f"{', '.join(_TOKENIZER_MODELS)}")
    return None


def _token_content(tok: Any) -> str | None:
    """tokenizer_config.json stores special tokens as a string or as {"content": ...}."""
    if isinstance(tok, str):
        return tok
    if isinstance(tok, dict) and isinstance(tok.get("content"), str):
        return tok["content"]
    return None


def _as_id_list(v: Any) -> list[int]:
    if isinstance(v, bool) or v is None:
        return []
    if isinstance(v, int):
        return [v]
    if isinstance(v, (list, tuple)):
        return [int(x) for x in v if isinstance(x, int) and not isinstance(x, bool)]
    return []


class HFTokenizer(Tokenizer):
    """Adapter over a Hugging Face `tokenizer.json` (the `tokenizers` library, no transformers).

    EOS is looked up in this order: the `eos_id` / `eos_token` arguments, tokenizer_config.json
    `eos_token`, generation_config.json `eos_token_id` (first of a list), config.json
    `eos_token_id`. If none is found, a ValueError says so. `eos_ids` holds every stop id the
    files name (generation_config may list several, e.g. Qwen instruct models).
    PAD: `pad_id` / `pad_token` arguments, tokenizer_config.json `pad_token`,
    generation_config.json / config.json `pad_token_id`, else EOS.

    `encode(text)` applies the tokenizer's post-processor (e.g. a Llama BOS) like HF does by
    default; pass `add_special_tokens=False` to get the bare ids.
    """

    def __init__(
        self,
        path: str,
        *,
        eos_id: int | None = None,
        eos_token: str | None = None,
        pad_id: int | None = None,
        pad_token: str | None = None,
    ) -> None:
        import tokenizers

        path = os.fspath(path)
        file = path if os.path.isfile(path) else os.path.join(path, "tokenizer.json")
        directory = os.path.dirname(file)
        if not os.path.isfile(file):
            raise ValueError(f"HFTokenizer: no tokenizer.json at {file}")
        self.path = directory
        try:
            self._tok = tokenizers.Tokenizer.from_file(file)
        except Exception as e:  # the tokenizers library raises a bare Exception
            why = _not_a_tokenizer(file) or " ".join(str(e).split())
            raise ValueError(f"HFTokenizer: {file} is not a usable tokenizer.json: {why}") from None
        tok_cfg = _read_json(os.path.join(directory, "tokenizer_config.json"))
        gen_cfg = _read_json(os.path.join(directory, "generation_config.json"))
        model_cfg = _read_json(os.path.join(directory, "config.json"))

        def token_id(token: str, what: str) -> int:
            i = self._tok.token_to_id(token)
            if i is None:
                raise ValueError(
                    f"HFTokenizer: {what} {token!r} is not in the vocabulary of {file}"
                )
            return i

        gen_eos = _as_id_list(gen_cfg.get("eos_token_id"))
        model_eos = _as_id_list(model_cfg.get("eos_token_id"))
        cfg_eos_token = _token_content(tok_cfg.get("eos_token"))
        if eos_id is not None:
            eos = int(eos_id)
        elif eos_token is not None:
            eos = token_id(eos_token, "eos_token")
        elif cfg_eos_token is not None:
            eos = token_id(cfg_eos_token, "tokenizer_config.json eos_token")
        elif gen_eos:
            eos = gen_eos[0]
        elif model_eos:
            eos = model_eos[0]
        else:
            raise ValueError(
                f"HFTokenizer: no EOS token found for {directory} (looked in tokenizer_config.json "
                "eos_token, generation_config.json and config.json eos_token_id); pass "
                "eos_id=... or eos_token=..."
            )
        self.eos_id = eos
        self.eos_ids: tuple[int, ...] = tuple(dict.fromkeys([eos, *gen_eos, *model_eos]))

        cfg_pad_token = _token_content(tok_cfg.get("pad_token"))
        pads = _as_id_list(gen_cfg.get("pad_token_id")) or _as_id_list(
            model_cfg.get("pad_token_id")
        )
        if pad_id is not None:
            self.pad_id = int(pad_id)
        elif pad_token is not None:
            self.pad_id = token_id(pad_token, "pad_token")
        elif cfg_pad_token is not None and self._tok.token_to_id(cfg_pad_token) is not None:
            self.pad_id = self._tok.token_to_id(cfg_pad_token)
        elif pads:
            self.pad_id = pads[0]
        else:
            self.pad_id = eos

        bos_token = _token_content(tok_cfg.get("bos_token"))
        bos = self._tok.token_to_id(bos_token) if bos_token is not None else None
        if bos is None:
            bos_ids = _as_id_list(gen_cfg.get("bos_token_id")) or _as_id_list(
                model_cfg.get("bos_token_id")
            )
            bos = bos_ids[0] if bos_ids else None
        self.bos_id = bos

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        keep = [int(i) for i in ids if int(i) != self.pad_id]
        return self._tok.decode(keep, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def __repr__(self) -> str:
        return (
            f"HFTokenizer({self.path!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id}, "
            f"pad_id={self.pad_id})"
        )


def load_tokenizer(path_or_name: str | os.PathLike, **kwargs: Any) -> Tokenizer:
    """"char" -> CharTokenizer; a directory holding tokenizer.json (or the file) -> HFTokenizer.

    Keyword arguments go to HFTokenizer (eos_id, eos_token, pad_id, pad_token).
    """
    name = os.fspath(path_or_name)
    if name == "char":
        if kwargs:
            raise ValueError(f"CharTokenizer takes no options, got {sorted(kwargs)}")
        return CharTokenizer()
    if os.path.isdir(name) or (os.path.isfile(name) and name.endswith(".json")):
        return HFTokenizer(name, **kwargs)
    raise ValueError(
        f"unknown tokenizer {name!r}: expected 'char' or a directory containing tokenizer.json"
    )

