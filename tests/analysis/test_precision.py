"""The diagnostics run every product at ``HIGHEST`` precision, whatever the backend's
default (TF32 on GPUs, bfloat16 passes on TPUs): each routine traced under an outer
``make_jaxpr`` shows the precision its products will compile with, on any backend."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import orthojax as oj

A = jnp.arange(20.0).reshape(5, 4) / 20
X = jnp.linspace(-1, 1, 10).reshape(2, 5)
Y = jnp.array([0, 3])


def _apply(params, x):
  return jnp.tanh(x @ params["w"]) @ params["v"]


PARAMS = {"w": A, "v": A.T[:, :4]}

ROUTINES = {
    "jacobian_singular_values": lambda x: oj.analysis.jacobian_singular_values(
        lambda v: jnp.tanh(v @ A), x),
    "top_eigenvalues": lambda x: oj.analysis.top_eigenvalues(
        lambda v: A.T @ (A @ v) + x[0, :4].sum(), 4, k=2, key=jax.random.PRNGKey(0)).values,
    "spectral_density": lambda x: oj.analysis.spectral_density(
        lambda v: A.T @ (A @ v) + x[0, :4].sum(), 4, num_iters=3, num_probes=2,
        key=jax.random.PRNGKey(0)),
    "fisher_max_eigenvalue": lambda x: oj.analysis.fisher_max_eigenvalue(
        _apply, PARAMS, x, Y, key=jax.random.PRNGKey(0), max_iters=4).eigenvalue,
    "empirical_ntk": lambda x: oj.analysis.empirical_ntk(_apply, PARAMS, x),
}


def _precisions(jaxpr, out):
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
      out.append(eqn.params["precision"])
    for value in eqn.params.values():
      for sub in value if isinstance(value, (list, tuple)) else [value]:
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          _precisions(inner, out)
  return out


@pytest.mark.parametrize("name", sorted(ROUTINES))
def test_every_product_runs_at_highest_precision(name):
  found = _precisions(jax.make_jaxpr(ROUTINES[name])(X).jaxpr, [])
  assert found, "no product traced"
  highest = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)
  assert all(p == highest for p in found), sorted(set(map(str, found)))


def test_the_callers_precision_is_untouched_outside():
  """The context is the routine's own: a product after it keeps the default."""
  oj.analysis.jacobian_singular_values(lambda v: jnp.tanh(v @ A), X)
  found = _precisions(jax.make_jaxpr(lambda x: x @ A)(X).jaxpr, [])
  assert found == [None]
