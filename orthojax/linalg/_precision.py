"""Matrix products at a chosen precision: float32, or tensor-core passes (emulated on CPU).

A float32 product ``A B`` can run three ways on an accelerator
(``jax.lax.DotAlgorithmPreset``):

* ``"highest"`` — float32 products (``Precision.HIGHEST``): a GPU's CUDA cores (67 TFLOP/s
  on an H100 SXM), six bfloat16 passes on a TPU. Unit roundoff 2^-24.
* ``"bf16x3"`` — each operand split into ``hi = bf16(x)`` and ``lo = bf16(x - hi)``, and
  ``A B ≈ A_hi B_lo + A_lo B_hi + A_hi B_hi`` on the tensor cores with float32
  accumulation (``BF16_BF16_F32_X3``; Henry, Tang & Heinecke, "Leveraging the bfloat16
  artificial intelligence datatype for higher-precision computations", ARITH 2019): about
  16 significant bits, a relative error near 2^-17 per product, a third of the
  tensor cores' bfloat16 rate (330 TFLOP/s on an H100 SXM).
* ``"bf16"`` — one bfloat16 product (``BF16_BF16_F32``): 8 bits, 2^-9.

``precision=None`` takes the backend's entry of a table (:data:`MANIFOLD_PRECISION` for
the manifolds, where the constraint is held by a final float32 correction; Muon's own
for its orthogonalization), resolved when the program is *lowered*
(``jax.lax.platform_dependent``), so a deviceless compile for a GPU or TPU gets that
backend's choice, and a CPU run its own.

On a CPU the tensor-core presets compute float32 products, so :func:`at_precision`
emulates them: it traces the function, and every product that carries a reduced preset
is replaced by the split products above in float32 — exact, since a product of two
8-bit significands fits float32's 24, and accumulated in float32 as the tensor cores do.
The numbers are a GPU's to the order of summation, so the defect tests run in CI.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
from jax.extend import core as jcore
from jax._src import source_info_util  # what jax.core.eval_jaxpr keeps; no public name

from orthojax.linalg._platform import platform_dependent

PRECISIONS = ("highest", "bf16x3", "bf16")
"""Accepted ``precision`` names (module docstring); ``None`` picks per backend."""

MANIFOLD_PRECISION: Mapping[str, str] = {"cpu": "highest", "gpu": "bf16x3", "tpu": "bf16x3"}
"""``precision=None`` for the manifold maths, per backend: float32 on a CPU (no tensor
cores: emulating three products costs three), three bfloat16 passes on GPUs and TPUs,
each point then corrected at float32 (:meth:`orthojax.manifolds.Stiefel.retract`), which
holds ``‖WᵀW − I‖`` at float32 rounding (docs/performance.md, "Precision")."""

_PRESETS = {
    "highest": "highest",
    "bf16x3": jax.lax.DotAlgorithmPreset.BF16_BF16_F32_X3,
    "bf16": jax.lax.DotAlgorithmPreset.BF16_BF16_F32,
}
_PASSES = {jax.lax.DotAlgorithmPreset.BF16_BF16_F32_X3: 3,
           jax.lax.DotAlgorithmPreset.BF16_BF16_F32: 1}

Precision = Any   # one of PRECISIONS, None, or a {backend: name} table


def check_precision(owner: str, precision: Precision, name: str = "precision") -> None:
  """One line naming ``owner``'s argument when ``precision`` is not a precision."""
  values = precision.values() if isinstance(precision, Mapping) else [precision]
  if precision is None or all(v in PRECISIONS for v in values):
    return
  raise ValueError(f"{owner}: {name}={precision!r} is not a precision; use one of "
                   f"{PRECISIONS} or None (per backend)")


def _table(precision: Precision, default: Mapping[str, str]) -> dict[str, str]:
  """``{"cpu": …, "default": …}``: what each backend runs."""
  table = dict(default if precision is None else
               precision if isinstance(precision, Mapping) else {"cpu": precision})
  other = {k: v for k, v in table.items() if k != "cpu"}
  if len(set(other.values())) > 1:
    raise ValueError(f"precision table {table!r}: one value for every accelerator")
  fallback = next(iter(other.values()), table.get("cpu"))
  return {"cpu": table.get("cpu", fallback), "default": fallback}


