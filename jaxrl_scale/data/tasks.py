"""Pure-Python generators behind the task builders: arithmetic and countdown problems, the
countdown solver, and GSM8K/MATH-style JSONL parsing. No TFDS here; builders.py wraps these.

Held-out split: every problem has a fixed key (its prompt, or its sorted numbers and target for
countdown) and belongs to the held-out pool iff a keyed hash of that key falls below
`test_fraction`. The partition does not depend on the seed or on the split sizes, so no test
problem is ever a training problem, whatever seed or sizes two runs use (as long as they use the
same `test_fraction`). The seed only chooses which problems each split samples, and in what order;
a split of n examples is a prefix of the same split with more examples.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import re
from typing import Any, Callable, Iterator

from jaxrl_scale.data.expr import evaluate

__all__ = [
    "ArithChainSpec",
    "ArithmeticSpec",
    "CountdownSpec",
    "arith_chain_problem",
    "arith_chain_steps",
    "arithmetic_problem",
    "countdown_problem",
    "countdown_prompt",
    "countdown_solutions",
    "in_heldout",
    "sample_split",
    "extract_boxed",
    "extract_gsm8k_answer",
    "iter_math_jsonl",
    "parse_math_row",
    "read_math_jsonl",
]

OP_NAMES = {"+": "add", "-": "sub", "*": "mul"}


def in_heldout(task: str, key: str, test_fraction: float) -> bool:
    """Whether problem `key` of `task` belongs to the held-out (test) pool."""
    h = hashlib.blake2b(f"jaxrl_scale/{task}/{key}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2.0**64 < test_fraction


def sample_split(
    task: str,
    make: Callable[[random.Random], dict[str, Any] | None],
    *,
    split: str,
    n: int,
    seed: int,
    test_fraction: float,
    max_attempts: int | None = None,
) -> list[dict[str, Any]]:
    """n distinct problems of `split` from generator `make` (which returns a dict with "key").

    Raises ValueError if `n` distinct problems of that split cannot be found, which happens when
    the knobs leave too few distinct problems.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    rng = random.Random(f"{task}:{seed}:{split}")
    want_test = split == "test"
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    attempts = 0
    limit = max_attempts if max_attempts is not None else 100 * n + 10_000
    while len(out) < n:
        attempts += 1
        if attempts > limit:
            raise ValueError(
                f"{task}: found only {len(out)} distinct {split} problems of the {n} requested "
                f"after {limit} draws; the knobs leave too few distinct problems (ask for fewer "
                "examples or make the task harder)"
            )
        ex = make(rng)
        if ex is None:
            continue
        key = ex.pop("key")
        if key in seen or in_heldout(task, key, test_fraction) != want_test:
            continue
        seen.add(key)
        out.append(ex)
    return out


# ---------------------------------------------------------------------------------------------
# Arithmetic.


@dataclasses.dataclass(frozen=True)
class ArithmeticSpec:
    """Operands are uniform in [0, 10**digits); operators drawn uniformly from `ops`."""

    digits: int = 2
    ops: str = "+-*"
    num_operands: int = 2

    def validate(self) -> None:
        if self.digits < 1:
            raise ValueError(f"arithmetic digits must be >= 1, got {self.digits}")
        if self.num_operands < 2:
            raise ValueError(f"arithmetic num_operands must be >= 2, got {self.num_operands}")
        ops = self.ops
        if not ops or any(c not in OP_NAMES for c in ops) or len(set(ops)) != len(ops):
            raise ValueError(f"arithmetic ops must be distinct characters of '+-*', got {ops!r}")

    def num_problems(self) -> int:
        return 10 ** (self.digits * self.num_operands) * len(self.ops) ** (self.num_operands - 1)


def arithmetic_problem(rng: random.Random, spec: ArithmeticSpec) -> dict[str, Any]:
    """{"prompt": "23+58=", "answer": "81", "solution": "81", "key": ...}."""
    parts = [str(rng.randrange(10**spec.digits))]
    for _ in range(spec.num_operands - 1):
        parts.append(rng.choice(spec.ops))
        parts.append(str(rng.randrange(10**spec.digits)))
    expr = "".join(parts)
    value, _ = evaluate(expr)
    return {"prompt": expr + "=", "answer": str(value), "solution": str(value), "key": expr}


# ---------------------------------------------------------------------------------------------
# Arithmetic chains with shown work.


