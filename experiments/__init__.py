"""Paper experiments: thin flag files -> config -> orthojax.train."""

import os

# jaxlib's CPU QR/SVD/eigh call LAPACK through OpenBLAS, whose threads fight
# XLA's own pool: on a 2-core machine a Stiefel run's batched QR took 10-70x
# longer with OpenBLAS's default threading (docs/performance.md). It must be
# set before numpy/jax load; set the variable yourself to override.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
