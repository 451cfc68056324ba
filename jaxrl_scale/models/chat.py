"""Chat templates: a conversation rendered the way the model saw conversations in its own
fine-tuning, so that an instruct checkpoint's prompts look like what it was trained on.

    ids = render([{"role": "user", "content": "23+58="}], "/ckpt/Qwen2.5")   # list[int]
    text = render_text(messages, "/ckpt/Qwen2.5", add_generation_prompt=False)

The template is the Jinja source of the tokenizer directory's chat_template.jinja or
tokenizer_config.json `chat_template` (or one you pass), rendered as transformers'
`apply_chat_template` renders it: a sandboxed Jinja environment with trim_blocks and
lstrip_blocks, the loop-control extension, `raise_exception`, `strftime_now` and a `tojson`
that does not escape HTML, with `messages`, `tools`, `add_generation_prompt` and the special
tokens of tokenizer_config.json (`bos_token`, `eos_token`, ...) in scope. The rendered text is
tokenized without the tokenizer's own special tokens (the template writes them), as
transformers does, so the ids match `apply_chat_template(..., tokenize=True)`.

Runs (`--chat_template`) use `load_chat_template`: "none" keeps the bare prompt, "auto" takes
the tokenizer's template, a path reads a .jinja file; a task prompt becomes one user turn
followed by the generation prompt (`Tokenizer.encode_prompt`).
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import os
from typing import Any, Sequence

__all__ = ["ChatTemplate", "ChatTemplateError", "load_chat_template", "read_template",
           "render", "render_text", "special_tokens"]

# The tokenizer_config.json keys transformers passes to a template (its special_tokens_map).
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                 "mask_token")
# The conversation a run's check renders: the shape of every task prompt (one user turn).
SAMPLE_PROMPT = "23+58="


class ChatTemplateError(ValueError):
    """A template that cannot be found, read, compiled or rendered (the message says which)."""


def _tokenizer_dir(tokenizer: str | os.PathLike | None) -> str | None:
    """The directory of a tokenizer given as a directory or as its tokenizer.json; None for the
    built-in character tokenizer (it has no files, so no template and no special tokens)."""
    if tokenizer is None or os.fspath(tokenizer) == "char":
        return None
    path = os.path.expanduser(os.fspath(tokenizer))
    return path if os.path.isdir(path) else os.path.dirname(path)


def _tokenizer_config(directory: str | None) -> dict[str, Any]:
    path = os.path.join(directory, "tokenizer_config.json") if directory else ""
    if not path or not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ChatTemplateError(f"{path} does not read as JSON ({e})") from None
    return data if isinstance(data, dict) else {}


def special_tokens(tokenizer: str | os.PathLike | None) -> dict[str, Any]:
    """{bos_token: "<s>", ...}: the special tokens tokenizer_config.json names, as strings (the
    file stores each as a string or as {"content": ...}), which templates read by name."""
    cfg = _tokenizer_config(_tokenizer_dir(tokenizer))
    out: dict[str, Any] = {}
    for key in _SPECIAL_KEYS:
        v = cfg.get(key)
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            out[key] = v
    extra = cfg.get("additional_special_tokens")
    if isinstance(extra, list):
        out["additional_special_tokens"] = [x.get("content") if isinstance(x, dict) else x
                                            for x in extra]
    return out


def read_template(spec: str, tokenizer: str | os.PathLike | None = None) -> str | None:
    """The Jinja source `spec` asks for: None for "none"; for "auto", the tokenizer directory's
    chat_template.jinja, else its tokenizer_config.json `chat_template` (a list of named
    templates: the one named "default"); otherwise `spec` is a path to a template file.
    A ChatTemplateError says what is missing."""
    if spec == "none":
        return None
    if spec != "auto":
        path = os.path.expanduser(spec)
        if not os.path.isfile(path):
            raise ChatTemplateError(f"{spec!r} is neither auto, none nor a template file")
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ChatTemplateError(f"{spec!r} does not read as UTF-8 text ({e})") from None
    directory = _tokenizer_dir(tokenizer)
    if directory is None:
        raise ChatTemplateError("auto asks for the tokenizer's template, and the built-in "
                                "character tokenizer has none")
    jinja_file = os.path.join(directory, "chat_template.jinja")
    if os.path.isfile(jinja_file):    # transformers saves the template here and prefers it
        with open(jinja_file, encoding="utf-8") as f:
            return f.read()
    source = _tokenizer_config(directory).get("chat_template")
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if not isinstance(source, str) or not source.strip():
        raise ChatTemplateError(f"auto asks for the tokenizer's template, and {directory} has "
                                "no chat_template in tokenizer_config.json nor a "
                                "chat_template.jinja")
    return source


@functools.lru_cache(maxsize=16)
def _compile(source: str):
    """The template in the environment transformers renders chat templates in (its sandbox and
    globals), so that a template written for transformers renders the same text here."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Jinja's own tojson escapes HTML characters, which would change the prompt's text
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the template does not parse: {e.message} (line {e.lineno})"
                                ) from None


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    """A template's Jinja `source` with the `tokens` ({bos_token: ..., ...}) it renders with."""

    source: str
    tokens: dict = dataclasses.field(default_factory=dict)

    def text(self, messages: Sequence[dict], add_generation_prompt: bool = True, *,
             tools: Sequence[dict] | None = None, **kwargs: Any) -> str:
        """The rendered conversation; a ChatTemplateError when the template fails (it raised,
        or it reads something the conversation does not have)."""
        import jinja2
        template = _compile(self.source)
        # a message without a key reads as undefined, as in transformers, which drops None keys
        chat = [{k: v for k, v in dict(m).items() if v is not None} for m in messages]
        try:
            return template.render(messages=chat, tools=None if tools is None else list(tools),
                                   documents=None, add_generation_prompt=add_generation_prompt,
                                   **{**self.tokens, **kwargs})
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the template fails to render: {e}") from None
        except (TypeError, KeyError, IndexError, AttributeError, ValueError) as e:
            raise ChatTemplateError(f"the template fails to render: {type(e).__name__}: {e}"
                                    ) from None

    def encode(self, tokenizer, messages: Sequence[dict], add_generation_prompt: bool = True,
               **kwargs: Any) -> list[int]:
        """Token ids of the rendered conversation under a models.tokenizer Tokenizer."""
        return encode_rendered(tokenizer, self.text(messages, add_generation_prompt, **kwargs))

    def encode_prompt(self, tokenizer, prompt: str) -> list[int]:
        """A task prompt as one user turn, followed by the assistant's generation prompt."""
        return self.encode(tokenizer, [{"role": "user", "content": prompt}], True)


