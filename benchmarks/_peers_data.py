"""The peers benchmark's inputs, from numpy alone, the same in both processes (a
process may hold jaxlib's LAPACK or torch's, not both: their symbols clash)."""

from __future__ import annotations

import math

import numpy as np


def stiefel_stack(shape, seed: int) -> np.ndarray:
  """float32 points with orthonormal columns: the sign-fixed Q of Gaussian matrices."""
  x = np.random.default_rng(seed).standard_normal(shape)
  q, r = np.linalg.qr(x)
  sign = np.where(np.diagonal(r, axis1=-2, axis2=-1) < 0, -1.0, 1.0)
  return (q * sign[..., None, :]).astype(np.float32)


def optimizer_case(shape) -> tuple[np.ndarray, np.ndarray]:
  """``(W, G)``: a stack of Stiefel points and a fixed gradient of the same shape."""
  g = 0.1 * np.random.default_rng(1).standard_normal(shape)
  return stiefel_stack(shape, 0), g.astype(np.float32)


def mlp_case(depth: int, width: int, batch: int, classes: int = 10):
  """``(x, y, hidden, head)`` of the tanh MLP: ``depth`` square Stiefel layers."""
  rng = np.random.default_rng(2)
  x = rng.standard_normal((batch, width)).astype(np.float32)
  y = rng.integers(0, classes, batch)
  head = (rng.standard_normal((width, classes)) / math.sqrt(width)).astype(np.float32)
  return x, y, stiefel_stack((depth, width, width), 3), head


def defect(w) -> float:
  """The largest ``‖WᵀW − I‖_F`` over a stack."""
  w = np.asarray(w, np.float64)
  gram = np.swapaxes(w, -1, -2) @ w
  return float(np.max(np.linalg.norm(gram - np.eye(w.shape[-1]), axis=(-2, -1))))
