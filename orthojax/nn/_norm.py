"""Mean-only normalization and weight normalization layers.

* :class:`InputMeanNorm` (IMN; GmP paper §4.2, eq. 16): subtract the mean of a
  layer's *inputs* — ``x − E[x]`` with the batch mean at train time and a
  running mean at eval — i.e. mean-only batch norm on post-activations,
  placed in front of intermediate GmP layers: ``GmPDense(IMN(h))``.
* :class:`MeanOnlyBatchNorm` (MBN; Salimans & Kingma 2016, §3): subtract the
  batch mean of *pre-activations* and add a learned bias, ``t − E[t] + β``;
  the baseline WN+MBN puts it between a weight-normalized layer (without
  bias) and the activation.
* :class:`WeightNormDense` / :class:`WeightNormConv` (Salimans & Kingma 2016,
  eq. 2): ``w = g · v / ‖v‖`` per output unit.

Both mean layers follow ``nnx.BatchNorm``'s conventions: a
``use_running_average`` attribute (set by ``model.train()`` /
``model.eval()``, by ``nnx.view(model, use_running_average=...)`` through
``set_view``, or per call), the running mean as an ``nnx.BatchStat`` updated
as ``m ← momentum·m + (1 − momentum)·batch_mean`` (no gradient flows into
it), statistics in at least float32, and ``axis_name`` for a ``pmean`` under
``pmap``/``shard_map`` (not needed under SPMD ``jit``).

Why not ``nnx.WeightNorm``: flax 0.12's wrapper *overwrites* the wrapped
layer's kernel with ``g·v/‖v‖`` on every forward pass (the stored ``v`` is
replaced, so the optimizer updates ``w`` rather than ``v``; the forward pass
mutates parameters), and it keeps the scales ``g`` in a plain dict rather
than ``nnx.Param`` s, so ``nnx.Optimizer(..., wrt=nnx.Param)`` never trains
them. Here ``v`` (``kernel``) and ``g`` (``scale``) are ordinary params and
the normalized weight is computed functionally each call.

References:
  Wenlin Chen and Hong Ge, "Neural characteristic activation value analysis
  for improved ReLU network feature learning" (GmP), §4.2 (IMN).
  Tim Salimans and Diederik P. Kingma, "Weight normalization: a simple
  reparameterization to accelerate training of deep neural networks",
  NeurIPS 2016 (WN, mean-only batch norm).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn import dtypes
from jax import lax

from orthojax.nn import _conv
from orthojax.nn import sharding
from orthojax.nn._checks import check_choice, check_positive_int

Initializer = Callable[[jax.Array, Sequence[int], Any], jax.Array]


class _MeanCentering(nnx.Module):
  """``x − mean (+ bias)`` over every axis but ``axis``; BatchNorm-style modes."""

  def __init__(self, num_features: int, *, momentum: float, axis: int,
               use_running_average: bool | None, use_bias: bool, bias_init: Initializer,
               dtype: Any, param_dtype: Any, axis_name: str | None, rngs: nnx.Rngs | None):
    num_features = check_positive_int(num_features, "num_features", where=type(self).__name__)
    self.mean = nnx.BatchStat(jnp.zeros((num_features,), jnp.float32),
                              **sharding.metadata(sharding.BIAS))
    if use_bias:
      key = rngs.params() if rngs is not None else jax.random.key(0)
      self.bias = nnx.Param(bias_init(key, (num_features,), param_dtype),
                            **sharding.metadata(sharding.BIAS))
    else:
      self.bias = nnx.data(None)
    self.num_features = num_features
    self.momentum = momentum
    self.axis = axis
    self.use_running_average = use_running_average
    self.dtype = dtype
    self.param_dtype = param_dtype
    self.axis_name = axis_name

  def __call__(self, x: jax.Array, use_running_average: bool | None = None) -> jax.Array:
    """Centre ``x``; ``use_running_average`` here overrides the attribute."""
    if use_running_average is None:
      use_running_average = self.use_running_average
    if use_running_average is None:
      raise ValueError(
          f"{type(self).__name__} needs use_running_average: pass it to the constructor "
          "or the call, or switch modes with model.train() / model.eval() or "
          "nnx.view(model, use_running_average=...)")
    x = jnp.asarray(x)
    feature_axis = self.axis % x.ndim
    if x.shape[feature_axis] != self.num_features:
      raise ValueError(f"{type(self).__name__}: input has {x.shape[feature_axis]} features on "
                       f"axis {self.axis}, expected num_features={self.num_features}")
    reduce_axes = tuple(a for a in range(x.ndim) if a != feature_axis)
    stats_dtype = jnp.promote_types(x.dtype, jnp.float32)
    if use_running_average:
      mean = self.mean[...]
    else:
      mean = jnp.mean(x.astype(stats_dtype), axis=reduce_axes)
      if self.axis_name is not None:
        mean = lax.pmean(mean, self.axis_name)
      self.mean[...] = lax.stop_gradient(
          self.momentum * self.mean[...] + (1.0 - self.momentum) * mean).astype(self.mean.dtype)
    shape = [1] * x.ndim
    shape[feature_axis] = self.num_features
    bias = self.bias[...] if self.bias is not None else None
    x, mean, bias = dtypes.promote_dtype((x, mean, bias), dtype=self.dtype)
    y = x - mean.reshape(shape)
    if bias is not None:
      y = y + bias.reshape(shape)
    return y

  def set_view(self, use_running_average: bool | None = None):
    """Used by ``nnx.view(model, use_running_average=...)``."""
    if use_running_average is not None:
      self.use_running_average = use_running_average


class InputMeanNorm(_MeanCentering):
  """Input Mean Normalization (IMN): ``x − E[x]`` (GmP paper, eq. 16).

  Parameter-free centring of a layer's inputs, meant in front of
  intermediate GmP layers (the inputs there are post-activations of the
  previous layer). Train mode subtracts the batch mean over every axis but
  ``axis`` and updates the running mean; eval mode subtracts the running
  mean.

  Example::

    >>> from flax import nnx
    >>> import jax.numpy as jnp
    >>> imn = InputMeanNorm(3)
    >>> y = imn(jnp.arange(6.0).reshape(2, 3))   # train mode by default
    >>> y.tolist()   # minus the batch mean [1.5, 2.5, 3.5]
    [[-1.5, -1.5, -1.5], [1.5, 1.5, 1.5]]
    >>> [round(float(m), 4) for m in imn.mean[...]]   # 0.99 · 0 + 0.01 · batch mean
    [0.015, 0.025, 0.035]
    >>> imn.eval()   # now subtracts the running mean
    >>> [round(float(v), 4) for v in imn(jnp.zeros((1, 3)))[0]]
    [-0.015, -0.025, -0.035]

  Args:
    num_features: size of ``axis``.
    momentum: running-mean decay.
    axis: the feature axis; the mean is over every other axis.
    use_running_average: False (train) by default, as ``nnx.BatchNorm``.
    dtype: output dtype (default: inferred). Statistics run in ≥ float32.
    axis_name: named axis to average the batch mean over (pmap/shard_map).
    rngs: unused (no parameters); accepted for a uniform constructor.
  """

  def __init__(self, num_features: int, *, momentum: float = 0.99, axis: int = -1,
               use_running_average: bool | None = False, dtype: Any = None,
               axis_name: str | None = None, rngs: nnx.Rngs | None = None):
    super().__init__(num_features, momentum=momentum, axis=axis,
                     use_running_average=use_running_average, use_bias=False,
                     bias_init=nnx.initializers.zeros, dtype=dtype, param_dtype=jnp.float32,
                     axis_name=axis_name, rngs=rngs)


class MeanOnlyBatchNorm(_MeanCentering):
  """Mean-only batch normalization: ``t − E[t] + β`` (Salimans & Kingma 2016).

  Centres pre-activations ``t`` (batch mean in train mode, running mean in
  eval mode) and adds a learned bias β (zeros init); the WN+MBN baseline is
  ``φ(MBN(WeightNormDense(..., use_bias=False)(x)))``.

  Args:
    num_features: size of ``axis``.
    momentum: running-mean decay.
    axis: the feature axis.
    use_running_average: False (train) by default.
    use_bias: learn β.
    bias_init: β initializer.
    dtype, param_dtype: output and parameter dtypes.
    axis_name: named axis for a ``pmean`` of the batch mean.
    rngs: ``nnx.Rngs`` for ``bias_init`` (optional for the default zeros).
  """

  def __init__(self, num_features: int, *, momentum: float = 0.99, axis: int = -1,
               use_running_average: bool | None = False, use_bias: bool = True,
               bias_init: Initializer = nnx.initializers.zeros, dtype: Any = None,
               param_dtype: Any = jnp.float32, axis_name: str | None = None,
               rngs: nnx.Rngs | None = None):
    super().__init__(num_features, momentum=momentum, axis=axis,
                     use_running_average=use_running_average, use_bias=use_bias,
                     bias_init=bias_init, dtype=dtype, param_dtype=param_dtype,
                     axis_name=axis_name, rngs=rngs)


_INIT_SCALES = ("norm", "one")


class _WeightNorm(nnx.Module):
  """``w = g · v / ‖v‖`` per output unit (the last axis of ``v``)."""

  def _init_params(self, kernel_shape, *, use_bias, kernel_init, bias_init, init_scale,
                   epsilon, param_dtype, rngs):
    check_choice(init_scale, _INIT_SCALES, "init_scale")
    v = kernel_init(rngs.params(), kernel_shape, param_dtype)
    kernel_axes = (sharding.DENSE_KERNEL if v.ndim == 2
                   else sharding.conv_kernel(v.ndim - 2))
    self.kernel = nnx.Param(v, **sharding.metadata(kernel_axes))
    norm = jnp.sqrt(jnp.sum(jnp.square(v.astype(jnp.float32)),
                            axis=tuple(range(v.ndim - 1))) + epsilon)
    scale = norm if init_scale == "norm" else jnp.ones_like(norm)
    self.scale = nnx.Param(scale.astype(param_dtype), **sharding.metadata(sharding.BIAS))
    self.bias = (nnx.Param(bias_init(rngs.params(), (kernel_shape[-1],), param_dtype),
                           **sharding.metadata(sharding.BIAS))
                 if use_bias else nnx.data(None))
    self.epsilon = epsilon

  def effective_kernel(self) -> jax.Array:
    """``g · v / sqrt(‖v‖² + epsilon)``, norms over every axis but the last."""
    v = self.kernel[...]
    v32 = v.astype(jnp.promote_types(v.dtype, jnp.float32))
    inv = lax.rsqrt(jnp.sum(jnp.square(v32), axis=tuple(range(v.ndim - 1))) + self.epsilon)
    return (v32 * (self.scale[...] * inv)).astype(jnp.promote_types(v.dtype, self.scale.dtype))


class WeightNormDense(_WeightNorm):
  """Dense layer with weight normalization: ``x (g ⊙ v/‖v‖) + b``.

  Parameters ``kernel`` (v, ``(in, out)``), ``scale`` (g, ``(out,)``) and
  ``bias``; every column of the effective kernel has norm ``g``.

  Args:
    in_features, out_features: sizes.
    use_bias: add a bias (set False when MeanOnlyBatchNorm follows).
    kernel_init: initializer for v (LeCun normal, as ``nnx.Linear``).
    bias_init: bias initializer (zeros).
    init_scale: ``"norm"`` (g = ‖v‖: the layer starts as the plain Dense
      with kernel v) or ``"one"`` (g = 1).
    epsilon: added to ‖v‖² before the square root.
    dtype, param_dtype, precision, rngs: as ``nnx.Linear``.
  """

  def __init__(self, in_features: int, out_features: int, *, use_bias: bool = True,
               kernel_init: Initializer = nnx.initializers.lecun_normal(),
               bias_init: Initializer = nnx.initializers.zeros,
               init_scale: str = "norm", epsilon: float = 1e-12, dtype: Any = None,
               param_dtype: Any = jnp.float32, precision: Any = None, rngs: nnx.Rngs):
    self.in_features = check_positive_int(in_features, "in_features", where="WeightNormDense")
    self.out_features = check_positive_int(out_features, "out_features",
                                           where="WeightNormDense")
    self.dtype = dtype
    self.precision = precision
    self._init_params((in_features, out_features), use_bias=use_bias, kernel_init=kernel_init,
                      bias_init=bias_init, init_scale=init_scale, epsilon=epsilon,
                      param_dtype=param_dtype, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    bias = self.bias[...] if self.bias is not None else None
    x, w, bias = dtypes.promote_dtype((x, self.effective_kernel(), bias), dtype=self.dtype)
    y = lax.dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ())), precision=self.precision)
    return y + bias if bias is not None else y


class WeightNormConv(_WeightNorm):
  """Convolution with weight normalization (norms over ``(*kernel_size, in)``).

  Channels-last like ``nnx.Conv``; ``kernel`` is ``(*kernel_size, in/groups,
  out)`` (an int ``kernel_size`` means 1-D, as in ``nnx.Conv``).

  Args:
    in_features, out_features, kernel_size, strides: as :class:`orthojax.nn.GmPConv`.
    padding, kernel_dilation, feature_group_count: as :class:`orthojax.nn.GmPConv`.
    use_bias, kernel_init, bias_init, init_scale: as :class:`WeightNormDense`.
    epsilon, dtype, param_dtype, precision, rngs: as :class:`WeightNormDense`.
  """

  def __init__(self, in_features: int, out_features: int, kernel_size: int | Sequence[int],
               strides: int | Sequence[int] = 1, *, padding: Any = "SAME",
               kernel_dilation: int | Sequence[int] = 1, feature_group_count: int = 1,
               use_bias: bool = True,
               kernel_init: Initializer = nnx.initializers.lecun_normal(),
               bias_init: Initializer = nnx.initializers.zeros,
               init_scale: str = "norm", epsilon: float = 1e-12, dtype: Any = None,
               param_dtype: Any = jnp.float32, precision: Any = None, rngs: nnx.Rngs):
    _conv.set_geometry(self, _conv.conv_geometry(in_features, out_features, kernel_size, strides,
                                                 padding, kernel_dilation, feature_group_count))
    self.dtype = dtype
    self.precision = precision
    self._init_params(self.geometry.kernel_shape, use_bias=use_bias, kernel_init=kernel_init,
                      bias_init=bias_init, init_scale=init_scale, epsilon=epsilon,
                      param_dtype=param_dtype, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    bias = self.bias[...] if self.bias is not None else None
    x, w, bias = dtypes.promote_dtype((x, self.effective_kernel(), bias), dtype=self.dtype)
    y = _conv.conv(x, w, self.geometry, precision=self.precision)
    return y + bias if bias is not None else y