def encode_rendered(tokenizer, text: str) -> list[int]:
    """Ids of rendered template text: without the tokenizer's post-processor (a Llama BOS),
    because the template writes its special tokens itself."""
    from jaxrl_scale.models.tokenizer import HFTokenizer
    if isinstance(tokenizer, HFTokenizer):
        return tokenizer.encode(text, add_special_tokens=False)
    return list(tokenizer.encode(text))


def load_chat_template(spec: str, tokenizer: str | os.PathLike | None = None
                       ) -> ChatTemplate | None:
    """The ChatTemplate of a --chat_template value ("auto", "none" or a path) for the run's
    --tokenizer ("char" or a directory); None for "none". The template is compiled and renders
    a one-turn conversation here, so a broken one fails before the run loads anything else."""
    source = read_template(spec, tokenizer)
    if source is None:
        return None
    template = ChatTemplate(source, special_tokens(tokenizer))
    template.text([{"role": "user", "content": SAMPLE_PROMPT}], True)
    return template


def render_text(messages: Sequence[dict], tokenizer_dir: str | os.PathLike,
                add_generation_prompt: bool = True, *, tools: Sequence[dict] | None = None,
                template: str | None = None, **kwargs: Any) -> str:
    """`messages` ([{"role", "content"}, ...]) rendered with the chat template of
    `tokenizer_dir` (or `template`: Jinja source), as transformers' apply_chat_template(...,
    tokenize=False) renders it. Extra keyword arguments reach the template (e.g.
    enable_thinking=False for Qwen3)."""
    source = template if template is not None else read_template("auto", tokenizer_dir)
    return ChatTemplate(source, special_tokens(tokenizer_dir)).text(
        messages, add_generation_prompt, tools=tools, **kwargs)


def render(messages: Sequence[dict], tokenizer_dir: str | os.PathLike,
           add_generation_prompt: bool = True, *, tools: Sequence[dict] | None = None,
           template: str | None = None, **kwargs: Any) -> list[int]:
    """Token ids of `render_text(...)` under the tokenizer.json of `tokenizer_dir`: the ids of
    transformers' apply_chat_template(messages, tokenize=True, ...)."""
    from jaxrl_scale.models.tokenizer import load_tokenizer
    text = render_text(messages, tokenizer_dir, add_generation_prompt, tools=tools,
                       template=template, **kwargs)
    return encode_rendered(load_tokenizer(tokenizer_dir), text)
