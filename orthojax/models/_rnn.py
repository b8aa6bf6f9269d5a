r"""A many-to-one vanilla RNN for sequential MNIST (Hlav's gain-adjusted regulariser experiments).

For an input sequence ``x_1, …, x_T`` (rows ``(batch, input_size)``)::

    h_0 = 0,   h_t = φ(x_t W_in + h_{t−1} W_rec + b),   logits = h_T W_out + b_out.

The recurrence runs under ``jax.lax.scan`` over time, so the 784-step
pixel-wise task compiles one step body; the input projection ``x_t W_in + b``
of all steps is one matmul before the scan.

The recurrent kernel ``W_rec`` (attribute ``recurrent_kernel``, matrix view
``(fan_in, fan_out) = (hidden, hidden)``) is what the variants change
(Hlav's note, see References; Vorontsov et al. 2017):

* ``recurrent_init="glorot"``: ``gain · U(±√(6/(2·hidden)))``, i.e.
  ``jax.nn.initializers.glorot_uniform`` (Keras' default) times ``gain``;
* ``recurrent_init="orthogonal"``: ``gain · Q``, ``Q`` Haar orthogonal
  (:func:`orthojax.nn.initializers.orthogonal`), every singular value ``gain``;
* ``recurrent="stiefel"``: ``W_rec = gain · V`` with ``V`` a
  :class:`~orthojax.nn.StiefelParam` (kept orthonormal by a Riemannian
  optimizer via :func:`orthojax.optim.partition`) and ``gain`` a fixed
  ``nnx.Variable``; requires ``recurrent_init="orthogonal"``.

Soft-orthogonality penalties (:mod:`orthojax.penalties`, e.g. the
gain-adjusted ``λ‖WᵀW/g² − I‖²_F``) and spectrum tracking read
``model.recurrent_kernel[...]`` (or :meth:`SequenceRNN.recurrent_matrix`,
which includes the Stiefel gain).

The input kernel is Glorot-uniform and the bias zero; the classifier is an
``nnx.Linear`` with a Glorot-uniform kernel and zero bias (Keras' defaults
for ``SimpleRNN`` and ``Dense``, Hlav's setup).

References:
  Vorontsov, Trabelsi, Kadoury & Pal, "On orthogonality and learning
  recurrent networks with long term dependencies", ICML 2017.
  Le, Jaitly & Hinton, "A simple way to initialize recurrent networks of
  rectified linear units", 2015 (the pixel-wise sequential MNIST task).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn import dtypes

from orthojax import manifolds
from orthojax.models._deep_mlp import activation_phi
from orthojax.nn import StiefelParam
from orthojax.nn import check_choice
from orthojax.nn import check_positive_int
from orthojax.nn import initializers
from orthojax.nn import sharding


class SequenceRNN(nnx.Module):
  r"""Vanilla many-to-one RNN classifier, scanned over time.

  Attributes:
    input_kernel: ``(input_size, hidden)``.
    recurrent_kernel: ``(hidden, hidden)``; an ``nnx.Param`` or, with
      ``recurrent="stiefel"``, a :class:`~orthojax.nn.StiefelParam` ``V``.
    recurrent_gain: the fixed gain in front of ``V`` (None unless Stiefel).
    bias: ``(hidden,)``.
    classifier: ``nnx.Linear(hidden, num_classes)`` on the last hidden state.

  Args:
    input_size: features per time step (28 row-wise, 1 pixel-wise).
    hidden: hidden units (Hlav: 64).
    num_classes: number of classes.
    recurrent_init: ``"glorot"`` or ``"orthogonal"``.
    gain: multiplies the initial recurrent kernel (both inits).
    recurrent: ``"euclidean"`` or ``"stiefel"``.
    activation: ``φ``: a callable (default ``jnp.tanh``) or a name of
      :data:`orthojax.nn.ACTIVATIONS`.
    dtype: computation dtype (None: promote).
    param_dtype: parameter dtype.
    rngs: ``nnx.Rngs`` with a ``params`` stream.

  Raises:
    ValueError: unknown ``recurrent_init`` / ``recurrent`` / activation name,
      or ``recurrent="stiefel"`` with ``recurrent_init="glorot"``.
  """

  RECURRENT_INITS = ("glorot", "orthogonal")
  """Accepted ``recurrent_init`` names."""
  RECURRENTS = ("euclidean", "stiefel")
  """Accepted ``recurrent`` names: where the recurrent kernel lives."""
  INPUT = "sequence"
  """The form the trainer feeds data in. ``"sequence"`` is ``(batch, time, features)``,
  with ``input_size`` the features (``orthojax.train.model_zoo.build``)."""
  PENALIZED = ("recurrent_kernel",)
  """The parameters a soft-orthogonality penalty acts on. Here ``W_rec`` only (Hlav, §3),
  not the input and output kernels."""

  def __init__(self, input_size: int, hidden: int = 64, num_classes: int = 10, *,
               recurrent_init: str = "glorot", gain: float = 1.0, recurrent: str = "euclidean",
               activation: str | Callable = jnp.tanh, dtype: Any = None,
               param_dtype: Any = jnp.float32, rngs: nnx.Rngs):
    check_choice(recurrent_init, self.RECURRENT_INITS, "recurrent_init", where="SequenceRNN")
    check_choice(recurrent, self.RECURRENTS, "recurrent", where="SequenceRNN")
    for name, size in (("input_size", input_size), ("hidden", hidden),
                       ("num_classes", num_classes)):
      check_positive_int(size, name, where="SequenceRNN")
    if recurrent == "stiefel" and recurrent_init != "orthogonal":
      raise ValueError("SequenceRNN: recurrent='stiefel' keeps the recurrent kernel orthonormal "
                       "(times gain); use recurrent_init='orthogonal'")
    self.activation = activation_phi(activation, "SequenceRNN")
    self.dtype = dtype
    kernel_meta = sharding.metadata(sharding.DENSE_KERNEL)
    glorot = jax.nn.initializers.glorot_uniform()
    self.input_kernel = nnx.Param(glorot(rngs.params(), (input_size, hidden), param_dtype),
                                  **kernel_meta)
    shape = (hidden, hidden)
    if recurrent == "stiefel":
      v = manifolds.Stiefel().random(rngs.params(), shape, param_dtype)
      self.recurrent_kernel = StiefelParam(v, **kernel_meta)
      self.recurrent_gain = nnx.Variable(jnp.asarray(gain, param_dtype),
                                         **sharding.metadata(()))
    else:
      init = (initializers.orthogonal(gain) if recurrent_init == "orthogonal" else
              jax.nn.initializers.variance_scaling(float(gain) ** 2, "fan_avg", "uniform"))
      self.recurrent_kernel = nnx.Param(init(rngs.params(), shape, param_dtype), **kernel_meta)
      self.recurrent_gain = None
    self.bias = nnx.Param(jnp.zeros((hidden,), param_dtype), **sharding.metadata(sharding.BIAS))
    self.classifier = nnx.Linear(
        hidden, num_classes, dtype=dtype, param_dtype=param_dtype, rngs=rngs, kernel_init=glorot,
        kernel_metadata=kernel_meta, bias_metadata=sharding.metadata(sharding.BIAS))

  def recurrent_matrix(self) -> jax.Array:
    """The effective ``W_rec`` (``gain · V`` for a Stiefel kernel)."""
    w = self.recurrent_kernel[...]
    return w if self.recurrent_gain is None else self.recurrent_gain[...] * w

  def states(self, x: jax.Array, *, return_sequence: bool = False) -> jax.Array:
    """Hidden states of inputs ``(batch, time, input_size)``.

    Returns:
      ``h_T`` of shape ``(batch, hidden)``, or every ``h_t`` as
      ``(batch, time, hidden)`` with ``return_sequence=True``.
    """
    if x.ndim != 3:
      raise ValueError(f"SequenceRNN expects inputs (batch, time, input_size), got {x.shape}")
    w_in, w_rec, b = dtypes.promote_dtype(
        (self.input_kernel[...], self.recurrent_matrix(), self.bias[...]), dtype=self.dtype)
    drive = jnp.swapaxes(jnp.asarray(x, w_in.dtype) @ w_in + b, 0, 1)   # (time, batch, hidden)
    act = self.activation

    def step(h, u):
      h = act(u + h @ w_rec)
      return h, (h if return_sequence else None)

    h0 = jnp.zeros(drive.shape[1:], drive.dtype)
    h, hs = jax.lax.scan(step, h0, drive)
    return jnp.swapaxes(hs, 0, 1) if return_sequence else h

  def __call__(self, x: jax.Array) -> jax.Array:
    """Logits ``(batch, num_classes)`` from the last hidden state."""
    return self.classifier(self.states(x))
