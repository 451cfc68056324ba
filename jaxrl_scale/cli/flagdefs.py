"""absl flags generated from frozen dataclasses: one flag per field, same name and default.

Nested dataclass fields (TrainConfig.loss, .sampling, .optim) get flags under their own flat
names (--clip_high, not --loss.clip_high; TrainConfig checks the names are unique). Tuple
fields are comma-separated lists ("8,16,32"; tuples of pairs "32x4,8x16"), dict fields JSON.
Only scripts import this (the library never reads flags).
"""
from __future__ import annotations

import dataclasses
import json
import typing

from absl import flags

from jaxrl_scale.experiment.config import ConfigError, task_max_new_tokens


def _leaves(cls, instance=None, prefix=""):
    """(flat name, dotted path, default, type hint) of every leaf field of `cls`."""
    instance = instance if instance is not None else cls()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        value = getattr(instance, f.name)
        if dataclasses.is_dataclass(value):
            hidden = getattr(cls, "_HIDDEN_FLAGS", ())
            for leaf in _leaves(type(value), value, f"{prefix}{f.name}."):
                if (f.name, leaf[0]) not in hidden:
                    yield leaf
        else:
            yield f.name, prefix + f.name, value, hints.get(f.name)


def _format(value) -> str:
    if isinstance(value, tuple):
        return ",".join("x".join(str(y) for y in v) if isinstance(v, tuple) else f"{v:g}"
                        if isinstance(v, float) else str(v) for v in value)
    return value


def define_from_dataclass(cls, *, skip=(), overrides=None, helps=None):
    """Define --NAME for every (leaf) field of `cls`; `helps` {name: text} adds help text."""
    overrides, helps = overrides or {}, helps or {}
    for name, path, default, _ in _leaves(cls):
        if name in skip:
            continue
        default = overrides.get(name, default)
        help_ = f"{cls.__name__}.{path}" + (f": {helps[name]}" if name in helps else "")
        if isinstance(default, bool):
            flags.DEFINE_bool(name, default, help_)
        elif isinstance(default, int):
            flags.DEFINE_integer(name, default, help_)
        elif isinstance(default, float):
            flags.DEFINE_float(name, default, help_)
        elif isinstance(default, dict):
            flags.DEFINE_string(name, json.dumps(default), help_ + " (JSON object)")
        elif isinstance(default, tuple):
            flags.DEFINE_string(name, _format(default), help_ + " (comma-separated)")
        else:
            flags.DEFINE_string(name, str(default), help_)


def _parse(name: str, raw, default, hint):
    """A field's value from its flag's string; a bad value names the flag and the fix."""
    if isinstance(default, dict):
        try:
            value = json.loads(raw) if raw else {}
        except json.JSONDecodeError as e:
            raise ConfigError(name, f"{raw!r} is not JSON ({e})",
                              f"""pass a JSON object, e.g. --{name}='{{"digits": 2}}'""") from None
        if not isinstance(value, dict):
            raise ConfigError(name, f"must be a JSON object, got {raw!r}",
                              f"""pass e.g. --{name}='{{"digits": 2}}'""")
        return value
    if not isinstance(default, tuple):
        if isinstance(raw, str) and float in typing.get_args(hint):   # e.g. `float | str`
            try:
                return float(raw)
            except ValueError:
                return raw
        return raw
    args = typing.get_args(hint)
    item = args[0] if args else str
    items = [x.strip() for x in raw.split(",") if x.strip()] if raw else []
    try:
        if typing.get_origin(item) is tuple:
            return tuple(tuple(int(y) for y in x.lower().split("x")) for x in items)
        return tuple(item(x) for x in items)
    except ValueError:
        want = "PxG items, e.g. 32x4" if typing.get_origin(item) is tuple else \
            f"comma-separated {item.__name__} values"
        raise ConfigError(name, f"cannot parse {raw!r}", f"give {want}") from None


def values_from_flags(cls, *, skip=(), only_present=False) -> dict:
    """{flat name: parsed value} of the flags of `cls` (only those given, if only_present)."""
    out = {}
    for name, _, default, hint in _leaves(cls):
        if name in skip or (only_present and not flags.FLAGS[name].present):
            continue
        out[name] = _parse(name, flags.FLAGS[name].value, default, hint)
    return out


def build_from_flags(cls, *, skip=(), **extra):
    """Instantiate `cls` from the parsed flags (flat names routed by `cls.make` if it has
    one, for nested configs). Without --max_new_tokens, a task whose solutions are longer than
    the default cap gets its own (config.task_max_new_tokens), so --task=arith_chain alone
    switches the workload."""
    kw = values_from_flags(cls, skip=tuple(skip) + tuple(extra))
    kw.update(extra)
    if "max_new_tokens" in kw and "max_new_tokens" not in extra and \
            not flags.FLAGS["max_new_tokens"].present and isinstance(kw.get("task_kwargs"), dict):
        kw["max_new_tokens"] = task_max_new_tokens(kw.get("task", ""), kw["task_kwargs"]) or \
            kw["max_new_tokens"]
    return cls.make(**kw) if hasattr(cls, "make") else cls(**kw)
