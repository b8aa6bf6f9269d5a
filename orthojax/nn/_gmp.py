"""Geometric parameterization (GmP) layers: ``z = r ⊙ φ(x U + λ)``.

A standard ReLU unit ``ReLU(wᵀx + b)`` is rewritten in hyperspherical
coordinates (Chen & Ge, "Neural characteristic activation value analysis for
improved ReLU network feature learning", eq. 15)::

  z = r · φ(u(θ)ᵀ x + λ)

with ``u(θ) ∈ S^{n−1}`` the unit direction of ``n − 1`` angles θ
(:func:`orthojax.nn.angles_to_direction`), ``λ`` the signed distance of the
unit's activation boundary from the origin ("radius"), and ``r`` a scale. For a
positively homogeneous φ (ReLU) this equals the standard unit with
``w = r u``, ``b = r λ``. The angles decouple the boundary's direction from
its distance and from the weight norm: Theorem 3 bounds the angle between
``u(θ)`` and ``u(θ + ε)`` by ``‖ε‖₂`` whatever ``‖w‖`` is, where the same
perturbation of ``w`` can turn the boundary by up to π when ``‖w‖`` is small.

Layers and cost: :class:`GmPDense` and :class:`GmPConv` assemble the
direction matrix ``U`` once per call — O(fan_in · fan_out), see
``orthojax.nn._hyperspherical`` for the stable float32 evaluation — then
run one matmul / convolution, so a layer costs O(mn) like ``nnx.Linear`` /
``nnx.Conv``. The paper applies GmP to every layer but the output layer
(keep that an ``nnx.Linear``) and puts Input Mean Normalization
(:class:`orthojax.nn.InputMeanNorm`) in front of intermediate GmP layers.

Parameters (per output unit j):

* ``theta``: ``(fan_out, fan_in − 1)`` — one *row* of angles per unit. This is
  not a matrix-view parameter: its rows are independent coordinate vectors,
  stored unit-major so each unit's angles are contiguous (the scan over them
  runs on the contiguous axis, which XLA:CPU handles without transposes).
  The assembled direction matrix has the usual matrix view
  ``(fan_in, fan_out)`` (:meth:`GmPDense.direction`). Do not hand ``theta``
  to orthogonality penalties or Stiefel optimizers — it is Euclidean.
* ``r``: ``(fan_out,)`` scale; ``lam``: ``(fan_out,)`` offset λ (absent when
  ``use_offset=False``).
* Fan-in 1 (``S^0 = {±1}``): no angles; a fixed ``sign`` (an
  ``nnx.Variable``, not trained — a sign cannot move continuously, as in the
  paper's 1-D units with θ ∈ {0, π}) drawn from the init sample.

Initialization (GmP paper §4.3 and its released code): the direction is that of a random
kernel sample (so uniform on the sphere for a Gaussian sample, whatever its
variance), ``λ = 0``, and ``r = 1`` (``init_radius="one"``, the paper) or
``r = ‖w‖`` of that sample (``"norm"``, the released code).
``init_direction``: ``"gaussian"`` (LeCun normal, ``‖w‖ ≈ 1``; the
direction is exactly uniform), ``"glorot"`` (Glorot/Xavier uniform; its
direction is uniform only approximately — a uniform cube sample leans toward
the diagonals, which fades as fan-in grows), or any ``jax.nn.initializers``
style callable ``(key, kernel_shape, dtype)``.

References:
  Wenlin Chen and Hong Ge, "Neural characteristic activation value analysis
  for improved ReLU network feature learning" (GmP), eq. 9–15, §4.1–4.3,
  Theorem 3.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn import dtypes
from jax import lax

from orthojax.nn import _conv
from orthojax.nn import _hyperspherical
from orthojax.nn import sharding
from orthojax.nn._activations import activation_fn
from orthojax.nn._checks import check_choice, check_positive_int

Initializer = Callable[[jax.Array, Sequence[int], Any], jax.Array]

# φ(c·t) = c·φ(t) for c > 0: r·φ(uᵀx + λ) = φ(wᵀx + b) exactly.
_POSITIVELY_HOMOGENEOUS = (None, jax.nn.relu, jax.nn.leaky_relu)

INIT_DIRECTIONS = ("gaussian", "glorot")
INIT_RADII = ("one", "norm")


def _direction_sampler(init_direction: str | Initializer) -> Initializer:
  if callable(init_direction):
    return init_direction
  check_choice(init_direction, INIT_DIRECTIONS, "init_direction",
               also="an initializer (key, shape, dtype) -> kernel sample")
  if init_direction == "gaussian":
    return nnx.initializers.lecun_normal()
  return nnx.initializers.glorot_uniform()


@jax.jit
def _geometry(sample: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Kernel sample ``(*k, in, out)`` -> per-unit angles ``(out, fan_in − 1)``
  (or the sign ``(out,)`` when fan_in = 1) and the column norms ``(out,)``."""
  rows = jnp.reshape(sample, (-1, sample.shape[-1])).T.astype(jnp.float32)
  norm = jnp.linalg.norm(rows, axis=1)
  if rows.shape[1] == 1:
    return jnp.where(rows[:, 0] < 0, -1.0, 1.0), norm
  return _hyperspherical.direction_to_angles(rows), norm


