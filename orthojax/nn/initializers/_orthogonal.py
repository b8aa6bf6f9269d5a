"""Orthogonal, delta-orthogonal, Gaussian and critical initializers.

Every initializer here has the ``jax.nn.initializers`` signature
``init(key, shape, dtype) -> Array`` (what ``flax.nnx`` layers call) and reads
``shape`` through orthojax's matrix view ``(*batch, fan_in, fan_out)``:
Dense ``(in, out)`` as is, conv ``(kh, kw, cin, cout)`` as
``(kh·kw·cin, cout)``, other layouts with an explicit ``view``
(:class:`orthojax.linalg.MatrixView`, e.g. ``MatrixView.stacked()`` for a
``(layers, in, out)`` stack).

Scaling for critical initialisation (Poole et al. 2016; Pennington,
Schoenholz & Ganguli 2017). The mean-field q-map assumes
``h_j = Σ_i W_ij x_i + b_j`` with ``E[W_ij²] = σ_w²/fan_in``, so that
``E[h_j²] = σ_w² · mean_i(x_i²) + σ_b²``:

* Gaussian: ``W_ij ~ N(0, σ_w²/fan_in)`` — :func:`gaussian`.
* Orthogonal, tall or square (``fan_in ≥ fan_out``): ``W = σ_w Q`` with
  ``QᵀQ = I``. Each column of ``Q`` is uniform on the unit sphere of
  ``R^{fan_in}``, so ``E[(Qᵀx)_j²] = |x|²/fan_in`` and the gain is exactly
  ``σ_w``; all singular values equal ``σ_w``.
* Orthogonal, wide (``fan_in < fan_out``): ``QQᵀ = I`` spreads the unit row
  norms over ``fan_out`` columns, ``E[Q_ij²] = 1/fan_out``, so ``σ_w Q`` gives
  ``E[h_j²] = σ_w² (fan_in/fan_out) mean(x²)``. Matching the q-map needs the
  gain ``σ_w √(fan_out/fan_in)`` (singular values all equal to it). That is
  what ``orthogonal(..., fan_in_variance=True)`` and
  :func:`critical_orthogonal` do; the plain ``orthogonal(gain)`` keeps every
  singular value at ``gain`` (Saxe et al. 2014), i.e.
  ``E[W_ij²] = gain²/max(fan_in, fan_out)``.

References:
  Saxe, McClelland & Ganguli, "Exact solutions to the nonlinear dynamics of
  learning in deep linear neural networks", ICLR 2014.
  Poole et al., "Exponential expressivity in deep neural networks through
  transient chaos", NeurIPS 2016.
  Pennington, Schoenholz & Ganguli, "Resurrecting the sigmoid in deep
  learning through dynamical isometry", NeurIPS 2017.
  Xiao, Bahri, Sohl-Dickstein, Schoenholz & Pennington, "Dynamical isometry
  and a mean field theory of CNNs: how to train 10,000-layer vanilla
  convolutional neural networks", ICML 2018.
  Mezzadri, "How to generate random matrices from the classical compact
  groups", Notices of the AMS 54, 2007.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from orthojax.linalg import MatrixView
from orthojax.linalg import compute_dtype
from orthojax.linalg import infer_view
from orthojax.linalg import layout
from orthojax.nn.initializers import _mean_field

Initializer = Callable[..., jax.Array]

CRITICAL_INITS = ("gaussian", "orthogonal")
"""Weight distributions of a critical initialisation: :func:`critical_gaussian`,
:func:`critical_orthogonal`."""


def _default_dtype(dtype):
  return jnp.dtype(jnp.float32) if dtype is None else jnp.dtype(dtype)


def _view_axes(shape, view) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
  """(fan-in axes, fan-out axes, batch axes) of ``shape`` under ``view``, non-negative."""
  view = infer_view(shape) if view is None else view
  ndim = len(shape)
  as_tuple = lambda a: (int(a),) if np.ndim(a) == 0 else tuple(int(x) for x in a)
  red = tuple(a % ndim for a in as_tuple(view.reduction_axis))
  out = tuple(a % ndim for a in as_tuple(view.output_axis))
  batch = tuple(a for a in range(ndim) if a not in red and a not in out)
  return red, out, batch


def orthogonal(
    gain: float = 1.0,
    view: MatrixView | Any = None,
    *,
    fan_in_variance: bool = False,
    dtype: Any = None,
) -> Initializer:
  r"""Haar-random orthonormal matrices in the matrix view, times ``gain``.

  On the tall side (the convention of :mod:`orthojax.linalg`): with
  ``W`` the ``(fan_in, fan_out)`` view of each batch element,

  * ``fan_in ≥ fan_out``: ``WᵀW = gain² I`` (orthonormal columns);
  * ``fan_in < fan_out``: ``WWᵀ = gain² I`` (orthonormal rows),

  drawn from the Haar measure on the Stiefel manifold (sign-fixed QR of a
  Gaussian matrix, Mezzadri 2007, via ``jax.random.orthogonal``), so
  ``E[W_ij] = 0`` and ``E[W_ij²] = gain²/max(fan_in, fan_out)``. Batch axes
  of the view (scanned layer stacks) get independent draws.

  Differences from ``jax.nn.initializers.orthogonal(scale, column_axis)``:
  jax flattens *every* axis but ``column_axis`` into rows, so for a
  ``(layers, in, out)`` stack it makes the ``(layers·in, out)`` matrix
  orthonormal instead of each layer; it has no notion of batch axes or of
  multi-axis fan-out. For a Dense ``(in, out)`` or conv
  ``(kh, kw, cin, cout)`` kernel (``column_axis=-1``) the two return the
  same array for the same key. jax also runs the QR in the requested dtype
  and fails for bfloat16; here the draw runs in at least float32 and is cast
  at the end.

  Args:
    gain: the common singular value (Saxe et al. 2014's gain; ``σ_w`` for a
      critical network, see the module docstring).
    view: a :class:`~orthojax.linalg.MatrixView` (or optax
      ``MuonDimensionNumbers``); None infers Dense for 2-D, conv for 4-D.
    fan_in_variance: multiply wide matrices (``fan_in < fan_out``) by
      ``√(fan_out/fan_in)`` so that ``E[W_ij²] = gain²/fan_in`` like
      ``N(0, gain²/fan_in)``; this is the mean-field-correct scaling. No
      effect on tall or square matrices.
    dtype: default dtype of the result (float32 when None).

  Returns:
    ``init(key, shape, dtype=dtype) -> Array``.
  """

  def init(key, shape, dtype=dtype):
    dtype = _default_dtype(dtype)
    shape = tuple(int(s) for s in shape)
    lay = layout(shape, view, name="orthogonal initializer shape")
    if any(s == 0 for s in shape):
      return jnp.zeros(shape, dtype)
    tall = jax.random.orthogonal(key, lay.n, lay.batch_shape, compute_dtype(dtype), lay.p)
    scale = float(gain)
    if fan_in_variance and lay.transposed:
      scale *= math.sqrt(lay.fan_out / lay.fan_in)
    return lay.from_tall(scale * tall).astype(dtype)

  return init


def delta_orthogonal(gain: float = 1.0, *, dtype: Any = None) -> Initializer:
  r"""Delta-orthogonal conv kernels (Xiao et al. 2018).

  A kernel ``(*spatial, cin, cout)`` (1-, 2- or 3-D convolution) that is zero
  except at the spatial centre tap ``((k−1)//2, …)``, which holds
  ``gain · H`` with ``H`` a Haar-random ``(cin, cout)`` matrix with
  orthonormal rows, ``HHᵀ = I``. The convolution then maps every input
  position ``x(y) ↦ gain · x(y) H`` and is ``gain`` times an isometry
  whatever the padding (only the centre tap is non-zero, and with ``"SAME"``
  or circular padding the centre tap reads position ``y`` itself). Requires
  ``cin ≤ cout``: a map to fewer channels cannot preserve norms.

  Wraps ``jax.nn.initializers.delta_orthogonal``, drawing in at least
  float32 (jax's QR fails for bfloat16) and casting at the end. For a
  critical network take ``gain = σ_w`` of :func:`critical` with ``cin =
  cout``; for ``cin < cout`` the per-channel variance is scaled by
  ``cin/cout`` (see the module docstring).

  Args:
    gain: the scale of the centre tap.
    dtype: default dtype (float32 when None).

  Returns:
    ``init(key, shape, dtype=dtype) -> Array``.
  """
  def init(key, shape, dtype=dtype):
    dtype = _default_dtype(dtype)
    shape = tuple(int(s) for s in shape)
    if len(shape) not in (3, 4, 5):
      raise ValueError(
          f"delta_orthogonal needs a 1-, 2- or 3-D conv kernel (*spatial, cin, cout) of rank 3-5, "
          f"got shape {shape}")
    if shape[-2] > shape[-1]:
      raise ValueError(
          f"delta_orthogonal needs cin <= cout for an isometry, got cin={shape[-2]}, "
          f"cout={shape[-1]} (shape {shape})")
    base = jax.nn.initializers.delta_orthogonal(scale=1.0, column_axis=-1)
    kernel = base(key, shape, compute_dtype(dtype))
    return (float(gain) * kernel).astype(dtype)

  return init


def variance_scaling(
    scale: float,
    mode: str = "fan_in",
    distribution: str = "normal",
    view: MatrixView | Any = None,
    *,
    dtype: Any = None,
) -> Initializer:
  r"""``jax.nn.initializers.variance_scaling`` with fans read from the matrix view.

  Variance ``scale / n`` with ``n`` = ``fan_in``, ``fan_out``, their mean
  (``"fan_avg"``) or geometric mean (``"fan_geo_avg"``) of the
  ``(fan_in, fan_out)`` view. For a conv kernel ``(kh, kw, cin, cout)``
  ``fan_in = kh·kw·cin`` as in jax, but ``fan_out = cout`` (jax/flax count
  ``kh·kw·cout``): only ``"fan_in"`` agrees with jax's default for convs.
  View batch axes are passed as jax's ``batch_axis``.

  Args:
    scale: the variance numerator.
    mode: ``"fan_in" | "fan_out" | "fan_avg" | "fan_geo_avg"``.
    distribution: ``"normal" | "truncated_normal" | "uniform"`` (jax's
      truncated normal is rescaled to have the requested variance).
    view: the matrix view (None infers Dense / conv).
    dtype: default dtype (float32 when None).
  """

  def init(key, shape, dtype=dtype):
    dtype = _default_dtype(dtype)
    shape = tuple(int(s) for s in shape)
    layout(shape, view, name="variance_scaling initializer shape")  # validates
    red, out, batch = _view_axes(shape, view)
    base = jax.nn.initializers.variance_scaling(
        scale, mode, distribution, in_axis=red, out_axis=out, batch_axis=batch)
    return base(key, shape, compute_dtype(dtype)).astype(dtype)

  return init


def gaussian(
    sigma_w: float = 1.0, view: MatrixView | Any = None, *, dtype: Any = None
) -> Initializer:
  r"""``W_ij ~ N(0, σ_w²/fan_in)`` in the matrix view (Poole et al. 2016)."""
  return variance_scaling(float(sigma_w) ** 2, "fan_in", "normal", view, dtype=dtype)


def _bias_init(sigma_b: float, dtype: Any = None) -> Initializer:
  """``N(0, σ_b²)`` entries (zeros when ``σ_b = 0``)."""
  base = jax.nn.initializers.normal(stddev=float(sigma_b))

  def init(key, shape, dtype=dtype):
    dtype = _default_dtype(dtype)
    if sigma_b == 0.0:
      return jnp.zeros(shape, dtype)
    return base(key, shape, compute_dtype(dtype)).astype(dtype)

  return init


def critical(activation, q_star: float, **quad) -> tuple[float, float]:
  r"""``(σ_w, σ_b)`` of the critical point with fixed point ``q*``.

  The same as :func:`orthojax.nn.initializers.critical_point`: solves
  ``χ(q*) = σ_w² E[φ'(√q* h)²] = 1`` and ``q* = σ_w² E[φ(√q* h)²] + σ_b²``
  (Pennington, Schoenholz & Ganguli 2017). A numpy computation for
  initialisation time, not traceable.
  """
  return _mean_field.critical_point(activation, q_star, **quad)


def critical_orthogonal(
    activation, q_star: float, view: MatrixView | Any = None, *, dtype: Any = None, **quad
) -> tuple[Initializer, Initializer]:
  r"""``(kernel_init, bias_init)`` for a critical orthogonal network.

  ``kernel_init = orthogonal(σ_w, view, fan_in_variance=True)`` — ``σ_w Q``
  for square and tall layers, ``σ_w √(fan_out/fan_in) Q`` for wide ones, so
  the pre-activation variance follows the q-map to ``q*`` (module
  docstring) — and ``bias_init = N(0, σ_b²)``, with ``(σ_w, σ_b) =
  critical(activation, q*)``. With square layers this is the
  dynamical-isometry initialisation of Pennington et al. (2017): every
  layer's Jacobian ``D W`` has mean squared singular value ``χ = 1`` and the
  product's spectrum stays concentrated (for tanh, the more so the smaller
  ``q*``). The first layer's input should be scaled so that ``q¹ = q*``.
  """
  sigma_w, sigma_b = critical(activation, q_star, **quad)
  return (orthogonal(sigma_w, view, fan_in_variance=True, dtype=dtype),
          _bias_init(sigma_b, dtype))


def critical_gaussian(
    activation, q_star: float, view: MatrixView | Any = None, *, dtype: Any = None, **quad
) -> tuple[Initializer, Initializer]:
  r"""``(kernel_init, bias_init)``: ``N(0, σ_w²/fan_in)`` weights, ``N(0, σ_b²)`` biases.

  ``(σ_w, σ_b) = critical(activation, q*)``: ``χ = 1`` on average, but the
  Jacobian spectrum of ``L`` Gaussian layers spreads with variance
  ``∝ L`` (Pennington et al. 2017), unlike :func:`critical_orthogonal`.
  """
  sigma_w, sigma_b = critical(activation, q_star, **quad)
  return gaussian(sigma_w, view, dtype=dtype), _bias_init(sigma_b, dtype)
