"""Argument checks shared by the optimizer constructors: one line naming the argument."""

from __future__ import annotations

import math
from typing import Any

import jax


def check_rate(who: str, value: Any, name: str = "learning_rate", *,
               allow_zero: bool = False) -> None:
  """Raise ValueError unless ``value`` is a schedule (a callable, not checked) or a finite
  number above zero (at least zero with ``allow_zero``).

  A negative learning rate turns a descent method into an ascent one and a negative
  penalty strength rewards what the penalty measures; neither is ever what a constructor
  call means, so they are refused here as the command line refuses them. (A schedule may
  return anything: it is the user's own function.)
  """
  if callable(value) or isinstance(value, jax.core.Tracer):   # a schedule; inject_hyperparams
    return
  try:
    number = float(value)
  except (TypeError, ValueError):
    raise ValueError(f"{who}: {name}={value!r}; pass a positive number or an optax "
                     f"schedule") from None
  if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
    bound = "at least 0" if allow_zero else "above 0"
    why = ("would reward what the penalty measures" if name == "strength"
           else "would ascend the loss")
    raise ValueError(f"{who}: {name}={value!r} must be a finite number {bound} (a negative "
                     f"{name.replace('_', ' ')} {why}); pass e.g. 1e-3, or an optax "
                     f"schedule")
