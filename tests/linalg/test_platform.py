"""``orthojax.linalg.platform_dependent``: jax's choice, without tracing unreachable branches."""

import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import orthojax as oj

_traced = collections.Counter()


def _branch(name, value):
  def run(x):
    _traced[name] += 1
    return x + value
  return run


def _nested(choose):
  """An outer CPU / accelerator choice, each branch making a CPU / TPU / other choice."""
  inner = lambda x, base: choose(x, cpu=_branch(f"{base}.cpu", base + 1),
                                 tpu=_branch(f"{base}.tpu", base + 2),
                                 default=_branch(f"{base}.other", base + 3))
  return lambda x: choose(x, cpu=lambda x: inner(x, 10), default=lambda x: inner(x, 20))


def _exported_constant(fn, platform):
  """The constant ``fn`` adds to its input, in the module exported for ``platform``."""
  exported = jax.export.export(jax.jit(fn), platforms=[platform])(
      jax.ShapeDtypeStruct((), jnp.float32))
  return {float(v) for v in re.findall(r"dense<([0-9.e+]+)> : tensor<f32>",
                                       exported.mlir_module())}


@pytest.mark.parametrize("platform, added", [("cpu", 11.0), ("tpu", 22.0), ("cuda", 23.0),
                                             ("rocm", 23.0)])
def test_each_platform_lowers_the_branch_jax_lowers(platform, added):
  ours = _exported_constant(_nested(oj.linalg.platform_dependent), platform)
  theirs = _exported_constant(_nested(jax.lax.platform_dependent), platform)
  assert added in ours and ours == theirs


def test_a_nested_choice_traces_only_the_branches_its_platforms_reach():
  """Inside the CPU branch only the inner CPU branch is traced; inside the accelerator one
  the inner TPU and other branches, once each. jax's own traces all six."""
  _traced.clear()
  jax.make_jaxpr(_nested(oj.linalg.platform_dependent))(1.0)
  assert dict(_traced) == {"10.cpu": 1, "20.tpu": 1, "20.other": 1}
  _traced.clear()
  jax.make_jaxpr(_nested(jax.lax.platform_dependent))(1.0)
  assert sum(_traced.values()) == 6


def test_one_reachable_branch_is_called_without_a_choice():
  """Every platform reachable here selects one branch: it runs as it is, no ``cond``."""
  choose = oj.linalg.platform_dependent
  fn = lambda x: choose(x, cpu=lambda x: choose(x, cpu=lambda y: 2 * y, default=jnp.sin),
                        default=jnp.cos)
  jaxpr = jax.make_jaxpr(fn)(1.0)
  (outer,) = [e for e in jaxpr.eqns if e.primitive.name == "cond"]
  branches = sorted([e.primitive.name for e in b.jaxpr.eqns] for b in outer.params["branches"])
  assert branches == [["cos"], ["mul"]]
  np.testing.assert_allclose(jax.jit(fn)(1.5), 3.0)


def test_an_unknown_platform_is_refused_in_one_line():
  with pytest.raises(ValueError, match=r"unknown platform\(s\) \['gpu'\]; name"):
    oj.linalg.platform_dependent(1.0, gpu=jnp.sin, default=jnp.cos)


def test_a_program_exported_for_several_platforms_runs_the_cpu_branch_here():
  """Lowered for cpu, cuda and tpu at once, the program keeps a conditional on the
  platform; run on this CPU it takes the CPU path through both levels."""
  exported = jax.export.export(jax.jit(_nested(oj.linalg.platform_dependent)),
                               platforms=["cpu", "cuda", "tpu"])(
      jax.ShapeDtypeStruct((), jnp.float32))
  np.testing.assert_allclose(exported.call(jnp.float32(0.0)), 11.0)
