"""What multi-turn episodes cost on this machine: environment isolation (thread vs a worker
process per episode) and the slot engine vs the synchronous multi-turn rollout.

    PYTHONPATH=. python results/multiturn/bench.py

Both on the `tiny` model with the built-in retry environment (an untrained model never
answers right, so every episode runs to the turn cap). Prints measured figures only; the
README beside this file records one run.
"""
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxrl_scale.data.envs import retry  # noqa: E402
from jaxrl_scale.models import get_config, init_params  # noqa: E402
from jaxrl_scale.models.tokenizer import CharTokenizer  # noqa: E402
from jaxrl_scale.rl.multiturn import EnvRunner  # noqa: E402
from jaxrl_scale.rl.partial_turns import EpisodePartialRollout  # noqa: E402
from jaxrl_scale.rl.rollout import SamplingSettings  # noqa: E402
from jaxrl_scale.sampling import SamplingConfig  # noqa: E402
from jaxrl_scale.sampling.engine import SlotEngine  # noqa: E402

TOK = CharTokenizer()
CFG = get_config("tiny")
REPS = int(os.environ.get("REPS", 5))


def isolation(B: int = 64, G: int = 8) -> None:
    """env_s per rollout of B two-turn episodes under each isolation (first rollout: warm-up)."""
    params = init_params(CFG, 0)
    examples = [{"prompt": f"{i % 50}+{i % 7}=", "answer": str(i % 50 + i % 7)}
                for i in range(B // G)]
    s = SamplingSettings(SamplingConfig(1.0, 0, 1.0), 24, None, TOK.pad_id, B)
    for iso in ("thread", "process"):
        runner = EnvRunner(retry, max_turns=2, max_obs_tokens=16, timeout_s=60.0,
                           max_prompt_len=8, turn_tokens=4, isolation=iso)
        env_s, wall = [], []
        for rep in range(REPS + 1):
            t0 = time.perf_counter()
            f = runner.rollout(CFG, params, examples, G, TOK, s, seed=rep).fields()
            assert f["env_failures"] == 0 and f["env_turns"] == 2.0
            env_s.append(f["env_s"])
            wall.append(time.perf_counter() - t0)
        print(f"isolation {iso:8s} B={B}: env_s per rollout median {np.median(env_s[1:]):.3f} s "
              f"({1e3 * np.median(env_s[1:]) / B:.2f} ms per episode; reps "
              f"{' '.join(f'{e:.3f}' for e in env_s[1:])}), rollout wall median "
              f"{np.median(wall[1:]):.3f} s", flush=True)


def engine_vs_sync(P: int = 8, G: int = 2, M: int = 128, turn: int = 24, ratio: int = 1) -> None:
    """Seconds per batch of P x G three-turn episodes: synchronous rollout vs slot engine."""
    params = jax.tree.map(lambda a: a * 4.0 if a.ndim >= 2 else a, init_params(CFG, 0))
    rng = np.random.default_rng(0)
    ex = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in rng.integers(0, 50, (64, 2))]
    kw = dict(max_turns=3, max_obs_tokens=24, max_prompt_len=8, timeout_s=30.0, turn_tokens=turn,
              isolation="thread")
    s = SamplingSettings(SamplingConfig(1.0, 0, 1.0), M, TOK.eos_id, TOK.pad_id, P * G)
    runner = EnvRunner(retry, **kw)
    runner.rollout(CFG, params, ex[:P], G, TOK, s, seed=99)   # compile
    sync_s = []
    for r in range(REPS):
        t0 = time.perf_counter()
        runner.rollout(CFG, params, ex[r * P:(r + 1) * P], G, TOK, s, seed=r)
        sync_s.append(time.perf_counter() - t0)
    eng = SlotEngine(CFG, slots=ratio * P * G, prompt_len=8, max_new_tokens=M,
                     sampling=SamplingConfig(1.0), eos_id=TOK.eos_id, pad_id=TOK.pad_id,
                     steps_per_call=8)
    it = iter(ex * 10)
    pr = EpisodePartialRollout(eng, lambda: next(it), EnvRunner(retry, **kw), TOK,
                               prompts_per_step=P, group_size=G, max_staleness=ratio - 1)
    eng.warm(params, range(G, eng.B + 1, G))
    pr.next_batch(params, version=0, seed=99)   # warm-up
    eng_s, calls, steps = [], [], []
    for r in range(REPS):
        t0 = time.perf_counter()
        f = pr.next_batch(params, version=r + 1, seed=r).fields()
        eng_s.append(time.perf_counter() - t0)
        calls.append(f["engine_calls"])
        steps.append(f["decode_steps"])
    # the mean is the throughput: with staleness > 0 one call can finish the next batch too,
    # so single batches alternate between long and near-free
    spread = lambda x: f"{np.mean(x):.3f} s/batch (min-max {min(x):.3f}-{max(x):.3f})"
    print(f"3-turn episodes, {P * G} per batch, mean over {REPS} batches: synchronous "
          f"{spread(sync_s)}; slot engine ({eng.B} slots, staleness {ratio - 1}) "
          f"{spread(eng_s)}, {np.mean(calls):.1f} "
          f"decode calls and {np.mean(steps):.0f} decode steps per batch (8 steps per call)",
          flush=True)


if __name__ == "__main__":
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}", flush=True)
    isolation()
    engine_vs_sync(ratio=1)
    engine_vs_sync(ratio=2)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    sys.exit(0)
