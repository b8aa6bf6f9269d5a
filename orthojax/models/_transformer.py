r"""A decoder-only transformer language model with scanned blocks (GPT-2 / nanoGPT shape).

For tokens ``t_1 … t_T`` (row vectors, Flax's ``x @ W`` layout)::

    x⁰ = E[t]                                           (token embedding, no positions)
    xˡ⁺¹ = xˡ + Attn(RMSNorm(xˡ)) ,  then  xˡ⁺¹ += MLP(RMSNorm(xˡ⁺¹))     l = 0 … L−1
    logits = RMSNorm(xᴸ) W_head

* ``Attn``: ``q, k, v = x W_q, x W_k, x W_v`` split into ``heads`` heads, rotary
  position embedding on ``q`` and ``k`` (Su et al. 2021, eq. 34, rotate-half form), an
  optional RMSNorm of ``q`` and ``k`` per head (QK-norm; Dehghani et al. 2023),
  causal softmax attention through :func:`jax.nn.dot_product_attention` (the fused
  cuDNN kernel on GPUs), then ``W_o``;
* ``MLP``: ``φ(x W_in) W_out`` with ``W_in`` ``(width, mlp_ratio·width)``, GELU by default;
* RMSNorm (Zhang & Sennrich 2019) with a learned gain; no biases anywhere.

The ``L = depth`` blocks are one stack of arrays with a leading ``layers`` axis, applied
with :func:`jax.lax.scan`, so a 24-layer model traces and compiles one block. Q, K and
V are three separate square matrices, ``qkv`` of shape ``(layers, 3, width, width)``:
each is orthogonalized (Muon) or constrained (Stiefel) on its own, as Keller Jordan's
Muon does for its stacked ``(3, d, d)`` QKV. Every hidden matrix states its
:class:`~orthojax.linalg.MatrixView` on its Variable (``layers`` and the Q/K/V index are
batch axes), so :func:`orthojax.nn.matrix_views` hands the orthogonal optimizers their
views; the embedding, the head, the norms and the scales carry ``matrix_view=False``
and go to the Euclidean group — Muon's split (embeddings, head and gains on AdamW),
with no label tree to write.

Initialisation (GPT-2, Radford et al. 2019; nanoGPT): every matrix ``N(0, 0.02²)``, the
two residual projections ``W_o`` and ``W_out`` ``N(0, (0.02/√(2L))²)``, norm gains 1.

Stiefel-constrained hidden matrices (``stiefel=("attention", "mlp")`` or any of
:attr:`TransformerLM.MATRICES`): the matrix is ``W = V·s`` with ``V`` a
:class:`~orthojax.nn.StiefelParam` (orthonormal columns on the tall side) and ``s`` a
learned Euclidean scale — one per matrix (``scale="matrix"``, Sokol & Park 2020, App.
A.6.3) or one per output unit (``scale="output"``, ``W = V diag(s)``). ``V`` is a Haar
point and ``s = 0.02·√max(fan_in, fan_out)`` (the residual projections: divided by
``√(2L)``), which gives ``W`` the second moment of the Euclidean initialisation: a Haar
``V`` has ``E[V_ij²] = 1/max(fan_in, fan_out)``. The layer computes ``x (V·s)`` where
its input has at least as many rows as ``V`` (a language model's batch of tokens), else
``(x V)·s``: whichever scales the smaller array, and the first needs no second product for
the scale's gradient. ``oblique=`` does the same with unit-norm columns
(:class:`~orthojax.nn.ObliqueParam`).

Sharding: logical axes ``("layers", "qkv", "fan_in", "fan_out")`` for the hidden
matrices, ``("vocab", "embed")`` / ``("embed", "vocab")`` for the embedding and the head
(:mod:`orthojax.nn.sharding`); the trainer's rules map ``fan_out`` and ``embed`` to the
``fsdp`` mesh axis. ``remat=True`` recomputes each block in the backward pass
(:func:`jax.checkpoint`), the memory/compute trade production sizes need.

References:
  Vaswani et al., "Attention is all you need", NeurIPS 2017.
  Radford et al., "Language models are unsupervised multitask learners", 2019 (GPT-2).
  Su et al., "RoFormer: enhanced transformer with rotary position embedding", 2021.
  Zhang & Sennrich, "Root mean square layer normalization", NeurIPS 2019.
  Dehghani et al., "Scaling vision transformers to 22 billion parameters", ICML 2023
  (QK-norm).
  Jordan et al., "Muon: an optimizer for hidden layers in neural networks", 2024.
  Sokol & Park, "Information geometry of orthogonal initializations and training",
  ICLR 2020.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn import dtypes

from orthojax import manifolds
from orthojax.linalg import MatrixView
from orthojax.nn import ObliqueParam
from orthojax.nn import StiefelParam
from orthojax.nn import activation_fn
from orthojax.nn import check_choice
from orthojax.nn import sharding

_INIT_STD = 0.02   # GPT-2's
# The residual stream and the logits: the batch axis sharded like the batch, the rest whole.
_RESIDUAL = (sharding.BATCH, None, None)


def _normal(key: jax.Array, shape: Sequence[int], std: float, dtype: Any) -> jax.Array:
  return (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def rms_norm(x: jax.Array, gain: jax.Array, eps: float = 1e-6) -> jax.Array:
  r"""``x / √(mean(x²) + ε) · g`` over the last axis, in float32 whatever ``x``'s dtype."""
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
  return (y * gain.astype(jnp.float32)).astype(x.dtype)