def _direction_rows(theta: jax.Array | None, sign: jax.Array | None) -> jax.Array:
  if theta is None:
    return sign.astype(jnp.promote_types(sign.dtype, jnp.float32))[:, None]
  return _hyperspherical.angles_to_direction(theta, axis=-1)


@functools.partial(jax.jit, static_argnames=("activation", "dtype", "contract"))
def _apply(x, theta, sign, r, lam, *, activation, dtype, contract):
  """``r ⊙ φ(contract(x, U) + λ)``, jitted so eager calls compile once per shape."""
  u_rows = _direction_rows(theta, sign)
  x, u_rows, r, lam = dtypes.promote_dtype((x, u_rows, r, lam), dtype=dtype)
  y = contract(x, u_rows)
  if lam is not None:
    y = y + lam
  if activation is not None:
    y = activation(y)
  return y * r


def _dense_contract(x, u_rows, *, precision):
  return lax.dot_general(x, u_rows, (((x.ndim - 1,), (1,)), ((), ())), precision=precision)


def _conv_contract(x, u_rows, *, geometry, precision):
  kernel_ohwi = u_rows.reshape((geometry.out_features,) + geometry.kernel_shape[:-1])
  return _conv.conv(x, kernel_ohwi, geometry, kernel_layout="OHWI", precision=precision)


class _GmPBase(nnx.Module):
  """Parameters, initialization and direction assembly shared by the layers."""

  def _init_params(self, kernel_shape: tuple[int, ...], *, init_direction, init_radius,
                   use_offset: bool, param_dtype, rngs: nnx.Rngs):
    init_radius = check_choice(init_radius, INIT_RADII, "init_radius")
    sample = _direction_sampler(init_direction)(rngs.params(), kernel_shape, param_dtype)
    if tuple(sample.shape) != tuple(kernel_shape):
      raise ValueError(f"init_direction returned shape {tuple(sample.shape)}, "
                       f"expected the kernel shape {tuple(kernel_shape)}")
    fan_out = kernel_shape[-1]
    coords, norm = _geometry(sample)
    self.fan_in = math.prod(kernel_shape[:-1])
    if self.fan_in == 1:
      self.theta = nnx.data(None)
      self.sign = nnx.Variable(coords.astype(param_dtype), **sharding.metadata(sharding.BIAS))
    else:
      self.theta = nnx.Param(coords.astype(param_dtype), **sharding.metadata(sharding.GMP_ANGLES))
      self.sign = nnx.data(None)
    radius = norm if init_radius == "norm" else jnp.ones_like(norm)
    self.r = nnx.Param(radius.astype(param_dtype), **sharding.metadata(sharding.BIAS))
    self.lam = (nnx.Param(jnp.zeros((fan_out,), param_dtype), **sharding.metadata(sharding.BIAS))
                if use_offset
                else nnx.data(None))
    self.use_offset = use_offset
    return norm

  def _direction_rows(self) -> jax.Array:
    """Unit directions as rows, ``(fan_out, fan_in)``, in at least float32."""
    return _direction_rows(self.theta[...] if self.theta is not None else None,
                           self.sign[...] if self.sign is not None else None)

  def direction(self) -> jax.Array:
    """The assembled unit-column direction matrix in its matrix view ``(fan_in, fan_out)``."""
    return self._direction_rows().T

  def __call__(self, x: jax.Array) -> jax.Array:
    """``r ⊙ φ(contract(x, U) + λ)``: a matmul (Dense) or convolution (Conv)."""
    return _apply(x, self.theta[...] if self.theta is not None else None,
                  self.sign[...] if self.sign is not None else None, self.r[...],
                  self.lam[...] if self.lam is not None else None,
                  activation=self.activation, dtype=self.dtype, contract=self._contract)

  def _set_from_standard(self, norm: jax.Array, bias: jax.Array | None) -> None:
    """λ = b / ‖w‖; a zero column (dead unit) gets r = 0, λ = 0."""
    zero = norm == 0
    self.r[...] = jnp.where(zero, 0.0, self.r[...]).astype(self.r.dtype)
    if bias is not None:
      if self.lam is None:
        raise ValueError("from_dense got a bias but use_offset=False")
      bias = jnp.asarray(bias, jnp.float32).reshape(-1)
      lam = jnp.where(zero, 0.0, bias / jnp.where(zero, 1.0, norm))
      self.lam[...] = lam.astype(self.lam.dtype)


