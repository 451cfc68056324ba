"""Deliberate small bugs against the tolerance-checked tests.

Each mutant patches one line of the library in a throwaway git worktree of HEAD, runs the
tests that check that computation, and records whether they fail (they must). Run from the
repository root:  python results/numerics/mutants.py [INDEX ...]  (writes
results/numerics/mutants.json). The MoE expert-mesh test runs one micro-batch on both sides,
and the shared-prompt mesh test the shared path on both, so each is listed under the bug its
comparison can see.
"""
import json
import os
import subprocess
import sys
import tempfile

MUTANTS = [
    ("micro-batch gradients summed with a 0.1% wrong scale (M > 1)",
     "jaxrl_scale/rl/steps.py",
     "acc = jax.tree.map(lambda a, x: a + _f32(x), acc, g)",
     "acc = jax.tree.map(lambda a, x: a + _f32(x) * (1.0 + 1e-3 * (M > 1)), acc, g)",
     ["tests/test_steps.py::test_micro_batch_count_does_not_change_update",
      "tests/test_steps.py::test_seq_mean_modes_micro_batch_invariant",
      "tests/test_steps.py::test_ppo_step_micro_batch_invariant_and_updates_critic",
      "tests/test_sharding.py::test_grpo_on_mesh_matches_one_device",
      "tests/test_sharding.py::test_shared_prompt_update_on_mesh_matches_one_device"]),
    ("a dropped row: with M > 1 micro-batches, row 1 is replaced by a copy of row 0",
     "jaxrl_scale/rl/steps.py",
     "    B = x.shape[0]\n    x = x.reshape(B // (parts * group), parts, group, *x.shape[1:])",
     "    B = x.shape[0]\n    x = x.at[1].set(x[0]) if parts > 1 else x\n"
     "    x = x.reshape(B // (parts * group), parts, group, *x.shape[1:])",
     ["tests/test_steps.py::test_micro_batch_count_does_not_change_update",
      "tests/test_steps.py::test_micro_batches_hold_whole_groups",
      "tests/test_sharding.py::test_grpo_on_mesh_matches_one_device"]),
    ("shared-prompt hidden states 0.1% too large",
     "jaxrl_scale/models/decoder.py",
     "    return (h_BRD, jnp.stack(router_L)) if return_router_logits else h_BRD",
     "    h_BRD = h_BRD * 1.001\n"
     "    return (h_BRD, jnp.stack(router_L)) if return_router_logits else h_BRD",
     ["tests/test_steps.py::test_shared_prompt_update_equals_every_row",
      "tests/test_decoder.py::test_shared_prompt_hidden_states_equal_full_rows",
      "tests/test_moe.py::test_shared_prompt_update_equals_full_rows"]),
    ("cached one-token extend: logits 0.1% too large",
     "jaxrl_scale/models/decoder.py",
     "    logits_BTV = logits_from_hidden(cfg, params, x_BTD)",
     "    logits_BTV = logits_from_hidden(cfg, params, x_BTD) * (1 + 1e-3 * (x_BTD.shape[1] == 1))",
     ["tests/test_decoder.py::test_cached_decoding_matches_forward",
      "tests/test_generate.py::test_decode_step_equals_extend"]),
    ("decode step: logits 0.1% too large",
     "jaxrl_scale/sampling/decode.py",
     "    logits_BV = logits_from_hidden(cfg, params, x_B1D)[:, 0]",
     "    logits_BV = logits_from_hidden(cfg, params, x_B1D)[:, 0] * 1.001",
     ["tests/test_generate.py::test_greedy_matches_full_forward_reference",
      "tests/test_generate.py::test_sampled_logprobs_match_forward",
      "tests/test_generate.py::test_decode_step_equals_extend"]),
    ("critic mini-batches: contiguous halves instead of the interleaved row splits",
     "jaxrl_scale/rl/steps.py",
     "split = jax.tree.map(lambda x: _split_rows(x, K), data)",
     "split = jax.tree.map(lambda x: x.reshape(K, -1, *x.shape[1:]), data)",
     ["tests/test_steps.py::test_ppo_critic_has_its_own_schedule"]),
]


def main(only=None):
    """only: indices of MUTANTS to run (all by default)."""
    root = os.getcwd()
    results = []
    for i, (name, path, old, new, tests) in enumerate(MUTANTS):
        if only is not None and i not in only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            wt = os.path.join(tmp, "wt")
            subprocess.run(["git", "worktree", "add", "-q", "--detach", wt, "HEAD"], check=True)
            try:
                f = os.path.join(wt, path)
                src = open(f).read()
                assert src.count(old) == 1, (name, old)
                open(f, "w").write(src.replace(old, new))
                row = {"mutant": name, "file": path, "tests": {}}
                for t in tests:
                    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x",
                                        "-p", "no:cacheprovider", t], cwd=wt,
                                       env={**os.environ, "PYTHONPATH": wt},
                                       capture_output=True, text=True)
                    line = (r.stdout.strip().splitlines() or [""])[-1]
                    row["tests"][t] = {"failed": r.returncode != 0, "summary": line}
                    print(f"{'FAILS' if r.returncode else 'PASSES (bad)'}  {name}  {t}  {line}",
                          flush=True)
                results.append(row)
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", wt], check=False)
    out = os.path.join(root, "results", "numerics", "mutants.json")
    with open(out, "w") as fh:
        json.dump(results, fh, indent=1)
    caught = sum(v["failed"] for r in results for v in r["tests"].values())
    total = sum(len(r["tests"]) for r in results)
    print(f"{caught} of {total} mutant/test pairs fail as they must")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or None)
