"""Building orthojax's optimizers owner-sharded in a block: :func:`sharded_updates`."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
from typing import Any, Callable, Sequence

import optax

from orthojax.optim.execution.owners import owner_axes
from orthojax.optim.execution.sharded import shard_update

_CONTEXT: contextvars.ContextVar[Any] = contextvars.ContextVar("orthojax_shard_update",
                                                               default=None)


@contextlib.contextmanager
def sharded_updates(mesh: Any, axes: Sequence[str] | None = None,
                    split_above: float | None = None, stripe_stacks: bool = False):
  """Build orthojax's orthogonalizing optimizers owner-sharded over ``mesh`` in this block.

  Inside the block ``oj.optim.radam(...)`` (and ``rsgd``, ``projected_gradient``,
  ``cayley_sgd``, ``cayley_adam``, ``landing``, ``muon``, ``stiefel_muon``,
  ``fused_stiefel_adam``) returns ``shard_update(<the optimizer>, mesh,
  views=<its views>, split_above=split_above, stripe_stacks=stripe_stacks)``; the
  trainer builds a run's
  optimizer this way. It affects construction only: a transformation built
  outside keeps its layout.
  """
  owner_axes(mesh, axes)   # validate now
  token = _CONTEXT.set((mesh, axes, split_above, stripe_stacks))
  try:
    yield
  finally:
    _CONTEXT.reset(token)


def owner_sharded(constructor: Callable[..., optax.GradientTransformation]
                  ) -> Callable[..., optax.GradientTransformation]:
  """Decorate an optimizer constructor to honour :func:`sharded_updates`."""
  signature = inspect.signature(constructor)

  @functools.wraps(constructor)
  def build(*args: Any, **kwargs: Any) -> optax.GradientTransformation:
    context = _CONTEXT.get()
    if context is None:
      return constructor(*args, **kwargs)
    token = _CONTEXT.set(None)   # the constructor's own parts are not sharded again
    try:
      tx = constructor(*args, **kwargs)
    finally:
      _CONTEXT.reset(token)
    views = signature.bind(*args, **kwargs).arguments.get("views")
    mesh, axes, split_above, stripe_stacks = context
    return shard_update(tx, mesh, views=views, axes=axes, split_above=split_above,
                        stripe_stacks=stripe_stacks)

  return build
