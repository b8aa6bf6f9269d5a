"""The jitted train step is one device program with no host round trip.

Checks, on the trainer's ``make_train_step`` (a small model whose kernels go
to ``radam(Stiefel("cayley"))`` through ``oj.optim.partition``, the rest to
SGD momentum) and on a bare jitted radam update:

* no primitive of the jaxpr (walked recursively into every sub-jaxpr:
  pjit, scan, while, cond, custom_jvp/vjp ...) is a host callback
  (``callback``, ``pure_callback``, ``io_callback``, ``debug_callback``) or
  infeed / outfeed;
* the lowered StableHLO has no Python host-callback custom call
  (``xla_python_cpu_callback``, ``xla_ffi_python_cpu_callback``, GPU
  variants) and no infeed / outfeed / send / recv;
* it compiles to one HLO module, and runs under
  ``jax.transfer_guard("disallow")`` (no implicit host <-> device copies).

The detectors are checked too: a step with a ``jax.debug.callback`` fails
them.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

import orthojax as oj
from orthojax.train import step as step_lib

_HOST_PRIMITIVE = re.compile(r"callback|infeed|outfeed")
_HOST_HLO = re.compile(
    r"xla_python_cpu_callback|xla_ffi_python_cpu_callback|xla_python_gpu_callback|"
    r"xla_ffi_python_gpu_callback|xla_ffi_partitioned_python_cpu_callback|"
    r"stablehlo\.(infeed|outfeed|send|recv)\b|\b(infeed|outfeed)\(")


def _subjaxprs(value):
  if isinstance(value, jax.extend.core.ClosedJaxpr):
    yield value.jaxpr
  elif isinstance(value, jax.extend.core.Jaxpr):
    yield value
  elif isinstance(value, (tuple, list)):
    for v in value:
      yield from _subjaxprs(v)


def host_primitives(jaxpr) -> list[str]:
  """Names of host-callback / infeed / outfeed primitives anywhere in ``jaxpr``."""
  if isinstance(jaxpr, jax.extend.core.ClosedJaxpr):
    jaxpr = jaxpr.jaxpr
  found = []
  for eqn in jaxpr.eqns:
    if _HOST_PRIMITIVE.search(eqn.primitive.name):
      found.append(eqn.primitive.name)
    for param in eqn.params.values():
      for sub in _subjaxprs(param):
        found += host_primitives(sub)
  return found


def host_ops_in_hlo(text: str) -> list[str]:
  return sorted({m.group(0) for m in _HOST_HLO.finditer(text)})


def _assert_one_device_program(fn, *args):
  assert host_primitives(jax.make_jaxpr(fn)(*args)) == []
  lowered = jax.jit(fn).lower(*args)
  assert host_ops_in_hlo(lowered.as_text()) == []
  compiled = lowered.compile()
  hlo = compiled.as_text()
  assert hlo.count("HloModule ") == 1
  assert host_ops_in_hlo(hlo) == []
  args = jax.device_put(args)
  with jax.transfer_guard("disallow"):
    jax.block_until_ready(compiled(*args))


class _Net(nnx.Module):

  def __init__(self, rngs):
    self.l1 = nnx.Linear(12, 8, rngs=rngs)
    self.l2 = nnx.Linear(8, 3, rngs=rngs)

  def __call__(self, x):
    return self.l2(jnp.tanh(self.l1(x)))


def _labels(params):
  return jax.tree.map(lambda p: "stiefel" if p.ndim == 2 else "sgd", params)


def _tx():
  return oj.optim.partition(
      _labels, stiefel=oj.optim.radam(1e-2, oj.manifolds.Stiefel("cayley", cayley_iterations=2)),
      sgd=optax.sgd(1e-2, momentum=0.9))


def _train_step_and_inputs(debug_callback=False):
  model = _Net(nnx.Rngs(0))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  params, rest = nnx.to_pure_dict(params), nnx.to_pure_dict(rest)
  tx = _tx()
  loss = lambda out, y: optax.softmax_cross_entropy_with_integer_labels(out, y)
  step = step_lib.make_train_step(graphdef, tx, loss, classification=True)
  state = step_lib.TrainState.create(params, rest, tx)
  batch = {"x": jax.random.normal(jax.random.key(2), (16, 12)),
           "y": jax.random.randint(jax.random.key(3), (16,), 0, 3)}
  if debug_callback:
    inner = step

    def step(state, batch):
      new_state, metrics = inner(state, batch)
      jax.debug.callback(lambda loss: None, metrics["loss"])
      return new_state, metrics
  return step, state, batch


def test_train_step_is_one_program_without_host_callbacks():
  step, state, batch = _train_step_and_inputs()
  _assert_one_device_program(step, state, batch)


def test_radam_update_is_one_program_without_host_callbacks():
  w = oj.manifolds.Stiefel().random(jax.random.key(0), (64, 16))
  params = {"w": w, "b": jnp.zeros(16)}
  grads = jax.tree.map(lambda p: 0.1 * jnp.ones_like(p), params)
  tx = oj.optim.partition(lambda p: {"w": "stiefel", "b": "sgd"},
                          stiefel=oj.optim.radam(1e-2, oj.manifolds.Stiefel("cayley")),
                          sgd=optax.sgd(1e-2, momentum=0.9))
  state = tx.init(params)

  def update(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  _assert_one_device_program(update, params, state, grads)


def test_detectors_catch_a_debug_callback():
  step, state, batch = _train_step_and_inputs(debug_callback=True)
  assert any("callback" in p for p in host_primitives(jax.make_jaxpr(step)(state, batch)))
  assert host_ops_in_hlo(jax.jit(step).lower(state, batch).as_text())
  with pytest.raises(AssertionError):
    _assert_one_device_program(step, state, batch)
