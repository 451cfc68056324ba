r"""The RL loop's retained responses/s, split into rollout, update and host overhead, and
(with --compare_trl) TRL's GRPOTrainer on the same model file, tokenizer, prompts and shapes.

One round of one framework = a fresh trainer from the same random-init checkpoint, --steps
GRPO steps (rollout of P prompts x G samples, --max_new_tokens new tokens, rewards, one Adam
update, no KL, no reference model), the first --discard steps dropped (compilation, warm-up).
Rounds alternate between the frameworks (jaxrl_scale in this process, TRL in a child process
started for its round), so each ratio compares two measurements taken minutes apart on the
same machine state. Printed per P: medians over rounds and the ratio of every round.

jaxrl_scale runs GRPO's default update, which scores each group's prompt once
(TrainConfig.share_prompt); with --every_row (default) it is also timed with the prompt
scored in every row, the token shapes TRL's update runs on (T, tokens per row, is printed).

Splits (seconds per step, medians over the kept steps of a round):
  jaxrl_scale: rollout = the jitted decode (+ transfers); update = the jitted GRPO step
               (+ transfers); host = everything else in the step (tokenise, detokenise,
               rewards, packing, advantages).
  TRL:         rollout = `_generate_and_score_completions` (generation, rewards, advantages);
               update = the rest of the Trainer step (forward, backward, Adam).

    python experiments/rl_bench.py                         # jaxrl_scale alone, P = 8, 32, 128
    pip install -e '.[bench]' && python experiments/rl_bench.py --compare_trl
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from absl import flags

from jaxrl_scale.cli import one_line_errors, quiet_logging, run_main, write_json_out
from jaxrl_scale.numbers import write_json

FLAGS = flags.FLAGS
flags.DEFINE_list("prompts", ["8", "32", "128"], "Prompts per step P (one setting each).")
flags.DEFINE_integer("group", 8, "Samples per prompt G.")
flags.DEFINE_integer("max_new_tokens", 6, "Response length cap (tokens).")
flags.DEFINE_integer("steps", 12, "GRPO steps per round.")
flags.DEFINE_integer("discard", 2, "Leading steps of each round left out of the medians.")
flags.DEFINE_integer("rounds", 4, "Rounds per framework and P (alternating).")
flags.DEFINE_integer("micro_batches", 1, "Micro-batches per update, both frameworks (TRL: "
                     "per_device_train_batch_size = P*G/M, gradient_accumulation_steps = M).")
flags.DEFINE_string("model", "rl_cpu", "Model preset (random init, exported as an HF checkpoint).")
flags.DEFINE_string("task", "arithmetic", "Built-in task the prompts and rewards come from.")
flags.DEFINE_float("lr", 1e-5, "Adam learning rate (both frameworks).")
flags.DEFINE_integer("seed", 0, "Init, data order and sampling seed.")
flags.DEFINE_bool("compare_trl", False, "Also run TRL's GRPOTrainer (needs the bench extra).")
flags.DEFINE_bool("every_row", True, "Also time jaxrl_scale with --share_prompt=false (the "
                  "prompt scored in every row: the token shapes TRL's update runs on).")
flags.DEFINE_string("trl_python", sys.executable, "Python that has trl installed.")
flags.DEFINE_string("data_dir", "~/.cache/jaxrl_scale/data", "Where the task data is built.")
flags.DEFINE_string("json_out", "results/rl_bench.json", "Where to write every measurement.")
flags.DEFINE_string("trl_round", "", "Internal: run one TRL round from this spec file.")


# ----------------------------------------------------------------------------- shared inputs

def _task_kwargs() -> dict:
    from jaxrl_scale.experiment.config import TrainConfig
    d = TrainConfig()
    return dict(d.task_kwargs) if FLAGS.task == d.task else {}


def _prepare(work: str, P_max: int) -> dict:
    """The random-init checkpoint (HF layout, read by both) and the prompt order."""
    from jaxrl_scale.experiment.common import load_splits
    from jaxrl_scale.experiment.config import TrainConfig
    from jaxrl_scale.models import get_config, init_params
    from jaxrl_scale.models.hf import save_hf
    from jaxrl_scale.data import PromptStream

    cfg = get_config(FLAGS.model)
    model_dir = os.path.join(work, "model")
    save_hf(model_dir, cfg, init_params(cfg, FLAGS.seed),
            extra_config=dict(pad_token_id=0, eos_token_id=1, bos_token_id=2))
    d = TrainConfig()  # the training split a run loads (same size, so the same permutation)
    train, _ = load_splits(FLAGS.task, _task_kwargs(), FLAGS.data_dir, d.num_train_examples,
                           d.num_test_examples)
    # The order a jaxrl_scale run consumes prompts in (PromptStream, the run's seed); TRL
    # reads the same list unshuffled, G copies of each prompt per step.
    stream = PromptStream(train, P_max, FLAGS.seed)
    examples = [{k: (v.item() if hasattr(v, "item") else v) for k, v in e.items()}
                for _ in range(FLAGS.steps) for e in stream.next_batch()]
    return dict(model_dir=model_dir, examples=examples)


# ----------------------------------------------------------------------------- jaxrl_scale

def _jax_round(model_dir: str, P: int, share_prompt: bool = True) -> list[dict]:
    from jaxrl_scale.experiment.config import TrainConfig
    from jaxrl_scale.experiment.train import Run

    cfg = TrainConfig.make(hf_checkpoint=model_dir, tokenizer="char", task=FLAGS.task,
                           task_kwargs=_task_kwargs(), data_dir=FLAGS.data_dir,
                           prompts_per_step=P, group_size=FLAGS.group,
                           max_new_tokens=FLAGS.max_new_tokens, base_lr=FLAGS.lr,
                           lr_rule="fixed", base_batch=P * FLAGS.group,
                           micro_batches=FLAGS.micro_batches,
                           max_grad_norm=0.0, kl_coef=0.0, seed=FLAGS.seed, eval_prompts=1,
                           share_prompt=share_prompt)
    run = Run(cfg)
    update, _ = run.compile()
    loop = run.initial_state()
    out = []
    for step in range(1, FLAGS.steps + 1):
        t0 = time.perf_counter()
        loop, rec = run.train_step(loop, update)
        step_s = time.perf_counter() - t0
        out.append(dict(step_s=step_s, rollout_s=rec["decode_s"], update_s=rec["update_s"],
                        host_s=step_s - rec["decode_s"] - rec["update_s"],
                        retained=rec["retained"], tokens_per_row=run.prompt_len +
                        FLAGS.max_new_tokens))
    return out


# ----------------------------------------------------------------------------- TRL (child)

def _char_tokenizer(vocab_size: int):
    """jaxrl_scale's CharTokenizer as a transformers tokenizer (same ids, no BOS/EOS added);
    ids past the characters get placeholder tokens so every sampled id decodes."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from jaxrl_scale.models.tokenizer import CHAR_VOCAB, CharTokenizer, _SPECIALS

    vocab = {t: i for i, t in enumerate(_SPECIALS)}
    vocab.update({c: i + len(_SPECIALS) for i, c in enumerate(CHAR_VOCAB)})
    vocab.update({f"<unused{i}>": i for i in range(len(vocab), vocab_size)})
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    ours = CharTokenizer()
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>",
                                   bos_token="<bos>", padding_side="left"), ours


