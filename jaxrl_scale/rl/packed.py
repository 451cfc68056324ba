"""Token-budget micro-batches: the GRPO update on packed rows (`--token_budget`).

The padded update runs every row at T = max_prompt_len + max_new_tokens columns; with
long-tailed responses most of those are padding. Here each row's valid tokens (its prompt and
response, no padding) are laid end to end in rows of L = token_budget tokens (models/packing.py:
segments attend only within themselves, positions restart per segment), a micro-batch is D
such rows (D = the data-parallel size, one row per shard), and the number of micro-batches per
update follows the batch's lengths. L is rounded up to a multiple of the padded row length
T: a sequence then lies within two consecutive T-blocks of its row, and attention runs over
those 2T keys only (models/packing.segment_attention), so a long packed row costs no more
attention per token than the padded rows. Every micro-batch has the shape [D, L], so the gradient
function compiles once; a host loop sums the micro-batches' gradients and one optimizer step
applies them (verl `use_dynamic_bsz` + `ppo_max_token_len_per_gpu`, TRL `padding_free`).

The same update as the padded one: advantages come from the whole batch and the loss weights
w (rl/steps.token_weights: the aggregation's normaliser of the whole (mini)batch) are
computed on the padded batch first, then moved with every token-aligned field to the packed
layout, so the micro-batches' gradients sum to the full batch's (tests/test_packing.py). Rows
the loss does not see (filtered groups) are left out: their weight is zero.

Placement (`plan_packing`): whole groups, first-fit decreasing by the group's tokens; a group's
G sequences share one micro-batch (as the padded micro-batches keep groups whole) and may
span its D rows. Shapes: B rows, T padded columns, S = T - 1 actions, M micro-batches, D rows
of a micro-batch, L = token_budget.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_scale import sharding as shd
from jaxrl_scale.models.decoder import hidden_states, logits_from_hidden
from jaxrl_scale.rl import steps
from jaxrl_scale.rl.config import StepOptions
from jaxrl_scale.rl.microbatch import apply_grads, f32, sqnorm

sg = jax.lax.stop_gradient
# token-aligned fields of the update data (steps._actor_data's action-frame fields, shifted)
_FIELDS = ("mask", "w", "old_logp", "adv", "ref_logp", "prox_logp")


@dataclasses.dataclass(frozen=True)
class PackPlan:
    """Where each packed token comes from: src_MDL = flat index b * T + t into the [B, T]
    batch (-1 on padding), seg_MDL = its sequence's number within the packed row (0:
    padding)."""
    src_MDL: np.ndarray
    seg_MDL: np.ndarray

    @property
    def micro_batches(self) -> int:
        return self.src_MDL.shape[0]

    @property
    def pad_frac(self) -> float:
        """Share of the packed token slots that hold padding."""
        return float((self.src_MDL < 0).mean()) if self.src_MDL.size else 0.0

    def pack(self, x_BT: np.ndarray) -> np.ndarray:
        """[B, T] -> [M, D, L] (0 on padding)."""
        flat = np.asarray(x_BT).reshape(-1)
        return np.where(self.src_MDL >= 0, flat[np.maximum(self.src_MDL, 0)],
                        0).astype(flat.dtype)


def plan_packing(valid_BT: np.ndarray, keep_B: np.ndarray, group_size: int, rows: int,
                 budget: int) -> PackPlan:
    """First-fit decreasing of whole groups into micro-batches of `rows` rows of `budget`
    tokens; only rows with keep_B. A ValueError when a group cannot fit an empty micro-batch
    (config.check_packing rules that out before a run)."""
    valid_BT = np.asarray(valid_BT, bool)
    B, T = valid_BT.shape
    G, D, L = int(group_size), int(rows), int(budget)
    idx_B = [np.flatnonzero(valid_BT[b]) for b in range(B)]
    groups = [[b for b in range(g * G, (g + 1) * G) if keep_B[b]] for g in range(B // G)]
    groups = sorted((grp for grp in groups if grp),
                    key=lambda grp: -sum(idx_B[b].size for b in grp))
    micro: list[list[list[int]]] = []   # [micro-batch][row] -> rows b of the batch, in order
    used: list[list[int]] = []

    def place(m: int, grp: list[int]) -> bool:
        fill = list(used[m])
        where = []
        for b in sorted(grp, key=lambda b: -idx_B[b].size):
            d = next((d for d in range(D) if fill[d] + idx_B[b].size <= L), None)
            if d is None:
                return False
            fill[d] += idx_B[b].size
            where.append((d, b))
        for d, b in where:
            micro[m][d].append(b)
        used[m] = fill
        return True

    for grp in groups:
        if not any(place(m, grp) for m in range(len(micro))):
            micro.append([[] for _ in range(D)])
            used.append([0] * D)
            if not place(len(micro) - 1, grp):
                raise ValueError(f"a group of {len(grp)} sequences "
                                 f"({sum(idx_B[b].size for b in grp)} tokens) does not fit "
                                 f"{D} row(s) of token_budget={L}")
    if not micro:   # nothing in the loss: one empty micro-batch (zero gradient, every metric)
        micro = [[[] for _ in range(D)]]
    src = np.full((len(micro), D, L), -1, np.int64)
    seg = np.zeros((len(micro), D, L), np.int32)
    for m, mb in enumerate(micro):
        for d, row in enumerate(mb):
            at = 0
            for k, b in enumerate(row, 1):
                n = idx_B[b].size
                src[m, d, at:at + n] = b * T + idx_B[b]
                seg[m, d, at:at + n] = k
                at += n
    return PackPlan(src, seg)


def min_budget(seq_len: int, group_size: int, rows: int) -> int:
    """The smallest token_budget that fits any group of `group_size` sequences of up to
    `seq_len` tokens in `rows` rows, whatever the lengths: ceil(G / D) full sequences a row."""
    return -(-int(group_size) // int(rows)) * int(seq_len)


def _data(batch, o: StepOptions) -> dict[str, jax.Array]:
    """The padded update's data (steps._actor_data: advantages from the whole batch)."""
    adv_BS = steps._grpo_advantages_BS(batch, o.group_size, o.loss_cfg.advantage,
                                       o.loss_cfg.adv_norm)
    return steps._actor_data(batch, adv_BS, o.loss_cfg)


