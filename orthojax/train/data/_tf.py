"""TensorFlow for tf.data only: imported here once, with every GPU hidden from it.

TensorFlow, when it sees a GPU, reserves most of its memory at start-up —
next to JAX on the same GPU that ends in out-of-memory errors (a known pain
of the Flax/big_vision examples). The input pipeline needs the CPU only, so
the GPUs are made invisible to TF as soon as it is imported, before any TF
op could initialise them. Every module of this package that uses ``tf``
imports it from here::

    from orthojax.train.data._tf import tf

(``tensorflow-cpu``, the pinned dependency, has no GPU support anyway; this
covers environments that install the full ``tensorflow`` wheel.)
"""

from __future__ import annotations

import os
import warnings

# oneDNN is TF's CPU kernel library for dense math, which tf.data and
# tf.summary do not use; enabled, TF prints a banner about it on every start.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

try:
  tf.config.set_visible_devices([], "GPU")
except RuntimeError as e:  # TF already initialised its devices elsewhere
  if tf.config.get_visible_devices("GPU"):
    warnings.warn(f"TensorFlow was initialised before orthojax could hide the GPUs from it "
                  f"({e}); it may reserve GPU memory next to JAX. Import "
                  f"orthojax.train.data before other TF code.", RuntimeWarning, stacklevel=2)

__all__ = ["tf"]
