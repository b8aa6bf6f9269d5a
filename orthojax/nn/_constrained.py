"""Constrained Variable types: parameters that live on a manifold.

A plain Dense/Conv kernel becomes manifold-constrained by storing it in a
:class:`StiefelParam` (orthonormal columns on the tall side of its matrix
view) or :class:`ObliqueParam` (unit-norm columns on the tall side) instead
of an ``nnx.Param``. Both are ``nnx.Param`` subclasses, so
``nnx.Optimizer(model, tx, wrt=nnx.Param)`` still trains them; what changes is
*which* transform does:

* :func:`orthojax.optim.partition` given the model labels every leaf by its
  Variable type (``"stiefel"``, ``"oblique"``, else ``"euclidean"``);
* each Variable's ``matrix_view`` metadata says its view where it cannot be
  inferred (a scanned stack ``(layers, in, out)``), or that it is no matrix
  (False). The optimizers and the penalty read it themselves when
  ``nnx.Optimizer`` hands them the Variables; :func:`matrix_views` collects it
  into the ``views=`` tree for code that hands them bare arrays.

Example::

    class Net(nnx.Module):
      def __init__(self, rngs):
        self.hidden = nnx.Linear(784, 256, rngs=rngs)
        self.hidden.kernel = oj.nn.StiefelParam(
            oj.manifolds.Stiefel().random(rngs.params(), (784, 256)))
        self.head = nnx.Linear(256, 10, rngs=rngs)

    tx = oj.optim.partition(model,
        stiefel=oj.optim.radam(1e-3, views=oj.nn.matrix_views(model)),
        euclidean=optax.adam(1e-3))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

:class:`ManifoldLinear` adds Sokol & Park's learnable isotropic scale in front
of such a weight (``W = s · V``; Sokol & Park, ICLR 2020, Appendix A.6.3).

Sharding: the usual ``out_sharding`` metadata (``nnx.with_partitioning``)
works on these types as on any ``nnx.Param``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn import dtypes

from orthojax import manifolds
from orthojax.linalg import MatrixView
from orthojax.linalg import layout
from orthojax.nn import sharding
from orthojax.nn._checks import check_choice, check_positive_int


class ManifoldParam(nnx.Param):
  """Base of the constrained ``nnx.Param`` types.

  Metadata:
    matrix_view: the parameter's :class:`orthojax.linalg.MatrixView`, or None
      to infer it (2-D Dense, 4-D conv). Checked against the value's shape on
      construction, so a wrong view fails where it is declared.

  Class attribute ``manifold_label`` is the label
  :func:`orthojax.optim.partition` gives the leaf.
  """

  manifold_label: ClassVar[str] = ""

  def __init__(self, value: Any, *, matrix_view: MatrixView | None = None, **metadata: Any):
    if type(self) is ManifoldParam:
      raise TypeError("ManifoldParam is abstract: use StiefelParam or ObliqueParam")
    shape = jnp.shape(value)
    # Raises a clear ValueError for a leaf that has no matrix view.
    layout(shape, matrix_view, f"{type(self).__name__}{tuple(shape)}")
    super().__init__(value, matrix_view=matrix_view, **metadata)


class StiefelParam(ManifoldParam):
  """A parameter constrained to the Stiefel manifold along its matrix view.

  Columns orthonormal when fan_in ≥ fan_out (``WᵀW = I``), rows otherwise;
  batch axes of the view (e.g. a scanned layer axis) hold independent
  matrices. Routed to the ``stiefel=`` transform of
  :func:`orthojax.optim.partition`.
  """

  manifold_label: ClassVar[str] = "stiefel"


class ObliqueParam(ManifoldParam):
  """A parameter on the oblique manifold: unit-norm columns on the tall side.

  Routed to the ``oblique=`` transform of :func:`orthojax.optim.partition`
  (e.g. ``oj.optim.radam(..., manifold=oj.manifolds.Oblique())``).
  """

  manifold_label: ClassVar[str] = "oblique"


def _state(tree: Any, wrt: Any) -> Any:
  return nnx.state(tree, wrt) if isinstance(tree, nnx.Module) else tree


def _is_variable(x: Any) -> bool:
  return isinstance(x, nnx.Variable)


def manifold_labels(tree: Any, wrt: Any = nnx.Param, default: str = "euclidean") -> Any:
  """Label tree for ``optax.partition``: each Variable's ``manifold_label``.

  Args:
    tree: an ``nnx.Module`` (its ``nnx.state(tree, wrt)`` is labelled) or a
      ``State`` / pytree holding Variables.
    wrt: the filter the optimizer trains (``nnx.Optimizer``'s ``wrt``).
    default: label of every other Variable.

  Returns:
    A tree with the structure of ``nnx.as_pure(nnx.state(tree, wrt))`` and
    string leaves.
  """
  return jax.tree.map(lambda v: getattr(type(v), "manifold_label", "") or default,
                      _state(tree, wrt), is_leaf=_is_variable)


def matrix_views(tree: Any, wrt: Any = nnx.Param) -> Any:
  """The ``views=`` tree for the manifold optimizers, read from Variable metadata.

  Each leaf is the Variable's ``matrix_view`` metadata (None — infer — where
  absent). Pass it as ``views=`` to :func:`orthojax.optim.radam` and friends,
  or to :func:`orthojax.penalties.tree_penalty`, where they get bare arrays (a
  plain parameter dict, ``nnx.to_pure_dict``). Under
  ``nnx.Optimizer(model, tx, wrt=nnx.Param)`` their default (``views=None``)
  already agrees with it: ``tx.init`` gets the Variables, and the views they
  record are kept for the updates (:class:`orthojax.optim.RecordedViewsState`).
  """
  # A MatrixView is a NamedTuple, i.e. a pytree node: wrap it so the tree
  # keeps it as one leaf, then unwrap (views trees are walked, not mapped).
  boxed = jax.tree.map(lambda v: [v.get_metadata().get("matrix_view")],
                       _state(tree, wrt), is_leaf=_is_variable)
  return jax.tree.map(lambda box: box[0], boxed,
                      is_leaf=lambda x: isinstance(x, list) and len(x) == 1)


class ManifoldLinear(nnx.Module):
  """``y = s · (x V) + b`` with ``V`` on the Stiefel or oblique manifold.

  Sokol & Park's parameterization of a Dense layer (Sokol & Park 2020, Appendix A.6.3): the kernel
  ``V`` is a :class:`StiefelParam` / :class:`ObliqueParam`, initialised as a
  uniformly random manifold point (Haar-orthogonal / uniform unit columns),
  and an isotropic Euclidean scale ``s`` sits in front. With
  ``learn_scale=False`` the scale is a fixed gain (an ``nnx.Variable``, not
  trained).

  Args:
    in_features, out_features: layer sizes.
    manifold: ``"stiefel"`` or ``"oblique"``.
    scale_init: initial ``s`` (e.g. the critical ``σ_w`` scaled for the
      manifold: orthonormal columns of length 1 correspond to Gaussian
      entries of variance ``1/fan_in``, so ``s = σ_w`` matches ``σ_w²/fan_in``).
    learn_scale: train ``s`` (Euclidean) or keep it fixed.
    use_bias: add a Euclidean bias.
    bias_init: bias initializer.
    dtype, param_dtype: computation / parameter dtypes.
    rngs: ``nnx.Rngs`` with a ``params`` stream.
  """

  def __init__(self, in_features: int, out_features: int, *, manifold: str = "stiefel",
               scale_init: float = 1.0, learn_scale: bool = True, use_bias: bool = True,
               bias_init: Any = nnx.initializers.zeros_init(), dtype: Any = None,
               param_dtype: Any = jnp.float32, rngs: nnx.Rngs):
    kinds = {"stiefel": (manifolds.Stiefel, StiefelParam),
             "oblique": (manifolds.Oblique, ObliqueParam)}
    check_choice(manifold, sorted(kinds), "manifold", where="ManifoldLinear")
    in_features = check_positive_int(in_features, "in_features", where="ManifoldLinear")
    out_features = check_positive_int(out_features, "out_features", where="ManifoldLinear")
    manifold_cls, param_cls = kinds[manifold]
    kernel = manifold_cls().random(rngs.params(), (in_features, out_features), param_dtype)
    self.kernel = param_cls(kernel, **sharding.metadata(sharding.DENSE_KERNEL))
    scale = jnp.asarray(scale_init, param_dtype)
    self.scale = nnx.Param(scale) if learn_scale else nnx.Variable(scale)
    self.bias = (nnx.Param(bias_init(rngs.params(), (out_features,), param_dtype),
                           **sharding.metadata(sharding.BIAS)) if use_bias else None)
    self.dtype = dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    kernel, scale, bias = dtypes.promote_dtype(
        (self.kernel[...], self.scale[...], None if self.bias is None else self.bias[...]),
        dtype=self.dtype)
    y = scale * (x @ kernel)
    return y if bias is None else y + bias