def rotary(x: jax.Array, base: float = 10_000.0) -> jax.Array:
  r"""Rotary position embedding of ``x`` ``(batch, T, heads, head_dim)`` at positions 0…T−1.

  Pairs ``(x_i, x_{i+h/2})`` are rotated by the angle ``t·base^{−2i/h}`` (the rotate-half
  layout of GPT-NeoX and LLaMA; Su et al. 2021, eq. 34 up to a fixed permutation of
  the feature axis). The rotation makes ``⟨R_s q, R_t k⟩`` depend on ``t − s`` only.
  """
  t, half = x.shape[-3], x.shape[-1] // 2
  freqs = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angles = jnp.arange(t, dtype=jnp.float32)[:, None] * freqs[None, :]     # (T, half)
  cos, sin = jnp.cos(angles)[:, None, :], jnp.sin(angles)[:, None, :]     # (T, 1, half)
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


def _scales_weight(x: jax.Array, v: jax.Array) -> bool:
  """Whether a constrained layer scales its matrix (``x (V·s)``) rather than its output
  (``(x V)·s``): where ``x`` has at least as many rows (tokens) as ``V`` (its fan-in).
  Scaling the output costs element-wise work on the activations, and its gradient
  ``ds = Σ (x V) ⊙ δ`` needs the unscaled product ``x V`` again in the backward pass —
  with rematerialised blocks, one more matrix product per layer (+7 % of the step's
  FLOPs for the 1.3 B model). Scaling the matrix costs element-wise work on ``V``, and
  ``ds = Σ V ⊙ (xᵀ δ)`` reuses the weight gradient. A batch of fewer rows keeps the
  output scaled: there the matrix is the larger array."""
  return math.prod(x.shape[:-1]) >= v.shape[-2]


