"""A learning-rate probe: the best rate of a grid, the grid widened past an edge.

A short stand-in for tuning a rate (the papers tune by Bayesian optimisation on
validation accuracy): train briefly at every rate of a log-spaced grid, keep the one
with the best score. A best rate at the grid's edge says the grid was too narrow, so
the probe tries the next rate past that edge (a step of the grid's own ratio), and again,
until the best is inside or ``widen`` extra rates were tried. The rule is fixed before
any full run; nothing here looks at a test split.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence


@dataclasses.dataclass(frozen=True)
class Probe:
  """What a probe tried and chose.

  Attributes:
    scores: rate → score, every rate tried (the grid and its widenings).
    best: the chosen rate: the highest score (a NaN, a diverged run, the lowest); among
      equal scores the smallest rate.
    at_edge: the best rate is still at an edge of what was tried (``widen`` ran out).
  """

  scores: dict[float, float]
  best: float
  at_edge: bool

  def row(self, fmt: Callable[[float], str] = "{:.3f}".format) -> str:
    """``1e-05 0.841 / **3e-05 0.894** / …``: the rates in order, the chosen one bold."""
    parts = []
    for rate in sorted(self.scores):
      text = f"{rate:g} {fmt(self.scores[rate])}"
      parts.append(f"**{text}**" if rate == self.best else text)
    return " / ".join(parts) + (" (best at the edge)" if self.at_edge else "")


def _key(rate: float, score: float) -> tuple[float, float]:
  return (score if math.isfinite(score) else -math.inf, -rate)


def best_rate(grid: Sequence[float], score: Callable[[float], float], *,
              widen: int = 3) -> Probe:
  """Probe ``grid`` (positive rates, at least two) with ``score(rate)`` (higher is better).

  While the best rate is the smallest (largest) tried, and fewer than ``widen`` rates
  were added, also try one more step past that edge: the grid's edge divided (multiplied)
  by its mean ratio ``(max / min)^(1 / (n − 1))`` once more, to one significant digit
  (a 1e-5, 3e-5, 1e-4 grid goes on with 3e-6, 1e-6 and 3e-4, 1e-3). Each rate is scored
  once.
  """
  rates = sorted(set(float(r) for r in grid))
  if len(rates) < 2 or rates[0] <= 0:
    raise ValueError(f"a learning-rate grid needs two or more positive rates, got {list(grid)}")
  ratio = (rates[-1] / rates[0]) ** (1 / (len(rates) - 1))   # the grid's mean step
  scores = {rate: float(score(rate)) for rate in rates}
  below = above = 0
  for widened in range(widen + 1):
    tried = sorted(scores)
    best = max(tried, key=lambda r: _key(r, scores[r]))
    inside = best not in (tried[0], tried[-1])
    if inside or widened == widen:
      return Probe(scores, best, at_edge=not inside)
    if best == tried[0]:
      below += 1
      past = rates[0] / ratio ** below
    else:
      above += 1
      past = rates[-1] * ratio ** above
    past = float(f"{past:.1g}")   # 3e-05, not 3.16e-05
    scores[past] = float(score(past))
  raise AssertionError("unreachable")