def _micro_grads(params, mb: dict[str, jax.Array], o: StepOptions, window: int):
    """(float32 gradients, additive metrics, token sums, loss tokens) of one packed micro-batch
    [D, L]: logits at packed position l score token l + 1, whose fields sit at l + 1 (a
    segment's first token is a prompt token, outside every mask: nothing crosses segments)."""
    def loss_fn(p):
        h_DLH = hidden_states(o.cfg, p, mb["tokens"], remat=o.remat, segment_ids_BT=mb["seg"],
                              window=window)
        logits_DSV = logits_from_hidden(o.cfg, p, h_DLH)[:, :-1]
        frame = {f"{k}_BS": mb[k][:, 1:] for k in _FIELDS if k in mb}
        loss, additive, token_sums = steps.policy_terms(o.loss_cfg, logits_DSV,
                                                        mb["tokens"][:, 1:], frame)
        return loss, (dict(additive, loss=sg(loss)), token_sums)

    (_, (additive, token_sums)), g = jax.value_and_grad(loss_fn, has_aux=True)(params)
    return jax.tree.map(f32, g), additive, token_sums, jnp.sum(mb["mask"])


def _apply(state, grads, o: StepOptions):
    return apply_grads(state, grads, o.tx, o.lr_fn)


class PackedGRPO:
    """The GRPO update with token-budget micro-batches, called as update(state, batch) ->
    (state, metrics) like the padded step: metrics under the padded step's names
    (actor_loss, pg_loss, actor_grad_norm, tokens, lr, ...; no actor_grad_sqnorm_micro: the
    micro-batches differ in size) plus packed_microbatches and pad_frac. Several updates per
    rollout (o.num_minibatches, o.epochs) split the batch as the padded step does (whole
    groups, minibatch k = groups k, k + K, ...), each minibatch weighted and packed alone."""

    def __init__(self, options: StepOptions, token_budget: int, mesh=None):
        self.o, self.L, self.mesh = options, int(token_budget), mesh
        self.D = shd.data_parallel_size(mesh) if mesh is not None else 1
        o = options
        self._data = jax.jit(functools.partial(_data, o=o))
        self._grads = jax.jit(functools.partial(_micro_grads, o=o), static_argnames="window")
        self._apply = jax.jit(functools.partial(_apply, o=o))
        self._add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b))

    def row_len(self, T: int) -> int:
        """The packed row length for padded rows of T: the budget rounded up to a multiple of
        T, the block of the packed attention (models/packing.segment_attention)."""
        return -(-self.L // T) * T

    def warm(self, state, batch) -> None:
        """Compile every piece on `batch`'s shapes and an empty micro-batch (results
        discarded): a run's clock then never times a compile."""
        data = jax.device_get(self._data(batch))
        T = data["tokens_BT"].shape[1]
        L = self.row_len(T)
        mb = {k: np.zeros((self.D, L), np.float32) for k in _FIELDS
              if f"{k}_BS" in data or k == "w"}
        mb.update(tokens=np.zeros((self.D, L), np.int32), seg=np.zeros((self.D, L), np.int32))
        out = self._grads(state.params, self._put(mb), window=T)
        self._add(out, out)
        self._apply(state, out[0])

    def _put(self, x):
        return x if self.mesh is None else jax.device_put(x, shd.batch_sharding(self.mesh))

    def __call__(self, state, batch):
        o = self.o
        data = jax.device_get(self._data(batch))
        pad = functools.partial(np.pad, pad_width=((0, 0), (1, 0)))   # action frame -> tokens
        cols = {k: pad(np.asarray(data[f"{k}_BS"], np.float32)) for k in _FIELDS
                if f"{k}_BS" in data and k != "w"}
        B, K, G = len(data["tokens_BT"]), o.num_minibatches, o.group_size
        group_B = np.arange(B) // G
        per_update, n_micro, pads = [], 0, []
        for _ in range(o.epochs):
            for k in range(K):
                rows = np.flatnonzero(group_B % K == k)
                state, m, plan = self._one_update(state, data, cols, rows)
                per_update.append(m)
                n_micro += plan.micro_batches
                pads.append(plan.pad_frac)
        metrics = per_update[0] if len(per_update) == 1 else \
            {k: np.stack([m[k] for m in per_update]) for k in per_update[0]}
        metrics.update(packed_microbatches=n_micro, pad_frac=float(np.mean(pads)))
        return state, metrics

    def _one_update(self, state, data, cols, rows):
        o = self.o
        mask_BS = jnp.asarray(data["mask_BS"][rows])
        w_BT = np.pad(np.asarray(steps.token_weights(mask_BS, o.loss_cfg.agg, o.group_size)),
                      ((0, 0), (1, 0)))
        keep_B = np.asarray(data["mask_BS"][rows]).any(axis=1)
        T = data["tokens_BT"].shape[1]
        plan = plan_packing(data["valid_BT"][rows], keep_B, o.group_size, self.D,
                            self.row_len(T))
        packed = {k: plan.pack(v[rows]) for k, v in cols.items()}
        packed.update(w=plan.pack(w_BT), tokens=plan.pack(data["tokens_BT"][rows]),
                      seg=plan.seg_MDL)
        acc = None   # (grads, additive, token sums, loss tokens), summed on the device
        for m in range(plan.micro_batches):
            out = self._grads(state.params, self._put({k: v[m] for k, v in packed.items()}),
                              window=T)
            acc = out if acc is None else self._add(acc, out)
        grads, additive, token_sums, n_tok = acc
        new_state, opt = self._apply(state, grads)
        # several updates per rollout: a minibatch of filtered groups only makes no update
        # (as microbatch.multi_update; Adam's momentum would move the params on a zero grad)
        multi = o.num_minibatches * o.epochs > 1
        empty = multi and not keep_B.any()
        state = state if empty else new_state
        n_tok = float(n_tok)
        metrics = dict(jax.device_get(additive))
        metrics.update({k: float(v) / max(n_tok, 1.0)
                        for k, v in jax.device_get(token_sums).items()})
        sq = float(sqnorm(grads))
        metrics.update(grad_sqnorm=sq, grad_norm=float(np.sqrt(sq)), tokens=n_tok,
                       **jax.device_get(opt))
        if multi:
            metrics["empty_minibatch"] = float(empty)
        return state, steps._named(metrics, "actor"), plan


__all__ = ["PackPlan", "PackedGRPO", "min_budget", "plan_packing"]
