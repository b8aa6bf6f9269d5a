"""LAPACK-backed factorisations on CPU, one matrix per call.

On CPU, ``jnp.linalg.qr``, ``cholesky``, ``svd``, ``eigh``, ``solve`` and
``lax.linalg.triangular_solve`` of a *batch* become one LAPACK custom call each, and
jaxlib 0.10 runs the batch over XLA:CPU's intra-op thread pool
(``ParallelBatchMap``), blocking the calling thread until the batch is done. XLA:CPU
often starts such a call *on* a worker of that same pool: as the continuation of a
parallelised loop or copy. Two batched calls that do not depend on each other (two
stacks of a model, the owner-sharded update's groups of matrices, or several devices
of one process) then each hold a worker while they wait for the others, and the
program deadlocks once they hold them all: on a 2-core machine two calls are enough.
Measured with jax 0.10.2 on this project's 2-core machine: two batched sign-fixed
QRs of 16 × 400 × 400 in one ``jit`` hung in 6 of 6 runs, two of 16 × 128 × 128 in 4
of 6; mapped over the batch, 0 of 8.

``per_matrix_on_cpu`` therefore runs the factorisation under ``jax.lax.map`` on
CPU, so each call holds one matrix and never waits on the pool; other platforms get
the batched call (cuSOLVER's and the TPU's batched kernels). The price on CPU is the
batch's parallelism inside jaxlib, which the measurement above shows small: 32 QRs of
400 × 400 in 112 ms mapped against 99 ms batched, of 1024 × 256 in 229 against 212 ms
(OpenBLAS on one thread, idle machine).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

from orthojax.linalg._platform import platform_dependent


def per_matrix_on_cpu(fn: Callable[..., Any]) -> Callable[..., Any]:
  """``fn`` of matrices on the last two axes, made to run one matrix per call on CPU.

  Args:
    fn: a function of one or more arrays ``(..., m, n)`` whose leading (batch) axes
      broadcast together, returning arrays (or a tuple of them) with those axes.

  Returns:
    The same function. On CPU, with more than one matrix in the batch, it applies
    ``fn`` to each matrix in turn (``jax.lax.map``); elsewhere, and for a single
    matrix, it is ``fn`` itself. Results are identical: the same LAPACK routine runs
    on the same matrices.
  """
  def wrapped(*xs: jax.Array) -> Any:
    batch = jnp.broadcast_shapes(*(x.shape[:-2] for x in xs))
    if math.prod(batch) <= 1:
      return fn(*xs)
    xs = [jnp.broadcast_to(x, (*batch, *x.shape[-2:])) for x in xs]

    def one_at_a_time(*xs):
      flat = [x.reshape(-1, *x.shape[-2:]) for x in xs]
      out = jax.lax.map(lambda args: fn(*args), flat)
      return jax.tree.map(lambda o: o.reshape(*batch, *o.shape[1:]), out)

    return platform_dependent(*xs, cpu=one_at_a_time, default=fn)

  return wrapped
