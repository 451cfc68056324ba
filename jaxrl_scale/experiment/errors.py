"""The bad-input error every command prints as one line. Its own module, free of JAX, so
commands that need no JAX (jaxrl-analyze, jaxrl-plan) can catch it without importing
`experiment.config` (whose rule tables pull in jax via `optim`); `experiment.config`
re-exports it, so both names are the same class."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad configuration value. str() is `<field>: <problem>. Fix: <fix>.`, where <field> is
    the flat name, which is also the flag (--<field>). The scripts print it as one line and
    exit 2; any other exception is a bug and keeps its traceback."""

    def __init__(self, field: str, problem: str, fix: str):
        self.field, self.problem, self.fix = field, problem, fix
        super().__init__(f"{field}: {problem}. Fix: {fix}.")


def one_line(e: BaseException) -> str:
    """`e` as one line: its type and the first line of its message (a run's or a step's error
    in a summary; the traceback goes to ERROR.txt)."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"
