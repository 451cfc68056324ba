"""jaxrl-export: a trained run's checkpoint loads in transformers (and peft) with the logits of
the run's own params, and every bad input is one line and exit 2 before any tensor is read.

Two tiny runs train here for two steps each (nothing is downloaded): a full update of the
`tiny` preset (with remat on, so a remat run trains, records its setting and exports), and a
LoRA run on a tiny random HF Qwen2 base that carries tokenizer files.

The logit bound is derived, not fitted. Each logit is a float32 sum over D terms of the final
normed hidden state times the head, z_v = sum_d n_d W_dv; two programs that compute the same
network in other orders (XLA here, torch there) differ by the rounding of each of the L
layers' sums, carried by the residual stream, plus the head's own: at most (L + 1) times
numerics.sum_bound of one sum as long as the network's longest (K = max(D, F, N*H, T)) with
the head's magnitudes sum_d |n_d W_dv|. A LoRA comparison has one rounding more per layer
(the merged weight W + s A B is rounded once, or the unmerged path sums B(A x) separately):
depth L + 2.
"""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import numerics
from numerics import DETECT, sum_bound
from test_cli import _check, _table
from test_train import _digit_reward, tiny_cfg

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxrl_scale.checkpoint import Checkpointer  # noqa: E402
from jaxrl_scale.experiment import export as ex  # noqa: E402
from jaxrl_scale.experiment.train import Run, trained_part  # noqa: E402
from jaxrl_scale.models import decoder, forward, lora  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LORA = dict(lora_rank=4, lora_alpha=8.0, lora_targets=("q", "v", "down"), base_lr=1e-2)
REMAT = "dots_with_no_batch_dims_saveable"
TOKENS = np.random.default_rng(0).integers(3, 99, (2, 12))   # char ids, one shape: one compile
EOS = 1


def _hf_base(d):
    """A tiny random Qwen2 (vocab 128 >= the char tokenizer's 99 ids) with tokenizer files."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    model = numerics.tiny_qwen2(vocab_size=128, eos_token_id=EOS)
    model.save_pretrained(d)
    vocab = {"<pad>": 0, "<eos>": EOS, **{str(i): 2 + i for i in range(10)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<eos>", "pad_token": "<pad>",
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"full": run dir, "lora": run dir, "base": HF base dir}, each run trained 2 steps with a
    checkpoint at steps 1 and 2 (a reward the random model gets partly right: gradients)."""
    root = tmp_path_factory.mktemp("export_runs")
    data = str(root / "data")
    base = str(root / "hf_base")
    _hf_base(base)
    kw = dict(max_steps=2, checkpoint_every=1, eval_every=2, eval_prompts=4)
    cfgs = {"full": tiny_cfg(root / "full", data, remat=REMAT, **kw),
            "lora": tiny_cfg(root / "lora", data, hf_checkpoint=base, **LORA, **kw)}
    with pytest.MonkeyPatch.context() as mp:
        _digit_reward(mp)
        from jaxrl_scale.experiment.train import run_training
        for cfg in cfgs.values():
            assert run_training(cfg, progress=False)["finished"]
    return {**{k: c.run_dir for k, c in cfgs.items()}, "base": base, "cfgs": cfgs}


_RUNS: dict = {}


def _run_state(cfg, step):
    """(model config, the policy's trained params at `step`, LoRA's frozen base or None),
    restored the way a resume restores them."""
    run = _RUNS.get(cfg.run_dir) or _RUNS.setdefault(cfg.run_dir, Run(cfg))
    ck = Checkpointer(os.path.join(cfg.run_dir, "checkpoints"))
    try:
        states, _ = ck.restore(step, trained_part(run.init_states))
    finally:
        ck.close()
    return run.model_cfg, states[0].params, run.init_states[0].frozen


_forward = jax.jit(forward, static_argnums=0)
_hidden = jax.jit(lambda cfg, p, t: decoder.hidden_states(cfg, p, t), static_argnums=0)


def _ours(cfg, params):
    return np.asarray(_forward(cfg, params, jnp.asarray(TOKENS)))


def _theirs(model):
    with torch.no_grad():
        return model(input_ids=torch.tensor(TOKENS)).logits.float().numpy()


def _logit_bound(cfg, params, depth):
    """Per-logit bound on two float32 evaluations of the network (module docstring)."""
    h = np.asarray(_hidden(cfg, params, jnp.asarray(TOKENS)), np.float64)
    n = h / np.sqrt(np.mean(h * h, -1, keepdims=True) + cfg.rms_norm_eps) * \
        np.asarray(params["final_norm"], np.float64)
    w = np.asarray(params["embed"]).T if cfg.tie_word_embeddings else params["lm_head"]
    abs_sum = np.abs(n) @ np.abs(np.asarray(w, np.float64))
    K = max(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim, TOKENS.shape[1])
    return depth * sum_bound(K, abs_sum)


def _assert_logits_close(got, want, tol):
    scale = float(np.abs(want).max())
    assert float(tol.max()) <= DETECT * scale, (float(tol.max()), scale)   # keeps its power
    diff = np.abs(np.asarray(got, np.float64) - want)
    worst = np.unravel_index(np.argmax(diff / tol), tol.shape)
    numerics._log("logits", float(diff[worst]), float(tol[worst]), scale)
    assert np.all(diff <= tol), (float(diff.max()), float(tol[np.unravel_index(
        np.argmax(diff - tol), tol.shape)]))


