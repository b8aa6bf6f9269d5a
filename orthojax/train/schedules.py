"""Learning-rate schedules over a run of known length (``config.schedule``).

Each multiplies the peak rate (the optimizer section's ``learning_rate``) as a function of
the step: ``constant``; ``cosine`` (to 0 at the end, Loshchilov & Hutter 2017);
``warmup_cosine`` (linear warmup for ``warmup_steps``, then cosine); ``step``
(× ``decay_factor`` at each fraction of training in ``decay_boundaries``, He et al. 2016);
``plateau`` is constant here — the trainer lowers a multiplier in the train state when the
eval metric stalls (``orthojax.train.optimizers``). Built on optax's schedules.
"""

from __future__ import annotations

from typing import Sequence

import optax

SCHEDULES = ("constant", "cosine", "warmup_cosine", "step", "plateau")


def schedule(name: str, base_lr: float, total_steps: int, *, warmup_steps: int = 0,
             decay_boundaries: Sequence[float] = (), decay_factor: float = 0.1
             ) -> optax.Schedule:
  """The schedule ``name`` peaking at ``base_lr`` over ``total_steps`` steps.

  Raises:
    ValueError: an unknown ``name``.
  """
  if name in ("constant", "plateau"):
    return optax.constant_schedule(base_lr)
  if name == "cosine":
    return optax.cosine_decay_schedule(base_lr, max(total_steps, 1))
  if name == "warmup_cosine":
    return optax.warmup_cosine_decay_schedule(0.0, base_lr, warmup_steps,
                                              max(total_steps, warmup_steps + 1))
  if name == "step":
    boundaries = {int(round(b * total_steps)): decay_factor for b in decay_boundaries}
    return optax.piecewise_constant_schedule(base_lr, boundaries)
  raise ValueError(f"unknown schedule {name!r}; choose one of {SCHEDULES}")
