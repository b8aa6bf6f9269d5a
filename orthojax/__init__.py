"""orthojax: orthogonality in neural networks for JAX, Flax and Optax.

Layers (imports only point down): ``linalg`` -> ``manifolds`` -> ``penalties``
and ``optim`` -> ``nn`` -> ``analysis`` -> ``models`` -> ``train`` -> ``compile``
(what a job costs before it runs). Nothing in the library below them imports
``train`` or ``compile``, and nothing imports the experiments; both are imported
on their own (``from orthojax.compile import aot``), not by ``import orthojax``.
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
