"""Rewards from a server, a judge and a reward model (data/remote_rewards.py,
models/reward_model.py): a stub HTTP server on 127.0.0.1 (port 0, a thread of this process)
scores, fails, hangs or answers garbage; nothing leaves the machine."""
import http.server
import json
import os
import threading
import time

import numpy as np
import pytest
import numerics

from jaxrl_scale.data.remote_rewards import (JudgeReward, RemoteReward, fill_template,
                                             parse_last_number, parse_yes_no)
from jaxrl_scale.experiment.config import ConfigError, TrainConfig, validate


class Stub:
    """A local JSON server: `reply(path, body, n)` (n: the request's number, from 0) returns
    (status, body bytes or a JSON-able object), or sleeps to hang. Records every request and
    the most requests it held at once."""

    def __init__(self, reply):
        self.reply, self.bodies, self.in_flight, self.max_in_flight = reply, [], 0, 0
        self.lock = threading.Lock()
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):   # quiet
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with stub.lock:
                    n = len(stub.bodies)
                    stub.bodies.append(json.loads(raw))
                    stub.in_flight += 1
                    stub.max_in_flight = max(stub.max_in_flight, stub.in_flight)
                try:
                    status, body = stub.reply(self.path, stub.bodies[n], n)
                finally:
                    with stub.lock:
                        stub.in_flight -= 1
                if not isinstance(body, bytes):
                    body = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:   # the client gave up (a timeout test)
                    pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/get_reward"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub():
    made = []

    def make(reply):
        made.append(Stub(reply))
        return made[-1]
    yield make
    for s in made:
        s.close()


def _len_rewards(path, body, n):
    """Scores each query by its response's length: the order shows in the values."""
    return 200, {"rewards": [float(len(r)) for r in body["responses"]], "extra": "ignored"}


EXAMPLES = [{"prompt": f"p{i}=", "answer": str(i)} for i in range(5)]
RESPONSES = ["x" * k for k in range(10)]          # G = 2 per example, prompt-major


def test_batches_keep_order_and_the_openrlhf_shape(stub):
    s = stub(_len_rewards)
    reward = RemoteReward(s.url, batch_size=3, concurrency=2, timeout_s=5)
    out = reward.score_batch(RESPONSES, EXAMPLES)
    assert out.dtype == np.float32 and out.tolist() == list(range(10))
    assert sorted(len(b["query"]) for b in s.bodies) == [1, 3, 3, 3]
    first = [b for b in s.bodies if b["responses"][0] == ""][0]
    assert first["query"] == ["p0=", "p0=x", "p1=xx"]            # prompt + response
    assert first["prompts"] == ["p0=", "p0=", "p1="] and first["labels"] == ["0", "0", "1"]
    assert first["examples"][2] == EXAMPLES[1]
    assert reward.failures == 0 and reward.calls == 10 and reward.seconds > 0
    assert reward.lap() == reward.seconds and reward.lap() == 0.0


def test_the_in_process_reward_times_itself_too():
    """RewardFn (the task's and --reward_fn's) keeps the same clock: reward_s of every run."""
    from jaxrl_scale.data.reward_runner import RewardFn
    reward = RewardFn(lambda r, e: time.sleep(0.02) or 1.0, timeout_s=5)
    reward.score_batch(["a", "b"], EXAMPLES[:1])
    first = reward.lap()
    assert first >= 0.04 and reward.lap() == 0.0 and reward.seconds == first


def test_batch_size_0_splits_the_batch_over_the_concurrency(stub):
    s = stub(_len_rewards)
    RemoteReward(s.url, concurrency=4, timeout_s=5).score_batch(RESPONSES[:8], EXAMPLES[:4])
    assert [len(b["query"]) for b in s.bodies] == [2, 2, 2, 2]


def test_requests_run_concurrency_at_a_time(stub):
    def slow(path, body, n):
        time.sleep(0.3)
        return _len_rewards(path, body, n)
    s = stub(slow)
    reward = RemoteReward(s.url, batch_size=1, concurrency=4, timeout_s=5)
    t0 = time.perf_counter()
    out = reward.score_batch(RESPONSES[:8], EXAMPLES[:4])
    took = time.perf_counter() - t0
    assert out.tolist() == list(range(8)) and s.max_in_flight == 4
    assert took < 8 * 0.3 * 0.75, took            # two waves of 4, not 8 one after another


