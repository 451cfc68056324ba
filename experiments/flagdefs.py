"""absl flags generated from a frozen dataclass: one flag per field, same name and default.

Only scripts import this (the library never reads flags).
"""
from __future__ import annotations

import dataclasses
import json

from absl import flags


def define_from_dataclass(cls, *, skip=(), overrides=None):
    """Define --FIELD for every field of `cls`; dict fields take JSON strings."""
    overrides = overrides or {}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        default = overrides.get(f.name, f.default if f.default is not dataclasses.MISSING
                                else f.default_factory())
        help_ = f"{cls.__name__}.{f.name}"
        if isinstance(default, bool):
            flags.DEFINE_bool(f.name, default, help_)
        elif isinstance(default, int):
            flags.DEFINE_integer(f.name, default, help_)
        elif isinstance(default, float):
            flags.DEFINE_float(f.name, default, help_)
        elif isinstance(default, dict):
            flags.DEFINE_string(f.name, json.dumps(default), help_ + " (JSON object)")
        else:
            flags.DEFINE_string(f.name, default, help_)


def build_from_flags(cls, *, skip=(), **extra):
    """Instantiate `cls` from the parsed flags; a bad JSON value names its flag."""
    kw = {}
    for f in dataclasses.fields(cls):
        if f.name in skip or f.name in extra:
            continue
        value = flags.FLAGS[f.name].value
        if isinstance(f.default_factory() if f.default is dataclasses.MISSING else f.default,
                      dict):
            try:
                value = json.loads(value) if value else {}
            except json.JSONDecodeError as e:
                raise ValueError(f"--{f.name} must be a JSON object, got {value!r}: {e}") from e
            if not isinstance(value, dict):
                raise ValueError(f"--{f.name} must be a JSON object, got {value!r}")
        kw[f.name] = value
    kw.update(extra)
    return cls(**kw)
