import json
from collections import Counter
import random
import sys

import pytest

from jaxrl_scale.data import TASKS, PromptStream, load_task, verify_countdown
from jaxrl_scale.data.expr import ExprError, evaluate
from jaxrl_scale.data.tasks import countdown_solutions, extract_boxed, extract_gsm8k_answer

SMALL = dict(num_examples=40)


def _rows(src):
    return [src[i] for i in range(len(src))]


def test_registry():
    assert set(TASKS) >= {"arithmetic", "countdown", "math_jsonl"}
    with pytest.raises(ValueError, match="known tasks"):
        load_task("nope", "train", data_dir="/tmp")


def test_arithmetic_builds_deterministic_and_disjoint(tmp_path):
    kw = dict(digits=3, ops="+-", **SMALL)
    a = load_task("arithmetic", "train", data_dir=tmp_path / "a", seed=3, **kw)
    b = load_task("arithmetic", "train", data_dir=tmp_path / "b", seed=3, **kw)
    assert len(a) == 40
    rows = _rows(a)
    assert rows == _rows(b)  # same seed, separate builds -> same examples
    assert [r["id"] for r in rows] == list(range(40))
    for r in rows:
        assert set(r) >= {"prompt", "answer", "solution", "id"}
        assert isinstance(r["prompt"], str) and r["prompt"].endswith("=")
        assert r["answer"] == r["solution"] == str(evaluate(r["prompt"][:-1])[0])
        assert all(c in "0123456789+-=" for c in r["prompt"])
    other_seed = load_task("arithmetic", "train", data_dir=tmp_path / "a", seed=4, **kw)
    assert [r["prompt"] for r in rows] != [r["prompt"] for r in _rows(other_seed)]
    # Held out: no test problem is a train problem, across seeds and sizes.
    test = load_task("arithmetic", "test", data_dir=tmp_path / "a", seed=3, digits=3, ops="+-",
                     num_examples=15)
    assert len(test) == 15
    train_prompts = {r["prompt"] for r in rows} | {r["prompt"] for r in _rows(other_seed)}
    assert train_prompts.isdisjoint(r["prompt"] for r in _rows(test))
    # The cache is keyed by config: the same call reuses the built files.
    again = load_task("arithmetic", "train", data_dir=tmp_path / "a", seed=3, **kw)
    assert again.config.name == a.config.name and _rows(again) == rows
    assert "tensorflow" not in sys.modules


def test_arithmetic_bad_knobs(tmp_path):
    with pytest.raises(ValueError, match="too few|leave only"):
        load_task("arithmetic", "train", data_dir=tmp_path, digits=1, ops="+", num_examples=500)
    with pytest.raises(ValueError, match="ops"):
        load_task("arithmetic", "train", data_dir=tmp_path, ops="/", num_examples=5)
    with pytest.raises(ValueError, match="unknown option.*valid options"):
        load_task("arithmetic", "train", data_dir=tmp_path, digitz=3, num_examples=5)


def test_countdown_builds_and_solutions_verify(tmp_path):
    a = load_task("countdown", "train", data_dir=tmp_path / "a", seed=1, **SMALL)
    b = load_task("countdown", "train", data_dir=tmp_path / "b", seed=1, **SMALL)
    rows = _rows(a)
    assert rows == _rows(b)
    test = load_task("countdown", "test", data_dir=tmp_path / "a", seed=1, num_examples=15)
    keys = lambda src: {(tuple(sorted(r["numbers"].split())), r["answer"]) for r in _rows(src)}
    assert keys(a).isdisjoint(keys(test))
    for r in rows + _rows(test):
        nums = [int(x) for x in r["numbers"].split()]
        assert 3 <= len(nums) <= 4
        assert r["prompt"] == f"nums {r['numbers']} target {r['answer']}:"
        assert len(r["prompt"]) <= 32
        assert verify_countdown(r["solution"], nums, int(r["answer"])), r


def test_countdown_solver():
    sols = countdown_solutions([3, 7, 25])
    assert sols[46] == "3*7+25"
    assert sols[175 - 3] == "7*25-3"
    for v, e in sols.items():
        value, used = evaluate(e)
        assert value == v and not Counter(used) - Counter([3, 7, 25])
    # a-(b+c) needs its parentheses
    assert evaluate(countdown_solutions([20, 3, 4])[13])[0] == 13


def test_expr_parser_rejects_unsafe_text():
    assert evaluate("(25-7)*3-8") == (46, [25, 7, 3, 8])
    for bad in ["", "1+", "(1+2", "1+2)", "-3+4", "2**3", "1/2", "__import__('os')", "07+1",
                "1" * 300]:
        with pytest.raises(ExprError):
            evaluate(bad)


