"""paired_difference / standard_error against hand-computed cases, the 2-SE boundary included."""

from __future__ import annotations

import math

import pytest

from orthojax import analysis as oa


def test_paired_difference_hand_computed():
  # d = a − b = [2, 1, 4]: mean 7/3, sd² = ((1/3)² + (4/3)² + (5/3)²) / 2 = 7/3,
  # SE = √(7/3) / √3 = √7 / 3 ≈ 0.882, 2 SE ≈ 1.764 < 7/3: supported.
  a, b = [85.0, 82.0, 88.0], [83.0, 81.0, 84.0]
  r = oa.paired_difference(a, b)
  assert (r.n, r.z, r.verdict) == (3, 2.0, "supported")
  assert r.mean == pytest.approx(7 / 3)
  assert r.se == pytest.approx(math.sqrt(7) / 3)
  assert r.detectable == pytest.approx(2 * math.sqrt(7) / 3)
  # The same numbers unpaired: SE = √(sd(a)²/3 + sd(b)²/3) = √(9/3 + (7/3)/3) ≈ 1.944, so
  # 2 SE ≈ 3.89 > 7/3 would not resolve it — pairing removes the shared seed effect.
  assert math.sqrt(9 / 3 + (7 / 3) / 3) > r.mean / 2
  flipped = oa.paired_difference(b, a)
  assert (flipped.mean, flipped.se, flipped.verdict) == (-r.mean, r.se, "rejected")


@pytest.mark.parametrize("shift, z, verdict", [
    (2.0, 2.0, "not resolved"),      # d̄ = 2 SE exactly: not beyond it
    (2.25, 2.0, "supported"),
    (-2.0, 2.0, "not resolved"),
    (-2.25, 2.0, "rejected"),
    (2.0, 1.5, "supported"),         # a looser rule resolves the same data
    (0.0, 2.0, "not resolved"),
])
def test_verdict_at_the_boundary(shift, z, verdict):
  # d = shift + [1, 1, 1, −3]: mean = shift, sd² = 12 / 3 = 4, SE = 2 / √4 = 1 (exact floats).
  d = [shift + e for e in (1.0, 1.0, 1.0, -3.0)]
  r = oa.paired_difference(d, [0.0] * 4, z=z)
  assert (r.mean, r.se, r.n, r.verdict) == (shift, 1.0, 4, verdict)
  assert r.detectable == z


def test_degenerate_samples():
  one = oa.paired_difference([3.0], [1.0])                 # one pair: no error estimate
  assert (one.mean, one.n, one.verdict) == (2.0, 1, "not resolved")
  assert math.isnan(one.se) and math.isnan(one.detectable)
  same = oa.paired_difference([2.0, 3.0], [1.0, 2.0])      # identical differences: SE 0
  assert (same.mean, same.se, same.verdict) == (1.0, 0.0, "supported")
  tie = oa.paired_difference([1.0, 2.0], [1.0, 2.0])
  assert (tie.mean, tie.se, tie.verdict) == (0.0, 0.0, "not resolved")
  assert oa.standard_error([1.0, 2.0, 3.0, 4.0]) == pytest.approx(math.sqrt(5 / 3) / 2)
  assert math.isnan(oa.standard_error([1.0]))


@pytest.mark.parametrize("a, b, z, message", [
    ([1.0, 2.0], [1.0], 2.0, "needs one b per a, got 2 and 1 values"),
    ([], [], 2.0, "needs one b per a, got 0 and 0 values"),
    ([1.0, math.nan], [1.0, 2.0], 2.0, "non-finite value"),
    ([1.0, 2.0], [1.0, 2.0], 0.0, "z=0.0 must be > 0"),
])
def test_bad_input_is_one_clear_line(a, b, z, message):
  with pytest.raises(ValueError, match="^paired_difference: " + message.replace("(", r"\(")):
    oa.paired_difference(a, b, z=z)
  with pytest.raises(ValueError, match="standard_error: non-finite"):
    oa.standard_error([1.0, math.inf])
