r"""Deep critical fully connected networks with scanned layers (Sokol & Park 2020).

The network of Pennington, Schoenholz & Ganguli (2017) and Sokol & Park
(2020), for inputs ``x⁰ = x`` (row vectors, Flax's ``x @ W`` layout)::

    h¹ = x⁰ W⁰ + b⁰                      (input layer, in_features → width)
    h^{l+1} = φ(h^l) W^l + b^l,  l = 1…L  (``depth`` hidden layers, width → width)
    y = φ(h^{L+1}) W_out + b_out          (Euclidean readout, nnx.Linear)

The ``L = depth`` hidden kernels are one stacked array ``(depth, width,
width)`` (logical axes ``("layers", "fan_in", "fan_out")``, matrix view
``MatrixView.stacked()``), applied with ``jax.lax.scan``: the layer body is
traced and compiled once, so a 200 × 400 network compiles in seconds.

Critical initialisation. The mean-field q-map
``q^{l+1} = σ_w² E_h[φ(√q^l h)²] + σ_b²`` has fixed point ``q*``, and
``χ = σ_w² E_h[φ'(√q* h)²]`` is the per-layer mean squared Jacobian gain;
given ``(φ, q*)``, :func:`orthojax.nn.initializers.critical` returns the
``(σ_w, σ_b)`` with ``χ = 1``. Weights are ``N(0, σ_w²/fan_in)``
(``init="gaussian"``) or ``σ_w Q`` with ``Q`` Haar orthogonal
(``init="orthogonal"``; wide layers get ``σ_w √(fan_out/fan_in)``, see
:mod:`orthojax.nn.initializers`), biases ``N(0, σ_b²)``. The input layer uses
the same ``(σ_w, σ_b)``: ``h¹`` has variance ``q*`` when the inputs have mean
square ``E[φ(√q* h)²] = (q* − σ_b²)/σ_w²`` per entry.

Manifold weights (Sokol & Park 2020, Appendix A.6.3). With ``weights="stiefel"`` or
``"oblique"`` the input and hidden kernels are ``W = s · V``: ``V`` a
:class:`~orthojax.nn.StiefelParam` / :class:`~orthojax.nn.ObliqueParam`
(trained by a Riemannian optimizer through :func:`orthojax.optim.partition`)
and ``s`` a Euclidean per-layer scale (an ``nnx.Param``; a fixed
``nnx.Variable`` with ``learn_scale=False``), initialised to ``σ_w``. This
matches the mean field exactly, for both manifolds: a tall (or square) ``V``
has columns of unit norm, each uniform on the sphere ``S^{fan_in − 1}``
(Haar columns for Stiefel, normalised Gaussian columns for oblique), so
``E[(x V)_j²] = |x|²/fan_in`` and ``E[V_ij²] = 1/fan_in`` — the second moment
of ``N(0, 1/fan_in)``. Hence ``s = σ_w`` gives pre-activation variance
``σ_w² mean(x²) + σ_b²`` like the Gaussian network, and the same ``q*`` and
``χ``. A wide ``V`` (``fan_in < fan_out``, possible only for the input layer)
has unit *rows* (the tall side), ``E[V_ij²] = 1/fan_out``, so
``s = σ_w √(fan_out/fan_in)``. The two manifolds differ in the spectrum, not
the mean field: a Stiefel ``V`` has all singular values 1 (dynamical
isometry with ``s = σ_w``), the oblique one's columns are independent, not
orthogonal, and its singular values spread like a Gaussian matrix's
(Marchenko–Pastur). ``init`` picks the manifold point: ``"orthogonal"`` a
Haar Stiefel point (also an oblique point), ``"gaussian"`` the manifold's
own ``random`` (Stiefel: the same Haar point; oblique: normalised Gaussian
columns). Biases and the readout are always Euclidean.

References:
  Poole, Lahiri, Raghu, Sohl-Dickstein & Ganguli, "Exponential expressivity in
  deep neural networks through transient chaos", NeurIPS 2016.
  Pennington, Schoenholz & Ganguli, "Resurrecting the sigmoid in deep
  learning through dynamical isometry: theory and practice", NeurIPS 2017.
  Sokol & Park, "Information geometry of orthogonal initializations and
  training", ICLR 2020.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.nnx.nn import dtypes

from orthojax import manifolds
from orthojax.linalg import MatrixView
from orthojax.nn import ObliqueParam
from orthojax.nn import StiefelParam
from orthojax.nn import activation_fn
from orthojax.nn import check_choice
from orthojax.nn import check_positive_int
from orthojax.nn import initializers
from orthojax.nn import sharding


def _identity(x):
  return x


_MANIFOLDS = {"stiefel": (manifolds.Stiefel, StiefelParam),
              "oblique": (manifolds.Oblique, ObliqueParam)}


def activation_phi(activation: Any, where: str = "model") -> Callable:
  """The jax function ``φ`` of an activation: a name in :data:`orthojax.nn.ACTIVATIONS`
  (the identity names give the identity), a callable, or a pair ``(φ, φ')`` (the
  form the mean-field functions accept; ``φ'`` is theirs alone).

  Raises:
    ValueError: an unknown name, listing the known ones.
    TypeError: anything that is neither a name, a callable nor such a pair.
  """
  if isinstance(activation, (tuple, list)) and len(activation) == 2 and callable(activation[0]):
    return activation[0]
  if activation is None:
    raise TypeError(f"{where}: activation must be a name, a callable or a pair (phi, phi_prime), "
                    "got None")
  phi = activation_fn(activation, where=where)
  return _identity if phi is None else phi


def resolve_sigmas(activation: str | Callable, q_star: float | None, sigma_w: float | None,
                   sigma_b: float | None) -> tuple[float, float]:
  r"""``(σ_w, σ_b)`` from whichever of ``q*``, ``σ_w``, ``σ_b`` are given.

  * ``q_star`` alone: the critical point with that fixed point
    (:func:`orthojax.nn.initializers.critical`);
  * ``sigma_w`` (and optionally ``sigma_b``, default 0): taken as given;
  * ``sigma_b`` alone, or nothing (``σ_b = 0``): the critical ``σ_w`` for that
    ``σ_b`` (:func:`orthojax.nn.initializers.critical_line`; tanh at
    ``σ_b = 0`` gives ``σ_w = 1``, ReLU ``√2``).

  Raises:
    ValueError: ``q_star`` together with ``sigma_w``/``sigma_b`` (over-determined),
      or the initializers' error where no critical point exists (e.g. ReLU with
      ``σ_b > 0``, sigmoid at small ``q*``).
  """
  if q_star is not None:
    if sigma_w is not None or sigma_b is not None:
      raise ValueError("give q_star (critical sigma_w, sigma_b) or sigma_w/sigma_b, not both: "
                       f"got q_star={q_star}, sigma_w={sigma_w}, sigma_b={sigma_b}")
    return initializers.critical(activation, q_star)
  if sigma_w is not None:
    return float(sigma_w), 0.0 if sigma_b is None else float(sigma_b)
  sigma_b = 0.0 if sigma_b is None else float(sigma_b)
  return float(initializers.critical_line(activation, sigma_b)), sigma_b


def normal_init(stddev: float) -> Callable[..., jax.Array]:
  """``N(0, stddev²)`` entries (exact zeros when ``stddev = 0``)."""

  def init(key, shape, dtype=jnp.float32):
    if stddev == 0.0:
      return jnp.zeros(shape, dtype)
    return stddev * jax.random.normal(key, shape, dtype)

  return init


def wide_gain(fan_in: int, fan_out: int) -> float:
  """``√(fan_out/fan_in)`` for a wide matrix, 1 otherwise (module docstring)."""
  return math.sqrt(fan_out / fan_in) if fan_in < fan_out else 1.0


class DeepMLP(nnx.Module):
  r"""A deep critical fully connected network with a scanned hidden stack.

  See the module docstring for the equations, the critical initialisation
  and the Stiefel / oblique parameterization ``W = s · V``.

  Attributes:
    in_kernel: ``(in_features, width)`` input kernel (``V`` for manifold weights).
    in_bias: ``(width,)``.
    in_scale: scalar ``s`` of the input layer (None for Euclidean weights).
    kernels: ``(depth, width, width)`` stacked hidden kernels.
    biases: ``(depth, width)``.
    scales: ``(depth,)`` per-layer ``s`` (None for Euclidean weights).
    readout: the Euclidean ``nnx.Linear(width, out_features)``, kernel
      ``N(0, 1/width)``, zero bias.
    sigma_w: the initialisation scale ``σ_w`` used.
    sigma_b: the initialisation scale ``σ_b`` used.
    q_star: as given.

  Args:
    in_features: input size (CIFAR-10 flattened: 3072).
    depth: number of hidden ``width → width`` layers, ``≥ 1`` (Sokol & Park: 200).
    width: hidden width (Sokol & Park: 400).
    out_features: number of outputs (classes).
    activation: a name in :data:`orthojax.nn.ACTIVATIONS` (``"tanh"``,
      ``"hard_tanh"``, ``"erf"``, ``"relu"``, ``"linear"`` …), an
      elementwise jax-traceable callable, or a pair ``(φ, φ')`` (``φ'`` is
      used only for the critical point).
    q_star: the fixed point of the critical initialisation
      (:func:`orthojax.nn.initializers.critical`); give it or
      ``sigma_w``/``sigma_b``, not both. With neither, ``σ_w`` is the critical
      one for ``σ_b`` (default 0; :func:`orthojax.nn.initializers.critical_line`).
    sigma_w, sigma_b: explicit initialisation scales.
    init: ``"gaussian"`` or ``"orthogonal"``.
    weights: ``"euclidean"``, ``"stiefel"`` or ``"oblique"``.
    learn_scale: train the manifold scales ``s`` (Euclidean ``nnx.Param``) or
      keep them fixed (``nnx.Variable``). Ignored for Euclidean weights.
    dtype: computation dtype (None: promote the inputs and parameters).
    param_dtype: parameter dtype.
    rngs: ``nnx.Rngs`` with a ``params`` stream.

  Raises:
    ValueError: unknown ``activation`` / ``init`` / ``weights``, ``depth < 1``,
      or no critical point for the given ``q_star`` / ``sigma_b``.
  """

  INITS = initializers.CRITICAL_INITS
  """Accepted ``init`` names: the weight distribution of the critical initialisation."""
  WEIGHTS = ("euclidean", "stiefel", "oblique")
  """Accepted ``weights`` names: where the hidden weights live."""
  INPUT = "flat"
  """The form the trainer feeds data in. ``"flat"`` is flattened to ``(batch, features)``,
  with ``in_features`` their number (``orthojax.train.model_zoo.build``)."""

  @property
  def input_scale(self) -> float:
    r"""``c = √(q* − σ_b²) / σ_w`` (1 without ``q_star``): standardised inputs times ``c``
    start the network at its fixed point.

    The first pre-activation ``h¹ = c·x W⁰ + b⁰`` has variance ``σ_w² c² E[x²] + σ_b²``,
    which is ``q*`` for inputs of unit mean square — the input normalisation of
    Pennington et al. (2017) and Sokol & Park (2020, §4), so the network is at its fixed
    point from the first layer on rather than converging to it. The trainer multiplies
    the (standardised) inputs by it (``orthojax.train.model_zoo.Flatten``).

    Raises:
      ValueError: ``q* ≤ σ_b²`` (no input scale reaches the fixed point).
    """
    if not self.q_star:
      return 1.0
    if not self.q_star > self.sigma_b ** 2:
      raise ValueError(f"input_scale: q*={self.q_star} must exceed "
                       f"sigma_b^2={self.sigma_b ** 2}")
    return math.sqrt(self.q_star - self.sigma_b ** 2) / self.sigma_w

  def __init__(self, in_features: int, depth: int, width: int, out_features: int, *,
               activation: str | Callable = "tanh", q_star: float | None = None,
               sigma_w: float | None = None, sigma_b: float | None = None,
               init: str = "gaussian", weights: str = "euclidean", learn_scale: bool = True,
               dtype: Any = None, param_dtype: Any = jnp.float32, rngs: nnx.Rngs):
    self.activation = activation_phi(activation, "DeepMLP")
    check_choice(init, self.INITS, "init", where="DeepMLP")
    check_choice(weights, self.WEIGHTS, "weights", where="DeepMLP")
    for name, size in (("in_features", in_features), ("width", width),
                       ("out_features", out_features)):
      check_positive_int(size, name, where="DeepMLP")
    if int(depth) < 1:
      raise ValueError(f"DeepMLP: depth must be >= 1, got {depth}")
    depth, width = int(depth), int(width)
    self.sigma_w, self.sigma_b = resolve_sigmas(activation, q_star, sigma_w, sigma_b)
    self.q_star = q_star
    self.depth, self.width, self.weights, self.init = depth, width, weights, init
    self.dtype = dtype

    stacked = MatrixView.stacked()
    bias_init = normal_init(self.sigma_b)
    shapes = ((in_features, width), (depth, width, width))
    views = (None, stacked)
    if weights == "euclidean":
      make = (initializers.gaussian if init == "gaussian" else
              lambda g, view: initializers.orthogonal(g, view, fan_in_variance=True))
      values = [make(self.sigma_w, v)(rngs.params(), s, param_dtype)
                for s, v in zip(shapes, views)]
      self.in_kernel = nnx.Param(values[0], **sharding.metadata(sharding.DENSE_KERNEL))
      self.kernels = nnx.Param(values[1], matrix_view=stacked, **sharding.metadata(
          sharding.stacked(sharding.DENSE_KERNEL)))
      self.in_scale = self.scales = None
    else:
      manifold_cls, param_cls = _MANIFOLDS[weights]
      point = manifolds.Stiefel() if init == "orthogonal" else manifold_cls()
      values = [point.random(rngs.params(), s, param_dtype, view=v)
                for s, v in zip(shapes, views)]
      self.in_kernel = param_cls(values[0], **sharding.metadata(sharding.DENSE_KERNEL))
      self.kernels = param_cls(values[1], matrix_view=stacked, **sharding.metadata(
          sharding.stacked(sharding.DENSE_KERNEL)))
      scale_cls = nnx.Param if learn_scale else nnx.Variable
      in_scale = self.sigma_w * wide_gain(in_features, width)
      self.in_scale = scale_cls(jnp.asarray(in_scale, param_dtype), **sharding.metadata(()))
      self.scales = scale_cls(jnp.full((depth,), self.sigma_w, param_dtype),
                              **sharding.metadata((sharding.LAYERS,)))
    biases = bias_init(rngs.params(), (depth + 1, width), param_dtype)   # one draw
    self.in_bias = nnx.Param(biases[0], **sharding.metadata(sharding.BIAS))
    self.biases = nnx.Param(biases[1:], **sharding.metadata(sharding.stacked(sharding.BIAS)))
    self.readout = nnx.Linear(
        width, out_features, dtype=dtype, param_dtype=param_dtype, rngs=rngs,
        kernel_init=initializers.gaussian(1.0),
        kernel_metadata=sharding.metadata(sharding.DENSE_KERNEL),
        bias_metadata=sharding.metadata(sharding.BIAS))

  def effective_kernels(self) -> tuple[jax.Array, jax.Array]:
    """``(W⁰, W)``: the input kernel and the ``(depth, width, width)`` stack, scales applied."""
    if self.scales is None:
      return self.in_kernel[...], self.kernels[...]
    return (self.in_scale[...] * self.in_kernel[...],
            self.scales[...][:, None, None] * self.kernels[...])

  def hidden_map(self, from_layer: int = 1,
                 to_layer: int | None = None) -> Callable[[jax.Array], jax.Array]:
    r"""``h^a ↦ h^b``, the map between two hidden pre-activations, for Jacobians.

    With the module's numbering (row vectors, ``x⁰`` the input)::

        h¹ = x⁰ W⁰ + b⁰,    h^{l+1} = φ(h^l) W^l + b^l   (l = 1 … L, L = depth),

    the returned function maps the pre-activations ``h^a`` (``a =
    from_layer``; ``a = 0`` means the input ``x⁰``) to ``h^b`` (``b =
    to_layer``, default ``L + 1``, the last hidden pre-activation), applying
    the hidden kernels ``W^a … W^{b−1}`` with ``jax.lax.scan``. Its Jacobian
    ``∂h^b/∂h^a`` (output × input) is ``J_{h^a}^{h^b} = (D_a W^a D_{a+1}
    W^{a+1} ⋯ D_{b−1} W^{b−1})ᵀ`` with ``D_l = diag φ'(h^l)`` — the
    column-convention product ``∏ W^lᵀ D_l`` — as in Sokol & Park's
    ``J_{h¹}^{h^L}``. Manifold scales ``s`` are applied (effective kernels).

    The function works on one example ``(width,)`` or on any leading batch
    axes. It closes over the model's current arrays; build it inside
    ``jax.jit`` (from a traced ``nnx.merge``) to keep them traced.

    Args:
      from_layer: ``a``, ``0 ≤ a ≤ L``.
      to_layer: ``b``, ``a < b ≤ L + 1`` (default ``L + 1``).

    Returns:
      ``f(h_a) -> h_b``.

    Raises:
      TypeError: a layer index that is not an int.
      ValueError: layers out of range.
    """
    depth = self.depth
    to_layer = depth + 1 if to_layer is None else to_layer
    for name, v in (("from_layer", from_layer), ("to_layer", to_layer)):
      if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"DeepMLP.hidden_map: {name} must be an int, got {v!r}")
    if not 0 <= from_layer < to_layer <= depth + 1:
      raise ValueError(f"DeepMLP.hidden_map: need 0 <= from_layer < to_layer <= depth + 1 = "
                       f"{depth + 1}, got from_layer={from_layer}, to_layer={to_layer}")
    w_in, w = self.effective_kernels()
    b_in, b = self.in_bias[...], self.biases[...]
    act = self.activation
    start = max(from_layer, 1)
    w_stack, b_stack = w[start - 1:to_layer - 1], b[start - 1:to_layer - 1]

    def layer(h, params):
      w_l, b_l = params
      return act(h) @ w_l + b_l, None

    def f(h):
      h = jnp.asarray(h)
      if from_layer == 0:
        h = h @ w_in + b_in
      if w_stack.shape[0] == 0:
        return h
      return jax.lax.scan(layer, h, (w_stack, b_stack))[0]

    return f

  def _hidden(self, x: jax.Array, collect: bool) -> tuple[jax.Array, jax.Array | None]:
    """``h^{L+1}`` and, if ``collect``, the stacked ``h¹, …, h^{L+1}`` (else None)."""
    # A manifold layer computes s · (x V) rather than x (s V): the scale goes on the
    # activations, so the scaled stack (and its gradient) is never materialised.
    depth = self.kernels[...].shape[0]
    ones = jnp.ones((), self.kernels.dtype)
    s_in = ones if self.in_scale is None else self.in_scale[...]
    s = jnp.broadcast_to(ones, (depth,)) if self.scales is None else self.scales[...]
    v_in, v, b_in, b, s_in, s = dtypes.promote_dtype(
        (self.in_kernel[...], self.kernels[...], self.in_bias[...], self.biases[...], s_in, s),
        dtype=self.dtype)
    act = self.activation
    scaled = self.scales is not None

    def layer(h, params):
      v_l, b_l, s_l = params
      h = ((act(h) @ v_l) * s_l if scaled else act(h) @ v_l) + b_l
      return h, (h if collect else None)

    h1 = jnp.asarray(x, v_in.dtype) @ v_in
    h1 = (h1 * s_in if scaled else h1) + b_in
    h, hs = jax.lax.scan(layer, h1, (v, b, s))
    return h, (jnp.concatenate([h1[None], hs], axis=0) if collect else None)

  def preactivations(self, x: jax.Array) -> jax.Array:
    """The hidden pre-activations ``h¹ … h^{L+1}`` stacked: ``(depth + 1, *batch, width)``."""
    return self._hidden(x, collect=True)[1]

  def features(self, x: jax.Array) -> jax.Array:
    """``x^{L+1} = φ(h^{L+1})``, the last hidden layer (the readout's input).

    ``jax.jacfwd(model.features)`` is the input-output Jacobian of the
    critical stack (Pennington et al. 2017) including the input layer.
    """
    h, _ = self._hidden(x, collect=False)
    return self.activation(h)

  def __call__(self, x: jax.Array) -> jax.Array:
    """Logits ``(*batch, out_features)`` of inputs ``(*batch, in_features)``."""
    return self.readout(self.features(x))
