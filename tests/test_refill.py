"""DAPO dynamic sampling with refill (rl/refill.py): further rounds until P
groups with a reward spread are kept, at most refill_cap rounds; generated vs kept counted;
N counts responses generated (scaling/io.py, and verl's train/num_gen_batches)."""
import json
import os

import numpy as np
import pytest
from test_updates_per_rollout import _cfg as tiny_cfg

from jaxrl_scale.experiment.config import ConfigError, TrainConfig, validate
from jaxrl_scale.experiment.train import run_training
from jaxrl_scale.rl import refill
from jaxrl_scale.rl.batch import rollout_batch
from jaxrl_scale.rl.rollout import Rollout
from jaxrl_scale.scaling import io
from jaxrl_scale.scaling.readers import verl

G = 2


def _round(k, rewards_B, M=3):
    """A fake rollout of round k: every token of row i is 100 * k + i (so rows are traceable)."""
    B = len(rewards_B)
    tokens = (100 * k + np.arange(B))[:, None] * np.ones((1, M), np.int32)
    return Rollout(tokens_BM=tokens.astype(np.int32), logprobs_BM=-tokens / 1000.0,
                   lengths_B=np.full((B,), M - 1, np.int32),
                   examples=tuple({"id": (k, g)} for g in range(B // G)),
                   prompts=[[7, k, i // G] for i in range(B)], group_size=G, decode_s=0.5)


# rewards per round, 3 groups of G = 2 each: (spread?) round 0: no, yes, no; round 1: yes, no,
# yes; round 2: yes, yes, yes
ROUNDS = [np.array([0, 0, 1, 0, 1, 1.]), np.array([0, 1, 0, 0, 1, 0.]),
          np.array([1, 0, 0, 1, 1, 0.])]


def _refill(cap, rounds=ROUNDS, groups=3):
    calls = []

    def next_round(k):
        calls.append(k)
        return _round(k, rounds[k])

    out = refill.refill_rollout(_round(0, rounds[0]), rounds[0], next_round,
                                lambda r: (rounds[r.tokens_BM[0, 0] // 100], 1),
                                groups=groups, cap=cap)
    return out, calls


def test_refill_stops_once_the_batch_is_full():
    """Round 0 keeps group 1, round 1 groups 0 and 2: three kept after two rounds, so no third
    round; the update trains on them in generation order; every round's responses counted."""
    out, calls = _refill(cap=5)
    assert calls == [1]
    assert out.counts == {"generated": 12, "gen_rounds": 2, "refill_short": 0,
                          "zero_var_groups": 3}
    assert out.failed == 1                       # the extra round's failures, not round 0's
    np.testing.assert_array_equal(out.rollout.tokens_BM[:, 0], [2, 3, 100, 101, 104, 105])
    np.testing.assert_array_equal(out.rewards_B, [1, 0, 0, 1, 1, 0])
    assert [e["id"] for e in out.rollout.examples] == [(0, 1), (1, 0), (1, 2)]
    assert out.rollout.prompts == [[7, 0, 1], [7, 0, 1], [7, 1, 0], [7, 1, 0], [7, 1, 2],
                                   [7, 1, 2]]
    assert out.rollout.decode_s == 1.0
    np.testing.assert_array_equal(out.seen_rewards, np.concatenate(ROUNDS[:2]))
    batch, acc = rollout_batch(out.rollout.prompts, out.rollout.tokens_BM,
                               out.rollout.logprobs_BM, out.rollout.lengths_B, out.rewards_B,
                               prompt_len=3, pad_id=0, group_size=G, filter_zero_variance=True)
    assert acc["retained"] == 6 and np.asarray(batch.loss_mask_BT).any(1).all()


def test_refill_at_its_cap_tops_up_with_masked_groups_and_says_so():
    """cap = 1: no refill; the one kept group plus the two filtered ones (masked), in order: the
    same batch as --filter_zero_variance without refill."""
    out, calls = _refill(cap=1)
    assert calls == [] and out.counts["refill_short"] == 2 and out.counts["gen_rounds"] == 1
    np.testing.assert_array_equal(out.rollout.tokens_BM, _round(0, ROUNDS[0]).tokens_BM)
    batch, acc = rollout_batch(out.rollout.prompts, out.rollout.tokens_BM,
                               out.rollout.logprobs_BM, out.rollout.lengths_B, out.rewards_B,
                               prompt_len=3, pad_id=0, group_size=G, filter_zero_variance=True)
    assert acc["retained"] == 2
    np.testing.assert_array_equal(np.asarray(batch.loss_mask_BT).any(1),
                                  [False, False, True, True, False, False])


def test_more_kept_than_needed_trains_on_the_first():
    """Round 2 keeps all three groups, but only one is needed after rounds 0 and 1 kept... two
    groups are needed of a batch of 2: the first kept ones; later kept groups are generated
    (counted) but not trained on, as verl aligns its batch."""
    out, _ = _refill(cap=3, groups=2)
    assert out.counts["gen_rounds"] == 2 and out.counts["generated"] == 12
    assert [e["id"] for e in out.rollout.examples] == [(0, 1), (1, 0)]
    picks, short = refill.select_groups(ROUNDS, G, 5)
    assert short == 0 and picks == [(0, 1), (1, 0), (1, 2), (2, 0), (2, 1)]
    picks, short = refill.select_groups(ROUNDS[:1], G, 3)
    assert short == 2 and picks == [(0, 0), (0, 1), (0, 2)]


@pytest.mark.parametrize("kw, field", [
    (dict(refill=True), "refill_cap"),
    (dict(refill=True, refill_cap=0), "refill_cap"),
    (dict(refill=True, refill_cap=-1), "refill_cap"),
    (dict(refill_cap=3), "refill_cap"),
    (dict(refill_prompts=3), "refill_prompts"),
    (dict(refill=True, refill_cap=2, refill_prompts=-1), "refill_prompts"),
    (dict(refill=True, refill_cap=2, algo="ppo", group_size=1), "refill"),
    (dict(refill=True, refill_cap=2, gen_batch_ratio=2), "refill"),
])
def test_bad_refill_settings_name_the_field(kw, field):
    with pytest.raises(ConfigError) as e:
        validate(TrainConfig.make(**kw))
    assert e.value.field == field and "\n" not in str(e.value)


REWARD_MODULE = '''
def parity(response, example):
    """Deterministic, mixed within most groups: the parity of the response's characters."""
    return float(sum(map(ord, response)) % 2)


def never(response, example):
    return 0.0
'''


def _cfg(tmp_path, name, **kw):
    """test_updates_per_rollout's tiny config (P = 4, G = 4), evaluated every 2 steps."""
    return tiny_cfg(tmp_path / name, str(tmp_path / "data"), **{"eval_every": 2, **kw})


def _records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    return ([r for r in recs if r["step"] > 0 and "score" not in r],
            [r for r in recs if "score" in r])


@pytest.fixture()
def rewards_module(tmp_path, monkeypatch):
    (tmp_path / "rw_refill.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_refill_cap_1_is_the_filtered_run_bit_for_bit(tmp_path, rewards_module):
    """--refill --refill_cap=1 generates one round and trains on it with filtered groups
    masked: the same records as --filter_zero_variance (plus the refill counters)."""
    kw = dict(reward_fn="rw_refill:parity")
    run_training(_cfg(tmp_path, "filt", filter_zero_variance=True, **kw), progress=False)
    run_training(_cfg(tmp_path, "refill", refill=True, refill_cap=1, **kw), progress=False)
    (ft, fe), (rt, re_) = _records(tmp_path / "filt"), _records(tmp_path / "refill")
    timing = ("time_s", "gen_s", "decode_s", "train_s", "update_s", "eval_s", "compile_s",
              "reward_s")
    for a, b in zip(ft + fe, rt + re_):
        assert {k: v for k, v in b.items() if k not in timing + ("gen_rounds", "refill_short")} \
            == {k: v for k, v in a.items() if k not in timing}
    assert [r["gen_rounds"] for r in rt] == [1, 1]
    assert any(r["zero_var_groups"] for r in ft)   # the comparison covers masked groups
    # and the analysis reads both on one axis (retained responses): the same N*, so r_N = 1
    f, r = io.read_run(str(tmp_path / "filt")), io.read_run(str(tmp_path / "refill"))
    assert r.refill and not f.refill and r.eval_curve()[0].tolist() == f.eval_curve()[0].tolist()
    assert r.eval_curve()[1].tolist() == f.eval_curve()[1].tolist()


def test_refill_runs_to_its_cap_and_the_analysis_counts_retained(tmp_path, rewards_module):
    """A reward that never varies: every step runs its 3 rounds, keeps nothing (no update),
    and counts 3 x 16 generated; the analysis reads the run on the retained axis (the
    source's N), the rounds' time charged to q."""
    cfg = _cfg(tmp_path, "never", refill=True, refill_cap=3, reward_fn="rw_refill:never")
    run_training(cfg, progress=False)
    train, evals = _records(cfg.run_dir)
    assert [r["gen_rounds"] for r in train] == [3, 3]
    assert [r["refill_short"] for r in train] == [4, 4]
    assert [r["generated"] for r in train] == [48, 48]
    assert [r["retained"] for r in train] == [0, 0] and "actor_loss" not in train[0]
    assert [r["responses_generated"] for r in train] == [48, 96]
    assert evals[-1]["responses_generated"] == 96 and evals[-1]["responses"] == 0
    run = io.read_run(cfg.run_dir)
    assert [r["responses"] for r in run.train] == [0, 0]
    assert [e["responses"] for e in run.evals] == [0, 0] and run.refill


def test_refill_keeps_the_batch_full(tmp_path, rewards_module):
    """With a reward that varies, refill trains on P kept groups every step (retained = B)
    and generates at least that many."""
    cfg = _cfg(tmp_path, "parity", refill=True, refill_cap=8, reward_fn="rw_refill:parity")
    run_training(cfg, progress=False)
    train, _ = _records(cfg.run_dir)
    assert max(r["gen_rounds"] for r in train) > 1     # the refill ran (measured: 2, 2)
    for r in train:
        assert r["retained"] == 16 and r["refill_short"] == 0
        assert r["generated"] == 16 * r["gen_rounds"] >= 16
        assert 4 * r["gen_rounds"] - r["zero_var_groups"] >= 4   # P kept over the rounds
        assert "actor_loss" in r


def test_small_refill_rounds(tmp_path, rewards_module):
    """--refill_prompts=1: each round after the first samples 1 prompt x G (a second generate
    shape, compiled before the clock starts): the batch still fills with P kept groups, and
    generated = P*G + (rounds - 1) * G."""
    cfg = _cfg(tmp_path, "small", refill=True, refill_cap=16, refill_prompts=1,
               reward_fn="rw_refill:parity")
    run_training(cfg, progress=False)
    train, _ = _records(cfg.run_dir)
    assert max(r["gen_rounds"] for r in train) > 1
    for r in train:
        assert r["retained"] == 16 and r["refill_short"] == 0
        assert r["generated"] == 16 + (r["gen_rounds"] - 1) * 4


def test_rounds_of_another_size_select_alike():
    """Rounds of 1 group after a first of 3 (refill_prompts = 1): the same pick rules."""
    rounds = [ROUNDS[0], np.array([0, 0.]), np.array([1, 0.]), np.array([0, 1.])]
    picks, short = refill.select_groups(rounds, G, 3)
    assert (picks, short) == ([(0, 1), (2, 0), (3, 0)], 0)
    assert not refill.needs_more(rounds, G, 3, cap=10)
    assert refill.needs_more(rounds[:3], G, 3, cap=10)
    assert not refill.needs_more(rounds[:3], G, 3, cap=3)


def _verl_run(root, name, rounds, enable=True, gen_batch_size=6):
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "config.yaml").write_text(json.dumps({
        "data": {"train_batch_size": 4, "gen_batch_size": gen_batch_size},
        "actor_rollout_ref": {"rollout": {"n": 2}},
        "algorithm": {"adv_estimator": "grpo", "filter_groups": {"enable": enable}}}))
    lines = [{"step": 0, "data": {"val-core/x/acc/mean@1": 0.1}}]
    for s, k in enumerate(rounds, 1):
        data = {"timing_s/step": 2.0, "train/num_gen_batches": k}
        if s == len(rounds):
            data["val-core/x/acc/mean@1"] = 0.4
        lines.append({"step": s, "data": data})
    (d / "log.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    return str(d)


def test_verl_dynamic_sampling_stays_on_retained_responses(tmp_path):
    """verl's DAPO trainer (filter_groups) keeps 4 x 2 responses per step whatever its
    generation batches: N counts those, as for a plain run; the extra batches' time is in
    timing_s/step, so in q."""
    run = verl.read_run(_verl_run(tmp_path, "dapo", [1, 3, 2]))
    assert run.batch == 8 and run.refill
    assert [r["responses"] for r in run.train] == [8, 16, 24]
    assert [e["responses"] for e in run.evals] == [0, 24]
    assert any("retained responses" in w for w in run.warnings)
    plain = verl.read_run(_verl_run(tmp_path, "plain", [1, 3, 2], enable=False))
    assert [r["responses"] for r in plain.train] == [8, 16, 24] and not plain.refill


def test_a_resumed_refill_run_equals_an_uninterrupted_one(tmp_path, rewards_module):
    """The refill rounds read further prompts from the stream; its position is checkpointed,
    so a run stopped after step 1 and resumed gives the uninterrupted run's records."""
    kw = dict(refill=True, refill_cap=8, reward_fn="rw_refill:parity", checkpoint_every=1,
              max_steps=3)
    run_training(_cfg(tmp_path, "whole", **kw), progress=False)
    cut = _cfg(tmp_path, "cut", **kw)
    run_training(cut, progress=False, stop_after_steps=1)
    run_training(cut, progress=False)
    skip = ("time_s", "gen_s", "decode_s", "train_s", "update_s", "eval_s", "compile_s",
            "reward_s")
    (wt, we), (ct, ce) = _records(tmp_path / "whole"), _records(cut.run_dir)
    assert len(wt + we) == len(ct + ce) and max(r["gen_rounds"] for r in wt) > 1
    for a, b in zip(wt + we, ct + ce):
        assert {k: v for k, v in a.items() if k not in skip} == \
            {k: v for k, v in b.items() if k not in skip}


def _own_run(name, refilled, per_step_generated, step_s):
    """A run of ours (make_run): 10 steps of 8 retained responses, step_s seconds each, the
    score rising linearly with the retained responses; refilled runs say so in their config."""
    records, gen = [{"step": 0, "responses": 0, "time_s": 0.0, "score": 0.0, "eval_n": 400}], 0
    for s in range(1, 11):
        gen += per_step_generated
        records.append({"step": s, "responses": 8 * s, "responses_generated": gen,
                        "time_s": step_s * s})
        records.append({"step": s, "responses": 8 * s, "responses_generated": gen,
                        "score": 8 * s / 80, "eval_n": 400})
    config = {"name": name, "batch_train": 8, "algo": "grpo", "lr_rule": "sqrt",
              "refill": refilled}
    return io.make_run(name, records, config)


def test_refill_is_charged_to_throughput_not_to_n():
    """The source's axis: a refilled config reaching the target at the same retained count
    as the plain one has r_N = 1 (the same training, as --refill_cap=1 against
    --filter_zero_variance), and its refill rounds slow q; the table marks the config."""
    from jaxrl_scale.report.tables import format_table
    from jaxrl_scale.scaling.analysis import analyze
    runs = [_own_run(f"plain_P1_G8_s{i}", False, 8, 0.5) for i in range(2)] + \
        [_own_run(f"refill_P1_G8_s{i}", True, 16, 1.0) for i in range(2)]
    s = analyze(runs, target=0.5, reference="plain_P1_G8", n_boot=50)
    plain, refilled = s.configs["plain_P1_G8"], s.configs["refill_P1_G8"]
    assert plain.refill is None and refilled.refill is True
    assert plain.N_star == pytest.approx(40) and refilled.N_star == pytest.approx(40)
    assert refilled.r_N == pytest.approx(1.0) and refilled.r_q == pytest.approx(0.5)
    assert "refill" not in s.to_json()["configs"]["plain_P1_G8"]
    table = format_table(s)
    assert "refill" in table.split("refill_P1_G8")[1].split("\n")[0]
    assert "N* counts retained responses" in table
