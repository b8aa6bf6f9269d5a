"""orthojax: orthogonality in neural networks for JAX, Flax and Optax.

Layers (imports only point down): ``linalg`` -> ``manifolds`` -> ``penalties``
and ``optim`` -> ``nn`` -> ``analysis`` -> ``models`` -> ``train``. Nothing in
the library imports ``train`` or the experiments.
"""

from orthojax import _no_tpu

_no_tpu.drop_absent_tpu_backend()

from orthojax import linalg  # pylint: disable=g-import-not-at-top,wrong-import-position
from orthojax import manifolds
from orthojax import penalties
from orthojax import optim
from orthojax import nn
from orthojax import models
from orthojax import analysis

__version__ = "0.1.0"

__all__ = ["linalg", "manifolds", "penalties", "optim", "nn", "models", "analysis",
           "__version__"]
