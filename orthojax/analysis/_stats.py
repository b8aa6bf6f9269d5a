r"""Seed-to-seed statistics of a comparison: paired differences and the 2-SE rule.

Two settings ``A`` and ``B`` trained with the same seeds ``s = 1 … n`` (same
data order, split and initial draws) give paired results ``a_s``, ``b_s``.
Their differences ``d_s = a_s − b_s`` are independent over seeds, so

    d̄ = (1/n) Σ_s d_s,     SE(d̄) = sd(d) / √n,     sd(d)² = Σ_s (d_s − d̄)² / (n − 1),

and the claim "A beats B" is judged by the Wald rule at ``z`` standard
errors (``z = 2``: about 95 % two-sided for a normal ``d̄``):

* ``supported``    if ``d̄ >  z · SE``;
* ``rejected``     if ``d̄ < −z · SE`` (B beats A, resolved);
* ``not resolved`` otherwise (``|d̄| ≤ z · SE``, or fewer than 2 pairs),

and ``z · SE`` is the smallest effect the run could have resolved (the
minimal detectable effect). Pairing removes what the two settings share
(e.g. the data order); when ``a`` and ``b`` are strongly correlated,
``SE(d̄)`` is much smaller than the unpaired ``√(sd(a)²/n + sd(b)²/n)``.
With few pairs the rule is anti-conservative (Student's t with 4 degrees
of freedom puts 95 % at 2.78, not 2); it is a screening rule, not a test at
an exact level.

Reference: L. Wasserman, *All of Statistics* (Springer, 2004), §10.1 (the
Wald test; the paired comparison of two means).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

VERDICTS = ("supported", "rejected", "not resolved")


@dataclasses.dataclass(frozen=True)
class PairedDifference:
  """The mean of ``a_s − b_s`` over ``n`` pairs, its standard error and the verdict.

  Attributes:
    mean: ``d̄``, the mean difference.
    se: ``sd(d) / √n`` (NaN with fewer than 2 pairs).
    n: the number of pairs.
    z: the rule's number of standard errors.
    verdict: one of ``"supported"``, ``"rejected"``, ``"not resolved"``, for the claim ``a > b``.
  """

  mean: float
  se: float
  n: int
  z: float
  verdict: str

  @property
  def detectable(self) -> float:
    """``z · SE``: the smallest absolute mean difference the run resolves (NaN below 2 pairs)."""
    return self.z * self.se


def standard_error(values: Sequence[float]) -> float:
  """``sd(x) / √n`` with the ``n − 1`` sample variance; NaN for fewer than 2 values.

  Raises:
    ValueError: a non-finite value.
  """
  x = np.asarray(values, dtype=np.float64).reshape(-1)
  if not np.all(np.isfinite(x)):
    raise ValueError(f"standard_error: non-finite value in {x.tolist()}")
  if x.size < 2:
    return math.nan
  return float(np.std(x, ddof=1) / math.sqrt(x.size))


def paired_difference(a: Sequence[float], b: Sequence[float], *, z: float = 2.0
                      ) -> PairedDifference:
  """``a − b`` pair by pair, judged by the ``z``-SE rule (module docstring).

  Args:
    a: the claimed-better setting's results, one per seed.
    b: the other setting's, the same seeds in the same order.
    z: standard errors the mean difference must exceed (> 0).

  Raises:
    ValueError: empty or different-length samples, a non-finite value, ``z <= 0``.
  """
  a = np.asarray(a, dtype=np.float64).reshape(-1)
  b = np.asarray(b, dtype=np.float64).reshape(-1)
  if a.shape != b.shape or a.size == 0:
    raise ValueError(f"paired_difference: needs one b per a, got {a.size} and {b.size} values")
  if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
    raise ValueError(f"paired_difference: non-finite value in a={a.tolist()} or b={b.tolist()}")
  if not z > 0:
    raise ValueError(f"paired_difference: z={z} must be > 0")
  d = a - b
  mean, se = float(np.mean(d)), standard_error(d)
  if math.isnan(se) or abs(mean) <= z * se:
    verdict = "not resolved"
  else:
    verdict = "supported" if mean > 0 else "rejected"
  return PairedDifference(mean=mean, se=se, n=int(d.size), z=float(z), verdict=verdict)
