"""Convolution set-up shared by the conv layers (GmPConv, OrthogonalConv, WeightNormConv).

:func:`conv_geometry` validates ``kernel_size`` / ``strides`` / ``padding`` /
``kernel_dilation`` / ``feature_group_count`` once, with ``nnx.Conv``'s
conventions (channels-last inputs, an int ``kernel_size`` means a 1-D
kernel, ``"SAME"`` / ``"VALID"`` / an int / (low, high) pairs of padding);
:func:`conv` runs the channels-last convolution with any leading batch axes.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import jax
import numpy as np
from jax import lax

from orthojax.nn._checks import check_positive_int

Padding = str | tuple[tuple[int, int], ...]


class ConvGeometry(NamedTuple):
  """A validated convolution window, in canonical form.

  Attributes:
    kernel_size: the spatial window, one int per spatial axis (1 to 3 axes).
    strides, kernel_dilation: one int per spatial axis.
    padding: ``"SAME"``, ``"VALID"`` or one ``(low, high)`` pair per axis.
    feature_group_count: grouped convolution; divides both channel counts.
    in_features, out_features: channels.
  """

  kernel_size: tuple[int, ...]
  strides: tuple[int, ...]
  padding: Padding
  kernel_dilation: tuple[int, ...]
  feature_group_count: int
  in_features: int
  out_features: int

  @property
  def kernel_shape(self) -> tuple[int, ...]:
    """The kernel ``(*kernel_size, in/groups, out)`` (HWIO, as ``nnx.Conv``)."""
    return self.kernel_size + (self.in_features // self.feature_group_count, self.out_features)

  @property
  def fan_in(self) -> int:
    """``prod(kernel_size) · in/groups``, the rows of the kernel's matrix view."""
    return math.prod(self.kernel_shape[:-1])


def _per_axis(value: int | Sequence[int], nd: int, argname: str) -> tuple[int, ...]:
  values = (value,) * nd if isinstance(value, (int, np.integer)) else tuple(value)
  if len(values) != nd:
    raise ValueError(f"{argname}={value!r} must have {nd} entries (one per spatial axis)")
  return tuple(check_positive_int(v, argname) for v in values)


def canonical_padding(padding: Any, nd: int) -> Padding:
  """``'SAME'``/``'VALID'``, an int, or one int / (low, high) pair per spatial axis."""
  if isinstance(padding, str):
    if padding.upper() in ("SAME", "VALID"):
      return padding.upper()
    raise ValueError(f"unknown padding={padding!r}; valid: 'SAME', 'VALID', an int or "
                     "(low, high) pairs")
  if isinstance(padding, (int, np.integer)):
    return ((int(padding), int(padding)),) * nd
  pads = tuple((p, p) if isinstance(p, (int, np.integer)) else tuple(p) for p in padding)
  if len(pads) != nd or any(len(p) != 2 for p in pads):
    raise ValueError(f"padding={padding!r} must give one int or (low, high) pair per spatial axis")
  return pads


def conv_geometry(in_features: int, out_features: int, kernel_size: int | Sequence[int],
                  strides: int | Sequence[int] = 1, padding: Any = "SAME",
                  kernel_dilation: int | Sequence[int] = 1,
                  feature_group_count: int = 1) -> ConvGeometry:
  """Validate a conv layer's arguments (``nnx.Conv`` conventions) into a :class:`ConvGeometry`.

  Raises:
    ValueError: non-positive sizes, a ``kernel_size`` without 1, 2 or 3
      spatial entries, ``strides`` / ``kernel_dilation`` / ``padding`` that
      do not give one entry per spatial axis, an unknown padding name, or a
      ``feature_group_count`` that does not divide both channel counts.
  """
  in_features = check_positive_int(in_features, "in_features")
  out_features = check_positive_int(out_features, "out_features")
  if isinstance(kernel_size, (int, np.integer)):
    kernel_size = (kernel_size,)
  nd = len(tuple(kernel_size))
  if nd not in (1, 2, 3):
    raise ValueError(f"kernel_size={kernel_size!r} must have 1, 2 or 3 spatial entries")
  groups = check_positive_int(feature_group_count, "feature_group_count")
  if in_features % groups or out_features % groups:
    raise ValueError(f"in_features={in_features} and out_features={out_features} must be "
                     f"divisible by feature_group_count={feature_group_count}")
  return ConvGeometry(
      kernel_size=_per_axis(kernel_size, nd, "kernel_size"),
      strides=_per_axis(strides, nd, "strides"),
      padding=canonical_padding(padding, nd),
      kernel_dilation=_per_axis(kernel_dilation, nd, "kernel_dilation"),
      feature_group_count=groups, in_features=in_features, out_features=out_features)


def conv(x: jax.Array, kernel: jax.Array, geometry: ConvGeometry, *, kernel_layout: str = "HWIO",
         precision: Any = None) -> jax.Array:
  """Channels-last convolution of ``x`` ``(*batch, *spatial, in)`` with ``kernel``.

  Leading batch axes are flattened (and none is fine), as in ``nnx.Conv``.

  Args:
    x: the input.
    kernel: ``(*kernel_size, in/groups, out)`` (``kernel_layout="HWIO"``,
      ``nnx.Conv``'s) or ``(out, *kernel_size, in/groups)`` (``"OHWI"``: a
      unit-major direction matrix reshaped, with no transpose).
    geometry: from :func:`conv_geometry`.
    kernel_layout: ``"HWIO"`` or ``"OHWI"``.
    precision: ``jax.lax.Precision`` of the convolution.

  Returns:
    ``(*batch, *spatial_out, out)``.
  """
  nd = len(geometry.kernel_size)
  if x.ndim < nd + 1:
    raise ValueError(f"input of shape {x.shape} has fewer than {nd} spatial axes + channels")
  batch_shape = x.shape[:x.ndim - nd - 1]
  x = x.reshape((-1,) + x.shape[x.ndim - nd - 1:])
  lhs = (0, nd + 1) + tuple(range(1, nd + 1))
  rhs = {"OHWI": lhs, "HWIO": (nd + 1, nd) + tuple(range(nd))}[kernel_layout]
  y = lax.conv_general_dilated(
      x, kernel, window_strides=geometry.strides, padding=geometry.padding,
      rhs_dilation=geometry.kernel_dilation,
      dimension_numbers=lax.ConvDimensionNumbers(lhs, rhs, lhs),
      feature_group_count=geometry.feature_group_count, precision=precision)
  return y.reshape(batch_shape + y.shape[1:])


def set_geometry(layer: Any, geometry: ConvGeometry) -> None:
  """Record ``layer.geometry`` and its fields as attributes (``layer.kernel_size`` …)."""
  layer.geometry = geometry
  for name, value in geometry._asdict().items():
    setattr(layer, name, value)
