"""Hugging Face checkpoint I/O: safetensors <-> params pytree (config.json <-> ModelConfig and
the supported families: models/hf_config.py).

HF stores torch Linear weights as [out, in]; our layout (decoder.py) stores [in, ...out]:
  wq [D, N, H] = q_proj.weight.T.reshape(D, N, H);  wo [N, H, D] = o_proj.weight.T.reshape(N, H, D)
  w_gate/w_up [D, F] = weight.T;  w_down [F, D] = down_proj.weight.T;  lm_head [D, V] = weight.T
  MoE: router [D, E] = mlp.gate.weight.T; expert_gate[e] / expert_up[e] [D, F] =
  mlp.experts.{e}.gate_proj / up_proj .weight.T; expert_down[e] [F, D] = down_proj.weight.T.
  That per-expert layout is what transformers 5.x writes to disk (it fuses the experts into
  3-D gate_up_proj [E, 2F, D] / down_proj [E, D, F] parameters only in memory); load_hf also
  reads checkpoints stored in that fused layout. save_hf writes the per-expert one.

Every check (architecture, config.json's field types, tensor names, shapes, each safetensors
header against its file's size) runs on config.json and the safetensors headers before any
tensor data is read (`check_hf`): a truncated or corrupt file, or a config.json that does not
describe a model, is an HFCheckpointError (a ValueError) naming the file, and nothing of the
checkpoint is used.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Callable, Iterator

import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from jaxrl_scale.models.config import ModelConfig
from jaxrl_scale.models.decoder import Params, param_shapes
from jaxrl_scale.models.hf_config import (CheckpointNotFoundError, HFCheckpointError,
                                          config_from_hf, config_to_hf, read_config_json,
                                          read_json_object)
from jaxrl_scale.numbers import write_json

__all__ = ["load_hf", "check_hf", "save_hf", "config_from_hf", "config_to_hf",
           "HFCheckpointError", "CheckpointNotFoundError"]

_err = HFCheckpointError


SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


# ----------------------------------------------------------------------------- name mapping

def _ident(a):
    return a


def _spec(cfg: ModelConfig, fused_experts: bool = False
          ) -> list[tuple[tuple[str, ...], str, tuple[int, ...], Callable, Callable]]:
    """(our path, HF name, HF shape, hf->ours, ours->hf) for every tensor. A name with one
    "{}" is one tensor per layer, with two ("{}" layer, "{}" expert) one per layer and expert.
    fused_experts: the experts as transformers 5's in-memory 3-D tensors (load only)."""
    D, V, F = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

    def lin_in(*out):  # torch [out, in] -> ours [in, *out]
        return (lambda a: a.T.reshape(a.shape[1], *out),
                lambda a: a.reshape(a.shape[0], -1).T)

    def lin_out(*inn):  # torch [out, in] -> ours [*in, out]  (o_proj)
        return (lambda a: a.T.reshape(*inn, a.shape[0]),
                lambda a: a.reshape(-1, a.shape[-1]).T)

    def vec(*shape):
        return (lambda a: a.reshape(shape), lambda a: a.reshape(-1))

    att = "model.layers.{}.self_attn."
    mlp = "model.layers.{}.mlp."
    layer = [
        ("attn_norm", "model.layers.{}.input_layernorm.weight", (D,), (_ident, _ident)),
        ("wq", att + "q_proj.weight", (N * H, D), lin_in(N, H)),
        ("wk", att + "k_proj.weight", (K * H, D), lin_in(K, H)),
        ("wv", att + "v_proj.weight", (K * H, D), lin_in(K, H)),
        ("wo", att + "o_proj.weight", (D, N * H), lin_out(N, H)),
        ("mlp_norm", "model.layers.{}.post_attention_layernorm.weight", (D,), (_ident, _ident)),
    ]
    if not cfg.num_experts:
        layer += [
            ("w_gate", mlp + "gate_proj.weight", (F, D), (np.transpose, np.transpose)),
            ("w_up", mlp + "up_proj.weight", (F, D), (np.transpose, np.transpose)),
            ("w_down", mlp + "down_proj.weight", (D, F), (np.transpose, np.transpose)),
        ]
    elif fused_experts:
        E, Fe = cfg.num_experts, cfg.moe_intermediate_size
        swap = (lambda a: np.swapaxes(a, -1, -2))
        layer += [
            ("router", mlp + "gate.weight", (E, D), (np.transpose, np.transpose)),
            ("expert_gate", mlp + "experts.gate_up_proj", (E, 2 * Fe, D),
             (lambda a: swap(a[:, :Fe]), None)),
            ("expert_up", mlp + "experts.gate_up_proj", (E, 2 * Fe, D),
             (lambda a: swap(a[:, Fe:]), None)),
            ("expert_down", mlp + "experts.down_proj", (E, D, Fe), (swap, None)),
        ]
    else:
        E, Fe = cfg.num_experts, cfg.moe_intermediate_size
        ex = mlp + "experts.{}."
        layer += [
            ("router", mlp + "gate.weight", (E, D), (np.transpose, np.transpose)),
            ("expert_gate", ex + "gate_proj.weight", (Fe, D), (np.transpose, np.transpose)),
            ("expert_up", ex + "up_proj.weight", (Fe, D), (np.transpose, np.transpose)),
            ("expert_down", ex + "down_proj.weight", (D, Fe), (np.transpose, np.transpose)),
        ]
    if cfg.attention_bias:
        layer += [("bq", att + "q_proj.bias", (N * H,), vec(N, H)),
                  ("bk", att + "k_proj.bias", (K * H,), vec(K, H)),
                  ("bv", att + "v_proj.bias", (K * H,), vec(K, H))]
    if cfg.o_bias:
        layer += [("bo", att + "o_proj.bias", (D,), (_ident, _ident))]
    if cfg.qk_norm:
        layer += [("q_norm", att + "q_norm.weight", (H,), (_ident, _ident)),
                  ("k_norm", att + "k_norm.weight", (H,), (_ident, _ident))]
    spec = [(("embed",), "model.embed_tokens.weight", (V, D), _ident, _ident)]
    spec += [(("layers", k), n, s, f, b) for k, n, s, (f, b) in layer]
    spec.append((("final_norm",), "model.norm.weight", (D,), _ident, _ident))
    if not cfg.tie_word_embeddings:
        spec.append((("lm_head",), "lm_head.weight", (V, D), np.transpose, np.transpose))
    return spec


