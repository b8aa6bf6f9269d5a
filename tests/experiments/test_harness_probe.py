"""The learning-rate probe: the best of a grid, widened past an edge, NaN lowest."""

from __future__ import annotations

import math

import pytest

from experiments._harness import probe


def _peak_at(rate):
  return lambda r: -(math.log10(r) - math.log10(rate)) ** 2


def test_an_inside_best_needs_no_widening():
  calls = []
  result = probe.best_rate([1e-3, 1e-2, 1e-1], lambda r: calls.append(r) or _peak_at(1e-2)(r))
  assert (result.best, result.at_edge) == (1e-2, False)
  assert sorted(calls) == [1e-3, 1e-2, 1e-1]   # each rate once, nothing added


def test_a_best_at_the_edge_widens_by_the_grids_ratio_until_inside():
  result = probe.best_rate([1e-3, 1e-2], _peak_at(1e-1))
  assert sorted(result.scores) == pytest.approx([1e-3, 1e-2, 1e-1, 1.0])
  assert result.best == pytest.approx(1e-1) and not result.at_edge
  low = probe.best_rate([1e-4, 3e-4, 1e-3], _peak_at(1e-5))   # steps of √10: 3e-5, 1e-5, 3e-6
  assert sorted(low.scores) == pytest.approx([3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3], rel=1e-12)
  assert low.best == pytest.approx(1e-5) and not low.at_edge
  edge = probe.best_rate([1e-4, 3e-4, 1e-3], _peak_at(1e-7), widen=2)
  assert min(edge.scores) == pytest.approx(1e-5) and edge.at_edge   # two rates added: the edge


def test_widening_stops_after_widen_rates_and_says_so():
  result = probe.best_rate([1.0, 2.0], lambda r: r, widen=2)
  assert sorted(result.scores) == [1.0, 2.0, 4.0, 8.0]
  assert result.best == 8.0 and result.at_edge
  assert probe.best_rate([1.0, 2.0], lambda r: r, widen=0).scores == {1.0: 1.0, 2.0: 2.0}


def test_a_nan_is_the_lowest_score_and_ties_go_to_the_smaller_rate():
  scores = {1.0: 0.5, 2.0: float("nan"), 3.0: 0.9, 4.0: 0.2}
  assert probe.best_rate(list(scores), scores.get).best == 3.0
  flat = probe.best_rate([1.0, 2.0, 3.0], lambda r: 0.1 if r > 1 else float("nan"), widen=0)
  assert flat.best == 2.0 and not flat.at_edge   # 2 and 3 tie: the smaller


def test_row_marks_the_chosen_rate_and_an_edge():
  result = probe.best_rate([1e-5, 3e-5, 1e-4], {1e-5: 0.841, 3e-5: 0.894, 1e-4: 0.841}.get)
  assert result.row() == "1e-05 0.841 / **3e-05 0.894** / 0.0001 0.841"
  assert probe.best_rate([1.0, 2.0], lambda r: r, widen=0).row().endswith(
      "**2 2.000** (best at the edge)")


@pytest.mark.parametrize("grid", [[1e-3], [0.0, 1e-3], []])
def test_a_grid_needs_two_positive_rates(grid):
  with pytest.raises(ValueError, match="two or more positive rates"):
    probe.best_rate(grid, lambda r: r)


def test_maximize_false_picks_the_lowest_score_a_nan_still_worst():
  losses = {1e-3: 2.0, 1e-2: 1.5, 1e-1: float("nan"), 1.0: 3.0}
  result = probe.best_rate(list(losses), losses.get, widen=0, maximize=False)
  assert result.best == 1e-2 and not result.at_edge
  assert probe.best_rate(list(losses), losses.get, widen=0).best == 1.0   # the highest
