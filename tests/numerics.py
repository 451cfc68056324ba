"""Float tolerances derived from the computation, not tuned on one CPU.

Two float32 programs that compute one quantity in different summation orders (micro-batches,
a shared prompt, a sharded reduction, another instruction set's vector width) differ by
rounding alone, and that rounding is no fixed fraction of the result: it grows with the count
and the magnitude of the terms summed, and after an Adam step with 1 / (|g| + eps) for the
gradient entries that cancel to nearly zero. So a check here takes its bound from the
computation itself:

- ``reorder_floor``: the spread between the reference and the same program run on its rows
  reordered (an update: the batch's groups permuted) or on its hidden units reordered (a
  forward: ``permute_mlp``), the same sums in another legitimate order, measured in the test.
  Any other legitimate order has errors of the same distribution; the L2 norm over thousands
  of entries concentrates, so SAFETY times the largest of a few reorderings bounds it on any
  ISA.
- ``assert_adam_step_close``: params and Adam moments compared after one optimizer step from
  the same state differ by what Adam makes of the two programs' measured gradient difference
  (entries with |g| ~ eps amplify it up to lr / eps), computed exactly in float64, plus each
  program's float32 rounding of the step, bounded operation by operation (adam_step64). No
  measured floor enters, so a chain of steps is checked one step at a time: each program
  step starts from the state the other produced (a chain compared only at its end would
  compound the eps-amplified differences of every step, which no derived bound follows).
- ``sum_bound``: Higham's bound for a float32 sum of n terms of total magnitude sum|x|,
  2 * gamma(n + TERM_ULPS) * sum|x| for two evaluations in any orders, used where a quantity is
  one scalar sum (a loss): one reordering of a scalar can cancel by chance, a bound cannot.
- ``sqnorm_bound``: a squared gradient norm summed in float32 over n ~ 1e5 entries, where the
  worst-case gamma_n is vacuous: Higham & Mary's probabilistic bound (SIAM J. Sci. Comput.
  41(5), 2019, Thm 3.1), LAMBDA * sqrt(n) * u, exceeded with probability below
  2 exp(-LAMBDA^2 / 2) = 3e-8, plus what the gradients themselves may differ by.

Every check also asserts that its tolerance stays below DETECT of the quantity's own scale,
so a bound that grew until it would accept a 0.1% wrong scale or a dropped row of a 16-row
batch fails instead of passing: the tests keep their power on every machine.

Set JAXRL_TOL_LOG=FILE to append one line per check (test, measured / tolerance) for the
margin tables recorded under results/numerics/.
"""
import json
import os

import jax
import numpy as np
import optax

EPS32 = float(np.finfo(np.float32).eps)      # 2^-23; unit roundoff u = EPS32 / 2
SAFETY = 8.0     # other orders vs the largest measured reordering (see the module docstring)
TERM_ULPS = 8    # ulps each summed term carries in from its own exp / log / matmul
DETECT = 1e-3    # a tolerance above this fraction of the scale could hide a real bug
LAMBDA = 6.0     # Higham-Mary confidence: the bound fails with probability 2 exp(-18)


def tree_norm(t) -> float:
    """Global L2 norm in float64 numpy (eager jnp ops would compile per leaf shape)."""
    return float(np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64)))
                             for x in jax.tree_util.tree_leaves(t))))


def tree_diff(a, b) -> float:
    return tree_norm(jax.tree.map(lambda x, y: np.asarray(x, np.float64) - np.asarray(y), a, b))


