"""What a traced program holds: its primitives counted, nested jaxprs included."""

from __future__ import annotations

import jax


def update_primitives(tx, params, grads, platform: str = "cpu") -> dict[str, int]:
  """How often each primitive occurs in ``tx``'s traced ``init`` + ``update`` as lowered for
  ``platform``: of a ``jax.lax.platform_dependent`` choice (a ``cond`` on
  ``platform_index``, resolved when the program is lowered) only that platform's branch."""
  jaxpr = jax.make_jaxpr(lambda p, g: tx.update(g, tx.init(p), p))(params, grads).jaxpr
  return primitive_counts(jaxpr, platform)


def primitive_counts(jaxpr, platform: str = "cpu") -> dict[str, int]:
  """:func:`update_primitives` of a jaxpr."""
  counts: dict[str, int] = {}

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      platforms = eqn.params.get("branches_platforms")
      if platforms:
        chosen = [i for i, names in enumerate(platforms) if names and platform in names]
        default = [i for i, names in enumerate(platforms) if names is None]
        walk(eqn.params["branches"][(chosen or default)[0]].jaxpr)
        continue
      if eqn.primitive.name == "platform_index":
        continue
      counts[eqn.primitive.name] = counts.get(eqn.primitive.name, 0) + 1
      for value in eqn.params.values():
        for sub in value if isinstance(value, (list, tuple)) else [value]:
          inner = getattr(sub, "jaxpr", sub)
          if hasattr(inner, "eqns"):
            walk(inner)

  walk(jaxpr)
  return counts