def _check_homogeneous(activation, homogeneous: bool | None) -> None:
  if homogeneous is None and not any(activation is f for f in _POSITIVELY_HOMOGENEOUS):
    raise ValueError(
        f"from_dense reproduces φ(x W + b) exactly only for a positively homogeneous "
        f"activation (relu, leaky_relu, identity/None); got activation={activation!r}. "
        "Pass activation=None to reproduce the pre-activation x W + b (and apply φ "
        "yourself), or homogeneous=True if your callable is positively homogeneous.")


class GmPDense(_GmPBase):
  """Dense layer under geometric parameterization: ``z = r ⊙ φ(x U + λ)``.

  ``U`` (``(in_features, out_features)``, unit columns) is assembled from the
  angles each call (O(in·out)), then one matmul — the cost of ``nnx.Linear``
  up to the O(in·out) direction map. With ``activation=None`` the layer is a
  reparameterized Dense: ``z = r ⊙ (x U + λ)``.

  Example::

    >>> from flax import nnx
    >>> import jax.numpy as jnp
    >>> layer = GmPDense(8, 4, rngs=nnx.Rngs(0))
    >>> layer(jnp.ones((2, 8))).shape
    (2, 4)
    >>> layer.theta.shape, layer.r.shape, layer.lam.shape
    ((4, 7), (4,), (4,))

  Args:
    in_features: fan-in n.
    out_features: fan-out m.
    activation: φ: a callable, a name from :data:`orthojax.nn.ACTIVATIONS` (``"relu"``
      ...), or None for the identity. Default ReLU (the paper's setting).
    init_direction: ``"gaussian"`` (default), ``"glorot"``, or an initializer
      ``(key, (in, out), dtype)``; its columns' directions become θ.
    init_radius: ``"one"`` (r = 1, the paper) or ``"norm"`` (r = ‖w‖ of the
      sample, the released code).
    use_offset: learn λ (initialised to 0).
    dtype: computation dtype (default: inferred from input and params, as
      in flax). The direction map always runs in at least float32.
    param_dtype: parameter dtype.
    precision: matmul precision (``jax.lax.Precision``).
    rngs: ``nnx.Rngs`` with a ``params`` stream.

  Raises:
    ValueError: unknown ``activation``, ``init_direction`` or ``init_radius``.
  """

  def __init__(self, in_features: int, out_features: int, *,
               activation: str | Callable | None = jax.nn.relu,
               init_direction: str | Initializer = "gaussian",
               init_radius: str = "one",
               use_offset: bool = True,
               dtype: Any = None,
               param_dtype: Any = jnp.float32,
               precision: Any = None,
               rngs: nnx.Rngs):
    in_features = check_positive_int(in_features, "in_features", where="GmPDense")
    out_features = check_positive_int(out_features, "out_features", where="GmPDense")
    self.activation = activation_fn(activation)
    self.in_features = in_features
    self.out_features = out_features
    self.dtype = dtype
    self.param_dtype = param_dtype
    self.precision = precision
    self._contract = functools.partial(_dense_contract, precision=precision)
    self._init_params((in_features, out_features), init_direction=init_direction,
                      init_radius=init_radius, use_offset=use_offset,
                      param_dtype=param_dtype, rngs=rngs)

  @classmethod
  def from_dense(cls, kernel: jax.Array, bias: jax.Array | None = None, *,
                 activation: str | Callable | None = jax.nn.relu,
                 homogeneous: bool | None = None,
                 rngs: nnx.Rngs | None = None, **kwargs) -> "GmPDense":
    """The GmP layer equal to the standard layer ``φ(x @ kernel + bias)``.

    ``u = w/‖w‖``, ``r = ‖w‖``, ``λ = b/‖w‖`` per column, so
    ``r·φ(uᵀx + λ) = φ(wᵀx + b)`` for positively homogeneous φ (ReLU, leaky
    ReLU, identity) — exact up to float32 round-off. Other activations raise
    (the identity does not hold); with ``activation=None`` any kernel/bias
    pair is reproduced as the pre-activation map. A zero column (dead unit)
    maps to ``r = 0``: exact when ``φ(b) = 0``.

    Args:
      kernel: ``(in_features, out_features)``.
      bias: ``(out_features,)`` or None (λ = 0).
      activation: as in the constructor.
      homogeneous: True to vouch that a custom ``activation`` is positively
        homogeneous; None checks it against relu/leaky_relu/identity.
      rngs: unused by the conversion (default ``nnx.Rngs(0)``).
      **kwargs: other constructor arguments (``dtype``, ``param_dtype``, ...).
    """
    act = activation_fn(activation)
    _check_homogeneous(act, homogeneous)
    kernel = jnp.asarray(kernel)
    if kernel.ndim != 2:
      raise ValueError(f"kernel must be (in_features, out_features), got shape {kernel.shape}")
    layer = cls(kernel.shape[0], kernel.shape[1], activation=act,
                init_direction=lambda key, shape, dtype: kernel.astype(dtype),
                init_radius="norm", rngs=nnx.Rngs(0) if rngs is None else rngs, **kwargs)
    layer._set_from_standard(jnp.linalg.norm(kernel.astype(jnp.float32), axis=0), bias)
    return layer


