"""A name for each transformation's ops in the compiled program.

``jax.named_scope`` puts the name into every op's ``op_name`` metadata, so a
profile — or :mod:`orthojax.compile.hlo`'s traffic breakdown of a compiled
step — can say which part of an optimizer costs what. Names only: the
computation is unchanged.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax


def scoped(name: str, update_fn: Callable[..., Any]) -> Callable[..., Any]:
  """``update_fn`` run under ``jax.named_scope(name)``."""
  @functools.wraps(update_fn)
  def update(*args: Any, **kwargs: Any) -> Any:
    with jax.named_scope(name):
      return update_fn(*args, **kwargs)
  return update