def test_retries_with_backoff_then_success(stub):
    s = stub(lambda p, b, n: (503, {"error": "warming up"}) if n < 2 else _len_rewards(p, b, n))
    reward = RemoteReward(s.url, concurrency=1, timeout_s=5, retries=2, backoff_s=0.05)
    t0 = time.perf_counter()
    assert reward.score_batch(RESPONSES[:2], EXAMPLES[:1]).tolist() == [0.0, 1.0]
    assert len(s.bodies) == 3 and reward.failures == 0 and reward.requests == 3
    assert time.perf_counter() - t0 >= 0.05 + 0.1          # slept 0.05 s, then 0.1 s


def test_a_client_error_is_not_retried(stub):
    s = stub(lambda p, b, n: (400, {"error": "bad request"}))
    reward = RemoteReward(s.url, concurrency=1, timeout_s=5, retries=3, backoff_s=0.01)
    assert reward.score_batch(RESPONSES[:2], EXAMPLES[:1]).tolist() == [0.0, 0.0]
    assert len(s.bodies) == 1 and reward.failures == 2 and "HTTP 400" in reward.last_error


def _hang(path, body, n):
    time.sleep(1.5)
    return _len_rewards(path, body, n)


@pytest.mark.parametrize("reply, failed, timeouts", [
    (lambda p, b, n: (500, b"boom"), [0, 1, 2, 3], 0),                    # server error
    (_hang, [0, 1, 2, 3], 4),                                              # slower than timeout
    (lambda p, b, n: (200, b"<html>not json"), [0, 1, 2, 3], 0),         # malformed JSON
    (lambda p, b, n: (200, {"rewards": [1.0]}), [0, 1, 2, 3], 0),        # wrong length
    (lambda p, b, n: (200, {"scores": [1.0, 1.0]}), [0, 1, 2, 3], 0),    # no "rewards"
    (lambda p, b, n: (200, [1.0, 1.0]), [0, 1, 2, 3], 0),                # not an object
    (lambda p, b, n: (200, {"rewards": [None, 2.0]}), [0, 2], 0),        # one entry bad
    (lambda p, b, n: (200, {"rewards": ["1.0", True]}), [0, 2], 0),      # text is no reward
])
def test_failures_score_zero_are_counted_and_never_raise(stub, reply, failed, timeouts):
    s = stub(reply)
    reward = RemoteReward(s.url, batch_size=2, concurrency=2, timeout_s=0.5, retries=1,
                          backoff_s=0.01)
    out = reward.score_batch(RESPONSES[:4], EXAMPLES[:2])
    assert [i for i in range(4) if out[i] == 0] == failed
    assert reward.failures == len(failed) and reward.timeouts == timeouts
    if len(failed) == 2:   # the good entries kept their place (True is a reward of 1)
        assert out[1] == out[3] == (2.0 if reward.last_error.endswith("None, not a real "
                                                                     "number") else 1.0)


def test_no_server_at_all_is_counted(stub):
    s = stub(_len_rewards)
    url = s.url
    s.close()   # the port now refuses connections
    reward = RemoteReward(url, concurrency=1, timeout_s=1, retries=1, backoff_s=0.01)
    assert reward.score_batch(["a", "b"], EXAMPLES[:1]).tolist() == [0.0, 0.0]
    assert reward.failures == 2 and reward.requests == 2


@pytest.mark.parametrize("url", ["localhost:8000/x", "ftp://h/x", "http:///x", "http://h:99999/"])
def test_a_url_that_cannot_be_posted_to_is_refused(url):
    with pytest.raises(ValueError):
        RemoteReward(url)


# ----------------------------------------------------------------------------- judge