class GmPConv(_GmPBase):
  """Convolution under geometric parameterization: ``z = r ⊙ φ(conv(x, U) + λ)``.

  One direction per output channel over the ``prod(kernel_size) · in/groups``
  fan-in; the assembled kernel's matrix view is ``(kh·kw·cin, cout)``
  (:meth:`direction`), the same as an ``nnx.Conv`` kernel ``(kh, kw, cin,
  cout)`` flattened. Inputs are channels-last (NHWC for 2-D) like
  ``nnx.Conv``; ``kernel_size`` follows ``nnx.Conv`` too (an int means a 1-D
  kernel, pass ``(3, 3)`` for 2-D).

  Args:
    in_features: input channels.
    out_features: output channels.
    kernel_size: spatial kernel shape.
    strides: int or one per spatial axis.
    padding: ``"SAME"`` (default), ``"VALID"``, an int, or (low, high) pairs.
    kernel_dilation: int or one per spatial axis.
    feature_group_count: grouped convolution (fan-in is ``prod(k)·in/groups``).
    activation, init_direction, init_radius, use_offset: as in :class:`GmPDense`.
    dtype, param_dtype, precision, rngs: as in :class:`GmPDense`.

  Raises:
    ValueError: as :class:`GmPDense`, plus bad ``kernel_size``, ``strides``,
      ``padding``, ``kernel_dilation`` or group counts.
  """

  def __init__(self, in_features: int, out_features: int,
               kernel_size: int | Sequence[int],
               strides: int | Sequence[int] = 1, *,
               padding: Any = "SAME",
               kernel_dilation: int | Sequence[int] = 1,
               feature_group_count: int = 1,
               activation: str | Callable | None = jax.nn.relu,
               init_direction: str | Initializer = "gaussian",
               init_radius: str = "one",
               use_offset: bool = True,
               dtype: Any = None,
               param_dtype: Any = jnp.float32,
               precision: Any = None,
               rngs: nnx.Rngs):
    _conv.set_geometry(self, _conv.conv_geometry(in_features, out_features, kernel_size, strides,
                                                 padding, kernel_dilation, feature_group_count))
    self.activation = activation_fn(activation)
    self.dtype = dtype
    self.param_dtype = param_dtype
    self.precision = precision
    self._contract = functools.partial(_conv_contract, geometry=self.geometry,
                                       precision=precision)
    self._init_params(self.geometry.kernel_shape, init_direction=init_direction,
                      init_radius=init_radius, use_offset=use_offset, param_dtype=param_dtype,
                      rngs=rngs)

  @classmethod
  def from_dense(cls, kernel: jax.Array, bias: jax.Array | None = None, *,
                 activation: str | Callable | None = jax.nn.relu,
                 homogeneous: bool | None = None,
                 rngs: nnx.Rngs | None = None, **kwargs) -> "GmPConv":
    """The GmP layer equal to ``φ(conv(x, kernel) + bias)`` (see :meth:`GmPDense.from_dense`).

    Args:
      kernel: an ``nnx.Conv`` kernel ``(*kernel_size, in/groups, out)``.
      bias: ``(out,)`` or None.
      activation, homogeneous, rngs: as in :meth:`GmPDense.from_dense`.
      **kwargs: ``strides``, ``padding``, ``feature_group_count`` ... as in
        the constructor.
    """
    act = activation_fn(activation)
    _check_homogeneous(act, homogeneous)
    kernel = jnp.asarray(kernel)
    if kernel.ndim < 3:
      raise ValueError(f"kernel must be (*kernel_size, in, out), got shape {kernel.shape}")
    groups = kwargs.get("feature_group_count", 1)
    layer = cls(kernel.shape[-2] * groups, kernel.shape[-1], kernel.shape[:-2],
                activation=act, init_direction=lambda key, shape, dtype: kernel.astype(dtype),
                init_radius="norm", rngs=nnx.Rngs(0) if rngs is None else rngs, **kwargs)
    norm = jnp.linalg.norm(kernel.astype(jnp.float32).reshape(-1, kernel.shape[-1]), axis=0)
    layer._set_from_standard(norm, bias)
    return layer