def _indices(cfg, name) -> list[tuple[int, ...]]:
    """The format arguments of `name`: (), (layer,) or (layer, expert)."""
    n = name.count("{}")
    if n == 2:
        return [(i, e) for i in range(cfg.num_layers) for e in range(cfg.num_experts)]
    return [(i,) for i in range(cfg.num_layers)] if n == 1 else [()]


def _names(cfg, name):
    return [name.format(*ix) for ix in _indices(cfg, name)]


# ----------------------------------------------------------------------------- load


def _weight_map(path: str) -> dict[str, str]:
    """tensor name -> safetensors file (absolute path)."""
    index = os.path.join(path, INDEX_FILE)
    single = os.path.join(path, SINGLE_FILE)
    if os.path.isfile(index):
        wm = read_json_object(index).get("weight_map")
        if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
            raise _err(f"{index} has no 'weight_map' dict of tensor name -> file name.")
        for fname in sorted(set(wm.values())):
            if not os.path.isfile(os.path.join(path, fname)):
                raise CheckpointNotFoundError(
                        f"shard {fname!r} listed in {index} does not exist.")
        return {k: os.path.join(path, v) for k, v in wm.items()}
    if os.path.isfile(single):
        return {k: single for k in safetensors_header(single)}
    raise CheckpointNotFoundError(
            f"no weights in {path}: expected {SINGLE_FILE} or {INDEX_FILE} (only safetensors "
            "checkpoints are supported).")


# bytes per element of the safetensors dtypes this loader reads; the format's others
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
                "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
                "I64": 8, "U64": 8, "F64": 8}
_DTYPES_NOT_READ = ("F4", "F6_E2M3", "F6_E3M2", "C64")
_HEADER_MAX = 100 * 2 ** 20   # safetensors' own limit on the header's JSON


