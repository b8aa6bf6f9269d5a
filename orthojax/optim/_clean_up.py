"""The periodic clean-up of ``reorthonormalize_every``: a branch every k steps, or a step
cheap enough for every one.

A retraction that does not land on the manifold exactly (iterative Cayley; Li et al.'s
Cayley optimizers) leaves a small defect each step that accumulates. Two ways remove it:

* ``reorthonormalize_every=k > 1``: every ``k`` steps the point is replaced by the
  closest point of the manifold (``manifold.reorthonormalize``: Newton–Schulz to a
  tolerance), in a ``lax.cond`` (:func:`orthojax.linalg.guarded_cond`). Between
  clean-ups the defect grows (radam, iterative Cayley with 2 iterations: 3.4e-5 at step 99
  of a noisy run); a GPU waits on the branch's predicate each step (1.3 ms per call on an
  H200) and compiles the branch's products whether or not it runs.
* ``reorthonormalize_every=1``: one Newton–Schulz step after every step
  (``manifold.reorthonormalize_step``: two ``n p²`` products, no loop, no branch), which
  maps a defect ``δ`` to ``~3/4 δ²`` and holds the iterate at rounding level (2.9e-6 at
  most over 1,000 steps of the same run) for 18 % more of radam's arithmetic on
  ResNet-50's kernels (docs/performance.md). Where the arithmetic is cheap and a branch
  is not (GPUs), this is the one to use — for steps that leave the manifold by a little:
  one step leaves ``~3/4 δ²`` of a per-step defect ``δ``, below 1e-5 for ``δ ≲ 3e-3``
  (radam at 1e-3 on unit gradients); a large step (rsgd at 3e-2 on unit gradients of a
  96 × 24 matrix) kept 3.5e-3, and needs the full clean-up or a smaller step.

Where the manifold's products are reduced (``Stiefel(precision=None)`` on a GPU or TPU:
three bfloat16 passes), every retraction already ends with such a step, its Gram matrix
at float32 (:meth:`orthojax.manifolds.Manifold.correct`), so ``reorthonormalize_every=1``
adds nothing there (:func:`after_retraction`).
"""

from __future__ import annotations

from typing import Any, Callable

from orthojax import linalg
from orthojax.optim._checks import traced


def after_retraction(manifold: Any, view: Any = None) -> Callable[[Any], Any]:
  """The every-step clean-up of a point ``manifold.retract`` returned: its
  ``reorthonormalize_step`` where the manifold's products run at float32; nothing where
  they are reduced, since the retraction's float32 correction is already that step
  (:meth:`orthojax.manifolds.Manifold.correct`)."""
  return lambda y: linalg.reduced(manifold.precision)(
      lambda y: y, y, otherwise=lambda y: manifold.reorthonormalize_step(y, view=view))


def clean_up(y: Any, count: Any, every: Any, full: Callable[[Any], Any],
             step: Callable[[Any], Any]) -> Any:
  """``y`` cleaned up as ``reorthonormalize_every=every`` asks at retraction step ``count``
  (module docstring): ``step(y)`` for 1, ``full(y)`` in a guarded branch every ``every``
  steps otherwise, ``y`` itself for None."""
  if every is None:
    return y
  if not traced(every) and int(every) == 1:
    return step(y)
  return linalg.guarded_cond(count % every == 0, full, lambda y: y, y)
