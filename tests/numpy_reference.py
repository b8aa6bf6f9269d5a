"""Numpy float64 references shared by the tests, independent of orthojax's layout code."""

from __future__ import annotations

import numpy as np


def swap(x):
  """Transpose of the last two axes."""
  return np.swapaxes(x, -1, -2)


def to_tall(x):
  """Tall view in float64: conv (kh, kw, cin, cout) -> (kh·kw·cin, cout), wide transposed."""
  x = np.asarray(x, np.float64)
  if x.ndim == 4:
    x = x.reshape(-1, x.shape[-1])
  return swap(x) if x.shape[-2] < x.shape[-1] else x


def from_tall(t, shape):
  """Inverse of :func:`to_tall` for a parameter of ``shape``."""
  if len(shape) == 4:
    return t.reshape(shape)
  return swap(t) if shape[-2] < shape[-1] else t


def sym(a):
  """Symmetric part of square matrices on the last two axes."""
  return 0.5 * (a + swap(a))


def stiefel_project(w, g):
  """Tangent projection on tall matrices, Euclidean metric: ``G − W sym(WᵀG)``."""
  return g - w @ sym(swap(w) @ g)


def qr_retraction(w, xi):
  """``qf(W + ξ)`` with the sign fix ``diag(R) ≥ 0``."""
  q, r = np.linalg.qr(w + xi)
  return q * np.where(np.diagonal(r, axis1=-2, axis2=-1) < 0, -1.0, 1.0)[..., None, :]


def cayley_retraction(w, xi, iterations=None):
  """Cayley retraction of a tangent ``ξ`` at ``W`` (Wen & Yin 2013).

  ``A = ξ̂ Wᵀ − W ξ̂ᵀ`` with ``ξ̂ = ξ − W (Wᵀξ)/2``; exact:
  ``(I − A/2)⁻¹ (I + A/2) W``; with ``iterations=k``, Li et al.'s fixed point
  ``Y₀ = W + A W``, ``Y ← W + A (W + Y)/2`` k times.
  """
  vh = xi - 0.5 * w @ (swap(w) @ xi)
  a = vh @ swap(w)
  a = a - swap(a)
  if iterations is None:
    eye = np.eye(w.shape[-2])
    return np.linalg.solve(eye - 0.5 * a, w + 0.5 * a @ w)
  y = w + a @ w
  for _ in range(iterations):
    y = w + 0.5 * a @ (w + y)
  return y


def riemannian_adam(w, grad_fn, lrs, retraction, b1=0.9, b2=0.999, eps=1e-8,
                    second_moment="elementwise"):
  """Riemannian Adam (Bécigneul & Ganea 2019) on one tall matrix (stack), float64.

  Per step t = 1, 2, …, with ``P`` the tangent projection at the current W:
  ``g = P(G)``, ``m = b1 P(m) + (1 − b1) g``, ``v = b2 v + (1 − b2) s(g)``
  (``s = g²``, or its mean over the matrix for ``"matrix"``, its sum for
  ``"matrix_sum"``),
  ``d = m/(1 − b1ᵗ) / (sqrt(v/(1 − b2ᵗ)) + eps)`` (projected again for the
  elementwise moment), ``W ← retraction(W, −lr_t d)``.

  Args:
    w: (..., n, p) tall point.
    grad_fn: tall W -> tall Euclidean gradient.
    lrs: the learning rate of each step.
    retraction: ``(W, ξ) -> W'``.

  Returns:
    The list of iterates after each step.
  """
  w = np.asarray(w, np.float64)
  m = np.zeros_like(w)
  v = np.zeros_like(w) if second_moment == "elementwise" else np.zeros(w.shape[:-2])
  out = []
  for t, lr in enumerate(lrs, start=1):
    g = stiefel_project(w, grad_fn(w))
    m = b1 * stiefel_project(w, m) + (1 - b1) * g
    if second_moment == "elementwise":
      v = b2 * v + (1 - b2) * g * g
      denom = np.sqrt(v / (1 - b2 ** t)) + eps
      d = stiefel_project(w, m / (1 - b1 ** t) / denom)
    else:
      reduce = np.mean if second_moment == "matrix" else np.sum
      v = b2 * v + (1 - b2) * reduce(g * g, axis=(-2, -1))
      denom = np.sqrt(v / (1 - b2 ** t)) + eps
      d = m / (1 - b1 ** t) / denom[..., None, None]
    w = retraction(w, -lr * d)
    out.append(w)
  return out
