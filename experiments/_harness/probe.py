"""A learning-rate probe: the best rate of a grid, the grid widened past an edge.

A short stand-in for tuning a rate (the papers tune by Bayesian optimisation on
validation accuracy): train briefly at every rate of a log-spaced grid, keep the one
with the best score. A best rate at the grid's edge says the grid was too narrow, so
the probe tries the next rate past that edge (a step of the grid's own ratio), and again,
until the best is inside or ``widen`` extra rates were tried. The rule is fixed before
any full run; nothing here looks at a test split.

A run with several parameter groups (a manifold optimizer on the constrained weights, Adam
on the rest) probes them one after the other (:func:`probe_groups`): each group's grid at
the rates already chosen for the groups before it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class Probe:
  """What a probe tried and chose.

  Attributes:
    scores: rate → score, every rate tried (the grid and its widenings).
    best: the chosen rate: the best score — the highest, or the lowest with
      ``maximize=False`` (a NaN, a diverged run, is the worst either way); among
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

  def entry(self) -> dict[str, Any]:
    """The probe as JSON: ``{"scores": {"1e-05": score, …}, "best", "at_edge", "row"}``."""
    return {"scores": {f"{r:g}": s for r, s in sorted(self.scores.items())},
            "best": self.best, "at_edge": self.at_edge, "row": self.row()}


def _key(rate: float, score: float, maximize: bool = True) -> tuple[float, float]:
  return ((score if maximize else -score) if math.isfinite(score) else -math.inf, -rate)


def best_rate(grid: Sequence[float], score: Callable[[float], float], *,
              widen: int = 3, maximize: bool = True) -> Probe:
  """Probe ``grid`` (positive rates, at least two) with ``score(rate)``: higher is better
  (a validation accuracy), or lower with ``maximize=False`` (a validation loss).

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
    best = max(tried, key=lambda r: _key(r, scores[r], maximize))
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


def probe_groups(grids: Sequence[tuple[str, Sequence[float]]],
                 score: Callable[[dict[str, float]], float], *,
                 start: Mapping[str, float] | None = None, widen: int = 3,
                 maximize: bool = True) -> dict[str, Any]:
  """Probe the rates of several parameter groups, one group after the other.

  Args:
    grids: ``(group, grid)`` pairs in the order they are probed.
    score: ``score(rates)`` of a trial at ``rates``, group → rate:
      the groups chosen so far, ``start``'s for the others not yet chosen, and the rate
      under test.
    start: rates of groups not yet probed (e.g. Adam's on the rest while the manifold
      rate is probed); a probed group's choice replaces its start.
    widen, maximize: :func:`best_rate`'s (``maximize=False``: lower scores are better).

  Returns:
    ``{"rates": {group: rate}, "probes": {group: Probe.entry()}}``, the probed groups
    in the order of ``grids``, then the other groups of ``start``.
  """
  chosen = dict(start or {})
  probes = {}
  for group, grid in grids:
    probe = best_rate(grid, lambda rate, group=group: score({**chosen, group: rate}),
                      widen=widen, maximize=maximize)
    chosen[group] = probe.best
    probes[group] = probe.entry()
  rates = {group: chosen[group] for group, _ in grids}
  return {"rates": {**rates, **chosen}, "probes": probes}