def at_precision(fn: Callable[..., Any], precision: Precision = "highest", *,
                 default: Mapping[str, str] = MANIFOLD_PRECISION) -> Callable[..., Any]:
  """``fn`` with its float32 matrix products at ``precision`` (module docstring).

  Args:
    fn: the function; its products without an explicit precision take this one.
    precision: one of :data:`PRECISIONS`, None for ``default``'s entry of the backend,
      or such a table itself.
    default: the table ``None`` reads.

  Returns:
    A function of ``fn``'s arguments. Products ``fn`` runs at an explicit precision
    (a nested ``at_precision``) keep theirs.
  """
  check_precision("at_precision", precision)
  table = _table(precision, default)

  @functools.wraps(fn)
  def run(*args):
    cpu = functools.partial(_emulated if table["cpu"] != "highest" else _native,
                            fn, table["cpu"])
    accelerator = functools.partial(_native, fn, table["default"])
    if table["cpu"] == table["default"] == "highest" or _wider_than_float32(args):
      return _native(fn, "highest", *args)   # float64 stays float64 (the presets cast it)
    return platform_dependent(*args, cpu=cpu, default=accelerator)

  return run


def _wider_than_float32(args) -> bool:
  return any(jnp.issubdtype(jnp.result_type(x), jnp.floating)
             and jnp.finfo(jnp.result_type(x)).bits > 32 for x in jax.tree.leaves(args))


def on_accelerators(precision: Precision, *,
                    default: Mapping[str, str] = MANIFOLD_PRECISION) -> str:
  """The name ``precision`` resolves to on a GPU or TPU (one value for every accelerator)."""
  check_precision("on_accelerators", precision)
  return _table(precision, default)["default"]


def reduced(precision: Precision, *, default: Mapping[str, str] = MANIFOLD_PRECISION
            ) -> Callable[..., Any]:
  """``apply(f, x, otherwise=None)``: ``f(x)`` on the backends whose products ``precision``
  reduces, ``otherwise(x)`` (default ``x`` itself) where they run at float32 — how a
  manifold adds its final float32 correction only where it is needed."""
  table = _table(precision, default)

  def apply(f, x, otherwise=None):
    otherwise = otherwise or (lambda y: y)
    cpu = f if table["cpu"] != "highest" else otherwise
    accelerator = f if table["default"] != "highest" else otherwise
    if cpu is accelerator:
      return cpu(x)
    return platform_dependent(x, cpu=cpu, default=accelerator)

  return apply


_ROUNDOFF = {"highest": 0.0, "bf16x3": 2.0 ** -16, "bf16": 2.0 ** -8}


def roundoff(precision: Precision, dtype: Any, *,
             default: Mapping[str, str] = MANIFOLD_PRECISION) -> jax.Array:
  """The relative rounding of one product at ``precision`` (at least ``dtype``'s machine
  epsilon), as the backend the program is compiled for runs it: a threshold for a test
  on a computed result (:func:`orthojax.linalg.cholesky_qr2`'s one-pass skip)."""
  table = _table(precision, default)
  eps = float(jnp.finfo(dtype).eps)
  value = {k: max(eps, _ROUNDOFF[v]) for k, v in table.items()}
  if value["cpu"] == value["default"]:
    return jnp.asarray(value["cpu"], dtype)
  return platform_dependent(cpu=lambda: jnp.asarray(value["cpu"], dtype),
                            default=lambda: jnp.asarray(value["default"], dtype))


def _native(fn, name, *args):
  with jax.default_matmul_precision(_scope_name(name)):
    return fn(*args)


def _scope_name(name: str) -> str:
  preset = _PRESETS[name]
  return preset if isinstance(preset, str) else preset.name