def gamma(n: int) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative error bound of an n-term float32 sum."""
    u = EPS32 / 2
    return n * u / (1 - n * u)


def sum_bound(n_terms: int, abs_sum: float) -> float:
    """|a - b| bound for two float32 evaluations, in any orders, of one sum of n_terms terms
    whose magnitudes add to abs_sum (each term itself good to TERM_ULPS ulps)."""
    return 2 * gamma(n_terms + TERM_ULPS) * abs_sum


def sqnorm_bound(n_entries: int, sqnorm: float, grad_tol: float) -> float:
    """|s_a - s_b| for s_a a float32 sum of the n_entries squares of gradient a (no
    cancellation: all terms positive) and s_b = |b|^2 exactly, where |a - b| <= grad_tol:
    the float32 sum's own rounding plus |a|^2 - |b|^2 <= (|a| + |b|) |a - b|."""
    u = EPS32 / 2
    return LAMBDA * np.sqrt(n_entries + TERM_ULPS) * u * sqnorm + \
        (2 * np.sqrt(sqnorm) + grad_tol) * grad_tol


def tree_tol(floor: float, scale: float) -> float:
    """The tolerance of assert_tree_close: SAFETY reorderings, at least a few ulps of scale."""
    return max(SAFETY * floor, 4 * EPS32 * scale)


def _adam_state(opt_state):
    """The one optax ScaleByAdamState (count, mu, nu) inside a train state's opt_state."""
    kind = optax.ScaleByAdamState
    found = [x for x in jax.tree_util.tree_leaves(opt_state, is_leaf=lambda x: isinstance(x, kind))
             if isinstance(x, kind)]
    assert len(found) == 1, f"expected one Adam state, found {len(found)}"
    return found[0]


def _f64(tree):
    return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


def adam_step64(params, opt_state, grads, hp, max_grad_norm: float | None = 1.0,
                norm_scale: float = 1.0):
    """What the library's optimizer (optim.make_optimizer: clip_by_global_norm, then optax
    Adam) makes of `grads` from (params, opt_state), in float64: (params, mu, nu), plus
    `bound`, the per-entry bound on how far a float32 evaluation of the same step, from the
    same state and gradients, can be from it. norm_scale scales the global norm the clip
    sees (to propagate the float32 norm's own error).

    The bound is first-order rounding analysis (u = 2^-24), one term per operation:
      m = b1 mu + (1 - b1) c g:  |err| <= 6 u m_abs, m_abs = b1 |mu| + (1 - b1) |c g|
                                 (two constants, two products, one sum, the clip's c g);
      v = b2 nu + (1 - b2) (c g)^2: all terms positive, |err| <= 8 u v;
      1 - b^t, b^t a float32 pow of fl(b): |err| <= (t + TERM_ULPS) u b^t + u (1 - b^t),
                                 which 1 - b2^t ~ 1e-3 t turns into a relative error of
                                 ~1e4 u: the largest term, kept exactly;
      sqrt(v_hat) + eps: half v_hat's relative error, plus 2 u;
      lr * m_hat / den, then params + update: 3 u of the update, u of the new param.
    """
    adam = _adam_state(opt_state)
    u = EPS32 / 2
    t = int(adam.count) + 1
    g = _f64(grads)
    norm = tree_norm(grads) * norm_scale
    c = min(1.0, max_grad_norm / norm) if max_grad_norm else 1.0
    b1, b2, eps, lr = hp.b1, hp.b2, hp.eps, hp.lr
    bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
    e1 = ((t + TERM_ULPS) * u * b1 ** t + u * bc1) / bc1        # relative, of 1 - b1^t
    e2 = ((t + TERM_ULPS) * u * b2 ** t + u * bc2) / bc2
    e_den = (8 * u + e2 + u) / 2 + 2 * u                          # relative, of sqrt(v_hat) + eps

    leaves, treedef = jax.tree_util.tree_flatten(params)
    out = {k: [] for k in ("params", "mu", "nu", "b_params", "b_mu", "b_nu")}
    for p, mu, nu, gi in zip(leaves, *(treedef.flatten_up_to(x) for x in (adam.mu, adam.nu, g))):
        p, mu, nu = (np.asarray(x, np.float64) for x in (p, mu, nu))
        m = b1 * mu + (1 - b1) * c * gi
        v = b2 * nu + (1 - b2) * (c * gi) ** 2
        m_abs = b1 * np.abs(mu) + (1 - b1) * np.abs(c * gi)
        den = np.sqrt(v / bc2) + eps
        new_p = p - lr * (m / bc1) / den
        err_upd = lr * m_abs / (bc1 * den) * (6 * u + e1 + u + e_den + 3 * u)
        for k, x in (("params", new_p), ("mu", m), ("nu", v),
                     ("b_params", 1.01 * err_upd + u * np.abs(new_p)),
                     ("b_mu", 6 * u * m_abs), ("b_nu", 8 * u * v)):
            out[k].append(x)
    trees = {k: jax.tree_util.tree_unflatten(treedef, x) for k, x in out.items()}
    return ({k: trees[k] for k in ("params", "mu", "nu")},
            {k: trees["b_" + k] for k in ("params", "mu", "nu")})


