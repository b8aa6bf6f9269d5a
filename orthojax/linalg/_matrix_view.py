"""The one matrix-view convention of orthojax.

Every parameter that orthojax constrains, penalises or measures is seen as a
stack of matrices of shape ``(*batch, fan_in, fan_out)``:

* a Dense kernel ``(in, out)`` is that matrix as it is;
* a conv kernel ``(kh, kw, cin, cout)`` views as ``(kh*kw*cin, cout)``;
* scanned / vmapped layer stacks keep their leading layer axis as a batch axis.

Which axes are ``fan_in`` and ``fan_out`` is stated with :class:`MatrixView`,
whose two fields have the same names and meaning as optax's
``optax.contrib.MuonDimensionNumbers`` (``reduction_axis`` = fan-in,
``output_axis`` = fan-out, every other axis is a batch axis), so a user states
axes once for Muon and for orthojax; either type is accepted everywhere.

The constraint sits on the *tall side*: if ``fan_in >= fan_out`` the columns
are orthonormal (``W^T W = I``), otherwise the rows are (``W W^T = I``).
:class:`Layout` turns a parameter into its *tall* matrix ``(*batch, n, p)``
with ``n >= p`` and back, so the manifold mathematics is written once, for
tall matrices.

When no view is given, it is inferred only where the layout is unambiguous:
2-D arrays are Dense kernels and 4-D arrays are 2-D conv kernels (the Flax
layouts). A 3-D array may be a 1-D conv kernel ``(k, cin, cout)`` or a stack
of Dense kernels ``(L, in, out)``, so it needs an explicit view — orthojax
raises rather than guess.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple, Sequence

import jax.numpy as jnp
import numpy as np


class MatrixView(NamedTuple):
  """Which axes of a parameter are fan-in and fan-out; the rest are batch.

  Field names match ``optax.contrib.MuonDimensionNumbers``. Negative axes are
  allowed and count from the end.

  Attributes:
    reduction_axis: the fan-in axis or axes (contracted with the input).
    output_axis: the fan-out axis or axes.
    row_blocks: in how many blocks the rows of the tall matrix (its long side) lie on
      as many devices: 1 for a whole matrix; :func:`orthojax.optim.shard_update` sets it
      for a matrix it splits by rows. An update may arrange its products for it:
      Newton–Schulz then applies its polynomial to the row blocks instead of forming
      its ``p x p`` square, which every device would repeat
      (:func:`orthojax.linalg.newton_schulz`'s ``row_blocks``). The maths is the same.
  """

  reduction_axis: Sequence[int] | int = 0
  output_axis: Sequence[int] | int = 1
  row_blocks: int = 1

  @classmethod
  def dense(cls) -> "MatrixView":
    """A Dense kernel ``(in, out)``."""
    return cls(reduction_axis=-2, output_axis=-1)

  @classmethod
  def conv(cls, spatial_dims: int = 2) -> "MatrixView":
    """A conv kernel ``(*spatial, cin, cout)`` viewed as ``(prod(spatial)*cin, cout)``."""
    if spatial_dims < 1:
      raise ValueError(f"conv spatial_dims must be >= 1, got {spatial_dims}")
    return cls(reduction_axis=tuple(range(spatial_dims + 1)), output_axis=spatial_dims + 1)

  @classmethod
  def stacked(cls, base: "MatrixView | None" = None, num_batch_axes: int = 1) -> "MatrixView":
    """``base`` (default Dense) behind ``num_batch_axes`` leading stack axes."""
    base = cls.dense() if base is None else base
    shift = lambda axes: tuple(a + num_batch_axes if a >= 0 else a for a in _as_tuple(axes))
    return cls(reduction_axis=shift(base.reduction_axis), output_axis=shift(base.output_axis),
               row_blocks=_row_blocks(base))


def _as_tuple(axes: Sequence[int] | int) -> tuple[int, ...]:
  return (int(axes),) if isinstance(axes, (int, np.integer)) else tuple(int(a) for a in axes)


def _row_blocks(view: Any) -> int:
  """``view``'s ``row_blocks`` (1 for optax's ``MuonDimensionNumbers``)."""
  return int(getattr(view, "row_blocks", 1))


def is_view(obj: Any) -> bool:
  """True for a :class:`MatrixView` or an optax ``MuonDimensionNumbers``."""
  return isinstance(obj, tuple) and hasattr(obj, "reduction_axis") and hasattr(obj, "output_axis")


def infer_view(shape: Sequence[int], name: str = "parameter") -> MatrixView:
  """The default view of an array of ``shape``: Dense for 2-D, conv for 4-D.

  Raises:
    ValueError: for any other rank, naming ``name``, since the layout would
      be a guess (see the module docstring).
  """
  ndim = len(shape)
  if ndim == 2:
    return MatrixView.dense()
  if ndim == 4:
    return MatrixView.conv(2)
  if ndim < 2:
    raise ValueError(
        f"{name} has shape {tuple(shape)}: a matrix view needs at least 2 axes "
        "(fan_in, fan_out); vectors and scalars cannot be constrained to a matrix manifold.")
  raise ValueError(
      f"{name} has shape {tuple(shape)} ({ndim} axes): its matrix view is ambiguous. "
      "Pass view=MatrixView(reduction_axis=..., output_axis=...), e.g. "
      "MatrixView.stacked() for a (layers, in, out) stack or MatrixView.conv(1) "
      "for a (k, cin, cout) kernel.")


@dataclasses.dataclass(frozen=True)
class Layout:
  """How one parameter shape maps to its tall matrix ``(*batch, n, p)``, n >= p.

  Built by :func:`layout`; the shapes are static, so it is free under jit.

  Attributes:
    shape: the parameter's shape.
    perm: the transpose that puts axes in (batch, fan_in, fan_out) order.
    batch_shape: the shape of the batch axes, in their original order.
    fan_in: product of the fan-in axis sizes.
    fan_out: product of the fan-out axis sizes.
    transposed: True when ``fan_in < fan_out`` (wide): the tall matrix is the
      transpose of the ``(fan_in, fan_out)`` view and its columns are the rows
      of the parameter's matrix view.
    row_blocks: the view's ``MatrixView.row_blocks``.
  """

  shape: tuple[int, ...]
  perm: tuple[int, ...]
  batch_shape: tuple[int, ...]
  fan_in: int
  fan_out: int
  transposed: bool
  row_blocks: int = 1

  @property
  def n(self) -> int:
    """Rows of the tall matrix (the larger side)."""
    return max(self.fan_in, self.fan_out)

  @property
  def p(self) -> int:
    """The number of columns of the tall matrix (its smaller side), min(fan_in, fan_out)."""
    return min(self.fan_in, self.fan_out)

  def to_matrix(self, x: jnp.ndarray) -> jnp.ndarray:
    """``x`` of ``shape`` -> ``(*batch, fan_in, fan_out)``."""
    _check_shape(x, self.shape)
    return jnp.transpose(x, self.perm).reshape(self.batch_shape + (self.fan_in, self.fan_out))

  def from_matrix(self, m: jnp.ndarray) -> jnp.ndarray:
    """Inverse of :meth:`to_matrix`."""
    permuted_shape = tuple(self.shape[a] for a in self.perm)
    inverse = tuple(int(i) for i in np.argsort(self.perm))
    return jnp.transpose(m.reshape(permuted_shape), inverse)

  def to_tall(self, x: jnp.ndarray) -> jnp.ndarray:
    """``x`` of ``shape`` -> tall ``(*batch, n, p)``."""
    m = self.to_matrix(x)
    return jnp.swapaxes(m, -1, -2) if self.transposed else m

  def from_tall(self, m: jnp.ndarray) -> jnp.ndarray:
    """Inverse of :meth:`to_tall`."""
    return self.from_matrix(jnp.swapaxes(m, -1, -2) if self.transposed else m)


def _check_shape(x, shape):
  if tuple(x.shape) != shape:
    raise ValueError(f"array of shape {tuple(x.shape)} does not match the layout's shape {shape}")


def layout(shape: Sequence[int], view: Any = None, name: str = "parameter") -> Layout:
  """The :class:`Layout` of a parameter of ``shape`` under ``view``.

  Args:
    shape: the parameter's shape.
    view: a :class:`MatrixView`, an optax ``MuonDimensionNumbers``, or None to
      infer (see :func:`infer_view`).
    name: how error messages name the parameter (e.g. its path in the tree).

  Raises:
    ValueError: the rank is below 2, the view is ambiguous or malformed.
  """
  shape = tuple(int(s) for s in shape)
  if view is None:
    view = infer_view(shape, name)
  elif not is_view(view):
    raise TypeError(f"view for {name} must be a MatrixView or MuonDimensionNumbers, got {view!r}")
  ndim = len(shape)
  if ndim < 2:
    infer_view(shape, name)  # raises the rank error
  try:
    red = tuple(a % ndim for a in _as_tuple(view.reduction_axis))
    out = tuple(a % ndim for a in _as_tuple(view.output_axis))
  except ZeroDivisionError:  # pragma: no cover - ndim == 0 handled above
    raise ValueError(f"{name}: cannot view a scalar as a matrix") from None
  for axes, what in ((view.reduction_axis, "reduction_axis"), (view.output_axis, "output_axis")):
    if any(not -ndim <= a < ndim for a in _as_tuple(axes)):
      raise ValueError(f"{name} has {ndim} axes; {what}={axes} is out of range")
  if not red or not out:
    raise ValueError(f"{name}: view {view} needs at least one fan-in and one fan-out axis")
  blocks = getattr(view, "row_blocks", 1)   # optax's MuonDimensionNumbers: whole
  if isinstance(blocks, bool) or not isinstance(blocks, (int, np.integer)) or blocks < 1:
    raise ValueError(f"{name}: view {view} has row_blocks={blocks!r}; pass a positive int "
                     f"(1 for a whole matrix)")
  if set(red) & set(out) or len(set(red)) != len(red) or len(set(out)) != len(out):
    raise ValueError(f"{name}: view {view} repeats an axis; fan-in and fan-out axes must be disjoint")
  batch = tuple(a for a in range(ndim) if a not in red and a not in out)
  fan_in = math.prod(shape[a] for a in red)
  fan_out = math.prod(shape[a] for a in out)
  return Layout(
      shape=shape,
      perm=batch + red + out,
      batch_shape=tuple(shape[a] for a in batch),
      fan_in=fan_in,
      fan_out=fan_out,
      transposed=fan_in < fan_out,
      row_blocks=int(blocks),
  )


def check_float(x: Any, name: str = "parameter") -> None:
  """Raise a TypeError naming ``name`` unless ``x`` has a floating dtype."""
  dtype = jnp.asarray(x).dtype if not hasattr(x, "dtype") else x.dtype
  if not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(f"{name} has dtype {dtype}; orthogonality needs a floating-point dtype")


def compute_dtype(dtype: Any) -> Any:
  """The dtype manifold arithmetic runs in: at least float32.

  bfloat16/float16 parameters are upcast, because their ~1e-2/1e-3 epsilon
  cannot hold ``W^T W = I`` to useful accuracy; float64 stays float64.
  """
  return jnp.promote_types(dtype, jnp.float32)