def _trl_round_main(spec_path: str) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from jaxrl_scale.data import reward_for_task

    spec = json.load(open(spec_path))
    P, G = spec["P"], spec["G"]
    print(f"TRL round: torch {torch.__version__}, {torch.get_num_threads()} threads", file=sys.stderr)
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    tok, ours = _char_tokenizer(model.config.vocab_size)
    examples = spec["examples"][:P * spec["steps"]]
    for e in examples[:64]:  # same token ids on both sides
        assert tok(e["prompt"])["input_ids"] == ours.encode(e["prompt"]), e["prompt"]
    reward_fn = reward_for_task(spec["task"])
    keys = sorted(examples[0])

    def reward(completions, **columns):
        rows = [{k: columns[k][i] for k in keys if k in columns} | {"prompt": p}
                for i, p in enumerate(columns.get("prompts", [None] * len(completions)))]
        return [float(r) for r in reward_fn.score_batch(list(completions), rows)]

    timings = {"rollout": [], "step": [], "tokens": []}

    class Timed(GRPOTrainer):
        def _generate_and_score_completions(self, *a, **kw):
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(*a, **kw)
            timings["rollout"].append(time.perf_counter() - t0)
            timings["tokens"].append(out["prompt_ids"].shape[1] + out["completion_ids"].shape[1])
            return out

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            timings["step"].append(time.perf_counter() - self.t0)

    args = GRPOConfig(
        output_dir=spec["out_dir"], per_device_train_batch_size=P * G // spec["micro_batches"],
        gradient_accumulation_steps=spec["micro_batches"], num_generations=G,
        max_completion_length=spec["max_new_tokens"], learning_rate=spec["lr"], beta=0.0,
        num_iterations=1, max_steps=spec["steps"], shuffle_dataset=False, temperature=1.0,
        top_p=1.0, top_k=0, use_cpu=True, report_to="none", save_strategy="no",
        logging_steps=10 ** 6, disable_tqdm=True, seed=spec["seed"], lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_grad_norm=0.0, dataloader_num_workers=0,
        # TRL's GRPO defaults are bf16 autocast and gradient checkpointing; both frameworks run
        # float32 without rematerialisation here (the same math, and TRL's faster CPU setting).
        bf16=False, gradient_checkpointing=False)
    trainer = Timed(model=model, reward_funcs=reward, args=args, processing_class=tok,
                    train_dataset=Dataset.from_list(examples), callbacks=[StepTimer()])
    trainer.train()
    rows = []
    for step_s, roll_s, n_tok in zip(timings["step"], timings["rollout"], timings["tokens"]):
        rows.append(dict(step_s=step_s, rollout_s=roll_s, update_s=step_s - roll_s,
                         retained=P * G, tokens_per_row=n_tok))
    print("TRL_ROUND_JSON " + json.dumps(rows), flush=True)


