"""A safe parser for integer expressions with + - * and parentheses (no eval).

Grammar (no unary minus, no leading zeros):
    expr   := term (("+" | "-") term)*
    term   := factor ("*" factor)*
    factor := INT | "(" expr ")"
Used to compute arithmetic answers at build time and to verify countdown responses.
"""
from __future__ import annotations

import re

__all__ = ["ExprError", "evaluate", "MAX_EXPR_CHARS"]

MAX_EXPR_CHARS = 256  # bounds parsing time and recursion depth for untrusted model output
_TOKEN = re.compile(r"\s*(?:(\d+)|([-+*()]))")


class ExprError(ValueError):
    """The text is not a well-formed expression of the grammar above."""


def _tokenize(text: str) -> list[str]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ExprError(f"unexpected character {text[pos:].lstrip()[:1]!r} in {text!r}")
        num, op = m.groups()
        if num is not None and len(num) > 1 and num[0] == "0":
            raise ExprError(f"number with a leading zero {num!r}")
        out.append(num if num is not None else op)
        pos = m.end()
    return out


def evaluate(text: str) -> tuple[int, list[int]]:
    """Value of `text` and the integer literals it uses, in order of appearance."""
    if len(text) > MAX_EXPR_CHARS:
        raise ExprError(f"expression longer than {MAX_EXPR_CHARS} characters")
    toks = _tokenize(text)
    if not toks:
        raise ExprError("empty expression")
    numbers: list[int] = []
    pos = 0

    def peek() -> str | None:
        return toks[pos] if pos < len(toks) else None

    def factor() -> int:
        nonlocal pos
        t = peek()
        if t is None:
            raise ExprError("expression ends early")
        if t == "(":
            pos += 1
            v = expr()
            if peek() != ")":
                raise ExprError("missing ')'")
            pos += 1
            return v
        if t.isdigit():
            pos += 1
            numbers.append(int(t))
            return int(t)
        raise ExprError(f"unexpected {t!r}")

    def term() -> int:
        nonlocal pos
        v = factor()
        while peek() == "*":
            pos += 1
            v *= factor()
        return v

    def expr() -> int:
        nonlocal pos
        v = term()
        while peek() in ("+", "-"):
            op = toks[pos]
            pos += 1
            rhs = term()
            v = v + rhs if op == "+" else v - rhs
        return v

    value = expr()
    if pos != len(toks):
        raise ExprError(f"unexpected {toks[pos]!r} after a complete expression")
    return value, numbers