def _load(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def test_hf_export_of_each_step_has_the_runs_logits(runs, tmp_path):
    """The command exports the latest step by default and --step=1 when asked; each loads in
    transformers with the logits our decoder computes from the run's params at that step."""
    cfg = runs["cfgs"]["full"]
    with open(os.path.join(cfg.run_dir, "config.json")) as f:
        assert json.load(f)["remat"] == REMAT      # the run records its remat setting
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    outs = {}
    for step, extra in ((2, []), (1, ["--step=1"])):
        outs[step] = str(tmp_path / f"step{step}")
        res = subprocess.run([sys.executable, "-m", "jaxrl_scale.cli.export",
                              f"--run_dir={cfg.run_dir}", f"--out={outs[step]}", *extra],
                             capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        assert f"exported step {step} of " in res.stdout, res.stdout
        assert "Traceback" not in res.stderr and "WARNING" not in res.stderr, res.stderr
    logits = {}
    for step, out in outs.items():
        model_cfg, params, frozen = _run_state(cfg, step)
        assert frozen is None
        with open(os.path.join(out, ex.EXPORT_FILE)) as f:
            assert json.load(f)["step"] == step
        logits[step] = _theirs(_load(out))
        _assert_logits_close(_ours(model_cfg, params), logits[step],
                             _logit_bound(model_cfg, params, model_cfg.num_layers + 1))
    assert np.abs(logits[1] - logits[2]).max() > 1e-4    # the two steps are different models


def test_lora_merged_and_peft_exports_have_the_runs_logits(runs, tmp_path):
    """A LoRA run's merged export has the logits of the run's composed params (base + its
    adapters), its PEFT adapter on the base model gives those of the merged export, --format=hf
    writes the merged weights too, and the base's tokenizer files and eos id come along."""
    peft = pytest.importorskip("peft")
    cfg = runs["cfgs"]["lora"]
    plans = {fmt: ex.plan_export(cfg.run_dir, None, fmt, str(tmp_path / fmt))
             for fmt in ("merged", "peft", "hf")}
    for plan in plans.values():
        assert plan.step == 2
        ex.export(plan)
    model_cfg, adapters, base = _run_state(cfg, 2)
    composed = lora.compose(base, adapters, cfg.lora.scale)
    merged = _theirs(_load(str(tmp_path / "merged")))
    depth = model_cfg.num_layers + 2
    _assert_logits_close(_ours(model_cfg, composed), merged,
                         _logit_bound(model_cfg, composed, depth))
    assert np.abs(merged - _ours(model_cfg, base)).max() > 1e-4    # the adapters trained

    with_adapter = peft.PeftModel.from_pretrained(_load(runs["base"]), str(tmp_path / "peft"))
    _assert_logits_close(_theirs(with_adapter.eval()), merged,
                         _logit_bound(model_cfg, composed, depth))
    with open(tmp_path / "peft" / lora.PEFT_CONFIG_FILE) as f:
        assert json.load(f)["r"] == 4

    for name in ("model.safetensors", "config.json"):   # hf on a LoRA run: the merged model
        assert (tmp_path / "hf" / name).read_bytes() == (tmp_path / "merged" / name).read_bytes()
    for fmt in ("merged", "peft"):
        assert {"tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(tmp_path / fmt))
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "merged"))
    assert tok.convert_tokens_to_ids("<eos>") == EOS
    with open(tmp_path / "merged" / "config.json") as f:
        assert json.load(f)["eos_token_id"] == EOS


def test_bad_inputs_one_line_each_before_anything_is_read(runs, tmp_path):
    """No checkpoint, a step that does not exist (the ones that do are listed), --out an
    existing file, a LoRA format on a full run, ...: one line naming the flag and the fix,
    exit 2, nothing written."""
    empty = tmp_path / "started"          # a run that has not saved a checkpoint yet
    empty.mkdir()
    (empty / "config.json").write_text(
        open(os.path.join(runs["full"], "config.json")).read())
    (tmp_path / "a_file").write_text("")
    out = tmp_path / "out"
    rows = [
        ("--run_dir={empty} --out={out}", "run_dir"),
        ("--run_dir={full} --step=7 --out={out}", "step"),
        ("--run_dir={full} --step=-1 --out={out}", "step"),
        ("--run_dir={full} --out={file}", "out"),
        ("--run_dir={full} --out={file}/sub", "out"),
        ("--run_dir={full} --format=peft --out={out}", "format"),
        ("--run_dir={full} --format=merged --out={out}", "format"),
        ("--run_dir={full} --format=gguf --out={out}", "format"),
        ("--run_dir={full} --out={full}", "out"),
        ("--run_dir={full}", "out"),
        ("--out={out}", "run_dir"),
        ("--run_dir={tmp}/nope --out={out}", "run_dir"),
        ("--run_dir={tmp} --out={out}", "run_dir"),            # no config.json
    ]
    results = _table(tmp_path, "jaxrl_scale.cli.export", rows, empty=empty, full=runs["full"],
                     file=tmp_path / "a_file", out=out, tmp=tmp_path)
    _check(results, rows)
    step = [r for r in results if "--step=7" in r["row"]][0]["stderr"]
    assert "it has steps 1, 2" in step and "latest (2)" in step
    assert not out.exists()