def adam_step_tolerance(prev_state, grads, hp, max_grad_norm: float | None = 1.0):
    """(float64 step, per-output tolerance trees) for one float32 program's Adam step from
    prev_state on `grads`: its rounding bound plus what the float32 global norm's error
    (Higham-Mary, as sqnorm_bound) does through the clip."""
    step, bound = adam_step64(prev_state.params, prev_state.opt_state, grads, hp, max_grad_norm)
    n = sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(grads))
    delta = (LAMBDA * np.sqrt(n + TERM_ULPS) * EPS32 / 2) / 2 + 4 * EPS32 / 2
    for s in (1 + delta, 1 - delta):
        moved, _ = adam_step64(prev_state.params, prev_state.opt_state, grads, hp, max_grad_norm, s)
        bound = jax.tree.map(lambda b, x, y: b + np.abs(x - y), bound, moved, step)
    return step, bound


def assert_adam_step_close(got_state, want_state, prev_state, got_grads, want_grads, hp,
                           max_grad_norm: float | None = 1.0, detect: float = DETECT) -> None:
    """Two programs took one Adam step from the same prev_state, on gradients got_grads and
    want_grads (each measured; compare those separately): their params and moments agree to
    |step64(got) - step64(want)| + |bound(got)| + |bound(want)|, the exact float64 effect of
    the gradients' difference plus each program's derived float32 rounding (adam_step64).
    No factor measured on a machine enters; detect caps the rounding part at a fraction of
    the step, so the check keeps its power."""
    s_got, b_got = adam_step_tolerance(prev_state, got_grads, hp, max_grad_norm)
    s_want, b_want = adam_step_tolerance(prev_state, want_grads, hp, max_grad_norm)
    prev_adam = _adam_state(prev_state.opt_state)
    got_adam, want_adam = _adam_state(got_state.opt_state), _adam_state(want_state.opt_state)
    pairs = dict(params=(got_state.params, want_state.params, prev_state.params),
                 mu=(got_adam.mu, want_adam.mu, prev_adam.mu),
                 nu=(got_adam.nu, want_adam.nu, prev_adam.nu))
    for k, (got, want, prev) in pairs.items():
        known = tree_diff(s_got[k], s_want[k])
        rounding = tree_norm(b_got[k]) + tree_norm(b_want[k])
        scale = tree_diff(want, prev)
        assert rounding <= detect * scale, (
            f"{k}: rounding bound {rounding:.3g} exceeds {detect:g} of the step {scale:.3g}")
        tol = known + rounding
        diff = tree_diff(got, want)
        _log(f"adam_{k}", diff, tol, scale)
        assert diff <= tol, (f"{k}: |got - want| = {diff:.3g} > {tol:.3g} (gradients' effect "
                             f"{known:.3g}, rounding {rounding:.3g}, step {scale:.3g})")


def reorder_floor(reference, *reorders) -> float:
    """The largest spread between the reference and the same computation in other orders."""
    return max(tree_diff(r, reference) for r in reorders)


def _log(kind: str, measured: float, tol: float, scale: float) -> None:
    path = os.environ.get("JAXRL_TOL_LOG")
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        with open(path, "a") as f:
            f.write(json.dumps(dict(test=test, kind=kind, measured=float(measured), tol=float(tol),
                                    scale=float(scale), ratio=float(measured / tol) if tol else None)) + "\n")