def _trl_round(work: str, model_dir: str, examples: list, P: int) -> list[dict]:
    spec = dict(P=P, G=FLAGS.group, micro_batches=FLAGS.micro_batches, steps=FLAGS.steps,
                max_new_tokens=FLAGS.max_new_tokens,
                lr=FLAGS.lr, seed=FLAGS.seed, task=FLAGS.task, model_dir=model_dir,
                examples=examples, out_dir=os.path.join(work, "trl_out"))
    path = os.path.join(work, f"trl_spec_P{P}.json")
    write_json(path, spec)
    proc = subprocess.run([FLAGS.trl_python, os.path.abspath(__file__), f"--trl_round={path}"],
                          capture_output=True, text=True, env=dict(os.environ,
                                                                     TOKENIZERS_PARALLELISM="false"))
    for line in proc.stdout.splitlines():
        if line.startswith("TRL_ROUND_JSON "):
            return json.loads(line[len("TRL_ROUND_JSON "):])
    raise RuntimeError(f"TRL round failed (exit {proc.returncode}); its stderr ends:\n"
                       + proc.stderr[-3000:])


# ----------------------------------------------------------------------------- summary

EVERY_ROW = "jaxrl_scale_every_row"   # share_prompt=False: TRL's token shapes in the update


def _round_summary(rows: list[dict]) -> dict:
    kept = rows[FLAGS.discard:]
    med = {k: statistics.median(r[k] for r in kept)
           for k in ("step_s", "rollout_s", "update_s") + (("host_s",) if "host_s" in kept[0]
                                                             else ())}
    med["responses_per_s"] = sum(r["retained"] for r in kept) / sum(r["step_s"] for r in kept)
    med["tokens_per_row"] = max(r["tokens_per_row"] for r in kept)   # the update's T
    return med


def _check_flags() -> list[int]:
    """One line and exit 2 (ConfigError) for a flag the bench cannot use, before any data,
    model or timing; returns the P values."""
    import jaxrl_scale.cli as c
    from jaxrl_scale.data.builders import TASKS
    from jaxrl_scale.experiment.config import ConfigError
    c.check_flag_ranges({"group": (2, c.INF, False), "max_new_tokens": (1, c.INF, False),
                         "steps": (1, c.INF, False), "discard": (0, c.INF, False),
                         "rounds": (1, c.INF, False), "micro_batches": (1, c.INF, False),
                         "lr": (0, c.INF, True), "seed": (0, c.INF, False)},
                        ints=("group", "max_new_tokens", "steps", "discard", "rounds",
                              "micro_batches", "seed"))
    Ps = c.int_list_flag("prompts")
    if FLAGS.discard >= FLAGS.steps:
        raise ConfigError("discard", f"{FLAGS.discard} leaves none of --steps={FLAGS.steps}",
                          "set --discard below --steps")
    if any(P % FLAGS.micro_batches for P in Ps):
        raise ConfigError("micro_batches", f"{FLAGS.micro_batches} does not divide every P in "
                          f"--prompts={','.join(map(str, Ps))}", "micro-batches hold whole "
                          "groups: pass a divisor of every P")
    c.check_model_preset()
    c.check_choice("task", FLAGS.task, TASKS)
    c.check_json_out()
    if FLAGS.compare_trl:
        probe = subprocess.run([FLAGS.trl_python, "-c", "import trl, torch, transformers"],
                               capture_output=True, text=True)
        if probe.returncode:
            raise ConfigError("compare_trl", f"needs trl, torch and transformers in "
                              f"{FLAGS.trl_python}", "pip install -e '.[bench]' (or point "
                              "--trl_python at a Python that has them)")
    return Ps