def _emulated(fn, name, *args):
  with jax.default_matmul_precision(_scope_name(name)):
    closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
  outs = _eval(closed.jaxpr, closed.consts, jax.tree.leaves(args))
  return jax.tree.unflatten(jax.tree.structure(shape), outs)


# -- the emulation: a jaxpr evaluated with split products ----------------------------


def split_product(lhs: jax.Array, rhs: jax.Array, passes: int, **dot_params) -> jax.Array:
  """The tensor cores' bfloat16 product of float32 ``lhs`` and ``rhs`` in float32:
  ``hi·hi`` (one pass) or ``hi·lo + lo·hi + hi·hi`` (three), each exact in float32 and
  accumulated in float32 (``dot_params``: ``lax.dot_general``'s)."""
  dot = functools.partial(jax.lax.dot_general, **{**dot_params,
                                                  "precision": jax.lax.Precision.HIGHEST})

  def parts(x):
    hi = x.astype(jnp.bfloat16).astype(x.dtype)
    return hi, (x - hi).astype(jnp.bfloat16).astype(x.dtype)

  (a_hi, a_lo), (b_hi, b_lo) = parts(lhs), parts(rhs)
  if passes == 1:
    return dot(a_hi, b_hi)
  return (dot(a_hi, b_lo) + dot(a_lo, b_hi)) + dot(a_hi, b_hi)   # small terms first


def _emulates(eqn) -> bool:
  if eqn.primitive is not jax.lax.dot_general_p or eqn.params["precision"] not in _PASSES:
    return False
  return all(v.aval.dtype == jnp.float32 for v in eqn.invars)


def _contains_emulated(jaxpr) -> bool:
  return any(_emulates(e) for e in jaxpr.eqns) or any(
      _contains_emulated(sub) for sub in jcore.subjaxprs(jaxpr))


def _eval(jaxpr, consts, args):
  env: dict[Any, Any] = {}
  read = lambda v: v.val if isinstance(v, jcore.Literal) else env[v]
  env.update(zip(jaxpr.constvars, consts))
  env.update(zip(jaxpr.invars, args))
  for eqn in jaxpr.eqns:
    # As jax.core.eval_jaxpr: each equation under its own name stack (the op_names
    # the compile reports group by) and context.
    names = source_info_util.current_name_stack() + eqn.source_info.name_stack
    with source_info_util.user_context(eqn.source_info.traceback, name_stack=names), \
        eqn.ctx.manager:
      outs = _eval_eqn(eqn, [read(v) for v in eqn.invars])
    env.update(zip(eqn.outvars, outs if eqn.primitive.multiple_results else [outs]))
  return [read(v) for v in jaxpr.outvars]


_INLINED = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr",
            "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr",
            "custom_vjp_call_jaxpr": "fun_jaxpr"}


def _eval_eqn(eqn, invals):
  params = eqn.params
  if _emulates(eqn):
    return split_product(*invals, _PASSES[params["precision"]],
                         dimension_numbers=params["dimension_numbers"],
                         preferred_element_type=params["preferred_element_type"])
  if eqn.primitive.name in _INLINED and _contains_emulated(eqn.params[
      _INLINED[eqn.primitive.name]].jaxpr):
    # A call, or a custom derivative's primal (the update is not differentiated).
    closed = params[_INLINED[eqn.primitive.name]]
    return _eval(closed.jaxpr, closed.consts, invals)
  params = {k: _rewrite(v) for k, v in params.items()}
  return eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(params))


def _rewrite(param):
  """A control-flow body with emulated products, re-traced; anything else as it is."""
  if isinstance(param, tuple):
    return tuple(_rewrite(p) for p in param)
  if not isinstance(param, jcore.ClosedJaxpr) or not _contains_emulated(param.jaxpr):
    if isinstance(param, jcore.Jaxpr) and _contains_emulated(param):
      raise NotImplementedError("at_precision: emulated products inside an open jaxpr "
                                "(shard_map); call at_precision inside it")
    return param
  avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type)
           for a in param.in_avals]
  return jax.make_jaxpr(lambda *a: _eval(param.jaxpr, param.consts, a))(*avals)
