"""What a traced program holds: its primitives counted, nested jaxprs included."""

from __future__ import annotations

import jax


def update_primitives(tx, params, grads) -> dict[str, int]:
  """How often each primitive occurs in ``tx``'s traced ``init`` + ``update``."""
  jaxpr = jax.make_jaxpr(lambda p, g: tx.update(g, tx.init(p), p))(params, grads).jaxpr
  counts: dict[str, int] = {}

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      counts[eqn.primitive.name] = counts.get(eqn.primitive.name, 0) + 1
      for value in eqn.params.values():
        for sub in value if isinstance(value, (list, tuple)) else [value]:
          inner = getattr(sub, "jaxpr", sub)
          if hasattr(inner, "eqns"):
            walk(inner)

  walk(jaxpr)
  return counts
