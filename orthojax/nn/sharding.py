"""Logical sharding axes for orthojax parameters.

Every parameter the orthojax layers and models create carries logical axis
names in the standard NNX ``out_sharding`` metadata (the field
``nnx.with_partitioning`` writes), with ``eager_sharding=False`` so a model
can be built with no mesh in scope (a laptop, a test). The training framework
maps the logical names to mesh axes by rules
(``flax.core.spmd.logical_axis_rules`` + ``nnx.get_partition_spec``), e.g.
``(("fan_out", "fsdp"), ("fan_in", None), ("layers", None))`` — sharding
declared by rules, not scattered through model code.

Logical axes:
  ``fan_in`` / ``fan_out``: the contracted / produced feature axes of a
  kernel (its matrix view); ``spatial``: conv window axes; ``layers``: the
  leading axis of a scanned layer stack; ``angles``: GmP's per-unit angle
  axis; ``vocab``: classifier outputs and token ids; ``embed``: a transformer's
  model width in its embedding, head and norms; ``qkv``: the query/key/value index of
  a stacked attention projection.

Activations: a model marks the axes of an activation with the same kind of names
(``batch`` for its leading axis) through :func:`constrain`. Outside a trainer it does
nothing; a trainer that traces its step under :func:`activation_sharding` turns the names
into a sharding constraint, as MaxText's ``with_logical_constraint`` does. Without one, XLA's
propagation may follow a weight's sharding instead of the batch's: the embedding of a
transformer whose width is sharded over ``fsdp`` hands the same mesh axis to the model
width, and the whole global batch then runs on every chip.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

import jax

from orthojax.linalg import MatrixView

FAN_IN = "fan_in"
FAN_OUT = "fan_out"
SPATIAL = "spatial"
LAYERS = "layers"
ANGLES = "angles"
VOCAB = "vocab"
EMBED = "embed"
QKV = "qkv"
BATCH = "batch"

DENSE_KERNEL = (FAN_IN, FAN_OUT)
BIAS = (FAN_OUT,)
GMP_ANGLES = (FAN_OUT, ANGLES)
EMBEDDING = (VOCAB, EMBED)
HEAD = (EMBED, VOCAB)


def conv_kernel(spatial_dims: int = 2) -> tuple[str, ...]:
  """Logical axes of a conv kernel ``(*window, cin, cout)``."""
  return (SPATIAL,) * spatial_dims + (FAN_IN, FAN_OUT)


def stacked(names: tuple[str | None, ...]) -> tuple[str | None, ...]:
  """The axes of a parameter stacked along a leading scanned-layer axis."""
  return (LAYERS,) + tuple(names)


def metadata(names: tuple[str | None, ...]) -> dict[str, Any]:
  """Variable metadata recording ``names`` without sharding eagerly.

  A parameter whose axes are not a kernel's (no ``fan_in`` and ``fan_out``: a bias, a
  scale, GmP's angles, a generator) also records ``matrix_view=False``: it is not a
  matrix, so :func:`orthojax.nn.matrix_views` says so and Muon, the penalties and the
  manifold optimizers leave it to their Euclidean fallback. A conv kernel whose view
  cannot be inferred from its rank (a 1-D or 3-D window: ``(k, cin, cout)`` could as
  well be a stack of Dense kernels) records its conv view,
  ``MatrixView.conv(spatial_dims)``; a Dense or 2-D conv kernel records none (inferred).
  """
  names = tuple(names)
  out = {"out_sharding": names, "eager_sharding": False}
  if not (FAN_IN in names and FAN_OUT in names):
    out["matrix_view"] = False
  elif (spatial := names.count(SPATIAL)) not in (0, 2) and names == conv_kernel(spatial):
    out["matrix_view"] = MatrixView.conv(spatial)
  return out


_ACTIVATIONS = threading.local()


@contextlib.contextmanager
def activation_sharding(resolve: Callable[[tuple[str | None, ...], tuple[int, ...]], Any]
                        ) -> Iterator[None]:
  """Within it, :func:`constrain` asks ``resolve(names, shape)`` for a sharding.

  A trainer enters it around the function it traces (``resolve`` maps logical names to
  its mesh's axes, e.g. ``orthojax.train.mesh.activation_resolver``).
  """
  previous = getattr(_ACTIVATIONS, "resolve", None)
  _ACTIVATIONS.resolve = resolve
  try:
    yield
  finally:
    _ACTIVATIONS.resolve = previous


def constrain(x: jax.Array, names: tuple[str | None, ...]) -> jax.Array:
  """``x`` with a sharding constraint by logical axis ``names`` (one per axis), under
  :func:`activation_sharding`; ``x`` itself outside it."""
  resolve = getattr(_ACTIVATIONS, "resolve", None)
  if resolve is None:
    return x
  if len(names) != x.ndim:
    raise ValueError(f"constrain: {len(names)} names {names} for an array of rank {x.ndim}")
  return jax.lax.with_sharding_constraint(x, resolve(tuple(names), tuple(x.shape)))
