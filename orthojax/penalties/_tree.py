"""Soft-orthogonality penalties summed over a parameter pytree.

:func:`tree_penalty` applies one of the penalties of :mod:`orthojax.penalties`
(or a user callable) to every selected leaf of a parameter tree and sums the
results. ``mask`` selects the leaves and ``views`` says how each is seen as a
matrix, with the one convention of :func:`orthojax.linalg.map_views` shared by
every orthojax transform: ``mask`` None
means every leaf with at least 2 axes, a bool at an inner node covers the
matrices below it (``{"dense": True}`` is the kernel, not the bias); in
``views`` None means *the views the tree records* — where it holds Flax NNX
Variables (``nnx.state(model)``), their ``matrix_view`` metadata — else *infer*,
and ``False`` means *skip this leaf*; both may be partial trees or callables.

Errors about a leaf (integer dtype, too few axes, an ambiguous 3-D layout
without a view) name it by its path, e.g. ``['encoder']['layers_0']['kernel']``.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from orthojax import linalg
from orthojax.penalties import _penalties

PENALTIES: dict[str, Callable[..., jnp.ndarray]] = {
    "so": _penalties.so,
    "half_so": _penalties.half_so,
    "dso": _penalties.dso,
    "mc": _penalties.mc,
    "srip": _penalties.srip,
    "gain_adjusted_so": _penalties.gain_adjusted_so,
}
"""Penalty name -> function ``(w, *, view=None, ...) -> scalar``."""


def get_penalty(kind: str | Callable[..., Any]) -> Callable[..., Any]:
  """The penalty function named ``kind`` (a callable is returned as is).

  Raises:
    ValueError: ``kind`` is a string that names no penalty; the message lists
      the valid names.
    TypeError: ``kind`` is neither a string nor a callable.
  """
  if callable(kind):
    return kind
  if isinstance(kind, str):
    try:
      return PENALTIES[kind]
    except KeyError:
      raise ValueError(f"unknown penalty kind={kind!r}; valid names: {sorted(PENALTIES)}") from None
  raise TypeError(f"kind must be a penalty name {sorted(PENALTIES)} or a callable, got {kind!r}")


def tree_penalty(
    params: Any,
    kind: str | Callable[..., Any],
    *,
    strength: Any = 1.0,
    mask: Any = None,
    views: Any = None,
    **kwargs: Any,
) -> jnp.ndarray:
  r"""``strength · Σ_leaves penalty(leaf)`` over the constrained leaves.

  Args:
    params: a pytree of parameters.
    kind: a name in :data:`PENALTIES` (``"so"``, ``"half_so"``, ``"dso"``,
      ``"mc"``, ``"srip"``, ``"gain_adjusted_so"``) or a callable
      ``(w, view=...) -> scalar``.
    strength: the multiplier λ (a float or a traced scalar, e.g. a schedule's
      value).
    mask: None, a bool, a (partial) bool tree or a callable (module docstring).
    views: None, one view, a (partial) view tree (None infers, False skips a
      leaf) or a callable (module docstring); None reads the views Variables in
      ``params`` record.
    **kwargs: passed to the penalty, e.g. ``reduction="mean"``, ``gain=1.2``
      for ``"gain_adjusted_so"``, ``iterations=4`` or ``key=...`` for
      ``"srip"`` (the same key serves every leaf).

  Returns:
    The scalar total (float32, or float64 if a float64 leaf contributes; 0
    if no leaf is constrained).

  Raises:
    ValueError: unknown ``kind``; a constrained leaf with fewer than 2 axes,
      or an ambiguous layout (e.g. 3-D) without a view — naming the leaf's
      path; ``return_vector=True`` (carried SRIP vectors are per-leaf state:
      call :func:`~orthojax.penalties.srip` per leaf instead).
    TypeError: a constrained leaf with an integer dtype, naming its path.
  """
  fn = get_penalty(kind)
  if kwargs.get("return_vector", False):
    raise ValueError("tree_penalty sums scalars; return_vector=True is not supported here "
                     "(call orthojax.penalties.srip on each leaf to carry its vector)")
  values = linalg.map_views(lambda w, view: fn(w, view=view, **kwargs), params,
                            mask=True if mask is None else mask, views=views, default=lambda leaf: None)
  total = jnp.zeros((), jnp.float32)
  for value in jax.tree_util.tree_leaves(values):
    total = total + value
  return strength * total