def main(argv):
    del argv
    quiet_logging()   # TFDS logs every dataset load at INFO
    if FLAGS.trl_round:
        return _trl_round_main(FLAGS.trl_round)
    with one_line_errors():
        Ps = _check_flags()
    import jax
    with tempfile.TemporaryDirectory() as work:
        shared = _prepare(work, max(Ps))
        results = []
        for P in Ps:
            ex = shared["examples"]  # the stream's order; a TRL round reads the first P * steps
            rounds = {"jaxrl_scale": [], EVERY_ROW: [], "trl": []}
            for r in range(FLAGS.rounds):
                rounds["jaxrl_scale"].append(_round_summary(_jax_round(shared["model_dir"], P)))
                if FLAGS.every_row:
                    rounds[EVERY_ROW].append(_round_summary(
                        _jax_round(shared["model_dir"], P, share_prompt=False)))
                if FLAGS.compare_trl:
                    rounds["trl"].append(_round_summary(_trl_round(work, shared["model_dir"],
                                                                   ex, P)))
                _print_round(P, r, rounds)
            results.append(dict(P=P, G=FLAGS.group, rounds=rounds))
    _print_table(results)
    out = dict(results=results, model=FLAGS.model, task=FLAGS.task, group=FLAGS.group,
               micro_batches=FLAGS.micro_batches,
               max_new_tokens=FLAGS.max_new_tokens, steps=FLAGS.steps, discard=FLAGS.discard,
               backend=jax.default_backend(), cpu_count=os.cpu_count(),
               machine=platform.machine(), command=" ".join(sys.argv))
    write_json_out(out)


def _print_round(P, r, rounds):
    parts = []
    for name, rs in rounds.items():
        if rs:
            x = rs[-1]
            host = f", host {x['host_s']:.3f}" if "host_s" in x else ""
            parts.append(f"{name} {x['responses_per_s']:.0f} resp/s (rollout {x['rollout_s']:.3f}"
                         f", update {x['update_s']:.3f}{host} s/step, T={x['tokens_per_row']})")
    line = f"P={P} round {r + 1}: " + " | ".join(parts)
    if rounds["trl"]:
        line += (" | ratio to TRL " + ", ".join(
            f"{rs[-1]['responses_per_s'] / rounds['trl'][-1]['responses_per_s']:.2f}x"
            for name, rs in rounds.items() if rs and name != "trl"))
    print(line, flush=True)


def _print_table(results):
    print(f"\n{'P':>4} {'G':>2} {'framework':>22} {'resp/s':>8} {'rollout s':>10} "
          f"{'update s':>9} {'host s':>7} {'host %':>7} {'T':>3}")
    for res in results:
        for name, rs in res["rounds"].items():
            if not rs:
                continue
            m = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            host = f"{m['host_s']:.3f}" if "host_s" in m else "-"
            pct = f"{100 * m['host_s'] / m['step_s']:.1f}" if "host_s" in m else "-"
            print(f"{res['P']:>4} {res['G']:>2} {name:>22} {m['responses_per_s']:>8.0f} "
                  f"{m['rollout_s']:>10.3f} {m['update_s']:>9.3f} {host:>7} {pct:>7} "
                  f"{m['tokens_per_row']:>3.0f}")
        trl = res["rounds"]["trl"]
        for name, rs in res["rounds"].items():
            if not trl or not rs or name == "trl":
                continue
            ratios = [j["responses_per_s"] / t["responses_per_s"] for j, t in zip(rs, trl)]
            upd = [t["update_s"] / j["update_s"] for j, t in zip(rs, trl)]
            print(f"{'':>4} {'':>2} {name + ' / trl':>22} resp/s per round: "
                  f"{', '.join(f'{x:.2f}x' for x in ratios)}; update speed per round: "
                  f"{', '.join(f'{x:.2f}x' for x in upd)}")


def run():
    """Console-script entry point."""
    run_main(main, __name__)


if __name__ == "__main__":
    run()
