"""A ``lax.cond`` whose costlier branch is a guard's rare fall-back.

CholeskyQR2's second pass and its Householder fall-back, or a periodic
re-orthonormalisation, are branches a healthy step does not take. XLA's cost
analysis counts every conditional at its costliest branch, so a compiled step's
FLOPs and bytes would include them. :func:`guarded_cond` runs such a ``lax.cond``
under the named scope :data:`GUARD_SCOPE`; ``orthojax.compile.hlo`` reads that scope
from the optimized HLO and reports the step both ways: each guarded conditional at
its cheapest branch (the step when no guard fires), and XLA's costliest.
"""

from __future__ import annotations

from typing import Any, Callable

import jax

GUARD_SCOPE = "guard"
"""The ``jax.named_scope`` of a guarded ``lax.cond`` (a path segment of its ``op_name``)."""


def guarded_cond(pred: Any, true_fn: Callable[..., Any], false_fn: Callable[..., Any],
                 *operands: Any) -> Any:
  """``jax.lax.cond(pred, true_fn, false_fn, *operands)`` in the :data:`GUARD_SCOPE` scope.

  Use it where one branch is a rare fall-back or a periodic extra: compile reports
  (``orthojax.compile.aot``) then count the step without it, and its cost beside.
  """
  with jax.named_scope(GUARD_SCOPE):
    return jax.lax.cond(pred, true_fn, false_fn, *operands)