class TransformerLM(nnx.Module):
  r"""A decoder-only transformer language model (see the module docstring).

  Attributes:
    embed: ``(vocab_size, width)`` token embedding.
    qkv: ``(depth, 3, width, width)`` — ``W_q, W_k, W_v`` of every block.
    attn_out: ``(depth, width, width)`` — ``W_o``.
    mlp_in: ``(depth, width, mlp_ratio·width)``.
    mlp_out: ``(depth, mlp_ratio·width, width)``.
    attn_norm: ``(depth, width)`` RMSNorm gains before attention.
    mlp_norm: ``(depth, width)`` RMSNorm gains before the MLP.
    q_norm: ``(depth, head_dim)`` QK-norm gains of the queries (None without ``qk_norm``).
    k_norm: ``(depth, head_dim)`` the same for the keys.
    final_norm: ``(width,)``.
    head: ``(width, vocab_size)``.
    scales: ``{matrix name: s}`` of the constrained matrices (``(depth[, 3])`` or
      ``(depth[, 3], fan_out)``); empty for a Euclidean model.

  Args:
    vocab_size: number of tokens (the data's, supplied by the trainer; a larger value
      leaves the extra logits unused, as GPT-2's padded vocabulary does).
    depth: number of blocks ``L``.
    width: model width ``d``; a multiple of ``heads``.
    heads: attention heads; ``width / heads`` must be even (rotary pairs).
    mlp_ratio: MLP hidden width over ``width``.
    activation: the MLP's ``φ``, a name in :data:`orthojax.nn.ACTIVATIONS`.
    qk_norm: RMSNorm on queries and keys per head before the rotation.
    rope_base: the rotary base (10,000 in RoFormer).
    stiefel: the hidden matrices stored as :class:`~orthojax.nn.StiefelParam` with a
      learned scale: names of :attr:`MATRICES`, ``"attention"`` (``qkv``, ``attn_out``),
      ``"mlp"`` (``mlp_in``, ``mlp_out``) or ``"all"``.
    oblique: the same for :class:`~orthojax.nn.ObliqueParam` (disjoint from ``stiefel``).
    scale: ``"matrix"`` (one ``s`` per matrix) or ``"output"`` (one per output unit).
    learn_scale: train the scales (``nnx.Param``) or keep them fixed (``nnx.Variable``).
    remat: recompute each block in the backward pass (:func:`jax.checkpoint`).
    dtype: computation dtype (None: float32 parameters compute in float32).
    param_dtype: parameter dtype.
    rngs: ``nnx.Rngs`` with a ``params`` stream.

  Raises:
    ValueError: a size that does not fit (``width % heads``, an odd head dimension),
      an unknown or overlapping ``stiefel`` / ``oblique`` name — the embedding and the
      head cannot be constrained (they are Muon's AdamW group) — or an unknown
      ``scale`` / ``activation``.
  """

  INPUT = "tokens"
  """The form the trainer feeds data in, int32 token ids ``(batch, context)``."""
  MATRICES = ("qkv", "attn_out", "mlp_in", "mlp_out")
  """The hidden matrices, the ones an orthogonal optimizer or constraint may take."""
  GROUPS = {"attention": ("qkv", "attn_out"), "mlp": ("mlp_in", "mlp_out"),
            "all": MATRICES}
  """Shorthands for sets of :attr:`MATRICES` in ``stiefel=`` / ``oblique=``."""
  SCALES = ("matrix", "output")
  """Accepted ``scale`` names, one learned scale per matrix or per output unit."""

  def __init__(self, vocab_size: int, *, depth: int = 4, width: int = 128, heads: int = 4,
               mlp_ratio: int = 4, activation: str = "gelu", qk_norm: bool = False,
               rope_base: float = 10_000.0, stiefel: Sequence[str] | str = (),
               oblique: Sequence[str] | str = (), scale: str = "matrix",
               learn_scale: bool = True, remat: bool = False, dtype: Any = None,
               param_dtype: Any = jnp.float32, rngs: nnx.Rngs):
    for name, value in (("vocab_size", vocab_size), ("depth", depth), ("width", width),
                        ("heads", heads), ("mlp_ratio", mlp_ratio)):
      if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"TransformerLM: {name}={value!r} must be a positive integer")
    if width % heads or (width // heads) % 2:
      raise ValueError(f"TransformerLM: width={width} must be heads={heads} times an even "
                       f"head dimension (rotary pairs)")
    check_choice(scale, self.SCALES, "scale", where="TransformerLM")
    self.activation = activation_fn(activation, where="TransformerLM") or (lambda x: x)
    kinds = {m: "stiefel" for m in self._matrices("stiefel", stiefel)}
    for m in self._matrices("oblique", oblique):
      if m in kinds:
        raise ValueError(f"TransformerLM: {m} is named in both stiefel= and oblique=")
      kinds[m] = "oblique"
    self.vocab_size, self.depth, self.width, self.heads = (int(vocab_size), int(depth),
                                                           int(width), int(heads))
    self.hidden = int(mlp_ratio) * self.width
    self.rope_base, self.remat, self.dtype = float(rope_base), bool(remat), dtype
    self.constrained = kinds
    self.scale_kind = scale

    d, f, L = self.width, self.hidden, self.depth
    residual_std = _INIT_STD / math.sqrt(2 * L)
    shapes = {"qkv": ((L, 3, d, d), _INIT_STD, 2), "attn_out": ((L, d, d), residual_std, 1),
              "mlp_in": ((L, d, f), _INIT_STD, 1), "mlp_out": ((L, f, d), residual_std, 1)}
    self.scales = nnx.Dict()
    for name, (shape, std, batch_axes) in shapes.items():
      view = MatrixView.stacked(num_batch_axes=batch_axes)
      axes = (sharding.LAYERS,) + (sharding.QKV,) * (batch_axes - 1) + sharding.DENSE_KERNEL
      meta = {**sharding.metadata(axes), "matrix_view": view}
      kind = kinds.get(name)
      if kind is None:
        setattr(self, name, nnx.Param(_normal(rngs.params(), shape, std, param_dtype), **meta))
        continue
      manifold, param_cls = ((manifolds.Stiefel(), StiefelParam) if kind == "stiefel" else
                             (manifolds.Oblique(), ObliqueParam))
      setattr(self, name, param_cls(manifold.random(rngs.params(), shape, param_dtype,
                                                    view=view), **meta))
      s0 = std * math.sqrt(max(shape[-2], shape[-1]))
      scale_shape = shape[:batch_axes] + ((shape[-1],) if scale == "output" else ())
      scale_axes = axes[:batch_axes] + ((sharding.FAN_OUT,) if scale == "output" else ())
      scale_cls = nnx.Param if learn_scale else nnx.Variable
      self.scales[name] = scale_cls(jnp.full(scale_shape, s0, param_dtype),
                                    **sharding.metadata(scale_axes))
    ones = lambda shape, axes: nnx.Param(jnp.ones(shape, param_dtype), **sharding.metadata(axes))
    self.attn_norm = ones((L, d), (sharding.LAYERS, sharding.EMBED))
    self.mlp_norm = ones((L, d), (sharding.LAYERS, sharding.EMBED))
    head_dim = d // self.heads
    self.q_norm = ones((L, head_dim), (sharding.LAYERS, None)) if qk_norm else None
    self.k_norm = ones((L, head_dim), (sharding.LAYERS, None)) if qk_norm else None
    self.final_norm = ones((d,), (sharding.EMBED,))
    self.embed = nnx.Param(_normal(rngs.params(), (self.vocab_size, d), _INIT_STD, param_dtype),
                           **sharding.metadata(sharding.EMBEDDING))
    self.head = nnx.Param(_normal(rngs.params(), (d, self.vocab_size), _INIT_STD, param_dtype),
                          **sharding.metadata(sharding.HEAD))

  @classmethod
  def _matrices(cls, argname: str, names: Sequence[str] | str) -> tuple[str, ...]:
    """The :attr:`MATRICES` that ``names`` (matrices and :attr:`GROUPS`) select."""
    names = (names,) if isinstance(names, str) else tuple(names or ())
    out = []
    for name in names:
      if name in ("embed", "head"):
        raise ValueError(f"TransformerLM: {argname}={name!r}: the embedding and the head "
                         f"are not hidden matrices (Muon's AdamW group) and cannot be "
                         f"constrained; choose from {', '.join(cls.MATRICES + tuple(cls.GROUPS))}")
      if name not in cls.MATRICES and name not in cls.GROUPS:
        raise ValueError(f"TransformerLM: unknown {argname}={name!r}; choose from "
                         f"{', '.join(cls.MATRICES + tuple(cls.GROUPS))}")
      out.extend(cls.GROUPS.get(name, (name,)))
    return tuple(dict.fromkeys(out))

  def _stack(self) -> dict[str, Any]:
    """Every per-layer array, by name, for the scan (None where absent)."""
    stack = {name: getattr(self, name)[...] for name in self.MATRICES}
    stack.update({f"{name}_scale": v[...] for name, v in self.scales.items()})
    for name in ("attn_norm", "mlp_norm", "q_norm", "k_norm"):
      var = getattr(self, name)
      stack[name] = None if var is None else var[...]
    return stack

  @staticmethod
  def _matmul(x: jax.Array, p: Mapping[str, Any], name: str) -> jax.Array:
    """``x W`` for one layer's matrix ``name`` (``W = V·s`` when constrained,
    :func:`_scales_weight`)."""
    s = p.get(f"{name}_scale")
    if s is None:
      return x @ p[name]
    if _scales_weight(x, p[name]):
      return x @ (p[name] * s)
    return (x @ p[name]) * s

  def _heads(self, x: jax.Array, p: Mapping[str, Any]) -> tuple[jax.Array, ...]:
    """One layer's ``q, k, v`` ``(batch, T, heads, head_dim)``, rotary applied."""
    b, t, d = x.shape
    n = self.heads
    h = rms_norm(x, p["attn_norm"])
    w, s = p["qkv"], p.get("qkv_scale")   # s: (3,) per matrix or (3, d) per output
    on_weight = s is not None and _scales_weight(h, w)
    if on_weight:
      w = w * (s[:, None, None] if s.ndim == 1 else s[:, None, :])
    qkv = jnp.einsum("btd,ide->ibte", h, w)                # Q, K, V in one product
    if s is not None and not on_weight:
      qkv = qkv * (s[:, None, None, None] if s.ndim == 1 else s[:, None, None, :])
    q, k, v = qkv.reshape(3, b, t, n, d // n)
    if p["q_norm"] is not None:
      q, k = rms_norm(q, p["q_norm"]), rms_norm(k, p["k_norm"])
    return rotary(q, self.rope_base), rotary(k, self.rope_base), v

  def _block(self, x: jax.Array, p: Mapping[str, Any]) -> jax.Array:
    b, t, d = x.shape
    q, k, v = self._heads(x, p)
    attn = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, t, d)
    x = x + self._matmul(attn, p, "attn_out")
    h = rms_norm(x, p["mlp_norm"])
    return x + self._matmul(self.activation(self._matmul(h, p, "mlp_in")), p, "mlp_out")

  def __call__(self, tokens: jax.Array) -> jax.Array:
    """Logits ``(batch, T, vocab_size)`` of int tokens ``(batch, T)``: position ``t`` sees
    tokens ``0 … t`` only."""
    return self._forward(tokens)

  def attention_logit_max(self, tokens: jax.Array) -> jax.Array:
    r"""The largest pre-softmax attention logit of each layer on ``tokens``:
    ``max |q·k| / √d_head`` over the batch, the heads and the causal pairs, shape
    ``(depth,)``.

    The quantity whose growth saturates the softmax: Kimi K2 (Moonshot AI, arXiv
    2507.20534, §2.1) clips it under Muon ("QK-clip"); Yoshihara (arXiv 2606.13276) reports
    it blowing up wherever attention was left unconstrained by the Stiefel manifold.
    """
    def record(x, p):
      q, k, _ = self._heads(x, p)
      scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
      causal = jnp.tril(jnp.ones(scores.shape[-2:], bool))
      return self._block(x, p), jnp.max(jnp.where(causal, jnp.abs(scores), 0.0))

    _, per_layer = self._forward(tokens, record)
    return per_layer

  def query_key_norms(self) -> jax.Array:
    """The spectral norm ``‖W_q W_kᵀ‖₂`` of each layer, scales applied (``(V_q s_q)(V_k
    s_k)ᵀ`` for a constrained model), shape ``(depth,)``: the bilinear form of the
    attention logits, ``q·k = x W_q W_kᵀ yᵀ`` summed over the heads, before rotary."""
    qkv = self.qkv[...].astype(jnp.float32)
    w_q, w_k = qkv[:, 0], qkv[:, 1]
    if "qkv" in self.scales:
      s = self.scales["qkv"][...].astype(jnp.float32)
      s = s[:, :, None, None] if s.ndim == 2 else s[:, :, None, :]   # per matrix / output
      w_q, w_k = w_q * s[:, 0], w_k * s[:, 1]
    return jnp.linalg.norm(w_q @ jnp.swapaxes(w_k, -1, -2), ord=2, axis=(-2, -1))

  def _forward(self, tokens, record=None):
    """The embedding, the scanned blocks and the head: the logits. With ``record(x, p) ->
    (block output, value)`` in place of the blocks: the last block's output and the
    stacked values."""
    stack = self._stack()
    names = [k for k, v in stack.items() if v is not None]
    arrays = dtypes.promote_dtype([stack[k] for k in names] + [self.embed[...], self.head[...],
                                                               self.final_norm[...]],
                                  dtype=self.dtype)
    *layer_arrays, embed, head, final_norm = arrays
    layers = dict(zip(names, layer_arrays))
    layers.update({k: None for k, v in stack.items() if v is None})

    def body(x, p):
      if record is not None:
        return record(x, p)
      return sharding.constrain(self._block(x, p), _RESIDUAL), None

    if self.remat and record is None:
      body = jax.checkpoint(body, prevent_cse=False)
    x = sharding.constrain(jnp.take(embed, tokens, axis=0), _RESIDUAL)
    x, values = jax.lax.scan(body, x, layers)
    if record is not None:
      return x, values
    return sharding.constrain(rms_norm(x, final_norm) @ head, _RESIDUAL)