def safetensors_header(fname: str) -> dict[str, dict]:
    """{tensor name: {"dtype", "shape", "data_offsets"}} of a safetensors file, read and checked
    without the library: the 8-byte header length, the header's JSON, and every tensor's byte
    span against its shape and dtype, the spans tiling the data exactly to the end of the file.
    A truncated or corrupt file is an HFCheckpointError naming it, before any tensor is read
    (so nothing of it is used)."""
    size = os.path.getsize(fname)

    def bad(why: str) -> HFCheckpointError:
        return _err(f"{fname} is truncated or corrupt: {why}.")

    with open(fname, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise bad(f"{size} bytes, less than the 8-byte header length")
        n = int.from_bytes(head, "little")
        if n > min(size - 8, _HEADER_MAX):
            raise bad(f"the header length field says {n} bytes, " + (
                f"the file has {size - 8} after it" if n > size - 8 else
                f"over the format's {_HEADER_MAX >> 20} MiB limit"))
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except ValueError as e:
        raise bad(f"its header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise bad(f"its header is a JSON {type(header).__name__}, not an object")
    header.pop("__metadata__", None)
    spans = []
    for name, t in header.items():
        try:
            dtype, shape, (begin, end) = t["dtype"], list(t["shape"]), t["data_offsets"]
            ok = isinstance(dtype, str) and begin <= end and all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0
                for x in (*shape, begin, end))
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise bad(f"tensor {name!r} has a malformed header entry {str(t)[:120]}")
        if dtype in _DTYPES_NOT_READ:
            raise _err(f"{fname}: tensor {name!r} has dtype {dtype}, which this loader does "
                       f"not read (it reads {', '.join(_DTYPE_BYTES)}).")
        if dtype not in _DTYPE_BYTES:
            raise bad(f"tensor {name!r} has dtype {dtype[:20]!r}, which safetensors does not "
                      "define")
        if end - begin != math.prod(shape) * _DTYPE_BYTES[dtype]:
            raise bad(f"tensor {name!r} ({dtype} {shape}) spans {end - begin} bytes, its shape "
                      f"needs {math.prod(shape) * _DTYPE_BYTES[dtype]}")
        spans.append((begin, end, name))
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            raise bad(f"tensor {name!r}'s data starts at byte {begin} of the data, expected {at}")
        at = end
    if 8 + n + at != size:
        raise bad(f"the header describes {at} bytes of tensor data, the file holds "
                  f"{size - 8 - n}")
    return header


def _header_shapes(weight_map: dict[str, str]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    by_file: dict[str, list[str]] = {}
    for name, fname in weight_map.items():
        by_file.setdefault(fname, []).append(name)
    for fname, names in by_file.items():
        header = safetensors_header(fname)
        for name in names:
            if name not in header:
                raise _err(f"tensor {name!r} is listed in the index for "
                           f"{os.path.basename(fname)} but that file does not hold it.")
            shapes[name] = tuple(header[name]["shape"])
    return shapes


def _checked(path: str, dtype: Any, compute_dtype: Any):
    """(ModelConfig, weight map, tensor spec): every check of `check_hf`."""
    if not os.path.isdir(path):
        raise CheckpointNotFoundError(f"HF checkpoint directory {path} does not exist.")
    cfg = config_from_hf(read_config_json(path), dtype=dtype, compute_dtype=compute_dtype)
    weight_map = _weight_map(path)
    shapes = _header_shapes(weight_map)
    fused = cfg.num_experts > 0 and "model.layers.0.mlp.experts.down_proj" in shapes
    spec = _spec(cfg, fused_experts=fused)

    expected = set()
    for _, name, shape, _, _ in spec:
        for n in _names(cfg, name):
            expected.add(n)
            if n not in shapes:
                where = (os.path.join(path, INDEX_FILE) if os.path.isfile(
                    os.path.join(path, INDEX_FILE)) else os.path.join(path, SINGLE_FILE))
                raise _err(f"tensor {n!r} is missing from {where} (needed by "
                           f"model_type={cfg.arch!r}).")
            if shapes[n] != shape:
                raise _err(f"tensor {n!r} in {os.path.basename(weight_map[n])} has shape "
                           f"{list(shapes[n])}, expected {list(shape)} from config.json.")
    allowed = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    extra = sorted(n for n in shapes if n not in expected and n not in allowed
                   and not n.endswith("rotary_emb.inv_freq"))
    if extra:
        more = f" (+{len(extra) - 5} more)" if len(extra) > 5 else ""
        raise _err(f"unexpected tensors in {path} for model_type={cfg.arch!r}: "
                   f"{extra[:5]}{more}; is config.json right for these weights?")
    return cfg, weight_map, spec


def check_hf(path, *, dtype: Any = None, compute_dtype: Any = None) -> ModelConfig:
    """The ModelConfig of the HF checkpoint directory `path` after every check `load_hf` makes
    before it reads tensor data: config.json (architecture, field types), each safetensors
    file's header against the file's size, the tensor names and shapes against config.json.
    Reads config.json and the headers only (cheap at any model size); HFCheckpointError
    naming the file otherwise."""
    return _checked(os.fspath(path), dtype, compute_dtype)[0]


def load_hf(path, *, dtype: Any = None, compute_dtype: Any = None
            ) -> tuple[ModelConfig, Params]:
    """Load an HF checkpoint directory -> (ModelConfig, params).

    Reads config.json and model.safetensors or a sharded model.safetensors.index.json. `dtype`
    (default float32) is the param dtype, `compute_dtype` (default `dtype`) the matmuls'.
    Raises HFCheckpointError (a ValueError) naming the problem (unsupported architecture,
    a config.json field of the wrong type, missing / unexpected tensor, wrong shape, missing,
    truncated or corrupt file) before reading any tensor data (`check_hf`).
    """
    cfg, weight_map, spec = _checked(os.fspath(path), dtype, compute_dtype)

    np_dt = np.dtype(jnp.dtype(cfg.param_dtype))
    handles: dict[str, Any] = {}

    def get(name):
        fname = weight_map[name]
        try:   # the headers are checked: only a file changed since then fails here
            if fname not in handles:
                handles[fname] = safe_open(fname, framework="np")
            return handles[fname].get_tensor(name)
        except SafetensorError as e:
            raise _err(f"{fname}: cannot read tensor {name!r} ({e}).") from None

    ours = param_shapes(cfg)
    params: Params = {"layers": {}}
    try:
        for key, name, _, to_ours, _ in spec:
            target = ours[key[0]] if len(key) == 1 else ours["layers"][key[1]]
            if "{}" in name:  # stacked over layers (and experts), filled one at a time
                out = np.empty(target, np_dt)
                for ix in _indices(cfg, name):
                    out[ix] = to_ours(get(name.format(*ix))).astype(np_dt, copy=False)
            else:
                out = np.ascontiguousarray(to_ours(get(name)).astype(np_dt, copy=False))
            assert out.shape == tuple(target), (key, out.shape, target)
            arr = jnp.asarray(out)
            del out
            if len(key) == 1:
                params[key[0]] = arr
            else:
                params["layers"][key[1]] = arr
    finally:
        for h in handles.values():
            try:
                h.__exit__(None, None, None)
            except Exception:  # pragma: no cover - older safetensors handles need no closing
                pass
    return cfg, params


# ----------------------------------------------------------------------------- save

def _hf_tensors(cfg: ModelConfig, params: Params) -> Iterator[tuple[str, tuple, Callable]]:
    """(HF name, HF shape, thunk producing the numpy tensor) in a stable order."""
    for key, name, shape, _, to_hf in _spec(cfg):
        arr = params[key[0]] if len(key) == 1 else params["layers"][key[1]]
        if "{}" in name:
            for ix in _indices(cfg, name):
                yield (name.format(*ix), shape,
                       lambda arr=arr, ix=ix, to_hf=to_hf: to_hf(np.asarray(arr[ix])))
        else:
            yield name, shape, lambda arr=arr, to_hf=to_hf: to_hf(np.asarray(arr))


def save_hf(path, cfg: ModelConfig, params: Params, *, max_shard_bytes: int | None = None,
            extra_config: dict | None = None) -> None:
    """Write an HF checkpoint directory (config.json + safetensors) that
    `transformers.AutoModelForCausalLM.from_pretrained(path)` and `load_hf` read back.

    Tensors are stored in the dtype of the params. With `max_shard_bytes`, weights are split
    into model-0000i-of-0000n.safetensors files plus model.safetensors.index.json.
    `extra_config` entries (e.g. bos_token_id, eos_token_id) are added to config.json.
    """
    path = os.fspath(path)
    shapes = param_shapes(cfg)
    for key, want in [(("embed",), shapes["embed"]), (("final_norm",), shapes["final_norm"])] + [
            (("layers", k), v) for k, v in shapes["layers"].items()] + (
            [(("lm_head",), shapes["lm_head"])] if "lm_head" in shapes else []):
        node = params.get(key[0]) if len(key) == 1 else params.get("layers", {}).get(key[1])
        if node is None:
            raise ValueError(f"params is missing {'/'.join(key)} needed by the ModelConfig.")
        if tuple(node.shape) != tuple(want):
            raise ValueError(f"params {'/'.join(key)} has shape {tuple(node.shape)}, expected "
                             f"{tuple(want)} from the ModelConfig.")
    os.makedirs(path, exist_ok=True)
    dt = jnp.dtype(params["embed"].dtype)
    hf_cfg = config_to_hf(cfg)
    hf_cfg["torch_dtype"] = hf_cfg["dtype"] = dt.name
    hf_cfg.update(extra_config or {})
    write_json(os.path.join(path, "config.json"), hf_cfg, indent=2, sort_keys=True)

    tensors = list(_hf_tensors(cfg, params))
    itemsize = np.dtype(dt).itemsize
    shards: list[list] = [[]]
    size = 0
    for t in tensors:
        nbytes = int(np.prod(t[1])) * itemsize
        if max_shard_bytes and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += nbytes
    meta = {"format": "pt"}
    for stale in os.listdir(path):  # an older save could leave conflicting weight files
        if (stale.startswith("model") and stale.endswith(".safetensors")) or stale == INDEX_FILE:
            os.remove(os.path.join(path, stale))
    if len(shards) == 1:
        save_file({n: np.ascontiguousarray(make()) for n, _, make in shards[0]},
                  os.path.join(path, SINGLE_FILE), metadata=meta)
        return
    weight_map = {}
    for j, shard in enumerate(shards):
        fname = f"model-{j + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: np.ascontiguousarray(make()) for n, _, make in shard},
                  os.path.join(path, fname), metadata=meta)
        weight_map.update({n: fname for n, _, _ in shard})
    total = sum(int(np.prod(s)) * itemsize for _, s, _ in tensors)
    write_json(os.path.join(path, INDEX_FILE),
               {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