@dataclasses.dataclass(frozen=True)
class ArithChainSpec:
    """A chain of `k` operations on operands uniform in [0, 10**digits), operators uniform in
    `ops`, k in [min_ops, max_ops] with P(k) proportional to ops_decay**(k - min_ops).

    Why this shape: the response shows one reduction per operation, so its length grows
    about quadratically in k, and the geometric k makes it long-tailed (with the defaults:
    median 9, mean 17, 99th percentile 67 characters), like the reasoning traces of LLM RL
    where a few long responses set the generation time of a batch.
    """

    digits: int = 2
    ops: str = "+-"
    min_ops: int = 1
    max_ops: int = 6
    ops_decay: float = 0.7

    def validate(self) -> None:
        ArithmeticSpec(digits=self.digits, ops=self.ops).validate()
        if not 1 <= self.min_ops <= self.max_ops:
            raise ValueError(f"arith_chain needs 1 <= min_ops <= max_ops, got {self.min_ops}, "
                             f"{self.max_ops}")
        if not 0.0 < self.ops_decay <= 1.0:
            raise ValueError(f"arith_chain ops_decay must be in (0, 1], got {self.ops_decay}")

    def ops_weights(self) -> list[float]:
        """P(k) for k = min_ops..max_ops."""
        w = [self.ops_decay ** (k - self.min_ops) for k in range(self.min_ops, self.max_ops + 1)]
        return [x / sum(w) for x in w]

    def max_value_chars(self) -> int:
        """Characters of the widest intermediate value, sign included (a bound)."""
        top = 10 ** self.digits - 1
        big = top ** (self.max_ops + 1) if "*" in self.ops else top * (self.max_ops + 1)
        return len(str(big)) + 1

    def max_response_chars(self) -> int:
        """An upper bound on the response length: the step with r operations left has at most
        one value of max_value_chars, r operands of `digits` characters and r operators."""
        k, v = self.max_ops, self.max_value_chars()
        width = max(v, self.digits)
        return sum(width + r * (self.digits + 1) for r in range(k)) + (k - 1)


def _render(values: list[int], ops: list[str]) -> str:
    return str(values[0]) + "".join(o + str(x) for o, x in zip(ops, values[1:]))


def arith_chain_steps(values: list[int], ops: list[str]) -> list[str]:
    """The expressions after each reduction, last one the value: [12, 7, 5], ["+", "-"] ->
    ["19-5", "14"]. Each step applies the operation evaluated first under the usual
    precedence ("*" before "+" / "-", then left to right)."""
    values, ops = list(values), list(ops)
    steps = []
    while ops:
        i = ops.index("*") if "*" in ops else 0
        a, b, op = values[i], values[i + 1], ops[i]
        values[i:i + 2] = [a * b if op == "*" else a + b if op == "+" else a - b]
        del ops[i]
        steps.append(_render(values, ops))
    return steps


def arith_chain_problem(rng: random.Random, spec: ArithChainSpec) -> dict[str, Any]:
    """{"prompt": "12+7-5=", "answer": "14", "solution": "19-5=14", "num_ops": 2, "key": ...}.
    The solution is the work the policy imitates in the warm-start; the reward reads only the
    final number (rewards.chain_final_answer)."""
    ks = list(range(spec.min_ops, spec.max_ops + 1))
    k = rng.choices(ks, weights=spec.ops_weights())[0]
    values = [rng.randrange(10**spec.digits) for _ in range(k + 1)]
    ops = [rng.choice(spec.ops) for _ in range(k)]
    expr = _render(values, ops)
    steps = arith_chain_steps(values, ops)
    return {"prompt": expr + "=", "answer": steps[-1], "solution": "=".join(steps),
            "num_ops": k, "key": expr}


# ---------------------------------------------------------------------------------------------
# Countdown.


@dataclasses.dataclass(frozen=True)
class CountdownSpec:
    """Numbers uniform in [1, max_number], count uniform in [min_numbers, max_numbers]; the
    target is drawn uniformly among the values in [min_target, max_target] reachable with + - *
    using each number at most once (excluding the given numbers themselves)."""

    min_numbers: int = 3
    max_numbers: int = 4
    max_number: int = 25
    min_target: int = 10
    max_target: int = 100

    def validate(self) -> None:
        if not 2 <= self.min_numbers <= self.max_numbers <= 6:
            raise ValueError(
                "countdown needs 2 <= min_numbers <= max_numbers <= 6, got "
                f"{self.min_numbers}, {self.max_numbers}"
            )
        if self.max_number < 1:
            raise ValueError(f"countdown max_number must be >= 1, got {self.max_number}")
        if not 0 <= self.min_target <= self.max_target:
            raise ValueError(
                f"countdown needs 0 <= min_target <= max_target, got {self.min_target}, "
                f"{self.max_target}"
            )


# Precedence of an expression's top operator: 3 atom, 2 "*", 1 "+"/"-".
def _combine(a: tuple[str, int], b: tuple[str, int], op: str) -> str:
    ea, pa = a
    eb, pb = b
    p = 2 if op == "*" else 1
    if pa < p:
        ea = f"({ea})"
    # a-(b+c) and a*(b+c) need parentheses on the right; a+(b-c) and a*(b*c) do not.
    if pb < p or (op == "-" and pb == 1):
        eb = f"({eb})"
    return f"{ea}{op}{eb}"


def _better(new: str, old: str | None) -> bool:
    return old is None or (len(new), new) < (len(old), old)


