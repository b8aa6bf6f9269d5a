"""Soft-orthogonality penalties: pure functions over arrays and parameter trees."""

from orthojax.penalties._penalties import dso
from orthojax.penalties._penalties import gain_adjusted_so
from orthojax.penalties._penalties import half_so
from orthojax.penalties._penalties import mc
from orthojax.penalties._penalties import REDUCTIONS
from orthojax.penalties._penalties import so
from orthojax.penalties._penalties import srip
from orthojax.penalties._tree import PENALTIES
from orthojax.penalties._tree import get_penalty
from orthojax.penalties._tree import tree_penalty

__all__ = [
    "so",
    "half_so",
    "dso",
    "mc",
    "srip",
    "gain_adjusted_so",
    "tree_penalty",
    "get_penalty",
    "PENALTIES",
    "REDUCTIONS",
]