def test_parse_rules():
    assert parse_last_number("Score: 0.8") == 0.8
    assert parse_last_number("3 steps; final score 1") == 1.0
    assert parse_last_number("on a scale 0 to 1 I give .25") == 0.25
    assert parse_last_number("7/10") is None                 # last number 10: not in [0, 1]
    assert parse_last_number("no digits here") is None
    assert parse_last_number("score 1e-1") == 0.1
    assert parse_yes_no("Yes.") == 1.0 and parse_yes_no("yes, or rather NO") == 0.0
    assert parse_yes_no("nothing") is None and parse_yes_no("yesterday, notably") is None


def test_fill_template_fills_three_fields_and_keeps_other_braces():
    t = 'Q: {prompt}\nA: {response}\nRef: {answer}\nReply as {"score": x}; {other} stays'
    got = fill_template(t, "2+2", "4 {answer}", "4")
    assert got == 'Q: 2+2\nA: 4 {answer}\nRef: 4\nReply as {"score": x}; {other} stays'


def _judge(path, body, n):
    """Grades "A: <response>" by the response's length: even -> 1, odd -> "I cannot say"."""
    assert path == "/v1/chat/completions" and body["model"] == "judge-1"
    assert body["temperature"] == 0
    response = body["messages"][0]["content"].split("A: ", 1)[1].split("\n", 1)[0]
    text = "I cannot say" if len(response) % 2 else f"Reasoning... score {len(response) / 10}"
    return 200, {"choices": [{"message": {"role": "assistant", "content": text}}]}


def test_judge_scores_each_response_in_order_and_counts_unreadable_replies(stub):
    s = stub(_judge)
    url = s.url.replace("/get_reward", "/v1/chat/completions")
    judge = JudgeReward(url, "judge-1", "Q: {prompt}\nA: {response}\nRef: {answer}\n",
                        concurrency=3, timeout_s=5)
    out = judge.score_batch(RESPONSES[:8], EXAMPLES[:4])
    np.testing.assert_allclose(out, [0, 0, 0.2, 0, 0.4, 0, 0.6, 0], rtol=1e-6)
    assert judge.failures == 4 and len(s.bodies) == 8 and "no score" in judge.last_error
    asked = [b["messages"][0]["content"] for b in s.bodies]
    assert "Q: p3=\nA: xxxxxxx\nRef: 3\n" in asked


def test_judge_template_needs_the_response():
    with pytest.raises(ValueError, match="response"):
        JudgeReward("http://127.0.0.1:1/v1/chat/completions", "m", "Q: {prompt}")


# ----------------------------------------------------------------------------- flags

def _cfg(**kw):
    return TrainConfig.make(model="tiny", **kw)


@pytest.mark.parametrize("kw, field, says", [
    (dict(reward_url="localhost:8000/get_reward"), "reward_url", "scheme"),
    (dict(reward_fn="m:f", reward_url="http://127.0.0.1:1/r"), "reward_url", "both"),
    (dict(reward_url="http://127.0.0.1:1/r", reward_model="/x"), "reward_model", "both"),
    (dict(reward_concurrency=0), "reward_concurrency", ""),
    (dict(reward_retries=-1), "reward_retries", ""),
    (dict(judge_url="http://127.0.0.1:1/v1/chat/completions", judge_template="{t}"),
     "judge_model", "needs"),
    (dict(judge_model="m"), "judge_model", "judge_url"),
    (dict(judge_url="http://127.0.0.1:1/v1/chat/completions", judge_model="m",
          judge_template="{t}"), "judge_template", "{response}"),
    (dict(judge_url="http://127.0.0.1:1/v1/chat/completions", judge_model="m",
          judge_template="{t}", judge_parse="stars"), "judge_parse", ""),
    (dict(reward_url="http://127.0.0.1:1/r", eval_mode="exact"), "eval_mode", "exact"),
    (dict(reward_model="{d}"), "reward_model", "ForSequenceClassification"),
])
def test_bad_flags_name_the_field(tmp_path, kw, field, says):
    (tmp_path / "t.txt").write_text("Q: {prompt} -- grade it")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    kw = {k: v.replace("{t}", str(tmp_path / "t.txt")).replace("{d}", str(tmp_path))
          if isinstance(v, str) else v for k, v in kw.items()}
    with pytest.raises(ConfigError, match=f"^{field}: .*{says}") as e:
        validate(_cfg(**kw))
    assert ". Fix: " in str(e.value) and "\n" not in str(e.value)