def countdown_solutions(numbers: list[int]) -> dict[int, str]:
    """Every value reachable with + - * using each number at most once (non-negative
    intermediate values), with the shortest expression for each (ties: lexicographically
    smallest). Brute force over subsets; fine for up to ~5 numbers."""
    n = len(numbers)
    # table[mask] = {value: (expr, precedence)} over expressions using exactly the numbers in mask
    table: list[dict[int, tuple[str, int]]] = [dict() for _ in range(1 << n)]
    for i, x in enumerate(numbers):
        table[1 << i][x] = (str(x), 3)
    for mask in range(1, 1 << n):
        if mask & (mask - 1) == 0:
            continue
        low = mask & -mask
        best = table[mask]

        def put(v: int, e: str, p: int) -> None:
            old = best.get(v)
            if _better(e, old[0] if old else None):
                best[v] = (e, p)

        sub = (mask - 1) & mask
        while sub:
            if sub & low:  # each unordered split once: the left part holds the lowest bit
                other = mask ^ sub
                for va, a in table[sub].items():
                    for vb, b in table[other].items():
                        put(va + vb, _combine(a, b, "+"), 1)
                        put(va * vb, _combine(a, b, "*"), 2)
                        if va > vb:
                            put(va - vb, _combine(a, b, "-"), 1)
                        elif vb > va:
                            put(vb - va, _combine(b, a, "-"), 1)
            sub = (sub - 1) & mask
    result: dict[int, str] = {}
    for mask in range(1, 1 << n):
        for v, (e, _) in table[mask].items():
            if _better(e, result.get(v)):
                result[v] = e
    return result


def countdown_prompt(numbers: list[int], target: int) -> str:
    return f"nums {' '.join(map(str, numbers))} target {target}:"


def countdown_problem(rng: random.Random, spec: CountdownSpec) -> dict[str, Any] | None:
    """A solvable instance, or None when the drawn numbers reach no target in range."""
    k = rng.randint(spec.min_numbers, spec.max_numbers)
    numbers = [rng.randint(1, spec.max_number) for _ in range(k)]
    sols = countdown_solutions(numbers)
    targets = sorted(
        v for v in sols if spec.min_target <= v <= spec.max_target and v not in numbers
    )
    if not targets:
        return None
    target = rng.choice(targets)
    return {
        "prompt": countdown_prompt(numbers, target),
        "answer": str(target),
        "solution": sols[target],
        "numbers": " ".join(map(str, numbers)),
        "key": f"{sorted(numbers)}:{target}",
    }


# ---------------------------------------------------------------------------------------------
# GSM8K / MATH-style JSONL.

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def extract_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}) in `text`, braces matched."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            c = text[i]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    content = text[start:i].strip()
                    if content:
                        return content
                    break
    return None


def extract_gsm8k_answer(text: str) -> str | None:
    """The final answer after GSM8K's "####" marker, thousands separators removed."""
    if "####" not in text:
        return None
    ans = text.rsplit("####", 1)[1].strip()
    ans = ans.splitlines()[0].strip() if ans else ""
    ans = re.sub(r"(?<=\d),(?=\d{3})", "", ans)
    return ans or None


def parse_math_row(row: Any) -> dict[str, str]:
    """{"prompt", "answer", "solution"} from a GSM8K row (question/answer with "#### 42") or a
    MATH row (problem/solution with \\boxed{}, optionally an explicit "answer").
    Raises ValueError describing what is wrong (without file/line: the reader adds those)."""
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    prompt = row.get("question", row.get("problem"))
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("missing a non-empty 'question' or 'problem' string field")
    solution = row.get("solution")
    answer = row.get("answer")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if solution is not None:
        if not isinstance(solution, str):
            raise ValueError("'solution' must be a string")
        if isinstance(answer, str) and answer.strip():
            final = extract_gsm8k_answer(answer) or answer.strip()
        else:
            final = extract_boxed(solution) or extract_gsm8k_answer(solution)
        if not final:
            raise ValueError("no final answer: no 'answer' field and no \\boxed{} in 'solution'")
        return {"prompt": prompt, "answer": final, "solution": solution}
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError("missing a non-empty 'answer' or 'solution' field")
    final = extract_gsm8k_answer(answer) or extract_boxed(answer)
    if final is None:
        if "\n" in answer.strip():
            raise ValueError("'answer' has several lines but no '#### <answer>' or \\boxed{}")
        final = answer.strip()
    return {"prompt": prompt, "answer": final, "solution": answer}


def iter_math_jsonl(path: str | os.PathLike) -> Iterator[dict[str, str]]:
    """Parsed rows of a JSONL file; a malformed row is a ValueError naming file and line."""
    path = os.fspath(path)
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                msg = f"{path}:{lineno}: malformed row: invalid JSON ({e.msg})"
                raise ValueError(msg) from None
            try:
                yield parse_math_row(row)
            except ValueError as e:
                raise ValueError(f"{path}:{lineno}: malformed row: {e}") from None


def read_math_jsonl(path: str | os.PathLike) -> list[dict[str, str]]:
    return list(iter_math_jsonl(path))
