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
"""

from __future__ import annotations

from typing import Any

FAN_IN = "fan_in"
FAN_OUT = "fan_out"
SPATIAL = "spatial"
LAYERS = "layers"
ANGLES = "angles"
VOCAB = "vocab"
EMBED = "embed"
QKV = "qkv"

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
  manifold optimizers leave it to their Euclidean fallback.
  """
  out = {"out_sharding": tuple(names), "eager_sharding": False}
  if not (FAN_IN in names and FAN_OUT in names):
    out["matrix_view"] = False
  return out