# ----------------------------------------------------------------------------- reward model

@pytest.fixture(scope="module")
def seq_cls(tmp_path_factory):
    """A tiny random Qwen2ForSequenceClassification saved as safetensors (nothing downloaded)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = numerics.tiny_qwen2("Qwen2ForSequenceClassification", vocab_size=128,
                                hidden_size=64, intermediate_size=96,
                                max_position_embeddings=256, num_labels=1, pad_token_id=0)
    d = tmp_path_factory.mktemp("rm")
    model.save_pretrained(d)
    return model, str(d)


def _hf_scores(model, rows):
    import torch
    with torch.no_grad():   # one row at a time: no padding on transformers' side
        return np.array([model(input_ids=torch.tensor([r])).logits[0, 0].item() for r in rows],
                        np.float32)


def test_reward_model_scores_equal_transformers_logits(seq_cls):
    from numerics import assert_tree_close, permute_mlp, reorder_floor, tree_norm

    from jaxrl_scale.models.reward_model import RewardModel
    model, d = seq_cls
    rm = RewardModel.load(d)
    rng = np.random.RandomState(1)
    rows = [list(rng.randint(1, 128, n)) for n in (1, 5, 13, 17, 40)]   # padded to 64 here
    ours = rm.score_tokens(rows)
    want = _hf_scores(model, rows)
    # the rounding floor: the same scores summed in other orders (MLP units permuted)
    others = [RewardModel(rm.cfg, permute_mlp(rm.params, seed=s), rm.head_D).score_tokens(rows)
              for s in (1, 2)]
    assert_tree_close(ours, want, reorder_floor(ours, *others), tree_norm(want))
    assert np.std(want) > 0.05   # the scores differ: a wrong row or position would show


def test_model_reward_scores_prompt_plus_response(seq_cls):
    from jaxrl_scale.models.reward_model import ModelReward
    from jaxrl_scale.models.tokenizer import load_tokenizer
    model, d = seq_cls
    tok = load_tokenizer("char")
    reward = ModelReward(d, tok, batch_size=3)
    out = reward.score_batch(RESPONSES[1:9], EXAMPLES[:4])
    rows = [tok.encode(EXAMPLES[i // 2]["prompt"] + r) for i, r in enumerate(RESPONSES[1:9])]
    np.testing.assert_allclose(out, _hf_scores(model, rows), atol=1e-4)
    assert reward.failures == 0 and reward.lap() > 0
    bad = reward.score_batch(["\u00e9" * 300], EXAMPLES[:1])     # beyond max_seq_len 256
    assert bad.tolist() == [0.0] and reward.failures == 1


# ----------------------------------------------------------------------------- end to end

def test_one_training_step_against_the_stub(stub, tmp_path):
    """run_training with --reward_url: the records carry reward_s, and a server failing every
    third request costs rewards (counted in reward_failures), not the run."""
    from jaxrl_scale.experiment.train import run_training
    s = stub(lambda p, b, n: (500, b"down") if n % 3 == 2 else _len_rewards(p, b, n))
    cfg = TrainConfig.make(
        run_dir=str(tmp_path / "run"), data_dir=str(tmp_path / "data"), model="tiny",
        num_train_examples=50, num_test_examples=8, prompts_per_step=2, group_size=4,
        max_new_tokens=4, eval_every=100, eval_prompts=4, eval_samples=1, max_steps=1,
        base_lr=1e-3, base_batch=8, reward_url=s.url, reward_batch_size=4,
        reward_concurrency=2, reward_retries=0)
    run_training(cfg, progress=False)
    with open(os.path.join(cfg.run_dir, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    train = [r for r in recs if "reward_s" in r]
    assert len(train) == 1 and train[0]["reward_s"] > 0 and train[0]["step"] == 1
    assert train[0]["reward_failures"] >= 4 and len(s.bodies) >= 2
    assert train[0]["reward_mean"] >= 0
