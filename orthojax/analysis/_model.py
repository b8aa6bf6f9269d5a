r"""Pure functions from Flax NNX models, for the matrix-free analyses.

The analyses differentiate plain functions: ``f(x)`` for input-output
Jacobians, ``apply_fn(params, x)`` for parameter Jacobians (Fisher, NTK).
These helpers turn an ``nnx.Module`` into such functions *in evaluation
mode* (``Module.eval()``: dropout off, batch norm on its running
statistics) without touching the caller's module — it is cloned first —
and without ``nnx.jit``: the functions are pure, so ``jax.jit``,
``jax.vmap``, ``jax.jvp``/``jax.vjp`` apply directly.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
from flax import nnx


def _eval_clone(model: Any, who: str) -> nnx.Module:
  if not isinstance(model, nnx.Module):
    raise TypeError(f"{who}: expected an nnx.Module, got {type(model).__name__}")
  clone = nnx.clone(model)
  clone.eval()
  return clone


def model_function(model: nnx.Module, method: str = "__call__") -> Callable[[jax.Array], jax.Array]:
  r"""``x ↦ model.<method>(x)`` as a pure function, in evaluation mode.

  The model is cloned and put in eval mode once; its state is closed over
  (under ``jax.jit`` of an outer function that built the closure from traced
  state, the state stays traced). The function takes whatever the model
  takes, normally a batch ``(B, *features)``.

  Args:
    model: an ``nnx.Module``.
    method: the method to call, e.g. ``"features"`` for
      :class:`orthojax.models.DeepMLP`'s last hidden layer.

  Returns:
    ``f(x)``.

  Raises:
    TypeError: ``model`` is not an ``nnx.Module``.
    ValueError: it has no such method.
  """
  clone = _eval_clone(model, "model_function")
  if not callable(getattr(clone, method, None)):
    raise ValueError(f"model_function: {type(model).__name__} has no method {method!r}")
  graphdef, state = nnx.split(clone)

  def f(x):
    return getattr(nnx.merge(graphdef, state), method)(x)

  return f


def model_apply(model: nnx.Module, wrt: Any = nnx.Param,
                method: str = "__call__") -> tuple[Callable[[Any, jax.Array], jax.Array], Any]:
  r"""``(apply_fn, params)`` with ``apply_fn(params, x) = model.<method>(x)`` in eval mode.

  ``params`` is the pure dict (``nnx.to_pure_dict``) of the variables
  selected by ``wrt`` — the same tree the orthojax trainer holds in
  ``state.params`` — and every other variable (batch statistics, fixed
  scales) is closed over as a constant.

  Args:
    model: an ``nnx.Module``.
    wrt: an NNX filter for the differentiated variables (default ``nnx.Param``).
    method: the method to call.

  Returns:
    ``(apply_fn, params)``.

  Raises:
    TypeError: ``model`` is not an ``nnx.Module``.
    ValueError: it has no such method.
  """
  clone = _eval_clone(model, "model_apply")
  if not callable(getattr(clone, method, None)):
    raise ValueError(f"model_apply: {type(model).__name__} has no method {method!r}")
  graphdef, params, rest = nnx.split(clone, wrt, ...)

  def apply_fn(p, x):
    return getattr(nnx.merge(graphdef, p, rest), method)(x)

  return apply_fn, nnx.to_pure_dict(params)