def _write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")


def test_math_jsonl(tmp_path):
    d = tmp_path / "gsm"
    d.mkdir()
    _write_jsonl(d / "train.jsonl", [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=7\n#### 7"},
        {"question": "Big sum?", "answer": "It is large.\n#### 1,234"},
        "",
        {"problem": "What is $1/2 + 1/4$?", "solution": "Add: $\\boxed{\\frac{3}{4}}$."},
        {"problem": "Root?", "solution": "see text", "answer": "\\sqrt{2}"},
    ])
    _write_jsonl(d / "test.jsonl", [{"question": "2+2?", "answer": "#### 4"}])
    src = load_task("math_jsonl", "train", data_dir=tmp_path / "data", manual_dir=str(d))
    rows = _rows(src)
    assert [r["answer"] for r in rows] == ["7", "1234", "\\frac{3}{4}", "\\sqrt{2}"]
    assert rows[0]["prompt"].startswith("Tom has") and rows[0]["solution"].endswith("#### 7")
    assert [r["id"] for r in rows] == [0, 1, 2, 3]
    test = load_task("math_jsonl", "test", data_dir=tmp_path / "data", manual_dir=str(d))
    assert _rows(test)[0]["answer"] == "4"
    first2 = load_task("math_jsonl", "train", data_dir=tmp_path / "data", manual_dir=str(d),
                       num_examples=2)
    assert _rows(first2) == rows[:2]


@pytest.mark.parametrize(
    "bad_row, msg",
    [
        ('{"question": "x", "answer": "1"', "invalid JSON"),
        ('{"answer": "#### 3"}', "question"),
        ('{"problem": "p", "solution": "no box here"}', "final answer"),
        ('[1, 2]', "JSON object"),
    ],
)
def test_math_jsonl_malformed_row_names_file_and_line(tmp_path, bad_row, msg):
    d = tmp_path / "bad"
    d.mkdir()
    _write_jsonl(d / "train.jsonl", [{"question": "ok", "answer": "#### 1"}, "", bad_row])
    with pytest.raises(ValueError, match=rf"train\.jsonl:3: malformed row: .*{msg}"):
        load_task("math_jsonl", "train", data_dir=tmp_path / "data", manual_dir=str(d))


def test_math_jsonl_missing_directory(tmp_path):
    with pytest.raises(ValueError, match="manual_dir"):
        load_task("math_jsonl", "train", data_dir=tmp_path)
    with pytest.raises(ValueError, match="manual_dir .*does not exist"):
        load_task("math_jsonl", "train", data_dir=tmp_path, manual_dir=str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="train.jsonl"):
        load_task("math_jsonl", "train", data_dir=tmp_path, manual_dir=str(tmp_path / "empty"))


def test_answer_extraction():
    assert extract_gsm8k_answer("so 5\n#### 1,000,000") == "1000000"
    assert extract_boxed("a \\boxed{1} then \\boxed{\\frac{a}{b}} end") == "\\frac{a}{b}"
    assert extract_boxed("no box") is None


def test_prompt_stream_deterministic_and_resumable():
    source = [{"id": i} for i in range(10)]
    s = PromptStream(source, batch_size=4, seed=0)
    batches = [[e["id"] for e in s.next_batch()] for _ in range(5)]  # 20 examples: 2 epochs
    assert s.position == 20
    flat = sum(batches, [])
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:]) == list(range(10))
    assert flat[:10] != flat[10:]  # reshuffled each epoch
    again = PromptStream(source, batch_size=4, seed=0)
    assert [[e["id"] for e in again.next_batch()] for _ in range(5)] == batches
    other = PromptStream(source, batch_size=4, seed=1)
    assert [[e["id"] for e in other.next_batch()] for _ in range(5)] != batches
    # Resume from a saved position (a plain int) continues the same sequence.
    saved = json.loads(json.dumps({"position": 8}))["position"]
    resumed = PromptStream(source, batch_size=4, seed=0).restore(saved)
    assert [[e["id"] for e in resumed.next_batch()] for _ in range(3)] == batches[2:]
    with pytest.raises(ValueError):
        PromptStream([], batch_size=2, seed=0)


def test_prompt_stream_over_task_source(tmp_path):
    src = load_task("arithmetic", "test", data_dir=tmp_path, num_examples=6)
    s = PromptStream(src, batch_size=4, seed=random.Random(0).randrange(100))
    b1, b2 = s.next_batch(), s.next_batch()
    assert len(b1) == len(b2) == 4 and all(isinstance(e["prompt"], str) for e in b1 + b2)
    assert sorted(e["id"] for e in b1 + b2[:2]) == list(range(6))