def assert_tree_close(got, want, floor: float, scale: float, detect: float = DETECT,
                      known: float = 0.0) -> None:
    """got equals want up to rounding: |got - want| <= SAFETY * floor (at least a few ulps of
    scale) plus `known`, a difference computed exactly from measured inputs; the tolerance
    must itself stay under detect * scale."""
    tol = tree_tol(floor, scale) + known
    assert tol <= detect * scale, (
        f"tolerance {tol:.3g} exceeds {detect:g} of the scale {scale:.3g}: the check could no "
        "longer tell rounding from a bug")
    diff = tree_diff(got, want)
    _log("tree", diff, tol, scale)
    assert diff <= tol, f"|got - want| = {diff:.3g} > {tol:.3g} (floor {floor:.3g}, scale {scale:.3g})"


def assert_sum_close(got, want, n_terms: int, abs_sum: float, detect: float | None = None
                     ) -> None:
    """Two evaluations of one float32 sum (a loss, a mean metric) agree to sum_bound; detect,
    when given, is a difference a real bug would make and must exceed the bound."""
    tol = sum_bound(n_terms, abs_sum)
    if detect is not None:
        assert tol < detect, f"bound {tol:.3g} would hide a difference of {detect:.3g}"
    diff = float(np.max(np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))))
    _log("sum", diff, tol, abs_sum)
    assert diff <= tol, f"|got - want| = {diff:.3g} > {tol:.3g} (n={n_terms}, sum|x|={abs_sum:.3g})"


def assert_sqnorm_close(got_sqnorm, want_grads, floor: float) -> None:
    """A float32 squared norm the step reports equals |want_grads|^2 up to sqnorm_bound, the
    gradients being allowed tree_tol(floor) apart."""
    want = tree_norm(want_grads) ** 2
    n = sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(want_grads))
    tol = sqnorm_bound(n, want, tree_tol(floor, np.sqrt(want)))
    assert tol <= 2 * DETECT * want, f"bound {tol:.3g} too loose for |g|^2 = {want:.3g}"
    diff = abs(float(got_sqnorm) - want)
    _log("sqnorm", diff, tol, want)
    assert diff <= tol, f"|got - want| = {diff:.3g} > {tol:.3g} (|g|^2 = {want:.3g}, n = {n})"


def permute_mlp(params, seed: int = 1):
    """The same decoder with its MLP's hidden units in another order (columns of w_gate and
    w_up, rows of w_down): every output is mathematically unchanged, but the down
    projection sums its F terms in another order. Forwards with these params measure the
    rounding floor of a forward (reorder_floor), as a batch reordering does for an update."""
    layers = dict(params["layers"])
    F = layers["w_down"].shape[-2]
    perm = np.random.default_rng(seed).permutation(F)
    layers["w_gate"] = layers["w_gate"][..., perm]
    layers["w_up"] = layers["w_up"][..., perm]
    layers["w_down"] = layers["w_down"][..., perm, :]
    return {**params, "layers": layers}


def tiny_qwen2(cls: str = "Qwen2ForCausalLM", seed: int = 0, **config):
    """A tiny transformers Qwen2 model (``cls``: Qwen2ForCausalLM, Qwen2ForSequenceClassification)
    with every parameter random: norms near 1, biases and weights small, so a weight-mapping
    error shows in its outputs. ``config``: Qwen2Config fields over a 2-layer, width-32 base.
    Needs torch and transformers (the caller skips without them)."""
    import torch
    import transformers
    kw = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
              tie_word_embeddings=False)
    kw.update(config)
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(transformers.Qwen2Config(**kw)).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.2 if "norm" in name else 0.1 if name.endswith("bias") else 0.08
            p.copy_((1.0 if "norm" in name else 0.0) + scale * torch.randn_like(p))
    return model
