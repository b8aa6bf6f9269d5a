"""Sharded training framework: config, mesh, data, checkpoints, metrics, loop.

Entry points: :func:`train` (a zoo model on a registered dataset, from a
:class:`Config`) and :func:`fit` (your own ``nnx.Module``, optimizer and
batches). What a run costs before it runs (the pod compile check) is the
package one floor above, :mod:`orthojax.compile`, built on this one's program.
"""

from orthojax.train.config import Config
from orthojax.train.config import ConfigError
from orthojax.train.trainer import TrainResult
from orthojax.train.trainer import fit
from orthojax.train.trainer import train

__all__ = ["Config", "ConfigError", "TrainResult", "fit", "train"]
