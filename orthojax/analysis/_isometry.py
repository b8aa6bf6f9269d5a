r"""Fisher ``λ_max`` and Jacobian ``σ_max`` of a deep critical network, on fixed examples.

Sokol & Park (2020) bound the largest eigenvalue of the Fisher information
of a deep network ``x⁰ → h¹ → … → h^g → z`` by a function essentially
quadratic in ``σ_max`` of the input–output Jacobian ``J_{x⁰}^{h^g}`` (§3,
Theorem "Bound on the Fisher Information Eigenvalues", eq. 13–17), and test
it by correlating, at initialisation, ``λ_max`` of the empirical Fisher with
``σ_max²(J)`` across critical initialisations (§4, ρ = 0.64 for cross
entropy, 0.81 for MSE). :func:`isometry_diagnostics` measures both on one
batch:

* ``λ_max`` of the empirical Fisher of the cross-entropy loss over the
  batch (Kunstner, Hennig & Balles 2019)::

      F = (1/B) Σ_i g_i g_iᵀ,   g_i = ∇_θ ℓ(z_i, y_i),

  by Lanczos (:func:`~orthojax.analysis.fisher_max_eigenvalue`,
  ``kind="empirical"``);
* ``σ_max`` of ``J_{x⁰}^{h^g} = ∂h^g/∂x⁰`` per example, from the *scaled*
  input ``x⁰`` to the last hidden layer (``DeepMLP.features``), by Lanczos on
  the Gram matrix with jvp/vjp
  (:func:`~orthojax.analysis.jacobian_singular_values`), averaged over the
  first examples of the batch (as ``σ_max`` and as ``σ_max²``);
* optionally ``λ_max`` of the MSE Gauss–Newton matrix ``(1/B) Σ_i J_iᵀJ_i``
  (``J_i = ∂z_i/∂θ``; the Fisher of a unit-variance Gaussian output,
  Sokol & Park eq. 6–8).

References:
  Sokol & Park, "Information geometry of orthogonal initializations and
  training", ICLR 2020: eq. 6–8, §3 (the bound), §4 and Fig. 2.
  F. Kunstner, P. Hennig, L. Balles, "Limitations of the empirical Fisher
  approximation for natural gradient descent", NeurIPS 2019.
  Pennington, Schoenholz & Ganguli 2017 (the critical tanh network).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from orthojax.analysis._fisher import fisher_max_eigenvalue
from orthojax.analysis._jacobian import jacobian_singular_values
from orthojax.analysis._model import _eval_clone

KEYS = ("fisher_lambda_max", "fisher_converged", "jacobian_sigma_max", "jacobian_sigma_max_sq")
"""The keys :func:`isometry_diagnostics` always returns (``fisher_mse_lambda_max`` too with ``mse``)."""


def _positive_int(value: Any, name: str) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(f"isometry_diagnostics: {name} must be a positive int, got {value!r}")
  return int(value)


def isometry_diagnostics(model: nnx.Module, x: Any, y: Any, *, jacobian_examples: int = 8,
                         lanczos_iters: int = 30, mse: bool = False) -> dict[str, float]:
  r"""``λ_max`` of the empirical Fisher and ``σ_max`` of the input–output Jacobian.

  On the batch ``(x, y)``, with the network in eval mode (a clone; the
  caller's model is not touched):

  * ``fisher_lambda_max``: ``λ_max(F)``, ``F = (1/B) Σ_i g_i g_iᵀ`` with
    ``g_i = ∇_θ ℓ_CE(z_i, y_i)`` over the model's ``nnx.Param`` variables
    (Kunstner et al. 2019; the measure of Sokol & Park §4), by Lanczos with
    at most ``lanczos_iters`` steps (:func:`fisher_max_eigenvalue`,
    ``kind="empirical"``, default ``tol=1e-3``); ``fisher_converged``: 1.0
    if its residual met the tolerance, else 0.0;
  * ``jacobian_sigma_max`` / ``jacobian_sigma_max_sq``: the mean over the
    first ``jacobian_examples`` examples of ``σ_max(J)`` / ``σ_max(J)²`` with
    ``J = ∂h^g/∂x⁰`` the Jacobian of the network's ``features`` (the last
    hidden layer) at the scaled input ``x⁰ = scale·x`` (Sokol & Park's
    ``J_{x⁰}^{h^g}``, §3), by Lanczos (:func:`jacobian_singular_values`,
    ``k=1``);
  * with ``mse=True`` also ``fisher_mse_lambda_max``: ``λ_max`` of the MSE
    Gauss–Newton matrix ``(1/B) Σ_i J_iᵀJ_i``, ``J_i = ∂z_i/∂θ`` (Sokol &
    Park eq. 6–8 with ``H = I``).

  Args:
    model: an ``nnx.Module`` with a ``features`` method (an
      :class:`orthojax.models.DeepMLP`), or a wrapper whose ``.model`` is
      one and whose ``.scale`` (a float, default 1) multiplies the flattened
      input before it — the orthojax trainer's ``Flatten``, whose forward
      pass ``model(scale·x.reshape(B, −1))`` gives the logits.
    x: the inputs ``(B, …)``; flattened to ``(B, −1)``.
    y: integer labels ``(B,)`` (or one-hot ``(B, C)``).
    jacobian_examples: how many of the first examples ``σ_max`` is averaged over.
    lanczos_iters: the Fisher's Lanczos step cap.
    mse: also measure ``fisher_mse_lambda_max``.

  Returns:
    ``{"fisher_lambda_max", "fisher_converged", "jacobian_sigma_max",
    "jacobian_sigma_max_sq"}`` (plus ``"fisher_mse_lambda_max"``), floats.

  Raises:
    TypeError: ``model`` is not an ``nnx.Module`` or has no ``features``
      (neither itself nor its ``.model``).
    ValueError: non-positive ``jacobian_examples``/``lanczos_iters``; what
      :func:`fisher_max_eigenvalue` raises for the labels.

  References:
    Sokol & Park, ICLR 2020, eq. 6–8, §3–4; Kunstner, Hennig & Balles 2019.
  """
  who = "isometry_diagnostics"
  jacobian_examples = _positive_int(jacobian_examples, "jacobian_examples")
  lanczos_iters = _positive_int(lanczos_iters, "lanczos_iters")
  clone = _eval_clone(model, who)
  if callable(getattr(clone, "features", None)):
    wrapped, scale = False, 1.0
  elif callable(getattr(getattr(clone, "model", None), "features", None)):
    wrapped, scale = True, float(getattr(clone, "scale", 1.0))
  else:
    raise TypeError(f"{who}: {type(model).__name__} has no features method (a DeepMLP), "
                    f"and no .model with one")
  graphdef, params, rest = nnx.split(clone, nnx.Param, ...)
  params = nnx.to_pure_dict(params)
  x = jnp.asarray(x)
  x = jnp.reshape(x, (x.shape[0], -1))
  y = jnp.asarray(y)

  def apply(p, inputs):
    return nnx.merge(graphdef, p, rest)(inputs)

  fisher = fisher_max_eigenvalue(apply, params, x, y, loss="cross_entropy", kind="empirical",
                                 max_iters=lanczos_iters)
  network = nnx.merge(graphdef, params, rest)
  if wrapped:
    network = network.model
  x0 = scale * x[:jacobian_examples]          # J from x⁰, the scaled input
  jac = jacobian_singular_values(network.features, x0, method="lanczos", k=1, batched=True)
  sigma = np.asarray(jac.largest)[:, 0]
  out = {"fisher_lambda_max": float(fisher.eigenvalue),
         "fisher_converged": float(fisher.converged),
         "jacobian_sigma_max": float(np.mean(sigma)),
         "jacobian_sigma_max_sq": float(np.mean(sigma ** 2))}
  if mse:
    gn = fisher_max_eigenvalue(apply, params, x, loss="mse", kind="gauss_newton",
                               max_iters=lanczos_iters)
    out["fisher_mse_lambda_max"] = float(gn.eigenvalue)
  return out
