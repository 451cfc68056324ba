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
- ``adam_propagated``: params compared after one Adam step differ by what Adam makes of the
  two programs' measured gradient difference (entries with |g| ~ eps amplify it up to lr / eps);
  it is computed exactly from the gradients and added to the tolerance.
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


def adam_first_step(grads, lr: float, eps: float = 1e-8, max_grad_norm: float | None = 1.0):
    """Adam's first update in float64: clip_by_global_norm, then -lr g / (|g| + eps) (the
    bias-corrected moments of one step are g and g^2)."""
    norm = tree_norm(grads)
    c = min(1.0, max_grad_norm / norm) if max_grad_norm else 1.0
    return jax.tree.map(lambda g: -lr * c * np.asarray(g, np.float64)
                        / (np.abs(c * np.asarray(g, np.float64)) + eps), grads)


def adam_propagated(grads_a, grads_b, lr: float, **kw) -> float:
    """What one Adam step makes of a measured gradient difference: entries that cancel to
    |g| ~ eps move by up to lr on a rounding-level change, so params compared after a step
    differ by this much more than the gradients' own rounding suggests."""
    return tree_diff(adam_first_step(grads_a, lr, **kw), adam_first_step(grads_b, lr, **kw))


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
    scale) plus `known`, a difference computed exactly from measured inputs (adam_propagated);
    the tolerance must itself stay under detect * scale."""
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
